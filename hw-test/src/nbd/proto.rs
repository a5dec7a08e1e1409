//! NBD wire constants (fixed newstyle negotiation, simple replies) and the big-endian field
//! helpers both ends of a connection use. Values from the NBD protocol document (doc/proto.md of
//! the NetworkBlockDevice project).

use std::io::{self, Read, Write};

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": the server's newstyle greeting and the prefix of every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_NO_ZEROES: u32 = 1 << 1;

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
const REP_ERR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR | 1;
pub const REP_ERR_INVALID: u32 = REP_ERR | 3;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR | 6;

pub const INFO_EXPORT: u16 = 0;
pub const INFO_BLOCK_SIZE: u16 = 3;

pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_FLAG_FUA: u16 = 1 << 0;

pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;

/// Longest option payload the server reads (export names are short); longer ones end the
/// connection rather than make the server buffer whatever a peer claims.
pub const MAX_OPTION_LEN: u32 = 4096;
/// Largest read or write served (the protocol's customary 32 MiB ceiling), advertised as the
/// maximum block size.
pub const MAX_REQUEST: u32 = 32 << 20;
/// Requests must be aligned to the tear granularity of the crash model.
pub const MIN_BLOCK: u32 = 512;
pub const PREFERRED_BLOCK: u32 = 4096;

pub fn read_u16(r: &mut impl Read) -> io::Result<u16> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}

pub fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

pub fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// One transmission-phase request header (the payload of a write follows it on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

impl Request {
    pub const LEN: usize = 28;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.handle.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// `None` when the magic is wrong: the stream is out of step and cannot be trusted further.
    pub fn decode(b: &[u8; Self::LEN]) -> Option<Request> {
        let field =
            |r: std::ops::Range<usize>| b[r].iter().fold(0u64, |a, &x| (a << 8) | u64::from(x));
        if field(0..4) != u64::from(REQUEST_MAGIC) {
            return None;
        }
        Some(Request {
            flags: field(4..6) as u16,
            kind: field(6..8) as u16,
            handle: field(8..16),
            offset: field(16..24),
            length: field(24..28) as u32,
        })
    }
}

/// A simple reply header; a successful read's data follows it.
pub fn write_simple_reply(w: &mut impl Write, error: u32, handle: u64) -> io::Result<()> {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    w.write_all(&b)
}

/// An option reply header followed by its data.
pub fn write_option_reply(
    w: &mut impl Write,
    option: u32,
    kind: u32,
    data: &[u8],
) -> io::Result<()> {
    let len = u32::try_from(data.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "option reply over 4 GiB"))?;
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(data);
    w.write_all(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_header_round_trips_and_rejects_a_bad_magic() {
        let r = Request {
            flags: CMD_FLAG_FUA,
            kind: CMD_WRITE,
            handle: 0x0102_0304_0506_0708,
            offset: 1 << 40,
            length: 4096,
        };
        let mut b = r.encode();
        assert_eq!(Request::decode(&b), Some(r));
        b[0] ^= 1;
        assert_eq!(Request::decode(&b), None);
    }
}
