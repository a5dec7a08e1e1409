//! The broker's own state (committed offsets, topic tombstones, SCRAM credentials) lives in
//! internal partitions of the same ring as the data. When the ring wraps and the oldest data is
//! freed, the periodic snapshot keeps that state alive: after several laps and a power cut, it is
//! all still there (topic ids included, which follow from the topics' incarnations).

use crate::common;

use frontend::client::Client;
use frontend::meta::{META_TOPIC, OFFSETS_TOPIC};
use frontend::sasl::{ScramCredential, ScramMechanism};
use frontend::{Broker, Config};
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
    // Topic ids come from the topic's incarnation: "again", deleted and created anew, has a
    // second id, which must outlive the wrap that frees its tombstone.
    let data_id = b.topics().id("data").expect("an id");
    common::create_topic(&mut cl, "again").await;
    let first_again = b.topics().id("again").expect("an id");
    del.topic_names = vec![name("again")];
    assert_eq!(cl.call(3, &del).await.unwrap().responses[0].error_code, 0);
    common::create_topic(&mut cl, "again").await;
    let again_id = b.topics().id("again").expect("an id");
    assert_ne!(again_id, first_again);

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

    common::lap_the_ring(&mut cl, "data").await;
    let offsets_start = common::internal_start(&b, OFFSETS_TOPIC);
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
    let b2 = common::reopen(handle.power_on(), Config::default());
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
    assert_eq!(b2.topics().id("data"), Some(data_id));
    assert_eq!(
        b2.topics().id("again"),
        Some(again_id),
        "the re-created topic's id changed"
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
