//! The I/O threads of the file backend.
//!
//! Each thread takes a request from a shared channel, performs it with one blocking system call
//! (looped on short transfers), and queues the completion. A write's completion is queued only
//! after its `pwrite` returned, which is what makes the flush contract hold: a flush submitted
//! after a write's completion was delivered starts after that write reached the kernel. A linked
//! write+flush is one request: the thread writes, queues the write's completion, and then runs the
//! `fdatasync` (on the flush description the device reserved for it) only if the write succeeded.
//!
//! Completion notification: the thread queues a completion and writes the notifier under one
//! lock, and `poll` resets the notifier and takes the completions under the same lock. So a reset
//! never falls between a completion and its signal: a completion queued after a `poll` always
//! leaves the descriptor readable, and once a `poll` has taken everything no stale signal is left.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam::channel::{self, Receiver, RecvTimeoutError, Sender, TrySendError};

use super::engine::{not_run_error, FlushEvent, Linked};
use super::notify::{fd_readable, Notifier};
use crate::{Completion, DeviceError, IoBuffer, Op, Tag};

/// One request for an engine.
pub(super) struct Request {
    pub tag: Tag,
    pub op: Op,
    pub lba: u64,
    pub buffer: Option<IoBuffer>,
    /// A flush: the flush description its `fdatasync` runs on.
    pub desc: usize,
    /// A write: the flush linked after it, if any.
    pub linked: Option<Linked>,
    /// Test seam: a flush's `fdatasync` waits until this gate is readable.
    pub gate: Option<Arc<Notifier>>,
}

/// Outcome of handing a request to the threads.
pub(super) enum Submit {
    Queued,
    Full,
    Gone,
}

/// What a thread hands back.
enum Done {
    Io(Completion),
    Flush(FlushEvent),
}

/// State the threads share.
struct Shared {
    file: File,
    /// The flush descriptions, indexed by `Request::desc`.
    flushers: Vec<File>,
    block_size: u64,
    /// Set by the thread whose flush failed, before it queues that event.
    stopped: AtomicBool,
    notify: Notifier,
    /// Held while a completion is queued and the notifier written, and while `poll` resets the
    /// notifier and takes completions (see the module docs).
    deliver: Mutex<()>,
    /// Test seam: the next write fails with `EBADF` without being carried out.
    fail_write: AtomicBool,
}

/// The thread pool: a request channel in, a completion channel out.
pub(super) struct Pool {
    /// `None` only while dropping: closing it tells the threads to finish.
    requests: Option<Sender<Request>>,
    completions: Receiver<Done>,
    threads: Vec<JoinHandle<()>>,
    shared: Arc<Shared>,
    /// Test seam: every gate handed to the threads, released on drop so that they can finish.
    gates: Mutex<Vec<Arc<Notifier>>>,
}

/// A lock whose holder cannot leave the data inconsistent (it guards nothing, or an `Option`).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Pool {
    /// Starts `threads` I/O threads over `file`, flushing on `flushers`. The request channel holds
    /// `depth` requests, which is all the device admits, so a submit never blocks.
    pub fn start(
        file: File,
        flushers: Vec<File>,
        block_size: u64,
        threads: usize,
        depth: usize,
    ) -> io::Result<Pool> {
        let (req_tx, req_rx) = channel::bounded::<Request>(depth);
        let (done_tx, done_rx) = channel::unbounded::<Done>();
        let shared = Arc::new(Shared {
            file,
            flushers,
            block_size,
            stopped: AtomicBool::new(false),
            notify: Notifier::new()?,
            deliver: Mutex::new(()),
            fail_write: AtomicBool::new(false),
        });
        let mut pool = Pool {
            requests: Some(req_tx),
            completions: done_rx,
            threads: Vec::with_capacity(threads),
            shared: Arc::clone(&shared),
            gates: Mutex::new(Vec::new()),
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
        if let Some(gate) = &req.gate {
            lock(&self.gates).push(Arc::clone(gate));
        }
        match tx.try_send(req) {
            Ok(()) => Submit::Queued,
            Err(TrySendError::Full(_)) => Submit::Full,
            Err(TrySendError::Disconnected(_)) => Submit::Gone,
        }
    }

    /// Resets the notifier and takes everything queued, without blocking.
    pub fn poll(&self, out: &mut Vec<Completion>, events: &mut Vec<FlushEvent>) {
        let _g = lock(&self.shared.deliver);
        self.shared.notify.drain();
        while let Ok(d) = self.completions.try_recv() {
            route(d, out, events);
        }
    }

    /// Sleeps up to `timeout` for the first thing queued, then takes everything queued. `Err(())`
    /// when every thread has exited.
    pub fn wait(
        &self,
        out: &mut Vec<Completion>,
        events: &mut Vec<FlushEvent>,
        timeout: Duration,
    ) -> Result<(), ()> {
        match self.completions.recv_timeout(timeout) {
            Ok(d) => {
                route(d, out, events);
                self.poll(out, events);
                Ok(())
            }
            Err(RecvTimeoutError::Timeout) => Ok(()),
            Err(RecvTimeoutError::Disconnected) => Err(()),
        }
    }

    pub fn notify_fd(&self) -> std::os::fd::RawFd {
        self.shared.notify.fd()
    }

    /// True once a flush has failed.
    pub fn stopped(&self) -> bool {
        self.shared.stopped.load(Ordering::Acquire)
    }

    pub fn fail_next_write(&self) {
        self.shared.fail_write.store(true, Ordering::Release);
    }
}

fn route(d: Done, out: &mut Vec<Completion>, events: &mut Vec<FlushEvent>) {
    match d {
        Done::Io(c) => out.push(c),
        Done::Flush(e) => events.push(e),
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // A held flush would keep its thread (and this join) waiting for ever.
        for gate in lock(&self.gates).drain(..) {
            gate.signal();
        }
        // Closing the request channel lets each thread drain what is queued and then exit.
        drop(self.requests.take());
        for t in self.threads.drain(..) {
            // A thread that panicked has nothing left to clean up; dropping must not panic.
            let _ = t.join();
        }
    }
}

fn run(shared: &Shared, rx: &Receiver<Request>, tx: &Sender<Done>) {
    while let Ok(req) = rx.recv() {
        if shared.execute(req, tx).is_err() {
            // The device is gone; nobody will collect completions.
            break;
        }
    }
}

impl Shared {
    /// Queues `d` and signals the notifier, under the delivery lock.
    fn deliver(&self, tx: &Sender<Done>, d: Done) -> Result<(), ()> {
        let _g = lock(&self.deliver);
        let sent = tx.send(d).map_err(drop);
        self.notify.signal();
        sent
    }

    fn execute(&self, req: Request, tx: &Sender<Done>) -> Result<(), ()> {
        let Request {
            tag,
            op,
            lba,
            mut buffer,
            desc,
            linked,
            gate,
        } = req;
        if op == Op::Flush {
            if let Some(gate) = gate {
                // Test seam only; an error here means the gate is gone, which releases it too.
                let _ = fd_readable(gate.fd(), None);
            }
            let result = self.flush(desc);
            return self.deliver(tx, Done::Flush(FlushEvent::Ran { desc, tag, result }));
        }
        let result = match (op, buffer.as_mut()) {
            (Op::Write, Some(buf)) => self.write(lba, buf),
            (Op::Read, Some(buf)) => self.read(lba, buf),
            _ => Err(DeviceError::Io {
                op,
                lba,
                detail: "internal error: request without a buffer".into(),
            }),
        };
        let after = linked.map(|l| (l, result.clone()));
        self.deliver(
            tx,
            Done::Io(Completion {
                tag,
                op,
                lba,
                buffer,
                result,
            }),
        )?;
        // The linked flush, only now that the write's completion is queued (write first).
        let Some((Linked { tag, desc }, written)) = after else {
            return Ok(());
        };
        let event = match (written, desc) {
            (Err(e), desc) => FlushEvent::Unrun {
                desc,
                tag,
                err: not_run_error(lba, &e),
            },
            (Ok(()), Some(desc)) => FlushEvent::Ran {
                desc,
                tag,
                result: self.flush(desc),
            },
            (Ok(()), None) => FlushEvent::Due { tag },
        };
        self.deliver(tx, Done::Flush(event))
    }

    fn write(&self, lba: u64, buf: &IoBuffer) -> Result<(), DeviceError> {
        if self.fail_write.swap(false, Ordering::AcqRel) {
            return Err(io_error(
                Op::Write,
                lba,
                &io::Error::from_raw_os_error(libc::EBADF),
            ));
        }
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

    /// `fdatasync` on flush description `desc`.
    fn flush(&self, desc: usize) -> Result<(), DeviceError> {
        let stopped = || DeviceError::Stopped {
            op: Op::Flush,
            lba: 0,
        };
        if self.stopped.load(Ordering::Acquire) {
            return Err(stopped());
        }
        let Some(file) = self.flushers.get(desc) else {
            return Err(DeviceError::Io {
                op: Op::Flush,
                lba: 0,
                detail: format!("internal error: no flush description {desc}"),
            });
        };
        match sync_data(file) {
            // A flush beside one that failed is not believed (see `flushes`).
            Ok(()) if self.stopped.load(Ordering::Acquire) => Err(stopped()),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A read of one block from /dev/null: it ends at once (in a no-progress error), a completion
    /// like any other.
    fn read(pool: &Pool, tag: Tag) {
        let req = Request {
            tag,
            op: Op::Read,
            lba: 0,
            buffer: Some(IoBuffer::new_heap(512, 512).unwrap()),
            desc: 0,
            linked: None,
            gate: None,
        };
        assert!(matches!(pool.submit(req), Submit::Queued));
    }

    fn readable(pool: &Pool, t: Duration) -> bool {
        fd_readable(pool.notify_fd(), Some(t)).unwrap()
    }

    /// A completion queued while `poll` runs is either taken by it, its signal reset with it, or
    /// left with its signal: never taken with a signal left over (an event loop would spin), never
    /// left without one (a lost wake-up). Many rounds, busy-polling against the I/O threads.
    #[test]
    fn the_notifier_is_readable_exactly_while_a_completion_waits() {
        let null = File::open("/dev/null").unwrap();
        let pool = Pool::start(null, Vec::new(), 512, 2, 8).unwrap();
        let (mut out, mut events) = (Vec::new(), Vec::new());
        for round in 0..2000 {
            read(&pool, round);
            out.clear();
            while out.is_empty() {
                pool.poll(&mut out, &mut events);
            }
            assert_eq!(out.len(), 1);
            assert!(
                !readable(&pool, Duration::ZERO),
                "round {round}: a stale signal"
            );
        }
        read(&pool, 9999);
        assert!(
            readable(&pool, Duration::from_secs(5)),
            "no signal for a waiting completion"
        );
        pool.poll(&mut out, &mut events);
        assert!(!readable(&pool, Duration::ZERO));
    }
}
