//! The power cut: the crash model of storage.md §6.
//!
//! This is the only place where state that is not durable reaches the medium at a cut. Everything
//! that might land (completed writes still in the volatile cache, and writes in flight) is gathered,
//! put in a seeded random order (a drive destages and services in any order), and each one is
//! independently kept whole, lost, or torn at 512-byte sectors, with optional garbage sectors and
//! read-modify-write damage to its physical block's neighbours. Then the device is off.

use std::convert::Infallible;

use super::media::{CacheEntry, SECTOR};
use super::state::{State, Work};
use super::{CutReport, Rng};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Completed, in the volatile cache.
    Cached,
    /// Completed, but its flush failed: it may be lost or torn, never kept whole.
    Doomed,
    /// Submitted and not completed: it may land, be lost, or tear.
    InFlight,
}

struct Item {
    kind: Kind,
    entry: CacheEntry,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Sector {
    New,
    Old,
    Garbage,
}

/// Probability that a torn sector holds garbage when `garbage_sectors` is on.
const GARBAGE_P: f64 = 0.25;
/// Probability that a partially written physical block is caught mid read-modify-write, and then
/// that each neighbouring sector of it is damaged.
const RMW_BLOCK_P: f64 = 0.5;
const RMW_SECTOR_P: f64 = 0.5;

impl State {
    pub(crate) fn power_cut(&mut self) -> CutReport {
        let mut report = CutReport::default();
        if self.off {
            // Already off: nothing is pending, so a second cut changes nothing.
            return report;
        }
        let mut items = Vec::new();
        for e in std::mem::take(&mut self.cache) {
            if !e.any_live() {
                continue;
            }
            let kind = if e.doomed { Kind::Doomed } else { Kind::Cached };
            match kind {
                Kind::Doomed => report.doomed += 1,
                _ => report.cached += 1,
            }
            items.push(Item { kind, entry: e });
        }
        let lbs = self.lbs();
        let cap = self.cfg.capacity;
        let inflight = std::mem::take(&mut self.inflight);
        // Linked flushes whose write had not completed never ran.
        self.linked.clear();
        report.dropped_ios = inflight.len() as u64;
        for p in inflight.into_values() {
            if let Work::Write {
                buffer,
                target,
                fails: false,
            } = &p.work
            {
                let off = target.saturating_mul(lbs);
                let fit = cap.saturating_sub(off).min(buffer.len() as u64) as usize;
                if fit == 0 {
                    continue;
                }
                report.in_flight_writes += 1;
                let entry = CacheEntry::new(u64::MAX, off, buffer[..fit].to_vec());
                items.push(Item {
                    kind: Kind::InFlight,
                    entry,
                });
            }
            // Reads and flushes in flight just never complete; a write that was going to fail
            // never reaches the medium. Their buffers are dropped here.
        }
        self.rng.shuffle(&mut items);
        for item in &items {
            self.land(item, &mut report);
        }
        self.off = true;
        self.faults.ooo_first = None;
        self.stats.cuts += 1;
        report
    }

    fn land(&mut self, item: &Item, report: &mut CutReport) {
        let e = &item.entry;
        let media = &mut self.media;
        let landed = land_unflushed::<Infallible>(
            &mut self.rng,
            e,
            item.kind == Kind::Doomed,
            self.cfg.garbage_sectors,
            |at, bytes| {
                media.write(at, bytes);
                Ok(())
            },
        );
        let Ok(landed) = landed;
        report.garbage_sectors += landed.garbage_sectors;
        match landed.fate {
            WriteFate::Survived => report.survived += 1,
            WriteFate::Lost => report.lost += 1,
            WriteFate::Torn => report.torn += 1,
        }
        if self.cfg.rmw_damage {
            self.rmw_damage(e.off, e.data.len() as u64, report);
        }
    }

    /// A write that covers only part of a physical block makes the drive read, merge and rewrite
    /// the whole block; a cut in the middle may leave the block's *other* sectors damaged, which
    /// is why the log never lets two writes share a physical block (the write unit U).
    fn rmw_damage(&mut self, off: u64, len: u64, report: &mut CutReport) {
        let pbs = u64::from(self.cfg.physical_block_size);
        if pbs <= SECTOR || len == 0 {
            return;
        }
        let end = off + len;
        let first = off / pbs;
        let last = (end - 1) / pbs;
        let mut blocks = vec![first];
        if last != first {
            blocks.push(last);
        }
        for b in blocks {
            let (b_lo, b_hi) = (b * pbs, (b + 1) * pbs);
            if off <= b_lo && end >= b_hi {
                continue; // fully covered: no read-modify-write
            }
            if !self.rng.chance(RMW_BLOCK_P) {
                continue;
            }
            let mut s = b_lo;
            while s < b_hi && s < self.cfg.capacity {
                let inside = s >= off && s + SECTOR <= end;
                if !inside && self.rng.chance(RMW_SECTOR_P) {
                    let mut junk = vec![0u8; SECTOR as usize];
                    self.rng.fill(&mut junk);
                    self.media.write(s, &junk);
                    report.rmw_damaged_sectors += 1;
                }
                s += SECTOR;
            }
        }
    }
}

/// What a power cut made of one unflushed write, judged by what landed, not by what was rolled: a
/// "tear" that came out all new is a survivor, and one that came out all old (no garbage) a loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteFate {
    Survived,
    Lost,
    Torn,
}

/// The outcome of [`land_unflushed`] for one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Landing {
    pub fate: WriteFate,
    /// Sectors left holding random bytes (only with `garbage`).
    pub garbage_sectors: u64,
}

/// The crash model for one write that completed but was not flushed when the power went: with one
/// draw from `rng` it survives whole, is lost, or is torn, and a torn write keeps each live 512-byte
/// sector new or old independently (or, with `garbage`, random). Every sector that changes the
/// medium is handed to `put(byte offset, bytes)` in ascending order; the caller owns the medium
/// (the sim's memory, or a file behind an NBD server). A `doomed` write (its flush failed) is
/// never kept whole. The order of draws is fixed, so a seed replays the same cut.
pub fn land_unflushed<E>(
    rng: &mut Rng,
    e: &CacheEntry,
    doomed: bool,
    garbage: bool,
    mut put: impl FnMut(u64, &[u8]) -> Result<(), E>,
) -> Result<Landing, E> {
    let live: Vec<usize> = (0..e.live.len()).filter(|&i| e.live[i]).collect();
    let roll = rng.below(3);
    let mut fate: Vec<Sector> = match (doomed, roll) {
        (false, 0) => vec![Sector::New; live.len()],
        (false, 1) | (true, 0) => vec![Sector::Old; live.len()],
        _ => tear(rng, live.len(), garbage),
    };
    if doomed && fate.iter().all(|&s| s == Sector::New) {
        // The failed flush lost at least part of it.
        let i = rng.below(fate.len() as u64) as usize;
        if let Some(f) = fate.get_mut(i) {
            *f = Sector::Old;
        }
    }
    let (mut new, mut old, mut junk_sectors) = (0usize, 0usize, 0u64);
    for (&s, &f) in live.iter().zip(&fate) {
        let r = e.sector_range(s);
        let at = e.off + r.start as u64;
        match f {
            Sector::New => {
                new += 1;
                put(at, &e.data[r])?;
            }
            Sector::Old => old += 1,
            Sector::Garbage => {
                junk_sectors += 1;
                let mut junk = vec![0u8; r.len()];
                rng.fill(&mut junk);
                put(at, &junk)?;
            }
        }
    }
    let fate = if new == live.len() {
        WriteFate::Survived
    } else if old == live.len() {
        WriteFate::Lost
    } else {
        WriteFate::Torn
    };
    Ok(Landing {
        fate,
        garbage_sectors: junk_sectors,
    })
}

fn tear(rng: &mut Rng, sectors: usize, garbage: bool) -> Vec<Sector> {
    (0..sectors)
        .map(|_| {
            if garbage && rng.chance(GARBAGE_P) {
                Sector::Garbage
            } else if rng.below(2) == 0 {
                Sector::New
            } else {
                Sector::Old
            }
        })
        .collect()
}
