//! Where log positions live on the device: the ring of storage.md §4.3.

use crate::format::Superblock;

/// The geometry every component shares, taken from the superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub format_id: u64,
    pub write_unit: u64,
    pub log_start: u64,
    pub log_size: u64,
    pub max_batch: u64,
    pub window: u64,
    pub logical_block: u64,
}

impl Geometry {
    pub fn from_superblock(sb: &Superblock, logical_block: u32) -> Geometry {
        Geometry {
            format_id: sb.format_id,
            write_unit: u64::from(sb.write_unit),
            log_start: sb.log_start,
            log_size: sb.log_size,
            max_batch: u64::from(sb.max_batch),
            window: sb.window,
            logical_block: u64::from(logical_block),
        }
    }

    /// The device byte ranges that hold log bytes [position, position + len): one range, or two
    /// when the span crosses the ring's end. `len` must not exceed the log size.
    pub fn segments(&self, position: u64, len: u64) -> [(u64, u64); 2] {
        let off = position % self.log_size;
        let first = len.min(self.log_size - off);
        [(self.log_start + off, first), (self.log_start, len - first)]
    }

    /// Rounds a length up to the write unit.
    pub fn round_up(&self, len: u64) -> u64 {
        len.div_ceil(self.write_unit) * self.write_unit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        Geometry {
            format_id: 1,
            write_unit: 4096,
            log_start: 2 << 20,
            log_size: 16 * 4096,
            max_batch: 8192,
            window: 16384,
            logical_block: 512,
        }
    }

    #[test]
    fn a_span_inside_the_ring_is_one_segment() {
        let g = geo();
        let s = g.segments(3 * 4096 + 16 * 4096 * 5, 8192);
        assert_eq!(s[0], ((2 << 20) + 3 * 4096, 8192));
        assert_eq!(s[1].1, 0);
    }

    #[test]
    fn a_span_over_the_ring_end_splits_in_two() {
        let g = geo();
        let s = g.segments(15 * 4096, 3 * 4096);
        assert_eq!(s[0], ((2 << 20) + 15 * 4096, 4096));
        assert_eq!(s[1], (2 << 20, 8192));
    }
}
