//! The io_uring engine of the file backend: the thread that owns the device submits and reaps
//! itself, as with the NVMe driver's polled queue pair, so a write costs no hand-over to another
//! thread.
//!
//! Each I/O owns a slot (its index is the SQE's `user_data`) that holds its buffer until the
//! kernel has posted its CQE. Submits only queue SQEs; `poll` and `wait` pass them to the kernel
//! with one `io_uring_enter` and reap CQEs. A write's completion is delivered only after its CQE
//! was reaped, so a flush (`IORING_OP_FSYNC` with `IORING_FSYNC_DATASYNC`, on one of the flush
//! descriptions, see `flushes`) submitted after that delivery is issued after the write finished
//! in the kernel and covers it, exactly as with the I/O threads. No drain flag is used.
//!
//! **Completion notification**: an eventfd registered with `IORING_REGISTER_EVENTFD`, which the
//! kernel signals after posting CQEs. `poll` and `wait` read it (reset) *before* they reap, so a
//! CQE posted meanwhile leaves it readable. When SQEs stay queued after a `poll` (the kernel
//! refused them for now, `EAGAIN`/`EBUSY`), the engine signals it itself, so that an owner
//! sleeping on it comes back to submit them.
//!
//! **Linked write+flush**: the write's SQE carries `IOSQE_IO_LINK` and is followed by the fsync on
//! a free flush description, so the kernel starts the fsync only once the write has completed in
//! full. A short write (or `EINTR`) breaks the link: the kernel cancels the fsync (`-ECANCELED`),
//! the write is continued as any other, and the fsync is issued by the engine once the write has
//! completed. A cancelled fsync is never reported as a success, and neither is one that ran after
//! a write that was cut short (it cannot cover the rest). If the write fails, the flush fails
//! without running. A pair whose flush found no free description is a plain write: when it
//! completes the device starts the flush like any other.

use std::cell::Cell;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use io_uring::{opcode, squeue, types, IoUring};

use super::engine::{FlushEvent, Linked};
use super::notify::Notifier;
use super::threads::{offset, Request};
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

/// `user_data` of the SQEs that are no I/O of ours (the test seams' gate and link breaker).
const AUX: u64 = u64::MAX;

/// The test seam's link breaker: a timeout that expires at once, which severs the link it is in.
/// The kernel reads it when the SQE is submitted, so it lives for ever.
static BREAKER: types::Timespec = types::Timespec::new().nsec(1_000);

/// One I/O the kernel may still be working on.
struct Slot {
    tag: Tag,
    op: Op,
    lba: u64,
    buffer: Option<IoBuffer>,
    /// Bytes transferred so far; a short transfer is continued from here, as the threads do.
    done: usize,
    /// A flush: the description its fsync runs on.
    desc: usize,
    /// A write: the flush that follows it.
    then: Then,
    /// A flush: where it stands with the write it is linked to.
    link: Link,
}

/// What follows a write.
#[derive(Clone, Copy)]
enum Then {
    Nothing,
    /// The linked flush in this slot.
    Flush(u32),
    /// A linked flush without a description: reported due when the write completes.
    Due(Tag),
}

/// A flush's relation to the write of its pair.
enum Link {
    /// Its fsync SQE is its own (a plain flush, or issued by us after the write).
    Own,
    /// Its SQE follows the write in slot `write` in an intact link; the write has not completed.
    Linked { write: u32 },
    /// As `Linked`, but the write's first attempt was short: the link is broken, and whatever the
    /// SQE reports, the fsync must be issued again after the write has completed.
    Cut { write: u32 },
    /// Its SQE is still in the kernel and the write completed in full (`cut`: only after a short
    /// first attempt).
    WriteOk { cut: bool },
    /// Its SQE is still in the kernel and the write failed: the flush fails with this.
    WriteFailed(DeviceError),
    /// Its SQE came back unrun while its write goes on: issued when the write completes.
    Parked,
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

/// The ring, its slots and the files they work on.
pub(super) struct Ring {
    ring: IoUring,
    /// Indexed by `user_data`; `Some` while the kernel may use the slot's buffer (or a flush is
    /// parked in it).
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    file: File,
    /// The flush descriptions, indexed by `Slot::desc`.
    flushers: Vec<File>,
    block_size: u64,
    /// Set when a flush failed: the device refuses what comes next.
    stopped: bool,
    /// Registered with the ring; signalled by the kernel after it posts CQEs.
    notify: Notifier,
    /// Test seam: every gate handed to the kernel (a flush's fsync linked behind a poll on it),
    /// released when the ring is dropped so that it can drain.
    gates: Vec<Arc<Notifier>>,
    /// Test seam: the next write goes to an invalid descriptor and fails in the kernel (`EBADF`).
    fail_write: bool,
    /// Test seam: the next linked write's first attempt is short and the link is severed.
    short_linked: bool,
    /// CQEs were reaped since the eventfd was last reset: their signals may still be pending.
    maybe_signalled: bool,
    /// Linked flushes whose fsync the engine issued itself after their write (a severed link).
    reissued: u64,
}

/// A short wait for the loop that drains the ring when the device is dropped.
const DRAIN_STEP: Duration = Duration::from_millis(100);

impl Ring {
    /// Sets up a ring of `depth` entries over `file`, flushing on `flushers`, with its completion
    /// eventfd registered. Needs `IORING_FEAT_EXT_ARG` (kernel ≥ 5.11) for the timed wait. The
    /// error is the reason in words.
    pub fn start(
        file: File,
        flushers: Vec<File>,
        block_size: u64,
        depth: usize,
    ) -> Result<Ring, String> {
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
        let notify =
            Notifier::new().map_err(|e| format!("cannot create the completion eventfd: {e}"))?;
        ring.submitter()
            .register_eventfd(notify.fd())
            .map_err(|e| format!("cannot register the completion eventfd with io_uring: {e}"))?;
        // A clamped ring may be smaller than asked; the device then admits no more than it holds.
        let depth = depth.min(ring.params().sq_entries() as usize);
        Ok(Ring {
            ring,
            slots: (0..depth).map(|_| None).collect(),
            free: (0..depth as u32).rev().collect(),
            file,
            flushers,
            block_size,
            stopped: false,
            notify,
            gates: Vec::new(),
            reissued: 0,
            fail_write: false,
            short_linked: false,
            maybe_signalled: false,
        })
    }

    /// How many I/Os the ring holds at once.
    pub fn depth(&self) -> usize {
        self.slots.len()
    }

    pub fn stopped(&self) -> bool {
        self.stopped
    }

    pub fn notify_fd(&self) -> RawFd {
        self.notify.fd()
    }

    pub fn reissued(&self) -> u64 {
        self.reissued
    }

    pub fn fail_next_write(&mut self) {
        self.fail_write = true;
    }

    pub fn short_next_linked_write(&mut self) {
        self.short_linked = true;
    }

    /// Takes a slot for `req` (two for a linked write whose flush has a description) and queues
    /// its SQEs; they reach the kernel at the next `poll`/`wait`/`submit_queued`.
    pub fn push(&mut self, req: Request) -> Result<(), DeviceError> {
        let Request {
            tag,
            op,
            lba,
            buffer,
            desc,
            linked,
            gate,
        } = req;
        let then = match linked {
            Some(Linked {
                tag: flush,
                desc: Some(d),
            }) => return self.push_pair(tag, lba, buffer, flush, d),
            Some(Linked { tag, desc: None }) => Then::Due(tag),
            None => Then::Nothing,
        };
        let idx = self.take_slot(op, lba, 1)?[0];
        self.slots[idx as usize] = Some(Slot {
            tag,
            op,
            lba,
            buffer,
            done: 0,
            desc,
            then,
            link: Link::Own,
        });
        if let Err(e) = self.queue(idx, gate) {
            // Never handed to the kernel, so the buffer is ours to drop.
            drop(self.release(idx));
            return Err(e);
        }
        Ok(())
    }

    /// `n` free slots, taken; `QueueFull` (taking none) when fewer are free.
    fn take_slot(&mut self, op: Op, lba: u64, n: usize) -> Result<[u32; 2], DeviceError> {
        if self.free.len() < n {
            return Err(DeviceError::QueueFull {
                op,
                lba,
                depth: self.depth(),
            });
        }
        let mut got = [0; 2];
        for g in got.iter_mut().take(n) {
            *g = self.free.pop().unwrap_or_default();
        }
        Ok(got)
    }

    /// A write linked to the fsync of flush `flush_tag` on description `desc`.
    fn push_pair(
        &mut self,
        tag: Tag,
        lba: u64,
        buffer: Option<IoBuffer>,
        flush_tag: Tag,
        desc: usize,
    ) -> Result<(), DeviceError> {
        let [w, f] = self.take_slot(Op::Write, lba, 2)?;
        self.slots[w as usize] = Some(Slot {
            tag,
            op: Op::Write,
            lba,
            buffer,
            done: 0,
            desc: 0,
            then: Then::Flush(f),
            link: Link::Own,
        });
        self.slots[f as usize] = Some(Slot {
            tag: flush_tag,
            op: Op::Flush,
            lba: 0,
            buffer: None,
            done: 0,
            desc,
            then: Then::Nothing,
            link: Link::Linked { write: w },
        });
        let pushed = self
            .pair_entries(w, f)
            .and_then(|entries| self.push_sqes(&entries));
        if let Err(e) = pushed {
            drop(self.release(w));
            drop(self.release(f));
            return Err(e);
        }
        Ok(())
    }

    /// The SQEs of a linked pair: the write (linked), the test seam's breaker if armed, the fsync.
    fn pair_entries(&mut self, w: u32, f: u32) -> Result<Vec<squeue::Entry>, DeviceError> {
        let mut limit = None;
        if std::mem::take(&mut self.short_linked) {
            let len = self.slots[w as usize]
                .as_ref()
                .and_then(|s| s.buffer.as_ref())
                .map_or(0, |b| b.len());
            let half = (len as u64 / 2 / self.block_size * self.block_size) as usize;
            // A write of one block cannot be split; the seam then does nothing.
            limit = (half > 0).then_some(half);
        }
        let write = self.entry(w, limit)?.flags(squeue::Flags::IO_LINK);
        let fsync = self.entry(f, None)?;
        Ok(match limit {
            Some(_) => vec![
                write,
                opcode::Timeout::new(&BREAKER)
                    .build()
                    .user_data(AUX)
                    .flags(squeue::Flags::IO_LINK),
                fsync,
            ],
            None => vec![write, fsync],
        })
    }

    /// Queues the SQE for what slot `idx` has left to do, behind a poll on the test `gate` if any.
    fn queue(&mut self, idx: u32, gate: Option<Arc<Notifier>>) -> Result<(), DeviceError> {
        let entry = self.entry(idx, None)?;
        match gate {
            Some(gate) => {
                let poll = opcode::PollAdd::new(types::Fd(gate.fd()), libc::POLLIN as u32)
                    .build()
                    .user_data(AUX)
                    .flags(squeue::Flags::IO_LINK);
                self.gates.push(gate);
                self.push_sqes(&[poll, entry])
            }
            None => self.push_sqes(&[entry]),
        }
    }

    /// The SQE for what slot `idx` has left to do, at most `limit` bytes of it.
    fn entry(&mut self, idx: u32, limit: Option<usize>) -> Result<squeue::Entry, DeviceError> {
        let Some(slot) = self.slots[idx as usize].as_mut() else {
            return Err(internal(Op::Write, 0, "queued an empty slot"));
        };
        let (op, lba, done) = (slot.op, slot.lba, slot.done);
        let entry: squeue::Entry = match (op, slot.buffer.as_mut()) {
            (Op::Flush, _) => {
                let Some(f) = self.flushers.get(slot.desc) else {
                    return Err(internal(op, lba, "no such flush description"));
                };
                opcode::Fsync::new(types::Fd(f.as_raw_fd()))
                    .flags(types::FsyncFlags::DATASYNC)
                    .build()
            }
            (Op::Write | Op::Read, Some(buf)) if done < buf.len() => {
                let at = offset(op, lba, self.block_size)? + done as u64;
                // `done < len <= max_transfer`, which is a u32, and the pointer stays inside the
                // buffer.
                let len = limit.map_or(buf.len() - done, |l| l.min(buf.len() - done)) as u32;
                let ptr = buf.as_mut_ptr().wrapping_add(done);
                if op == Op::Write {
                    let fd = match std::mem::take(&mut self.fail_write) {
                        true => types::Fd(-1),
                        false => types::Fd(self.file.as_raw_fd()),
                    };
                    opcode::Write::new(fd, ptr.cast_const(), len)
                        .offset(at)
                        .build()
                } else {
                    opcode::Read::new(types::Fd(self.file.as_raw_fd()), ptr, len)
                        .offset(at)
                        .build()
                }
            }
            _ => return Err(internal(op, lba, "request without a buffer to transfer")),
        };
        Ok(entry.user_data(u64::from(idx)))
    }

    /// Pushes `entries` to the submission queue, all or none.
    fn push_sqes(&mut self, entries: &[squeue::Entry]) -> Result<(), DeviceError> {
        let room = |ring: &mut IoUring| {
            let mut sq = ring.submission();
            sq.sync();
            sq.capacity() - sq.len()
        };
        if room(&mut self.ring) < entries.len() {
            // Only the test seams add SQEs beyond one per busy slot; hand the kernel what is
            // queued to make room.
            let _ = self.ring.submit();
        }
        // SAFETY: an I/O SQE points at its slot's buffer, which is heap memory that does not move
        // when the `IoBuffer` value moves, and which stays in `self.slots` until this slot's last
        // CQE is reaped (`release` is the only place that takes it out, and is called for a slot
        // with an SQE in the kernel only from its CQE). `Drop` waits for every busy slot's CQE,
        // and leaks the buffers if it cannot, so the kernel never writes to or reads from freed
        // memory. The descriptors (file, flush descriptions, gates) stay open for as long as
        // `self` lives, and the breaker timespec is a static.
        let pushed = unsafe { self.ring.submission().push_multiple(entries) };
        // Cannot fail but for the test seams: the ring has at least as many entries as slots,
        // and each busy slot has at most one SQE waiting.
        pushed.map_err(|_| internal(Op::Write, 0, "the submission queue is full"))
    }

    /// Frees slot `idx`, returning what it held.
    fn release(&mut self, idx: u32) -> Option<Slot> {
        let slot = self.slots.get_mut(idx as usize)?.take();
        if slot.is_some() {
            self.free.push(idx);
        }
        slot
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

    /// Reaps every CQE that is ready: finished I/Os into `out`, flush outcomes into `events`.
    /// Reaps every CQE ready; returns how many.
    fn reap(&mut self, out: &mut Vec<Completion>, events: &mut Vec<FlushEvent>) -> usize {
        let mut cqes = 0;
        loop {
            // A `let ... else`, so that the completion queue's borrow ends here.
            let Some(cqe) = self.ring.completion().next() else {
                break;
            };
            cqes += 1;
            let Ok(idx) = u32::try_from(cqe.user_data()) else {
                continue;
            };
            let Some(op) = self
                .slots
                .get(idx as usize)
                .and_then(|s| s.as_ref())
                .map(|s| s.op)
            else {
                continue;
            };
            if op == Op::Flush {
                self.fsync_done(idx, cqe.result(), events);
            } else {
                self.transfer_done(idx, cqe.result(), out, events);
            }
        }
        cqes
    }

    /// Submits what is queued, resets the completion eventfd, then reaps what is ready: in that
    /// order, so that a CQE posted after the reset leaves the eventfd readable.
    pub fn poll(
        &mut self,
        out: &mut Vec<Completion>,
        events: &mut Vec<FlushEvent>,
    ) -> Result<(), DeviceError> {
        self.enter(None)?;
        // Nothing completed, and no signal can be left over from CQEs reaped after the last
        // reset: leave the eventfd alone, which saves a system call per poll of an owner that
        // polls often. A completion posted after this look signals the eventfd, so the owner
        // still wakes for it.
        if self.ring.completion().is_empty() && !self.maybe_signalled {
            return Ok(());
        }
        self.poll_with(out, events, |_| {})
    }

    /// `poll`, calling `between` after the reset and before the reap (a test's hook).
    fn poll_with(
        &mut self,
        out: &mut Vec<Completion>,
        events: &mut Vec<FlushEvent>,
        between: impl FnOnce(&mut IoUring),
    ) -> Result<(), DeviceError> {
        self.enter(None)?;
        self.notify.drain();
        between(&mut self.ring);
        // A CQE reaped now may have signalled after the reset: the next poll resets again.
        self.maybe_signalled = self.reap(out, events) > 0;
        Ok(())
    }

    /// Reaps what is ready; if nothing is, submits what is queued and sleeps in the kernel until a
    /// completion arrives or `timeout` passes. The caller has something in flight.
    pub fn wait(
        &mut self,
        out: &mut Vec<Completion>,
        events: &mut Vec<FlushEvent>,
        timeout: Duration,
    ) -> Result<(), DeviceError> {
        let before = (out.len(), events.len());
        self.notify.drain();
        self.maybe_signalled = self.reap(out, events) > 0;
        if (out.len(), events.len()) != before {
            return Ok(());
        }
        self.enter(Some(timeout))?;
        self.notify.drain();
        self.maybe_signalled = self.reap(out, events) > 0;
        Ok(())
    }

    /// Hands the kernel what was queued since the reap. If some SQEs stay queued (the kernel
    /// refused them for now), signals the eventfd so that an owner sleeping on it comes back.
    pub fn submit_queued(&mut self) -> Result<(), DeviceError> {
        self.enter(None)?;
        if !self.ring.submission().is_empty() {
            self.notify.signal();
        }
        Ok(())
    }

    fn busy(&self) -> usize {
        self.slots.len() - self.free.len()
    }
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
    /// this waits rather than cancels; a held test gate is released first. If the ring itself
    /// fails, the buffers of busy slots are leaked: memory the kernel may still write must never
    /// go back to the allocator.
    fn drop(&mut self) {
        for gate in self.gates.drain(..) {
            gate.signal();
        }
        let (mut sink, mut events) = (Vec::new(), Vec::new());
        while self.busy() > 0 {
            sink.clear();
            events.clear();
            if self.enter(Some(DRAIN_STEP)).is_err() {
                for slot in self.slots.iter_mut() {
                    if let Some(s) = slot.take() {
                        std::mem::forget(s.buffer);
                    }
                }
                return;
            }
            self.reap(&mut sink, &mut events);
        }
    }
}

mod complete;
#[cfg(test)]
mod tests;
