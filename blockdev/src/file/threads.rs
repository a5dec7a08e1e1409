//! The I/O threads of the file backend.
//!
//! Each thread takes a request from a shared channel, performs it with one blocking system call
//! (looped on short transfers), and queues the completion. A write's completion is queued only
//! after its `pwrite` returned, which is what makes the flush contract hold: a flush submitted
//! after a write's completion was delivered starts after that write reached the kernel.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam::channel::{self, Receiver, RecvTimeoutError, Sender, TrySendError};

use crate::{Completion, DeviceError, IoBuffer, Op, Tag};

/// One request for an I/O thread.
pub(super) struct Request {
    pub tag: Tag,
    pub op: Op,
    pub lba: u64,
    pub buffer: Option<IoBuffer>,
}

/// Outcome of handing a request to the threads.
pub(super) enum Submit {
    Queued,
    Full,
    Gone,
}

/// State the threads share.
struct Shared {
    file: File,
    block_size: u64,
    /// Set by the thread whose flush failed, before it queues that completion.
    stopped: AtomicBool,
    /// Test seam: an errno the next flush reports instead of calling `fdatasync` (0: none).
    inject_flush: AtomicI32,
}

/// The thread pool: a request channel in, a completion channel out.
pub(super) struct Pool {
    /// `None` only while dropping: closing it tells the threads to finish.
    requests: Option<Sender<Request>>,
    completions: Receiver<Completion>,
    threads: Vec<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl Pool {
    /// Starts `threads` I/O threads over `file`. The request channel holds `depth` requests, which
    /// is all the device admits, so a submit never blocks.
    pub fn start(file: File, block_size: u64, threads: usize, depth: usize) -> io::Result<Pool> {
        let (req_tx, req_rx) = channel::bounded::<Request>(depth);
        let (done_tx, done_rx) = channel::unbounded::<Completion>();
        let shared = Arc::new(Shared {
            file,
            block_size,
            stopped: AtomicBool::new(false),
            inject_flush: AtomicI32::new(0),
        });
        let mut pool = Pool {
            requests: Some(req_tx),
            completions: done_rx,
            threads: Vec::with_capacity(threads),
            shared: Arc::clone(&shared),
        };
        for i in 0..threads {
            let (shared, rx, tx) = (Arc::clone(&shared), req_rx.clone(), done_tx.clone());
            // On error `pool` is dropped here, which stops and joins the threads already started.
            let handle = std::thread::Builder::new()
                .name(format!("nvmq-file-io-{i}"))
                .spawn(move || run(&shared, &rx, &tx))?;
            pool.threads.push(handle);
        }
        Ok(pool)
    }

    pub fn submit(&self, req: Request) -> Submit {
        let Some(tx) = &self.requests else {
            return Submit::Gone;
        };
        match tx.try_send(req) {
            Ok(()) => Submit::Queued,
            Err(TrySendError::Full(_)) => Submit::Full,
            Err(TrySendError::Disconnected(_)) => Submit::Gone,
        }
    }

    pub fn try_recv(&self) -> Option<Completion> {
        self.completions.try_recv().ok()
    }

    /// `Ok(None)` on timeout, `Err(())` when every thread has exited.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Option<Completion>, ()> {
        match self.completions.recv_timeout(timeout) {
            Ok(c) => Ok(Some(c)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err(()),
        }
    }

    /// True once a flush has failed.
    pub fn stopped(&self) -> bool {
        self.shared.stopped.load(Ordering::Acquire)
    }

    pub fn inject_flush_failure(&self, errno: i32) {
        self.shared.inject_flush.store(errno, Ordering::Release);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Closing the request channel lets each thread drain what is queued and then exit.
        drop(self.requests.take());
        for t in self.threads.drain(..) {
            // A thread that panicked has nothing left to clean up; dropping must not panic.
            let _ = t.join();
        }
    }
}

fn run(shared: &Shared, rx: &Receiver<Request>, tx: &Sender<Completion>) {
    while let Ok(req) = rx.recv() {
        let c = shared.execute(req);
        if tx.send(c).is_err() {
            // The device is gone; nobody will collect completions.
            break;
        }
    }
}

impl Shared {
    fn execute(&self, req: Request) -> Completion {
        let Request {
            tag,
            op,
            lba,
            mut buffer,
        } = req;
        let result = match (op, buffer.as_mut()) {
            (Op::Write, Some(buf)) => self.write(lba, buf),
            (Op::Read, Some(buf)) => self.read(lba, buf),
            (Op::Flush, _) => self.flush(),
            _ => Err(DeviceError::Io {
                op,
                lba,
                detail: "internal error: request without a buffer".into(),
            }),
        };
        Completion {
            tag,
            op,
            lba,
            buffer,
            result,
        }
    }

    fn write(&self, lba: u64, buf: &IoBuffer) -> Result<(), DeviceError> {
        let base = offset(Op::Write, lba, self.block_size)?;
        let mut done = 0usize;
        while done < buf.len() {
            match self.file.write_at(&buf[done..], base + done as u64) {
                Ok(0) => return Err(no_progress(Op::Write, lba, done, buf.len())),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error(Op::Write, lba, &e)),
            }
        }
        Ok(())
    }

    fn read(&self, lba: u64, buf: &mut IoBuffer) -> Result<(), DeviceError> {
        let base = offset(Op::Read, lba, self.block_size)?;
        let len = buf.len();
        let mut done = 0usize;
        while done < len {
            match self.file.read_at(&mut buf[done..], base + done as u64) {
                Ok(0) => return Err(no_progress(Op::Read, lba, done, len)),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error(Op::Read, lba, &e)),
            }
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), DeviceError> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(DeviceError::Stopped {
                op: Op::Flush,
                lba: 0,
            });
        }
        let result = match self.inject_flush.swap(0, Ordering::AcqRel) {
            0 => sync_data(&self.file),
            errno => Err(io::Error::from_raw_os_error(errno)),
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) => {
                self.stopped.store(true, Ordering::Release);
                Err(io_error(Op::Flush, 0, &e))
            }
        }
    }
}

/// The byte offset of block `lba`.
pub(super) fn offset(op: Op, lba: u64, block_size: u64) -> Result<u64, DeviceError> {
    lba.checked_mul(block_size).ok_or(DeviceError::Io {
        op,
        lba,
        detail: "byte offset overflows".into(),
    })
}

/// A transfer that moved no bytes (and reported no error) before it was complete.
pub(super) fn no_progress(op: Op, lba: u64, done: usize, len: usize) -> DeviceError {
    DeviceError::Io {
        op,
        lba,
        detail: format!(
            "short {op} made no progress after {done} of {len} bytes (the file ended or shrank)"
        ),
    }
}

pub(super) fn io_error(op: Op, lba: u64, e: &io::Error) -> DeviceError {
    DeviceError::Io {
        op,
        lba,
        detail: e.to_string(),
    }
}

/// Makes completed writes durable: `fdatasync(2)` on Linux, retried on `EINTR` (which reports
/// nothing about the data).
#[cfg(not(target_os = "macos"))]
pub(super) fn sync_data(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: fdatasync takes a file descriptor and touches no memory of ours; the descriptor
        // is open for as long as `file` is borrowed.
        let rc = unsafe { libc::fdatasync(file.as_raw_fd()) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Makes completed writes durable on macOS, where `fsync` does not flush the drive's cache:
/// `fcntl(F_FULLFSYNC)`.
#[cfg(target_os = "macos")]
pub(super) fn sync_data(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: F_FULLFSYNC takes no argument and touches no memory of ours; the descriptor is
        // open for as long as `file` is borrowed.
        let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_FULLFSYNC) };
        if rc != -1 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
