//! The writer thread's doorbell (unix): an eventfd (a pipe off Linux) that producers write only
//! while the writer thread sleeps, so that it sleeps in one `poll(2)` on the doorbell and the
//! device's completion fd together instead of waking in slices to look at both.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};

use crate::host::Doorbell;

/// See the module docs.
pub(crate) struct ThreadBell {
    /// Set by the writer thread before it sleeps (and after a last look at its queue); the
    /// first ring after that writes the fd.
    armed: AtomicBool,
    read: OwnedFd,
    #[cfg(not(target_os = "linux"))]
    write: OwnedFd,
}

impl ThreadBell {
    #[cfg(target_os = "linux")]
    pub fn new() -> io::Result<ThreadBell> {
        use rustix::event::{eventfd, EventfdFlags};
        let read = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
        Ok(ThreadBell {
            armed: AtomicBool::new(false),
            read,
        })
    }

    #[cfg(not(target_os = "linux"))]
    pub fn new() -> io::Result<ThreadBell> {
        use rustix::pipe::{pipe_with, PipeFlags};
        let (read, write) = pipe_with(PipeFlags::NONBLOCK | PipeFlags::CLOEXEC)?;
        Ok(ThreadBell {
            armed: AtomicBool::new(false),
            read,
            write,
        })
    }

    fn write_fd(&self) -> BorrowedFd<'_> {
        #[cfg(target_os = "linux")]
        return self.read.as_fd();
        #[cfg(not(target_os = "linux"))]
        return self.write.as_fd();
    }

    /// The writer thread is about to sleep: from now on a request rings.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// The writer thread is awake again; takes back a ring that came meanwhile.
    pub fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
        let mut buf = [0u8; 64];
        // Non-blocking: EAGAIN when nothing rang. An eventfd takes its 8 bytes at once.
        while matches!(rustix::io::read(&self.read, &mut buf), Ok(n) if n > 0) {
            if cfg!(target_os = "linux") {
                break;
            }
        }
    }

    /// Sleeps until the doorbell rings, `device` (a completion fd) is readable, or `timeout`
    /// passes. Arm first, and look at the queue once more after arming.
    pub fn sleep(&self, device: Option<BorrowedFd<'_>>, timeout: Duration) {
        let mut fds = vec![PollFd::new(&self.read, PollFlags::IN)];
        if let Some(d) = device.as_ref() {
            fds.push(PollFd::new(d, PollFlags::IN));
        }
        let ts = rustix::event::Timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        // EINTR and the like only end the sleep early: the caller looks again.
        let _ = rustix::event::poll(&mut fds, Some(&ts));
    }
}

impl Doorbell for ThreadBell {
    fn ring(&self) {
        if self.armed.swap(false, Ordering::SeqCst) {
            let one = 1u64.to_ne_bytes();
            #[cfg(target_os = "linux")]
            let bytes = &one[..];
            #[cfg(not(target_os = "linux"))]
            let bytes = &one[..1];
            // A full counter or pipe is readable already: nothing to do on EAGAIN.
            let _ = rustix::io::write(self.write_fd(), bytes);
        }
    }
}
