//! What the writer publishes for readers: durable positions, the partition table and the index.
//! Only durable batches ever enter it, so a reader can never be served a record that a power cut
//! could take back (storage.md §1, "Reads keep the promise too").

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};

/// One batch's share of a partition: the partition's records in that batch start at
/// `first_offset` and run to `end_offset` (exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub first_offset: u64,
    pub end_offset: u64,
    pub batch_position: u64,
    pub batch_length: u32,
}

/// A partition as readers see it.
#[derive(Debug, Clone, Default)]
pub struct PartitionView {
    pub topic: String,
    pub index: u32,
    /// First retained offset.
    pub start_offset: u64,
    /// One past the last durable offset: the high watermark.
    pub durable_end: u64,
    /// Offset → batch, in offset order, for durable retained batches.
    pub entries: VecDeque<IndexEntry>,
}

impl PartitionView {
    /// The batch holding `offset`, if it is retained and durable.
    pub fn locate(&self, offset: u64) -> Option<IndexEntry> {
        let i = self.entries.partition_point(|e| e.end_offset <= offset);
        self.entries
            .get(i)
            .copied()
            .filter(|e| e.first_offset <= offset && offset < e.end_offset)
    }
}

/// Counters the writer keeps; figures for `bench` and metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriterStats {
    pub appends_acked: u64,
    pub payload_bytes_acked: u64,
    pub batches_written: u64,
    pub device_bytes_written: u64,
    pub flushes: u64,
    pub superblock_writes: u64,
    pub checkpoints: u64,
    pub reads: u64,
    pub corrupt_reads: u64,
}

#[derive(Debug, Default)]
pub struct SharedState {
    /// D: every byte below is durable.
    pub durable: u64,
    /// Oldest retained position.
    pub head: u64,
    pub partitions: HashMap<u32, PartitionView>,
    /// Set once the writer has stopped after a fatal error.
    pub fatal: Option<String>,
    pub stats: WriterStats,
    pub epoch: u64,
    pub stopped: bool,
    /// The index below the recovery point is still being rebuilt (readers below it wait).
    pub backfill_pending: bool,
    /// Why the rebuild stopped short: damage below the recovery point.
    pub backfill_error: Option<String>,
    /// Bytes the rebuild read.
    pub backfill_bytes: u64,
    /// What the background scrub found.
    pub scrub: crate::scrub::ScrubState,
}

/// The state plus a condition variable that wakes readers waiting for new durable data.
#[derive(Debug, Default)]
pub struct Shared {
    state: Mutex<SharedState>,
    changed: Condvar,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, SharedState> {
        // A panic while holding the lock would be a bug in the writer; readers still want to see
        // the state it left rather than poison everything.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn notify(&self) {
        self.changed.notify_all();
    }

    /// Waits until `ready` holds or the timeout passes; returns the guard either way.
    pub fn wait_until<'a>(
        &'a self,
        timeout: std::time::Duration,
        mut ready: impl FnMut(&SharedState) -> bool,
    ) -> MutexGuard<'a, SharedState> {
        let guard = self.lock();
        let (g, _) = self
            .changed
            .wait_timeout_while(guard, timeout, |s| {
                !ready(s) && s.fatal.is_none() && !s.stopped
            })
            .unwrap_or_else(|e| e.into_inner());
        g
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_finds_the_batch_holding_an_offset() {
        let mut v = PartitionView::default();
        for (i, (a, b)) in [(0u64, 3u64), (3, 4), (10, 12)].iter().enumerate() {
            v.entries.push_back(IndexEntry {
                first_offset: *a,
                end_offset: *b,
                batch_position: i as u64 * 4096,
                batch_length: 4096,
            });
        }
        assert_eq!(v.locate(0).unwrap().batch_position, 0);
        assert_eq!(v.locate(2).unwrap().batch_position, 0);
        assert_eq!(v.locate(3).unwrap().batch_position, 4096);
        assert!(v.locate(5).is_none());
        assert_eq!(v.locate(11).unwrap().batch_position, 8192);
        assert!(v.locate(12).is_none());
    }
}
