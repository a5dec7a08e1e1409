//! The I/O path of one queue pair ([`NvmeDevice`]): submit, poll and reap, and what happens
//! when the controller fails or a command times out. Nothing here takes a lock while the
//! controller works: a pair touches only its own queues, slots and doorbells; the shared part
//! is looked at through atomics, and locked only to map an arena, send an Abort or stop.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::command::{io, Sqe};
use super::device::{NvmeDevice, Request, Slot};
use super::dma;
use super::prp;
use super::regs::{self, csts};
use super::status::Status;
use super::sys::Host;
use crate::{check_io, BlockDevice, Completion, DeviceError, DeviceInfo, IoBuffer, Op, Tag};

/// Polls with commands in flight between two looks at the controller: CSTS (an MMIO read) and
/// the clock (a system call on an HPET guest), for `wait`'s timeout and the commands' ages.
/// Polls that reaped count too: a pair that keeps reaping completions must still see a command
/// stuck behind them age and time out. One look per this many polls is never one per I/O.
const LOOK_EVERY: u32 = 256;

/// How long the driver waits for the controller to answer the Abort of a timed-out command.
const ABORT_WAIT: Duration = Duration::from_secs(1);

impl<H: Host> NvmeDevice<H> {
    /// Queues a read without the capacity check, so a driver check can see the controller's own
    /// answer to blocks past the end (LBA Out of Range) and that the queue goes on working after
    /// an error completion. Everything else is checked as for `submit_read`.
    pub fn submit_read_unchecked(
        &mut self,
        tag: Tag,
        lba: u64,
        buffer: IoBuffer,
    ) -> Result<(), DeviceError> {
        self.submit_io(Op::Read, tag, lba, buffer, false)
    }

    fn submit_io(
        &mut self,
        op: Op,
        tag: Tag,
        lba: u64,
        buffer: IoBuffer,
        range_check: bool,
    ) -> Result<(), DeviceError> {
        if self.stopped {
            return Err(self.refusal(op, lba));
        }
        let len = buffer.len();
        match check_io(&self.shared.info, op, lba, len) {
            // Reported only once the length and alignment checks passed.
            Err(DeviceError::OutOfRange { .. }) if !range_check => {}
            r => r?,
        }
        let Some(iova) = self.buffer_iova(&buffer) else {
            return Err(DeviceError::BadRequest {
                op,
                lba,
                len,
                why: "the buffer is not DMA memory of this device; allocate it with alloc_buffer",
            });
        };
        let command_bytes = self.shared.command_bytes;
        let parts = len.div_ceil(command_bytes);
        let Some(&r) = self.free_requests.last() else {
            return Err(DeviceError::QueueFull {
                op,
                lba,
                depth: self.in_flight,
            });
        };
        if self.free_slots.len() < parts {
            return Err(DeviceError::QueueFull {
                op,
                lba,
                depth: self.in_flight,
            });
        }
        let opcode = if op == Op::Write { io::WRITE } else { io::READ };
        let page = self.shared.details.page_size;
        let tail = self.io.tail();
        for k in 0..parts {
            let off = k * command_bytes;
            let n = command_bytes.min(len - off);
            let part_lba = lba + (off >> self.shared.lba_shift) as u64;
            let s = self.free_slots[self.free_slots.len() - 1 - k];
            // SAFETY: slot s owns PRP list page s of the control arena; the slot is free, so the
            // controller is not reading that page.
            let list = unsafe {
                std::slice::from_raw_parts_mut(
                    self.prp_lists.as_ptr().add(usize::from(s) * page / 8),
                    page / 8,
                )
            };
            let list_iova = self.prp_lists_iova + (usize::from(s) * page) as u64;
            let prps = match prp::build(iova + off as u64, n, page, list, list_iova) {
                Ok(p) => p,
                Err(_) => {
                    self.io.rewind(tail);
                    return Err(DeviceError::BadRequest {
                        op,
                        lba,
                        len,
                        why: "the buffer cannot be described with PRPs",
                    });
                }
            };
            let blocks = (n >> self.shared.lba_shift) as u32;
            let sqe = Sqe::read_write(
                opcode,
                self.shared.nsid,
                part_lba,
                blocks,
                prps.prp1,
                prps.prp2,
            );
            self.io.push(&sqe.with_cid(s));
            self.slots[usize::from(s)] = Slot {
                request: r,
                lba: part_lba,
                opcode,
                busy: true,
                epoch: self.epochs.stamp(),
            };
        }
        self.free_slots.truncate(self.free_slots.len() - parts);
        self.free_requests.pop();
        self.requests[usize::from(r)] = Request {
            tag,
            op,
            lba,
            buffer: Some(buffer),
            parts: parts as u32,
            active: true,
            error: None,
        };
        self.in_flight += 1;
        Ok(())
    }

    /// Why a submit is refused once the device has stopped: the first failure, whichever pair
    /// found it.
    fn refusal(&self, op: Op, lba: u64) -> DeviceError {
        self.shared.stopped_error(op, lba)
    }

    /// Stops the device after the controller failed (here or in another pair): disables it (so
    /// it can no longer complete anything, late or not), turns off its DMA and fails every I/O
    /// in flight with the error `error(request index, op, lba)` gives, handing the buffers
    /// back. `why` goes to the other pairs of the controller, which fail theirs with it.
    fn fail_all(
        &mut self,
        out: &mut Vec<Completion>,
        why: Option<DeviceError>,
        error: impl Fn(usize, Op, u64) -> DeviceError,
    ) -> usize {
        self.stopped = true;
        self.shared.stop(why);
        let mut n = 0;
        for (i, r) in self.requests.iter_mut().enumerate() {
            if !r.active {
                continue;
            }
            r.active = false;
            out.push(Completion {
                tag: r.tag,
                op: r.op,
                lba: r.lba,
                buffer: r.buffer.take(),
                result: Err(error(i, r.op, r.lba)),
            });
            self.free_requests.push(i as u16);
            n += 1;
        }
        for (i, s) in self.slots.iter_mut().enumerate() {
            if s.busy {
                s.busy = false;
                self.free_slots.push(i as u16);
            }
        }
        self.in_flight = 0;
        n
    }

    fn check_fatal(&mut self, out: &mut Vec<Completion>) -> usize {
        let v = self.host.read32(regs::CSTS);
        let fatal = (v == u32::MAX || v & csts::CFS != 0).then_some(v);
        match fatal {
            None => 0,
            Some(csts) => {
                let detail = format!(
                    "the NVMe controller {} reported a fatal status (CSTS={csts:#x}, CFS set or \
                     device gone); the device is stopped: reset the controller (rebind or reboot) \
                     before recovery and check its health",
                    self.shared.details.pci
                );
                let why = io_error(Op::Flush, 0, &detail);
                self.fail_all(out, Some(why), |_, op, lba| io_error(op, lba, &detail))
            }
        }
    }

    /// Fails what this pair has in flight once another pair stopped the controller.
    fn check_shared(&mut self, out: &mut Vec<Completion>) -> usize {
        if self.stopped || !self.shared.stopped.load(Ordering::Acquire) {
            return 0;
        }
        let shared = std::sync::Arc::clone(&self.shared);
        self.fail_all(out, None, |_, op, lba| shared.stopped_error(op, lba))
    }

    /// Takes a clock reading (made every `LOOK_EVERY` busy polls) and fails the device when the
    /// oldest command in flight has exceeded the I/O timeout; the error is then the first
    /// failure of the controller (this timeout, unless another pair's failure came first).
    fn check_timeout(&mut self, now: Instant, out: &mut Vec<Completion>) -> Option<DeviceError> {
        self.epochs.observe(now);
        if !self.epochs.may_have_expired(now) {
            return None;
        }
        // The hint may be stale (its command completed): find the true oldest.
        let oldest = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.busy)
            .min_by_key(|(_, s)| s.epoch)
            .map(|(cid, s)| (cid, *s));
        self.epochs.set_oldest(oldest.map(|(_, s)| s.epoch));
        let (cid, slot) = oldest?;
        let waited = self.epochs.age(slot.epoch, now);
        if waited < self.epochs.timeout() {
            return None;
        }
        let cid = cid as u16;
        let within = self.epochs.timeout().min(ABORT_WAIT);
        let aborted = self.shared.lock().ctrl.abort(self.qid, cid, within);
        let abort = match aborted {
            Ok(true) => "an Abort was sent and the controller aborted the command".to_string(),
            Ok(false) => "an Abort was sent but the controller did not abort the command".into(),
            Err(e) => format!("the Abort sent for it failed: {e}"),
        };
        let request = usize::from(slot.request);
        let error = DeviceError::CommandTimeout {
            op: self.requests[request].op,
            lba: slot.lba,
            opcode: slot.opcode,
            cid,
            qid: self.qid,
            waited_ms: waited.as_millis() as u64,
            timeout_ms: self.epochs.timeout().as_millis() as u64,
            abort,
        };
        self.fail_all(out, Some(error.clone()), |i, op, lba| {
            if i == request {
                error.clone()
            } else {
                DeviceError::Failed {
                    op,
                    lba,
                    reason: Box::new(error.clone()),
                }
            }
        });
        Some(self.shared.first_failure().unwrap_or(error))
    }

    /// What `poll` answers once this pair has stopped: the controller's first failure, every
    /// time (nothing more is reaped, so a late completion is never reported); nothing after a
    /// stop without a failure.
    fn stopped_answer(&self) -> Result<usize, DeviceError> {
        match self.shared.first_failure() {
            Some(e) => Err(e),
            None => Ok(0),
        }
    }
}

fn io_error(op: Op, lba: u64, detail: &str) -> DeviceError {
    DeviceError::Io {
        op,
        lba,
        detail: detail.to_string(),
    }
}

impl<H: Host> BlockDevice for NvmeDevice<H> {
    fn info(&self) -> &DeviceInfo {
        &self.shared.info
    }

    /// A zeroed buffer from the DMA arenas, page aligned, of a power-of-two capacity; maps another
    /// arena (up to `NvmeOptions::max_arenas`) when they are full.
    fn alloc_buffer(&mut self, len: usize) -> Result<IoBuffer, DeviceError> {
        if len == 0 {
            return Err(DeviceError::BadRequest {
                op: Op::Allocate,
                lba: 0,
                len,
                why: "a buffer of zero bytes",
            });
        }
        loop {
            if let Some(b) = self.shared.pool.alloc(len)? {
                return Ok(b);
            }
            let size = dma::class_size(len).map_or(len, |(_, s)| s);
            self.map_arena(self.shared.opts.arena_bytes.max(size))?;
        }
    }

    fn queue_depth(&self) -> usize {
        self.shared.queue_depth
    }

    fn submit_write(&mut self, tag: Tag, lba: u64, buffer: IoBuffer) -> Result<(), DeviceError> {
        self.submit_io(Op::Write, tag, lba, buffer, true)
    }

    fn submit_read(&mut self, tag: Tag, lba: u64, buffer: IoBuffer) -> Result<(), DeviceError> {
        self.submit_io(Op::Read, tag, lba, buffer, true)
    }

    /// Queues an NVMe Flush. The controller learns of it at the next `poll`, after every write
    /// whose completion was delivered before this call had completed, so the Flush covers them.
    fn submit_flush(&mut self, tag: Tag) -> Result<(), DeviceError> {
        if self.stopped {
            return Err(self.refusal(Op::Flush, 0));
        }
        let (Some(&r), Some(&s)) = (self.free_requests.last(), self.free_slots.last()) else {
            return Err(DeviceError::QueueFull {
                op: Op::Flush,
                lba: 0,
                depth: self.in_flight,
            });
        };
        self.free_requests.pop();
        self.free_slots.pop();
        self.io.push(&Sqe::flush(self.shared.nsid).with_cid(s));
        self.slots[usize::from(s)] = Slot {
            request: r,
            lba: 0,
            opcode: io::FLUSH,
            busy: true,
            epoch: self.epochs.stamp(),
        };
        self.requests[usize::from(r)] = Request {
            tag,
            op: Op::Flush,
            lba: 0,
            buffer: None,
            parts: 1,
            active: true,
            error: None,
        };
        self.in_flight += 1;
        Ok(())
    }

    /// Once the controller failed, the call that finds it hands back every I/O in flight on
    /// this pair, failed (and returns the [`DeviceError::CommandTimeout`] when it was this
    /// pair's command that timed out); every later call returns the controller's first failure,
    /// whichever pair found it, and nothing more is reaped, so a late completion of a command is
    /// never reported.
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, DeviceError> {
        if self.stopped {
            return self.stopped_answer();
        }
        let failed = self.check_shared(out);
        if failed > 0 || self.stopped {
            return Ok(failed);
        }
        self.io.ring_submissions(&*self.host);
        let mut delivered = 0;
        while let Some(cqe) = self.io.pop() {
            let cid = usize::from(cqe.cid);
            let Some(slot) = self.slots.get(cid).copied().filter(|s| s.busy) else {
                self.io.ring_completions(&*self.host);
                let detail = format!(
                    "the NVMe controller {} completed command id {cid}, which is not in flight; \
                     the device is stopped",
                    self.shared.details.pci
                );
                let why = io_error(Op::Flush, 0, &detail);
                let failed = self.fail_all(out, Some(why), |_, op, lba| io_error(op, lba, &detail));
                return Ok(delivered + failed);
            };
            self.slots[cid].busy = false;
            self.free_slots.push(cid as u16);
            let status = Status::from_field(cqe.status_field());
            let ri = usize::from(slot.request);
            let req = &mut self.requests[ri];
            if !status.is_success() && req.error.is_none() {
                req.error = Some(status.to_error(req.op, slot.lba, slot.opcode));
            }
            req.parts -= 1;
            if req.parts == 0 {
                req.active = false;
                out.push(Completion {
                    tag: req.tag,
                    op: req.op,
                    lba: req.lba,
                    buffer: req.buffer.take(),
                    result: req.error.take().map_or(Ok(()), Err),
                });
                self.free_requests.push(slot.request);
                self.in_flight -= 1;
                delivered += 1;
            }
        }
        self.io.ring_completions(&*self.host);
        if self.in_flight == 0 {
            // Nothing can be stuck: the count starts again with the next command.
            self.busy_polls = 0;
            return Ok(delivered);
        }
        self.busy_polls = self.busy_polls.wrapping_add(1);
        // CSTS is an MMIO read, slow on real hardware, and the clock may be a system call: look
        // every `LOOK_EVERY` polls with commands in flight, whether they reaped or not, never
        // per I/O. Counting only empty polls in a row let a steady stream of completions hide a
        // command that never completes.
        if self.busy_polls.is_multiple_of(LOOK_EVERY) {
            delivered += self.check_fatal(out);
            if !self.stopped {
                let now = self.host.now();
                self.sample = Some(now);
                if let Some(e) = self.check_timeout(now, out) {
                    return Err(e);
                }
            }
        }
        Ok(delivered)
    }

    /// Spins on `poll` until something completes or `timeout` passes; returns at once when
    /// nothing is in flight. The clock is read by `poll` every `LOOK_EVERY` polls with commands
    /// in flight (counted since the pair last had none), so waits that the controller answers
    /// promptly read it at most once per `LOOK_EVERY` polls, never per I/O (in a guest whose
    /// clocksource is HPET each read is a system call); the timeout counts from the first read. Those readings also age the commands in flight: a command older than
    /// `NvmeOptions::io_timeout` fails the wait with [`DeviceError::CommandTimeout`].
    fn wait(&mut self, out: &mut Vec<Completion>, timeout: Duration) -> Result<usize, DeviceError> {
        let mut start = None;
        self.sample = None;
        loop {
            let n = self.poll(out)?;
            if n > 0 || self.in_flight == 0 {
                return Ok(n);
            }
            if let Some(now) = self.sample.take() {
                if now.duration_since(*start.get_or_insert(now)) >= timeout {
                    return Ok(0);
                }
            }
            std::hint::spin_loop();
        }
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}
