//! Looking at a log without changing it: the same superblock choice, scan, probe and decision as
//! recovery (storage.md §5, steps 1–3 and 5), minus the flush and the superblock writes. For
//! operator tools (`nvmq inspect`, `nvmq verify`) that must never write to the device they read.

use std::collections::{HashMap, VecDeque};

use blockdev::BlockDevice;
use nvmq_log::format::{Superblock, SuperblockFault};
use nvmq_log::layout::Geometry;
use nvmq_log::mkfs::read_superblocks;
use nvmq_log::shared::IndexEntry;
use nvmq_log::state::Registry;
use nvmq_log::RetainedBatch;

use crate::scan::{self, ScanStop, StopOrEnd};
use crate::{prepare, RecoveryError};

/// What a read-only examination found: where the log would be cut, and everything a recovery
/// would rebuild from it.
#[derive(Debug, Clone)]
pub struct Examination {
    /// Each slot as read: the copy, or why it is not valid.
    pub copies: [Result<Superblock, SuperblockFault>; 2],
    pub chosen: Superblock,
    pub geometry: Geometry,
    /// End of the last valid batch: where a recovery would cut and new writes would start.
    pub tail: u64,
    /// Where and why the scan from the recovery point stopped (always at `tail`).
    pub stop: ScanStop,
    /// Bytes of valid-looking batches the probe found past the tail (unacknowledged writes that
    /// a recovery would fence off).
    pub valid_past_tail: u64,
    /// Largest epoch in the scan and the probe.
    pub max_epoch: u64,
    /// Header checksum of the last valid batch: what the next batch must name as its link.
    pub last_hash: u32,
    /// Largest "durable through" in any batch header scanned.
    pub max_durable_through: u64,
    /// Batches and records scanned from the recovery point.
    pub batches: u64,
    pub records: u64,
    /// Bytes read above and below the recovery point.
    pub scanned_bytes: u64,
    pub indexed_bytes: u64,
    pub registry: Registry,
    pub index: HashMap<u32, VecDeque<IndexEntry>>,
    pub retained: VecDeque<RetainedBatch>,
}

/// Examines the log on `dev` read-only: it issues reads and nothing else (no flush, no write), so
/// it may run over a device wrapper that refuses both. Damage in acknowledged data is the same
/// error recovery would refuse the open with.
///
/// Without the flush recovery starts with, what is read may include writes still in a volatile
/// cache; on a device that no process is writing to, that is what the medium holds.
pub fn examine<D: BlockDevice + ?Sized>(dev: &mut D) -> Result<Examination, RecoveryError> {
    let copies = read_superblocks(dev);
    let (choice, geo) = prepare(dev, &copies)?;
    let sb = choice.chosen;
    let scanned = scan::recover_scan(dev, &geo, &sb)?;
    let below = scan::index_below(dev, &geo, &sb, &scanned)?;
    let stop = match &scanned.stop {
        StopOrEnd::Stop(s) => s.clone(),
        // recover_scan refuses a scan without a stop, so this is only a guard.
        StopOrEnd::End => ScanStop {
            position: scanned.cut,
            what: "end of the scanned range".into(),
            read_error: false,
        },
    };
    Ok(Examination {
        copies,
        chosen: sb,
        geometry: geo,
        tail: scanned.cut,
        stop,
        valid_past_tail: scanned.valid_past_cut,
        max_epoch: scanned.max_epoch,
        last_hash: scanned.last_hash,
        max_durable_through: scanned.max_durable_through,
        batches: scanned.batches,
        records: scanned.records,
        scanned_bytes: scanned.bytes_read,
        indexed_bytes: below.bytes_read,
        registry: below.registry,
        index: below.index,
        retained: below.retained,
    })
}
