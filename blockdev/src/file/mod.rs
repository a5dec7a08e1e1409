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
//!
//! Files are opened with `O_DIRECT` by default, so that a completed write is in the device (or its
//! cache) rather than in the page cache, and so that reads during recovery see the medium, not a
//! cached copy of a write that never reached it. Flushes are always issued: even on a drive with
//! power-loss protection the file system's metadata (extent state, size) needs them.

mod create;
mod engine;
mod flushes;
mod open;
mod threads;
#[cfg(target_os = "linux")]
mod uring;

pub use engine::{fail_next_io_uring_setup, io_uring_support, Engine, UnknownEngine};

use std::path::Path;
use std::time::Duration;

use crate::{check_io, BlockDevice, Completion, DeviceError, DeviceInfo, IoBuffer, Op, Tag};

use engine::Io;
use flushes::{Flushes, Next};
use threads::{Request, Submit};

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
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            io_threads: 4,
            queue_depth: 256,
            direct: true,
            read_only: false,
            engine: Engine::default(),
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
    /// One `fdatasync` at a time (see `flushes`).
    flushes: Flushes,
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
        let mut opened = open::open_device(path, opts.direct, opts.read_only, lock)?;
        let logical = u64::from(opened.info.logical_block_size);
        let (io, fallback) = Io::start(opened.file, logical, &opts).map_err(open_err)?;
        opened.info.engine = io.describe(opts.io_threads, fallback.as_deref());
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
            flushes: Flushes::new(queue_depth),
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
        self.io.inject_flush_failure(errno);
    }

    fn admit(&self, op: Op, lba: u64) -> Result<(), DeviceError> {
        if self.read_only && op != Op::Read {
            return Err(DeviceError::BadRequest {
                op,
                lba,
                len: 0,
                why: "the device was opened read-only",
            });
        }
        if self.io.stopped() {
            return Err(DeviceError::Stopped { op, lba });
        }
        if self.in_flight >= self.queue_depth {
            return Err(DeviceError::QueueFull {
                op,
                lba,
                depth: self.in_flight,
            });
        }
        Ok(())
    }

    fn submit_io(
        &mut self,
        op: Op,
        tag: Tag,
        lba: u64,
        buffer: IoBuffer,
    ) -> Result<(), DeviceError> {
        check_io(&self.info, op, lba, buffer.len())?;
        if !(buffer.as_ptr() as usize).is_multiple_of(self.mem_align) {
            return Err(DeviceError::BadRequest {
                op,
                lba,
                len: buffer.len(),
                why: "the buffer is not aligned for direct I/O; allocate it with alloc_buffer",
            });
        }
        self.admit(op, lba)?;
        self.send(Request {
            tag,
            op,
            lba,
            buffer: Some(buffer),
        })
    }

    fn send(&mut self, req: Request) -> Result<(), DeviceError> {
        self.dispatch(req).map(|()| self.in_flight += 1)
    }

    /// Hands a request to the engine (not counting it: `send` does, or it was counted already).
    fn dispatch(&mut self, req: Request) -> Result<(), DeviceError> {
        let (op, lba) = (req.op, req.lba);
        match &mut self.io {
            Io::Threads(pool) => match pool.submit(req) {
                Submit::Queued => Ok(()),
                // Cannot happen while in_flight <= queue_depth bounds the channel, but is not a
                // panic.
                Submit::Full => Err(DeviceError::QueueFull {
                    op,
                    lba,
                    depth: self.in_flight,
                }),
                Submit::Gone => Err(DeviceError::Stopped { op, lba }),
            },
            #[cfg(target_os = "linux")]
            Io::Uring(ring) => ring.push(req),
        }
    }

    /// The flush completions the engine just delivered (`out[from..]`) answer the flushes that
    /// rode on them and start the one that waited; returns the completions added.
    fn settle_flushes(&mut self, out: &mut Vec<Completion>, from: usize) -> usize {
        let end = out.len();
        let mut added = 0;
        for i in from..end {
            if out[i].op != Op::Flush {
                continue;
            }
            let result = out[i].result.clone();
            let (n, next) = self.flushes.completed(&result, out);
            added += n;
            if let Next::Start(tag) = next {
                if let Err(e) = self.dispatch(flush_request(tag)) {
                    added += self.flushes.not_started(tag, e, out);
                }
            }
        }
        added
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

    /// Queues an `fdatasync`. It covers every write whose completion was delivered before this
    /// call, because a write's completion is queued only after its `pwrite` returned. One runs
    /// at a time: a flush submitted while one runs rides on the next (see `flushes`).
    /// After a flush has failed the device refuses everything with [`DeviceError::Stopped`]: the
    /// kernel reports a writeback error once, so a later flush could succeed and lie.
    fn submit_flush(&mut self, tag: Tag) -> Result<(), DeviceError> {
        self.admit(Op::Flush, 0)?;
        if self.flushes.running() {
            // It waits for the running one and rides on the next fdatasync (see `flushes`).
            self.flushes.wait(tag);
            self.in_flight += 1;
            return Ok(());
        }
        self.send(flush_request(tag))?;
        self.flushes.started();
        Ok(())
    }

    /// Takes the completions that are ready. With io_uring this is also where queued submissions
    /// reach the kernel (one `io_uring_enter` for all of them).
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, DeviceError> {
        let before = out.len();
        let n = match &mut self.io {
            Io::Threads(pool) => {
                let before = out.len();
                out.extend(std::iter::from_fn(|| pool.try_recv()));
                out.len() - before
            }
            #[cfg(target_os = "linux")]
            Io::Uring(ring) => ring.poll(out)?,
        };
        let n = n + self.settle_flushes(out, before);
        Ok(self.delivered(n))
    }

    /// Sleeps for up to `timeout` for the first completion (on the completion channel, or in
    /// `io_uring_enter` after submitting what is queued), then takes whatever else is ready.
    /// Returns `Ok(0)` when the time ran out, and at once when nothing is in flight (every
    /// completion belongs to an I/O counted in flight).
    fn wait(&mut self, out: &mut Vec<Completion>, timeout: Duration) -> Result<usize, DeviceError> {
        if self.in_flight == 0 {
            return Ok(0);
        }
        let before = out.len();
        let n = match &mut self.io {
            Io::Threads(pool) => match pool.recv_timeout(timeout) {
                Ok(Some(c)) => {
                    out.push(c);
                    out.extend(std::iter::from_fn(|| pool.try_recv()));
                    out.len() - before
                }
                Ok(None) => 0,
                Err(()) => {
                    return Err(DeviceError::Stopped {
                        op: Op::Flush,
                        lba: 0,
                    })
                }
            },
            #[cfg(target_os = "linux")]
            Io::Uring(ring) => ring.wait(out, timeout)?,
        };
        let n = n + self.settle_flushes(out, before);
        Ok(self.delivered(n))
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

fn flush_request(tag: Tag) -> Request {
    Request {
        tag,
        op: Op::Flush,
        lba: 0,
        buffer: None,
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
