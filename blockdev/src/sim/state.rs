//! The shared state of one simulated device and everything that happens to it between power cuts:
//! submission, the service-time queue, completion effects, flush coverage and doomed data.

use std::collections::{BTreeMap, VecDeque};

use super::media::{CacheEntry, Media, RangeSet, SECTOR};
use super::{Rng, SimConfig, SimStats};
use crate::{check_io, Completion, DeviceError, DeviceInfo, IoBuffer, Op, Tag};

/// Faults armed through the handle. Counters, not flags, so that arming twice fails two operations.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    pub(crate) fail_writes: u64,
    pub(crate) fail_flushes: u64,
    /// Out-of-order flush failures still to start (each consumes two flushes).
    pub(crate) ooo_armed: u64,
    /// The first flush of an out-of-order pair, waiting for the second to be submitted.
    pub(crate) ooo_first: Option<u64>,
    pub(crate) misdirects: VecDeque<u64>,
    pub(crate) write_error_rate: f64,
    pub(crate) flush_error_rate: f64,
}

/// What a submitted I/O does when it is served. Fault decisions are taken at submission (from the
/// seeded RNG, in submission order), so that the run does not depend on when the caller polls.
#[derive(Debug)]
pub(crate) enum Work {
    Write {
        buffer: IoBuffer,
        /// Where the data actually lands (differs from the completion's lba when misdirected).
        target: u64,
        fails: bool,
    },
    Read {
        buffer: IoBuffer,
    },
    Flush {
        /// Covers the cache entries with `cseq < covers`: the writes completed before submission.
        covers: u64,
        fails: bool,
        /// Out-of-order failure: this flush completes only after the flush with this id has.
        release_after: Option<u64>,
    },
}

#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) tag: Tag,
    pub(crate) op: Op,
    pub(crate) lba: u64,
    pub(crate) work: Work,
    /// Nanoseconds on the device clock when the service ends.
    pub(crate) due: u64,
    /// Seeded tie-break among completions due at the same instant: lets completions come out of
    /// submission order (as on a real queue pair) while staying reproducible.
    pub(crate) tiebreak: u64,
    /// Held back regardless of `due` (the failing first flush of an out-of-order pair).
    pub(crate) held: bool,
}

pub(crate) struct State {
    pub(crate) cfg: SimConfig,
    pub(crate) info: DeviceInfo,
    pub(crate) rng: Rng,
    pub(crate) media: Media,
    /// Completed, not yet durable writes, in completion order (empty without a volatile cache).
    pub(crate) cache: Vec<CacheEntry>,
    /// Submitted, not yet delivered I/Os by submission id (a BTreeMap: every walk over it is in
    /// submission order, so no decision depends on hashing).
    pub(crate) inflight: BTreeMap<u64, Pending>,
    /// Linked flushes by the id of the write they wait for: submitted when it completes.
    pub(crate) linked: BTreeMap<u64, Tag>,
    pub(crate) next_id: u64,
    /// Count of writes completed so far; the next cache entry's `cseq`.
    pub(crate) completed_writes: u64,
    pub(crate) last_flush_finish: u64,
    /// Power cycle number: a device built in an earlier cycle is refused with `Stopped`.
    pub(crate) generation: u64,
    pub(crate) off: bool,
    pub(crate) faults: Faults,
    pub(crate) read_errors: RangeSet,
    pub(crate) stats: SimStats,
}

impl State {
    pub(crate) fn new(cfg: SimConfig, info: DeviceInfo) -> State {
        State {
            rng: Rng::new(cfg.seed),
            media: Media::new(cfg.capacity),
            cfg,
            info,
            cache: Vec::new(),
            inflight: BTreeMap::new(),
            linked: BTreeMap::new(),
            next_id: 0,
            completed_writes: 0,
            last_flush_finish: 0,
            generation: 0,
            off: false,
            faults: Faults::default(),
            read_errors: RangeSet::default(),
            stats: SimStats::default(),
        }
    }

    pub(crate) fn lbs(&self) -> u64 {
        u64::from(self.cfg.logical_block_size)
    }

    fn check_on(&self, generation: u64, op: Op, lba: u64) -> Result<(), DeviceError> {
        if self.off || generation != self.generation {
            return Err(DeviceError::Stopped { op, lba });
        }
        Ok(())
    }

    fn check_room(&self, op: Op, lba: u64) -> Result<(), DeviceError> {
        if self.inflight.len() >= self.cfg.queue_depth {
            return Err(DeviceError::QueueFull {
                op,
                lba,
                depth: self.inflight.len(),
            });
        }
        Ok(())
    }

    fn enqueue(&mut self, tag: Tag, op: Op, lba: u64, work: Work, due: u64) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let tiebreak = self.rng.next_u64();
        self.inflight.insert(
            id,
            Pending {
                tag,
                op,
                lba,
                work,
                due,
                tiebreak,
                held: false,
            },
        );
        id
    }

    pub(crate) fn submit_write(
        &mut self,
        generation: u64,
        tag: Tag,
        lba: u64,
        buffer: IoBuffer,
    ) -> Result<(), DeviceError> {
        self.check_on(generation, Op::Write, lba)?;
        check_io(&self.info, Op::Write, lba, buffer.len())?;
        self.check_room(Op::Write, lba)?;
        let fails = if self.faults.fail_writes > 0 {
            self.faults.fail_writes -= 1;
            true
        } else {
            let p = self.faults.write_error_rate;
            p > 0.0 && self.rng.chance(p)
        };
        let target = self.faults.misdirects.pop_front().unwrap_or(lba);
        let now = self.cfg.clock.now_nanos();
        let due = now.saturating_add(self.cfg.write_latency.sample(&mut self.rng));
        self.stats.writes += 1;
        let work = Work::Write {
            buffer,
            target,
            fails,
        };
        self.enqueue(tag, Op::Write, lba, work, due);
        Ok(())
    }

    pub(crate) fn submit_read(
        &mut self,
        generation: u64,
        tag: Tag,
        lba: u64,
        buffer: IoBuffer,
    ) -> Result<(), DeviceError> {
        self.check_on(generation, Op::Read, lba)?;
        check_io(&self.info, Op::Read, lba, buffer.len())?;
        self.check_room(Op::Read, lba)?;
        let now = self.cfg.clock.now_nanos();
        // Reads share the media service time of writes: the config models one medium.
        let due = now.saturating_add(self.cfg.write_latency.sample(&mut self.rng));
        self.stats.reads += 1;
        self.enqueue(tag, Op::Read, lba, Work::Read { buffer }, due);
        Ok(())
    }

    /// A write, and a flush the device submits itself when the write has completed without error
    /// (then it covers that write); if the write fails, the flush fails too and never runs.
    pub(crate) fn submit_write_flush(
        &mut self,
        generation: u64,
        write_tag: Tag,
        lba: u64,
        buffer: IoBuffer,
        flush_tag: Tag,
    ) -> Result<(), DeviceError> {
        if !self.cfg.linked_flush {
            return Err(DeviceError::BadRequest {
                op: Op::Write,
                lba,
                len: buffer.len(),
                why: crate::LINKED_FLUSH_UNSUPPORTED,
            });
        }
        self.check_on(generation, Op::Write, lba)?;
        // Room for both: the flush takes its slot once the write is done.
        if self.inflight.len() + self.linked.len() + 2 > self.cfg.queue_depth {
            return Err(DeviceError::QueueFull {
                op: Op::Write,
                lba,
                depth: self.inflight.len() + self.linked.len(),
            });
        }
        let id = self.next_id;
        self.submit_write(generation, write_tag, lba, buffer)?;
        self.linked.insert(id, flush_tag);
        self.stats.linked_flushes += 1;
        Ok(())
    }

    /// The write `id` completed (delivered as `done`): submits its linked flush now, or fails it
    /// when the write failed.
    fn release_linked(&mut self, id: u64, done: &Completion, out: &mut Vec<Completion>) {
        let Some(tag) = self.linked.remove(&id) else {
            return;
        };
        match &done.result {
            Ok(()) => self.start_flush(tag),
            Err(_) => out.push(Completion {
                tag,
                op: Op::Flush,
                lba: 0,
                buffer: None,
                result: Err(DeviceError::Io {
                    op: Op::Flush,
                    lba: 0,
                    detail: format!("not run: its linked write at block {} failed", done.lba),
                }),
            }),
        }
    }

    pub(crate) fn submit_flush(&mut self, generation: u64, tag: Tag) -> Result<(), DeviceError> {
        self.check_on(generation, Op::Flush, 0)?;
        self.check_room(Op::Flush, 0)?;
        self.start_flush(tag);
        Ok(())
    }

    /// A flush enters service now, covering every write completed so far.
    fn start_flush(&mut self, tag: Tag) {
        let id = self.next_id;
        let (fails, held) = if let Some(first) = self.faults.ooo_first.take() {
            // Second flush of an out-of-order pair: it succeeds, and the first (failing) one is
            // released only after this one has completed.
            if let Some(Pending {
                work: Work::Flush { release_after, .. },
                ..
            }) = self.inflight.get_mut(&first)
            {
                *release_after = Some(id);
            }
            (false, false)
        } else if self.faults.ooo_armed > 0 {
            self.faults.ooo_armed -= 1;
            self.faults.ooo_first = Some(id);
            (true, true)
        } else if self.faults.fail_flushes > 0 {
            self.faults.fail_flushes -= 1;
            (true, false)
        } else {
            let p = self.faults.flush_error_rate;
            (p > 0.0 && self.rng.chance(p), false)
        };
        let now = self.cfg.clock.now_nanos();
        let start = if self.cfg.serialize_flushes {
            now.max(self.last_flush_finish)
        } else {
            now
        };
        let due = start.saturating_add(self.cfg.flush_latency.sample(&mut self.rng));
        self.last_flush_finish = self.last_flush_finish.max(due);
        self.stats.flushes += 1;
        let work = Work::Flush {
            covers: self.completed_writes,
            fails,
            release_after: None,
        };
        let got = self.enqueue(tag, Op::Flush, 0, work, due);
        debug_assert_eq!(got, id);
        if held {
            if let Some(p) = self.inflight.get_mut(&id) {
                p.held = true;
            }
        }
    }

    /// Delivers every I/O whose service has ended, in (due time, seeded tie-break) order, applying
    /// each one's effect at that moment: delivery *is* completion for this device.
    pub(crate) fn poll(
        &mut self,
        generation: u64,
        out: &mut Vec<Completion>,
    ) -> Result<usize, DeviceError> {
        // `poll` has no operation of its own; `Write` names the kind of I/O a caller polls for most.
        self.check_on(generation, Op::Write, 0)?;
        let now = self.cfg.clock.now_nanos();
        // A held flush waits for its partner. If the caller polls while nothing else is in flight,
        // it is waiting on that flush alone and the partner may never come: let it complete (in
        // order) rather than hang the caller. Checked only on entry, so that a caller who polls
        // other I/Os and then submits the second flush still gets the out-of-order pair.
        if !self.inflight.is_empty() && self.inflight.values().all(|p| p.held) {
            for p in self.inflight.values_mut() {
                p.held = false;
            }
            self.faults.ooo_first = None;
        }
        let mut n = 0;
        loop {
            let mut ready: Vec<(u64, u64, u64)> = self
                .inflight
                .iter()
                .filter(|(_, p)| !p.held && p.due <= now)
                .map(|(&id, p)| (p.due, p.tiebreak, id))
                .collect();
            if ready.is_empty() {
                break;
            }
            ready.sort_unstable();
            for (_, _, id) in ready {
                if let Some(p) = self.inflight.remove(&id) {
                    let c = self.complete(id, p);
                    let before = out.len();
                    self.release_linked(id, &c, out);
                    // The write's completion goes before its (failed) linked flush's.
                    out.insert(before, c);
                    n += out.len() - before;
                }
            }
        }
        self.stats.completed += n as u64;
        Ok(n)
    }

    /// The earliest due time among the I/Os that are not held back.
    pub(crate) fn earliest_due(&self) -> Option<u64> {
        self.inflight
            .values()
            .filter(|p| !p.held)
            .map(|p| p.due)
            .min()
    }

    fn complete(&mut self, id: u64, p: Pending) -> Completion {
        let Pending {
            tag,
            op,
            lba,
            work,
            due,
            ..
        } = p;
        match work {
            Work::Write {
                buffer,
                target,
                fails,
            } => {
                let result = if fails {
                    self.stats.write_errors += 1;
                    Err(DeviceError::Io {
                        op,
                        lba,
                        detail: "injected write error (sim); the data was not written".into(),
                    })
                } else {
                    self.apply_write(target, &buffer);
                    Ok(())
                };
                Completion {
                    tag,
                    op,
                    lba,
                    buffer: Some(buffer),
                    result,
                }
            }
            Work::Read { mut buffer } => {
                let blocks = buffer.len() as u64 / self.lbs();
                let result = if self.read_errors.overlaps(lba, lba + blocks) {
                    self.stats.read_errors += 1;
                    Err(DeviceError::Io {
                        op,
                        lba,
                        detail: "injected latent sector error (sim)".into(),
                    })
                } else {
                    self.read_view(lba * self.lbs(), &mut buffer);
                    Ok(())
                };
                Completion {
                    tag,
                    op,
                    lba,
                    buffer: Some(buffer),
                    result,
                }
            }
            Work::Flush { covers, fails, .. } => {
                let result = if fails {
                    self.stats.flush_errors += 1;
                    // An earlier-submitted flush that will succeed still vouches for what it
                    // covers (storage.md §1): only the writes beyond it are lost with this one.
                    let vouched = self.vouched_before(id);
                    self.doom_range(vouched, covers);
                    Err(DeviceError::Io {
                        op,
                        lba,
                        detail: "injected flush error (sim); the covered writes are not durable"
                            .into(),
                    })
                } else {
                    // A failing flush submitted earlier and still running means the device lost
                    // that flush's data; this flush "succeeds" without it (storage.md §6).
                    let lost = self
                        .inflight
                        .range(..id)
                        .filter_map(|(&fid, q)| match q.work {
                            Work::Flush {
                                covers: c,
                                fails: true,
                                ..
                            } => Some((fid, c)),
                            _ => None,
                        })
                        .max_by_key(|&(_, c)| c);
                    if let Some((failing, c)) = lost {
                        // ...but never what a still earlier flush that succeeds vouches for.
                        let vouched = self.vouched_before(failing);
                        self.doom_range(vouched, c);
                    }
                    self.make_durable(covers);
                    Ok(())
                };
                // Release the failing first flush of an out-of-order pair now that its partner is done.
                for q in self.inflight.values_mut() {
                    if let Work::Flush {
                        release_after: Some(after),
                        ..
                    } = q.work
                    {
                        if after == id {
                            q.held = false;
                            q.due = q.due.max(due);
                        }
                    }
                }
                Completion {
                    tag,
                    op,
                    lba,
                    buffer: None,
                    result,
                }
            }
        }
    }

    /// A successful write takes effect: into the cache, or straight onto the medium when the device
    /// has no volatile cache (power-loss protected: completion means durable).
    fn apply_write(&mut self, target: u64, data: &[u8]) {
        let lbs = self.lbs();
        let off = target.saturating_mul(lbs);
        // A misdirect may aim past the end: the part that does not fit is simply lost.
        let fit = self.cfg.capacity.saturating_sub(off).min(data.len() as u64) as usize;
        self.stats.bytes_written += data.len() as u64;
        let cseq = self.completed_writes;
        self.completed_writes += 1;
        if fit == 0 {
            return;
        }
        let data = &data[..fit];
        if self.cfg.volatile_cache {
            self.cache.push(CacheEntry::new(cseq, off, data.to_vec()));
        } else {
            self.media.write(off, data);
        }
        // Writing a block remaps a latent bad sector, as a drive does.
        self.read_errors.remove(target, target + fit as u64 / lbs);
    }

    /// The bytes a read would return now: the medium with the cache's live sectors over it, oldest
    /// first so that the newest completed write wins.
    pub(crate) fn read_view(&self, off: u64, buf: &mut [u8]) {
        self.media.read(off, buf);
        for e in &self.cache {
            e.overlay(off, buf);
        }
    }

    /// The most that flushes submitted before flush `id`, still running and bound to succeed,
    /// cover: a failure after them cannot take that back.
    fn vouched_before(&self, id: u64) -> u64 {
        self.inflight
            .range(..id)
            .filter_map(|(_, q)| match q.work {
                Work::Flush {
                    covers: c,
                    fails: false,
                    ..
                } => Some(c),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    fn doom_range(&mut self, from: u64, covers: u64) {
        for e in self
            .cache
            .iter_mut()
            .filter(|e| e.cseq >= from && e.cseq < covers)
        {
            e.doomed = true;
        }
    }

    /// A successful flush: the covered, not doomed cache entries go to the medium in completion
    /// order. Older entries left behind (doomed ones) lose the sectors a moved entry overwrote, so
    /// that a later cut cannot land stale bytes over durable data.
    fn make_durable(&mut self, covers: u64) {
        let (moved, kept): (Vec<CacheEntry>, Vec<CacheEntry>) = std::mem::take(&mut self.cache)
            .into_iter()
            .partition(|e| !e.doomed && e.cseq < covers);
        self.cache = kept;
        for m in &moved {
            write_live(&mut self.media, m);
        }
        let newest_moved = moved.iter().map(|m| m.cseq).max();
        if let Some(newest) = newest_moved {
            for k in self.cache.iter_mut().filter(|k| k.cseq < newest) {
                let older = k.cseq;
                for m in moved.iter().filter(|m| m.cseq > older) {
                    k.kill(m.off, m.data.len() as u64);
                }
            }
            self.cache.retain(|k| k.any_live());
        }
    }

    /// Writes `data` straight to the medium, as it reads now around it: every 512-byte sector the
    /// range touches becomes durable with the current view patched by `data`, and no cache entry
    /// keeps those sectors (so nothing pending can later bring older bytes back over them).
    pub(crate) fn poke_durable(&mut self, off: u64, data: &[u8]) {
        let cap = self.cfg.capacity;
        if off >= cap || data.is_empty() {
            return;
        }
        let len = (cap - off).min(data.len() as u64);
        let lo = off / SECTOR * SECTOR;
        let hi = (off + len).div_ceil(SECTOR).saturating_mul(SECTOR).min(cap);
        let mut view = vec![0u8; (hi - lo) as usize];
        self.read_view(lo, &mut view);
        let at = (off - lo) as usize;
        view[at..at + len as usize].copy_from_slice(&data[..len as usize]);
        self.media.write(lo, &view);
        for e in &mut self.cache {
            e.kill(lo, hi - lo);
        }
        self.cache.retain(|e| e.any_live());
    }

    pub(crate) fn flip_bit(&mut self, off: u64, bit: u8) {
        if off >= self.cfg.capacity {
            return;
        }
        self.media.flip_bit(off, bit);
        for e in &mut self.cache {
            if e.overlaps(off, 1) {
                let i = (off - e.off) as usize;
                if e.live[i / SECTOR as usize] {
                    e.data[i] ^= 1 << (bit & 7);
                }
            }
        }
    }
}

/// Writes an entry's live sectors to the medium.
pub(crate) fn write_live(media: &mut Media, e: &CacheEntry) {
    for (at, bytes) in e.live_runs() {
        media.write(at, bytes);
    }
}
