//! Idempotent producers' state across restarts: start-up restores the newest snapshot and
//! replays only the records after it, retries are still recognised, a clean shutdown leaves
//! nothing to replay, and a crash that cuts the log below a snapshot neither loses nor invents
//! state (checked against a full replay of what the log holds).

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use blockdev::sim::{SimDevice, SimHandle};
use bytes::Bytes;
use frontend::client::{record_batch, Client};
use frontend::meta::{MetaRecord, ProducerSnap, ProducerStatePart, StoredBatch};
use frontend::producers::{PartitionSnap, Producers};
use frontend::{Broker, Config, PartRef, Server, ServerOptions, Startup};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{MetadataRequest, ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use nvmq_log::{FlushMode, LogConfig};

const TOPIC: &str = "idem";

fn device(seed: u64) -> (SimDevice, SimHandle) {
    common::sim_device(seed, 64 << 20, 100)
}

/// A broker serving the log on `dev` (dropping it stops it like a crash).
struct Opened {
    server: Server,
    b: Arc<Broker>,
}

impl std::ops::Deref for Opened {
    type Target = Broker;
    fn deref(&self) -> &Broker {
        &self.b
    }
}

fn open(dev: SimDevice, flush: FlushMode) -> Opened {
    let lc = LogConfig {
        flush,
        ..LogConfig::default()
    };
    let (w, _) = recovery::open(dev, lc.clone()).expect("open");
    let cfg = Config {
        default_partitions: 2,
        ..Config::default()
    };
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let opts = ServerOptions {
        loops: 2,
        pin: false,
        queue_capacity: lc.queue_capacity,
        ..ServerOptions::default()
    };
    let server = Server::start(vec![w], l, cfg, opts).expect("server");
    let b = server.broker().clone();
    Opened { server, b }
}

/// A broker over a log on a writer thread of its own, not serving: no background snapshots.
fn open_unserved(dev: SimDevice) -> Arc<Broker> {
    let lc = LogConfig::default();
    let (w, _) = recovery::open(dev, lc.clone()).expect("open");
    let cfg = Config {
        default_partitions: 2,
        ..Config::default()
    };
    let log = nvmq_log::Log::start(w, lc.queue_capacity);
    Broker::open(log, lc.queue_capacity, cfg).expect("broker")
}

struct Node {
    b: Arc<Broker>,
    c: Client,
    server: Server,
}

async fn start(o: Opened) -> Node {
    let Opened { server, b } = o;
    let addr = server.local_addr();
    let mut c = Client::connect(addr, "t").await.unwrap();
    let mut md = MetadataRequest::default();
    let mut mt = MetadataRequestTopic::default();
    mt.name = Some(TopicName(StrBytes::from_static_str(TOPIC)));
    md.topics = Some(vec![mt]);
    md.allow_auto_topic_creation = true;
    let r = c.call(8, &md).await.unwrap();
    assert_eq!(r.topics[0].partitions.len(), 2);
    Node { b, c, server }
}

impl Node {
    /// Stops serving the clean way (in-flight appends acknowledged, last snapshot taken).
    async fn shut_down(self) -> Arc<Broker> {
        let Node { server, .. } = self;
        tokio::task::spawn_blocking(move || server.shutdown())
            .await
            .unwrap()
            .unwrap()
    }
}

fn produce_request(part: i32, batch: Vec<u8>) -> ProduceRequest {
    let mut p = PartitionProduceData::default();
    p.index = part;
    p.records = Some(Bytes::from(batch));
    let mut td = TopicProduceData::default();
    td.name = TopicName(StrBytes::from_static_str(TOPIC));
    td.partition_data = vec![p];
    let mut r = ProduceRequest::default();
    r.acks = -1;
    r.timeout_ms = 10_000;
    r.topic_data = vec![td];
    r
}

/// A batch of `n` records of producer `pid` starting at `seq`.
fn batch(pid: i64, epoch: i16, seq: i32, n: usize) -> Vec<u8> {
    let v = seq.to_be_bytes();
    let values: Vec<&[u8]> = (0..n).map(|_| &v[..]).collect();
    record_batch(&values, Some((pid, epoch, seq)))
}

/// (error code, base offset).
async fn produce(c: &mut Client, part: i32, batch: Vec<u8>) -> (i16, i64) {
    let r = c.call(7, &produce_request(part, batch)).await.unwrap();
    let p = &r.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

fn data_partitions(b: &Broker) -> Vec<PartRef> {
    b.topics().map[TOPIC].clone()
}

fn normalized(mut s: PartitionSnap) -> PartitionSnap {
    for p in &mut s.producers {
        p.last_seen_ms = 0;
    }
    s
}

/// The broker's producer state of a partition.
fn state(b: &Broker, partition: PartRef) -> PartitionSnap {
    normalized(
        b.producers()
            .snapshot(partition, frontend::producers::now_ms(), false)
            .unwrap(),
    )
}

/// What a replay of every record the log holds for the partition builds.
fn full_replay(b: &Broker, partition: PartRef) -> PartitionSnap {
    let p = Producers::default();
    let (start, end) = b.bounds(partition).unwrap();
    let mut next = start;
    while next < end {
        let recs = b
            .log_of(partition)
            .read(partition.id, next, 1 << 20)
            .unwrap();
        assert!(!recs.is_empty());
        for r in recs {
            let info = frontend::batch::header(&r.payload).unwrap();
            p.replay(partition, &info, r.offset, 0);
            next = r.offset + u64::from(r.span);
        }
    }
    p.set_end(partition, end);
    normalized(p.snapshot(partition, 0, false).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_replays_only_what_follows_the_snapshot_and_retries_stay_duplicates() {
    let (dev, handle) = device(11);
    let mut n = start(open(dev, FlushMode::Always)).await;
    let pid = 7;
    let mut offsets = [Vec::new(), Vec::new()];
    for seq in 0..10 {
        for part in 0..2 {
            let (code, base) = produce(&mut n.c, part, batch(pid, 0, 2 * seq, 2)).await;
            assert_eq!(code, 0);
            offsets[part as usize].push(base);
        }
    }
    assert_eq!(n.b.snapshot_producers(false).await.unwrap(), 2);
    for seq in 10..13 {
        for part in 0..2 {
            let (code, base) = produce(&mut n.c, part, batch(pid, 0, 2 * seq, 2)).await;
            assert_eq!(code, 0);
            offsets[part as usize].push(base);
        }
    }
    let before: Vec<PartitionSnap> = data_partitions(&n.b)
        .iter()
        .map(|&p| state(&n.b, p))
        .collect();

    // A power cut, not a clean stop: the three batches after the snapshot are replayed.
    handle.power_cut();
    let b = open(handle.power_on(), FlushMode::Always);
    assert_eq!(
        b.startup(),
        Startup {
            partitions_from_snapshot: 2,
            partitions_replayed_in_full: 0,
            records_replayed: 6,
            producers_expired: 0,
        }
    );
    for (i, &p) in data_partitions(&b).iter().enumerate() {
        assert_eq!(state(&b, p), before[i]);
        assert_eq!(state(&b, p), full_replay(&b, p));
    }
    let mut n = start(b).await;
    let parts = data_partitions(&n.b);
    for (part, landed) in offsets.iter().enumerate() {
        // Inside the snapshot (sequence 16) and after it (sequence 22): answered with the
        // original offset, not stored again.
        for k in [8usize, 11] {
            let (code, base) = produce(&mut n.c, part as i32, batch(pid, 0, 2 * k as i32, 2)).await;
            assert_eq!((code, base), (0, landed[k]), "retry of batch {k}");
        }
        assert_eq!(
            n.b.bounds(parts[part]).unwrap().1,
            26,
            "a retry was stored again"
        );
        let (code, base) = produce(&mut n.c, part as i32, batch(pid, 0, 26, 1)).await;
        assert_eq!((code, base), (0, 26));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_clean_shutdown_nothing_is_replayed() {
    let (dev, handle) = device(12);
    let mut n = start(open(dev, FlushMode::Always)).await;
    for seq in 0..20 {
        let (code, _) = produce(&mut n.c, seq % 2, batch(3, 0, seq / 2, 1)).await;
        assert_eq!(code, 0);
    }
    // More requests still in flight when the stop comes: they finish or are never queued.
    for seq in 10..40 {
        for part in 0..2 {
            n.c.send(7, &produce_request(part, batch(3, 0, seq, 1)))
                .await
                .unwrap();
        }
    }
    let b = n.shut_down().await;
    let before: Vec<PartitionSnap> = data_partitions(&b).iter().map(|&p| state(&b, p)).collect();
    drop(b);
    handle.power_cut();
    let b = open(handle.power_on(), FlushMode::Always);
    let st = b.startup();
    assert_eq!(
        (
            st.partitions_from_snapshot,
            st.partitions_replayed_in_full,
            st.records_replayed
        ),
        (2, 0, 0)
    );
    for (i, &p) in data_partitions(&b).iter().enumerate() {
        assert!(b.bounds(p).unwrap().1 >= 10);
        assert_eq!(state(&b, p), before[i]);
        assert_eq!(state(&b, p), full_replay(&b, p));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_without_snapshots_and_a_snapshot_past_the_end_are_replayed_in_full() {
    // Data written straight to the log, as a broker without producer snapshots left it: a
    // broker that does not serve (a serving one takes snapshots in the background).
    let (dev, handle) = device(13);
    let b = open_unserved(dev);
    assert!(b.create_topic(TOPIC, 2).await.unwrap());
    let parts = data_partitions(&b);
    for seq in 0..6 {
        b.log_of(parts[0])
            .append_wait(parts[0].id, batch(9, 0, seq, 1))
            .expect("append");
    }
    // A snapshot whose `through` lies past the partition's end (as only damage could leave it).
    let bogus = MetaRecord::ProducerState(ProducerStatePart {
        partition: parts[1].id,
        through: 1000,
        part: 0,
        parts: 1,
        producers: vec![ProducerSnap {
            id: 9,
            epoch: 0,
            last_seen_ms: frontend::producers::now_ms(),
            batches: vec![StoredBatch {
                first_seq: 0,
                last_seq: 0,
                offset: 500,
            }],
        }],
    });
    b.log()
        .append_wait(b.meta_partition(), bogus.encode())
        .expect("append");
    drop(b);
    handle.power_cut();
    let b = open(handle.power_on(), FlushMode::Always);
    assert_eq!(
        b.startup(),
        Startup {
            partitions_from_snapshot: 0,
            partitions_replayed_in_full: 2,
            records_replayed: 6,
            producers_expired: 0,
        }
    );
    assert_eq!(state(&b, parts[0]), full_replay(&b, parts[0]));
    assert!(state(&b, parts[1]).producers.is_empty(), "state invented");
    let mut n = start(b).await;
    assert_eq!(produce(&mut n.c, 0, batch(9, 0, 5, 1)).await, (0, 5));
    assert_eq!(produce(&mut n.c, 0, batch(9, 0, 6, 1)).await, (0, 6));
}

/// A small deterministic generator (xorshift64*), so a seed replays a run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// Snapshots every partition; notes each one's `through`.
async fn snapshot(b: &Broker, parts: &[PartRef], through: &mut [u64]) {
    for (i, &p) in parts.iter().enumerate() {
        through[i] = b.producers().snapshot(p, 0, false).unwrap().through;
    }
    b.snapshot_producers(false).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_that_cut_below_a_snapshot_neither_lose_nor_invent_state() {
    let seed: u64 = std::env::var("NVMQ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0005);
    println!("seed {seed} (NVMQ_SEED replays it)");
    let mut rng = Rng(seed | 1);
    let (dev, handle) = device(seed);
    // Acks at write completion, a flush every millisecond: a cut may take acknowledged records,
    // and snapshots, with it.
    let flush = FlushMode::Interval(Duration::from_millis(1));
    let mut b = open(dev, flush);
    let mut cut_below = 0;
    let mut from_snapshot = 0;
    for round in 0..8 {
        let mut n = start(b).await;
        let parts = data_partitions(&n.b);
        // Each producer continues from the log's state (its next sequence there).
        let mut last_through = vec![0u64; 2];
        for step in 0..60 {
            let part = rng.below(2) as usize;
            let pid = 100 + rng.below(3) as i64;
            let st = state(&n.b, parts[part]);
            let (epoch, next) = st
                .producers
                .iter()
                .find(|p| p.id == pid)
                .and_then(|p| Some((p.epoch, p.batches.last()?.last_seq + 1)))
                .unwrap_or((0, 0));
            let (epoch, seq) = if rng.below(20) == 0 {
                (epoch + 1, 0)
            } else {
                (epoch, next)
            };
            let (code, _) = produce(
                &mut n.c,
                part as i32,
                batch(pid, epoch, seq, 1 + rng.below(3) as usize),
            )
            .await;
            assert_eq!(code, 0, "seed {seed} round {round} step {step}");
            if rng.below(8) == 0 {
                snapshot(&n.b, &parts, &mut last_through).await;
            }
        }
        snapshot(&n.b, &parts, &mut last_through).await;
        // A few more appends after the last snapshot, then the power goes.
        for k in 0..3 {
            let _ = produce(&mut n.c, k % 2, record_batch(&[b"plain"], None)).await;
        }
        handle.power_cut();
        drop(n);
        b = open(handle.power_on(), flush);
        let st = b.startup();
        from_snapshot += st.partitions_from_snapshot;
        for (i, &p) in parts.iter().enumerate() {
            // The cut may take the topic's creation too (acks at write completion).
            let Some((_, end)) = b.bounds(p) else {
                assert_eq!(b.producers().count(p), 0, "seed {seed}: state invented");
                continue;
            };
            if end < last_through[i] {
                cut_below += 1;
            }
            assert_eq!(
                state(&b, p),
                full_replay(&b, p),
                "seed {seed} round {round} partition {i}: {st:?}"
            );
        }
    }
    println!(
        "{from_snapshot} partition starts from a snapshot, {cut_below} cuts below the newest one"
    );
    assert!(from_snapshot > 0, "seed {seed}: no start used a snapshot");
}
