//! Kafka RecordBatch (magic 2) headers: checked on produce, read back on fetch. On produce the
//! records are checked too (`records`, decompressing as a stream), but the batch is stored as
//! the producer sent it, compressed or not.

use crate::codes;
use crate::records::{self, Checks};

pub const HEADER_LEN: usize = 61;
const CRC_START: usize = 21;

/// What nvmq needs from a batch header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchInfo {
    /// Bytes of the whole batch (12 + batchLength).
    pub len: usize,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

impl BatchInfo {
    /// Offsets the batch takes.
    pub fn span(&self) -> u32 {
        self.record_count as u32
    }
    pub fn is_transactional(&self) -> bool {
        self.attributes & 0x10 != 0
    }
    pub fn is_control(&self) -> bool {
        self.attributes & 0x20 != 0
    }
    pub fn last_sequence(&self) -> i32 {
        // Sequences wrap at i32::MAX back to 0 (Kafka's DefaultRecordBatch.incrementSequence).
        let s = i64::from(self.base_sequence) + i64::from(self.last_offset_delta);
        (s % (i64::from(i32::MAX) + 1)) as i32
    }
}

/// Why a produced batch was refused: the Kafka error code and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}")]
pub struct BatchFault {
    pub code: i16,
    pub what: String,
}

fn fault(code: i16, what: String) -> BatchFault {
    BatchFault { code, what }
}

fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be_i64(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
}

/// Reads the header of the batch at the start of `b` without checking its CRC (for batches read
/// back from the log, which the log already verified).
pub fn header(b: &[u8]) -> Result<BatchInfo, BatchFault> {
    // The magic sits at byte 16 in every message format: an old-format message set (often
    // shorter than a v2 header) is named for what it is.
    if let Some(&magic) = b.get(16).filter(|&&m| m != 2) {
        return Err(fault(
            codes::UNSUPPORTED_FOR_MESSAGE_FORMAT,
            format!("record batch magic {magic}: only message format v2 is stored"),
        ));
    }
    if b.len() < HEADER_LEN {
        return Err(fault(
            codes::CORRUPT_MESSAGE,
            format!(
                "record batch of {} bytes is shorter than its {HEADER_LEN}-byte header",
                b.len()
            ),
        ));
    }
    let batch_length = be_i32(b, 8);
    let len = 12i64 + i64::from(batch_length);
    if batch_length < (HEADER_LEN - 12) as i32 || len > b.len() as i64 {
        return Err(fault(
            codes::CORRUPT_MESSAGE,
            format!(
                "record batch length {batch_length} does not fit the {} bytes sent",
                b.len()
            ),
        ));
    }
    Ok(BatchInfo {
        len: len as usize,
        attributes: be_i16(b, 21),
        last_offset_delta: be_i32(b, 23),
        base_timestamp: be_i64(b, 27),
        max_timestamp: be_i64(b, 35),
        producer_id: be_i64(b, 43),
        producer_epoch: be_i16(b, 51),
        base_sequence: be_i32(b, 53),
        record_count: be_i32(b, 57),
    })
}

/// Checks one produced batch's header at the start of `b`: magic, lengths, CRC32C over
/// attributes..end, a record count that matches the last offset delta, no control or
/// transactional batches. (Its records: `split`.)
pub fn check(b: &[u8]) -> Result<BatchInfo, BatchFault> {
    let info = header(b)?;
    let body = &b[..info.len];
    let want = u32::from_be_bytes([b[17], b[18], b[19], b[20]]);
    let got = crc32c::crc32c(&body[CRC_START..]);
    if want != got {
        return Err(fault(
            codes::CORRUPT_MESSAGE,
            format!("record batch CRC32C {got:#010x} does not match the {want:#010x} it carries"),
        ));
    }
    // Kafka's LogValidator.validateBatch: INVALID_RECORD, which clients do not retry (the
    // batch is intact as sent, so sending it again cannot help).
    if info.record_count < 1 || info.last_offset_delta != info.record_count - 1 {
        return Err(fault(
            codes::INVALID_RECORD,
            format!(
                "record batch claims {} records but its last offset delta is {}",
                info.record_count, info.last_offset_delta
            ),
        ));
    }
    if info.is_control() || info.is_transactional() {
        return Err(fault(
            codes::INVALID_REQUEST,
            "transactional and control batches are not supported".into(),
        ));
    }
    Ok(info)
}

/// Splits a produce request's records into batches, each checked with its records.
pub fn split<'a>(
    records: &'a [u8],
    checks: &Checks,
) -> Result<Vec<(BatchInfo, &'a [u8])>, BatchFault> {
    let (batches, fault) = frames(records);
    for (info, one) in &batches {
        records::check(one, info, checks)?;
    }
    match fault {
        Some(f) => Err(f),
        None => Ok(batches),
    }
}

/// Splits a produce request's records into batches with their headers checked, but not their
/// records: the batches before the first one refused, and why that one was (or why there was
/// none). The records are checked apart (`records::check`), some of them off the event loop;
/// the first fault in batch order, records or header, is the partition's.
pub fn frames(records: &[u8]) -> (Vec<(BatchInfo, &[u8])>, Option<BatchFault>) {
    let mut out = Vec::new();
    let mut rest = records;
    while !rest.is_empty() {
        let info = match check(rest) {
            Ok(info) => info,
            Err(f) => return (out, Some(f)),
        };
        let (one, tail) = rest.split_at(info.len);
        out.push((info, one));
        rest = tail;
    }
    if out.is_empty() {
        let f = fault(
            codes::CORRUPT_MESSAGE,
            "produce request without a record batch".into(),
        );
        return (out, Some(f));
    }
    (out, None)
}

/// Reads a zigzag varint at `*at`, moving past it.
fn varint(b: &[u8], at: &mut usize) -> Option<i64> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(((v >> 1) as i64) ^ -((v & 1) as i64));
        }
    }
    None
}

/// The first record of a stored batch whose timestamp reaches `ts`: (offset delta, timestamp).
/// Reads the records of an uncompressed batch; for a compressed one (not decompressed on reads)
/// answers with the batch's first offset and its largest timestamp, as long as
/// that reaches `ts`.
pub fn first_at_or_after(b: &[u8], ts: i64) -> Option<(i64, i64)> {
    let info = header(b).ok()?;
    if info.max_timestamp < ts {
        return None;
    }
    if info.attributes & 0x07 != 0 {
        return Some((0, info.max_timestamp));
    }
    let body = &b[..info.len];
    let mut at = HEADER_LEN;
    for _ in 0..info.record_count {
        let len = varint(body, &mut at)?;
        let end = at.checked_add(usize::try_from(len).ok()?)?;
        let mut r = at + 1; // attributes
        let t = info.base_timestamp.checked_add(varint(body, &mut r)?)?;
        let delta = varint(body, &mut r)?;
        if t >= ts {
            return Some((delta, t));
        }
        at = end;
    }
    Some((0, info.max_timestamp))
}

/// Writes the log's offset into a stored batch's baseOffset (outside the CRC).
pub fn set_base_offset(b: &mut [u8], offset: u64) {
    if b.len() >= 8 {
        b[..8].copy_from_slice(&(offset as i64).to_be_bytes());
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A valid uncompressed batch of `n` records with the given producer fields.
    pub fn make_batch(n: i32, pid: i64, epoch: i16, seq: i32, value_len: usize) -> Vec<u8> {
        let v = vec![b'v'; value_len];
        let values: Vec<&[u8]> = (0..n).map(|_| v.as_slice()).collect();
        crate::client::record_batch(&values, Some((pid, epoch, seq)))
    }

    #[test]
    fn a_valid_batch_passes_and_damage_is_named() {
        let b = make_batch(3, 7, 0, 5, 10);
        let info = check(&b).unwrap();
        assert_eq!(info.record_count, 3);
        assert_eq!(info.producer_id, 7);
        assert_eq!(info.last_sequence(), 7);
        let mut bad = b.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(check(&bad).unwrap_err().code, codes::CORRUPT_MESSAGE);
        let mut old = b.clone();
        old[16] = 1;
        assert_eq!(
            check(&old).unwrap_err().code,
            codes::UNSUPPORTED_FOR_MESSAGE_FORMAT
        );
        assert!(check(&b[..40]).is_err());
        assert!(check(&b[..b.len() - 1]).is_err());
        // The base offset is outside the CRC: patching it keeps the batch valid.
        let mut moved = b.clone();
        set_base_offset(&mut moved, 1234);
        assert!(check(&moved).is_ok());
        assert_eq!(be_i64(&moved, 0), 1234);
        let two = [b.clone(), make_batch(1, -1, -1, -1, 0)].concat();
        assert_eq!(split(&two, &Checks::default()).unwrap().len(), 2);
        assert!(split(&[], &Checks::default()).is_err());
    }

    #[test]
    fn the_first_record_reaching_a_timestamp_is_found() {
        let b = make_batch(3, -1, -1, -1, 4);
        // make_batch stamps every record with the batch's base timestamp.
        let base = header(&b).unwrap().base_timestamp;
        assert_eq!(first_at_or_after(&b, base), Some((0, base)));
        assert_eq!(first_at_or_after(&b, i64::MAX), None);
        assert!(varint(&[0x80], &mut 0).is_none());
    }

    #[test]
    fn sequences_wrap() {
        let b = make_batch(3, 7, 0, i32::MAX - 1, 1);
        assert_eq!(check(&b).unwrap().last_sequence(), 0);
    }
}
