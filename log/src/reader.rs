//! Serving records: only below D, every one verified (storage.md §1).

use bytes::Bytes;

use crate::batch::check_batch;
use crate::format::RecordKind;
use crate::layout::Geometry;
use crate::shared::{Shared, SharedState};
use crate::{Log, LogError};

/// A record served to a reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// First offset the record holds.
    pub offset: u64,
    /// Offsets it holds (1 unless it was appended with a span).
    pub span: u32,
    pub position: u64,
    /// The record's bytes (a view into the batch read, or into its cached copy).
    pub payload: Bytes,
}

/// How long a read below the recovery point waits for the background index rebuild.
const BACKFILL_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// At most this many batches are read for one call.
const MAX_BATCHES_PER_READ: usize = 64;

pub(crate) fn read(
    log: &Log,
    partition: u32,
    offset: u64,
    max_bytes: usize,
) -> Result<Vec<Record>, LogError> {
    read_with(
        log.shared(),
        &log.geometry(),
        partition,
        offset,
        max_bytes,
        |pos, len| log.read_raw(pos, len),
    )
}

/// The reader over any way of fetching raw log bytes: the writer thread's queue in production,
/// a stepped writer in the deterministic simulator. Batches in the tail cache are taken from it
/// instead, and checked the same way.
pub fn read_with(
    shared: &Shared,
    geo: &Geometry,
    partition: u32,
    offset: u64,
    max_bytes: usize,
    mut read_raw: impl FnMut(u64, u64) -> Result<Vec<u8>, LogError>,
) -> Result<Vec<Record>, LogError> {
    let mut raw = |pos: u64, len: u64| {
        // The cache's lock is let go before the device read: the writer takes it too.
        let cached = shared.cache().get(pos, len);
        match cached {
            Some(b) => Ok(Some(b)),
            None => read_raw(pos, len).map(|v| Some(Bytes::from(v))),
        }
    };
    match read_from(shared, geo, partition, offset, max_bytes, true, &mut raw) {
        Outcome::Done(r) => r,
        // Not reached: every read above either returns bytes or an error, and this read waits.
        Outcome::WouldBlock => Err(LogError::Unavailable(format!(
            "partition {partition} offset {offset} cannot be read now"
        ))),
    }
}

/// Reads only what the tail cache holds, without waiting and without touching the device: for
/// an event loop that must not block. None when the first batch wanted is not cached (or the
/// index below the recovery point is still being rebuilt); otherwise the records of the cached
/// batches from `offset` on, up to the first one that is not cached.
pub fn read_cached(
    shared: &Shared,
    geo: &Geometry,
    partition: u32,
    offset: u64,
    max_bytes: usize,
) -> Option<Result<Vec<Record>, LogError>> {
    let mut raw = |pos: u64, len: u64| {
        let cached = shared.cache().get(pos, len);
        Ok(cached)
    };
    match read_from(shared, geo, partition, offset, max_bytes, false, &mut raw) {
        Outcome::Done(r) => Some(r),
        Outcome::WouldBlock => None,
    }
}

enum Outcome {
    Done(Result<Vec<Record>, LogError>),
    /// The read would have to wait (for the index rebuild) or read the device.
    WouldBlock,
}

/// Raw bytes of a batch; `Ok(None)`: not available without blocking.
type RawFn<'a> = dyn FnMut(u64, u64) -> Result<Option<Bytes>, LogError> + 'a;

fn read_from(
    shared: &Shared,
    geo: &Geometry,
    partition: u32,
    offset: u64,
    max_bytes: usize,
    wait: bool,
    read_raw: &mut RawFn<'_>,
) -> Outcome {
    let entries = {
        // Below the part indexed so far, wait for the background rebuild (see `backfill`).
        let below_indexed = |s: &SharedState| {
            s.partitions.get(&partition).is_some_and(|v| {
                offset < v.durable_end && v.entries.front().is_none_or(|e| offset < e.first_offset)
            })
        };
        let s = if wait {
            shared.wait_until(BACKFILL_WAIT, |s| !(s.backfill_pending && below_indexed(s)))
        } else {
            shared.lock()
        };
        if s.backfill_pending && below_indexed(&s) {
            if !wait {
                return Outcome::WouldBlock;
            }
            return Outcome::Done(Err(LogError::Unavailable(format!(
                "partition {partition} offset {offset} lies below the recovery point, whose index is still being rebuilt"
            ))));
        }
        if let Some(what) = &s.backfill_error {
            if below_indexed(&s) {
                return Outcome::Done(Err(LogError::Corrupt {
                    partition,
                    offset,
                    position: 0,
                    what: format!("the log below the recovery point could not be indexed: {what}"),
                }));
            }
        }
        let Some(v) = s.partitions.get(&partition) else {
            return Outcome::Done(Err(LogError::UnknownPartition(partition)));
        };
        if offset < v.start_offset || offset > v.durable_end {
            return Outcome::Done(Err(LogError::OffsetOutOfRange {
                partition,
                offset,
                start: v.start_offset,
                end: v.durable_end,
            }));
        }
        if offset == v.durable_end {
            return Outcome::Done(Ok(Vec::new()));
        }
        let first = v.entries.partition_point(|e| e.end_offset <= offset);
        v.entries
            .iter()
            .skip(first)
            .take(MAX_BATCHES_PER_READ)
            .copied()
            .collect::<Vec<_>>()
    };
    let mut out = Vec::new();
    let mut bytes = 0usize;
    let mut want = offset;
    for e in entries {
        let raw = match read_raw(e.batch_position, u64::from(e.batch_length)) {
            Ok(Some(r)) => r,
            Ok(None) if out.is_empty() => return Outcome::WouldBlock,
            Ok(None) => break,
            Err(LogError::OffsetOutOfRange { .. }) => {
                return Outcome::Done(out_of_range(shared, partition, want))
            }
            Err(err) => return Outcome::Done(Err(err)),
        };
        let mut got = Vec::new();
        let checked = check_batch(
            &raw,
            geo.format_id,
            e.batch_position,
            geo.write_unit as u32,
            Some(e.epoch),
            |r| {
                if r.header.partition == partition && r.header.kind == RecordKind::Data {
                    got.push(Record {
                        offset: r.header.offset,
                        span: r.header.span,
                        position: r.header.position,
                        payload: raw.slice_ref(r.payload),
                    });
                }
            },
        );
        if let Err(fault) = checked {
            // A batch that retention freed meanwhile may have been overwritten: not corruption.
            if e.batch_position < shared.lock().head {
                return Outcome::Done(out_of_range(shared, partition, want));
            }
            return Outcome::Done(Err(corrupt(
                shared,
                partition,
                want,
                e.batch_position,
                fault.to_string(),
            )));
        }
        // The batch must hold exactly the offsets the index says, in order, without gaps.
        let mut next = e.first_offset;
        let contiguous = got.iter().all(|r| {
            let ok = r.offset == next;
            next = r.offset + u64::from(r.span);
            ok
        });
        if !contiguous || next != e.end_offset {
            let found: Vec<u64> = got.iter().map(|r| r.offset).collect();
            return Outcome::Done(Err(corrupt(
                shared,
                partition,
                want,
                e.batch_position,
                format!(
                    "batch holds offsets {:?}..{:?} of the partition, the index says {}..{}",
                    found.first(),
                    found.last(),
                    e.first_offset,
                    e.end_offset
                ),
            )));
        }
        let from = want;
        for r in got
            .into_iter()
            .filter(|r| r.offset + u64::from(r.span) > from)
        {
            bytes += r.payload.len();
            want = r.offset + u64::from(r.span);
            out.push(r);
        }
        if bytes >= max_bytes {
            break;
        }
    }
    Outcome::Done(Ok(out))
}

fn out_of_range(shared: &Shared, partition: u32, offset: u64) -> Result<Vec<Record>, LogError> {
    let (start, end) = shared
        .lock()
        .partitions
        .get(&partition)
        .map_or((0, 0), |v| (v.start_offset, v.durable_end));
    Err(LogError::OffsetOutOfRange {
        partition,
        offset,
        start,
        end,
    })
}

fn corrupt(shared: &Shared, partition: u32, offset: u64, position: u64, what: String) -> LogError {
    tracing::error!(partition, offset, position, %what, "corrupt record refused");
    shared.lock().stats.corrupt_reads += 1;
    LogError::Corrupt {
        partition,
        offset,
        position,
        what,
    }
}
