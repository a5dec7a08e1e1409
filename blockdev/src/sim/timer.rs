//! The sim's completion fd on a real clock (Linux): a timerfd armed for the earliest moment an
//! I/O in flight is due, so that an event loop sleeps until then instead of polling. With a
//! virtual clock the sim has none (the test moves time, nobody waits for it).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};

use std::os::fd::AsRawFd;

/// A non-blocking CLOCK_MONOTONIC timerfd.
pub(super) struct DueTimer {
    fd: OwnedFd,
    /// Nanoseconds (on the device clock) the timer is armed for; None when disarmed.
    armed: Option<u64>,
}

impl DueTimer {
    pub fn new() -> io::Result<DueTimer> {
        // SAFETY: timerfd_create takes two integers and touches no memory of ours.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created by the call above and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(DueTimer { fd, armed: None })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Clears a readiness that fired (call before reaping, so that what becomes due later fires
    /// again).
    pub fn reset(&mut self) {
        let mut buf = [0u8; 8];
        // SAFETY: the pointer and length describe `buf`, a live local array; the fd is ours. A
        // timerfd read takes 8 bytes and fails with EAGAIN when it has not fired: either is fine.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        self.armed = None;
    }

    /// Arms the timer to fire at `due` (device-clock nanoseconds), given the device clock's `now`;
    /// None disarms it. Does nothing when already armed for that moment.
    pub fn arm(&mut self, due: Option<u64>, now: u64) {
        if due == self.armed {
            return;
        }
        let value = match due {
            // Due already: fire at once (a zero value would disarm).
            Some(d) => d.saturating_sub(now).max(1),
            None => 0,
        };
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (value / 1_000_000_000) as libc::time_t,
                tv_nsec: (value % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: `spec` is a live, initialised local; a null old-value pointer is allowed.
        let rc =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        self.armed = if rc == 0 { due } else { None };
    }
}
