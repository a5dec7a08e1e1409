//! The checkpoint at the recovery point, part by part: what `Checkpoint::add_part` takes and
//! what it refuses (device bytes that check but are not what the writer writes).

use super::*;
use nvmq_log::batch::BatchBuilder;
use nvmq_log::format::RecordHeader;
use nvmq_log::state::part_capacity;

const FORMAT_ID: u64 = 0x5eed;

fn registry(n: u32) -> Registry {
    let mut r = Registry::default();
    for i in 0..n {
        r.insert(i, format!("topic-{:040}", i / 8), i % 8);
    }
    r
}

/// A checkpoint batch at position 4096 holding `records` (continuation flag, part index,
/// payload), and the records as the scan reads them back.
fn batch(records: &[(u32, u64, Vec<u8>)]) -> Vec<u8> {
    let mut buf = vec![0u8; 64 << 10];
    let mut b = BatchBuilder::new(&mut buf, FORMAT_ID, 1, 4096);
    for (continues, part, payload) in records {
        b.push(RecordKind::Checkpoint, *continues, *part, payload);
    }
    let (len, _) = b.finish(4096, BatchKind::Checkpoint, 0, 0, 0);
    buf.truncate(len);
    buf
}

fn add(c: &mut Checkpoint, bytes: &[u8]) -> Result<(), String> {
    let (h, _) = BatchHeader::decode(bytes, FORMAT_ID, 4096, 4096).map_err(|e| format!("{e:?}"))?;
    let mut recs = Vec::new();
    check_records(&h, bytes, |r| recs.push(r)).map_err(|e| e.to_string())?;
    c.add_part(&recs)
}

#[test]
fn parts_in_order_add_up_to_the_registry() {
    let whole = registry(64);
    let first = whole.encode_part(0, part_capacity(1024));
    let next = first
        .next
        .expect("64 entries take more than one part of 1 KiB");
    let second = whole.encode_part(next, part_capacity(64 << 10));
    assert!(second.next.is_none());
    let mut c = Checkpoint::Missing;
    add(&mut c, &batch(&[(PART_CONTINUES, 0, first.payload)])).expect("part 0");
    assert!(matches!(c, Checkpoint::Partial { parts: 1, .. }));
    add(&mut c, &batch(&[(0, 1, second.payload)])).expect("part 1");
    let Checkpoint::Complete(got) = c else {
        panic!("not complete after its last part");
    };
    assert_eq!(got, whole);
}

#[test]
fn a_checkpoint_batch_of_two_records_is_refused() {
    let whole = registry(4);
    let p = whole.encode_part(0, part_capacity(64 << 10)).payload;
    let mut c = Checkpoint::Missing;
    let e = add(&mut c, &batch(&[(0, 0, p.clone()), (0, 0, p)])).expect_err("two records");
    assert!(e.contains("2 records"), "{e}");
}

#[test]
fn a_checkpoint_batch_without_a_checkpoint_record_is_refused() {
    let mut c = Checkpoint::Missing;
    let e = c.add_part(&[]).expect_err("no record");
    assert!(e.contains("without a record"), "{e}");
    // A record of another kind (the batch check refuses it first on the device; the scan
    // does not lean on that).
    let header = RecordHeader {
        len: 0,
        kind: RecordKind::Data,
        partition: 0,
        offset: 0,
        span: 1,
        position: 4096 + 64,
        epoch: 1,
    };
    let e = c
        .add_part(&[RecordRef {
            header,
            payload: &[],
        }])
        .expect_err("a data record");
    assert!(e.contains("Data"), "{e}");
}

#[test]
fn parts_out_of_order_or_after_the_last_are_refused() {
    let whole = registry(64);
    let first = whole.encode_part(0, part_capacity(1024));
    let mut c = Checkpoint::Missing;
    let e = add(
        &mut c,
        &batch(&[(PART_CONTINUES, 1, first.payload.clone())]),
    )
    .expect_err("part 1 first");
    assert!(e.contains("part 1 where part 0"), "{e}");
    let mut c = Checkpoint::Missing;
    add(&mut c, &batch(&[(0, 0, whole.encode())])).expect("a whole checkpoint in one part");
    let e = add(&mut c, &batch(&[(0, 1, first.payload)])).expect_err("after the last");
    assert!(e.contains("after its last"), "{e}");
}
