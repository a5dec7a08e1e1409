//! DMA memory: a few large arenas mapped for the device once, IOVAs chosen inside the ranges the
//! IOMMU accepts, and fixed-size buffers carved from the arenas and recycled.
//!
//! IOVAs are not virtual addresses: QEMU's emulated VT-d has a 39-bit address width by default, so
//! user addresses (47 bits) would be refused. Like QEMU's and libvfn's drivers we allocate from
//! 0x10000 upwards inside the reported ranges (or below 2^39 when none are reported).

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use super::sys::{HostError, IovaRange, Memlock, Memory};
use crate::buffer::BufferPool;
use crate::{DeviceError, IoBuffer, Op};

/// Lowest IOVA handed out (QEMU util/vfio-helpers.c and libvfn use the same).
pub const IOVA_MIN: u64 = 0x10000;
/// Highest IOVA when the kernel reports no ranges: the 39-bit width of QEMU's VT-d.
pub const IOVA_MAX_DEFAULT: u64 = (1 << 39) - 1;
/// Arenas start on this IOVA alignment so huge pages map with huge IOMMU entries.
pub const ARENA_ALIGN: u64 = 2 << 20;
/// Smallest buffer handed out, and the alignment of every buffer.
pub const MIN_BUFFER: usize = 4096;

/// A bump allocator over the IOVA ranges.
#[derive(Debug, Clone)]
pub struct IovaSpace {
    ranges: Vec<IovaRange>,
    next: u64,
}

impl IovaSpace {
    pub fn new(reported: &[IovaRange]) -> IovaSpace {
        let mut ranges: Vec<IovaRange> = if reported.is_empty() {
            vec![IovaRange {
                start: IOVA_MIN,
                end: IOVA_MAX_DEFAULT,
            }]
        } else {
            reported
                .iter()
                .filter(|r| r.end >= IOVA_MIN && r.end >= r.start)
                .map(|r| IovaRange {
                    start: r.start.max(IOVA_MIN),
                    end: r.end,
                })
                .collect()
        };
        ranges.sort_by_key(|r| r.start);
        IovaSpace {
            ranges,
            next: IOVA_MIN,
        }
    }

    /// `len` bytes of IOVA space aligned to `align` (a power of two), never reused.
    pub fn alloc(&mut self, len: usize, align: u64) -> Result<u64, HostError> {
        let len64 = len as u64;
        for r in &self.ranges {
            let Some(start) = self.next.max(r.start).checked_next_multiple_of(align) else {
                continue;
            };
            let Some(last) = start.checked_add(len64.saturating_sub(1)) else {
                continue;
            };
            if len > 0 && last <= r.end {
                self.next = last + 1;
                return Ok(start);
            }
        }
        Err(HostError::IovaExhausted {
            len,
            ranges: self
                .ranges
                .iter()
                .map(|r| format!("{:#x}..={:#x}", r.start, r.end))
                .collect::<Vec<_>>()
                .join(", "),
        })
    }
}

/// Refuses to pin more than the process may.
pub fn check_memlock(m: Memlock, total_after: u64) -> Result<(), HostError> {
    match m.limit {
        Some(limit) if !m.privileged && total_after > limit => Err(HostError::Memlock {
            limit,
            need: total_after,
            need_kib: total_after.div_ceil(1024),
        }),
        _ => Ok(()),
    }
}

/// A mapped span of memory: where it is for the CPU and for the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub vaddr: usize,
    pub iova: u64,
    pub len: usize,
}

impl Span {
    /// The device address of `len` bytes at `ptr` if they lie inside this span.
    pub fn iova_of(&self, ptr: usize, len: usize) -> Option<u64> {
        let off = ptr.checked_sub(self.vaddr)?;
        (off.checked_add(len)? <= self.len).then(|| self.iova + off as u64)
    }
}

/// Memory for queues, PRP lists and admin data, carved once at start.
pub struct ControlArena {
    mem: Memory,
    pub span: Span,
    used: usize,
}

impl ControlArena {
    pub fn new(mem: Memory, iova: u64) -> ControlArena {
        let span = Span {
            vaddr: mem.as_ptr() as usize,
            iova,
            len: mem.len(),
        };
        ControlArena { mem, span, used: 0 }
    }

    pub fn memory(&self) -> &Memory {
        &self.mem
    }

    /// `len` zeroed bytes aligned to `align`: (CPU pointer, device address).
    pub fn carve(&mut self, len: usize, align: usize) -> Option<(NonNull<u8>, u64)> {
        let start = self.used.checked_next_multiple_of(align)?;
        let end = start.checked_add(len)?;
        if end > self.mem.len() {
            return None;
        }
        self.used = end;
        // SAFETY: start < len of the mapping, so the pointer stays inside it.
        let p = unsafe { self.mem.as_ptr().add(start) };
        Some((NonNull::new(p)?, self.span.iova + start as u64))
    }
}

/// Size classes: powers of two from 4 KiB to 2^(12+CLASSES-1).
const CLASSES: usize = 16;

struct Arena {
    mem: Memory,
    iova: u64,
    used: usize,
}

#[derive(Default)]
struct PoolInner {
    arenas: Vec<Arena>,
    /// Free buffers per size class: (address, iova).
    free: [Vec<(usize, u64)>; CLASSES],
}

/// The buffer pool over the DMA arenas. Buffers are power-of-two sized (at least 4 KiB, which also
/// is their alignment); a released buffer goes to its class's free list and is handed out again.
#[derive(Default)]
pub struct DmaPool {
    inner: Mutex<PoolInner>,
}

/// The capacity a request of `len` bytes gets, or None when it is larger than any class.
pub fn class_size(len: usize) -> Option<(usize, usize)> {
    let size = len.max(MIN_BUFFER).checked_next_power_of_two()?;
    let class = (size.trailing_zeros() - MIN_BUFFER.trailing_zeros()) as usize;
    (class < CLASSES).then_some((class, size))
}

impl DmaPool {
    /// Adds an arena already mapped for the device at `iova`.
    pub fn add_arena(&self, mem: Memory, iova: u64) {
        let mut inner = self.lock();
        inner.arenas.push(Arena { mem, iova, used: 0 });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolInner> {
        // A panic while holding the lock leaves only free lists behind, which stay consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A zeroed buffer of at least `len` bytes with its length set to `len`, or None when no arena
    /// has room (the caller maps another arena and retries).
    pub fn alloc(self: &Arc<Self>, len: usize) -> Result<Option<IoBuffer>, DeviceError> {
        let Some((class, size)) = class_size(len) else {
            return Err(DeviceError::BadRequest {
                op: Op::Allocate,
                lba: 0,
                len,
                why: "larger than the biggest DMA buffer class",
            });
        };
        let found = {
            let mut inner = self.lock();
            match inner.free[class].pop() {
                Some(f) => Some(f),
                None => inner.arenas.iter_mut().find_map(|a| {
                    let start = a.used.checked_next_multiple_of(MIN_BUFFER)?;
                    let end = start.checked_add(size)?;
                    (end <= a.mem.len()).then(|| {
                        a.used = end;
                        (a.mem.as_ptr() as usize + start, a.iova + start as u64)
                    })
                }),
            }
        };
        let Some((addr, iova)) = found else {
            return Ok(None);
        };
        let ptr = NonNull::new(addr as *mut u8).ok_or(DeviceError::BadRequest {
            op: Op::Allocate,
            lba: 0,
            len,
            why: "null DMA address",
        })?;
        // SAFETY: the `size` bytes at ptr belong to an arena this pool owns and were handed to no
        // one else (taken from the bump pointer or a free list); zeroing them is ours to do.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, size) };
        let pool: Arc<dyn BufferPool> = self.clone();
        // SAFETY: as above; the arena lives as long as the pool, which the buffer keeps alive.
        let mut b = unsafe { IoBuffer::from_pool(ptr, size, iova, pool) };
        b.set_len(len);
        Ok(Some(b))
    }

    /// Bytes of arena memory mapped.
    pub fn mapped_bytes(&self) -> usize {
        self.lock().arenas.iter().map(|a| a.mem.len()).sum()
    }
}

impl BufferPool for DmaPool {
    unsafe fn release(&self, ptr: NonNull<u8>, capacity: usize, iova: u64) {
        if let Some((class, size)) = class_size(capacity) {
            if size == capacity {
                self.lock().free[class].push((ptr.as_ptr() as usize, iova));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iovas_start_at_the_minimum_and_stay_below_39_bits_by_default() {
        let mut s = IovaSpace::new(&[]);
        assert_eq!(s.alloc(4096, 4096).unwrap(), IOVA_MIN);
        let b = s.alloc(1 << 20, ARENA_ALIGN).unwrap();
        assert_eq!(b, ARENA_ALIGN);
        assert!(s.alloc(1 << 39, 4096).is_err());
    }

    #[test]
    fn iovas_skip_holes_between_reported_ranges() {
        // An x86 MSI window hole as the kernel reports it.
        let ranges = [
            IovaRange {
                start: 0,
                end: 0xFEDF_FFFF,
            },
            IovaRange {
                start: 0xFEF0_0000,
                end: (1 << 39) - 1,
            },
        ];
        let mut s = IovaSpace::new(&ranges);
        let a = s.alloc(0xFE00_0000, ARENA_ALIGN).unwrap();
        assert_eq!(a, ARENA_ALIGN);
        // The next 16 MiB do not fit below the hole any more.
        let b = s.alloc(16 << 20, ARENA_ALIGN).unwrap();
        assert!(b >= 0xFEF0_0000, "{b:#x}");
        let e = s.alloc(1 << 40, ARENA_ALIGN).unwrap_err().to_string();
        assert!(e.contains("0xfef00000"), "{e}");
    }

    #[test]
    fn memlock_is_checked_unless_unlimited_or_privileged() {
        let low = Memlock {
            limit: Some(8 << 20),
            privileged: false,
        };
        let e = check_memlock(low, 40 << 20).unwrap_err().to_string();
        assert!(e.contains("RLIMIT_MEMLOCK is 8388608 bytes"), "{e}");
        assert!(e.contains("ulimit -l 40960"), "{e}");
        assert!(check_memlock(low, 8 << 20).is_ok());
        assert!(check_memlock(
            Memlock {
                privileged: true,
                ..low
            },
            1 << 40
        )
        .is_ok());
        assert!(check_memlock(
            Memlock {
                limit: None,
                privileged: false
            },
            1 << 40
        )
        .is_ok());
    }

    #[test]
    fn buffers_are_classed_zeroed_and_recycled() {
        let pool = Arc::new(DmaPool::default());
        assert!(pool.alloc(4096).unwrap().is_none(), "no arena yet");
        pool.add_arena(Memory::anonymous(1 << 20).unwrap(), 0x40_0000);
        let mut a = pool.alloc(5000).unwrap().unwrap();
        assert_eq!((a.len(), a.capacity()), (5000, 8192));
        assert_eq!(a.iova() % 4096, 0);
        assert!(a.iova() >= 0x40_0000);
        a.fill(0xEE);
        let (addr, iova) = (a.as_ptr() as usize, a.iova());
        drop(a);
        let b = pool.alloc(8192).unwrap().unwrap();
        assert_eq!((b.as_ptr() as usize, b.iova()), (addr, iova), "recycled");
        assert!(b.iter().all(|&x| x == 0), "zeroed again");
        assert!(pool.alloc(2 << 20).unwrap().is_none(), "arena exhausted");
        assert!(pool.alloc(usize::MAX / 2).is_err());
    }

    #[test]
    fn spans_translate_only_what_they_contain() {
        let s = Span {
            vaddr: 0x1000_0000,
            iova: 0x20_0000,
            len: 0x10000,
        };
        assert_eq!(s.iova_of(0x1000_1000, 0x1000), Some(0x20_1000));
        assert_eq!(s.iova_of(0x1000_F000, 0x2000), None);
        assert_eq!(s.iova_of(0x0FFF_F000, 0x1000), None);
    }
}
