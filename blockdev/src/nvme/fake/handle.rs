//! The test's side of the software controller: fault injection (failed, held and stalled
//! commands, failed DMA maps) and inspection (stats, the command log, the namespace's bytes).

use super::*;

impl FakeHandle {
    pub fn stats(&self) -> FakeStats {
        lock(&self.state).stats.clone()
    }

    /// Sets CSTS.CFS: the controller stops executing commands.
    pub fn set_fatal(&self) {
        lock(&self.state).csts |= csts::CFS;
    }

    /// The next command with `opcode` on an I/O queue fails with this status instead of running.
    pub fn fail_next(&self, opcode: u8, sct: u8, sc: u8, dnr: bool) {
        lock(&self.state).fail_next = Some((opcode, Status::field(sct, sc, dnr)));
    }

    /// The next Create I/O Completion Queue fails with Internal Error (SC 06h).
    pub fn fail_next_queue_creation(&self) {
        lock(&self.state).fail_create = true;
    }

    /// The next DMA mapping fails (as with a too low RLIMIT_MEMLOCK inside the kernel).
    pub fn fail_next_dma_map(&self) {
        lock(&self.state).fail_dma_map = true;
    }

    /// While held, completions of I/O commands are kept back; `release` posts them in reverse
    /// order, so tests see completions out of submission order.
    pub fn hold_completions(&self) {
        lock(&self.state).hold = true;
    }

    pub fn release(&self) {
        let mut s = lock(&self.state);
        s.hold = false;
        while let Some((qid, cqe)) = s.held.pop() {
            s.unhold(qid);
            s.post(qid, cqe);
        }
    }

    /// From now on every I/O command with `opcode` is stalled: the controller takes it off the
    /// submission queue and executes it but never completes it (a hung command), unless it is
    /// aborted or [`FakeHandle::release_stalled`] is called.
    pub fn stall_opcode(&self, opcode: u8) {
        lock(&self.state).stall_opcode = Some(opcode);
    }

    /// Stalls one I/O command: the one after `n` more (0 = the next).
    pub fn stall_nth(&self, n: u64) {
        lock(&self.state).stall_countdown = Some(n);
    }

    /// The controller answers Abort with "not aborted" and keeps the command stalled.
    pub fn ignore_aborts(&self) {
        lock(&self.state).ignore_aborts = true;
    }

    /// (SQID, CID) of the commands stalled now.
    pub fn stalled(&self) -> Vec<(u16, u16)> {
        let s = lock(&self.state);
        s.stalled.iter().map(|(_, c)| (c.sq_id, c.cid)).collect()
    }

    /// Posts the completions of the stalled commands, late, and stalls nothing more.
    pub fn release_stalled(&self) {
        let mut s = lock(&self.state);
        s.stall_opcode = None;
        s.stall_countdown = None;
        while let Some((cqid, cqe)) = s.stalled.pop() {
            s.unhold(cqid);
            s.post(cqid, cqe);
        }
    }

    /// Records (opcode, slba, blocks) of every I/O command from now on.
    pub fn log_commands(&self) {
        lock(&self.state).log = Some(Vec::new());
    }

    pub fn command_log(&self) -> Vec<(u8, u64, u32)> {
        lock(&self.state).log.clone().unwrap_or_default()
    }

    /// Bytes of the namespace.
    pub fn peek(&self, byte_offset: usize, len: usize) -> Vec<u8> {
        lock(&self.state).media[byte_offset..byte_offset + len].to_vec()
    }

    /// The PCI command register as the driver left it.
    pub fn pci_command(&self) -> u16 {
        lock(&self.state).pci_command
    }

    /// A new host side for the same controller and namespace, as after the process restarted:
    /// the controller keeps its registers (a driver must reset it), the namespace keeps its data,
    /// and the old process's DMA mappings are gone.
    pub fn reconnect(&self) -> FakeHost {
        let mut s = lock(&self.state);
        s.maps.clear();
        FakeHost {
            name: "fake:0000:00:04.0".into(),
            timed: s.cfg.timed,
            ranges: s.cfg.iova_ranges.clone(),
            memlock: s.cfg.memlock,
            bar_len: s.cfg.bar_len,
            state: Arc::clone(&self.state),
        }
    }

    /// Number of live DMA mappings.
    pub fn live_mappings(&self) -> usize {
        lock(&self.state).maps.len()
    }
}
