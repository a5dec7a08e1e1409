//! The damage the simulator plants besides power cuts (storage.md §6): misdirected batch writes
//! and latent read errors; which acknowledged records each one really destroys (so that the
//! checks excuse exactly those), and which positions an error or a refusal may name for it; how
//! they are planted, and what becomes of the log after an open refused them.

use blockdev::sim::SimDevice;
use blockdev::{BlockDevice, DeviceError};
use nvmq_log::format::{superblock_offset, Superblock, LOG_START, SUPERBLOCK_LEN};
use nvmq_log::{LogError, Writer};

use super::device::debug;
use super::world::{position_in, World};

/// A batch write (or one piece of a batch that crosses the ring's end) that the device reported
/// done but put somewhere else. Acknowledged records in it are lost for real: no system can keep
/// them, because its place holds older bytes and its copy sits at a wrong address.
#[derive(Clone, Copy, Debug)]
pub struct Misdirect {
    /// Log positions [at, at + len) the write was meant for.
    pub at: u64,
    pub len: u64,
    /// Ring offset (bytes from the log start) where it landed, whatever was there.
    pub ring: u64,
}

/// A latent sector error planted across a cut in one block of acknowledged data.
#[derive(Clone, Copy, Debug)]
pub struct Latent {
    /// Log position of the block and its length.
    pub position: u64,
    pub len: u64,
}

#[derive(Default)]
pub struct Damage {
    /// Misdirects since the log was last formatted.
    pub misdirects: Vec<Misdirect>,
    /// D when the pending misdirect was armed: the misdirected write is the next log write, so
    /// its position is at or above it, and less than a ring above.
    pub armed_at: Option<u64>,
    pub latent: Option<Latent>,
    /// Device block (logical block address) with a read error planted while the writer runs.
    pub reading: Option<u64>,
}

/// The geometry the rules below need.
#[derive(Clone, Copy)]
pub struct Ring {
    pub log_size: u64,
    pub window: u64,
    pub max_batch: u64,
}

/// Whether [a, a + alen) and [b, b + blen) overlap on the ring (both may wrap its end).
pub fn ring_overlap(ring: &Ring, a: u64, alen: u64, b: u64, blen: u64) -> bool {
    let ls = ring.log_size;
    let (a, b) = (a % ls, b % ls);
    // Unwrap b's interval to the right of a's start, and check one lap to each side.
    let b = if b < a { b + ls } else { b };
    b < a + alen || b + blen > a + ls
}

impl Damage {
    pub fn planted(&self) -> bool {
        !self.misdirects.is_empty() || self.latent.is_some() || self.reading.is_some()
    }

    /// Whether a misdirect destroyed the batch at log positions [start, end): it is the batch
    /// (or holds the piece) that never reached its place, or one the misdirected copy overwrote.
    /// A copy lands over a batch written before it; batches written a window or more after the
    /// misdirected one were submitted after it completed, so they overwrote the copy instead.
    pub fn batch_lost(&self, ring: &Ring, start: u64, end: u64) -> bool {
        self.misdirects.iter().any(|m| {
            (start < m.at + m.len && m.at < end)
                || (start < m.at + ring.window
                    && ring_overlap(ring, start, end - start, m.ring, m.len))
        })
    }

    /// Whether `position` is where a check may stop for planted damage: within a batch's length
    /// before a misdirect's place or landing zone, or before the latent read error's block. A
    /// refusal names the batch holding the failure (or, for a header found at a wrong address,
    /// that address); a read error names the batch whose read failed. The landing zone is named
    /// in the lap it hit (a retained batch up to a ring below, or free space ahead), or in the
    /// next, where a batch lost at a cut may leave the copy showing through.
    pub fn names(&self, ring: &Ring, position: u64) -> bool {
        let mb = ring.max_batch;
        let near = |at: u64, len: u64| position + mb > at && position < at + len;
        self.misdirects.iter().any(|m| {
            near(m.at, m.len)
                || (position + ring.log_size > m.at
                    && position < m.at + ring.log_size + ring.window + mb
                    && ring_overlap(ring, position, mb, m.ring, m.len))
        }) || self.latent.is_some_and(|l| near(l.position, l.len))
    }

    /// Whether a recovery cut at `cut` stopped at a misdirect's damage, which (like a tear)
    /// takes every later record with it when nothing durable above it was recorded yet
    /// (storage.md §5.3, the known limit).
    pub fn cut_at_misdirect(&self, ring: &Ring, cut: u64) -> bool {
        !self.misdirects.is_empty() && self.names(ring, cut)
    }
}

impl World {
    /// After an open refused (or an index rebuild reported) planted damage named at `position`:
    /// a latent read error is remapped (cleared) and the device power-cycled, and then everything
    /// acknowledged must read back; a misdirect destroyed acknowledged data, so the log stays
    /// refused and the operator formats. Returns the device, and whether it was formatted.
    pub(super) fn after_damage(&mut self, position: u64) -> Result<(SimDevice, bool), String> {
        self.handle.power_cut();
        self.cuts += 1;
        let mb = u64::from(self.fmt.max_batch);
        let latent = self
            .damage
            .latent
            .is_some_and(|l| position + mb > l.position && position < l.position + l.len);
        if latent || self.damage.misdirects.is_empty() {
            self.handle.clear_read_errors();
            self.damage.latent = None;
            return Ok((self.handle.power_on(), false));
        }
        Ok((self.reformat(false)?, true))
    }

    /// Arms a misdirect of the next batch write: into retained acknowledged data, or anywhere
    /// in the ring.
    pub(super) fn arm_misdirect<D: BlockDevice>(&mut self, w: &Writer<D>) {
        let (head, d) = {
            let shared = w.shared();
            let s = shared.lock();
            (s.head, s.durable)
        };
        let ls = self.log_size();
        let target = if self.rng.chance(0.5) {
            let c: Vec<_> = self
                .located()
                .into_iter()
                .filter(|r| r.3 >= head && r.4 <= d)
                .collect();
            if c.is_empty() {
                return;
            }
            c[self.rng.below(c.len() as u64) as usize].3 % ls
        } else {
            self.rng.below(ls / self.unit) * self.unit
        };
        self.plan.lock().unwrap().misdirect = Some(target);
        self.damage.armed_at = Some(d);
    }

    /// Takes note of the misdirects the device did.
    pub(super) fn landed(&mut self) -> Result<(), String> {
        let (landed, leaked) = {
            let mut p = self.plan.lock().unwrap();
            (std::mem::take(&mut p.landed), p.leaked)
        };
        if leaked {
            return Err("a misdirect was armed for a write the device then refused".into());
        }
        let ls = self.log_size();
        for l in landed {
            let floor = self
                .damage
                .armed_at
                .take()
                .ok_or("a misdirect landed that was not armed")?;
            let at = floor + (l.from + ls - floor % ls) % ls;
            if debug() {
                eprintln!(
                    "cut {}: the write of log position {at} ({} B) landed at ring offset {}",
                    self.cuts, l.len, l.to
                );
            }
            self.damage.misdirects.push(Misdirect {
                at,
                len: l.len,
                ring: l.to,
            });
            self.summary.misdirects += 1;
        }
        Ok(())
    }

    /// A latent read error in a block of an acknowledged record while the writer runs: reading
    /// it gives an error (or the right bytes from the tail cache), and once the error is gone it
    /// reads back.
    pub(super) fn read_error_while_running<D: BlockDevice>(
        &mut self,
        w: &mut Writer<D>,
    ) -> Result<(), String> {
        let (head, d) = {
            let shared = w.shared();
            let s = shared.lock();
            (s.head, s.durable)
        };
        let ring = self.ring();
        let c: Vec<_> = self
            .located()
            .into_iter()
            .filter(|r| r.3 >= head && r.4 <= d && !self.damage.batch_lost(&ring, r.3, r.4))
            .collect();
        if c.is_empty() {
            return Ok(());
        }
        let (id, off, pos, _, _) = c[self.rng.below(c.len() as u64) as usize];
        let lba = (LOG_START + pos % ring.log_size) / self.logical;
        self.handle.set_read_error(lba, 1);
        self.damage.reading = Some(lba);
        let first = self.verify_partition(w, id, off, None);
        self.handle.clear_read_errors();
        self.damage.reading = None;
        first?;
        self.verify_partition(w, id, off, None)
    }

    /// After a cut: a latent read error in a block of an acknowledged record that the superblock
    /// recovery will choose retains and names durable. The open must refuse it (or the index
    /// rebuild report it).
    pub(super) fn plant_latent(&mut self) {
        let copies = [0u8, 1].map(|slot| {
            let b = self.handle.peek(superblock_offset(slot), SUPERBLOCK_LEN);
            Superblock::decode(&b, slot)
        });
        let Ok(choice) = recovery::choose(&copies) else {
            return;
        };
        let sb = choice.chosen;
        let ring = self.ring();
        let c: Vec<_> = self
            .located()
            .into_iter()
            .filter(|r| {
                r.3 >= sb.head
                    && r.4 <= sb.durable_through
                    && !self.damage.batch_lost(&ring, r.3, r.4)
            })
            .collect();
        if c.is_empty() {
            return;
        }
        let (_, _, pos, _, _) = c[self.rng.below(c.len() as u64) as usize];
        let lba = (LOG_START + pos % ring.log_size) / self.logical;
        self.handle.set_read_error(lba, 1);
        self.damage.latent = Some(Latent {
            position: pos - pos % self.logical,
            len: self.logical,
        });
        self.summary.latent_planted += 1;
    }

    /// A read the reader refused while damage is planted: fine when it names that damage (the
    /// broker must never serve wrong bytes, and says where). Returns the offset to go on from.
    pub(super) fn refused_read<D: BlockDevice>(
        &mut self,
        w: &Writer<D>,
        id: u32,
        at: u64,
        e: &LogError,
    ) -> Result<u64, String> {
        let ring = self.ring();
        let (entry, first_indexed, start) = {
            let shared = w.shared();
            let s = shared.lock();
            let v = s.partitions.get(&id);
            (
                v.and_then(|v| v.locate(at)),
                v.and_then(|v| v.entries.front().map(|e| e.first_offset)),
                v.map_or(0, |v| v.start_offset),
            )
        };
        if at < start && entry.is_none() {
            // Retention freed the batch while it was read: read again (out of range now).
            return Ok(at);
        }
        let bad =
            || format!("partition {id}: read at {at} refused, but no planted damage is there: {e}");
        match e {
            LogError::Corrupt { what, .. } if what.contains("could not be indexed") => {
                // The rebuild of the index below the recovery point stopped at the damage: all
                // of that region is refused, as an open would be.
                let named = position_in(what).ok_or_else(bad)?;
                if !self.damage.names(&ring, named) {
                    return Err(bad());
                }
                self.summary.damage_reported += 1;
                Ok(first_indexed.filter(|&f| f > at).unwrap_or(at + 1))
            }
            LogError::Corrupt { position, .. } => {
                let entry = entry.ok_or_else(bad)?;
                let end = entry.batch_position + u64::from(entry.batch_length);
                if *position != entry.batch_position
                    || !self.damage.batch_lost(&ring, entry.batch_position, end)
                {
                    return Err(bad());
                }
                self.summary.damage_reported += 1;
                Ok(entry.end_offset)
            }
            LogError::Device {
                source: DeviceError::Io { lba, .. },
                ..
            } => {
                // A latent read error: an error, never other bytes, naming a block of the batch
                // that holds the bad one. The records stay demanded: once the error is gone they
                // must read back.
                let entry = entry.ok_or_else(bad)?;
                let logical = self.logical;
                let in_batch = |lba: u64| {
                    (lba * logical).checked_sub(LOG_START).is_some_and(|r| {
                        ring_overlap(
                            &ring,
                            entry.batch_position,
                            u64::from(entry.batch_length),
                            r,
                            logical,
                        )
                    })
                };
                if !(self.damage.reading.is_some_and(in_batch) && in_batch(*lba)) {
                    return Err(bad());
                }
                self.summary.read_errors_seen += 1;
                Ok(entry.end_offset)
            }
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: Ring = Ring {
        log_size: 100,
        window: 20,
        max_batch: 10,
    };

    #[test]
    fn ring_overlap_handles_wrapping_intervals() {
        assert!(ring_overlap(&R, 10, 5, 12, 5));
        assert!(!ring_overlap(&R, 10, 5, 15, 5));
        assert!(ring_overlap(&R, 95, 10, 2, 3));
        assert!(ring_overlap(&R, 2, 3, 95, 10));
        assert!(!ring_overlap(&R, 5, 3, 95, 10));
        assert!(ring_overlap(&R, 205, 3, 0, 10));
    }

    #[test]
    fn a_misdirect_destroys_its_batch_and_what_it_lands_on() {
        let d = Damage {
            misdirects: vec![Misdirect {
                at: 230,
                len: 10,
                ring: 50,
            }],
            ..Damage::default()
        };
        assert!(d.batch_lost(&R, 230, 240));
        assert!(
            d.batch_lost(&R, 145, 155),
            "the retained batch it landed on"
        );
        assert!(
            !d.batch_lost(&R, 250, 260),
            "the ring around it is untouched"
        );
        assert!(
            !d.batch_lost(&R, 350, 360),
            "a batch of the next lap overwrote the copy"
        );
        assert!(d.names(&R, 230) && d.names(&R, 145) && d.names(&R, 250) && d.names(&R, 350));
        assert!(!d.names(&R, 270) && !d.names(&R, 450) && !d.names(&R, 45));
    }
}
