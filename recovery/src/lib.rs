//! Opening an nvmq log after any stop (storage.md §5): flush, choose the superblock, scan from the
//! recovery point, tell a torn tail from damage in acknowledged data, cut the tail, and fence the
//! cut with a new epoch before the writer takes a single append.
#![forbid(unsafe_code)]

mod choose;
mod cursor;
mod error;
mod examine;
mod scan;

pub use choose::{choose, slot_name, Choice};
pub use error::RecoveryError;
pub use examine::{examine, Examination};
pub use scan::{scan_range, ChainRules, ScanStop, Scanned, StopOrEnd};

use std::time::{Duration, Instant};

use blockdev::{flush_sync, BlockDevice};
use nvmq_log::backfill::Backfill;
use nvmq_log::format::{Superblock, SuperblockFault, FORMAT_VERSION};
use nvmq_log::layout::Geometry;
use nvmq_log::mkfs::{read_superblocks, write_superblock};
use nvmq_log::{LogConfig, Resume, Writer};

/// What recovery found and did; printed by the tools and logged by the broker.
#[derive(Debug, Clone)]
pub struct RecoveryReport {
    /// Each slot: the copy's sequence, or why it was not valid.
    pub copies: [Result<u64, String>; 2],
    pub chosen: Superblock,
    pub head: u64,
    pub recovery_point: u64,
    /// Bytes read by the recovery scan (from the recovery point) and the probe.
    pub scanned_bytes: u64,
    /// Bytes read to rebuild the index below the recovery point.
    pub indexed_bytes: u64,
    pub batches: u64,
    pub records: u64,
    /// Where the log now ends and new writes start.
    pub cut_at: u64,
    /// Why the scan stopped at the cut.
    pub stop: String,
    /// Bytes past the cut that held valid-looking batches (unacknowledged, now fenced off).
    pub discarded_valid_batches: u64,
    pub new_epoch: u64,
    pub duration: Duration,
    pub index_duration: Duration,
    /// The log range whose index is rebuilt in the background after open, if any.
    pub backfill: Option<(u64, u64)>,
}

impl std::fmt::Display for RecoveryReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "recovered from superblock {} (sequence {}): scanned {} B from recovery point {} in {:.1} ms ({} batches, {} records); cut at {} ({}); new epoch {}; ",
            slot_name(self.chosen.copy),
            self.chosen.sequence,
            self.scanned_bytes,
            self.recovery_point,
            self.duration.as_secs_f64() * 1e3,
            self.batches,
            self.records,
            self.cut_at,
            self.stop,
            self.new_epoch,
        )?;
        match self.backfill {
            Some((from, to)) => write!(
                f,
                "index below the recovery point ({} B from {from}) rebuilt in the background",
                to - from
            ),
            None => write!(
                f,
                "index rebuilt over {} B in {:.1} ms",
                self.indexed_bytes,
                self.index_duration.as_secs_f64() * 1e3
            ),
        }
    }
}

/// When the index below the recovery point is rebuilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexMode {
    /// After the writer starts, through its read path (`Log::start` runs it): open time grows
    /// only with the bytes above the recovery point. Damage found there is reported by reads.
    Background,
    /// Before returning: open reads the whole retained log and refuses damage anywhere in it.
    Eager,
}

/// Recovers the log on `dev` and returns the state the writer resumes from, with the index below
/// the recovery point left to a background rebuild. Writes only the two superblock updates that
/// fence the cut.
pub fn recover<D: BlockDevice + ?Sized>(
    dev: &mut D,
) -> Result<(Resume, RecoveryReport), RecoveryError> {
    recover_with(dev, IndexMode::Background)
}

/// [`recover`], choosing when the index below the recovery point is rebuilt.
pub fn recover_with<D: BlockDevice + ?Sized>(
    dev: &mut D,
    mode: IndexMode,
) -> Result<(Resume, RecoveryReport), RecoveryError> {
    recover_for(dev, mode, None)
}

/// [`recover_with`]; given the configuration of the writer that will run on the device, also
/// refuses, before writing anything, a queue too shallow for that writer.
fn recover_for<D: BlockDevice + ?Sized>(
    dev: &mut D,
    mode: IndexMode,
    writer: Option<&LogConfig>,
) -> Result<(Resume, RecoveryReport), RecoveryError> {
    let started = Instant::now();
    // 1. Nothing read before this flush may be trusted as durable.
    flush_sync(dev).map_err(|source| RecoveryError::Device {
        op: "flush before recovery",
        source,
    })?;
    let copies = read_superblocks(dev);
    let (choice, geo) = prepare(dev, &copies)?;
    let sb = choice.chosen;
    // Before the first write (the fence below): a device whose blocks outgrew the log's write
    // unit, or that cannot transfer one, or (for a writer) whose queue is too shallow, is
    // refused untouched (`Geometry::check_for_writer`, which inspect and verify run too).
    match writer {
        Some(cfg) => geo.check_for_writer(dev.info(), dev.queue_depth(), cfg)?,
        None => geo.check_device(dev.info())?,
    };

    // 2–3. Scan from the recovery point, probe past the stop, decide.
    let scanned = scan::recover_scan(dev, &geo, &sb)?;
    let duration_scan = started.elapsed();

    // 4. Fence the cut: a new epoch starting at it, in both copies, before any write.
    let other_epochs = copies.iter().flatten().map(|c| c.epoch).max().unwrap_or(0);
    // Epochs below 2^63 only (superblock and batch header decoding refuse larger ones): no wrap.
    let new_epoch = scanned.max_epoch.max(other_epochs).max(sb.epoch) + 1;
    let first = Superblock {
        version: FORMAT_VERSION,
        copy: 1 - sb.copy,
        sequence: sb.sequence + 1,
        parent: sb.checksum(),
        durable_through: scanned.cut,
        epoch: new_epoch,
        epoch_start: scanned.cut,
        ..sb
    };
    write_superblock(dev, &first)?;
    let second = Superblock {
        copy: sb.copy,
        sequence: sb.sequence + 2,
        parent: first.checksum(),
        ..first
    };
    write_superblock(dev, &second)?;

    // 5. Rebuild what derives from the log: the index below the recovery point, in the
    //    background once the writer runs (recovery time must not grow with the log), or here.
    let index_started = Instant::now();
    let (below, backfill) = if mode == IndexMode::Background && sb.head < sb.recovery_point {
        let above = scan::Below {
            registry: scanned.registry.clone(),
            index: scanned.index.clone(),
            retained: scanned.retained.clone(),
            bytes_read: 0,
        };
        let job = Backfill {
            from: sb.head,
            to: sb.recovery_point,
            geo,
            scan: scan::backfill_scan,
        };
        (above, Some(job))
    } else {
        (scan::index_below(dev, &geo, &sb, &scanned)?, None)
    };
    let index_duration = index_started.elapsed();

    let mut superblocks = [first, first];
    superblocks[usize::from(second.copy)] = second;
    let report = RecoveryReport {
        copies: [0, 1].map(|i| match &copies[i] {
            Ok(c) => Ok(c.sequence),
            Err(e) => Err(e.to_string()),
        }),
        chosen: sb,
        head: sb.head,
        recovery_point: sb.recovery_point,
        scanned_bytes: scanned.bytes_read,
        indexed_bytes: below.bytes_read,
        batches: scanned.batches,
        records: scanned.records,
        cut_at: scanned.cut,
        stop: scanned.stop.to_string(),
        discarded_valid_batches: scanned.valid_past_cut,
        new_epoch,
        duration: duration_scan,
        index_duration,
        backfill: backfill.map(|b| (b.from, b.to)),
    };
    tracing::info!(%report, "recovery done");
    let resume = Resume {
        superblocks,
        newest: second.copy,
        tail: scanned.cut,
        last_hash: scanned.last_hash,
        registry: below.registry,
        index: below.index,
        retained: below.retained,
        backfill,
    };
    Ok((resume, report))
}

/// [`open`], choosing when the index below the recovery point is rebuilt.
pub fn open_with<D: BlockDevice>(
    mut dev: D,
    cfg: LogConfig,
    mode: IndexMode,
) -> Result<(Writer<D>, RecoveryReport), RecoveryError> {
    let (resume, report) = recover_for(&mut dev, mode, Some(&cfg))?;
    let w = Writer::new(dev, cfg, resume)?;
    Ok((w, report))
}

/// Recovers and starts a writer over the device.
pub fn open<D: BlockDevice>(
    mut dev: D,
    cfg: LogConfig,
) -> Result<(Writer<D>, RecoveryReport), RecoveryError> {
    let (resume, report) = recover_for(&mut dev, IndexMode::Background, Some(&cfg))?;
    let w = Writer::new(dev, cfg, resume)?;
    Ok((w, report))
}

/// Chooses the superblock copy and checks its geometry against the device: the part of opening
/// that recovery and the read-only [`examine`] share.
pub(crate) fn prepare<D: BlockDevice + ?Sized>(
    dev: &mut D,
    copies: &[Result<Superblock, SuperblockFault>; 2],
) -> Result<(Choice, Geometry), RecoveryError> {
    let choice = choose(copies)?;
    let sb = choice.chosen;
    let needed = sb.log_start + sb.log_size;
    if dev.info().capacity < needed {
        return Err(RecoveryError::DeviceTooSmall {
            capacity: dev.info().capacity,
            needed,
        });
    }
    // Only what reading needs: a read-only examination may look at a log on a device it could
    // not be written on (to drain it before a new format there).
    let geo = Geometry::from_superblock(&sb, dev.info().logical_block_size);
    geo.check_readable(dev.info())?;
    Ok((choice, geo))
}
