//! Topic configs and raised log start offsets are durable: they come back after a power cut,
//! configs survive the ring wrapping over the records that first held them (the snapshot
//! re-records them), and a deleted topic's configs go with it.

use crate::common;

use std::time::Duration;

use blockdev::sim::{Latency, SimClock, SimConfig, SimDevice};
use frontend::client::{record_batch, Client};
use frontend::topic_config::TopicConfigs;
use frontend::{Broker, Config, PartRef};
use kafka_protocol::messages::TopicName;
use kafka_protocol::messages::{delete_records_request, DeleteRecordsRequest, DeleteTopicsRequest};
use kafka_protocol::messages::{incremental_alter_configs_request, IncrementalAlterConfigsRequest};
use kafka_protocol::protocol::StrBytes;
use nvmq_log::{FormatOptions, Log, LogConfig};

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn open(dev: SimDevice) -> std::sync::Arc<Broker> {
    let lc = LogConfig::default();
    let (w, _) = recovery::open(dev, lc.clone()).expect("open");
    Broker::open(
        Log::start(w, lc.queue_capacity),
        lc.queue_capacity,
        Config::default(),
    )
    .expect("broker")
}

fn device(capacity: u64, window: u64, max_batch: u32) -> (SimDevice, blockdev::sim::SimHandle) {
    let mut c = SimConfig::new(3, capacity);
    c.flush_latency = Latency::Fixed(Duration::from_micros(100));
    c.clock = SimClock::real();
    let (mut dev, handle) = SimDevice::new(c);
    let fmt = FormatOptions {
        window,
        max_batch,
        ..FormatOptions::default()
    };
    nvmq_log::mkfs::format(&mut dev, &fmt).expect("format");
    (dev, handle)
}

async fn set(c: &mut Client, topic: &str, name: &str, value: &str) {
    let mut a = incremental_alter_configs_request::AlterableConfig::default();
    a.name = s(name);
    a.config_operation = 0;
    a.value = Some(s(value));
    let mut res = incremental_alter_configs_request::AlterConfigsResource::default();
    res.resource_type = 2;
    res.resource_name = s(topic);
    res.configs = vec![a];
    let mut r = IncrementalAlterConfigsRequest::default();
    r.resources = vec![res];
    let out = c.call(1, &r).await.unwrap();
    assert_eq!(out.responses[0].error_code, 0, "{topic}: {name}={value}");
}

async fn delete_topic(c: &mut Client, topic: &str) {
    let mut del = DeleteTopicsRequest::default();
    del.topic_names = vec![TopicName(s(topic))];
    del.timeout_ms = 5000;
    assert_eq!(c.call(3, &del).await.unwrap().responses[0].error_code, 0);
}

async fn produce(c: &mut Client, topic: &str, value: &[u8]) {
    let r = c
        .call(
            7,
            &common::produce_request(topic, 0, record_batch(&[value], None), -1),
        )
        .await
        .unwrap();
    assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
}

fn part0(b: &Broker, topic: &str) -> PartRef {
    b.topics().partition(topic, 0).expect("partition 0")
}

fn configs(pairs: &[(&str, &str)]) -> TopicConfigs {
    TopicConfigs {
        set: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configs_and_start_offsets_come_back_after_a_power_cut_and_go_with_their_topic() {
    let (dev, handle) = device(64 << 20, 1 << 20, 256 << 10);
    let server = common::server_on(dev, Config::default());
    let mut c = Client::connect(server.local_addr(), "t").await.unwrap();
    for t in ["kept", "again"] {
        common::create_topic(&mut c, t).await;
    }
    set(&mut c, "kept", "retention.ms", "3600000").await;
    set(&mut c, "kept", "max.message.bytes", "5000").await;
    set(&mut c, "again", "retention.bytes", "100000").await;
    for i in 0..5u8 {
        produce(&mut c, "kept", &[i; 10]).await;
    }
    let mut p = delete_records_request::DeleteRecordsPartition::default();
    p.partition_index = 0;
    p.offset = 3;
    let mut t = delete_records_request::DeleteRecordsTopic::default();
    t.name = TopicName(s("kept"));
    t.partitions = vec![p];
    let mut dr = DeleteRecordsRequest::default();
    dr.topics = vec![t];
    assert_eq!(
        c.call(2, &dr).await.unwrap().topics[0].partitions[0].low_watermark,
        3
    );
    // Deleted, then created again under the same name: from defaults.
    delete_topic(&mut c, "again").await;
    common::create_topic(&mut c, "again").await;
    assert_eq!(
        server.broker().topic_configs("again"),
        TopicConfigs::default()
    );

    handle.power_cut();
    server.kill();
    let b = open(handle.power_on());
    assert_eq!(
        b.topic_configs("kept"),
        configs(&[("max.message.bytes", "5000"), ("retention.ms", "3600000")])
    );
    assert_eq!(b.topic_configs("again"), TopicConfigs::default());
    let kept = part0(&b, "kept");
    assert_eq!(b.bounds(kept), Some((3, 5)));
    assert_eq!(b.batch_limit(kept), 5000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configs_survive_the_ring_wrapping_over_them_and_a_power_cut() {
    let (dev, handle) = device(12 << 20, 1 << 20, 256 << 10);
    let server = common::server_on(dev, Config::default());
    let b = server.broker().clone();
    let mut c = Client::connect(server.local_addr(), "t").await.unwrap();
    for t in ["data", "gone", "tuned"] {
        common::create_topic(&mut c, t).await;
    }
    set(&mut c, "tuned", "retention.ms", "3600000").await;
    set(&mut c, "tuned", "cleanup.policy", "delete").await;
    set(&mut c, "gone", "retention.bytes", "100000").await;
    delete_topic(&mut c, "gone").await;
    let meta = PartRef::new(0, b.meta_partition());
    let recorded_by = b.bounds(meta).unwrap().1;

    // About three laps of the ring, slowly enough for the snapshot ticker to keep up.
    let value = vec![7u8; 100 << 10];
    for _ in 0..400 {
        produce(&mut c, "data", &value).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let meta_start = b.bounds(meta).unwrap().0;
    assert!(
        meta_start > recorded_by,
        "the ring never freed the first config records ({meta_start} <= {recorded_by}): the test proves nothing"
    );

    handle.power_cut();
    server.kill();
    let b2 = open(handle.power_on());
    assert_eq!(
        b2.topic_configs("tuned"),
        configs(&[("cleanup.policy", "delete"), ("retention.ms", "3600000")])
    );
    assert!(!b2.topics().map.contains_key("gone"));
    assert_eq!(b2.topic_configs("gone"), TopicConfigs::default());
}
