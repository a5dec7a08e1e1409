//! A submission/completion queue pair in DMA memory.
//!
//! Submissions only write the entry into memory; the tail doorbell is written once for a batch by
//! [`QueuePair::ring_submissions`]. Completions are found by their phase tag, which the controller
//! inverts on every pass over the queue; the head doorbell is written once per batch reaped.
//! The three points where memory and doorbells must be ordered for the controller call
//! [`super::barrier`].

use std::ptr::NonNull;

use super::barrier;
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
        // The entries (and the PRP lists and data they point at) must be visible to the controller
        // before it learns of them.
        barrier::before_submission_doorbell();
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
        // The rest of the entry (and the data it completes) must not be read before the phase tag
        // that vouches for it.
        barrier::after_phase_tag();
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
        // The reaped entries must be read before the controller may overwrite their slots.
        barrier::before_completion_doorbell();
        host.write32(self.cq_doorbell, u32::from(self.cq_head));
        self.cq_unacked = 0;
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::nvme::barrier::trace::{self, Event};
    use crate::nvme::sys::{HostError, IovaRange, Memlock, Memory};

    /// Records register writes (also into the barrier trace); no controller behind it.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<(usize, u32)>>);

    impl Host for Recorder {
        fn name(&self) -> &str {
            "recorder"
        }
        fn bar_len(&self) -> usize {
            0x2000
        }
        fn read32(&self, _offset: usize) -> u32 {
            0
        }
        fn write32(&self, offset: usize, value: u32) {
            trace::record(Event::Mmio(offset, value));
            self.0.lock().unwrap().push((offset, value));
        }
        fn config_read16(&self, _offset: u64) -> Result<u16, HostError> {
            Ok(0)
        }
        fn config_write16(&self, _offset: u64, _value: u16) -> Result<(), HostError> {
            Ok(())
        }
        fn iova_ranges(&self) -> &[IovaRange] {
            &[]
        }
        fn memlock(&self) -> Memlock {
            Memlock {
                limit: None,
                privileged: true,
            }
        }
        unsafe fn dma_map(&self, _: *mut u8, _: usize, _: u64) -> Result<(), HostError> {
            Ok(())
        }
        fn dma_unmap(&self, _: u64, _: usize) -> Result<(), HostError> {
            Ok(())
        }
    }

    impl Recorder {
        fn take(&self) -> Vec<(usize, u32)> {
            std::mem::take(&mut self.0.lock().unwrap())
        }
    }

    /// Plays the controller: writes a completion for `cid` into CQ slot `slot` with `phase`.
    fn post(cq: NonNull<Cqe>, slot: usize, cid: u16, phase: bool) {
        let c = Cqe {
            cid,
            status: u16::from(phase),
            ..Cqe::default()
        };
        // SAFETY: slot < 4, the CQ memory holds 4 entries.
        unsafe { cq.as_ptr().add(slot).write_volatile(c) };
    }

    /// A 4-entry queue pair for queue 1: SQ in the first page of `mem`, CQ in the second.
    fn pair(mem: &Memory) -> (QueuePair, NonNull<Sqe>, NonNull<Cqe>) {
        let sq = NonNull::new(mem.as_ptr().cast::<Sqe>()).unwrap();
        // SAFETY: the second page of the two-page mapping.
        let cq = NonNull::new(unsafe { mem.as_ptr().add(4096) }.cast::<Cqe>()).unwrap();
        // SAFETY: 4 entries of each fit in their page of zeroed memory that outlives the test.
        (unsafe { QueuePair::new(1, 4, sq, cq, 0) }, sq, cq)
    }

    #[test]
    fn doorbells_batch_and_the_phase_flips_on_wrap_around() {
        let mem = Memory::anonymous(8192).unwrap();
        let (mut q, sq, cq) = pair(&mem);
        let host = Recorder::default();

        for cid in 0..3u16 {
            q.push(&Sqe::flush(1).with_cid(cid));
        }
        assert!(q.ring_submissions(&host));
        assert!(!q.ring_submissions(&host), "nothing new, no doorbell");
        assert_eq!(host.take(), vec![(0x1008, 3)]);
        // SAFETY: slot 2 of the SQ was written above.
        assert_eq!(unsafe { sq.as_ptr().add(2).read() }.cid(), 2);

        for (slot, cid) in [(0, 10), (1, 11), (2, 12)] {
            post(cq, slot, cid, true);
        }
        let cids: Vec<u16> = std::iter::from_fn(|| q.pop()).map(|c| c.cid).collect();
        assert_eq!(cids, vec![10, 11, 12]);
        assert!(q.ring_completions(&host));
        assert!(!q.ring_completions(&host));
        assert_eq!(host.take(), vec![(0x100C, 3)]);

        // The tail wraps: slot 3, then slots 0 and 1 of the next pass.
        for cid in 3..6u16 {
            q.push(&Sqe::flush(1).with_cid(cid));
        }
        q.ring_submissions(&host);
        assert_eq!(host.take(), vec![(0x1008, 2)]);
        post(cq, 3, 13, true);
        post(cq, 0, 14, false);
        post(cq, 1, 15, false);
        let cids: Vec<u16> = std::iter::from_fn(|| q.pop()).map(|c| c.cid).collect();
        assert_eq!(cids, vec![13, 14, 15], "second pass entries carry phase 0");
        // Slot 2 still holds the first pass's entry (phase 1): not new.
        assert!(q.pop().is_none());
        q.ring_completions(&host);
        assert_eq!(host.take(), vec![(0x100C, 2)]);
    }

    #[test]
    fn a_rewind_drops_unrung_submissions() {
        let mem = Memory::anonymous(8192).unwrap();
        let (mut q, _, _) = pair(&mem);
        let host = Recorder::default();
        let t = q.tail();
        q.push(&Sqe::flush(1));
        q.rewind(t);
        assert!(!q.ring_submissions(&host));
        assert!(host.take().is_empty());
    }

    /// No observable test of the barriers themselves is possible on x86-64 (TSO: the hardware
    /// never reorders what they order), so this pins where they are: each doorbell write comes
    /// right after its barrier, and a completion is read only after the phase barrier. It fails if
    /// a barrier is dropped or a doorbell is moved before it.
    #[test]
    fn each_doorbell_follows_its_barrier_and_each_completion_the_phase_barrier() {
        let mem = Memory::anonymous(8192).unwrap();
        let (mut q, _, cq) = pair(&mem);
        let host = Recorder::default();
        trace::take();

        q.push(&Sqe::flush(1).with_cid(7));
        q.push(&Sqe::flush(1).with_cid(8));
        assert!(trace::take().is_empty(), "pushing only writes memory");
        q.ring_submissions(&host);
        assert_eq!(
            trace::take(),
            [Event::BeforeSubmissionDoorbell, Event::Mmio(0x1008, 2)]
        );

        assert!(q.pop().is_none());
        assert!(
            trace::take().is_empty(),
            "no new phase tag, nothing read, no barrier"
        );
        post(cq, 0, 7, true);
        post(cq, 1, 8, true);
        assert_eq!(q.pop().map(|c| c.cid), Some(7));
        assert_eq!(q.pop().map(|c| c.cid), Some(8));
        assert!(q.pop().is_none());
        assert_eq!(trace::take(), [Event::AfterPhaseTag, Event::AfterPhaseTag]);
        q.ring_completions(&host);
        assert_eq!(
            trace::take(),
            [Event::BeforeCompletionDoorbell, Event::Mmio(0x100C, 2)]
        );

        // Nothing new: no doorbell, and no barrier paid for it.
        assert!(!q.ring_submissions(&host));
        assert!(!q.ring_completions(&host));
        assert!(trace::take().is_empty());
    }
}
