//! What the sim stores: the durable medium, the volatile write cache over it, and the set of
//! blocks with latent read errors.

use std::collections::HashMap;

/// The granularity at which a power cut tears a write (storage.md §6): the classic disk sector.
/// Devices with 4 KiB logical blocks still tear at 512 bytes in this model, because real drives
/// give no stronger guarantee than AWUPF and the log must not rely on one.
pub const SECTOR: u64 = 512;

/// Size of one storage chunk of the sparse medium.
const CHUNK: u64 = 4096;

/// The durable medium: sparse, so that benchmarks can ask for a multi-GiB device without the sim
/// allocating it. An absent chunk reads as zeros, like a freshly trimmed drive. Lookups only, never
/// iteration, so the HashMap's order cannot leak into the run.
#[derive(Debug, Default)]
pub(crate) struct Media {
    chunks: HashMap<u64, Box<[u8]>>,
    capacity: u64,
}

impl Media {
    pub(crate) fn new(capacity: u64) -> Media {
        Media {
            chunks: HashMap::new(),
            capacity,
        }
    }

    /// Clips a byte range to the capacity: returns how many bytes of `len` at `off` exist.
    fn clip(&self, off: u64, len: usize) -> usize {
        if off >= self.capacity {
            0
        } else {
            (self.capacity - off).min(len as u64) as usize
        }
    }

    /// Reads `buf.len()` bytes at `off`; bytes past the capacity read as zeros.
    pub(crate) fn read(&self, off: u64, buf: &mut [u8]) {
        let n = self.clip(off, buf.len());
        buf[n..].fill(0);
        let mut done = 0usize;
        while done < n {
            let pos = off + done as u64;
            let (idx, within) = (pos / CHUNK, (pos % CHUNK) as usize);
            let take = (CHUNK as usize - within).min(n - done);
            match self.chunks.get(&idx) {
                Some(c) => buf[done..done + take].copy_from_slice(&c[within..within + take]),
                None => buf[done..done + take].fill(0),
            }
            done += take;
        }
    }

    /// Writes `data` at `off`; bytes past the capacity are dropped.
    pub(crate) fn write(&mut self, off: u64, data: &[u8]) {
        let n = self.clip(off, data.len());
        let mut done = 0usize;
        while done < n {
            let pos = off + done as u64;
            let (idx, within) = (pos / CHUNK, (pos % CHUNK) as usize);
            let take = (CHUNK as usize - within).min(n - done);
            let src = &data[done..done + take];
            match self.chunks.get_mut(&idx) {
                Some(c) => c[within..within + take].copy_from_slice(src),
                None => {
                    // Writing zeros into an absent chunk changes nothing: keep the medium sparse.
                    if src.iter().any(|&b| b != 0) {
                        let mut c = vec![0u8; CHUNK as usize].into_boxed_slice();
                        c[within..within + take].copy_from_slice(src);
                        self.chunks.insert(idx, c);
                    }
                }
            }
            done += take;
        }
    }

    pub(crate) fn flip_bit(&mut self, off: u64, bit: u8) {
        if off >= self.capacity {
            return;
        }
        let mut b = [0u8; 1];
        self.read(off, &mut b);
        b[0] ^= 1 << (bit & 7);
        self.write(off, &b);
    }
}

/// A write that completed but is not durable yet: it sits in the device's volatile cache. Public so
/// that other models of a volatile cache (the hw-test NBD server) keep their unflushed writes in
/// the same form and hand them to [`super::land_unflushed`] at a cut.
#[derive(Debug)]
pub struct CacheEntry {
    /// Completion order: a flush covers the entries with `cseq` below the count it captured.
    pub(crate) cseq: u64,
    /// Byte offset on the medium (where the write landed, which a misdirect may have moved).
    pub(crate) off: u64,
    pub(crate) data: Vec<u8>,
    /// Per 512-byte sector: false once a newer durable write (or a poke) has superseded this
    /// sector, so that neither reads nor a power cut can bring this entry's older bytes back over it.
    pub(crate) live: Vec<bool>,
    /// The flush that should have made this entry durable failed (or was overtaken by a later
    /// flush that succeeded without it): no later flush can save it, and a cut never keeps it whole.
    pub(crate) doomed: bool,
}

impl CacheEntry {
    /// `cseq` orders completions (the sim's flush coverage); other users may pass any count.
    pub fn new(cseq: u64, off: u64, data: Vec<u8>) -> CacheEntry {
        let sectors = (data.len() as u64).div_ceil(SECTOR) as usize;
        CacheEntry {
            cseq,
            off,
            data,
            live: vec![true; sectors],
            doomed: false,
        }
    }

    /// Byte offset of the write on the medium.
    pub fn off(&self) -> u64 {
        self.off
    }

    /// Bytes of the write (dead sectors included).
    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The live parts of the write as (byte offset, bytes), adjacent live sectors merged: what a
    /// flush puts on the medium.
    pub fn live_runs(&self) -> impl Iterator<Item = (u64, &[u8])> + '_ {
        let n = self.live.len();
        let mut i = 0;
        std::iter::from_fn(move || {
            while i < n && !self.live[i] {
                i += 1;
            }
            if i == n {
                return None;
            }
            let first = i;
            while i < n && self.live[i] {
                i += 1;
            }
            let start = self.sector_range(first).start;
            let end = self.sector_range(i - 1).end;
            Some((self.off + start as u64, &self.data[start..end]))
        })
    }

    pub(crate) fn end(&self) -> u64 {
        self.off + self.data.len() as u64
    }

    pub(crate) fn overlaps(&self, off: u64, len: u64) -> bool {
        off < self.end() && self.off < off.saturating_add(len)
    }

    /// The byte range of sector `i` within `data`.
    pub(crate) fn sector_range(&self, i: usize) -> std::ops::Range<usize> {
        let start = i * SECTOR as usize;
        start..(start + SECTOR as usize).min(self.data.len())
    }

    /// Copies this entry's live bytes that fall in `[off, off + buf.len())` into `buf`.
    pub fn overlay(&self, off: u64, buf: &mut [u8]) {
        if !self.overlaps(off, buf.len() as u64) {
            return;
        }
        let lo = off.max(self.off);
        let hi = (off + buf.len() as u64).min(self.end());
        let first = ((lo - self.off) / SECTOR) as usize;
        let last = ((hi - 1 - self.off) / SECTOR) as usize;
        for s in first..=last {
            if !self.live[s] {
                continue;
            }
            let r = self.sector_range(s);
            let s_lo = (self.off + r.start as u64).max(lo);
            let s_hi = (self.off + r.end as u64).min(hi);
            let src = &self.data[(s_lo - self.off) as usize..(s_hi - self.off) as usize];
            buf[(s_lo - off) as usize..(s_hi - off) as usize].copy_from_slice(src);
        }
    }

    /// Marks dead every sector of this entry that overlaps `[off, off + len)`.
    pub fn kill(&mut self, off: u64, len: u64) {
        if len == 0 || !self.overlaps(off, len) {
            return;
        }
        let lo = off.max(self.off);
        let hi = (off + len).min(self.end());
        let first = ((lo - self.off) / SECTOR) as usize;
        let last = ((hi - 1 - self.off) / SECTOR) as usize;
        for s in first..=last {
            self.live[s] = false;
        }
    }

    pub fn any_live(&self) -> bool {
        self.live.iter().any(|&l| l)
    }
}

/// A set of logical block numbers kept as sorted, disjoint, half-open ranges (latent read errors
/// may be planted over large ranges, so one entry per block would not do).
#[derive(Debug, Default, Clone)]
pub(crate) struct RangeSet {
    ranges: Vec<(u64, u64)>,
}

impl RangeSet {
    pub(crate) fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        let mut kept = Vec::with_capacity(self.ranges.len() + 1);
        for &(a, b) in &self.ranges {
            if b < s || a > e {
                kept.push((a, b));
            } else {
                s = s.min(a);
                e = e.max(b);
            }
        }
        kept.push((s, e));
        kept.sort_unstable();
        self.ranges = kept;
    }

    pub(crate) fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let mut kept = Vec::with_capacity(self.ranges.len() + 1);
        for &(a, b) in &self.ranges {
            if b <= start || a >= end {
                kept.push((a, b));
                continue;
            }
            if a < start {
                kept.push((a, start));
            }
            if b > end {
                kept.push((end, b));
            }
        }
        self.ranges = kept;
    }

    pub(crate) fn overlaps(&self, start: u64, end: u64) -> bool {
        self.ranges.iter().any(|&(a, b)| a < end && start < b)
    }

    pub(crate) fn clear(&mut self) {
        self.ranges.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_media_sparse_round_trip_and_clipping() {
        let mut m = Media::new(10_000);
        let data: Vec<u8> = (0..6000u32).map(|i| (i % 251) as u8 + 1).collect();
        m.write(3000, &data);
        let mut back = vec![0u8; 6000];
        m.read(3000, &mut back);
        assert_eq!(back, data);
        // Past the end: dropped on write, zeros on read, no panic.
        m.write(9_990, &[7u8; 100]);
        let mut tail = vec![1u8; 100];
        m.read(9_990, &mut tail);
        assert_eq!(&tail[..10], &[7u8; 10]);
        assert!(tail[10..].iter().all(|&b| b == 0));
        m.read(u64::MAX - 3, &mut tail);
        m.flip_bit(u64::MAX, 9);
    }

    #[test]
    fn sim_cache_entry_overlay_respects_dead_sectors() {
        let mut e = CacheEntry::new(0, 1024, vec![9u8; 2048]);
        e.kill(1600, 10); // kills sector 1 (1536..2048)
        let mut buf = vec![0u8; 4096];
        e.overlay(0, &mut buf);
        assert!(buf[..1024].iter().all(|&b| b == 0));
        assert!(buf[1024..1536].iter().all(|&b| b == 9));
        assert!(buf[1536..2048].iter().all(|&b| b == 0));
        assert!(buf[2048..3072].iter().all(|&b| b == 9));
        assert!(buf[3072..].iter().all(|&b| b == 0));
    }

    #[test]
    fn sim_cache_entry_live_runs_merge_adjacent_sectors() {
        let data: Vec<u8> = (0..2560u32).map(|i| (i % 251) as u8).collect();
        let mut e = CacheEntry::new(0, 4096, data.clone());
        e.kill(4096 + 512, 512); // sector 1 of 5
        let runs: Vec<(u64, Vec<u8>)> = e.live_runs().map(|(o, b)| (o, b.to_vec())).collect();
        assert_eq!(
            runs,
            vec![
                (4096, data[..512].to_vec()),
                (4096 + 1024, data[1024..].to_vec())
            ]
        );
        e.kill(0, 1 << 20);
        assert_eq!(e.live_runs().count(), 0);
    }

    #[test]
    fn sim_range_set_insert_remove() {
        let mut r = RangeSet::default();
        r.insert(10, 20);
        r.insert(15, 30);
        assert!(r.overlaps(29, 40));
        r.remove(12, 14);
        assert!(!r.overlaps(12, 14));
        assert!(r.overlaps(10, 11));
        r.remove(0, 100);
        assert!(!r.overlaps(0, u64::MAX));
    }
}
