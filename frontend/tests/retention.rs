//! The broker's own state (committed offsets, topic tombstones) lives in internal partitions of
//! the same ring as the data. When the ring wraps and the oldest data is freed, the periodic
//! snapshot keeps that state alive: after several laps and a power cut, it is all still there.

mod common;

use frontend::client::Client;
use frontend::meta::OFFSETS_TOPIC;
use frontend::Config;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    DeleteTopicsRequest, MetadataRequest, OffsetCommitRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;

fn name(n: &str) -> TopicName {
    TopicName(StrBytes::from_string(n.to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_the_ring_wrapping_over_it_and_a_power_cut() {
    let (dev, handle) = common::small_ring(3);
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

    common::lap_the_ring(&mut cl, "data").await;
    let offsets_start = common::internal_start(&b, OFFSETS_TOPIC);
    assert!(
        offsets_start > 0,
        "the ring never freed the first commit: the test proves nothing"
    );

    handle.power_cut();
    server.kill();
    let b2 = common::reopen(handle.power_on());
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
}
