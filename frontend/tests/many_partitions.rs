//! Huge partition counts through the Kafka protocol (issue 11), in-process on the sim device:
//! 10,000 partitions of 60-character names created with CreateTopics, written past several
//! checkpoints (each of many batches) and ring laps, deleted with DeleteTopics; a new producer
//! still gets every ack, memory stays bounded, and a restart finds what it should. Also: the
//! registry's limit refused with a clear error, deleted topics' partitions freed even across a
//! crash, and a snapshot of large commit metadata.
//!
//! The 100,000-partition run goes through the real binary: `tools/tests/suite/many_partitions.rs`.

mod common;

use std::future::Future;
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::{Duration, Instant};

use blockdev::sim::{Latency, SimClock, SimConfig, SimDevice, SimHandle};
use frontend::client::{produce_one_each, Client};
use frontend::meta::MetaRecord;
use frontend::{codes, Config, PartRef};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    CreateTopicsRequest, DeleteTopicsRequest, GroupId, MetadataRequest, OffsetCommitRequest,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use nvmq_log::FormatOptions;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

fn tname(n: &str) -> TopicName {
    TopicName(StrBytes::from_string(n.to_string()))
}

/// 60 characters, as in the report.
fn topic(i: usize) -> String {
    let n = format!("many-partitions-topic-{i:05}-");
    format!("{n}{}", "x".repeat(60 - n.len()))
}

fn sim(seed: u64, fmt: &FormatOptions) -> (SimDevice, SimHandle) {
    let log = fmt.log_size.unwrap_or(64 * MIB);
    let mut c = SimConfig::new(seed, log + 2 * MIB);
    c.flush_latency = Latency::Fixed(Duration::from_micros(100));
    c.clock = SimClock::real();
    let (mut dev, h) = SimDevice::new(c);
    nvmq_log::mkfs::format(&mut dev, fmt).expect("format");
    (dev, h)
}

/// (VmRSS, VmHWM) of this process in MiB.
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (kib("VmRSS:") >> 10, kib("VmHWM:") >> 10)
}

async fn create(c: &mut Client, names: &[String], partitions: i32) -> Vec<(i16, Option<String>)> {
    let mut req = CreateTopicsRequest::default();
    req.timeout_ms = 60_000;
    req.topics = names
        .iter()
        .map(|n| {
            let mut t = CreatableTopic::default();
            t.name = tname(n);
            t.num_partitions = partitions;
            t.replication_factor = 1;
            t
        })
        .collect();
    let resp = c.call(4, &req).await.expect("CreateTopics");
    resp.topics
        .into_iter()
        .map(|t| (t.error_code, t.error_message.map(|m| m.to_string())))
        .collect()
}

async fn delete(c: &mut Client, names: &[String]) -> Vec<i16> {
    let mut req = DeleteTopicsRequest::default();
    req.timeout_ms = 60_000;
    req.topic_names = names.iter().map(|n| tname(n)).collect();
    let resp = c.call(3, &req).await.expect("DeleteTopics");
    resp.responses.into_iter().map(|r| r.error_code).collect()
}

/// One record to each of `partitions` partitions of `topic`, acks=all: the error codes.
async fn produce(c: &mut Client, topic: &str, partitions: i32, value: &[u8]) -> Vec<i16> {
    let req = produce_one_each(topic, partitions, value);
    let resp = tokio::time::timeout(Duration::from_secs(30), c.call(7, &req))
        .await
        .expect("a Produce answered in 30 s (the writer stalled?)")
        .expect("Produce");
    resp.responses
        .iter()
        .flat_map(|t| t.partition_responses.iter().map(|p| p.error_code))
        .collect()
}

/// Before multi-batch checkpoints, writes stopped for good once the recovery point lagged (the
/// registry, 860 KB here, could not be checkpointed in one batch of 64 KiB), and DeleteTopics
/// left every log partition in the registry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_partitions_created_written_past_checkpoints_and_laps_then_deleted() {
    let fmt = FormatOptions {
        window: MIB,
        max_batch: 64 * KIB as u32,
        log_size: Some(16 * MIB),
        format_id: None,
    };
    let (dev, handle) = sim(11, &fmt);
    let server = common::server_on(dev, Config::default());
    let addr = server.local_addr();
    let b = server.broker().clone();
    let (topics, per_topic) = (100usize, 100i32);
    let names: Vec<String> = (0..topics).map(topic).collect();
    let (rss0, _) = memory();

    let t = Instant::now();
    let mut c = Client::connect(addr, "many").await.expect("connect");
    for chunk in names.chunks(10) {
        for (code, msg) in create(&mut c, chunk, per_topic).await {
            assert_eq!(code, codes::NONE, "{msg:?}");
        }
    }
    let created_in = t.elapsed();
    let log = b.log().clone();
    let st = log.stats();
    assert_eq!(st.registry_partitions, 10_002, "with the two internal ones");
    let (rss, hwm) = memory();
    println!(
        "created 10,000 partitions in {:.2} s; registry {} B; VmRSS {rss} MiB (from {rss0}), VmHWM {hwm} MiB",
        created_in.as_secs_f64(),
        st.registry_bytes
    );

    // Three laps of the ring, four connections writing one record to each partition of a topic
    // per Produce.
    let t = Instant::now();
    let laps = 3 * 16 * MIB;
    let start = log.durable();
    let mut tasks = Vec::new();
    for conn in 0..4 {
        let names = names.clone();
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr, "writer").await.expect("connect");
            let value = vec![b'v'; 500];
            let mut i = conn;
            while log.durable() - start < laps {
                let codes = produce(&mut c, &names[i % names.len()], per_topic, &value).await;
                assert_eq!(codes, vec![0; per_topic as usize], "{codes:?}");
                i += 4;
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer task");
    }
    let st = log.stats();
    let (rss, hwm) = memory();
    println!(
        "wrote {} MiB of log in {:.1} s: {} checkpoints in {} batches (the newest {} B); VmRSS {rss} MiB, VmHWM {hwm} MiB",
        (log.durable() - start) >> 20,
        t.elapsed().as_secs_f64(),
        st.checkpoints,
        st.checkpoint_batches,
        st.checkpoint_bytes
    );
    assert!(st.checkpoints >= 3, "{} checkpoints", st.checkpoints);
    assert!(
        st.checkpoint_bytes > 10 * 64 * KIB,
        "{} B",
        st.checkpoint_bytes
    );
    let rss_written = rss;

    let t = Instant::now();
    for chunk in names.chunks(25) {
        assert_eq!(delete(&mut c, chunk).await, vec![0; chunk.len()]);
    }
    let st = log.stats();
    let (rss, hwm) = memory();
    println!(
        "deleted 100 topics in {:.2} s; registry {} partitions, {} B; VmRSS {rss} MiB, VmHWM {hwm} MiB",
        t.elapsed().as_secs_f64(),
        st.registry_partitions,
        st.registry_bytes
    );
    assert_eq!(
        st.registry_partitions, 2,
        "only the internal partitions are left"
    );
    assert_eq!(log.partitions().len(), 2);
    assert!(
        rss <= rss_written + 64,
        "memory grew by deleting: {rss_written} -> {rss} MiB"
    );

    // A new producer gets every ack, past the next checkpoint (of one batch again).
    let fresh = "after-the-deletes".to_string();
    assert_eq!(
        create(&mut c, std::slice::from_ref(&fresh), 1).await[0].0,
        0
    );
    for _ in 0..100 {
        assert_eq!(produce(&mut c, &fresh, 1, &[7u8; 100]).await, vec![0]);
    }

    // A restart finds the new topic alone.
    handle.power_cut();
    server.kill();
    let b2 = common::reopen(handle.power_on(), frontend::Config::default());
    let topics: Vec<String> = b2.topics().map.keys().cloned().collect();
    assert_eq!(topics, vec![fresh.clone()]);
    let p = b2.topics().partition(&fresh, 0).expect("partition");
    assert_eq!(b2.bounds(p).map(|b| b.1), Some(100));
    assert_eq!(b2.log().partitions().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_past_the_registry_limit_are_refused_whole_with_policy_violation() {
    let fmt = FormatOptions {
        window: 64 * KIB,
        max_batch: 16 * KIB as u32,
        log_size: Some(2 * MIB),
        format_id: None,
    };
    let (dev, _h) = sim(12, &fmt);
    let cfg = Config {
        default_partitions: 1000,
        ..Config::default()
    };
    let server = common::server_on(dev, cfg);
    let b = server.broker().clone();
    let mut c = Client::connect(server.local_addr(), "limit")
        .await
        .expect("connect");
    let names: Vec<String> = (0..10).map(topic).collect();
    let mut refused = None;
    for n in &names {
        let r = create(&mut c, std::slice::from_ref(n), 1000).await;
        if r[0].0 != codes::NONE {
            refused = Some((n.clone(), r[0].clone()));
            break;
        }
    }
    let (name, (code, msg)) = refused.expect("never refused");
    println!("{name}: {code} {msg:?}");
    assert_eq!(code, codes::POLICY_VIOLATION);
    assert!(msg
        .unwrap_or_default()
        .contains("no room for another partition"));
    // Nothing of the refused topic stays behind.
    let before = b.log().partitions().len();
    assert!(!b.topics().map.contains_key(&name));
    assert!(b.log().partitions().iter().all(|p| p.1 != name));
    // validate_only says the same without creating anything.
    let mut req = CreateTopicsRequest::default();
    let mut t = CreatableTopic::default();
    t.name = tname(&name);
    t.num_partitions = 1000;
    t.replication_factor = 1;
    req.topics = vec![t];
    req.validate_only = true;
    let resp = c.call(4, &req).await.expect("CreateTopics");
    assert_eq!(resp.topics[0].error_code, codes::POLICY_VIOLATION);
    // So does auto-creation (1000 partitions per topic here).
    let mut md = MetadataRequest::default();
    let mut mt = MetadataRequestTopic::default();
    mt.name = Some(tname(&topic(99)));
    md.topics = Some(vec![mt]);
    md.allow_auto_topic_creation = true;
    let resp = c.call(8, &md).await.expect("Metadata");
    assert_eq!(resp.topics[0].error_code, codes::POLICY_VIOLATION);
    assert_eq!(b.log().partitions().len(), before);
    // Deleting a topic makes room again.
    let first = names[0].clone();
    assert_eq!(delete(&mut c, std::slice::from_ref(&first)).await, vec![0]);
    assert_eq!(
        create(&mut c, std::slice::from_ref(&name), 1000).await[0].0,
        0
    );
}

/// A crash between a topic's tombstone and the deletes of its log partitions: the next start
/// deletes them (before, DeleteTopics never deleted any).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_of_a_topic_deleted_before_a_crash_are_freed_at_the_next_start() {
    let (dev, handle) = sim(13, &FormatOptions::default());
    let b = common::reopen(dev, frontend::Config::default());
    assert!(b.create_topic("kept", 3).await.expect("create"));
    assert!(b.create_topic("doomed", 50).await.expect("create"));
    assert_eq!(b.log().partitions().len(), 2 + 53);
    // The tombstone alone, as a crash right after it would leave it.
    b.append_meta(
        PartRef::new(0, b.meta_partition()),
        &MetaRecord::DeleteTopic {
            name: "doomed".into(),
            incarnation: 1,
        },
    )
    .await
    .expect("tombstone");
    handle.power_cut();
    drop(b);
    let b = common::reopen(handle.power_on(), frontend::Config::default());
    assert!(!b.topics().map.contains_key("doomed"));
    let left: Vec<String> = b.log().partitions().into_iter().map(|p| p.1).collect();
    assert_eq!(left.len(), 2 + 3, "{left:?}");
    assert!(left.iter().all(|t| t != "doomed"));
    // And a topic of the same name is a new one.
    assert!(b.create_topic("doomed", 2).await.expect("create"));
    assert_eq!(b.topics().map["doomed"].len(), 2);
}

/// Polls `f` once: its output if that finished it.
async fn poll_once<F: Future + Unpin>(f: &mut F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        Poll::Ready(match Pin::new(&mut *f).poll(cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        })
    })
    .await
}

/// Topics deleted and re-created while snapshots of the broker's state are being recorded (a
/// suspect of a many_partitions flake), then a ring that wraps past all of it: after a power cut
/// the restart lists exactly what was acknowledged, each re-created topic with its new partition
/// count. Every snapshot is taken in the middle of a delete (after its tombstone was queued,
/// before the topic left the registry: its records, made from the state before the delete, land
/// after the tombstone) or of a create (its log partitions made, the topic not yet served); and
/// the ring wraps until its head is past every one of those records, so the restart finds them
/// only through the log's checkpoints and the snapshots taken while it wrapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_and_creates_beside_snapshots_survive_a_power_cut() {
    let (dev, handle) = common::small_ring(29);
    let b = common::reopen(dev, frontend::Config::default());
    let log = b.log().clone();
    let names: Vec<String> = (0..24).map(topic).collect();
    for n in &names {
        assert!(b.create_topic(n, 20).await.expect("create"));
    }
    let checkpoints = log.stats().checkpoints;
    let mut expected = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let mut delete = pin!(b.delete_topic(n));
        assert!(
            poll_once(&mut delete).await.is_none(),
            "the delete of {n} did not wait for its tombstone"
        );
        assert!(
            b.topics().map.contains_key(n),
            "{n} left before its snapshot"
        );
        b.snapshot().await.expect("a snapshot amid a delete");
        assert!(delete.await.expect("delete"));
        if i % 3 != 0 {
            let mut create = pin!(b.create_topic(n, 3));
            assert!(
                poll_once(&mut create).await.is_none(),
                "the create of {n} did not wait for its partitions"
            );
            assert!(
                !b.topics().map.contains_key(n),
                "{n} served before its snapshot"
            );
            b.snapshot().await.expect("a snapshot amid a create");
            assert!(create.await.expect("re-create"));
            expected.push((n.clone(), 3));
        }
    }
    let changes_end = log.durable();
    // Wrap the ring past all of that, with a snapshot every 2 MiB (a quarter of the ring or
    // less, as the broker's own ticker takes them) so that the newest one stays retained.
    let filler = "filler";
    assert!(b.create_topic(filler, 1).await.expect("create"));
    expected.push((filler.to_string(), 1));
    let who = common::inproc::session("filler");
    let value = vec![7u8; 100 << 10];
    let mut records = 0;
    let log_size = log.geometry().log_size;
    // Until the head is past the changes and the ring has wrapped (the head may pass them
    // before, as what they held is freed).
    while log.shared().lock().head <= changes_end || log.durable() <= log_size {
        assert!(
            records < 2000,
            "the ring did not wrap past {changes_end} in {records} records (head {}, D {})",
            log.shared().lock().head,
            log.durable()
        );
        let batch = frontend::client::record_batch(&[&value], None);
        let r =
            common::inproc::call(&b, &who, 7, &common::produce_request(filler, 0, batch, -1)).await;
        assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
        records += 1;
        if records % 20 == 0 {
            b.snapshot().await.expect("a snapshot while the ring wraps");
        }
    }
    let head = log.shared().lock().head;
    assert!(
        log.stats().checkpoints > checkpoints,
        "no checkpoint after the deletes and creates"
    );
    println!("{records} records wrapped the ring: head {head}, past {changes_end}");
    handle.power_cut();
    drop(b);
    drop(log);
    let b = common::reopen(handle.power_on(), frontend::Config::default());
    let topics: Vec<(String, usize)> = b
        .topics()
        .map
        .iter()
        .map(|(n, p)| (n.clone(), p.len()))
        .collect();
    expected.sort();
    assert_eq!(topics, expected);
    assert_eq!(
        b.log().partitions().len(),
        2 + expected.iter().map(|(_, n)| n).sum::<usize>()
    );
}

/// Commits offset i for each partition i of topic t in one OffsetCommit of group g, each with
/// `meta_len` bytes of metadata; the partitions' error codes.
async fn commit(c: &mut Client, parts: std::ops::Range<i32>, meta_len: usize) -> Vec<i16> {
    let meta = "m".repeat(meta_len);
    let mut t = OffsetCommitRequestTopic::default();
    t.name = tname("t");
    t.partitions = parts
        .map(|i| {
            let mut p = OffsetCommitRequestPartition::default();
            p.partition_index = i;
            p.committed_offset = i64::from(i);
            p.committed_metadata = Some(StrBytes::from_string(meta.clone()));
            p
        })
        .collect();
    let mut oc = OffsetCommitRequest::default();
    oc.group_id = GroupId(StrBytes::from_static_str("g"));
    oc.generation_id_or_member_epoch = -1;
    oc.topics = vec![t];
    let r = c.call(2, &oc).await.expect("OffsetCommit");
    r.topics[0]
        .partitions
        .iter()
        .map(|p| p.error_code)
        .collect()
}

/// A group's commits were cut into records by count (max payload / 600 per record): with 4 KiB
/// of metadata each, a record outgrew the largest payload and the whole snapshot failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_holds_any_amount_of_commit_metadata() {
    let (addr, server) = common::serve(Config::default()).await;
    let b = server.broker().clone();
    let mut c = Client::connect(addr, "commits").await.expect("connect");
    assert_eq!(create(&mut c, &["t".to_string()], 300).await[0].0, 0);
    for part in 0..3 {
        let codes = commit(&mut c, part * 100..part * 100 + 100, 4000).await;
        assert_eq!(codes, vec![0; 100]);
    }
    b.snapshot().await.expect("the snapshot");
    let got = b.offsets().get("g", "t", 299).expect("committed");
    assert_eq!(
        (got.offset, got.metadata.map(|m| m.len())),
        (299, Some(4000))
    );
}

/// One OffsetCommit larger than a record: 300 partitions with 4,000 bytes of metadata each
/// (1.2 MB, over the 1 MiB batch) used to fail whole with KAFKA_STORAGE_ERROR. It is written in
/// as many records as it takes; every partition is committed, and a restart replays them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_offset_commit_larger_than_a_record_is_committed_and_survives_a_restart() {
    let (dev, handle) = sim(14, &FormatOptions::default());
    let server = common::server_on(dev, Config::default());
    let b = server.broker().clone();
    let mut c = Client::connect(server.local_addr(), "commits")
        .await
        .expect("connect");
    assert_eq!(create(&mut c, &["t".to_string()], 300).await[0].0, 0);
    let max = b.log().max_payload();
    assert!(
        300 * 4000 > max,
        "the request must outgrow one record ({max} B)"
    );
    assert_eq!(commit(&mut c, 0..300, 4000).await, vec![0; 300]);
    for i in [0, 150, 299] {
        let got = b.offsets().get("g", "t", i).expect("committed");
        assert_eq!(
            (got.offset, got.metadata.map(|m| m.len())),
            (i64::from(i), Some(4000))
        );
    }
    handle.power_cut();
    server.kill();
    let b2 = common::reopen(handle.power_on(), frontend::Config::default());
    for i in 0..300 {
        let got = b2
            .offsets()
            .get("g", "t", i)
            .expect("committed after the restart");
        assert_eq!(got.offset, i64::from(i));
    }
}
