//! ListOffsets by timestamp without scanning a partition each time: a sparse index per
//! partition of (offset, largest record timestamp below that offset), built by one pass over
//! what it does not cover yet and kept in memory, so that a lookup reads only the batches from the
//! last sample whose running maximum is still below the target (a few, when timestamps grow
//! with offsets; correct whatever order they come in).
//!
//! The index follows the partition's end as lookups come (each byte is read once); it is not
//! persisted, so the first lookup after a restart reads the partition once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use nvmq_log::{Log, LogError};

use crate::batch;
use crate::part::PartRef;

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
        }
    }
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
