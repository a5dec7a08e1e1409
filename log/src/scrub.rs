//! The background scrub (storage.md §4.5): re-reads the retained log at a capped rate, checking
//! every batch and record, so that damage to acknowledged data is found before a reader (or a
//! recovery) runs into it. It reads through the writer like any reader and reports like one:
//! the damage goes into the shared state (and the log), the writer keeps going.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::batch::check_batch;
use crate::format::BatchHeader;
use crate::layout::Geometry;
use crate::shared::Shared;
use crate::LogError;

/// What the scrub found so far.
#[derive(Debug, Clone, Default)]
pub struct ScrubState {
    /// Complete passes over the retained log.
    pub passes: u64,
    pub bytes_checked: u64,
    /// Each damaged batch found, once: (log position, what was wrong), oldest first (at most 64).
    pub damage: Vec<(u64, String)>,
}

const MAX_DAMAGE_KEPT: usize = 64;

/// Runs scrub passes until `cancel` is set. `read` fetches raw log bytes through the writer.
pub(crate) fn run(
    geo: Geometry,
    shared: Arc<Shared>,
    rate: u64,
    cancel: Arc<AtomicBool>,
    mut read: impl FnMut(u64, u64) -> Result<Vec<u8>, LogError>,
) {
    let u = geo.write_unit;
    let started = Instant::now();
    let mut budget_used = 0u64;
    let mut pos: Option<u64> = None;
    // The batch just checked, which the next one must link to.
    let mut prev: Option<Link> = None;
    // After a bad header, batches are found again one write unit at a time; one report suffices.
    let mut resyncing = false;
    while !cancel.load(Ordering::Relaxed) {
        let (head, durable, ready) = {
            let s = shared.lock();
            (s.head, s.durable, !s.backfill_pending && s.fatal.is_none())
        };
        if !ready {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let at = match pos {
            Some(p) if p >= head => p,
            _ => head,
        };
        if at >= durable {
            // A pass is done (or the log is empty): start over after a rest.
            if pos.is_some() {
                shared.lock().scrub.passes += 1;
                shared.notify();
            }
            pos = None;
            sleep_checking(&cancel, Duration::from_secs(1));
            continue;
        }
        // While resynchronising, one write unit at a time; else up to a maximum batch at once.
        let chunk = if resyncing { u } else { geo.max_batch };
        if prev.is_some_and(|l| l.end != at) {
            prev = None;
        }
        let (good, failed) = check_chunk(&geo, at, durable, chunk, &mut prev, &mut read);
        if good > 0 {
            resyncing = false;
        }
        let at = at + good;
        let step = match failed {
            None => good,
            Some(Checked::Freed) => {
                pos = None;
                continue;
            }
            Some(Checked::Stopped) => return,
            Some(Checked::Damage { what, skip }) => {
                // Retention may have freed (and the writer reused) it while we read.
                if at < shared.lock().head {
                    pos = None;
                    continue;
                }
                let mut s = shared.lock();
                let known = s.scrub.damage.iter().any(|d| d.0 == at);
                if !resyncing && !known {
                    tracing::error!(position = at, %what, "scrub: damage in acknowledged data");
                    if s.scrub.damage.len() < MAX_DAMAGE_KEPT {
                        s.scrub.damage.push((at, what));
                    }
                    drop(s);
                    shared.notify();
                }
                // Without a valid header the next batch cannot be found from here: go on one
                // write unit at a time until headers resynchronise.
                resyncing = skip.is_none();
                good + skip.unwrap_or(u)
            }
        };
        shared.lock().scrub.bytes_checked += step;
        pos = Some(at - good + step);
        // Cap the rate: sleep until the bytes read fit the budget.
        budget_used += step;
        let due = Duration::from_secs_f64(budget_used as f64 / rate as f64);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            sleep_checking(&cancel, wait);
        }
    }
}

/// A batch the scrub checked: where it ends, its header checksum (which the next batch names as
/// `prev_hash`) and its epoch (which the next may not be below).
#[derive(Clone, Copy)]
struct Link {
    end: u64,
    crc: u32,
    epoch: u64,
}

enum Checked {
    Freed,
    Stopped,
    /// `skip`: the damaged batch's length when its header was valid.
    Damage {
        what: String,
        skip: Option<u64>,
    },
}

fn damage(what: String, skip: Option<u64>) -> Checked {
    Checked::Damage { what, skip }
}

/// Checks the batches from `at` in one read of up to `chunk` bytes (small batches would
/// otherwise cost a request to the writer each); a batch the read cut short is left for the
/// next chunk, unless it is the first, which is then read whole. Returns the bytes of the
/// batches that checked, and why checking stopped before the end of the chunk, if it did (at
/// `at` plus those bytes). Each batch must link to the one before it (`prev`, when the scrub
/// checked it), as recovery requires: a valid batch that does not is a stale one, left by an
/// older era where the write meant for its position went elsewhere.
fn check_chunk(
    geo: &Geometry,
    at: u64,
    durable: u64,
    chunk: u64,
    prev: &mut Option<Link>,
    read: &mut impl FnMut(u64, u64) -> Result<Vec<u8>, LogError>,
) -> (u64, Option<Checked>) {
    let u = geo.write_unit;
    let fetch = |read: &mut dyn FnMut(u64, u64) -> Result<Vec<u8>, LogError>, from, len| match read(
        from, len,
    ) {
        Ok(b) => Ok(b),
        Err(LogError::OffsetOutOfRange { .. }) => Err(Checked::Freed),
        Err(LogError::Shutdown) | Err(LogError::WriterStopped(_)) => Err(Checked::Stopped),
        Err(e) => Err(damage(format!("read failed: {e}"), None)),
    };
    // Batch ends (so D) are multiples of U; the chunk is too.
    let want = chunk.min(geo.max_batch).min(durable - at);
    let want = (want - want % u).max(u);
    let chunk = match fetch(read, at, want) {
        Ok(b) => b,
        Err(c) => return (0, Some(c)),
    };
    let mut off = 0u64;
    while off < chunk.len() as u64 {
        let here = at + off;
        let rest = &chunk[off as usize..];
        let h = match BatchHeader::decode(rest, geo.format_id, here, u as u32) {
            Ok((h, _)) => h,
            Err(f) => return (off, Some(damage(format!("batch header: {f:?}"), None))),
        };
        let len = u64::from(h.length);
        if len == 0 || here + len > durable {
            let what = format!("batch length {len} runs past the durable point {durable}");
            return (off, Some(damage(what, None)));
        }
        let whole;
        let bytes = if len <= rest.len() as u64 {
            &rest[..len as usize]
        } else if off > 0 {
            // Cut short by the chunk: it starts the next one.
            break;
        } else {
            whole = match fetch(read, here, len) {
                Ok(b) => b,
                Err(c) => return (off, Some(c)),
            };
            &whole[..]
        };
        let crc = match check_batch(bytes, geo.format_id, here, u as u32, None, |_| {}) {
            Ok((_, crc)) => crc,
            Err(f) => {
                *prev = None;
                return (off, Some(damage(f.to_string(), Some(len))));
            }
        };
        if let Some(l) = prev.filter(|l| l.end == here) {
            if let Err(why) = crate::batch::follows(&h, Some(l.crc), l.epoch) {
                *prev = None;
                let what = format!("a valid batch that breaks the chain (a stale batch): {why}");
                return (off, Some(damage(what, Some(len))));
            }
        }
        *prev = Some(Link {
            end: here + len,
            crc,
            epoch: h.epoch,
        });
        off += len;
    }
    (off, None)
}

fn sleep_checking(cancel: &AtomicBool, total: Duration) {
    let end = Instant::now() + total;
    while !cancel.load(Ordering::Relaxed) {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}
