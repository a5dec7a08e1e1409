//! The file backend: a regular file or a block device, with flush = `fdatasync` (`F_FULLFSYNC` on
//! macOS) (storage.md §3), driven by one of two engines ([`Engine`]):
//!
//! - **io_uring** (Linux): the thread that owns the device submits SQEs and reaps CQEs itself, as
//!   with the NVMe driver's polled queue; a flush is `IORING_OP_FSYNC` with `IORING_FSYNC_DATASYNC`.
//! - **I/O threads**: `pwrite`/`pread`/`fdatasync` on a small pool of threads. A submit hands the
//!   request to a thread over a channel and returns at once; the thread does the blocking system
//!   call and queues the completion; `poll`/`wait` collect them. More than one thread exists so
//!   that the next group commit's write can run while the previous batch's `fdatasync` is still in
//!   the kernel, which is where group commit gets its throughput.
//!
//! Both adapt to the contract's polled shape rather than the other way round, and both give a flush
//! the same reach: every write whose completion was delivered before the flush was submitted.
//! Flushes run on their own open file descriptions of the device, up to
//! [`FileOptions::flush_descriptions`] at once (see `flushes` for why that is safe). Both engines
//! give [`BlockDevice::completion_fd`] (an eventfd on Linux, see `notify`) and
//! [`BlockDevice::submit_write_flush`].
//!
//! Files are opened with `O_DIRECT` by default, so that a completed write is in the device (or its
//! cache) rather than in the page cache, and so that reads during recovery see the medium, not a
//! cached copy of a write that never reached it. Flushes are always issued: even on a drive with
//! power-loss protection the file system's metadata (extent state, size) needs them.

mod create;
mod engine;
mod flushes;
mod notify;
mod open;
mod threads;
#[cfg(target_os = "linux")]
mod uring;

pub use engine::{fail_next_io_uring_setup, io_uring_support, Engine, UnknownEngine};
pub use notify::fd_readable;

use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{check_io, BlockDevice, Completion, DeviceError, DeviceInfo, IoBuffer, Op, Tag};

use engine::{FlushEvent, Io, Linked};
use flushes::{flush_completion, Flushes, Next};
use notify::Notifier;
use threads::Request;

/// The most flush descriptions a device opens ([`FileOptions::flush_descriptions`]).
pub const MAX_FLUSH_DESCRIPTIONS: usize = 64;

/// How a [`FileDevice`] is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileOptions {
    /// Number of I/O threads of the threads engine ([`Engine::Threads`], or `Auto` without
    /// io_uring). More than one, so that a write overlaps a running `fdatasync`; a few more let
    /// reads and several batch writes run side by side. Must be at least 1 (checked whatever the
    /// engine, so that `Auto` can always fall back).
    pub io_threads: usize,
    /// How many I/Os may be outstanding at once (submitted and not yet returned by `poll`/`wait`);
    /// with io_uring also the ring's size. Must be at least 1.
    pub queue_depth: usize,
    /// Open with `O_DIRECT` (`F_NOCACHE` on macOS). Turn it off only for file systems that refuse
    /// direct I/O (tmpfs on older kernels); writes then go through the page cache, and flushes
    /// (`fdatasync`) are what make them durable, as always. See [`FileDevice::is_direct`].
    pub direct: bool,
    /// Open for reading only (`O_RDONLY`, no lock, writes and flushes refused at submit): for
    /// tools that look at a log, so they run on a read-only file and beside a running broker.
    /// A read-write open takes an exclusive lock instead (see [`FileDevice::open`]).
    pub read_only: bool,
    /// How I/O is carried out: io_uring, the I/O threads, or io_uring when it can be set up
    /// ([`Engine::Auto`], the default). [`FileDevice::engine`] says which one runs.
    pub engine: Engine,
    /// How many more open file descriptions of the device are opened for flushes, which is how
    /// many `fdatasync`s may run at once (one per description; a flush submitted while all are
    /// busy waits and rides on the next one to start). 1 gives one `fdatasync` at a time. From 1
    /// to [`MAX_FLUSH_DESCRIPTIONS`]; a read-only open opens none. The default is 1. More closes
    /// the page cache's error race through Linux's per-description write-back error reporting
    /// (docs/storage-backends.md, "File engines"), but not a drive or block layer that reports a failed cache
    /// write-back to only one of two flushes running at once: the earlier flush could then
    /// succeed over lost data. Measured on this project's virtio disk it gained nothing.
    pub flush_descriptions: usize,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            io_threads: 4,
            queue_depth: 256,
            direct: true,
            read_only: false,
            engine: Engine::default(),
            // One `fdatasync` at a time: see the field's docs for what running several risks.
            flush_descriptions: 1,
        }
    }
}

/// A [`BlockDevice`] over a regular file or a block device node.
///
/// Dropping it waits for the I/O it holds: the threads engine stops and joins its threads after
/// they carried out the requests still queued; the io_uring engine waits for the CQE of every I/O
/// in the ring. Completions are discarded (their buffers freed only then), so a drop never panics,
/// never frees memory the kernel may still use, and never leaves I/O running on a file that the
/// caller believes closed.
pub struct FileDevice {
    info: DeviceInfo,
    direct: bool,
    read_only: bool,
    /// Alignment of the buffers `alloc_buffer` hands out.
    buffer_align: usize,
    /// Memory alignment that direct I/O requires of a buffer (1 without direct I/O).
    mem_align: usize,
    queue_depth: usize,
    in_flight: usize,
    io: Io,
    /// Which flush descriptions run an `fdatasync`, and the flushes waiting (see `flushes`).
    flushes: Flushes,
    /// What the engine reported about flushes since the last settle (kept for its capacity).
    events: Vec<FlushEvent>,
    /// Test seam: the gate of the next flush that `submit_flush` starts at once.
    hold: Option<Arc<Notifier>>,
}

/// Test seam: holds one flush's `fdatasync` until released (or dropped); see
/// [`FileDevice::hold_next_flush`].
#[doc(hidden)]
pub struct FlushHold {
    gate: Arc<Notifier>,
}

impl FlushHold {
    /// Lets the held `fdatasync` run.
    pub fn release(&self) {
        self.gate.signal();
    }
}

impl Drop for FlushHold {
    fn drop(&mut self) {
        self.gate.signal();
    }
}

impl FileDevice {
    /// Opens an existing regular file or block device; never creates one.
    ///
    /// Refused, with [`DeviceError::Open`] naming the path and the reason: a missing path, anything
    /// but a regular file or block device, an empty file, a size that is not a multiple of the
    /// logical block size, a file system that refuses `O_DIRECT` (the message suggests
    /// `direct: false`), and any error of `open(2)` itself such as a permission error. A block
    /// device is opened with `O_EXCL`, so that one that is mounted or in use is refused (`EBUSY`).
    /// A regular file opened read-write is locked (`flock`, exclusive) for as long as the device
    /// lives, so a second broker on the same file is refused instead of interleaving its writes
    /// with ours; a read-only open ([`FileOptions::read_only`]) takes no lock.
    pub fn open(path: &Path, opts: FileOptions) -> Result<FileDevice, DeviceError> {
        FileDevice::open_locked(path, opts, !opts.read_only)
    }

    /// [`FileDevice::open`], taking the exclusive lock only when `lock` is set (a create holds
    /// its own lock on the file it builds).
    pub(super) fn open_locked(
        path: &Path,
        opts: FileOptions,
        lock: bool,
    ) -> Result<FileDevice, DeviceError> {
        let open_err = |detail: String| DeviceError::Open {
            op: Op::Open,
            path: path.display().to_string(),
            detail,
        };
        if opts.io_threads == 0 {
            return Err(open_err(
                "FileOptions::io_threads must be at least 1".into(),
            ));
        }
        if opts.queue_depth == 0 {
            return Err(open_err(
                "FileOptions::queue_depth must be at least 1".into(),
            ));
        }
        if !(1..=MAX_FLUSH_DESCRIPTIONS).contains(&opts.flush_descriptions) {
            return Err(open_err(format!(
                "FileOptions::flush_descriptions must be from 1 to {MAX_FLUSH_DESCRIPTIONS}, not {}",
                opts.flush_descriptions
            )));
        }
        let mut opened = open::open_device(path, opts.direct, opts.read_only, lock)?;
        // A read-only device never flushes.
        let descriptions = if opts.read_only {
            0
        } else {
            opts.flush_descriptions
        };
        let flushers = open::open_flush_descriptions(path, &opened.file, descriptions)?;
        let logical = u64::from(opened.info.logical_block_size);
        let (io, fallback) = Io::start(opened.file, flushers, logical, &opts).map_err(open_err)?;
        opened.info.engine = io.describe(opts.io_threads, descriptions, fallback.as_deref());
        opened.info.linked_flush = !opts.read_only;
        let queue_depth = io.depth().unwrap_or(opts.queue_depth);
        let buffer_align = (opened.info.logical_block_size as usize)
            .max(4096)
            .max(opened.mem_align);
        Ok(FileDevice {
            info: opened.info,
            direct: opts.direct,
            read_only: opts.read_only,
            buffer_align,
            mem_align: opened.mem_align,
            queue_depth,
            in_flight: 0,
            io,
            flushes: Flushes::new(descriptions, queue_depth),
            events: Vec::with_capacity(queue_depth),
            hold: None,
        })
    }

    /// Creates a new device file of `size` bytes at `path` (storage.md §3, "Creating a file
    /// device") and returns it opened.
    ///
    /// Refuses if `path` exists. Writes a temporary file next to it, `.<name>.creating`, at its
    /// full size with real zeros (so the first lap over the log does not pay for extent conversion
    /// on every flush), opens it, lets `init` write the superblocks (with its own flushes), drains
    /// whatever `init` left in flight, fsyncs the file, renames it into place without replacing
    /// anything, and fsyncs the directory. On any error the temporary file is removed and the error
    /// returned; no file appears at `path`. `size` must be a positive multiple of 4096.
    ///
    /// The temporary file is held under an exclusive `flock` while it is built, so a second
    /// concurrent create of the same path fails instead of interleaving, and a temporary file left
    /// by a create that crashed (no lock held) is simply reused.
    pub fn create<F>(
        path: &Path,
        size: u64,
        opts: FileOptions,
        init: F,
    ) -> Result<FileDevice, DeviceError>
    where
        F: FnOnce(&mut FileDevice) -> Result<(), DeviceError>,
    {
        create::create(path, size, opts, init)
    }

    /// True when the device was opened for direct I/O (`O_DIRECT`), false when writes go through
    /// the page cache (`FileOptions::direct == false`). Either way flushes are `fdatasync`.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The engine that carries out this device's I/O: [`Engine::IoUring`] or [`Engine::Threads`],
    /// never `Auto` (which resolves at open). [`DeviceInfo::engine`] says the same in words.
    pub fn engine(&self) -> Engine {
        self.io.engine()
    }

    /// Test seam: the next flush to complete reports `errno` instead of its real result, so the
    /// failed-flush path (the device stops) can be exercised on a healthy file.
    #[doc(hidden)]
    pub fn inject_flush_failure(&mut self, errno: i32) {
        self.flushes.inject(errno);
    }

    /// Fault-injection seam (`NVMQ_FAULT_FLUSH_FAIL_AFTER` in the `nvmq` binary): the flush that
    /// completes after `after` more flushes have completed reports `errno`, and the device stops
    /// as after a real `fdatasync` failure. Lets a test fail a running broker's flush without
    /// reaching into the process; costs one branch per completed flush.
    #[doc(hidden)]
    pub fn inject_flush_failure_after(&mut self, after: u64, errno: i32) {
        self.flushes.inject_after(after, errno);
    }

    /// Test seam (`NVMQ_FAULT_GEOMETRY` in the `nvmq` binary): from now on the device reports
    /// larger physical or file system blocks, or a smaller maximum transfer (which it then also
    /// enforces), as the same file would on another drive or file system, so that a test can show
    /// what open and the tools do on a device that does not fit a log. Only a less capable
    /// geometry is taken, so that every I/O sent under it is one the file takes: a block that is
    /// not a power of two of at least the logical block, or a transfer that is zero, not whole
    /// logical blocks or beyond the device's own, is refused and nothing changes.
    #[doc(hidden)]
    pub fn report_geometry(
        &mut self,
        physical_block: Option<u32>,
        fs_block: Option<u32>,
        max_transfer: Option<u32>,
    ) -> Result<(), String> {
        let logical = self.info.logical_block_size;
        let block = |b: u32| b.is_power_of_two() && b >= logical;
        if !physical_block.into_iter().chain(fs_block).all(block) {
            return Err(format!(
                "a block size must be a power of two of at least the logical block ({logical} B)"
            ));
        }
        if max_transfer
            .is_some_and(|t| t == 0 || t > self.info.max_transfer || !t.is_multiple_of(logical))
        {
            return Err(format!(
                "a maximum transfer must be whole logical blocks ({logical} B) up to the \
                 device's own ({} B)",
                self.info.max_transfer
            ));
        }
        let i = &mut self.info;
        i.physical_block_size = physical_block.unwrap_or(i.physical_block_size);
        i.fs_block_size = fs_block.unwrap_or(i.fs_block_size);
        i.max_transfer = max_transfer.unwrap_or(i.max_transfer);
        Ok(())
    }

    /// Test seam: the `fdatasync` of the next flush that `submit_flush` starts at once (not one
    /// that waits for a description, not a linked one) waits, in the engine, until the returned
    /// hold is released or dropped, so that a test can keep one flush running. Dropping the device
    /// releases it too.
    #[doc(hidden)]
    pub fn hold_next_flush(&mut self) -> Result<FlushHold, DeviceError> {
        let gate = Arc::new(Notifier::new().map_err(|e| DeviceError::Io {
            op: Op::Flush,
            lba: 0,
            detail: format!("cannot create a flush hold: {e}"),
        })?);
        self.hold = Some(Arc::clone(&gate));
        Ok(FlushHold { gate })
    }

    /// Test seam: how many linked flushes the io_uring engine issued itself after their write,
    /// because the kernel severed the link (a short first attempt); 0 for the threads.
    #[doc(hidden)]
    pub fn linked_flushes_reissued(&self) -> u64 {
        self.io.reissued()
    }

    /// Test seam: the next write fails with `EBADF` (io_uring: in the kernel, on an invalid
    /// descriptor; threads: without being carried out).
    #[doc(hidden)]
    pub fn fail_next_write(&mut self) {
        self.io.fail_next_write();
    }

    /// Test seam (io_uring; returns false for the threads): the next linked write of at least two
    /// blocks goes to the kernel as a short first attempt whose link is severed, as a real short
    /// write's would be, so the write is continued and its flush issued after it.
    #[doc(hidden)]
    pub fn short_next_linked_write(&mut self) -> bool {
        self.io.short_next_linked_write()
    }

    fn stopped(&self) -> bool {
        self.flushes.failed() || self.io.stopped()
    }

    /// Whether `n` more I/Os (`op` at `lba`) may go in flight.
    fn admit(&self, op: Op, lba: u64, n: usize) -> Result<(), DeviceError> {
        if self.read_only && op != Op::Read {
            return Err(DeviceError::BadRequest {
                op,
                lba,
                len: 0,
                why: "the device was opened read-only",
            });
        }
        if self.stopped() {
            return Err(DeviceError::Stopped { op, lba });
        }
        if self.in_flight + n > self.queue_depth {
            return Err(DeviceError::QueueFull {
                op,
                lba,
                depth: self.in_flight,
            });
        }
        Ok(())
    }

    /// Checks a write's or read's shape and buffer, then whether `n` I/Os may go in flight.
    fn admit_io(&self, op: Op, lba: u64, buffer: &IoBuffer, n: usize) -> Result<(), DeviceError> {
        check_io(&self.info, op, lba, buffer.len())?;
        if !(buffer.as_ptr() as usize).is_multiple_of(self.mem_align) {
            return Err(DeviceError::BadRequest {
                op,
                lba,
                len: buffer.len(),
                why: "the buffer is not aligned for direct I/O; allocate it with alloc_buffer",
            });
        }
        self.admit(op, lba, n)
    }

    fn submit_io(
        &mut self,
        op: Op,
        tag: Tag,
        lba: u64,
        buffer: IoBuffer,
    ) -> Result<(), DeviceError> {
        self.admit_io(op, lba, &buffer, 1)?;
        self.io
            .dispatch(io_request(tag, op, lba, buffer, None), self.in_flight)?;
        self.in_flight += 1;
        Ok(())
    }

    /// Starts flush `tag` (already counted in flight) on a free description, or lets it wait for
    /// the next `fdatasync` to start when every one is busy.
    fn start_flush(&mut self, tag: Tag, out: &mut Vec<Completion>) -> Result<(), DeviceError> {
        let Some(desc) = self.flushes.take_free() else {
            self.flushes.wait(tag);
            return Ok(());
        };
        if let Err(e) = self.io.dispatch(flush_request(tag, desc), self.in_flight) {
            // Counted already: it fails as a completion, with what waited behind it.
            self.flushes.not_started(desc, tag, e.clone(), out);
            return Err(e);
        }
        Ok(())
    }

    /// Turns what the engine reported about flushes into completions (pushed to `out`) and
    /// starts the flushes that were waiting for a description or for their linked write.
    fn settle(&mut self, out: &mut Vec<Completion>) {
        let mut events = std::mem::take(&mut self.events);
        for ev in events.drain(..) {
            let next = match ev {
                FlushEvent::Ran { desc, tag, result } => self.flushes.ran(desc, tag, result, out),
                FlushEvent::Unrun {
                    desc: Some(desc),
                    tag,
                    err,
                } => self.flushes.not_run(desc, tag, err, out),
                FlushEvent::Unrun {
                    desc: None,
                    tag,
                    err,
                } => {
                    out.push(flush_completion(tag, Err(err)));
                    Next::Nothing
                }
                FlushEvent::Due { tag } if self.stopped() => {
                    out.push(flush_completion(
                        tag,
                        Err(DeviceError::Stopped {
                            op: Op::Flush,
                            lba: 0,
                        }),
                    ));
                    Next::Nothing
                }
                FlushEvent::Due { tag } => {
                    // Its write has completed: it is submitted now, like any flush. A failure to
                    // start it is already its completion.
                    let _ = self.start_flush(tag, out);
                    Next::Nothing
                }
            };
            if let Next::Start { desc, tag } = next {
                if let Err(e) = self.io.dispatch(flush_request(tag, desc), self.in_flight) {
                    self.flushes.not_started(desc, tag, e, out);
                }
            }
        }
        self.events = events;
    }

    fn delivered(&mut self, n: usize) -> usize {
        self.in_flight = self.in_flight.saturating_sub(n);
        n
    }
}

impl BlockDevice for FileDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// A zeroed heap buffer aligned to the larger of the logical block size and 4096 (and of the
    /// kernel's direct I/O memory alignment), which satisfies `O_DIRECT` everywhere we run.
    fn alloc_buffer(&mut self, len: usize) -> Result<IoBuffer, DeviceError> {
        IoBuffer::new_heap(len, self.buffer_align)
    }

    fn queue_depth(&self) -> usize {
        self.queue_depth
    }

    fn submit_write(&mut self, tag: Tag, lba: u64, buffer: IoBuffer) -> Result<(), DeviceError> {
        self.submit_io(Op::Write, tag, lba, buffer)
    }

    fn submit_read(&mut self, tag: Tag, lba: u64, buffer: IoBuffer) -> Result<(), DeviceError> {
        self.submit_io(Op::Read, tag, lba, buffer)
    }

    /// Queues an `fdatasync` on a flush description with none running. It covers every write
    /// whose completion was delivered before this call, because a write's completion is queued
    /// only after its `pwrite` (or CQE) returned. When every description is busy, it rides on the
    /// next `fdatasync` to start (see `flushes`). After a flush has failed the device refuses
    /// everything with [`DeviceError::Stopped`]: the kernel reports a write-back error once per
    /// description, so a later flush could succeed and lie.
    fn submit_flush(&mut self, tag: Tag) -> Result<(), DeviceError> {
        self.admit(Op::Flush, 0, 1)?;
        let Some(desc) = self.flushes.take_free() else {
            self.flushes.wait(tag);
            self.in_flight += 1;
            return Ok(());
        };
        let mut req = flush_request(tag, desc);
        req.gate = self.hold.take();
        if let Err(e) = self.io.dispatch(req, self.in_flight) {
            self.flushes.untake(desc);
            return Err(e);
        }
        self.in_flight += 1;
        Ok(())
    }

    /// Takes the completions that are ready, after resetting the completion descriptor. With
    /// io_uring this is also where queued submissions reach the kernel (one `io_uring_enter`
    /// before the reap, and one after it for flushes started while settling).
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, DeviceError> {
        let before = out.len();
        self.io.poll(out, &mut self.events)?;
        self.settle(out);
        let submitted = self.io.submit_queued();
        let n = self.delivered(out.len() - before);
        match submitted {
            // What stays queued goes to the kernel at the next poll, which the completions
            // delivered now make the owner call.
            Err(e) if n == 0 => Err(e),
            _ => Ok(n),
        }
    }

    /// Sleeps for up to `timeout` for the first completion (on the completion channel, or in
    /// `io_uring_enter` after submitting what is queued), then takes whatever else is ready.
    /// Returns `Ok(0)` when the time ran out, and at once when nothing is in flight (every
    /// completion belongs to an I/O counted in flight).
    fn wait(&mut self, out: &mut Vec<Completion>, timeout: Duration) -> Result<usize, DeviceError> {
        let deadline = Instant::now().checked_add(timeout);
        let before = out.len();
        loop {
            if self.in_flight == 0 {
                return Ok(0);
            }
            let now = Instant::now();
            let left = deadline.map_or(timeout, |d| d.saturating_duration_since(now));
            self.io.wait(out, &mut self.events, left)?;
            self.settle(out);
            let submitted = self.io.submit_queued();
            let n = self.delivered(out.len() - before);
            if n > 0 {
                return Ok(n);
            }
            submitted?;
            // Only a flush event came (a linked write completed and its flush started): wait on.
            if deadline.is_some_and(|d| Instant::now() >= d) || left.is_zero() {
                return Ok(0);
            }
        }
    }

    fn completion_fd(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: the descriptor belongs to this device's notifier (an `OwnedFd` inside
        // `self.io`), which is closed only when the device is dropped: it outlives this borrow.
        Some(unsafe { BorrowedFd::borrow_raw(self.io.notify_fd()) })
    }

    /// A write and an `fdatasync` that starts only after the write completed in full. With a
    /// free flush description the pair goes to the engine together (io_uring: two linked SQEs;
    /// threads: one thread writes, then syncs); with none, the write goes alone and the flush is
    /// submitted like any other once the write has completed. The write's completion is always
    /// delivered before the flush's.
    fn submit_write_flush(
        &mut self,
        write_tag: Tag,
        lba: u64,
        buffer: IoBuffer,
        flush_tag: Tag,
    ) -> Result<(), DeviceError> {
        self.admit_io(Op::Write, lba, &buffer, 2)?;
        let desc = self.flushes.take_free();
        let linked = Linked {
            tag: flush_tag,
            desc,
        };
        let req = io_request(write_tag, Op::Write, lba, buffer, Some(linked));
        if let Err(e) = self.io.dispatch(req, self.in_flight) {
            if let Some(d) = desc {
                self.flushes.untake(d);
            }
            return Err(e);
        }
        self.in_flight += 2;
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

fn flush_request(tag: Tag, desc: usize) -> Request {
    Request {
        tag,
        op: Op::Flush,
        lba: 0,
        buffer: None,
        desc,
        linked: None,
        gate: None,
    }
}

fn io_request(tag: Tag, op: Op, lba: u64, buffer: IoBuffer, linked: Option<Linked>) -> Request {
    Request {
        tag,
        op,
        lba,
        buffer: Some(buffer),
        desc: 0,
        linked,
        gate: None,
    }
}

impl std::fmt::Debug for FileDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDevice")
            .field("info", &self.info)
            .field("direct", &self.direct)
            .field("engine", &self.io.engine())
            .field("queue_depth", &self.queue_depth)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}
