//! Aligned I/O buffers that a device owns while an I/O runs.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::{DeviceError, Op};

/// Where a buffer's memory goes back to when it is dropped. A DMA backend hands out buffers carved
/// from an arena it mapped for the device; it implements this to take them back.
pub trait BufferPool: Send + Sync {
    /// Takes back memory this pool handed out.
    ///
    /// # Safety
    /// `ptr`, `capacity` and `iova` must be exactly what the pool gave to [`IoBuffer::from_pool`],
    /// and the buffer must not be used afterwards.
    unsafe fn release(&self, ptr: NonNull<u8>, capacity: usize, iova: u64);
}

enum Owner {
    Heap(Layout),
    Pool(Arc<dyn BufferPool>),
}

/// A block-aligned buffer with a capacity fixed at allocation and a length the caller sets (the
/// bytes an I/O transfers). Dereferences to its first `len` bytes.
pub struct IoBuffer {
    ptr: NonNull<u8>,
    capacity: usize,
    len: usize,
    iova: u64,
    owner: Owner,
}

// SAFETY: an IoBuffer owns its memory exclusively (like a Box<[u8]>); no other handle aliases it,
// and the pool it may return to is Send + Sync.
unsafe impl Send for IoBuffer {}
// SAFETY: shared references only allow reads of memory the buffer owns.
unsafe impl Sync for IoBuffer {}

impl IoBuffer {
    /// A zeroed heap buffer aligned to `align` (a power of two), for backends without DMA.
    pub fn new_heap(len: usize, align: usize) -> Result<IoBuffer, DeviceError> {
        let bad = |why| DeviceError::BadRequest {
            op: Op::Allocate,
            lba: 0,
            len,
            why,
        };
        if len == 0 {
            return Err(bad("a buffer of zero bytes"));
        }
        let layout = Layout::from_size_align(len, align.max(1))
            .map_err(|_| bad("invalid size or alignment"))?;
        // SAFETY: the layout has a non-zero size (checked above).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(bad("out of memory"))?;
        Ok(IoBuffer {
            ptr,
            capacity: len,
            len,
            iova: 0,
            owner: Owner::Heap(layout),
        })
    }

    /// Wraps memory handed out by a pool (a DMA arena).
    ///
    /// # Safety
    /// `ptr` must point to `capacity` bytes that stay valid and unaliased until the pool's
    /// `release` is called for them.
    pub unsafe fn from_pool(
        ptr: NonNull<u8>,
        capacity: usize,
        iova: u64,
        pool: Arc<dyn BufferPool>,
    ) -> IoBuffer {
        IoBuffer {
            ptr,
            capacity,
            len: capacity,
            iova,
            owner: Owner::Pool(pool),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The device (IO virtual) address of the first byte, for DMA backends; zero elsewhere.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Sets how many bytes the next I/O transfers. Clamped to the capacity.
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity);
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl std::ops::Deref for IoBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for `capacity` bytes and len <= capacity; we own the memory.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for IoBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for IoBuffer {
    fn drop(&mut self) {
        match &self.owner {
            // SAFETY: the memory came from alloc_zeroed with exactly this layout.
            Owner::Heap(layout) => unsafe { std::alloc::dealloc(self.ptr.as_ptr(), *layout) },
            // SAFETY: these are the values the pool handed out; the buffer is gone after this.
            Owner::Pool(pool) => unsafe { pool.release(self.ptr, self.capacity, self.iova) },
        }
    }
}

impl std::fmt::Debug for IoBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoBuffer")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .field("iova", &self.iova)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_buffer_is_aligned_zeroed_and_resizable() {
        let mut b = IoBuffer::new_heap(8192, 4096).unwrap();
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert!(b.iter().all(|&x| x == 0));
        b.set_len(512);
        assert_eq!(b.len(), 512);
        b[0] = 7;
        b.set_len(100_000);
        assert_eq!(b.len(), 8192);
        assert_eq!(b[0], 7);
    }

    #[test]
    fn zero_sized_or_misaligned_requests_are_refused() {
        assert!(IoBuffer::new_heap(0, 4096).is_err());
        assert!(IoBuffer::new_heap(4096, 3).is_err());
    }
}
