//! The block device contract of nvmq (storage.md §3) and its backends.
//!
//! The contract is shaped after a polled NVMe queue pair, because the userspace NVMe driver must fit
//! behind it without a copy or a thread hop: the caller submits writes, reads and flushes tagged with
//! its own identifiers, each I/O owns its buffer while it runs, and completions are *polled* and may
//! arrive in any order. Backends that are not polled by nature (the file backend's I/O threads) adapt
//! to this shape, never the other way round.
//!
//! Buffers come from the device ([`BlockDevice::alloc_buffer`]) so that a DMA backend can hand out
//! memory that is already mapped for the device; the writer allocates its buffers once at start and
//! recycles them, so steady-state I/O allocates nothing.

mod buffer;
pub mod contract;
mod error;
pub mod file;
// The NVMe backend needs Linux (VFIO) and DMA/MMIO barriers, which `nvme/barrier.rs` has for
// x86_64 and aarch64 only: elsewhere there is no `nvme` module, rather than one that builds with
// wrong barriers (docs/nvme-ordering.md). Crates that use it repeat this cfg.
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
pub mod nvme;
pub mod reported;
pub mod sim;
mod sync;

pub use buffer::IoBuffer;
pub use error::{DeviceError, Op};
pub use sync::{flush_sync, read_sync, write_sync, SyncIo};

use std::time::Duration;

/// What a device reports about itself. Every size is in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Smallest addressable unit: every I/O starts and ends on a multiple of it.
    pub logical_block_size: u32,
    /// The unit the medium writes internally; a smaller write may be a read-modify-write.
    pub physical_block_size: u32,
    /// Usable size in bytes (a multiple of the logical block size).
    pub capacity: u64,
    /// Largest single transfer the device takes; larger I/Os must be split by the caller.
    pub max_transfer: u32,
    /// Largest write the device promises to apply whole across a power loss (NVMe AWUPF/NAWUPF).
    /// Zero when unknown. A hint, never part of the write unit.
    pub atomic_write_unit: u32,
    /// Preferred write granularity for large writes (NVMe NPWG); zero when unknown.
    pub preferred_write: u32,
    /// True when completed writes may sit in a cache that a power loss clears. Only a device that
    /// *reports* no such cache (NVMe VWC bit clear) may say false; the file backend always says true.
    pub volatile_write_cache: bool,
    /// The file system's block size for the file backend, else zero. Part of the write unit.
    pub fs_block_size: u32,
    /// Which device this is, for logs and for telling devices apart (NVMe serial + namespace, or
    /// path + st_dev + st_ino).
    pub identity: String,
    /// Model and firmware when the device has them (NVMe); empty otherwise.
    pub model: String,
    /// The device's own health report when it has one (NVMe SMART: critical warning, failed
    /// power-loss protection, media errors); empty otherwise.
    pub health: String,
    /// How the backend carries out I/O, for reports: for the file backend `io_uring (ring of N,
    /// M flush descriptions)` or `threads (N I/O threads, M flush descriptions)` (see
    /// [`file::Engine`]; a read-only open has no flush descriptions and says nothing of them);
    /// empty for backends with one way.
    pub engine: String,
    /// True when [`BlockDevice::submit_write_flush`] is supported (the file backend opened
    /// read-write); false when it is refused (sim, nvme).
    pub linked_flush: bool,
}

impl DeviceInfo {
    /// The write unit U of storage.md: the largest of the logical, physical and file system block
    /// sizes. Batches start at multiples of U, so no write ever shares a physical block with another.
    pub fn write_unit(&self) -> u32 {
        self.logical_block_size
            .max(self.physical_block_size)
            .max(self.fs_block_size)
    }
}

/// The caller's name for one submitted I/O; it comes back in the completion.
pub type Tag = u64;

/// Why [`BlockDevice::submit_write_flush`] is refused by a device that does not support it.
pub const LINKED_FLUSH_UNSUPPORTED: &str =
    "linked write+flush unsupported by this device (DeviceInfo::linked_flush is false)";

/// One finished I/O. The buffer of a read or write comes back to the caller here.
#[derive(Debug)]
pub struct Completion {
    pub tag: Tag,
    pub op: Op,
    /// First block of the I/O (zero for a flush).
    pub lba: u64,
    pub buffer: Option<IoBuffer>,
    pub result: Result<(), DeviceError>,
}

/// The block device contract (storage.md §3). [`contract`] holds the checks every implementation
/// must pass.
///
/// Addresses are in logical blocks. A write or read covers `buffer.len()` bytes, which must be a
/// non-zero multiple of the logical block size and at most `max_transfer`. Nothing is retried or hidden:
/// an error comes back in the completion with the operation and block address.
pub trait BlockDevice: Send {
    fn info(&self) -> &DeviceInfo;

    /// A buffer the device can transfer from and to, aligned for it (to the logical block size
    /// and to 4096 at least), with `len` bytes zeroed. Zero bytes is refused as a bad request.
    fn alloc_buffer(&mut self, len: usize) -> Result<IoBuffer, DeviceError>;

    /// How many I/Os may be outstanding at once; a submit beyond it fails with `QueueFull`.
    fn queue_depth(&self) -> usize;

    fn submit_write(&mut self, tag: Tag, lba: u64, buffer: IoBuffer) -> Result<(), DeviceError>;
    fn submit_read(&mut self, tag: Tag, lba: u64, buffer: IoBuffer) -> Result<(), DeviceError>;
    /// Asks that every write that *completed before this call* be made durable.
    fn submit_flush(&mut self, tag: Tag) -> Result<(), DeviceError>;

    /// Moves finished I/Os into `out` without blocking; returns how many were added.
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, DeviceError>;

    /// Like `poll`, but waits up to `timeout` for at least one completion. A polled backend spins;
    /// a threaded one sleeps on its completion queue. With nothing in flight it returns `Ok(0)` at
    /// once: no completion can come.
    fn wait(&mut self, out: &mut Vec<Completion>, timeout: Duration) -> Result<usize, DeviceError>;

    /// I/Os submitted and not yet returned by `poll`/`wait`.
    fn in_flight(&self) -> usize;

    /// A file descriptor that becomes readable whenever a completion may be waiting for `poll`,
    /// so that an event loop (epoll, tokio `AsyncFd`) can wait for the device beside its
    /// sockets. `None` (the default) means the device must be polled (sim, nvme).
    ///
    /// How an owner uses it, so that no wake-up is lost:
    /// - Submissions may sit queued in the device until the next `poll` or `wait` (io_uring hands
    ///   them to the kernel there), so after its last submission the owner calls `poll`.
    /// - It sleeps on the fd only if that `poll` returned nothing and `in_flight() > 0`: with
    ///   nothing in flight no completion will come and nothing makes the fd readable. Right
    ///   before it sleeps it calls [`arm_completion_fd`](BlockDevice::arm_completion_fd).
    /// - `poll` and `wait` reset the fd's readiness *before* they reap, so a completion that
    ///   arrives while or after they run always leaves the fd readable, for level- and
    ///   edge-triggered epoll alike. A wake-up may be spurious (the completion that caused it was
    ///   reaped by the `poll` that reset it): the owner polls, finds nothing, and sleeps again.
    ///   With tokio, clear the `AsyncFd` guard's readiness only after a `poll` that returned
    ///   nothing (tokio then keeps a readiness that arrived meanwhile).
    ///
    /// The fd belongs to the device and lives as long as it: register it (or a duplicate of it)
    /// for readability only; never read or write it.
    #[cfg(unix)]
    fn completion_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// The owner is about to sleep on [`completion_fd`](BlockDevice::completion_fd) (its last
    /// `poll` returned nothing with I/O in flight): make sure a completion will wake it. A device
    /// whose fd costs something to set up does it only here, so an owner that polls instead of
    /// sleeping never pays for it: the sim's fd is a timer, and on a virtual machine arming a
    /// timer due within microseconds costs about 10 us (`docs/performance.md`). The default
    /// does nothing (a device that signals every completion anyway).
    fn arm_completion_fd(&mut self) {}

    /// Submits a write and a flush that the device starts only after the write has completed in
    /// full without error (a linked pair): one submission instead of write, wait for its
    /// completion, flush. The flush covers that write and every write whose completion was
    /// delivered before this call (storage.md §1 holds: the flush is issued after the write
    /// completed). It counts as two I/Os against [`queue_depth`](BlockDevice::queue_depth) and,
    /// on a device that limits the flushes it runs at once, like any other flush.
    ///
    /// Both completions are delivered, the write's first: never after the flush's. If the write
    /// fails, the flush completes with an error too (naming the write) and never reports success.
    ///
    /// Supported only when [`DeviceInfo::linked_flush`] is true. The default refuses with
    /// [`DeviceError::BadRequest`] naming [`LINKED_FLUSH_UNSUPPORTED`], before anything happens
    /// (nothing goes in flight; the buffer is dropped).
    fn submit_write_flush(
        &mut self,
        write_tag: Tag,
        lba: u64,
        buffer: IoBuffer,
        flush_tag: Tag,
    ) -> Result<(), DeviceError> {
        let _ = (write_tag, flush_tag);
        Err(DeviceError::BadRequest {
            op: Op::Write,
            lba,
            len: buffer.len(),
            why: LINKED_FLUSH_UNSUPPORTED,
        })
    }
}

impl<D: BlockDevice + ?Sized> BlockDevice for Box<D> {
    fn info(&self) -> &DeviceInfo {
        (**self).info()
    }
    fn alloc_buffer(&mut self, len: usize) -> Result<IoBuffer, DeviceError> {
        (**self).alloc_buffer(len)
    }
    fn queue_depth(&self) -> usize {
        (**self).queue_depth()
    }
    fn submit_write(&mut self, tag: Tag, lba: u64, buffer: IoBuffer) -> Result<(), DeviceError> {
        (**self).submit_write(tag, lba, buffer)
    }
    fn submit_read(&mut self, tag: Tag, lba: u64, buffer: IoBuffer) -> Result<(), DeviceError> {
        (**self).submit_read(tag, lba, buffer)
    }
    fn submit_flush(&mut self, tag: Tag) -> Result<(), DeviceError> {
        (**self).submit_flush(tag)
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, DeviceError> {
        (**self).poll(out)
    }
    fn wait(&mut self, out: &mut Vec<Completion>, timeout: Duration) -> Result<usize, DeviceError> {
        (**self).wait(out, timeout)
    }
    fn in_flight(&self) -> usize {
        (**self).in_flight()
    }
    #[cfg(unix)]
    fn completion_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        (**self).completion_fd()
    }
    fn arm_completion_fd(&mut self) {
        (**self).arm_completion_fd()
    }
    fn submit_write_flush(
        &mut self,
        write_tag: Tag,
        lba: u64,
        buffer: IoBuffer,
        flush_tag: Tag,
    ) -> Result<(), DeviceError> {
        (**self).submit_write_flush(write_tag, lba, buffer, flush_tag)
    }
}

/// Checks the shape of an I/O against the device's geometry; every backend calls it on submit so
/// the same request is refused the same way everywhere.
pub fn check_io(info: &DeviceInfo, op: Op, lba: u64, len: usize) -> Result<(), DeviceError> {
    let bs = u64::from(info.logical_block_size);
    let bad = |why: &'static str| DeviceError::BadRequest { op, lba, len, why };
    if len == 0 || !(len as u64).is_multiple_of(bs) {
        return Err(bad(
            "length is not a non-zero multiple of the logical block size",
        ));
    }
    if len > info.max_transfer as usize {
        return Err(bad("length exceeds the maximum transfer"));
    }
    let end = lba
        .checked_add(len as u64 / bs)
        .ok_or_else(|| bad("address overflows"))?;
    if end > info.capacity / bs {
        return Err(DeviceError::OutOfRange {
            op,
            lba,
            blocks: len as u64 / bs,
            capacity_blocks: info.capacity / bs,
        });
    }
    Ok(())
}
