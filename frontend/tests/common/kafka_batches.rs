//! Record batches as a Kafka client encodes them (the kafka-protocol crate's own encoder, not
//! nvmq's code), and batches altered to lie, for the tests and the examples.

use bytes::Bytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

/// Record `i` of a batch: offset delta `i`, timestamp 1,700,000,000,000 + `i`, no headers.
pub fn record(i: usize, key: Option<Bytes>, value: Option<Bytes>) -> Record {
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: i as i64,
        // The encoder starts a new batch where offset - sequence changes: -1 at offset 0 keeps
        // one batch with no base sequence.
        sequence: i as i32 - 1,
        timestamp: 1_700_000_000_000 + i as i64,
        key,
        value,
        headers: Default::default(),
    }
}

/// One batch of `records` (offsets from 0, no producer id), compressed with `compression`.
pub fn encode(records: &[Record], compression: Compression) -> Vec<u8> {
    let mut buf = bytes::BytesMut::new();
    let opts = RecordEncodeOptions {
        version: 2,
        compression,
    };
    RecordBatchEncoder::encode(&mut buf, records, &opts).expect("encode");
    buf.to_vec()
}

/// One batch of records holding `values` (no keys).
pub fn batch_of(values: &[Bytes], compression: Compression) -> Vec<u8> {
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| record(i, None, Some(v.clone())))
        .collect();
    encode(&records, compression)
}

/// `len` bytes that do not compress, the same for the same `seed` (xorshift).
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Rewrites a batch's record count and last offset delta to claim `count` records, and its CRC
/// to match: a batch that lies about its contents and is otherwise intact.
pub fn claim(mut b: Vec<u8>, count: i32) -> Vec<u8> {
    b[23..27].copy_from_slice(&(count - 1).to_be_bytes());
    b[57..61].copy_from_slice(&count.to_be_bytes());
    reseal(b)
}

/// The batch with its CRC32C made to match its bytes again.
pub fn reseal(mut b: Vec<u8>) -> Vec<u8> {
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}
