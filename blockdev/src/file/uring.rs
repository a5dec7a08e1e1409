//! The io_uring engine of the file backend: the thread that owns the device submits and reaps
//! itself, as with the NVMe driver's polled queue pair, so a write costs no hand-over to another
//! thread.
//!
//! Each I/O owns a slot (its index is the SQE's `user_data`) that holds its buffer until the
//! kernel has posted its CQE. Submits only queue SQEs; `poll` and `wait` pass them to the kernel
//! with one `io_uring_enter` and reap CQEs. A write's completion is delivered only after its CQE
//! was reaped, so a flush (`IORING_OP_FSYNC` with `IORING_FSYNC_DATASYNC`) submitted after that
//! delivery is issued after the write finished in the kernel and covers it, exactly as with the
//! I/O threads. No drain or link flag is used: a flush covers what was delivered before it, and
//! nothing more is promised.

use std::cell::Cell;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use io_uring::{opcode, squeue, types, IoUring};

use super::threads::{io_error, no_progress, offset, Request};
use crate::{Completion, DeviceError, IoBuffer, Op, Tag};

thread_local! {
    /// Test seam: an errno that the next ring set-up on this thread fails with.
    static SETUP_FAILURE: Cell<Option<i32>> = const { Cell::new(None) };
}

/// Makes the next io_uring set-up on the calling thread fail with `errno`, as a kernel without
/// io_uring (`ENOSYS`), a seccomp filter or `kernel.io_uring_disabled` (`EPERM`) would.
pub(super) fn fail_next_setup(errno: i32) {
    SETUP_FAILURE.with(|f| f.set(Some(errno)));
}

/// One I/O the kernel may still be working on.
struct Slot {
    tag: Tag,
    op: Op,
    lba: u64,
    buffer: Option<IoBuffer>,
    /// Bytes transferred so far; a short transfer is continued from here, as the threads do.
    done: usize,
}

/// Why the ring could not be set up, in words an operator can act on.
fn setup_error(e: &io::Error) -> String {
    let hint = match e.raw_os_error() {
        Some(libc::ENOSYS) => {
            "the kernel has no io_uring (built without CONFIG_IO_URING, or older than 5.1)"
                .to_string()
        }
        Some(libc::EPERM) => {
            let knob = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
                .map(|s| format!("kernel.io_uring_disabled = {}", s.trim()))
                .unwrap_or_else(|_| "kernel.io_uring_disabled unreadable".into());
            format!("io_uring is not permitted here ({knob}, or a seccomp filter such as a container's refuses it)")
        }
        Some(libc::ENOMEM) => "not enough locked memory for the ring (RLIMIT_MEMLOCK)".into(),
        _ => "io_uring_setup refused".into(),
    };
    format!("cannot set up io_uring: {e}: {hint}")
}

/// The ring, its slots and the file they work on.
pub(super) struct Ring {
    ring: IoUring,
    /// Indexed by `user_data`; `Some` while the kernel may use the slot's buffer.
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    file: File,
    block_size: u64,
    /// Set when a flush failed: later flushes report `Stopped` instead of a success that would
    /// hide the lost write-back error (the kernel reports it once).
    stopped: bool,
    /// Test seam: the errno that the next flush completion reports instead of its own result.
    inject_flush: Option<i32>,
}

/// A short wait for the loop that drains the ring when the device is dropped.
const DRAIN_STEP: Duration = Duration::from_millis(100);

impl Ring {
    /// Sets up a ring of `depth` entries over `file`. Needs `IORING_FEAT_EXT_ARG` (kernel ≥ 5.11)
    /// for the timed wait. The error is the reason in words.
    pub fn start(file: File, block_size: u64, depth: usize) -> Result<Ring, String> {
        if let Some(errno) = SETUP_FAILURE.with(|f| f.take()) {
            return Err(setup_error(&io::Error::from_raw_os_error(errno)));
        }
        let entries = u32::try_from(depth)
            .map_err(|_| format!("queue depth {depth} is too large for a ring"))?;
        let ring = IoUring::builder()
            .setup_clamp()
            .build(entries)
            .map_err(|e| setup_error(&e))?;
        if !ring.params().is_feature_ext_arg() {
            return Err(
                "cannot use io_uring: the kernel lacks IORING_FEAT_EXT_ARG (timed waits, Linux 5.11)"
                    .into(),
            );
        }
        // A clamped ring may be smaller than asked; the device then admits no more than it holds.
        let depth = depth.min(ring.params().sq_entries() as usize);
        Ok(Ring {
            ring,
            slots: (0..depth).map(|_| None).collect(),
            free: (0..depth as u32).rev().collect(),
            file,
            block_size,
            stopped: false,
            inject_flush: None,
        })
    }

    /// How many I/Os the ring holds at once.
    pub fn depth(&self) -> usize {
        self.slots.len()
    }

    pub fn stopped(&self) -> bool {
        self.stopped
    }

    pub fn inject_flush_failure(&mut self, errno: i32) {
        self.inject_flush = Some(errno);
    }

    /// Takes a slot for `req` and queues its SQE; it reaches the kernel at the next `poll`/`wait`.
    pub fn push(&mut self, req: Request) -> Result<(), DeviceError> {
        let Some(idx) = self.free.pop() else {
            return Err(DeviceError::QueueFull {
                op: req.op,
                lba: req.lba,
                depth: self.depth(),
            });
        };
        self.slots[idx as usize] = Some(Slot {
            tag: req.tag,
            op: req.op,
            lba: req.lba,
            buffer: req.buffer,
            done: 0,
        });
        if let Err(e) = self.queue(idx) {
            if let Some(slot) = self.slots[idx as usize].take() {
                // Never handed to the kernel, so the buffer is ours to drop.
                drop(slot);
            }
            self.free.push(idx);
            return Err(e);
        }
        Ok(())
    }

    /// Queues the SQE for what slot `idx` has left to do.
    fn queue(&mut self, idx: u32) -> Result<(), DeviceError> {
        let fd = types::Fd(self.file.as_raw_fd());
        let Some(slot) = self.slots[idx as usize].as_mut() else {
            return Err(internal(Op::Write, 0, "queued an empty slot"));
        };
        let (op, lba, done) = (slot.op, slot.lba, slot.done);
        let entry: squeue::Entry = match (op, slot.buffer.as_mut()) {
            (Op::Flush, _) => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            (Op::Write | Op::Read, Some(buf)) if done < buf.len() => {
                let at = offset(op, lba, self.block_size)? + done as u64;
                // `done < len <= max_transfer`, which is a u32, and the pointer stays inside the
                // buffer.
                let len = (buf.len() - done) as u32;
                let ptr = buf.as_mut_ptr().wrapping_add(done);
                if op == Op::Write {
                    opcode::Write::new(fd, ptr.cast_const(), len)
                        .offset(at)
                        .build()
                } else {
                    opcode::Read::new(fd, ptr, len).offset(at).build()
                }
            }
            _ => return Err(internal(op, lba, "request without a buffer to transfer")),
        };
        let entry = entry.user_data(u64::from(idx));
        // SAFETY: the SQE points at the slot's buffer, which is heap memory that does not move
        // when the `IoBuffer` value moves, and which stays in `self.slots[idx]` until this slot's
        // CQE is reaped (`complete` is the only place that takes it out). `Drop` waits for every
        // busy slot's CQE, and leaks the buffers if it cannot, so the kernel never writes to or
        // reads from freed memory. The file descriptor stays open for as long as `self` lives.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        // Cannot fail: the ring has at least as many entries as slots, and each busy slot has at
        // most one SQE waiting.
        pushed.map_err(|_| internal(op, lba, "the submission queue is full"))
    }

    /// Passes queued SQEs to the kernel; with `wait`, also blocks until at least one CQE is ready
    /// or the time runs out. One `io_uring_enter` at most.
    fn enter(&mut self, wait: Option<Duration>) -> Result<(), DeviceError> {
        let pending = self.ring.submission().len();
        let r = match wait {
            None if pending == 0 => return Ok(()),
            None => self.ring.submit(),
            Some(t) => {
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
        };
        match r {
            Ok(_) => Ok(()),
            // Timed out, interrupted, or short of resources for now (a later call retries what is
            // still queued): none of these lose an I/O.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(DeviceError::Io {
                op: Op::Write,
                lba: 0,
                detail: format!("io_uring_enter failed with {pending} submissions queued: {e}"),
            }),
        }
    }

    /// Reaps every CQE that is ready, delivering finished I/Os into `out`.
    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        let mut n = 0;
        loop {
            let Some(cqe) = self.ring.completion().next() else {
                break;
            };
            let Ok(idx) = u32::try_from(cqe.user_data()) else {
                continue;
            };
            if let Some(c) = self.complete(idx, cqe.result()) {
                out.push(c);
                n += 1;
            }
        }
        n
    }

    /// Applies one CQE's result to slot `idx`. Returns the completion when the I/O is finished,
    /// or `None` when it went back to the kernel (a short transfer continued, `EINTR` retried).
    fn complete(&mut self, idx: u32, res: i32) -> Option<Completion> {
        let slot = self.slots.get_mut(idx as usize)?.as_mut()?;
        let (op, lba) = (slot.op, slot.lba);
        let len = slot.buffer.as_ref().map_or(0, |b| b.len());
        let again =
            res == -libc::EINTR || (op != Op::Flush && res > 0 && slot.done + (res as usize) < len);
        if res > 0 && op != Op::Flush {
            slot.done += res as usize;
        }
        if again {
            match self.queue(idx) {
                Ok(()) => return None,
                Err(e) => return Some(self.finish(idx, Err(e))),
            }
        }
        let done = slot_done(&self.slots[idx as usize]);
        let result = match op {
            Op::Flush => {
                let res = self.inject_flush.take().map_or(res, |errno| -errno);
                if self.stopped {
                    Err(DeviceError::Stopped { op, lba })
                } else if res < 0 {
                    self.stopped = true;
                    Err(io_error(op, lba, &io::Error::from_raw_os_error(-res)))
                } else {
                    Ok(())
                }
            }
            _ if res < 0 => Err(io_error(op, lba, &io::Error::from_raw_os_error(-res))),
            _ if res == 0 => Err(no_progress(op, lba, done, len)),
            _ => Ok(()),
        };
        Some(self.finish(idx, result))
    }

    /// Frees slot `idx` and turns it into a completion carrying its buffer.
    fn finish(&mut self, idx: u32, result: Result<(), DeviceError>) -> Completion {
        let slot = self.slots[idx as usize].take();
        self.free.push(idx);
        match slot {
            Some(s) => Completion {
                tag: s.tag,
                op: s.op,
                lba: s.lba,
                buffer: s.buffer,
                result,
            },
            None => Completion {
                tag: 0,
                op: Op::Write,
                lba: 0,
                buffer: None,
                result,
            },
        }
    }

    /// Submits what is queued and reaps what is ready, without blocking.
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, DeviceError> {
        self.enter(None)?;
        Ok(self.reap(out))
    }

    /// Reaps what is ready; if nothing is, submits what is queued and sleeps in the kernel until a
    /// completion arrives or `timeout` passes. The caller has something in flight.
    pub fn wait(
        &mut self,
        out: &mut Vec<Completion>,
        timeout: Duration,
    ) -> Result<usize, DeviceError> {
        let n = self.reap(out);
        if n > 0 {
            self.enter(None)?;
            return Ok(n);
        }
        self.enter(Some(timeout))?;
        Ok(self.reap(out))
    }

    fn busy(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

fn slot_done(slot: &Option<Slot>) -> usize {
    slot.as_ref().map_or(0, |s| s.done)
}

fn internal(op: Op, lba: u64, what: &str) -> DeviceError {
    DeviceError::Io {
        op,
        lba,
        detail: format!("internal error in the io_uring engine: {what}"),
    }
}

impl Drop for Ring {
    /// Waits for every I/O the kernel holds before the buffers are freed (completions are
    /// discarded, as the threads discard theirs). File I/O cannot be relied on to cancel, so
    /// this waits rather than cancels. If the ring itself fails, the buffers of busy slots are
    /// leaked: memory the kernel may still write must never go back to the allocator.
    fn drop(&mut self) {
        let mut sink = Vec::new();
        while self.busy() > 0 {
            sink.clear();
            if self.enter(Some(DRAIN_STEP)).is_err() {
                for slot in self.slots.iter_mut() {
                    if let Some(s) = slot.take() {
                        std::mem::forget(s.buffer);
                    }
                }
                return;
            }
            self.reap(&mut sink);
        }
    }
}
