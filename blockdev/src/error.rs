use std::fmt;

/// The kind of I/O an error or completion belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Write,
    Read,
    Flush,
    Open,
    Allocate,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::Flush => "flush",
            Op::Open => "open",
            Op::Allocate => "buffer allocation",
        })
    }
}

/// Every way a device operation fails; each names the operation and the block address.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DeviceError {
    #[error("{op} of {len} bytes at block {lba} refused: {why}")]
    BadRequest {
        op: Op,
        lba: u64,
        len: usize,
        why: &'static str,
    },
    #[error("{op} at block {lba} (+{blocks} blocks) is past the end of the device ({capacity_blocks} blocks)")]
    OutOfRange {
        op: Op,
        lba: u64,
        blocks: u64,
        capacity_blocks: u64,
    },
    #[error("{op} at block {lba} refused: the device queue is full ({depth} in flight)")]
    QueueFull { op: Op, lba: u64, depth: usize },
    #[error("{op} at block {lba} failed: {detail}")]
    Io { op: Op, lba: u64, detail: String },
    #[error("{op} of {path} failed: {detail}")]
    Open {
        op: Op,
        path: String,
        detail: String,
    },
    #[error("the device is stopped after an earlier failure; {op} at block {lba} refused")]
    Stopped { op: Op, lba: u64 },
    #[error("timed out after {millis} ms waiting for {op} completions")]
    Timeout { op: Op, millis: u64 },
    /// An NVMe command completed with an error status. `lba` is the first block of the failing
    /// command, which for a split transfer may lie inside the caller's I/O.
    #[error(
        "{op} at block {lba} failed: NVMe command {opcode:#04x} completed with status \
         SCT {sct:#x} / SC {sc:#04x} ({meaning}), do-not-retry={dnr}"
    )]
    Nvme {
        op: Op,
        lba: u64,
        opcode: u8,
        sct: u8,
        sc: u8,
        dnr: bool,
        meaning: &'static str,
    },
    /// An NVMe command did not complete within the I/O timeout. The device is stopped: nothing
    /// that was in flight is known to have reached the medium, and a late completion of the
    /// command is never reported.
    #[error(
        "{op} at block {lba} timed out: NVMe command {opcode:#04x} (command id {cid} on \
         submission queue {qid}) had not completed after at least {waited_ms} ms (io_timeout \
         {timeout_ms} ms); {abort}; the device is stopped and nothing that was in flight is known \
         to be durable: check the drive (SMART, kernel log) and reset it before recovery"
    )]
    CommandTimeout {
        op: Op,
        lba: u64,
        opcode: u8,
        cid: u16,
        qid: u16,
        waited_ms: u64,
        timeout_ms: u64,
        /// What became of the Abort the driver sent.
        abort: String,
    },
    /// The device was stopped by an earlier failure (`reason`), which fails this I/O too.
    #[error("{op} at block {lba} failed: the device stopped after an earlier failure: {reason}")]
    Failed {
        op: Op,
        lba: u64,
        reason: Box<DeviceError>,
    },
}

impl DeviceError {
    pub fn op(&self) -> Op {
        match self {
            DeviceError::BadRequest { op, .. }
            | DeviceError::OutOfRange { op, .. }
            | DeviceError::QueueFull { op, .. }
            | DeviceError::Io { op, .. }
            | DeviceError::Open { op, .. }
            | DeviceError::Stopped { op, .. }
            | DeviceError::Timeout { op, .. }
            | DeviceError::Nvme { op, .. }
            | DeviceError::CommandTimeout { op, .. }
            | DeviceError::Failed { op, .. } => *op,
        }
    }
}
