//! The record checks over every codec: what passes, what lies, what bombs.

use std::io::Write;

use bytes::Bytes;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record};

use super::*;
use crate::batch::{self, tests::make_batch};

#[path = "../tests/common/kafka_batches.rs"]
#[allow(dead_code)] // the integration tests use the rest
mod kafka_batches;

/// Records with keys, values and a header each, as a client encodes them.
fn sample(n: usize) -> Vec<Record> {
    (0..n)
        .map(|i| {
            let key = Some(Bytes::from(format!("key-{i}")));
            let value = (i % 7 != 3).then(|| Bytes::from(format!("value {i} ").repeat(i % 13)));
            let mut r = kafka_batches::record(i, key, value);
            r.headers = [(
                StrBytes::from_string(format!("h{i}")),
                Some(Bytes::from_static(b"hv")),
            )]
            .into_iter()
            .collect();
            r
        })
        .collect()
}

/// A batch by the kafka-protocol crate's encoder (gzip, xerial snappy, zstd or none).
fn encoded(n: usize, compression: Compression) -> Vec<u8> {
    kafka_batches::encode(&sample(n), compression)
}

/// The uncompressed records section of an `n`-record batch.
fn plain_records(n: usize) -> Vec<u8> {
    encoded(n, Compression::None)[HEADER_LEN..].to_vec()
}

/// A batch header over `records` as they are: codec `codec`, `count` records, CRC sealed.
pub(crate) fn batch_over(records: &[u8], codec: i16, count: i32) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER_LEN + records.len());
    b.extend(0i64.to_be_bytes());
    b.extend(((HEADER_LEN - 12 + records.len()) as i32).to_be_bytes());
    b.extend((-1i32).to_be_bytes());
    b.push(2);
    b.extend(0u32.to_be_bytes());
    b.extend(codec.to_be_bytes());
    b.extend((count - 1).to_be_bytes());
    b.extend(1_700_000_000_000i64.to_be_bytes());
    b.extend(1_700_000_000_000i64.to_be_bytes());
    b.extend((-1i64).to_be_bytes());
    b.extend((-1i16).to_be_bytes());
    b.extend((-1i32).to_be_bytes());
    b.extend(count.to_be_bytes());
    b.extend(records);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn snappy_raw(data: &[u8]) -> Vec<u8> {
    snap::raw::Encoder::new().compress_vec(data).unwrap()
}

/// xerial framing as snappy-java writes it: header, then 32 KiB blocks.
fn snappy_xerial(data: &[u8]) -> Vec<u8> {
    let mut out = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01".to_vec();
    for chunk in data.chunks(32 << 10) {
        let c = snappy_raw(chunk);
        out.extend((c.len() as u32).to_be_bytes());
        out.extend(c);
    }
    out
}

fn lz4(data: &[u8]) -> Vec<u8> {
    let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::bulk::compress(data, 3).unwrap()
}

type Compressor = fn(&[u8]) -> Vec<u8>;

/// Every codec nvmq takes, as (attribute id, name, compressor).
fn codecs() -> Vec<(i16, &'static str, Compressor)> {
    vec![
        (0, "none", |d| d.to_vec()),
        (1, "gzip", gzip),
        (2, "snappy", snappy_xerial),
        (2, "raw snappy", snappy_raw),
        (3, "lz4", lz4),
        (4, "zstd", zstd),
    ]
}

fn run(b: &[u8], checks: &Checks) -> Result<(), BatchFault> {
    let info = batch::check(b)?;
    check(b, &info, checks)
}

#[test]
fn batches_from_a_client_encoder_pass() {
    for c in [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Zstd,
    ] {
        for n in [1, 2, 500] {
            let b = encoded(n, c);
            assert_eq!(run(&b, &Checks::default()), Ok(()), "{c:?} x{n}");
        }
    }
    let b = make_batch(3, 7, 0, 5, 10);
    assert_eq!(run(&b, &Checks::default()), Ok(()));
}

#[test]
fn every_codec_counts_its_records() {
    let records = plain_records(40);
    for (id, name, z) in codecs() {
        let packed = z(&records);
        assert_eq!(
            run(&batch_over(&packed, id, 40), &Checks::default()),
            Ok(()),
            "{name}"
        );
        let more = run(&batch_over(&packed, id, 5000), &Checks::default()).unwrap_err();
        assert_eq!(more.code, codes::INVALID_RECORD, "{name}: {more}");
        assert!(
            more.what.contains("claims 5000 records but holds 40"),
            "{name}: {more}"
        );
        let fewer = run(&batch_over(&packed, id, 39), &Checks::default()).unwrap_err();
        assert_eq!(fewer.code, codes::INVALID_RECORD, "{name}: {fewer}");
        assert!(fewer.what.contains("holds more"), "{name}: {fewer}");
    }
}

#[test]
fn malformed_records_are_named() {
    let checks = Checks::default();
    // Record 1's offset delta (after its length, attributes and timestamp delta) made 0.
    let mut b = make_batch(3, -1, -1, -1, 1);
    let second = HEADER_LEN + 1 + usize::from(b[HEADER_LEN]) / 2;
    assert_eq!(b[second + 3], 2);
    b[second + 3] = 0;
    let b = batch_over(&b[HEADER_LEN..], 0, 3);
    let f = run(&b, &checks).unwrap_err();
    assert_eq!(f.code, codes::INVALID_RECORD);
    assert!(f.what.contains("record 1: offset delta 0"), "{f}");
    // Fields that overrun the record's length, or stop short of it.
    for delta in [-2i8, 2] {
        let mut r = make_batch(1, -1, -1, -1, 5)[HEADER_LEN..].to_vec();
        r[0] = (r[0] as i8 + delta) as u8;
        let f = run(&batch_over(&r, 0, 1), &checks).unwrap_err();
        assert_eq!(f.code, codes::INVALID_RECORD, "{f}");
        assert!(f.what.contains("record 0"), "{f}");
    }
    // A negative header count; a record length below the smallest record.
    let mut r = make_batch(1, -1, -1, -1, 0)[HEADER_LEN..].to_vec();
    let last = r.len() - 1;
    r[last] = 1; // zigzag -1
    let f = run(&batch_over(&r, 0, 1), &checks).unwrap_err();
    assert!(f.what.contains("header count -1"), "{f}");
    let f = run(&batch_over(&[4, 0, 0, 0], 0, 1), &checks).unwrap_err();
    assert!(f.what.contains("length 2"), "{f}");
    // A varint that never ends.
    let f = run(&batch_over(&[0xff; 12], 0, 1), &checks).unwrap_err();
    assert!(f.what.contains("varint longer"), "{f}");
}

#[test]
fn damaged_compressed_data_is_corrupt_and_unknown_codecs_invalid() {
    let records = plain_records(10);
    for (id, name, z) in codecs().into_iter().filter(|c| c.0 != 0) {
        // Cut short (lz4 and snappy carry no checksum over the data, so a flipped literal
        // would only be caught where it breaks a record; a cut is always caught).
        let mut packed = z(&records);
        packed.truncate(packed.len() * 2 / 3);
        let r = run(&batch_over(&packed, id, 10), &Checks::default());
        let f = r.expect_err(name);
        assert!(
            matches!(f.code, codes::CORRUPT_MESSAGE | codes::INVALID_RECORD),
            "{name}: {f}"
        );
    }
    let f = run(&batch_over(&records, 6, 10), &Checks::default()).unwrap_err();
    assert_eq!(f.code, codes::INVALID_RECORD, "{f}");
    let no_zstd = Checks {
        zstd: false,
        ..Checks::default()
    };
    let f = run(&encoded(3, Compression::Zstd), &no_zstd).unwrap_err();
    assert_eq!(f.code, codes::UNSUPPORTED_COMPRESSION_TYPE);
}

/// One record whose value is `value` zero bytes, uncompressed.
pub(crate) fn big_record(value: usize) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, v: i64) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        while z >= 0x80 {
            out.push((z as u8) | 0x80);
            z >>= 7;
        }
        out.push(z as u8);
    }
    let mut len = Vec::new();
    varint(&mut len, value as i64);
    let mut r = Vec::with_capacity(value + 16);
    varint(&mut r, (4 + len.len() + value + 1) as i64);
    r.extend([0, 0, 0, 1]);
    r.extend(len);
    r.resize(r.len() + value, 0);
    r.push(0);
    r
}

#[test]
fn a_batch_decompressing_past_the_limit_is_refused_whatever_its_codec() {
    let small = Checks {
        max_uncompressed: 1 << 20,
        zstd: true,
    };
    let over = big_record(4 << 20);
    let under = big_record(1000 << 10);
    for (id, name, z) in codecs().into_iter().filter(|c| c.0 != 0) {
        let b = batch_over(&z(&over), id, 1);
        let f = run(&b, &small).unwrap_err();
        assert_eq!(f.code, codes::MESSAGE_TOO_LARGE, "{name}: {f}");
        assert!(f.what.contains("1048576 bytes"), "{name}: {f}");
        assert_eq!(
            run(&batch_over(&z(&under), id, 1), &small),
            Ok(()),
            "{name}"
        );
    }
    // Uncompressed batches are bounded by the frame, not by this.
    assert_eq!(run(&batch_over(&over, 0, 1), &small), Ok(()));
}

#[test]
fn the_loop_checks_what_is_cheap_and_leaves_the_rest_whatever_the_codec() {
    let inline = |b: &[u8], checks: &Checks| {
        let info = batch::check(b).unwrap();
        check_inline(b, &info, checks)
    };
    let all = Checks::default();
    let small = plain_records(40);
    let large = big_record(2 * INLINE_UNPACKED);
    for (id, name, z) in codecs() {
        // Small: checked here, with the full check's verdict, good or lying.
        assert_eq!(
            inline(&batch_over(&z(&small), id, 40), &all),
            Some(Ok(())),
            "{name}"
        );
        let lie = inline(&batch_over(&z(&small), id, 41), &all).expect(name);
        assert_eq!(lie.unwrap_err().code, codes::INVALID_RECORD, "{name}");
        if id == 0 {
            continue;
        }
        // Yielding more than the loop's share: left to the full check, valid or not.
        for count in [1, 2] {
            let b = batch_over(&z(&large), id, count);
            assert_eq!(inline(&b, &all), None, "{name} claiming {count}");
            assert_eq!(run(&b, &all).is_ok(), count == 1, "{name} claiming {count}");
        }
        // Under a limit below the loop's share, the loop's check is the whole check.
        let tight = Checks {
            max_uncompressed: 1024,
            zstd: true,
        };
        let f = inline(&batch_over(&z(&large), id, 1), &tight)
            .expect(name)
            .unwrap_err();
        assert_eq!(f.code, codes::MESSAGE_TOO_LARGE, "{name}: {f}");
        assert!(f.what.contains("1024 bytes"), "{name}: {f}");
    }
    // Uncompressed batches go by their size.
    let at = big_record(INLINE_PLAIN - 64);
    assert!(at.len() <= INLINE_PLAIN);
    assert_eq!(inline(&batch_over(&at, 0, 1), &all), Some(Ok(())));
    assert_eq!(
        inline(&batch_over(&big_record(INLINE_PLAIN), 0, 1), &all),
        None
    );
}

#[test]
fn a_snappy_block_claiming_more_than_it_can_hold_is_refused_before_allocating() {
    // A raw block header claiming 2 GiB over a few bytes.
    let mut lie = Vec::new();
    let mut n: u64 = 2 << 30;
    while n >= 0x80 {
        lie.push((n as u8) | 0x80);
        n >>= 7;
    }
    lie.push(n as u8);
    lie.extend([0; 8]);
    let f = run(&batch_over(&lie, 2, 1), &Checks::default()).unwrap_err();
    assert_eq!(f.code, codes::CORRUPT_MESSAGE, "{f}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 500, ..Default::default() })]

    /// Any bytes under any codec and any claimed count are answered, never a panic; the checks
    /// stay within the limit whatever the bytes say.
    #[test]
    fn any_records_under_any_codec_are_checked_without_panicking(
        codec in 0i16..8,
        count in proptest::prop_oneof![0i32..5, proptest::prelude::any::<i32>()],
        raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
        wrap in proptest::prelude::any::<bool>(),
    ) {
        // Half the cases compress the bytes in the codec's real framing, so the record parser
        // (not only the decompressor) sees hostile input.
        let body = match (wrap, codec) {
            (true, 1) => gzip(&raw),
            (true, 2) => snappy_xerial(&raw),
            (true, 3) => lz4(&raw),
            (true, 4) => zstd(&raw),
            _ => raw,
        };
        let small = Checks { max_uncompressed: 4096, zstd: true };
        let b = batch_over(&body, codec, count.max(1));
        let _ = run(&b, &small);
    }
}
