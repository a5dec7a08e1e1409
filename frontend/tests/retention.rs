//! The broker's own state (committed offsets, topic tombstones, SCRAM credentials) lives in
//! internal partitions of the same ring as the data. When the ring wraps and the oldest data is freed, the periodic
//! snapshot keeps that state alive: after several laps and a power cut, it is all still there.

mod common;

use std::time::Duration;

use blockdev::sim::{Latency, SimClock, SimConfig, SimDevice};
use bytes::Bytes;
use frontend::client::{record_batch, Client};
use frontend::meta::{META_TOPIC, OFFSETS_TOPIC};
use frontend::sasl::{ScramCredential, ScramMechanism};
use frontend::{Broker, Config};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    DeleteTopicsRequest, MetadataRequest, OffsetCommitRequest, ProduceRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use nvmq_log::{FormatOptions, Log, LogConfig};

fn name(n: &str) -> TopicName {
    TopicName(StrBytes::from_string(n.to_string()))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_the_ring_wrapping_over_it_and_a_power_cut() {
    let mut c = SimConfig::new(3, 12 << 20);
    c.flush_latency = Latency::Fixed(Duration::from_micros(100));
    c.clock = SimClock::real();
    let (mut dev, handle) = SimDevice::new(c);
    let fmt = FormatOptions {
        window: 1 << 20,
        max_batch: 256 << 10,
        ..FormatOptions::default()
    };
    nvmq_log::mkfs::format(&mut dev, &fmt).expect("format");
    let server = common::server_on(dev, Config::default());
    let addr = server.local_addr();
    let b = server.broker().clone();
    let mut cl = Client::connect(addr, "t").await.unwrap();

    let mut md = MetadataRequest::default();
    md.topics = Some(
        ["data", "gone"]
            .iter()
            .map(|t| {
                let mut mt = MetadataRequestTopic::default();
                mt.name = Some(name(t));
                mt
            })
            .collect(),
    );
    md.allow_auto_topic_creation = true;
    cl.call(8, &md).await.unwrap();
    let mut del = DeleteTopicsRequest::default();
    del.topic_names = vec![name("gone")];
    del.timeout_ms = 5000;
    assert_eq!(cl.call(3, &del).await.unwrap().responses[0].error_code, 0);

    let mut p = OffsetCommitRequestPartition::default();
    p.partition_index = 0;
    p.committed_offset = 42;
    p.committed_metadata = Some(StrBytes::from_static_str("kept"));
    let mut t = OffsetCommitRequestTopic::default();
    t.name = name("data");
    t.partitions = vec![p];
    let mut oc = OffsetCommitRequest::default();
    oc.group_id = kafka_protocol::messages::GroupId(StrBytes::from_static_str("g"));
    oc.generation_id_or_member_epoch = -1;
    oc.topics = vec![t];
    let r = cl.call(2, &oc).await.unwrap();
    assert_eq!(r.topics[0].partitions[0].error_code, 0);

    // A user kept, and one added and then removed.
    let sha512 = ScramMechanism::Sha512;
    let carol = ScramCredential::new(sha512, b"carol-pw", 4096).unwrap();
    b.set_credential("carol", sha512, carol.clone())
        .await
        .unwrap();
    let dave = ScramCredential::new(ScramMechanism::Sha256, b"dave-pw", 4096).unwrap();
    b.set_credential("dave", ScramMechanism::Sha256, dave)
        .await
        .unwrap();
    b.remove_credential("dave", ScramMechanism::Sha256)
        .await
        .unwrap();
    let meta_end = |b: &Broker| {
        b.log()
            .partitions()
            .into_iter()
            .find(|p| p.1 == META_TOPIC)
            .map(|p| (p.3, p.4))
            .unwrap()
    };
    let credentials_end = meta_end(&b).1;

    // About four laps of the ring, slowly enough for the snapshot ticker to keep up.
    let value = vec![7u8; 100 << 10];
    for _ in 0..400 {
        let mut pd = PartitionProduceData::default();
        pd.records = Some(Bytes::from(record_batch(&[&value], None)));
        let mut td = TopicProduceData::default();
        td.name = name("data");
        td.partition_data = vec![pd];
        let mut pr = ProduceRequest::default();
        pr.acks = -1;
        pr.timeout_ms = 10_000;
        pr.topic_data = vec![td];
        let r = cl.call(7, &pr).await.unwrap();
        assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let offsets_start = b
        .log()
        .partitions()
        .into_iter()
        .find(|p| p.1 == OFFSETS_TOPIC)
        .map(|p| p.3)
        .unwrap();
    assert!(
        offsets_start > 0,
        "the ring never freed the first commit: the test proves nothing"
    );
    assert!(
        meta_end(&b).0 >= credentials_end,
        "the ring never freed the credential records: the test proves nothing"
    );

    handle.power_cut();
    server.kill();
    let b2 = open(handle.power_on());
    let got = b2
        .offsets()
        .get("g", "data", 0)
        .expect("the commit is gone");
    assert_eq!((got.offset, got.metadata.as_deref()), (42, Some("kept")));
    assert!(b2.topics().map.contains_key("data"));
    assert!(
        !b2.topics().map.contains_key("gone"),
        "the deleted topic came back"
    );
    assert_eq!(b2.credentials().get("carol", sha512), Some(carol));
    assert!(b2.credentials().for_plain("carol").is_some());
    let users: Vec<String> = b2
        .credentials()
        .list()
        .into_iter()
        .map(|c| c.user)
        .collect();
    assert_eq!(
        users,
        ["carol"],
        "the removed user came back, or carol is gone"
    );
}
