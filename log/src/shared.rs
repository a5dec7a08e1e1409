//! What the writer publishes for readers: durable positions, the partition table and the index.
//! Only durable batches ever enter it, so a reader can never be served a record that a power cut
//! could take back (storage.md §1, "Reads keep the promise too").

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::cache::BatchCache;

/// One batch's share of a partition: the partition's records in that batch start at
/// `first_offset` and run to `end_offset` (exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub first_offset: u64,
    pub end_offset: u64,
    pub batch_position: u64,
    pub batch_length: u32,
    /// The epoch the batch was written in: a valid batch of another epoch at that position is
    /// a stale one that a misdirected write failed to replace (storage.md §4.2).
    pub epoch: u64,
    /// Bytes the partition's records take in the batch (`format::record_size` of each): what
    /// per-partition sizes (retention.bytes, DescribeLogDirs) add up.
    pub bytes: u32,
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

    /// Bytes of the retained records at or past `from` (a batch holding `from` counts whole).
    pub fn bytes_from(&self, from: u64) -> u64 {
        let i = self.entries.partition_point(|e| e.end_offset <= from);
        self.entries.range(i..).map(|e| u64::from(e.bytes)).sum()
    }

    /// Where the records from `from` on would start if their oldest batches went while at least
    /// `keep` bytes remain (Kafka's retention.bytes deletes whole segments while what remains
    /// is still at least the limit; here a log batch is the unit). None when none may go.
    pub fn start_keeping(&self, from: u64, keep: u64) -> Option<u64> {
        let i = self.entries.partition_point(|e| e.end_offset <= from);
        let mut total = self.bytes_from(from);
        let mut start = None;
        for e in self.entries.range(i..) {
            let b = u64::from(e.bytes);
            if total.saturating_sub(b) < keep || total < b {
                break;
            }
            total -= b;
            start = Some(e.end_offset);
        }
        start
    }
}

/// Buckets of a [`Pow2Histogram`]: bucket `i` counts values below 2^i and (past bucket 0) at
/// least 2^(i-1); the last one also takes everything larger.
pub const POW2_BUCKETS: usize = 23;

/// A histogram of whole numbers in power-of-two buckets, fixed in size so that the stats stay a
/// plain `Copy` value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pow2Histogram {
    pub buckets: [u64; POW2_BUCKETS],
    pub count: u64,
    pub sum: u64,
}

impl Pow2Histogram {
    /// Exclusive upper bound of bucket `i` (the last bucket is unbounded).
    pub fn bucket_bound(i: usize) -> u64 {
        1u64 << i
    }

    pub fn record(&mut self, value: u64) {
        // The first bucket whose bound exceeds the value.
        let i = (u64::BITS - value.leading_zeros()) as usize;
        self.buckets[i.min(POW2_BUCKETS - 1)] += 1;
        self.count += 1;
        self.sum = self.sum.saturating_add(value);
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
    /// Checkpoints completed (each one or more batches), and their batches.
    pub checkpoints: u64,
    pub checkpoint_batches: u64,
    /// Log bytes the newest checkpoint took.
    pub checkpoint_bytes: u64,
    /// Partitions in the registry, and the bytes their entries take in a checkpoint.
    pub registry_partitions: u64,
    pub registry_bytes: u64,
    /// The most log bytes the registry's checkpoint may take (`state::checkpoint_budget`).
    pub checkpoint_budget: u64,
    pub reads: u64,
    /// Of `reads`, those made on a queue pair of the reader's own (`DirectReads`), not
    /// through the writer.
    pub direct_reads: u64,
    pub corrupt_reads: u64,
    /// Batches (and their device bytes) that `on_full = drop-oldest` freed to make room although
    /// no retention setting had expired them yet (storage.md §4.3: never silently).
    pub dropped_unexpired_batches: u64,
    pub dropped_unexpired_bytes: u64,
    /// Flush latency in microseconds, submission to completion as the writer sees it.
    pub flush_latency_us: Pow2Histogram,
    /// Appends acknowledged each time D moved over some (in the default mode: per flush).
    pub records_per_flush: Pow2Histogram,
    /// Append to acknowledgement in microseconds: from the writer taking the append to the ack
    /// (after the covering flush in the default mode).
    pub ack_latency_us: Pow2Histogram,
}

#[derive(Debug, Default)]
pub struct SharedState {
    /// D: every byte below is durable.
    pub durable: u64,
    /// Oldest retained position.
    pub head: u64,
    pub partitions: HashMap<u32, PartitionView>,
    /// (topic, index) → id of every partition in `partitions` (kept by `insert_partition` and
    /// `remove_partition`): looking a partition up by name must not scan them all.
    pub names: HashMap<(String, u32), u32>,
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

impl SharedState {
    /// Publishes a partition (with its name in `names`).
    pub fn insert_partition(&mut self, id: u32, view: PartitionView) {
        self.names.insert((view.topic.clone(), view.index), id);
        self.partitions.insert(id, view);
    }

    /// Unpublishes a deleted partition: readers are refused from now on.
    pub fn remove_partition(&mut self, id: u32) -> Option<PartitionView> {
        let v = self.partitions.remove(&id)?;
        let key = (v.topic.clone(), v.index);
        if self.names.get(&key) == Some(&id) {
            self.names.remove(&key);
        }
        Some(v)
    }
}

/// The state plus a condition variable that wakes readers waiting for new durable data.
#[derive(Debug, Default)]
pub struct Shared {
    state: Mutex<SharedState>,
    changed: Condvar,
    /// Copies of the newest durable batches (its own lock: readers at the tail take it, not the
    /// state's).
    cache: Mutex<BatchCache>,
    /// The log was asked to close (`Log::close`): the writer finishes what it holds and stops.
    close: AtomicBool,
    /// Threads in `wait_until`: `notify` makes no system call when there are none.
    waiters: AtomicUsize,
    /// The writer takes no more requests (it stopped, or its owner dropped it).
    writer_gone: AtomicBool,
}

impl Shared {
    /// Shared state with a tail cache of `cache_bytes`.
    pub fn with_cache(cache_bytes: usize) -> Shared {
        Shared {
            cache: Mutex::new(BatchCache::new(cache_bytes)),
            ..Shared::default()
        }
    }

    /// Asks the writer to finish what it holds and stop.
    pub fn request_close(&self) {
        self.close.store(true, Ordering::SeqCst);
    }

    /// The writer takes no more requests from now on.
    pub fn mark_writer_gone(&self) {
        self.writer_gone.store(true, Ordering::SeqCst);
    }

    /// Whether the writer takes no more requests.
    pub fn writer_gone(&self) -> bool {
        self.writer_gone.load(Ordering::SeqCst)
    }

    /// Whether the log was asked to close.
    pub fn close_requested(&self) -> bool {
        self.close.load(Ordering::SeqCst)
    }

    /// The tail cache.
    pub fn cache(&self) -> MutexGuard<'_, BatchCache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn lock(&self) -> MutexGuard<'_, SharedState> {
        // A panic while holding the lock would be a bug in the writer; readers still want to see
        // the state it left rather than poison everything.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the threads waiting for a change; call after changing the state (under its lock).
    pub fn notify(&self) {
        // A waiter registers under the state's lock before it looks at the state, so a change
        // made under the lock before this call is either seen by it or finds it registered.
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.changed.notify_all();
        }
    }

    /// Waits until `ready` holds or the timeout passes; returns the guard either way.
    pub fn wait_until<'a>(
        &'a self,
        timeout: std::time::Duration,
        mut ready: impl FnMut(&SharedState) -> bool,
    ) -> MutexGuard<'a, SharedState> {
        let guard = self.lock();
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let (g, _) = self
            .changed
            .wait_timeout_while(guard, timeout, |s| {
                !ready(s) && s.fatal.is_none() && !s.stopped
            })
            .unwrap_or_else(|e| e.into_inner());
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        g
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_power_of_two_buckets() {
        let mut f = Pow2Histogram::default();
        f.record(0);
        f.record(1); // [1, 2)
        f.record(3000); // [2048, 4096)
        f.record(u64::MAX);
        assert_eq!(f.buckets[0], 1);
        assert_eq!(f.buckets[1], 1);
        assert_eq!(f.buckets[12], 1);
        assert_eq!(f.buckets[POW2_BUCKETS - 1], 1);
        assert_eq!(f.count, 4);
        assert_eq!(f.sum, u64::MAX);
    }

    #[test]
    fn locate_finds_the_batch_holding_an_offset() {
        let mut v = PartitionView::default();
        for (i, (a, b)) in [(0u64, 3u64), (3, 4), (10, 12)].iter().enumerate() {
            v.entries.push_back(IndexEntry {
                first_offset: *a,
                end_offset: *b,
                batch_position: i as u64 * 4096,
                batch_length: 4096,
                epoch: 1,
                bytes: 100,
            });
        }
        assert_eq!(v.locate(0).unwrap().batch_position, 0);
        assert_eq!(v.locate(2).unwrap().batch_position, 0);
        assert_eq!(v.locate(3).unwrap().batch_position, 4096);
        assert!(v.locate(5).is_none());
        assert_eq!(v.locate(11).unwrap().batch_position, 8192);
        assert!(v.locate(12).is_none());
        // 100 bytes a batch: sizes from an offset, and where to start to keep at least so many.
        assert_eq!(v.bytes_from(0), 300);
        assert_eq!(v.bytes_from(3), 200);
        assert_eq!(v.bytes_from(12), 0);
        assert_eq!(v.start_keeping(0, 300), None);
        assert_eq!(v.start_keeping(0, 250), None);
        assert_eq!(v.start_keeping(0, 200), Some(3));
        assert_eq!(v.start_keeping(0, 150), Some(3));
        assert_eq!(v.start_keeping(0, 100), Some(4));
        assert_eq!(v.start_keeping(0, 0), Some(12));
        assert_eq!(v.start_keeping(3, 100), Some(4));
    }
}
