//! Which engine carries out a file device's I/O, and the choice made at open.

use std::fmt;
use std::fs::File;
use std::os::fd::RawFd;
use std::str::FromStr;
use std::time::Duration;

use super::threads::{Pool, Request, Submit};
#[cfg(target_os = "linux")]
use super::uring::Ring;
use super::FileOptions;
use crate::{Completion, DeviceError, Op, Tag};

/// How a [`FileDevice`](super::FileDevice) carries out its I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Engine {
    /// `pwrite`/`pread`/`fdatasync` on a pool of [`FileOptions::io_threads`] threads.
    Threads,
    /// An io_uring the device's own thread submits to and reaps from (Linux ≥ 5.11). Opening
    /// fails with [`DeviceError::Open`](crate::DeviceError::Open) naming the reason when the ring
    /// cannot be set up (no io_uring in the kernel, `kernel.io_uring_disabled`, a seccomp filter).
    IoUring,
    /// io_uring when it can be set up, else the threads. The default: it measured faster
    /// (docs/performance.md, "File engines").
    #[default]
    Auto,
}

impl Engine {
    /// The name used on the command line (`engine=`) and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Threads => "threads",
            Engine::IoUring => "uring",
            Engine::Auto => "auto",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An engine name that is not one of `uring`, `threads`, `auto`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown file engine {0:?} (uring, threads, auto)")]
pub struct UnknownEngine(pub String);

impl FromStr for Engine {
    type Err = UnknownEngine;
    fn from_str(s: &str) -> Result<Engine, UnknownEngine> {
        match s {
            "uring" | "io_uring" | "iouring" => Ok(Engine::IoUring),
            "threads" => Ok(Engine::Threads),
            "auto" => Ok(Engine::Auto),
            _ => Err(UnknownEngine(s.to_string())),
        }
    }
}

/// Whether an io_uring engine can be set up here: `Err` holds the reason in words.
pub fn io_uring_support() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    {
        let file = File::open("/dev/null").map_err(|e| format!("cannot open /dev/null: {e}"))?;
        Ring::start(file, Vec::new(), 512, 1).map(drop)
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err("io_uring needs Linux".into())
    }
}

#[cfg(target_os = "linux")]
fn uring(ring: Ring) -> Io {
    Io::Uring(Box::new(ring))
}

/// The flush linked after a write ([`BlockDevice::submit_write_flush`](crate::BlockDevice)).
#[derive(Debug, Clone, Copy)]
pub(super) struct Linked {
    pub tag: Tag,
    /// The flush description reserved for it; `None` when every one was busy at submit (the
    /// device then starts the flush like any other once the write has completed).
    pub desc: Option<usize>,
}

/// What an engine reports about flushes; the device settles these (`flushes`) into completions.
#[derive(Debug)]
pub(super) enum FlushEvent {
    /// The `fdatasync` of flush `tag` on description `desc` finished.
    Ran {
        desc: usize,
        tag: Tag,
        result: Result<(), DeviceError>,
    },
    /// The linked flush `tag` did not run because its write failed; it fails with `err`, and the
    /// description it held (if any) is free again.
    Unrun {
        desc: Option<usize>,
        tag: Tag,
        err: DeviceError,
    },
    /// The write of linked flush `tag`, which had no description, completed: start it now.
    Due { tag: Tag },
}

/// The error of a linked flush whose write (at `lba`) failed with `e`.
pub(super) fn not_run_error(lba: u64, e: &DeviceError) -> DeviceError {
    DeviceError::Io {
        op: Op::Flush,
        lba: 0,
        detail: format!("not run: its linked write at block {lba} failed: {e}"),
    }
}

/// The engine a device runs.
pub(super) enum Io {
    Threads(Pool),
    /// Boxed: the ring is several times the size of the pool's handles.
    #[cfg(target_os = "linux")]
    Uring(Box<Ring>),
}

impl Io {
    /// Starts the engine `opts` asks for over `file`, flushing on `flushers`, with why `Auto` fell
    /// back to the threads if it did; the error is the reason in words.
    pub fn start(
        file: File,
        flushers: Vec<File>,
        block_size: u64,
        opts: &FileOptions,
    ) -> Result<(Io, Option<String>), String> {
        let threads = |file: File, flushers: Vec<File>| {
            Pool::start(
                file,
                flushers,
                block_size,
                opts.io_threads,
                opts.queue_depth,
            )
            .map(Io::Threads)
            .map_err(|e| format!("cannot start the I/O threads: {e}"))
        };
        match opts.engine {
            Engine::Threads => threads(file, flushers).map(|io| (io, None)),
            #[cfg(target_os = "linux")]
            Engine::IoUring => {
                Ring::start(file, flushers, block_size, opts.queue_depth).map(|r| (uring(r), None))
            }
            #[cfg(target_os = "linux")]
            Engine::Auto => {
                // The ring takes the files only when it is set up, so it is tried on duplicates
                // first; the originals then go to whichever engine runs.
                let dup = |f: &File| {
                    f.try_clone()
                        .map_err(|e| format!("cannot duplicate the file descriptor: {e}"))
                };
                let probe = dup(&file)?;
                let probe_flushers = flushers.iter().map(dup).collect::<Result<Vec<_>, _>>()?;
                match Ring::start(probe, probe_flushers, block_size, opts.queue_depth) {
                    Ok(ring) => Ok((uring(ring), None)),
                    Err(why) => threads(file, flushers).map(|io| (io, Some(why))),
                }
            }
            #[cfg(not(target_os = "linux"))]
            Engine::IoUring => Err("cannot use io_uring: it needs Linux".into()),
            #[cfg(not(target_os = "linux"))]
            Engine::Auto => {
                threads(file, flushers).map(|io| (io, Some("io_uring needs Linux".into())))
            }
        }
    }

    pub fn engine(&self) -> Engine {
        match self {
            Io::Threads(_) => Engine::Threads,
            #[cfg(target_os = "linux")]
            Io::Uring(_) => Engine::IoUring,
        }
    }

    /// For [`DeviceInfo::engine`](crate::DeviceInfo::engine); `flushers` is the number of flush
    /// descriptions (0 for a read-only open, which then says nothing of them), `fallback` is why
    /// `Auto` did not get io_uring.
    pub fn describe(&self, io_threads: usize, flushers: usize, fallback: Option<&str>) -> String {
        let flushers = match flushers {
            0 => String::new(),
            1 => ", 1 flush description".to_string(),
            n => format!(", {n} flush descriptions"),
        };
        match self {
            Io::Threads(_) => match fallback {
                None => format!("threads ({io_threads} I/O threads{flushers})"),
                Some(why) => format!(
                    "threads ({io_threads} I/O threads{flushers}; io_uring unavailable: {why})"
                ),
            },
            #[cfg(target_os = "linux")]
            Io::Uring(ring) => format!("io_uring (ring of {}{flushers})", ring.depth()),
        }
    }

    /// The queue depth the engine holds when it is smaller than asked (a clamped ring).
    pub fn depth(&self) -> Option<usize> {
        match self {
            Io::Threads(_) => None,
            #[cfg(target_os = "linux")]
            Io::Uring(ring) => Some(ring.depth()),
        }
    }

    pub fn stopped(&self) -> bool {
        match self {
            Io::Threads(pool) => pool.stopped(),
            #[cfg(target_os = "linux")]
            Io::Uring(ring) => ring.stopped(),
        }
    }

    /// Hands a request to the engine: queued for the threads, an SQE for the ring (it reaches the
    /// kernel at the next `poll`/`wait`/`submit_queued`).
    pub fn dispatch(&mut self, req: Request, in_flight: usize) -> Result<(), DeviceError> {
        let (op, lba) = (req.op, req.lba);
        match self {
            Io::Threads(pool) => match pool.submit(req) {
                Submit::Queued => Ok(()),
                // Cannot happen while in_flight <= queue_depth bounds the channel, but is not a
                // panic.
                Submit::Full => Err(DeviceError::QueueFull {
                    op,
                    lba,
                    depth: in_flight,
                }),
                Submit::Gone => Err(DeviceError::Stopped { op, lba }),
            },
            #[cfg(target_os = "linux")]
            Io::Uring(ring) => ring.push(req),
        }
    }

    /// Resets the completion notification, then takes what is ready without blocking (the ring
    /// first hands the kernel what is queued).
    pub fn poll(
        &mut self,
        out: &mut Vec<Completion>,
        events: &mut Vec<FlushEvent>,
    ) -> Result<(), DeviceError> {
        match self {
            Io::Threads(pool) => {
                pool.poll(out, events);
                Ok(())
            }
            #[cfg(target_os = "linux")]
            Io::Uring(ring) => ring.poll(out, events),
        }
    }

    /// Like `poll`, but sleeps up to `timeout` when nothing is ready.
    pub fn wait(
        &mut self,
        out: &mut Vec<Completion>,
        events: &mut Vec<FlushEvent>,
        timeout: Duration,
    ) -> Result<(), DeviceError> {
        match self {
            Io::Threads(pool) => {
                pool.wait(out, events, timeout)
                    .map_err(|()| DeviceError::Stopped {
                        op: Op::Flush,
                        lba: 0,
                    })
            }
            #[cfg(target_os = "linux")]
            Io::Uring(ring) => ring.wait(out, events, timeout),
        }
    }

    /// Hands the kernel the SQEs queued since the last `poll`/`wait` (flushes started while
    /// settling, continued transfers), so that nothing sits queued while the owner sleeps on the
    /// completion descriptor. Nothing to do for the threads.
    pub fn submit_queued(&mut self) -> Result<(), DeviceError> {
        match self {
            Io::Threads(_) => Ok(()),
            #[cfg(target_os = "linux")]
            Io::Uring(ring) => ring.submit_queued(),
        }
    }

    pub fn notify_fd(&self) -> RawFd {
        match self {
            Io::Threads(pool) => pool.notify_fd(),
            #[cfg(target_os = "linux")]
            Io::Uring(ring) => ring.notify_fd(),
        }
    }

    /// Linked flushes the engine issued itself after their write, their link severed (io_uring).
    pub fn reissued(&self) -> u64 {
        match self {
            Io::Threads(_) => 0,
            #[cfg(target_os = "linux")]
            Io::Uring(ring) => ring.reissued(),
        }
    }

    pub fn fail_next_write(&mut self) {
        match self {
            Io::Threads(pool) => pool.fail_next_write(),
            #[cfg(target_os = "linux")]
            Io::Uring(ring) => ring.fail_next_write(),
        }
    }

    /// Test seam (io_uring only; false for the threads): the next linked write's first attempt
    /// is short and breaks the link, so the device must continue it and run the flush itself.
    pub fn short_next_linked_write(&mut self) -> bool {
        match self {
            Io::Threads(_) => false,
            #[cfg(target_os = "linux")]
            Io::Uring(ring) => {
                ring.short_next_linked_write();
                true
            }
        }
    }
}

/// Test seam: makes the next io_uring set-up on the calling thread fail with `errno`, as a kernel
/// without io_uring (`ENOSYS`) or a seccomp filter or `kernel.io_uring_disabled` (`EPERM`) would.
#[doc(hidden)]
pub fn fail_next_io_uring_setup(errno: i32) {
    #[cfg(target_os = "linux")]
    super::uring::fail_next_setup(errno);
    #[cfg(not(target_os = "linux"))]
    let _ = errno;
}
