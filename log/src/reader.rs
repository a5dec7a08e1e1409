//! Serving records: only below D, every one verified (storage.md §1).

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
    pub payload: Vec<u8>,
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
/// a stepped writer in the deterministic simulator.
pub fn read_with(
    shared: &Shared,
    geo: &Geometry,
    partition: u32,
    offset: u64,
    max_bytes: usize,
    mut read_raw: impl FnMut(u64, u64) -> Result<Vec<u8>, LogError>,
) -> Result<Vec<Record>, LogError> {
    let entries = {
        // Below the part indexed so far, wait for the background rebuild (see `backfill`).
        let below_indexed = |s: &SharedState| {
            s.partitions.get(&partition).is_some_and(|v| {
                offset < v.durable_end && v.entries.front().is_none_or(|e| offset < e.first_offset)
            })
        };
        let s = shared.wait_until(BACKFILL_WAIT, |s| !(s.backfill_pending && below_indexed(s)));
        if s.backfill_pending && below_indexed(&s) {
            return Err(LogError::Unavailable(format!(
                "partition {partition} offset {offset} lies below the recovery point, whose index is still being rebuilt"
            )));
        }
        if let Some(what) = &s.backfill_error {
            if below_indexed(&s) {
                return Err(LogError::Corrupt {
                    partition,
                    offset,
                    position: 0,
                    what: format!("the log below the recovery point could not be indexed: {what}"),
                });
            }
        }
        let v = s
            .partitions
            .get(&partition)
            .ok_or(LogError::UnknownPartition(partition))?;
        if offset < v.start_offset || offset > v.durable_end {
            return Err(LogError::OffsetOutOfRange {
                partition,
                offset,
                start: v.start_offset,
                end: v.durable_end,
            });
        }
        if offset == v.durable_end {
            return Ok(Vec::new());
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
            Ok(r) => r,
            Err(LogError::OffsetOutOfRange { .. }) => return out_of_range(shared, partition, want),
            Err(err) => return Err(err),
        };
        let mut got = Vec::new();
        let checked = check_batch(
            &raw,
            geo.format_id,
            e.batch_position,
            geo.write_unit as u32,
            |r| {
                if r.header.partition == partition && r.header.kind == RecordKind::Data {
                    got.push(Record {
                        offset: r.header.offset,
                        span: r.header.span,
                        position: r.header.position,
                        payload: r.payload.to_vec(),
                    });
                }
            },
        );
        if let Err(fault) = checked {
            // A batch that retention freed meanwhile may have been overwritten: not corruption.
            if e.batch_position < shared.lock().head {
                return out_of_range(shared, partition, want);
            }
            return Err(corrupt(
                shared,
                partition,
                want,
                e.batch_position,
                fault.to_string(),
            ));
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
            return Err(corrupt(
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
            ));
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
    Ok(out)
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
