//! `nvmq inspect`: what a log holds, read without writing a byte.

use anyhow::{anyhow, Result};
use nvmq_log::format::{BatchKind, RecordKind, Superblock};
use recovery::{ChainRules, Examination, RecoveryError, StopOrEnd};
use serde::Serialize;

use crate::describe::{bytes, CopyReport, DeviceReport, GeometryReport};
use crate::examined::{self, Ending};
use crate::Status;

#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Example:\n  nvmq inspect --device file:/var/lib/nvmq/log.img --records\n\n\
Read-only: the device is opened but never written or flushed.\n\
Exit status: 0 shown (also when it warns that serve would refuse this device: a block larger \
than the log's write unit, a maximum transfer below it, a queue too shallow); 1 error (missing \
or unformatted device); 3 damage found (a damaged superblock pair or damage inside \
acknowledged data)."
)]
pub struct InspectArgs {
    /// The device: `file:<path>` (or a plain path). Repeat it for each device of a broker that
    /// has several.
    #[arg(long, required = true, action = clap::ArgAction::Append)]
    pub device: Vec<String>,
    /// Also list every retained record with its log position, partition and offset.
    #[arg(long)]
    pub records: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What the superblock copy in use says.
#[derive(Serialize, Debug)]
struct SuperblockReport {
    chosen: char,
    #[serde(flatten)]
    geometry: GeometryReport,
    head: u64,
    recovery_point: u64,
    checkpoint: u64,
    durable_through: u64,
    epoch: u64,
    epoch_start: u64,
}

impl SuperblockReport {
    fn new(sb: &Superblock) -> SuperblockReport {
        SuperblockReport {
            chosen: recovery::slot_name(sb.copy),
            geometry: GeometryReport::new(sb),
            head: sb.head,
            recovery_point: sb.recovery_point,
            checkpoint: sb.checkpoint,
            durable_through: sb.durable_through,
            epoch: sb.epoch,
            epoch_start: sb.epoch_start,
        }
    }
}

/// What the scan of the log found.
#[derive(Serialize, Debug)]
struct LogReport {
    tail: u64,
    end: Ending,
    used_bytes: u64,
    free_bytes: u64,
    used_percent: f64,
    retained_batches: usize,
    retained_records: u64,
}

#[derive(Serialize, Debug)]
struct PartitionReport {
    id: u32,
    topic: String,
    index: u32,
    /// Retained offsets: [start_offset, next_offset).
    start_offset: u64,
    next_offset: u64,
    /// Log positions of the retained batches holding it: [first, end).
    first_position: Option<u64>,
    end_position: Option<u64>,
}

#[derive(Serialize, Debug)]
struct RecordLine {
    position: u64,
    batch: u64,
    kind: &'static str,
    partition: u32,
    offset: u64,
    len: u32,
}

#[derive(Serialize, Debug)]
struct Report {
    device_spec: String,
    device: DeviceReport,
    superblocks: Vec<CopyReport>,
    /// The copy in use; None when no copy could be chosen.
    superblock: Option<SuperblockReport>,
    /// None when the log could not be scanned (no log, or damage).
    log: Option<LogReport>,
    partitions: Vec<PartitionReport>,
    /// Why the log could not be examined (damage or no log); None when it could.
    error: Option<String>,
    /// Where damage was found, when it was.
    damage_position: Option<u64>,
    /// Why `nvmq serve` would refuse to open the log on this device (its geometry does not fit
    /// the log); None when it would open it.
    open_refused: Option<String>,
    records: Option<Vec<RecordLine>>,
}

pub fn run(a: InspectArgs) -> Result<Status> {
    crate::each_device(&a.device, a.json, |d| run_one(&a, d))
}

fn run_one(a: &InspectArgs, device: &str) -> Result<Status> {
    let pb = crate::progress::bytes_bar(0, "reading the log");
    let (mut dev, spec) = examined::open_read_only(device, &pb)?;
    let ex = examined::examine(&mut dev, &pb);
    let mut report = Report {
        device_spec: device.to_string(),
        device: DeviceReport::new(blockdev::BlockDevice::info(&dev), spec.backend()),
        superblocks: ex.copy_reports(),
        superblock: recovery::choose(&ex.copies)
            .ok()
            .map(|c| SuperblockReport::new(&c.chosen)),
        log: None,
        partitions: Vec::new(),
        error: None,
        damage_position: None,
        open_refused: examined::open_refusal(&dev, &ex.copies),
        records: None,
    };
    let status = match &ex.result {
        Ok(e) => {
            let end = examined::ending(&mut dev, e);
            report.log = Some(log_report(e, end));
            report.partitions = partitions(e);
            if a.records {
                report.records = Some(list_records(&mut dev, e));
            }
            Status::Ok
        }
        Err(RecoveryError::NotFormatted { .. }) => {
            pb.finish_and_clear();
            let err = ex.result.as_ref().err().map(|e| e.to_string());
            report.error = err.clone();
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print_copies(&report);
            }
            return Err(anyhow!("{}: {}", device, err.unwrap_or_default()));
        }
        Err(e) => {
            report.error = Some(e.to_string());
            if let RecoveryError::Damage { position, .. } = e {
                report.damage_position = Some(*position);
            }
            Status::Damage
        }
    };
    pb.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_human(&report);
    }
    Ok(status)
}

fn log_report(e: &Examination, end: Ending) -> LogReport {
    let sb = &e.chosen;
    let used = e.tail - sb.head;
    LogReport {
        tail: e.tail,
        end,
        used_bytes: used,
        free_bytes: sb.log_size.saturating_sub(used),
        used_percent: used as f64 * 100.0 / sb.log_size as f64,
        retained_batches: e.retained.len(),
        retained_records: examined::retained_records(e),
    }
}

fn partitions(e: &Examination) -> Vec<PartitionReport> {
    e.registry
        .iter()
        .map(|p| {
            let entries = e.index.get(&p.id);
            PartitionReport {
                id: p.id,
                topic: p.topic.clone(),
                index: p.index,
                start_offset: p.start_offset,
                next_offset: p.next_offset,
                first_position: entries.and_then(|v| v.front()).map(|x| x.batch_position),
                end_position: entries
                    .and_then(|v| v.back())
                    .map(|x| x.batch_position + u64::from(x.batch_length)),
            }
        })
        .collect()
}

/// Every record from the head to the tail, read with the same checks as recovery's scan.
fn list_records(dev: &mut examined::Device, e: &Examination) -> Vec<RecordLine> {
    let mut out = Vec::new();
    let rules = ChainRules {
        first_link: None,
        epoch: 0,
        epoch_start: u64::MAX,
    };
    let scanned = recovery::scan_range(
        dev,
        &e.geometry,
        e.chosen.head,
        Some(e.tail),
        rules,
        |h, recs| {
            for r in recs {
                out.push(RecordLine {
                    position: r.header.position,
                    batch: h.position,
                    kind: match (h.kind, r.header.kind) {
                        (BatchKind::Checkpoint, _) | (_, RecordKind::Checkpoint) => "checkpoint",
                        (_, RecordKind::Data) => "data",
                        (_, RecordKind::CreatePartition) => "create-partition",
                        (_, RecordKind::DeletePartition) => "delete-partition",
                    },
                    partition: r.header.partition,
                    offset: r.header.offset,
                    len: r.header.len,
                });
            }
            Ok(())
        },
    );
    if let StopOrEnd::Stop(s) = scanned.stop {
        // The examination passed over the same range, so this is a read that failed only now.
        tracing::warn!(position = s.position, what = %s.what, "record listing stopped early");
    }
    out
}

fn print_copies(r: &Report) {
    let engine = match &r.device.engine {
        Some(e) => format!("; I/O engine {e}"),
        None => String::new(),
    };
    println!(
        "device               {} ({}{engine})",
        r.device_spec, r.device.identity
    );
    for c in &r.superblocks {
        println!("{}", c.line());
    }
}

fn print_human(r: &Report) {
    print_copies(r);
    if let Some(b) = &r.superblock {
        println!("using superblock     {}", b.chosen);
        let g = &b.geometry;
        println!("format id            {}", g.format_id);
        println!(
            "geometry             write unit {} B, log {} at byte {}, window {}, max batch {}",
            g.write_unit,
            bytes(g.log_size),
            g.log_start,
            bytes(g.window),
            bytes(u64::from(g.max_batch))
        );
        println!(
            "epoch                {} (from position {})",
            b.epoch, b.epoch_start
        );
        println!("head                 {}", b.head);
        println!(
            "recovery point       {} (checkpoint at {})",
            b.recovery_point, b.checkpoint
        );
        println!(
            "durable through      {} (as the superblock records it)",
            b.durable_through
        );
    }
    if let Some(why) = &r.open_refused {
        println!("{}", examined::refusal_line(why));
    }
    let Some(l) = &r.log else {
        if let Some(e) = &r.error {
            println!("DAMAGE               {e}");
        }
        return;
    };
    println!("tail                 {} ({})", l.tail, l.end.describe());
    println!(
        "space                {} used ({:.1}%), {} free; {} batches, {} records retained",
        bytes(l.used_bytes),
        l.used_percent,
        bytes(l.free_bytes),
        l.retained_batches,
        l.retained_records
    );
    if r.partitions.is_empty() {
        println!("partitions           none");
    } else {
        println!("partitions");
        println!(
            "  {:>5}  {:<24} {:>14} {:>14}  positions",
            "id", "topic/index", "start offset", "next offset"
        );
        for p in &r.partitions {
            let positions = match (p.first_position, p.end_position) {
                (Some(a), Some(b)) => format!("{a}..{b}"),
                _ => "-".into(),
            };
            println!(
                "  {:>5}  {:<24} {:>14} {:>14}  {positions}",
                p.id,
                format!("{}/{}", p.topic, p.index),
                p.start_offset,
                p.next_offset
            );
        }
    }
    if let Some(recs) = &r.records {
        println!("records ({})", recs.len());
        println!(
            "  {:>12} {:>12}  {:<16} {:>9} {:>10} {:>8}",
            "position", "batch", "kind", "partition", "offset", "bytes"
        );
        for x in recs {
            println!(
                "  {:>12} {:>12}  {:<16} {:>9} {:>10} {:>8}",
                x.position, x.batch, x.kind, x.partition, x.offset, x.len
            );
        }
    }
}
