//! What a produced batch must be to be stored, on the wire: records counted and parsed (inside
//! compressed batches too, within a bound on the decompressed bytes), and acks=0 failures
//! closing the connection as Kafka does (the client has no other way to learn of them).

use crate::common;

use common::kafka_batches::{claim, encode, noise, record, reseal};

use bytes::Bytes;

use std::io::Write;
use std::time::{Duration, Instant};

use frontend::client::{record_batch, Client};
use frontend::codes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_response::PartitionProduceResponse;
use kafka_protocol::messages::{
    ApiVersionsRequest, BrokerId, FetchRequest, ProduceRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record, RecordBatchDecoder};

/// Codes nvmq answers with that the frontend's table may not name yet.
const INVALID_RECORD: i16 = 87;

fn topic(n: &str) -> TopicName {
    TopicName(StrBytes::from_string(n.to_string()))
}

fn produce(t: &str, batch: Vec<u8>, acks: i16) -> ProduceRequest {
    common::produce_request(t, 0, batch, acks)
}

async fn create(c: &mut Client, t: &str) {
    common::create_topic(c, t).await
}

/// The one partition's answer to a Produce at v8.
async fn produce_at(c: &mut Client, t: &str, batch: Vec<u8>) -> PartitionProduceResponse {
    let r = c.call(8, &produce(t, batch, -1)).await.expect("produce");
    r.responses[0].partition_responses[0].clone()
}

/// Every record of partition 0 from offset 0: (offset, value).
async fn read_all(c: &mut Client, t: &str) -> (i64, Vec<(i64, Vec<u8>)>) {
    let mut p = FetchPartition::default();
    p.partition_max_bytes = 64 << 20;
    let mut ft = FetchTopic::default();
    ft.topic = topic(t);
    ft.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.replica_id = BrokerId(-1);
    r.max_bytes = 64 << 20;
    r.topics = vec![ft];
    let f = c.call(11, &r).await.expect("fetch");
    let pd = &f.responses[0].partitions[0];
    assert_eq!(pd.error_code, 0);
    let mut out = Vec::new();
    if let Some(mut recs) = pd.records.clone() {
        for set in RecordBatchDecoder::decode_all(&mut recs).expect("stored batches decode") {
            for r in set.records {
                out.push((r.offset, r.value.map(|v| v.to_vec()).unwrap_or_default()));
            }
        }
    }
    (pd.high_watermark, out)
}

/// A batch encoded by the kafka-protocol crate's client-side encoder (not nvmq's code).
fn encoded(values: &[&[u8]], compression: Compression) -> Vec<u8> {
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let key = Bytes::from(format!("k{i}"));
            record(i, Some(key), Some(Bytes::copy_from_slice(v)))
        })
        .collect();
    encode(&records, compression)
}

/// A batch header (61 bytes) over `records` as they are: compression `codec`, `count` records.
fn batch_over(records: &[u8], codec: i16, count: i32) -> Vec<u8> {
    let mut b = Vec::with_capacity(61 + records.len());
    b.extend(0i64.to_be_bytes());
    b.extend(((49 + records.len()) as i32).to_be_bytes());
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
    reseal(b)
}

/// A connection the server closed: the next read sees end of stream.
async fn closed(c: &mut Client) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(5), c.recv_raw()).await,
        Ok(Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_batch_claiming_more_records_than_it_holds_is_refused() {
    let (addr, _s) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    create(&mut c, "claims").await;
    // One record of 6000 bytes that do not compress: the batch is larger than the 5000 it
    // claims, so no bytes-per-record guess can tell; only counting the records does.
    let noise = noise(6000, 0x9e37_79b9_7f4a_7c15);
    let liar = claim(encoded(&[&noise], Compression::Gzip), 5000);
    assert!(liar.len() > 6000);
    let r = produce_at(&mut c, "claims", liar).await;
    assert_eq!(r.error_code, INVALID_RECORD, "{r:?}");
    let msg = r.error_message.map(|m| m.to_string()).unwrap_or_default();
    assert!(
        msg.contains("5000"),
        "message does not say what was wrong: {msg}"
    );
    // It took no offsets: the next batch lands at 0.
    let ok = produce_at(&mut c, "claims", record_batch(&[b"next"], None)).await;
    assert_eq!((ok.error_code, ok.base_offset), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_batch_from_a_client_encoder_is_stored_with_its_offsets() {
    let (addr, _s) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    create(&mut c, "gz").await;
    let a = produce_at(&mut c, "gz", record_batch(&[b"a0", b"a1"], None)).await;
    assert_eq!((a.error_code, a.base_offset), (0, 0));
    let values: Vec<Vec<u8>> = (0..300)
        .map(|i| format!("value-{i}").into_bytes())
        .collect();
    let refs: Vec<&[u8]> = values.iter().map(|v| v.as_slice()).collect();
    let g = produce_at(&mut c, "gz", encoded(&refs, Compression::Gzip)).await;
    assert_eq!((g.error_code, g.base_offset), (0, 2), "{g:?}");
    let b = produce_at(&mut c, "gz", record_batch(&[b"b0"], None)).await;
    assert_eq!((b.error_code, b.base_offset), (0, 302));
    let (hw, got) = read_all(&mut c, "gz").await;
    assert_eq!(hw, 303);
    assert_eq!(got.len(), 303);
    for (i, (o, v)) in got.iter().enumerate() {
        assert_eq!(*o, i as i64);
        if (2..302).contains(&i) {
            assert_eq!(v, &values[i - 2]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decompression_bomb_is_refused_quickly() {
    let (addr, _s) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    create(&mut c, "bomb").await;
    // One record whose value is 64 MiB of zeros: about 64 KiB compressed, four times the
    // default bound on what a batch may decompress to.
    let value = 64usize << 20;
    let mut rec = Vec::new();
    let body = 1 + 1 + 1 + 1 + varint_len(value as i64) + value + 1;
    varint(&mut rec, body as i64);
    rec.extend([0, 0, 0, 1]); // attributes, timestamp delta 0, offset delta 0, null key
    varint(&mut rec, value as i64);
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(&rec).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..64 {
        e.write_all(&zeros).unwrap();
    }
    e.write_all(&[0]).unwrap(); // no headers
    let bomb = batch_over(&e.finish().unwrap(), 1, 1);
    assert!(bomb.len() < 128 << 10, "bomb of {} bytes", bomb.len());
    let t = Instant::now();
    let r = produce_at(&mut c, "bomb", bomb).await;
    let took = t.elapsed();
    assert_eq!(r.error_code, codes::MESSAGE_TOO_LARGE, "{r:?}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

fn varint_len(v: i64) -> usize {
    let mut out = Vec::new();
    varint(&mut out, v);
    out.len()
}

fn varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncompressed_batches_are_counted_and_their_offset_deltas_checked() {
    let (addr, _s) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    create(&mut c, "plain").await;
    // Claims 3, holds 2.
    let short = claim(record_batch(&[b"a", b"b"], None), 3);
    let r = produce_at(&mut c, "plain", short).await;
    assert_eq!(r.error_code, INVALID_RECORD, "{r:?}");
    // Claims 1, holds 2.
    let long = claim(record_batch(&[b"a", b"b"], None), 1);
    assert_eq!(
        produce_at(&mut c, "plain", long).await.error_code,
        INVALID_RECORD
    );
    // Offset deltas 0, 0: the second record's delta (after length, attributes, timestamp delta).
    let mut dup = record_batch(&[b"a", b"b"], None);
    let second = 61 + 1 + usize::from(dup[61]) / 2;
    assert_eq!(dup[second + 3], 2, "layout of record_batch changed");
    dup[second + 3] = 0;
    let r = produce_at(&mut c, "plain", reseal(dup)).await;
    assert_eq!(r.error_code, INVALID_RECORD, "{r:?}");
    // A record whose fields run past its length.
    let mut bad = record_batch(&[b"abc"], None);
    bad[61] -= 2; // body length 2 bytes short; the batch still ends where it did
    let r = produce_at(&mut c, "plain", reseal(bad)).await;
    assert_eq!(r.error_code, INVALID_RECORD, "{r:?}");
    let (hw, _) = read_all(&mut c, "plain").await;
    assert_eq!(hw, 0, "a refused batch was stored");
}

/// A produce frame with acks=0 at v7, for sending raw.
fn acks0_frame(c: &mut Client, t: &str, batch: Vec<u8>) -> Bytes {
    c.frame(7, &produce(t, batch, 0)).expect("frame").1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_zero_to_an_unknown_topic_closes_the_connection() {
    let (addr, _s) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    let f = acks0_frame(&mut c, "no-such-topic", record_batch(&[b"x"], None));
    c.send_raw(&f).await.unwrap();
    assert!(closed(&mut c).await, "connection left open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_zero_with_a_corrupt_batch_closes_the_connection_after_earlier_answers() {
    let (addr, _s) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    create(&mut c, "z0").await;
    let mut corrupt = record_batch(&[b"x"], None);
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    // Pipelined in one write: an answered produce, the failing acks=0 one, then one more that
    // must not be taken (Kafka handles a connection's requests one at a time and closes it).
    let (_, before) = c
        .frame(7, &produce("z0", record_batch(&[b"before"], None), -1))
        .unwrap();
    let bad = acks0_frame(&mut c, "z0", corrupt);
    let (_, after) = c
        .frame(7, &produce("z0", record_batch(&[b"after"], None), -1))
        .unwrap();
    c.send_raw(&[before, bad, after].concat()).await.unwrap();
    let (_, r) = c
        .recv::<ProduceRequest>(7)
        .await
        .expect("the earlier answer");
    assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
    assert!(closed(&mut c).await, "connection left open");
    let mut c = Client::connect(addr, "t").await.unwrap();
    let (hw, got) = read_all(&mut c, "z0").await;
    assert_eq!(hw, 1, "{got:?}");
    assert_eq!(got[0].1, b"before");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_zero_that_the_device_fails_closes_the_connection() {
    let (dev, h) = common::sim_device(11, 128 << 20, 200);
    let s = common::server_on(dev, Default::default());
    let mut c = Client::connect(s.local_addr(), "t").await.unwrap();
    create(&mut c, "zf").await;
    h.fail_next_write();
    let f = acks0_frame(&mut c, "zf", record_batch(&[b"x"], None));
    c.send_raw(&f).await.unwrap();
    assert!(closed(&mut c).await, "connection left open");
}

/// An acks=0 append that the writer fails later (here: the log is full and refuses) closes the
/// connection, but only after the requests taken before it are answered. Before, the connection
/// closed at once and a long-polling Fetch ahead of it never got its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_zero_failed_by_the_writer_closes_the_connection_after_earlier_answers() {
    let (dev, _h) = common::sim_device(12, 64 << 20, 200);
    let lc = nvmq_log::LogConfig {
        on_full: nvmq_log::OnFull::Refuse,
        full_wait: Duration::from_millis(100),
        ..Default::default()
    };
    let s = common::serve_devices_with(vec![dev], lc, Default::default());
    let mut c = Client::connect(s.local_addr(), "t").await.unwrap();
    create(&mut c, "zfull").await;
    // Fill the log straight through the broker until it refuses large appends, then small ones
    // (a small batch may still fit where a large one did not).
    let b = s.broker().clone();
    let part = b.topics().partition("zfull", 0).expect("partition");
    for size in [512 << 10, 1] {
        let mut filled = false;
        for _ in 0..1000 {
            let rx = b.append(part, vec![1u8; size], 1).await.expect("queued");
            if matches!(rx.await, Ok(Err(nvmq_log::LogError::LogFull { .. }))) {
                filled = true;
                break;
            }
        }
        assert!(filled, "appends of {size} B never filled the log");
    }
    let end = b.bounds(part).expect("bounds").1;

    // Pipelined: a Fetch at the end that waits up to a second, then the acks=0 produce the full
    // log refuses after its 100 ms wait.
    let mut p = FetchPartition::default();
    p.fetch_offset = end as i64;
    p.partition_max_bytes = 1 << 20;
    let mut ft = FetchTopic::default();
    ft.topic = topic("zfull");
    ft.partitions = vec![p];
    let mut fetch = FetchRequest::default();
    fetch.replica_id = BrokerId(-1);
    fetch.max_bytes = 1 << 20;
    fetch.min_bytes = 1;
    fetch.max_wait_ms = 1000;
    fetch.topics = vec![ft];
    let (_, wait) = c.frame(11, &fetch).expect("frame");
    let quiet = acks0_frame(&mut c, "zfull", record_batch(&[b"x"], None));
    c.send_raw(&[wait, quiet].concat()).await.unwrap();
    let (_, r) = c
        .recv::<FetchRequest>(11)
        .await
        .expect("the fetch taken before the failure is answered");
    assert_eq!(r.responses[0].partitions[0].error_code, 0);
    let open = !closed(&mut c).await;
    assert!(
        !open,
        "connection left open; end {end} -> {:?}",
        b.bounds(part)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_acks_zero_produce_is_stored_and_keeps_the_connection() {
    let (addr, _s) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    create(&mut c, "zok").await;
    let f = acks0_frame(&mut c, "zok", record_batch(&[b"quiet"], None));
    c.send_raw(&f).await.unwrap();
    let r = c.call(3, &ApiVersionsRequest::default()).await.unwrap();
    assert_eq!(r.error_code, 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (hw, got) = read_all(&mut c, "zok").await;
        if hw == 1 {
            assert_eq!(got[0].1, b"quiet");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the acks=0 record never became durable"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
