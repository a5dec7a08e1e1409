//! The file device's completion notification ([`BlockDevice::completion_fd`](crate::BlockDevice)):
//! a descriptor that is readable while a completion may be waiting to be reaped.
//!
//! On Linux it is an eventfd: the io_uring engine registers it with `IORING_REGISTER_EVENTFD`, so
//! the kernel signals it after posting each CQE; the I/O threads write it after queueing each
//! completion. Elsewhere (macOS) it is a non-blocking pipe, one byte per signal. Either way a
//! reset (`drain`) followed by a reap can never lose a completion: one that lands after the reset
//! signals again. The same type serves as the gate of the "hold a flush" test seam.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// An eventfd (Linux) or a pipe, non-blocking and close-on-exec.
pub(super) struct Notifier {
    /// The end that is polled and drained (the eventfd itself on Linux).
    read: OwnedFd,
    /// The end that is written.
    #[cfg(not(target_os = "linux"))]
    write: OwnedFd,
}

impl Notifier {
    #[cfg(target_os = "linux")]
    pub fn new() -> io::Result<Notifier> {
        // SAFETY: eventfd takes two integers and touches no memory of ours.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a descriptor the call just created, owned by nothing else.
        let read = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Notifier { read })
    }

    #[cfg(not(target_os = "linux"))]
    pub fn new() -> io::Result<Notifier> {
        let mut fds: [libc::c_int; 2] = [-1, -1];
        // SAFETY: pipe writes two descriptors into the array, which is live and holds two ints.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created by pipe and are owned by nothing else; owning
        // them at once closes them on any error below.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        for fd in [&read, &write] {
            set_flag(fd, libc::F_GETFL, libc::F_SETFL, libc::O_NONBLOCK)?;
            set_flag(fd, libc::F_GETFD, libc::F_SETFD, libc::FD_CLOEXEC)?;
        }
        Ok(Notifier { read, write })
    }

    /// The descriptor to wait on for readability.
    pub fn fd(&self) -> RawFd {
        self.read.as_raw_fd()
    }

    /// Makes the descriptor readable. Never blocks; a full counter or pipe is readable already,
    /// so `EAGAIN` is ignored, and nothing else can fail on a descriptor we own.
    pub fn signal(&self) {
        #[cfg(target_os = "linux")]
        let (fd, byte) = (self.read.as_raw_fd(), 1u64.to_ne_bytes());
        #[cfg(not(target_os = "linux"))]
        let (fd, byte) = (self.write.as_raw_fd(), [1u8]);
        loop {
            // SAFETY: the pointer and length describe `byte`, a live local array the call only
            // reads; the descriptor is owned by `self`. An eventfd takes exactly 8 bytes.
            let rc = unsafe { libc::write(fd, byte.as_ptr().cast(), byte.len()) };
            if rc >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return;
            }
        }
    }

    /// Resets the descriptor to not readable (until the next `signal`).
    pub fn drain(&self) {
        // An eventfd read takes the whole counter at once; a pipe is read until empty.
        let mut buf = [0u8; 64];
        #[cfg(target_os = "linux")]
        let len = 8;
        #[cfg(not(target_os = "linux"))]
        let len = buf.len();
        loop {
            // SAFETY: the pointer and length describe `buf`, a live local array the call may
            // write; the descriptor is owned by `self`.
            let rc = unsafe { libc::read(self.read.as_raw_fd(), buf.as_mut_ptr().cast(), len) };
            match rc {
                // The eventfd is reset by one read; an empty (or closed) pipe has nothing more.
                _ if cfg!(target_os = "linux") && rc > 0 => return,
                n if n > 0 => {}
                0 => return,
                _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
                _ => return,
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn set_flag(fd: &OwnedFd, get: libc::c_int, set: libc::c_int, flag: libc::c_int) -> io::Result<()> {
    // SAFETY: F_GETFL/F_GETFD take no argument and touch no memory of ours; the descriptor is
    // owned by the caller.
    let old = unsafe { libc::fcntl(fd.as_raw_fd(), get) };
    if old < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: F_SETFL/F_SETFD take an integer and touch no memory of ours.
    if unsafe { libc::fcntl(fd.as_raw_fd(), set, old | flag) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `fd` is readable, waiting up to `timeout` for it (`None`: for as long as it takes).
/// For owners of a device's [`completion_fd`](crate::BlockDevice::completion_fd), tests and the
/// contract suite; `poll(2)` underneath, retried on `EINTR` (with the whole timeout again, which
/// only ever waits longer).
pub fn fd_readable(fd: RawFd, timeout: Option<Duration>) -> io::Result<bool> {
    let ms = match timeout {
        None => -1,
        // Rounded up, so that a short timeout still waits rather than only looks.
        Some(t) => {
            libc::c_int::try_from(t.as_nanos().div_ceil(1_000_000)).unwrap_or(libc::c_int::MAX)
        }
    };
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one pollfd, a live local the call reads and writes; a descriptor that is not
        // open is reported in `revents` (POLLNVAL), not a memory error.
        let rc = unsafe { libc::poll(&mut p, 1, ms) };
        if rc >= 0 {
            if p.revents & libc::POLLNVAL != 0 {
                return Err(io::Error::from_raw_os_error(libc::EBADF));
            }
            return Ok(rc > 0 && p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_makes_it_readable_and_drain_resets_it() {
        let n = Notifier::new().unwrap();
        assert!(!fd_readable(n.fd(), Some(Duration::ZERO)).unwrap());
        n.signal();
        n.signal();
        assert!(fd_readable(n.fd(), Some(Duration::ZERO)).unwrap());
        n.drain();
        assert!(!fd_readable(n.fd(), Some(Duration::ZERO)).unwrap());
        // Draining an empty one neither blocks nor fails.
        n.drain();
        n.signal();
        assert!(fd_readable(n.fd(), Some(Duration::from_millis(1))).unwrap());
    }
}
