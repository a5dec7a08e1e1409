//! `nvmq serve` after a failed flush (PostgreSQL's rule for an fsync failure): the produce in
//! flight is answered with an error, /metrics says why, the process exits with status 5 within a
//! bound, and a restart (recovery) still serves every record acknowledged before the failure.
//! The flush failure comes from the file device's fault-injection seam,
//! `NVMQ_FAULT_FLUSH_FAIL_AFTER`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use frontend::client::{record_batch, Client};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{FetchRequest, ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

/// Flushes the device lets succeed before the failing one: the start and the topic's creation
/// take a few (checked below), the produces the rest.
const FAIL_AFTER: u64 = 40;
/// The exit status `nvmq serve` documents for a stopped writer.
const WRITER_STOPPED_STATUS: i32 = 5;
/// KAFKA_STORAGE_ERROR, the answer to an append the stopped writer refused.
const KAFKA_STORAGE_ERROR: i16 = 56;
const TOPIC: &str = "stop";

/// `nvmq serve` on `device` with metrics, the flush-failure seam armed when `fail_after` is set.
fn start(device: &str, fail_after: Option<u64>) -> crate::common::Serving {
    let n = fail_after.map(|n| n.to_string());
    let env: Vec<(&str, &str)> = n
        .iter()
        .map(|n| (crate::common::FLUSH_FAIL_SEAM, n.as_str()))
        .collect();
    crate::common::serve_with(
        &[
            "--device",
            device,
            "--listen",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
        &env,
    )
}

fn topic() -> TopicName {
    TopicName(StrBytes::from_static_str(TOPIC))
}

/// A fixed-width value, so that it can be found again at the end of its stored batch.
fn record_value(i: u32) -> Vec<u8> {
    format!("rec-{i:06}").into_bytes()
}

fn produce(value: &[u8]) -> ProduceRequest {
    let mut p = PartitionProduceData::default();
    p.records = Some(Bytes::from(record_batch(&[value], None)));
    let mut td = TopicProduceData::default();
    td.name = topic();
    td.partition_data = vec![p];
    let mut r = ProduceRequest::default();
    r.acks = -1;
    r.timeout_ms = 10_000;
    r.topic_data = vec![td];
    r
}

/// (error code, base offset) of a one-partition Produce answer.
async fn produce_one(c: &mut Client, value: &[u8]) -> std::io::Result<(i16, i64)> {
    let resp = c.call(7, &produce(value)).await?;
    let p = &resp.responses[0].partition_responses[0];
    Ok((p.error_code, p.base_offset))
}

/// Every record of partition 0 as offset → value, read with Fetch from offset 0 (each stored
/// batch holds one record of `record_value`'s width, its value just before the trailing
/// header count).
async fn read_all(c: &mut Client) -> BTreeMap<i64, Vec<u8>> {
    let width = record_value(0).len();
    let mut got = BTreeMap::new();
    let mut next = 0i64;
    loop {
        let mut p = FetchPartition::default();
        p.partition = 0;
        p.fetch_offset = next;
        p.partition_max_bytes = 1 << 20;
        let mut ft = FetchTopic::default();
        ft.topic = topic();
        ft.partitions = vec![p];
        let mut r = FetchRequest::default();
        r.replica_id = kafka_protocol::messages::BrokerId(-1);
        r.max_bytes = 8 << 20;
        r.max_wait_ms = 0;
        r.topics = vec![ft];
        let resp = c.call(11, &r).await.expect("fetch");
        let pd = &resp.responses[0].partitions[0];
        assert_eq!(pd.error_code, 0, "fetch from {next}");
        let mut b = pd.records.clone().unwrap_or_default();
        let before = got.len();
        while b.len() >= 61 {
            let base = i64::from_be_bytes(b[..8].try_into().expect("8 bytes"));
            let len = 12 + i32::from_be_bytes([b[8], b[9], b[10], b[11]]) as usize;
            if len > b.len() {
                break; // a partial batch at the end of the answer
            }
            let batch = b.split_to(len);
            got.insert(
                base,
                batch[batch.len() - 1 - width..batch.len() - 1].to_vec(),
            );
            next = base + 1;
        }
        if got.len() == before || next >= pd.high_watermark {
            return got;
        }
    }
}

#[test]
fn a_failed_flush_stops_serve_with_status_5_and_a_restart_keeps_every_acknowledged_record() {
    stops_and_recovers("auto");
}

#[test]
fn the_same_with_the_io_threads_engine() {
    stops_and_recovers("threads");
}

/// The whole story on a file device run by `engine`.
fn stops_and_recovers(engine: &str) {
    let dir = crate::common::temp_dir(&format!("writer-stop-{engine}"));
    let img = crate::common::formatted(&dir);
    let device = format!("{},engine={engine}", crate::common::spec(&img));
    let mut serve = start(&device, Some(FAIL_AFTER));
    assert!(
        serve.stderr_shows(&["FAULT INJECTION (NVMQ_FAULT_FLUSH_FAIL_AFTER)"]),
        "the armed seam is announced:\n{}",
        serve.stderr()
    );

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (acked, refused_code, refused_at) = rt.block_on(async {
        let mut c = Client::connect(serve.kafka.as_str(), "writer-stop")
            .await
            .expect("connect");
        crate::common::kafka::auto_create(&mut c, TOPIC).await;
        let start_flushes = serve.metric("nvmq_flushes_total");
        assert!(
            start_flushes + 10.0 < FAIL_AFTER as f64,
            "the start took {start_flushes} flushes: raise FAIL_AFTER so that produces get acks first"
        );
        let mut acked = BTreeMap::new();
        for i in 0..10 * FAIL_AFTER as u32 {
            let v = record_value(i);
            let (code, offset) = produce_one(&mut c, &v).await.unwrap_or_else(|e| {
                panic!("the produce in flight when the flush failed was dropped, not answered: {e}")
            });
            if code != 0 {
                return (acked, code, Instant::now());
            }
            acked.insert(offset, v);
        }
        panic!(
            "{} produces acknowledged and none refused: the seam did not fail a flush",
            acked.len()
        );
    });
    assert!(
        !acked.is_empty(),
        "no produce was acknowledged before the failure"
    );
    assert_eq!(
        refused_code, KAFKA_STORAGE_ERROR,
        "the append the stopped writer refused"
    );

    // Before the process exits, a scrape says that the writer stopped, and why.
    let metrics = serve.metrics.as_deref().expect("metrics address");
    let body =
        crate::common::try_scrape(metrics).expect("/metrics still answers right after the failure");
    let fatal = body
        .lines()
        .find(|l| l.starts_with("nvmq_writer_fatal{"))
        .unwrap_or_else(|| panic!("no labelled nvmq_writer_fatal line:\n{body}"));
    assert!(
        fatal.ends_with(" 1") && fatal.contains("reason=") && fatal.contains("os error 5"),
        "{fatal}"
    );
    // Nothing more is acknowledged, on a new connection either.
    let late = rt.block_on(async {
        let mut c = Client::connect(serve.kafka.as_str(), "late").await?;
        produce_one(&mut c, &record_value(999_999)).await
    });
    assert!(
        !matches!(late, Ok((0, _))),
        "a produce after the failure was acknowledged"
    );

    let status = serve
        .exit_within(Duration::from_secs(20))
        .unwrap_or_else(|| {
            panic!(
                "serve still runs 20 s after its writer stopped; stderr:\n{}",
                serve.stderr()
            )
        });
    let took = refused_at.elapsed();
    assert!(took < Duration::from_secs(15), "exit took {took:?}");
    assert_eq!(
        status.code(),
        Some(WRITER_STOPPED_STATUS),
        "stderr:\n{}",
        serve.stderr()
    );
    assert!(
        serve.stderr_shows(&["writer for device 0", "os error 5", "exiting with status 5"]),
        "stderr names the device, the reason and the status:\n{}",
        serve.stderr()
    );
    drop(serve);

    // A restart without the seam recovers the log: every acknowledged record is there, and new
    // records are acknowledged.
    let serve = start(&device, None);
    rt.block_on(async {
        let mut c = Client::connect(serve.kafka.as_str(), "after")
            .await
            .expect("connect after the restart");
        let stored = read_all(&mut c).await;
        for (offset, v) in &acked {
            assert_eq!(
                stored.get(offset),
                Some(v),
                "acknowledged record at offset {offset} after the restart"
            );
        }
        let (code, offset) = produce_one(&mut c, &record_value(1_000_000))
            .await
            .expect("produce after the restart");
        assert_eq!(code, 0, "a produce after the restart");
        assert!(offset > *acked.keys().last().unwrap_or(&-1));
    });
}

/// A writer that stops while serve starts (the broker replays its internal partitions and writes
/// its startup records through the writers before it serves) is the same failure as one that
/// stops later: status 5 and the same log line, so that the supervisor's restart runs recovery.
#[test]
fn a_flush_failing_while_serve_starts_exits_with_status_5_too() {
    let dir = crate::common::temp_dir("writer-stop-at-start");
    let img = crate::common::formatted(&dir);
    // Recovery's own flushes come first (a failure there refuses the open before any writer
    // runs); the smallest count past them fails the first flush of the writer, during the start.
    for n in 0..8u64 {
        let copy = dir.join(format!("try-{n}.img"));
        std::fs::copy(&img, &copy).expect("copy the formatted log");
        let device = crate::common::spec(&copy);
        let r = crate::common::nvmq_with(
            &["serve", "--device", &device, "--listen", "127.0.0.1:0"],
            &[(crate::common::FLUSH_FAIL_SEAM, &n.to_string())],
            Duration::from_secs(30),
        );
        let _ = std::fs::remove_file(&copy);
        assert!(
            !r.stdout.contains("nvmq serving Kafka"),
            "with {n} flushes allowed serve started before a flush of its writer failed: {r}"
        );
        if !r.stderr.contains("writer stopped") {
            continue; // recovery refused the open: no writer ran yet
        }
        assert_eq!(r.code, WRITER_STOPPED_STATUS, "{n} flushes allowed: {r}");
        let line = format!("writer for device 0 ({device}) stopped: device flush failed");
        assert!(
            r.stderr.contains(&line)
                && r.stderr.contains("os error 5")
                && r.stderr
                    .contains("exiting with status 5 so that recovery runs on restart"),
            "stderr names the device, the reason and the status: {r}"
        );
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    panic!("no count up to 8 failed a flush of the writer while serve started");
}
