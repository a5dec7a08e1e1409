//! `nvmq serve` against hostile clients at once: thousands of idle connections, connections
//! stalled halfway through a frame, and clients that pipeline large Fetches and never read. The
//! broker's memory stays bounded (printed), a normal producer is still acknowledged, and the
//! clients that do not read are closed after the write timeout.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use frontend::client::{record_batch, request_frame, set_correlation_id, Client};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{FetchRequest, MetadataRequest, ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

const IDLE: usize = 2_000;
const STALLED: usize = 100;
const NON_READERS: usize = 10;

fn topic(n: &str) -> TopicName {
    TopicName(StrBytes::from_string(n.to_string()))
}

fn produce(value: &[u8]) -> ProduceRequest {
    let mut p = PartitionProduceData::default();
    p.records = Some(bytes::Bytes::from(record_batch(&[value], None)));
    let mut td = TopicProduceData::default();
    td.name = topic("h");
    td.partition_data = vec![p];
    let mut r = ProduceRequest::default();
    r.acks = -1;
    r.timeout_ms = 10_000;
    r.topic_data = vec![td];
    r
}

fn big_fetch() -> FetchRequest {
    let mut p = FetchPartition::default();
    p.partition_max_bytes = 50 << 20;
    let mut ft = FetchTopic::default();
    ft.topic = topic("h");
    ft.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.replica_id = kafka_protocol::messages::BrokerId(-1);
    r.min_bytes = 1;
    r.max_bytes = 50 << 20;
    r.topics = vec![ft];
    r
}

#[test]
fn idle_stalled_and_non_reading_clients_leave_memory_bounded_and_producers_served() {
    let serving = common::serve(&[
        "--device",
        "sim:flush=200us,capacity=512M",
        "--listen",
        "127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
        "--max-connection-bytes",
        "4M",
        "--max-queued-bytes",
        "128M",
        "--write-timeout",
        "3s",
    ]);
    let kafka = serving.kafka.clone();
    let metrics = serving.metrics.clone().expect("metrics address");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut normal = rt
        .block_on(Client::connect(kafka.as_str(), "normal"))
        .expect("connect");
    // 6 MB in the partition: a Fetch from its start answers with all of it.
    rt.block_on(async {
        let mut m = MetadataRequest::default();
        let mut mt = MetadataRequestTopic::default();
        mt.name = Some(topic("h"));
        m.topics = Some(vec![mt]);
        m.allow_auto_topic_creation = true;
        normal.call(8, &m).await.expect("metadata");
        for _ in 0..60 {
            let r = normal
                .call(7, &produce(&[7u8; 100_000]))
                .await
                .expect("fill");
            assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
        }
    });
    let rss_start = serving.status_kib("VmRSS:");

    let mut idle = Vec::new();
    for _ in 0..IDLE {
        idle.push(TcpStream::connect(&kafka).expect("idle connection"));
    }
    let mut stalled = Vec::new();
    for _ in 0..STALLED {
        let mut s = TcpStream::connect(&kafka).expect("stalled connection");
        // A frame announcing 8 MB, then 4 KiB of it, then nothing.
        let mut f = (8_000_000i32).to_be_bytes().to_vec();
        f.extend(std::iter::repeat_n(0u8, 4096));
        s.write_all(&f).expect("partial frame");
        stalled.push(s);
    }
    let mut hogs = Vec::new();
    let mut frame = request_frame(11, &big_fetch(), 0, "hog").expect("frame");
    for _ in 0..NON_READERS {
        let mut s = TcpStream::connect(&kafka).expect("hog connection");
        let mut all = Vec::new();
        for id in 0..100 {
            set_correlation_id(&mut frame, id);
            all.extend_from_slice(&frame);
        }
        s.write_all(&all).expect("pipelined fetches");
        hogs.push(s);
    }

    // Meanwhile a normal producer is acknowledged, each ack within seconds.
    let mut slowest = Duration::ZERO;
    rt.block_on(async {
        for i in 0..50u8 {
            let t = Instant::now();
            let r = tokio::time::timeout(Duration::from_secs(10), normal.call(7, &produce(&[i])))
                .await
                .expect("a normal producer waited 10 s")
                .expect("produce");
            assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
            slowest = slowest.max(t.elapsed());
        }
    });
    let body = common::scrape(&metrics);
    let open = common::metric(&body, "nvmq_connections");
    let queued = common::metric(&body, "nvmq_queued_bytes");
    let rss = serving.status_kib("VmRSS:");
    let hwm = serving.status_kib("VmHWM:");
    println!(
        "{IDLE} idle, {STALLED} stalled, {NON_READERS} non-reading (100 x 50 MB Fetches each): \
         {open} connections, {:.1} MiB queued; broker RSS {} MiB (was {} MiB), peak {} MiB; \
         slowest normal ack {} ms",
        queued / 1048576.0,
        rss / 1024,
        rss_start / 1024,
        hwm / 1024,
        slowest.as_millis()
    );
    // (Non-readers may be closing already.)
    assert!(open >= (IDLE + STALLED + 1) as f64, "{open} open");
    // Each non-reader holds at most its 4 MiB budget plus one 6 MB answer started under it.
    assert!(
        queued <= (NON_READERS * (11 << 20)) as f64,
        "{queued} B queued"
    );
    // The normal producer did not wait for the non-readers to be closed.
    assert!(slowest < Duration::from_secs(3), "slowest ack {slowest:?}");
    // Without the limits the non-readers alone hold 10 x 100 x 6 MB of answers.
    assert!(
        hwm < rss_start + (300 << 10),
        "peak {hwm} KiB after {rss_start} KiB"
    );

    // The clients that never read are closed after the write timeout; the others stay.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut open = open;
    while Instant::now() < deadline {
        open = common::metric(&common::scrape(&metrics), "nvmq_connections");
        if open <= (IDLE + STALLED + 1) as f64 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(open, (IDLE + STALLED + 1) as f64, "non-readers not closed");
    drop((idle, stalled, hogs));
}
