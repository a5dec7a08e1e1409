//! Completion status decoding: the 15-bit status field of a completion entry (NVMe base spec
//! "Completion Queue Entry: Status Field") into an error that names SCT/SC, DNR, the opcode and the
//! block address.

use crate::{DeviceError, Op};

/// A decoded completion status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// Status Code Type: 0 generic, 1 command specific, 2 media and data integrity, 3 path.
    pub sct: u8,
    /// Status Code within the type.
    pub sc: u8,
    /// Command Retry Delay index.
    pub crd: u8,
    /// More status information is in the Error Information log page.
    pub more: bool,
    /// Do Not Retry: the same command is expected to fail again.
    pub dnr: bool,
}

impl Status {
    /// Decodes the status field (phase tag already removed).
    pub fn from_field(field: u16) -> Status {
        Status {
            sc: field as u8,
            sct: (field >> 8 & 0x7) as u8,
            crd: (field >> 11 & 0x3) as u8,
            more: field >> 13 & 1 == 1,
            dnr: field >> 14 & 1 == 1,
        }
    }

    /// The field for a status (used by the software controller).
    pub fn field(sct: u8, sc: u8, dnr: bool) -> u16 {
        u16::from(sc) | u16::from(sct & 0x7) << 8 | u16::from(dnr) << 14
    }

    pub fn is_success(&self) -> bool {
        self.sct == 0 && self.sc == 0
    }

    /// What the spec calls this status, for error messages.
    pub fn meaning(&self) -> &'static str {
        match (self.sct, self.sc) {
            (0, 0x00) => "successful completion",
            (0, 0x01) => "invalid command opcode",
            (0, 0x02) => "invalid field in command",
            (0, 0x03) => "command ID conflict",
            (0, 0x04) => "data transfer error",
            (0, 0x05) => "commands aborted due to power loss notification",
            (0, 0x06) => "internal error",
            (0, 0x07) => "command abort requested",
            (0, 0x08) => "command aborted due to SQ deletion",
            (0, 0x0B) => "invalid namespace or format",
            (0, 0x0C) => "command sequence error",
            (0, 0x13) => "PRP offset invalid",
            (0, 0x80) => "LBA out of range",
            (0, 0x81) => "capacity exceeded",
            (0, 0x82) => "namespace not ready",
            (1, 0x00) => "completion queue invalid",
            (1, 0x01) => "invalid queue identifier",
            (1, 0x02) => "invalid queue size",
            (1, 0x0C) => "invalid queue deletion",
            (2, 0x80) => "write fault",
            (2, 0x81) => "unrecovered read error",
            (2, 0x82) => "end-to-end guard check error",
            (2, 0x86) => "access denied",
            (2, 0x87) => "deallocated or unwritten logical block",
            (0, _) => "generic command status (unknown code)",
            (1, _) => "command specific status (unknown code)",
            (2, _) => "media and data integrity error (unknown code)",
            (3, _) => "path related status",
            _ => "vendor specific or reserved status type",
        }
    }

    /// The error a failed command becomes.
    pub fn to_error(self, op: Op, lba: u64, opcode: u8) -> DeviceError {
        DeviceError::Nvme {
            op,
            lba,
            opcode,
            sct: self.sct,
            sc: self.sc,
            dnr: self.dnr,
            meaning: self.meaning(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_decode_and_round_trip() {
        let s = Status::from_field(Status::field(2, 0x80, true));
        assert_eq!(
            (s.sct, s.sc, s.dnr, s.more, s.crd),
            (2, 0x80, true, false, 0)
        );
        assert_eq!(s.meaning(), "write fault");
        assert!(!s.is_success());
        assert!(Status::from_field(0).is_success());
        // CRD and More sit between SCT and DNR.
        let s = Status::from_field(0b0110_0001_1000_0000 | 0x81);
        assert_eq!(
            (s.sct, s.sc, s.crd, s.more, s.dnr),
            (1, 0x81, 0, true, true)
        );
        let s = Status::from_field(3 << 11 | 0x06);
        assert_eq!((s.sct, s.sc, s.crd), (0, 0x06, 3));
    }

    #[test]
    fn the_error_message_names_everything_an_operator_needs() {
        let e = Status::from_field(Status::field(0, 0x80, true)).to_error(Op::Write, 1234, 0x01);
        let msg = e.to_string();
        for want in [
            "write",
            "1234",
            "0x01",
            "SCT 0x0",
            "SC 0x80",
            "LBA out of range",
            "do-not-retry=true",
        ] {
            assert!(msg.contains(want), "{msg:?} lacks {want:?}");
        }
        assert_eq!(e.op(), Op::Write);
    }
}
