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
    /// again). No syscall while the timer is disarmed: a one-shot timer that fired and was read,
    /// or was never armed, cannot become readable.
    pub fn reset(&mut self) {
        if self.armed.is_none() {
            return;
        }
        let mut buf = [0u8; 8];
        // SAFETY: the pointer and length describe `buf`, a live local array; the fd is ours. A
        // timerfd read takes 8 bytes and fails with EAGAIN when it has not fired yet.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n == 8 {
            // Fired: the one-shot timer is spent.
            self.armed = None;
        }
        // Not fired yet: it stays armed, and its later firing is a spurious wake-up (the owner
        // polls, finds nothing, and sleeps again), never a lost one.
    }

    /// Arms the timer to fire at `due` (device-clock nanoseconds), given the device clock's `now`;
    /// None disarms it. Does nothing when already armed for that moment or earlier (an early
    /// firing only costs a spurious wake-up; re-arming costs a syscall).
    pub fn arm(&mut self, due: Option<u64>, now: u64) {
        match (due, self.armed) {
            (Some(d), Some(a)) if a <= d => return,
            (None, None) => return,
            _ => {}
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
        if due.is_none() {
            // Disarmed: take a firing that came before, so that the fd cannot stay readable
            // with nothing armed (`reset` reads only an armed timer).
            let mut buf = [0u8; 8];
            // SAFETY: as in `reset`.
            let _ = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        }
    }
}
