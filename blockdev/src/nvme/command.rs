//! Submission and completion queue entries (64 and 16 bytes) and the commands the driver sends.

/// Admin opcodes.
pub mod admin {
    pub const DELETE_IO_SQ: u8 = 0x00;
    pub const CREATE_IO_SQ: u8 = 0x01;
    pub const DELETE_IO_CQ: u8 = 0x04;
    pub const CREATE_IO_CQ: u8 = 0x05;
    pub const ABORT: u8 = 0x08;
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const IDENTIFY: u8 = 0x06;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0A;
}

/// NVM I/O opcodes.
pub mod io {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
}

/// Identify CNS values.
pub const CNS_NAMESPACE: u32 = 0x00;
pub const CNS_CONTROLLER: u32 = 0x01;

/// Feature identifiers.
pub const FEAT_VOLATILE_WRITE_CACHE: u32 = 0x06;
/// Log page identifier of SMART / Health Information.
pub const LOG_SMART: u32 = 0x02;
pub const FEAT_NUMBER_OF_QUEUES: u32 = 0x07;

/// A submission queue entry.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sqe {
    /// Opcode 7:0, fuse 9:8, PSDT 15:14 (0 = PRPs), command id 31:16.
    pub cdw0: u32,
    pub nsid: u32,
    pub cdw2: u32,
    pub cdw3: u32,
    pub mptr: u64,
    pub prp1: u64,
    pub prp2: u64,
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
}

const _: () = assert!(std::mem::size_of::<Sqe>() == 64);
const _: () = assert!(std::mem::size_of::<Cqe>() == 16);

impl Sqe {
    fn new(opcode: u8, nsid: u32) -> Sqe {
        Sqe {
            cdw0: u32::from(opcode),
            nsid,
            ..Sqe::default()
        }
    }

    pub fn opcode(&self) -> u8 {
        self.cdw0 as u8
    }

    pub fn cid(&self) -> u16 {
        (self.cdw0 >> 16) as u16
    }

    pub fn with_cid(mut self, cid: u16) -> Sqe {
        self.cdw0 = (self.cdw0 & 0xFFFF) | u32::from(cid) << 16;
        self
    }

    pub fn identify(cns: u32, nsid: u32, buffer: u64) -> Sqe {
        Sqe {
            prp1: buffer,
            cdw10: cns,
            ..Sqe::new(admin::IDENTIFY, nsid)
        }
    }

    /// Get Log Page `lid`, `bytes` long (a multiple of 4), controller-wide (NSID FFFFFFFFh).
    pub fn get_log_page(lid: u32, bytes: u32, buffer: u64) -> Sqe {
        let numd = bytes / 4 - 1;
        Sqe {
            prp1: buffer,
            cdw10: (numd & 0xFFFF) << 16 | (lid & 0xFF),
            cdw11: numd >> 16,
            ..Sqe::new(admin::GET_LOG_PAGE, 0xFFFF_FFFF)
        }
    }

    pub fn get_features(fid: u32) -> Sqe {
        Sqe {
            cdw10: fid,
            ..Sqe::new(admin::GET_FEATURES, 0)
        }
    }

    pub fn set_features(fid: u32, cdw11: u32) -> Sqe {
        Sqe {
            cdw10: fid,
            cdw11,
            ..Sqe::new(admin::SET_FEATURES, 0)
        }
    }

    /// A physically contiguous, polled (interrupts disabled) completion queue.
    pub fn create_io_cq(qid: u16, entries: u16, base: u64) -> Sqe {
        Sqe {
            prp1: base,
            cdw10: (u32::from(entries) - 1) << 16 | u32::from(qid),
            cdw11: 1,
            ..Sqe::new(admin::CREATE_IO_CQ, 0)
        }
    }

    pub fn create_io_sq(qid: u16, entries: u16, cqid: u16, base: u64) -> Sqe {
        Sqe {
            prp1: base,
            cdw10: (u32::from(entries) - 1) << 16 | u32::from(qid),
            cdw11: u32::from(cqid) << 16 | 1,
            ..Sqe::new(admin::CREATE_IO_SQ, 0)
        }
    }

    pub fn delete_io_sq(qid: u16) -> Sqe {
        Sqe {
            cdw10: u32::from(qid),
            ..Sqe::new(admin::DELETE_IO_SQ, 0)
        }
    }

    pub fn delete_io_cq(qid: u16) -> Sqe {
        Sqe {
            cdw10: u32::from(qid),
            ..Sqe::new(admin::DELETE_IO_CQ, 0)
        }
    }

    /// Abort of command `cid` on submission queue `sqid` (CDW10: SQID 15:0, CID 31:16).
    pub fn abort(sqid: u16, cid: u16) -> Sqe {
        Sqe {
            cdw10: u32::from(cid) << 16 | u32::from(sqid),
            ..Sqe::new(admin::ABORT, 0)
        }
    }

    /// Read or Write of `blocks` (1..=65536) logical blocks at `slba`.
    pub fn read_write(opcode: u8, nsid: u32, slba: u64, blocks: u32, prp1: u64, prp2: u64) -> Sqe {
        Sqe {
            prp1,
            prp2,
            cdw10: slba as u32,
            cdw11: (slba >> 32) as u32,
            cdw12: (blocks - 1) & 0xFFFF,
            ..Sqe::new(opcode, nsid)
        }
    }

    pub fn flush(nsid: u32) -> Sqe {
        Sqe::new(io::FLUSH, nsid)
    }

    pub fn slba(&self) -> u64 {
        u64::from(self.cdw11) << 32 | u64::from(self.cdw10)
    }

    /// Number of logical blocks of a read or write.
    pub fn blocks(&self) -> u32 {
        (self.cdw12 & 0xFFFF) + 1
    }
}

/// A completion queue entry.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cqe {
    /// Command specific result.
    pub dw0: u32,
    pub dw1: u32,
    pub sq_head: u16,
    pub sq_id: u16,
    pub cid: u16,
    /// Phase tag in bit 0, status field in 15:1.
    pub status: u16,
}

impl Cqe {
    pub fn phase(&self) -> bool {
        self.status & 1 == 1
    }

    /// The 15-bit status field without the phase tag.
    pub fn status_field(&self) -> u16 {
        self.status >> 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_encodes_lba_count_and_cid() {
        let s = Sqe::read_write(io::WRITE, 1, 0x1_2345_6789, 8, 0x1000, 0x2000).with_cid(77);
        assert_eq!(s.opcode(), io::WRITE);
        assert_eq!(s.cid(), 77);
        assert_eq!(s.slba(), 0x1_2345_6789);
        assert_eq!(s.cdw12, 7);
        assert_eq!(s.blocks(), 8);
        assert_eq!((s.prp1, s.prp2, s.nsid), (0x1000, 0x2000, 1));
    }

    #[test]
    fn queue_creation_is_polled_and_contiguous() {
        let cq = Sqe::create_io_cq(1, 256, 0x10000);
        assert_eq!(cq.cdw10, 255 << 16 | 1);
        assert_eq!(cq.cdw11, 1, "PC=1, IEN=0");
        let sq = Sqe::create_io_sq(1, 256, 1, 0x20000);
        assert_eq!(sq.cdw11, 1 << 16 | 1);
    }

    #[test]
    fn abort_names_the_queue_and_the_command() {
        let a = Sqe::abort(1, 0x1234);
        assert_eq!(a.opcode(), 0x08);
        assert_eq!(a.cdw10, 0x1234_0001);
    }
}
