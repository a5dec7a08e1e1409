//! Which engine carries out a file device's I/O, and the choice made at open.

use std::fmt;
use std::fs::File;
use std::str::FromStr;

use super::threads::Pool;
#[cfg(target_os = "linux")]
use super::uring::Ring;
use super::FileOptions;

/// How a [`FileDevice`](super::FileDevice) carries out its I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Engine {
    /// `pwrite`/`pread`/`fdatasync` on a pool of [`FileOptions::io_threads`] threads.
    Threads,
    /// An io_uring the device's own thread submits to and reaps from (Linux ≥ 5.11). Opening
    /// fails with [`DeviceError::Open`](crate::DeviceError::Open) naming the reason when the ring
    /// cannot be set up (no io_uring in the kernel, `kernel.io_uring_disabled`, a seccomp filter).
    IoUring,
    /// io_uring when it can be set up, else the threads. The default: it measured faster (README,
    /// "Benchmark").
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
        Ring::start(file, 512, 1).map(drop)
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

/// The engine a device runs.
pub(super) enum Io {
    Threads(Pool),
    /// Boxed: the ring is several times the size of the pool's handles.
    #[cfg(target_os = "linux")]
    Uring(Box<Ring>),
}

impl Io {
    /// Starts the engine `opts` asks for, with why `Auto` fell back to the threads if it did; the
    /// error is the reason in words.
    pub fn start(
        file: File,
        block_size: u64,
        opts: &FileOptions,
    ) -> Result<(Io, Option<String>), String> {
        let threads = |file: File| {
            Pool::start(file, block_size, opts.io_threads, opts.queue_depth)
                .map(Io::Threads)
                .map_err(|e| format!("cannot start the I/O threads: {e}"))
        };
        match opts.engine {
            Engine::Threads => threads(file).map(|io| (io, None)),
            #[cfg(target_os = "linux")]
            Engine::IoUring => {
                Ring::start(file, block_size, opts.queue_depth).map(|r| (uring(r), None))
            }
            #[cfg(target_os = "linux")]
            Engine::Auto => {
                // The ring takes the file only when it is set up, so a duplicate is tried first;
                // the original then goes to whichever engine runs.
                let probe = file
                    .try_clone()
                    .map_err(|e| format!("cannot duplicate the file descriptor: {e}"))?;
                match Ring::start(probe, block_size, opts.queue_depth) {
                    Ok(ring) => Ok((uring(ring), None)),
                    Err(why) => threads(file).map(|io| (io, Some(why))),
                }
            }
            #[cfg(not(target_os = "linux"))]
            Engine::IoUring => Err("cannot use io_uring: it needs Linux".into()),
            #[cfg(not(target_os = "linux"))]
            Engine::Auto => threads(file).map(|io| (io, Some("io_uring needs Linux".into()))),
        }
    }

    pub fn engine(&self) -> Engine {
        match self {
            Io::Threads(_) => Engine::Threads,
            #[cfg(target_os = "linux")]
            Io::Uring(_) => Engine::IoUring,
        }
    }

    /// For [`DeviceInfo::engine`](crate::DeviceInfo::engine); `fallback` is why `Auto` did not
    /// get io_uring.
    pub fn describe(&self, io_threads: usize, fallback: Option<&str>) -> String {
        match self {
            Io::Threads(_) => match fallback {
                None => format!("threads ({io_threads} I/O threads)"),
                Some(why) => {
                    format!("threads ({io_threads} I/O threads; io_uring unavailable: {why})")
                }
            },
            #[cfg(target_os = "linux")]
            Io::Uring(ring) => format!("io_uring (ring of {})", ring.depth()),
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

    pub fn inject_flush_failure(&mut self, errno: i32) {
        match self {
            Io::Threads(pool) => pool.inject_flush_failure(errno),
            #[cfg(target_os = "linux")]
            Io::Uring(ring) => ring.inject_flush_failure(errno),
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
