//! The bytes of a rig record: who sent it, and a checksum of itself. The body is a pure function
//! of (run, id), so the verifier regenerates what was sent and compares bit for bit.

use blockdev::sim::Rng;

/// "nvrg": marks a rig record.
const MAGIC: u32 = 0x6e76_7267;
/// magic, run, cycle, producer, seq, body length.
const HEADER: usize = 4 + 8 + 4 + 4 + 8 + 4;
const TRAILER: usize = 4;

/// Names one record of a run: the cycle it was first sent in, its producer, and its place in that
/// producer's sequence. A resent record keeps its id (and so its bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct RecordId {
    pub cycle: u32,
    pub producer: u32,
    pub seq: u64,
}

impl std::fmt::Display for RecordId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "c{}/p{}/#{}", self.cycle, self.producer, self.seq)
    }
}

/// Why served bytes are not a sound rig record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadFault {
    #[error("{0} bytes: shorter than a rig record")]
    Short(usize),
    #[error("magic {0:#010x}: not a rig record")]
    Magic(u32),
    #[error("body length {claimed} does not fit in {len} bytes")]
    Length { claimed: u32, len: usize },
    #[error("checksum {stored:#010x} stored, {computed:#010x} computed")]
    Checksum { stored: u32, computed: u32 },
}

fn mix(run: u64, id: RecordId) -> u64 {
    let mut x = run ^ (u64::from(id.cycle) << 40) ^ (u64::from(id.producer) << 20) ^ id.seq;
    // splitmix64 finaliser: neighbouring ids get unrelated streams.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The record for `id` in `run`: its body length is drawn from `body_len` (inclusive bounds).
pub fn encode(run: u64, id: RecordId, body_len: (usize, usize)) -> Vec<u8> {
    let mut rng = Rng::new(mix(run, id));
    let (lo, hi) = (body_len.0.min(body_len.1), body_len.0.max(body_len.1));
    let n = rng.range(lo as u64, hi as u64 + 1) as usize;
    let mut out = Vec::with_capacity(HEADER + n + TRAILER);
    out.extend(MAGIC.to_be_bytes());
    out.extend(run.to_be_bytes());
    out.extend(id.cycle.to_be_bytes());
    out.extend(id.producer.to_be_bytes());
    out.extend(id.seq.to_be_bytes());
    out.extend((n as u32).to_be_bytes());
    let start = out.len();
    out.resize(start + n, 0);
    rng.fill(&mut out[start..]);
    let crc = crc32c::crc32c(&out);
    out.extend(crc.to_be_bytes());
    out
}

fn be32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// Checks a served record against its own checksum; returns the run and id it claims.
pub fn check(b: &[u8]) -> Result<(u64, RecordId), PayloadFault> {
    if b.len() < HEADER + TRAILER {
        return Err(PayloadFault::Short(b.len()));
    }
    let magic = be32(b, 0);
    if magic != MAGIC {
        return Err(PayloadFault::Magic(magic));
    }
    let claimed = be32(b, 28);
    if HEADER + claimed as usize + TRAILER != b.len() {
        return Err(PayloadFault::Length {
            claimed,
            len: b.len(),
        });
    }
    let body_end = b.len() - TRAILER;
    let stored = be32(b, body_end);
    let computed = crc32c::crc32c(&b[..body_end]);
    if stored != computed {
        return Err(PayloadFault::Checksum { stored, computed });
    }
    let id = RecordId {
        cycle: be32(b, 12),
        producer: be32(b, 16),
        seq: be64(b, 20),
    };
    Ok((be64(b, 4), id))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: RecordId = RecordId {
        cycle: 3,
        producer: 2,
        seq: 41,
    };

    #[test]
    fn a_record_checks_and_regenerates_bit_exact() {
        let a = encode(7, ID, (10, 300));
        assert_eq!(check(&a), Ok((7, ID)));
        assert_eq!(a, encode(7, ID, (10, 300)));
        let other = RecordId { seq: 42, ..ID };
        assert_ne!(a, encode(7, other, (10, 300)));
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let a = encode(1, ID, (40, 40));
        for bit in 0..a.len() * 8 {
            let mut b = a.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(check(&b).is_err(), "bit {bit} flipped went unnoticed");
        }
        assert_eq!(
            check(&a[..a.len() - 1]),
            Err(PayloadFault::Length {
                claimed: 40,
                len: a.len() - 1
            })
        );
        assert_eq!(check(&a[..10]), Err(PayloadFault::Short(10)));
    }
}
