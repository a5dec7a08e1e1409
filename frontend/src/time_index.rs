//! ListOffsets by timestamp without scanning a partition each time: a sparse index per
//! partition of (offset, largest record timestamp below that offset), built by one pass over
//! what it does not cover yet and kept in memory, so that a lookup reads only the batches from the
//! last sample whose running maximum is still below the target (a few, when timestamps grow
//! with offsets; correct whatever order they come in).
//!
//! The index follows the partition's end as lookups come (each byte is read once), and is
//! recorded with the partitions' snapshots (`MetaRecord::TimeIndex`, beside the producer state
//! on the partition's device, cut into parts by size); start-up restores the newest one, so the
//! first lookup after a restart reads only the batches written after it. A partition without a
//! recorded index (never looked up, or a log written before indexes were recorded) is indexed
//! from its first record by its first lookup, as before.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use nvmq_log::{Log, LogError};

use crate::batch;
use crate::meta::{MetaRecord, TimeIndexPart, TimesHead, TIME_INDEX_HEADER_LEN, TIME_SAMPLE_LEN};
use crate::part::PartRef;
use crate::snapshot_parts;

/// A sample at most every this many payload bytes (and at every batch below it): ~16 samples
/// per MiB, 16 bytes each.
const SAMPLE_EVERY: usize = 64 << 10;
/// Bytes asked of the log per read while indexing or scanning.
const READ_BYTES: usize = 1 << 20;

#[derive(Default)]
pub struct TimeIndex {
    /// One lock per partition: indexing one (reads of the log) holds up no other.
    parts: Mutex<HashMap<PartRef, Arc<Mutex<Times>>>>,
    /// Batches read for lookups and indexing since start (a figure for tests and metrics).
    batches_read: AtomicU64,
}

/// One partition's samples over the offsets [from, to).
struct Times {
    from: u64,
    to: u64,
    /// (batch base offset, largest timestamp of every record below it from `from`), in
    /// offset order; the timestamps never decrease.
    samples: Vec<(u64, i64)>,
    running: i64,
    /// The largest timestamp seen and the base offset of the batch holding it.
    max: Option<(i64, u64)>,
    since_sample: usize,
    /// `to` when last recorded in a snapshot.
    snapped: Option<u64>,
}

impl Times {
    fn new(at: u64) -> Times {
        Times {
            from: at,
            to: at,
            samples: Vec::new(),
            running: i64::MIN,
            max: None,
            since_sample: 0,
            snapped: None,
        }
    }

    /// A recorded index, if it is one this partition's retained `[start, end)` can use: it covers
    /// no offset past the end (a snapshot past the recovered end could only come from damage),
    /// reaches the retained records, and its samples run in order inside what it covers.
    fn restored(head: TimesHead, samples: Vec<(u64, i64)>, start: u64, end: u64) -> Option<Times> {
        let in_order = samples
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1);
        let inside = |o: u64| head.from <= o && o < head.to;
        let sound = head.from <= head.to
            && head.to <= end
            && head.to >= start
            && in_order
            && samples.iter().all(|s| inside(s.0))
            && head.max.is_none_or(|(_, at)| inside(at));
        sound.then(|| Times {
            from: head.from,
            to: head.to,
            samples,
            running: head.running,
            max: head.max,
            since_sample: usize::try_from(head.since_sample).unwrap_or(usize::MAX),
            snapped: Some(head.to),
        })
    }
}

/// The records of a partition's time index snapshot, in order, each at most `max_payload` bytes.
pub fn records(
    partition: u32,
    head: TimesHead,
    samples: Vec<(u64, i64)>,
    max_payload: usize,
) -> Vec<MetaRecord> {
    let per = max_payload.saturating_sub(TIME_INDEX_HEADER_LEN) / TIME_SAMPLE_LEN;
    snapshot_parts::cut(samples, per, |part, parts, samples| {
        MetaRecord::TimeIndex(TimeIndexPart {
            partition,
            head,
            part,
            parts,
            samples,
        })
    })
}

impl TimeIndex {
    /// Forgets a deleted partition's samples.
    pub fn forget(&self, p: PartRef) {
        self.parts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&p);
    }

    pub fn batches_read(&self) -> u64 {
        self.batches_read.load(Ordering::Relaxed)
    }

    /// `p`'s index as a snapshot records it (`changed_only`: only if it grew since it was last
    /// recorded). None as well for a partition being indexed right now: its lookup holds it while
    /// it reads the log, and the next snapshot records it.
    pub fn snapshot(&self, p: PartRef, changed_only: bool) -> Option<(TimesHead, Vec<(u64, i64)>)> {
        let entry = self
            .parts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&p)
            .cloned()?;
        let mut t = match entry.try_lock() {
            Ok(t) => t,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        if t.to == t.from || (changed_only && t.snapped == Some(t.to)) {
            return None;
        }
        t.snapped = Some(t.to);
        let head = TimesHead {
            from: t.from,
            to: t.to,
            running: t.running,
            max: t.max,
            since_sample: t.since_sample as u64,
        };
        Some((head, t.samples.clone()))
    }

    /// Takes a recorded index of `p` (retained `[start, end)` now) at start-up; false, and `p`
    /// left to be indexed by its first lookup, when it does not fit the partition.
    pub fn restore(
        &self,
        p: PartRef,
        head: TimesHead,
        samples: Vec<(u64, i64)>,
        start: u64,
        end: u64,
    ) -> bool {
        let Some(t) = Times::restored(head, samples, start, end) else {
            return false;
        };
        self.parts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(p, Arc::new(Mutex::new(t)));
        true
    }

    /// The first record of `p` (retained `[start, end)`) whose timestamp reaches `ts` as
    /// (offset, timestamp); `ts == -3`: the record with the largest timestamp. Blocking: call on
    /// a thread that may wait for the log.
    pub fn lookup(
        &self,
        log: &Log,
        p: PartRef,
        start: u64,
        end: u64,
        ts: i64,
    ) -> Result<Option<(i64, i64)>, LogError> {
        let entry = self
            .parts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(p)
            .or_insert_with(|| Arc::new(Mutex::new(Times::new(start))))
            .clone();
        let mut t = entry.lock().unwrap_or_else(PoisonError::into_inner);
        if t.from > start || t.to < start {
            // Never indexed, or retention passed all of it: start over at the first record.
            *t = Times::new(start);
        }
        self.extend(log, p, &mut t, end)?;
        // Samples below the retained start still hold (for a subset of the records).
        let k = t.samples.partition_point(|s| s.1 < ts);
        let from = k
            .checked_sub(1)
            .map_or(start, |i| t.samples[i].0.max(start));
        let max = t.max.filter(|m| m.1 >= start);
        drop(t);
        match (ts, max) {
            (-3, Some((max, at))) => Ok(self.read(log, p, at)?.and_then(|payload| {
                batch::first_at_or_after(&payload, max).map(|(d, t)| (at as i64 + d, t))
            })),
            // The batch with the largest timestamp was freed: look over what is retained.
            (-3, None) => self.scan(log, p, start, end, -3),
            _ => self.scan(log, p, from, end, ts),
        }
    }

    /// Indexes `p` from where its samples end up to `end`.
    fn extend(&self, log: &Log, p: PartRef, t: &mut Times, end: u64) -> Result<(), LogError> {
        while t.to < end {
            let recs = log.read(p.id, t.to, READ_BYTES)?;
            if recs.is_empty() {
                break;
            }
            self.batches_read
                .fetch_add(recs.len() as u64, Ordering::Relaxed);
            for r in recs {
                if r.offset < t.to {
                    continue;
                }
                let Ok(info) = batch::header(&r.payload) else {
                    t.to = r.offset + u64::from(r.span);
                    continue;
                };
                if t.samples.is_empty() || t.since_sample >= SAMPLE_EVERY {
                    t.samples.push((r.offset, t.running));
                    t.since_sample = 0;
                }
                t.since_sample += r.payload.len();
                t.running = t.running.max(info.max_timestamp);
                if t.max.is_none_or(|(m, _)| info.max_timestamp > m) {
                    t.max = Some((info.max_timestamp, r.offset));
                }
                t.to = r.offset + u64::from(r.span);
            }
        }
        Ok(())
    }

    /// The payload of the batch whose base offset is `at`.
    fn read(&self, log: &Log, p: PartRef, at: u64) -> Result<Option<bytes::Bytes>, LogError> {
        let recs = log.read(p.id, at, 1)?;
        self.batches_read.fetch_add(1, Ordering::Relaxed);
        Ok(recs.into_iter().find(|r| r.offset == at).map(|r| r.payload))
    }

    /// Reads from `from` for the first record at or after `ts` (-3: the largest timestamp).
    fn scan(
        &self,
        log: &Log,
        p: PartRef,
        from: u64,
        end: u64,
        ts: i64,
    ) -> Result<Option<(i64, i64)>, LogError> {
        let mut next = from;
        let mut best: Option<(i64, i64)> = None;
        while next < end {
            let recs = log.read(p.id, next, READ_BYTES)?;
            if recs.is_empty() {
                break;
            }
            self.batches_read
                .fetch_add(recs.len() as u64, Ordering::Relaxed);
            for r in recs {
                next = r.offset + u64::from(r.span);
                let Ok(info) = batch::header(&r.payload) else {
                    continue;
                };
                let want = if ts == -3 { info.max_timestamp } else { ts };
                if ts == -3 && best.is_some_and(|(_, t)| info.max_timestamp <= t) {
                    continue;
                }
                if let Some((delta, t)) = batch::first_at_or_after(&r.payload, want) {
                    let found = (r.offset as i64 + delta, t);
                    if ts != -3 {
                        return Ok(Some(found));
                    }
                    best = Some(found);
                }
            }
        }
        Ok(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot_parts::Parts;

    fn head(from: u64, to: u64) -> TimesHead {
        TimesHead {
            from,
            to,
            running: 500,
            max: Some((500, to - 1)),
            since_sample: 10,
        }
    }

    #[test]
    fn a_recorded_index_is_cut_by_size_restored_and_recorded_again_only_once_grown() {
        let p = PartRef::new(0, 7);
        let samples: Vec<(u64, i64)> = (0..100).map(|i| (10 * i, i as i64)).collect();
        let max = TIME_INDEX_HEADER_LEN + 30 * TIME_SAMPLE_LEN;
        let recs = records(p.id, head(0, 1000), samples.clone(), max);
        assert_eq!(recs.len(), 4);
        let mut parts: Parts<TimesHead, (u64, i64)> = Parts::default();
        for r in recs {
            let e = r.encode();
            assert!(e.len() <= max, "a record of {} B", e.len());
            match MetaRecord::decode(&e) {
                Ok(MetaRecord::TimeIndex(t)) => {
                    parts.add(t.partition, t.head, t.part, t.parts, t.samples)
                }
                other => panic!("{other:?}"),
            }
        }
        let (h, back) = parts.finish().remove(&p.id).expect("whole");
        assert_eq!((h, &back), (head(0, 1000), &samples));

        let idx = TimeIndex::default();
        assert!(idx.snapshot(p, false).is_none(), "nothing indexed yet");
        assert!(idx.restore(p, h, back, 0, 1000));
        // Just restored: nothing new to record, unless every index is asked for.
        assert!(idx.snapshot(p, true).is_none());
        assert_eq!(idx.snapshot(p, false), Some((head(0, 1000), samples)));
    }

    #[test]
    fn a_recorded_index_that_does_not_fit_the_partition_is_not_taken() {
        let p = PartRef::new(0, 1);
        let idx = TimeIndex::default();
        let ok = vec![(0, i64::MIN), (40, 3)];
        // Past the recovered end; below the retained start; samples out of order or outside.
        assert!(!idx.restore(p, head(0, 100), ok.clone(), 0, 99));
        assert!(!idx.restore(p, head(0, 100), ok.clone(), 101, 200));
        assert!(!idx.restore(p, head(0, 100), vec![(40, 3), (0, 4)], 0, 100));
        assert!(!idx.restore(p, head(0, 100), vec![(0, 5), (40, 3)], 0, 100));
        assert!(!idx.restore(p, head(0, 100), vec![(100, 3)], 0, 100));
        let mut far = head(0, 100);
        far.max = Some((9, 100));
        assert!(!idx.restore(p, far, ok.clone(), 0, 100));
        assert!(idx.snapshot(p, false).is_none());
        assert!(idx.restore(p, head(0, 100), ok, 50, 120));
    }
}
