//! A submission/completion queue pair in DMA memory.
//!
//! Submissions only write the entry into memory; the tail doorbell is written once for a batch by
//! [`QueuePair::ring_submissions`]. Completions are found by their phase tag, which the controller
//! inverts on every pass over the queue; the head doorbell is written once per batch reaped.

use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};

use super::command::{Cqe, Sqe};
use super::regs;
use super::sys::Host;

pub struct QueuePair {
    sq: NonNull<Sqe>,
    cq: NonNull<Cqe>,
    entries: u16,
    sq_tail: u16,
    /// Tail value last written to the doorbell.
    sq_rung: u16,
    cq_head: u16,
    /// The phase tag a new completion carries on this pass.
    phase: bool,
    cq_unacked: u16,
    sq_doorbell: usize,
    cq_doorbell: usize,
}

// SAFETY: the queue memory is owned by the device that owns the pair; the pair is only used from
// the thread that owns the device at a time.
unsafe impl Send for QueuePair {}

impl QueuePair {
    /// A pair over `entries`-entry queues at `sq` and `cq`, which must be zeroed, live as long as
    /// the pair, and be reachable by the controller.
    ///
    /// # Safety
    /// `sq` must point to `entries` Sqe and `cq` to `entries` Cqe of memory nothing else writes
    /// except the controller (into the CQ).
    pub unsafe fn new(
        qid: u16,
        entries: u16,
        sq: NonNull<Sqe>,
        cq: NonNull<Cqe>,
        dstrd: u32,
    ) -> QueuePair {
        QueuePair {
            sq,
            cq,
            entries,
            sq_tail: 0,
            sq_rung: 0,
            cq_head: 0,
            phase: true,
            cq_unacked: 0,
            sq_doorbell: regs::sq_tail_doorbell(qid, dstrd),
            cq_doorbell: regs::cq_head_doorbell(qid, dstrd),
        }
    }

    pub fn entries(&self) -> u16 {
        self.entries
    }

    fn next(&self, i: u16) -> u16 {
        if i + 1 == self.entries {
            0
        } else {
            i + 1
        }
    }

    /// Where the next submission goes; a caller that must undo a partly built batch rewinds to it.
    pub fn tail(&self) -> u16 {
        self.sq_tail
    }

    /// Drops submissions written after `tail` that were not yet rung.
    pub fn rewind(&mut self, tail: u16) {
        self.sq_tail = tail;
    }

    /// Writes `sqe` into the next slot. The caller keeps at most `entries - 1` commands
    /// outstanding (one command per free command slot), so the queue cannot overflow.
    pub fn push(&mut self, sqe: &Sqe) {
        // SAFETY: sq_tail < entries, so the slot is inside the queue memory we own.
        unsafe {
            self.sq
                .as_ptr()
                .add(usize::from(self.sq_tail))
                .write_volatile(*sqe)
        };
        self.sq_tail = self.next(self.sq_tail);
    }

    /// Tells the controller about every entry pushed since the last call; one MMIO write, none
    /// when nothing is new. Returns whether it rang.
    pub fn ring_submissions<H: Host>(&mut self, host: &H) -> bool {
        if self.sq_tail == self.sq_rung {
            return false;
        }
        // The entries must be visible in memory before the controller learns of them.
        fence(Ordering::Release);
        host.write32(self.sq_doorbell, u32::from(self.sq_tail));
        self.sq_rung = self.sq_tail;
        true
    }

    /// The next completion, if the controller has posted one.
    pub fn pop(&mut self) -> Option<Cqe> {
        // SAFETY: cq_head < entries; the entry lies in the CQ memory, which the controller writes
        // (hence volatile).
        let slot = unsafe { self.cq.as_ptr().add(usize::from(self.cq_head)) };
        // SAFETY: as above; the status word is the last 2 bytes of the 16-byte entry.
        let status = unsafe { std::ptr::addr_of!((*slot).status).read_volatile() };
        if (status & 1 == 1) != self.phase {
            return None;
        }
        // The rest of the entry must not be read before the phase tag that vouches for it.
        fence(Ordering::Acquire);
        // SAFETY: as above.
        let cqe = unsafe { slot.read_volatile() };
        self.cq_head = self.next(self.cq_head);
        if self.cq_head == 0 {
            self.phase = !self.phase;
        }
        self.cq_unacked += 1;
        Some(cqe)
    }

    /// Gives the controller back the completion slots reaped since the last call; one MMIO write,
    /// none when nothing was reaped.
    pub fn ring_completions<H: Host>(&mut self, host: &H) -> bool {
        if self.cq_unacked == 0 {
            return false;
        }
        host.write32(self.cq_doorbell, u32::from(self.cq_head));
        self.cq_unacked = 0;
        true
    }
}
