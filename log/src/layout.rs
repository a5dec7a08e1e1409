//! Where log positions live on the device: the ring of storage.md §4.3, and whether (and in which
//! pieces) the device a log is opened on can carry it.

use blockdev::DeviceInfo;

use crate::config::LogConfig;
use crate::format::Superblock;
use crate::LogError;

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

    /// The device I/Os that carry log bytes [position, position + len): each of [`segments`]
    /// cut into pieces of at most `max_io` bytes, in log order, as (device byte offset, offset
    /// into the span, length). With `max_io` a multiple of U (see [`Transfers`]) every piece of
    /// a batch starts and ends on a write unit, so no two pieces share a physical block.
    ///
    /// [`segments`]: Geometry::segments
    pub fn pieces(&self, position: u64, len: u64, max_io: u64) -> Vec<(u64, u64, u64)> {
        // Never zero: a zero piece size would never finish.
        let max_io = max_io.max(self.logical_block).max(1);
        let mut out = Vec::new();
        let mut from = 0;
        for (at, n) in self.segments(position, len) {
            let mut off = 0;
            while off < n {
                let take = (n - off).min(max_io);
                out.push((at + off, from + off, take));
                off += take;
            }
            from += n;
        }
        out
    }

    /// Whether the log can be read on a device of `info`: its logical block must divide U, or
    /// the batches (which start at multiples of U) cannot be addressed at all.
    pub fn check_readable(&self, info: &DeviceInfo) -> Result<(), LogError> {
        let logical = u64::from(info.logical_block_size);
        if logical == 0 || !self.write_unit.is_multiple_of(logical) {
            return Err(LogError::LogicalBlockMismatch {
                logical_block: logical,
                write_unit: self.write_unit,
            });
        }
        Ok(())
    }

    /// Whether the log can be *written* on a device of `info`, and in which pieces; checked
    /// before anything is written to it (recovery's fence, the writer's first batch).
    ///
    /// U is fixed at format from the device of that day (storage.md: the largest of its logical,
    /// physical and file system block sizes). The same bytes may later sit on a device with
    /// larger blocks: a 512-byte-sector drive cloned to a 4Kn or 512e one, a file copied to a
    /// file system with larger blocks. Batches are only U-aligned, so a batch would then start
    /// inside a block whose other part holds the end of the previous, acknowledged batch, and the
    /// device (or the file system) writes it by reading that block, changing part of it and
    /// writing it whole. A power cut during that write can damage the acknowledged bytes, and
    /// when no "durable through" above them was persisted yet, recovery cannot tell that damage
    /// from a torn tail and cuts acknowledged records (storage.md §5.3, §6). So a physical block
    /// or a file system block larger than U (or not dividing it) is refused.
    ///
    /// The atomic write unit (NVMe AWUPF) is deliberately not checked. It bounds the writes the
    /// device applies whole across a power loss; it is no read-modify-write granularity. A
    /// device that applies larger writes whole applies each U-sized piece whole too and never
    /// touches blocks outside a write; one that applies only smaller writes whole tears a U
    /// write into sectors, which is the torn tail recovery already tells from damage. Neither
    /// puts bytes outside a write at risk. (The preferred write size, NVMe NPWG, is a
    /// performance hint in the same way.)
    ///
    /// The maximum transfer only has to take one write unit: a batch larger than it is written
    /// in several pieces (see [`Transfers`]).
    pub fn check_device(&self, info: &DeviceInfo) -> Result<Transfers, LogError> {
        self.check_readable(info)?;
        let u = self.write_unit;
        for (block, size) in [
            ("physical block", info.physical_block_size),
            // Zero: not reported (every backend but the file backend).
            ("file system block", info.fs_block_size),
        ] {
            let size = u64::from(size);
            if size > u || (size != 0 && !u.is_multiple_of(size)) {
                return Err(LogError::BlockExceedsWriteUnit {
                    block,
                    size,
                    write_unit: u,
                });
            }
        }
        let max_transfer = u64::from(info.max_transfer);
        if max_transfer < u {
            return Err(LogError::TransferBelowWriteUnit {
                max_transfer,
                write_unit: u,
            });
        }
        // Format clamps the maximum batch to the device's maximum transfer, so a piece is the
        // whole batch unless the log moved to a device (or driver setting) that transfers less.
        let max_io = (max_transfer / u * u).min(self.max_batch).max(u);
        let per_batch = self.max_batch.div_ceil(max_io) + 1;
        Ok(Transfers {
            max_io,
            per_batch: u32::try_from(per_batch).unwrap_or(u32::MAX),
        })
    }
}

impl Geometry {
    /// Everything a device must satisfy before a writer configured with `cfg` may run this log on
    /// it: [`Geometry::check_device`] (blocks, maximum transfer) and then
    /// [`Transfers::check_queue`] against the device's `queue_depth`. Open (recovery, before its
    /// first write) and the writer run it; `nvmq inspect` and `verify` run it too, to say when
    /// open would refuse, so that all of them judge a device alike.
    pub fn check_for_writer(
        &self,
        info: &DeviceInfo,
        queue_depth: usize,
        cfg: &LogConfig,
    ) -> Result<Transfers, LogError> {
        let io = self.check_device(info)?;
        io.check_queue(queue_depth, self, cfg)?;
        Ok(io)
    }
}

/// How the writer cuts what it writes and reads into device I/Os on the device it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfers {
    /// The largest I/O: the device's maximum transfer rounded down to the write unit, at most a
    /// maximum batch.
    pub max_io: u64,
    /// The most I/Os a span of up to a maximum batch takes ([`Geometry::pieces`]): one per
    /// `max_io`, plus one where the span crosses the ring's end.
    pub per_batch: u32,
}

impl Transfers {
    /// The I/Os the writer may have in the device's queue at once: the pieces of every batch
    /// write it allows in flight, every flush, and one superblock write. Readers' I/Os get only
    /// the slots beyond these (the writer holds them back until slots free up).
    pub fn writer_ios(&self, cfg: &LogConfig) -> usize {
        (self.per_batch as usize)
            .saturating_mul(cfg.max_writes_in_flight)
            .saturating_add(cfg.max_flushes_in_flight)
            .saturating_add(1)
    }

    /// Refuses a queue that cannot take [`Transfers::writer_ios`]: a submission the device
    /// refuses for a full queue is a failed write, fatal for the writer.
    pub fn check_queue(
        &self,
        queue_depth: usize,
        geo: &Geometry,
        cfg: &LogConfig,
    ) -> Result<(), LogError> {
        // Room for one read too (as many I/Os as a batch), or readers could never run.
        let needed = self.writer_ios(cfg).saturating_add(self.per_batch as usize);
        if needed > queue_depth {
            return Err(LogError::QueueTooShallow {
                queue_depth,
                needed,
                max_batch: geo.max_batch,
                max_io: self.max_io,
                ios_per_batch: self.per_batch,
                writes: cfg.max_writes_in_flight,
                flushes: cfg.max_flushes_in_flight,
            });
        }
        Ok(())
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

    #[test]
    fn pieces_cut_each_segment_to_the_largest_io_in_log_order() {
        let g = geo();
        // Inside the ring, an I/O can take it all: one piece.
        assert_eq!(
            g.pieces(4096, 8192, 8192),
            vec![((2 << 20) + 4096, 0, 8192)]
        );
        // Over the ring's end, with I/Os of one write unit: 14, 15 | 0, 1 (blocks of the ring).
        let p = g.pieces(14 * 4096, 4 * 4096, 4096);
        let start = 2u64 << 20;
        assert_eq!(
            p,
            vec![
                (start + 14 * 4096, 0, 4096),
                (start + 15 * 4096, 4096, 4096),
                (start, 8192, 4096),
                (start + 4096, 12288, 4096),
            ]
        );
        // A degenerate size never loops forever.
        assert_eq!(g.pieces(0, 4096, 0).len(), 8);
    }

    fn info(logical: u32, physical: u32, fs: u32, max_transfer: u32) -> DeviceInfo {
        DeviceInfo {
            logical_block_size: logical,
            physical_block_size: physical,
            capacity: 1 << 30,
            max_transfer,
            atomic_write_unit: 0,
            preferred_write: 0,
            volatile_write_cache: true,
            fs_block_size: fs,
            identity: "test".into(),
            model: String::new(),
            health: String::new(),
            engine: String::new(),
            linked_flush: false,
        }
    }

    #[test]
    fn blocks_larger_than_the_write_unit_are_refused_and_name_both_sizes() {
        let g = geo(); // U = 4096
        assert!(g.check_device(&info(512, 4096, 4096, 1 << 20)).is_ok());
        let e = g.check_device(&info(512, 8192, 0, 1 << 20)).unwrap_err();
        assert_eq!(
            e,
            LogError::BlockExceedsWriteUnit {
                block: "physical block",
                size: 8192,
                write_unit: 4096
            }
        );
        let e = g
            .check_device(&info(4096, 4096, 65536, 1 << 20))
            .unwrap_err();
        assert!(matches!(
            e,
            LogError::BlockExceedsWriteUnit {
                block: "file system block",
                size: 65536,
                ..
            }
        ));
        assert!(e.to_string().contains("65536 B") && e.to_string().contains("4096 B"));
        let e = g.check_device(&info(8192, 8192, 0, 1 << 20)).unwrap_err();
        assert!(matches!(e, LogError::LogicalBlockMismatch { .. }), "{e}");
    }

    #[test]
    fn the_atomic_write_unit_is_no_part_of_the_check() {
        let g = geo();
        let mut i = info(4096, 4096, 0, 1 << 20);
        i.atomic_write_unit = 1 << 20;
        assert!(g.check_device(&i).is_ok());
        i.atomic_write_unit = 512;
        assert!(g.check_device(&i).is_ok());
    }

    #[test]
    fn a_small_max_transfer_splits_batches_and_one_below_the_write_unit_is_refused() {
        let g = geo(); // max batch 8192
        let t = g.check_device(&info(4096, 4096, 0, 1 << 20)).unwrap();
        assert_eq!((t.max_io, t.per_batch), (8192, 2));
        let t = g.check_device(&info(512, 4096, 0, 6144)).unwrap();
        // Rounded down to the write unit, so pieces never share a physical block.
        assert_eq!((t.max_io, t.per_batch), (4096, 3));
        let e = g.check_device(&info(512, 4096, 0, 2048)).unwrap_err();
        assert_eq!(
            e,
            LogError::TransferBelowWriteUnit {
                max_transfer: 2048,
                write_unit: 4096
            }
        );
    }

    #[test]
    fn a_queue_that_cannot_take_the_writers_ios_and_one_read_is_refused() {
        let g = geo();
        let t = g.check_device(&info(512, 4096, 0, 4096)).unwrap();
        let cfg = LogConfig::default(); // 1 write and 4 flushes in flight
        assert_eq!(t.writer_ios(&cfg), 3 + 4 + 1);
        // The writer's 8 and one read of up to 3 pieces.
        assert!(t.check_queue(11, &g, &cfg).is_ok());
        let e = t.check_queue(10, &g, &cfg).unwrap_err();
        assert!(
            matches!(e, LogError::QueueTooShallow { needed: 11, .. }),
            "{e}"
        );
    }
}
