//! What `inspect` and `verify` share: opening a device read-only, examining its log with
//! recovery's own read-only scan, and saying how the log ends.

use anyhow::Result;
use blockdev::{BlockDevice, SyncIo};
use indicatif::ProgressBar;
use nvmq_log::format::{BatchHeader, HeaderFault, Superblock, SuperblockFault};
use nvmq_log::layout::Geometry;
use nvmq_log::mkfs::read_superblocks;
use nvmq_log::LogConfig;
use recovery::{Examination, RecoveryError};
use serde::Serialize;

use crate::describe::CopyReport;
use crate::devspec::DeviceSpec;
use crate::readonly::ReadOnly;

pub type Device = ReadOnly<Box<dyn BlockDevice>>;

/// Opens an existing device so that nothing can be written to it; reads advance `pb`.
pub fn open_read_only(spec_text: &str, pb: &ProgressBar) -> Result<(Device, DeviceSpec)> {
    let spec: DeviceSpec = spec_text.parse()?;
    // Read-only at the OS level too: it runs on a read-only file and beside a running broker.
    let file_opts = blockdev::file::FileOptions {
        read_only: true,
        ..Default::default()
    };
    let dev = spec.open_with(None, file_opts, |_| Ok(()))?;
    let pb = pb.clone();
    Ok((ReadOnly::new(dev, move |n| pb.inc(n)), spec))
}

/// Both superblock slots as read, and the examination (or why there is none).
pub struct Examined {
    pub copies: [Result<Superblock, SuperblockFault>; 2],
    pub result: Result<Examination, RecoveryError>,
}

impl Examined {
    pub fn copy_reports(&self) -> Vec<CopyReport> {
        vec![
            CopyReport::new(0, &self.copies[0]),
            CopyReport::new(1, &self.copies[1]),
        ]
    }
}

/// Reads the superblocks, sizes the progress bar from them, and examines the log.
pub fn examine(dev: &mut Device, pb: &ProgressBar) -> Examined {
    let copies = read_superblocks(dev);
    if let Ok(c) = recovery::choose(&copies) {
        let sb = c.chosen;
        // The scan reads the retained log up to the durable point, then probes past it.
        let expect =
            sb.durable_through.saturating_sub(sb.head) + sb.window + u64::from(sb.max_batch);
        pb.set_length(expect.min(sb.log_size.saturating_mul(2)));
    }
    let result = recovery::examine(dev);
    pb.set_length(pb.position().max(1));
    Examined { copies, result }
}

/// Why `nvmq serve` would refuse to open this log on this device, if it would: the device check
/// open runs before it writes (`Geometry::check_for_writer`), for the writer serve runs (the
/// default configuration). None when no superblock can be chosen (the examination says why).
pub fn open_refusal(
    dev: &Device,
    copies: &[Result<Superblock, SuperblockFault>; 2],
) -> Option<String> {
    let sb = recovery::choose(copies).ok()?.chosen;
    let info = dev.info();
    let geo = Geometry::from_superblock(&sb, info.logical_block_size);
    geo.check_for_writer(info, dev.queue_depth(), &LogConfig::default())
        .err()
        .map(|e| e.to_string())
}

/// The warning line inspect and verify print for [`open_refusal`].
pub fn refusal_line(why: &str) -> String {
    format!("WARNING              nvmq serve would refuse to open this log on this device: {why}")
}

/// Data records in the retained log, as the rebuilt index counts them.
pub fn retained_records(e: &Examination) -> u64 {
    e.index
        .values()
        .flat_map(|v| v.iter())
        .map(|x| x.end_offset - x.first_offset)
        .sum()
}

/// How the retained log ends.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    /// `clean`: the block at the tail holds no batch of this log; `torn`: a write past the
    /// durable point did not land whole (normal after a crash; the next open cuts it);
    /// `fenced`: batches of an epoch that an earlier recovery cut away follow (normal).
    pub kind: &'static str,
    pub position: u64,
    pub detail: String,
    /// Bytes of valid-looking unacknowledged batches past the tail.
    pub valid_past_tail: u64,
}

impl Ending {
    pub fn describe(&self) -> String {
        match self.kind {
            "clean" => format!("ends cleanly at {}", self.position),
            "fenced" => format!(
                "ends at {}; what follows is from an epoch an earlier recovery fenced off ({})",
                self.position, self.detail
            ),
            _ => format!(
                "torn tail at {} beyond the durable point ({}{}); normal after a crash: the next open cuts it",
                self.position,
                self.detail,
                if self.valid_past_tail > 0 {
                    format!(
                        "; {} B of unacknowledged batches follow inside the window",
                        self.valid_past_tail
                    )
                } else {
                    String::new()
                }
            ),
        }
    }
}

/// Classifies the stop of a successful examination by looking at the block at the tail.
pub fn ending(dev: &mut Device, e: &Examination) -> Ending {
    let geo = &e.geometry;
    let at = e.tail;
    let mut out = Ending {
        kind: "torn",
        position: at,
        detail: e.stop.what.clone(),
        valid_past_tail: e.valid_past_tail,
    };
    if e.stop.read_error {
        return out;
    }
    let off = geo.segments(at, geo.write_unit)[0].0;
    let header = dev
        .read_at(off, geo.write_unit as usize)
        .ok()
        .map(|b| BatchHeader::decode(&b, geo.format_id, at, geo.write_unit as u32));
    let fenced_epoch = |h: &BatchHeader| at >= e.chosen.epoch_start && h.epoch < e.chosen.epoch;
    match header {
        Some(Err(HeaderFault::Invalid(_))) if e.valid_past_tail == 0 => out.kind = "clean",
        // A header from an earlier lap of the ring: stale, not a tear.
        Some(Err(HeaderFault::Misplaced { header }))
            if e.valid_past_tail == 0 && header.position % geo.log_size == at % geo.log_size =>
        {
            out.kind = "clean"
        }
        Some(Ok((h, _))) if fenced_epoch(&h) && e.valid_past_tail == 0 => out.kind = "fenced",
        _ => {}
    }
    out
}
