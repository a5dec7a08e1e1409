//! `nvmq verify`: a full read-only check of the retained log, with the same rules recovery uses
//! to tell a torn tail (normal after a crash) from damage inside acknowledged data.

use anyhow::{anyhow, Result};
use blockdev::SyncIo;
use nvmq_log::format::{BatchHeader, Superblock};
use nvmq_log::layout::Geometry;
use recovery::{ChainRules, RecoveryError, StopOrEnd};
use serde::Serialize;

use crate::describe::{bytes, CopyReport};
use crate::examined::{self, Device, Ending};
use crate::Status;

/// At most this many damaged places are listed; past the first, they are a courtesy.
const MAX_DAMAGE_LISTED: usize = 64;

#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Example:\n  nvmq verify --device file:/var/lib/nvmq/log.img\n\n\
Checks, from the head to the tail: both superblock copies, every batch header (checksum, \
position, format id, hash chain, epoch) and every record (checksum, position, epoch). Never \
writes or flushes.\n\
Exit status: 0 no damage (a torn tail past the durable point is normal after a crash and is \
reported); 1 error (missing or unformatted device), or a device serve would refuse (a block \
larger than the log's write unit, a maximum transfer below it, a queue too shallow: warned, \
naming the sizes); 3 damage inside acknowledged data or in both superblocks, with positions."
)]
pub struct VerifyArgs {
    /// The device: `file:<path>` (or a plain path). Repeat it for each device of a broker that
    /// has several.
    #[arg(long, required = true, action = clap::ArgAction::Append)]
    pub device: Vec<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize, Debug, Clone)]
struct Damage {
    position: u64,
    what: String,
}

#[derive(Serialize, Debug)]
struct Report {
    device_spec: String,
    superblocks: Vec<CopyReport>,
    /// `ok`, `torn-tail` (no damage) or `damage`.
    verdict: &'static str,
    head: Option<u64>,
    tail: Option<u64>,
    durable_through: Option<u64>,
    verified_bytes: u64,
    batches: u64,
    records: u64,
    bytes_read: u64,
    end: Option<Ending>,
    damage: Vec<Damage>,
    error: Option<String>,
    /// Why `nvmq serve` would refuse to open the log on this device (its geometry does not fit
    /// the log); None when it would open it. Set, verify exits 1 unless it found damage.
    open_refused: Option<String>,
}

pub fn run(a: VerifyArgs) -> Result<Status> {
    crate::each_device(&a.device, a.json, |d| run_one(&a, d))
}

fn run_one(a: &VerifyArgs, device: &str) -> Result<Status> {
    let pb = crate::progress::bytes_bar(0, "verifying");
    let (mut dev, _spec) = examined::open_read_only(device, &pb)?;
    let ex = examined::examine(&mut dev, &pb);
    let mut report = Report {
        device_spec: device.to_string(),
        superblocks: ex.copy_reports(),
        verdict: "ok",
        head: None,
        tail: None,
        durable_through: None,
        verified_bytes: 0,
        batches: 0,
        records: 0,
        bytes_read: 0,
        end: None,
        damage: Vec::new(),
        error: None,
        open_refused: examined::open_refusal(&dev, &ex.copies),
    };
    match &ex.result {
        Ok(e) => {
            let end = examined::ending(&mut dev, e);
            report.verdict = if end.kind == "torn" {
                "torn-tail"
            } else {
                "ok"
            };
            report.head = Some(e.chosen.head);
            report.tail = Some(e.tail);
            report.durable_through = Some(e.chosen.durable_through.max(e.max_durable_through));
            report.verified_bytes = e.tail - e.chosen.head;
            report.batches = e.retained.len() as u64;
            report.records = examined::retained_records(e);
            report.bytes_read = e.scanned_bytes + e.indexed_bytes;
            report.end = Some(end);
        }
        Err(RecoveryError::NotFormatted { .. }) => {
            pb.finish_and_clear();
            let err = ex
                .result
                .as_ref()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            report.error = Some(err.clone());
            report.verdict = "error";
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            }
            return Err(anyhow!("{}: {err}", device));
        }
        Err(err) => {
            report.verdict = "damage";
            report.error = Some(err.to_string());
            if let RecoveryError::Damage { position, what } = err {
                report.damage.push(Damage {
                    position: *position,
                    what: what.clone(),
                });
            }
            if let Ok(choice) = recovery::choose(&ex.copies) {
                let sb = choice.chosen;
                report.head = Some(sb.head);
                report.durable_through = Some(sb.durable_through);
                let geo = Geometry::from_superblock(
                    &sb,
                    blockdev::BlockDevice::info(&dev).logical_block_size,
                );
                for d in further_damage(&mut dev, &geo, &sb) {
                    if !report.damage.iter().any(|x| x.position == d.position) {
                        report.damage.push(d);
                    }
                }
                report.damage.sort_by_key(|d| d.position);
                report.damage.truncate(MAX_DAMAGE_LISTED);
            }
        }
    }
    pb.finish_and_clear();
    match report.damage.first() {
        Some(d) => {
            tracing::error!(device = %device, position = d.position, what = %d.what, places = report.damage.len(), "damage inside acknowledged data")
        }
        None => {
            tracing::info!(device = %device, verdict = report.verdict, tail = report.tail, "verified")
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_human(&report);
    }
    Ok(if report.verdict == "damage" {
        Status::Damage
    } else if report.open_refused.is_some() {
        Status::Refused
    } else {
        Status::Ok
    })
}

/// Damage is already known: sweeps the log from the head for every place that does not check,
/// resynchronising past each at the next block that holds a valid batch header of this log at its
/// own position. A place counts as damage when it lies below the largest durable point any
/// superblock or batch header names; like recovery's probe, the sweep looks up to one window and
/// one batch past that point for headers that raise it.
fn further_damage(dev: &mut Device, geo: &Geometry, sb: &Superblock) -> Vec<Damage> {
    let rules = ChainRules {
        first_link: None,
        epoch: sb.epoch,
        epoch_start: sb.epoch_start,
    };
    let u = geo.write_unit;
    let reach = geo.window + geo.max_batch;
    let mut bound = sb.durable_through;
    let mut candidates: Vec<Damage> = Vec::new();
    let mut pos = sb.head;
    let mut in_gap = false;
    while pos < bound.saturating_add(reach) && candidates.len() < 4 * MAX_DAMAGE_LISTED {
        let off = geo.segments(pos, u)[0].0;
        let header = dev
            .read_at(off, u as usize)
            .ok()
            .and_then(|b| BatchHeader::decode(&b, geo.format_id, pos, u as u32).ok());
        let fenced = |h: &BatchHeader| pos >= sb.epoch_start && h.epoch < sb.epoch;
        if header.is_none_or(|(h, _)| fenced(&h)) {
            if !in_gap {
                candidates.push(Damage {
                    position: pos,
                    what: "no valid batch header where one was expected".into(),
                });
                in_gap = true;
            }
            pos += u;
            continue;
        }
        let scanned = recovery::scan_range(dev, geo, pos, None, rules, |h, _| {
            bound = bound.max(h.durable_through);
            Ok(())
        });
        match scanned.stop {
            StopOrEnd::Stop(s) => {
                pos = s.position + u;
                candidates.push(Damage {
                    position: s.position,
                    what: s.what,
                });
                in_gap = true;
            }
            StopOrEnd::End => break,
        }
    }
    candidates.retain(|d| d.position < bound);
    candidates
}

fn print_human(r: &Report) {
    println!("device               {}", r.device_spec);
    for c in &r.superblocks {
        println!("{}", c.line());
    }
    if let (Some(h), Some(t)) = (r.head, r.tail) {
        println!(
            "verified             positions {h}..{t} ({}): {} batches, {} records; checksums, positions, hash chain and epochs",
            bytes(r.verified_bytes),
            r.batches,
            r.records
        );
    }
    if let Some(e) = &r.end {
        println!("end                  {}", e.describe());
    }
    for d in &r.damage {
        println!("DAMAGE at position {}: {}", d.position, d.what);
    }
    if let Some(why) = &r.open_refused {
        println!("{}", examined::refusal_line(why));
    }
    match r.verdict {
        "damage" => {
            if r.damage.is_empty() {
                if let Some(e) = &r.error {
                    println!("DAMAGE               {e}");
                }
            }
            println!(
                "result               DAMAGED: the log will not open until this is resolved (nothing was changed)"
            )
        }
        _ if r.open_refused.is_some() => println!(
            "result               DEVICE REFUSED: the log checks out, but serve will not open it on this device (see the warning; nothing was changed)"
        ),
        "torn-tail" => {
            println!("result               OK (torn tail past the durable point, no damage)")
        }
        _ => println!("result               OK"),
    }
}
