//! ListOffsets: earliest, latest, by timestamp (through the time index) and the largest
//! timestamp, on a partition of many batches; a lookup reads a few batches, not the partition.

use crate::common;

use blockdev::sim::SimHandle;
use frontend::Server;

use frontend::client::{record_batch, Client};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    BrokerId, ListOffsetsRequest, MetadataRequest, ProduceRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;

fn topic(n: &str) -> TopicName {
    TopicName(StrBytes::from_string(n.to_string()))
}

/// A batch of `n` records, all stamped `ts` (first and max timestamp; record deltas are 0).
fn stamped(n: usize, ts: i64) -> Vec<u8> {
    let vals: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; 50]).collect();
    let refs: Vec<&[u8]> = vals.iter().map(|v| v.as_slice()).collect();
    let mut b = record_batch(&refs, None);
    b[27..35].copy_from_slice(&ts.to_be_bytes());
    b[35..43].copy_from_slice(&ts.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

fn produce(t: &str, batch: Vec<u8>) -> ProduceRequest {
    common::produce_request(t, 0, batch, -1)
}

async fn list(c: &mut Client, t: &str, ts: i64) -> (i64, i64) {
    let mut p = ListOffsetsPartition::default();
    p.timestamp = ts;
    let mut lt = ListOffsetsTopic::default();
    lt.name = topic(t);
    lt.partitions = vec![p];
    let mut r = ListOffsetsRequest::default();
    r.replica_id = BrokerId(-1);
    r.topics = vec![lt];
    let resp = c.call(4, &r).await.expect("list offsets");
    let pr = &resp.topics[0].partitions[0];
    assert_eq!(pr.error_code, 0);
    (pr.offset, pr.timestamp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_by_timestamp_read_a_few_batches_through_the_time_index() {
    let (addr, server) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    let mut m = MetadataRequest::default();
    let mut mt = MetadataRequestTopic::default();
    mt.name = Some(topic("times"));
    m.topics = Some(vec![mt]);
    m.allow_auto_topic_creation = true;
    c.call(8, &m).await.unwrap();
    // 1,000 batches of 10 records; batch i stamped 1,000,000 + 10 i (offsets 10 i .. 10 i + 9).
    for i in 0..1000i64 {
        let r = c
            .call(7, &produce("times", stamped(10, 1_000_000 + 10 * i)))
            .await
            .unwrap();
        assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
    }
    assert_eq!(list(&mut c, "times", -2).await.0, 0);
    assert_eq!(list(&mut c, "times", -1).await.0, 10_000);
    let idx = server.broker().time_index().clone();
    // The first lookup indexes the partition (one pass)...
    assert_eq!(
        list(&mut c, "times", 1_000_000 + 5_000).await,
        (5_000, 1_005_000)
    );
    let after_first = idx.batches_read();
    assert!(after_first >= 1000, "indexed {after_first} batches");
    // ...later ones read a few batches each, wherever they land.
    for (ts, want) in [
        (1_000_000, (0, 1_000_000)),
        (1_000_001, (10, 1_000_010)),
        (1_007_775, (7_780, 1_007_780)),
        (1_009_990, (9_990, 1_009_990)),
        (-3, (9_990, 1_009_990)),
    ] {
        let before = idx.batches_read();
        assert_eq!(list(&mut c, "times", ts).await, want, "timestamp {ts}");
        let read = idx.batches_read() - before;
        assert!(read <= 64, "timestamp {ts}: {read} batches read");
    }
    // Past the last timestamp: no offset.
    assert_eq!(list(&mut c, "times", 2_000_000).await.0, -1);
    // New batches are indexed as lookups come, a pass over the new ones only.
    for i in 1000..1100i64 {
        c.call(7, &produce("times", stamped(10, 1_000_000 + 10 * i)))
            .await
            .unwrap();
    }
    let before = idx.batches_read();
    assert_eq!(list(&mut c, "times", 1_010_500).await, (10_500, 1_010_500));
    let read = idx.batches_read() - before;
    assert!(read <= 100 + 64, "{read} batches read after 100 new ones");
}

/// Produces `n` batches of 10 records to "times", batch i stamped 1,000,000 + 10 i from `first`.
async fn fill(c: &mut Client, first: i64, n: i64) {
    for i in first..first + n {
        let r = c
            .call(7, &produce("times", stamped(10, 1_000_000 + 10 * i)))
            .await
            .unwrap();
        assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
    }
}

/// A broker on a fresh sim device whose topic "times" holds `n` stamped batches.
async fn filled(seed: u64, n: i64) -> (Server, SimHandle, Client) {
    let (dev, handle) = common::sim_device(seed, 128 << 20, 100);
    let server = common::server_on(dev, Default::default());
    let mut c = Client::connect(server.local_addr(), "t").await.unwrap();
    common::create_topic(&mut c, "times").await;
    fill(&mut c, 0, n).await;
    (server, handle, c)
}

/// Stops the broker (a crash unless `clean`: then it records its state first), cuts the power,
/// and serves the device again.
async fn restart(server: Server, handle: &SimHandle, clean: bool) -> (Server, Client) {
    if clean {
        tokio::task::spawn_blocking(move || server.shutdown())
            .await
            .unwrap()
            .unwrap();
    } else {
        drop(server.kill());
    }
    handle.power_cut();
    let server = common::server_on(handle.power_on(), Default::default());
    let c = Client::connect(server.local_addr(), "t").await.unwrap();
    (server, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_first_lookup_reads_only_what_followed_the_last_snapshot() {
    let (server, handle, mut c) = filled(31, 1000).await;
    // Indexed by a lookup, then recorded with the partitions' snapshots.
    assert_eq!(list(&mut c, "times", 1_005_000).await, (5_000, 1_005_000));
    assert!(server.broker().time_index().batches_read() >= 1000);
    server.broker().snapshot_producers(false).await.unwrap();
    // 30 batches more, then a crash.
    fill(&mut c, 1000, 30).await;
    let (server, mut c) = restart(server, &handle, false).await;
    let idx = server.broker().time_index().clone();
    // The first lookup indexes the 30 batches written after the snapshot and reads a few more,
    // not the 1,030 batches of the partition.
    assert_eq!(list(&mut c, "times", 1_007_775).await, (7_780, 1_007_780));
    let read = idx.batches_read();
    assert!(read <= 30 + 64, "{read} batches read by the first lookup");
    // Whatever the snapshot covers or not, answers are right.
    let before = idx.batches_read();
    for (ts, want) in [
        (1_000_000, (0, 1_000_000)),
        (1_010_150, (10_150, 1_010_150)),
        (-3, (10_290, 1_010_290)),
    ] {
        assert_eq!(list(&mut c, "times", ts).await, want, "timestamp {ts}");
    }
    assert!(idx.batches_read() - before <= 3 * 64);
    assert_eq!(list(&mut c, "times", 2_000_000).await.0, -1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_recorded_index_the_first_lookup_after_a_restart_rebuilds_it() {
    // Never looked up, so nothing to record: after a crash the index is built as before.
    let (server, handle, _) = filled(32, 200).await;
    let (server, mut c) = restart(server, &handle, false).await;
    assert_eq!(list(&mut c, "times", 1_001_005).await, (1_010, 1_001_010));
    assert!(server.broker().time_index().batches_read() >= 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_clean_shutdown_the_first_lookup_reads_a_few_batches() {
    let (server, handle, mut c) = filled(33, 500).await;
    assert_eq!(list(&mut c, "times", -3).await, (4_990, 1_004_990));
    // The clean stop records every partition's state, its time index included.
    let (server, mut c) = restart(server, &handle, true).await;
    assert_eq!(list(&mut c, "times", 1_002_345).await, (2_350, 1_002_350));
    let read = server.broker().time_index().batches_read();
    assert!(read <= 64, "{read} batches read by the first lookup");
}
