//! Controller registers in BAR0 (NVMe base spec §3.1) and the doorbell layout.

pub const CAP: usize = 0x00;
pub const VS: usize = 0x08;
pub const CC: usize = 0x14;
pub const CSTS: usize = 0x1C;
pub const AQA: usize = 0x24;
pub const ASQ: usize = 0x28;
pub const ACQ: usize = 0x30;
/// Doorbells start here; each queue has a tail (SQ) and a head (CQ) doorbell.
pub const DOORBELLS: usize = 0x1000;

/// Controller Capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap(pub u64);

impl Cap {
    /// Largest queue the controller supports, in entries (MQES is 0's based).
    pub fn max_queue_entries(self) -> u32 {
        (self.0 & 0xFFFF) as u32 + 1
    }
    /// Queues must be physically (here: IOVA-) contiguous.
    pub fn contiguous_queues_required(self) -> bool {
        self.0 >> 16 & 1 == 1
    }
    /// How long one CSTS.RDY transition may take, in milliseconds (CAP.TO is in 500 ms units).
    pub fn ready_timeout_ms(self) -> u64 {
        (self.0 >> 24 & 0xFF) * 500
    }
    /// Doorbell stride exponent: doorbells are `4 << DSTRD` bytes apart.
    pub fn doorbell_stride(self) -> u32 {
        (self.0 >> 32 & 0xF) as u32
    }
    /// The NVM command set is supported (CSS bit 0).
    pub fn nvm_command_set(self) -> bool {
        self.0 >> 37 & 1 == 1
    }
    pub fn min_page_size(self) -> usize {
        1usize << (12 + (self.0 >> 48 & 0xF))
    }
    pub fn max_page_size(self) -> usize {
        1usize << (12 + (self.0 >> 52 & 0xF))
    }
}

/// Controller Configuration bits.
pub mod cc {
    pub const EN: u32 = 1;
    pub const SHN_MASK: u32 = 0b11 << 14;
    pub const SHN_NORMAL: u32 = 0b01 << 14;

    /// CC for enabling: NVM command set, round robin, `page` bytes per memory page, 64-byte SQ
    /// entries and 16-byte CQ entries.
    pub fn enable(page_size: usize) -> u32 {
        let mps = page_size.trailing_zeros().saturating_sub(12);
        EN | (mps & 0xF) << 7 | 6 << 16 | 4 << 20
    }
}

/// Controller Status bits.
pub mod csts {
    pub const RDY: u32 = 1;
    pub const CFS: u32 = 1 << 1;
    pub const SHST_MASK: u32 = 0b11 << 2;
    pub const SHST_COMPLETE: u32 = 0b10 << 2;
}

/// Offset of queue `qid`'s submission tail doorbell.
pub fn sq_tail_doorbell(qid: u16, dstrd: u32) -> usize {
    DOORBELLS + (2 * qid as usize) * (4usize << dstrd)
}

/// Offset of queue `qid`'s completion head doorbell.
pub fn cq_head_doorbell(qid: u16, dstrd: u32) -> usize {
    DOORBELLS + (2 * qid as usize + 1) * (4usize << dstrd)
}

/// Admin Queue Attributes for queues of `sq` and `cq` entries (the fields are 0's based).
pub fn aqa(sq: u16, cq: u16) -> u32 {
    (u32::from(cq) - 1) << 16 | (u32::from(sq) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_decode_as_qemu_reports_them() {
        // MQES 0x7FF, CQR, TO 0xF, DSTRD 0, CSS NVM, MPSMIN 0, MPSMAX 4.
        let cap = Cap(0x7FF | 1 << 16 | 0xF << 24 | 1 << 37 | 4 << 52);
        assert_eq!(cap.max_queue_entries(), 2048);
        assert!(cap.contiguous_queues_required());
        assert_eq!(cap.ready_timeout_ms(), 7500);
        assert_eq!(cap.doorbell_stride(), 0);
        assert!(cap.nvm_command_set());
        assert_eq!(cap.min_page_size(), 4096);
        assert_eq!(cap.max_page_size(), 65536);
    }

    #[test]
    fn doorbells_follow_the_stride() {
        assert_eq!(sq_tail_doorbell(0, 0), 0x1000);
        assert_eq!(cq_head_doorbell(0, 0), 0x1004);
        assert_eq!(sq_tail_doorbell(1, 0), 0x1008);
        assert_eq!(cq_head_doorbell(1, 0), 0x100C);
        assert_eq!(sq_tail_doorbell(1, 2), 0x1000 + 2 * 16);
        assert_eq!(cq_head_doorbell(1, 2), 0x1000 + 3 * 16);
    }

    #[test]
    fn enable_and_queue_attributes_encode() {
        assert_eq!(cc::enable(4096), 0x0046_0001);
        assert_eq!(cc::enable(8192), 0x0046_0081);
        assert_eq!(aqa(32, 32), 0x001F_001F);
    }
}
