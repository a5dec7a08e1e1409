//! More than one device: a topic's partitions spread over every device's log, each written by
//! the writer of its own device (on its own event loop), read back from the right one, and found
//! again on the right device after a restart, with each device's producer snapshots; and a
//! device whose writer stopped gets its appends refused at once, from either loop.

use crate::common;

use blockdev::sim::{SimDevice, SimHandle};
use frontend::client::{record_batch, Client};
use frontend::{codes, Config, PartRef, Server};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{CreateTopicsRequest, FetchRequest, ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

const TOPIC: &str = "spread";
const PARTITIONS: i32 = 6;

fn device(seed: u64) -> (SimDevice, SimHandle) {
    common::sim_device(seed, 64 << 20, 100)
}

fn serve(devs: Vec<SimDevice>) -> Server {
    common::serve_devices(devs, Config::default())
}

fn name() -> TopicName {
    TopicName(StrBytes::from_static_str(TOPIC))
}

fn produce(part: i32, batch: Vec<u8>) -> ProduceRequest {
    common::produce_request(TOPIC, part, batch, -1)
}

/// Every record value of a partition, read with Fetch from offset 0.
async fn read_all(c: &mut Client, part: i32) -> Vec<Vec<u8>> {
    let mut p = FetchPartition::default();
    p.partition = part;
    p.partition_max_bytes = 1 << 20;
    let mut ft = FetchTopic::default();
    ft.topic = name();
    ft.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.replica_id = kafka_protocol::messages::BrokerId(-1);
    r.max_bytes = 8 << 20;
    r.topics = vec![ft];
    let resp = c.call(11, &r).await.expect("fetch");
    let pd = &resp.responses[0].partitions[0];
    assert_eq!(pd.error_code, 0, "partition {part}");
    let mut out = Vec::new();
    let mut b = pd.records.clone().unwrap_or_default();
    // Each stored batch holds one record here: its value is the batch's last bytes after the
    // varints, so compare by suffix: the test's values are distinct 8-byte tags.
    while b.len() >= 61 {
        let len = 12 + i32::from_be_bytes([b[8], b[9], b[10], b[11]]) as usize;
        let batch = b.split_to(len);
        out.push(batch[batch.len() - 9..batch.len() - 1].to_vec());
    }
    out
}

fn tag(part: i32, i: u32) -> Vec<u8> {
    let mut v = (part as u32).to_be_bytes().to_vec();
    v.extend(i.to_be_bytes());
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_spread_over_devices_and_come_back_on_theirs() {
    let (d0, h0) = device(21);
    let (d1, h1) = device(22);
    let server = serve(vec![d0, d1]);
    let mut c = Client::connect(server.local_addr(), "t").await.unwrap();
    let mut ct = CreatableTopic::default();
    ct.name = name();
    ct.num_partitions = PARTITIONS;
    ct.replication_factor = 1;
    let mut req = CreateTopicsRequest::default();
    req.topics = vec![ct];
    req.timeout_ms = 10_000;
    let r = c.call(4, &req).await.unwrap();
    assert_eq!(r.topics[0].error_code, 0);
    let placed: Vec<PartRef> = server.broker().topics().map[TOPIC].clone();
    assert_eq!(placed.len(), PARTITIONS as usize);
    for dev in 0..2 {
        assert!(
            placed.iter().any(|p| p.dev == dev),
            "no partition on device {dev}: {placed:?}"
        );
    }
    // Plain and idempotent producers on every partition; pipelined, so that appends to both
    // devices are in flight together.
    for i in 0..20u32 {
        for part in 0..PARTITIONS {
            let idem = (part % 2 == 0).then_some((7, 0, i as i32));
            let b = record_batch(&[&tag(part, i)], idem);
            c.send(7, &produce(part, b)).await.unwrap();
        }
        for part in 0..PARTITIONS {
            let (_, r) = c.recv::<ProduceRequest>(7).await.unwrap();
            let p = &r.responses[0].partition_responses[0];
            assert_eq!(
                (p.error_code, p.base_offset),
                (0, i64::from(i)),
                "partition {part}"
            );
        }
    }
    for part in 0..PARTITIONS {
        let want: Vec<Vec<u8>> = (0..20).map(|i| tag(part, i)).collect();
        assert_eq!(read_all(&mut c, part).await, want, "partition {part}");
    }
    // Each partition's records are in its own device's log, and only there.
    for (index, p) in placed.iter().enumerate() {
        for (dev, log) in server.broker().logs().iter().enumerate() {
            let has = log.partition_id(TOPIC, index as u32).is_some();
            assert_eq!(has, dev == p.device(), "partition {index} on device {dev}");
        }
    }
    drop(c);
    server.shutdown().expect("clean shutdown");

    // Both devices again, in the same order: the same placement, the data, and each device's
    // producer snapshots (nothing to replay after a clean stop).
    let server = serve(vec![h0.power_on(), h1.power_on()]);
    assert_eq!(server.broker().topics().map[TOPIC], placed);
    let st = server.broker().startup();
    assert_eq!(
        (st.partitions_from_snapshot, st.records_replayed),
        (PARTITIONS as usize, 0)
    );
    let mut c = Client::connect(server.local_addr(), "t").await.unwrap();
    for part in 0..PARTITIONS {
        let want: Vec<Vec<u8>> = (0..20).map(|i| tag(part, i)).collect();
        assert_eq!(read_all(&mut c, part).await, want, "partition {part}");
        // A retry of an idempotent batch is still recognised, on either device.
        if part % 2 == 0 {
            let b = record_batch(&[&tag(part, 19)], Some((7, 0, 19)));
            let r = c.call(7, &produce(part, b)).await.unwrap();
            let p = &r.responses[0].partition_responses[0];
            assert_eq!(
                (p.error_code, p.base_offset),
                (0, 19),
                "retry on partition {part}"
            );
        }
    }
    server.shutdown().expect("clean shutdown");
}

/// Creates the spread topic; returns where its partitions went.
async fn create_spread(server: &Server, c: &mut Client) -> Vec<PartRef> {
    let mut ct = CreatableTopic::default();
    ct.name = name();
    ct.num_partitions = PARTITIONS;
    ct.replication_factor = 1;
    let mut req = CreateTopicsRequest::default();
    req.topics = vec![ct];
    req.timeout_ms = 10_000;
    let r = c.call(4, &req).await.unwrap();
    assert_eq!(r.topics[0].error_code, 0);
    server.broker().topics().map[TOPIC].clone()
}

/// The error code of one produce, which must be answered well before its 10 s timeout.
async fn produce_code(c: &mut Client, part: i32, value: &[u8]) -> i16 {
    let req = produce(part, record_batch(&[value], None));
    let r = tokio::time::timeout(std::time::Duration::from_secs(5), c.call(7, &req))
        .await
        .expect("answered before the produce timeout")
        .expect("produce");
    r.responses[0].partition_responses[0].error_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_to_a_stopped_writer_are_refused_at_once_from_either_loop() {
    let (d0, _h0) = device(31);
    let (d1, h1) = device(32);
    let server = serve(vec![d0, d1]);
    // Connections are dealt to loops 0 and 1 in turn: one appends to device 1 across loops, the
    // other on the loop hosting it.
    let mut a = Client::connect(server.local_addr(), "a").await.unwrap();
    let mut b = Client::connect(server.local_addr(), "b").await.unwrap();
    let placed = create_spread(&server, &mut a).await;
    let on = |dev: u16| {
        placed
            .iter()
            .position(|p| p.dev == dev)
            .map(|i| i as i32)
            .expect("a partition on each device")
    };
    let (p0, p1) = (on(0), on(1));
    assert_eq!(produce_code(&mut a, p1, b"before").await, codes::NONE);
    h1.fail_next_flush();
    // The append in flight when the flush fails gets the writer's error ...
    assert_eq!(
        produce_code(&mut a, p1, b"failing").await,
        codes::KAFKA_STORAGE_ERROR
    );
    assert!(server.broker().logs()[1].fatal().is_some());
    // ... and so does every later one, at once, whichever loop the connection is on.
    for c in [&mut a, &mut b] {
        for _ in 0..3 {
            assert_eq!(
                produce_code(c, p1, b"after").await,
                codes::KAFKA_STORAGE_ERROR
            );
        }
    }
    // The other device's writer is unaffected (stopping the process is `nvmq serve`'s call).
    assert_eq!(produce_code(&mut b, p0, b"elsewhere").await, codes::NONE);
    let started = std::time::Instant::now();
    tokio::task::spawn_blocking(move || server.shutdown().map(drop))
        .await
        .expect("shutdown thread")
        .expect("shutdown");
    assert!(started.elapsed() < std::time::Duration::from_secs(15));
}
