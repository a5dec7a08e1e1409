//! DescribeCluster, leader epochs (OffsetForLeaderEpoch, and epoch 0 in Metadata, Fetch and
//! ListOffsets), and transactions refused at their first request.

use crate::common;

use frontend::client::{record_batch, Client};
use frontend::codes;
use frontend::Config;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_cluster_names_this_broker_as_the_cluster_and_its_controller() {
    let cfg = Config {
        advertise_host: "broker.example".into(),
        advertise_port: 19092,
        ..Config::default()
    };
    let (addr, _s) = common::serve(cfg).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    let mut md = MetadataRequest::default();
    md.topics = Some(vec![]);
    let meta = c.call(8, &md).await.unwrap();
    let every: i32 = frontend::acl::operations::supported(frontend::acl::ResourceType::Cluster)
        .iter()
        .fold(0, |bits, op| bits | 1 << op.code());
    for v in 0..=2 {
        let mut r = DescribeClusterRequest::default();
        r.include_cluster_authorized_operations = true;
        r.endpoint_type = 1;
        r.include_fenced_brokers = v >= 2;
        let d = c.call(v, &r).await.unwrap();
        assert_eq!(d.error_code, codes::NONE);
        assert_eq!(Some(&d.cluster_id), meta.cluster_id.as_ref());
        assert_eq!(d.controller_id, meta.controller_id);
        assert_eq!(d.brokers.len(), 1);
        let b = &d.brokers[0];
        assert_eq!(
            (b.broker_id.0, b.host.as_str(), b.port),
            (0, "broker.example", 19092)
        );
        assert!(!b.is_fenced);
        // Asked, with the authorizer off: every cluster operation.
        assert_eq!(d.cluster_authorized_operations, every, "v{v}");
    }
    // Controllers are not served apart: endpoint type 2 is refused by name.
    let mut r = DescribeClusterRequest::default();
    r.endpoint_type = 2;
    let d = c.call(1, &r).await.unwrap();
    assert_eq!(d.error_code, codes::UNSUPPORTED_ENDPOINT_TYPE);
    assert!(d.error_message.is_some());
}

fn epoch_request(topic: &str, current: i32, requested: i32) -> OffsetForLeaderEpochRequest {
    let mut p = OffsetForLeaderPartition::default();
    p.current_leader_epoch = current;
    p.leader_epoch = requested;
    let mut t = OffsetForLeaderTopic::default();
    t.topic = TopicName(s(topic));
    t.partitions = vec![p];
    let mut r = OffsetForLeaderEpochRequest::default();
    r.replica_id = BrokerId(-1);
    r.topics = vec![t];
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_partition_is_at_leader_epoch_0_everywhere() {
    let (addr, _s) = common::serve(Config::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    common::create_topic(&mut c, "e").await;
    for _ in 0..3 {
        let r = c
            .call(
                7,
                &common::produce_request("e", 0, record_batch(&[b"x"], None), -1),
            )
            .await
            .unwrap();
        assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
    }
    let mut md = MetadataRequest::default();
    let mut mt = MetadataRequestTopic::default();
    mt.name = Some(TopicName(s("e")));
    md.topics = Some(vec![mt]);
    let m = c.call(8, &md).await.unwrap();
    assert_eq!(m.topics[0].partitions[0].leader_epoch, 0);

    // The end of epoch 0 is the high watermark; any other epoch is undefined.
    for v in 2..=4 {
        let r = c.call(v, &epoch_request("e", 0, 0)).await.unwrap();
        let e = &r.topics[0].partitions[0];
        assert_eq!(
            (e.error_code, e.leader_epoch, e.end_offset),
            (0, 0, 3),
            "v{v}"
        );
        let r = c.call(v, &epoch_request("e", -1, 5)).await.unwrap();
        let e = &r.topics[0].partitions[0];
        assert_eq!(
            (e.error_code, e.leader_epoch, e.end_offset),
            (0, -1, -1),
            "v{v}"
        );
        let r = c.call(v, &epoch_request("e", 1, 0)).await.unwrap();
        assert_eq!(
            r.topics[0].partitions[0].error_code,
            codes::UNKNOWN_LEADER_EPOCH
        );
        let r = c.call(v, &epoch_request("missing", 0, 0)).await.unwrap();
        assert_eq!(
            r.topics[0].partitions[0].error_code,
            codes::UNKNOWN_TOPIC_OR_PARTITION
        );
    }

    // Fetch and ListOffsets check the client's current epoch the same way.
    let fetch = |epoch: i32| {
        let mut p = FetchPartition::default();
        p.partition_max_bytes = 1 << 20;
        p.current_leader_epoch = epoch;
        let mut t = FetchTopic::default();
        t.topic = TopicName(s("e"));
        t.partitions = vec![p];
        let mut r = FetchRequest::default();
        r.replica_id = BrokerId(-1);
        r.max_bytes = 1 << 20;
        r.topics = vec![t];
        r
    };
    let ok = c.call(11, &fetch(0)).await.unwrap();
    let pd = &ok.responses[0].partitions[0];
    assert_eq!((pd.error_code, pd.high_watermark), (0, 3));
    assert!(pd.records.is_some());
    let newer = c.call(11, &fetch(1)).await.unwrap();
    assert_eq!(
        newer.responses[0].partitions[0].error_code,
        codes::UNKNOWN_LEADER_EPOCH
    );
    let list = |epoch: i32| {
        let mut p = ListOffsetsPartition::default();
        p.timestamp = -1;
        p.current_leader_epoch = epoch;
        let mut t = ListOffsetsTopic::default();
        t.name = TopicName(s("e"));
        t.partitions = vec![p];
        let mut r = ListOffsetsRequest::default();
        r.replica_id = BrokerId(-1);
        r.topics = vec![t];
        r
    };
    let l = c.call(5, &list(0)).await.unwrap();
    let p = &l.topics[0].partitions[0];
    assert_eq!((p.error_code, p.offset, p.leader_epoch), (0, 3, 0));
    let l = c.call(5, &list(-7)).await.unwrap();
    assert_eq!(
        l.topics[0].partitions[0].error_code,
        codes::FENCED_LEADER_EPOCH
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_are_refused_at_their_first_request_for_good() {
    let (addr, _s) = common::serve(Config::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    let mut fc = FindCoordinatorRequest::default();
    fc.key = s("my-txn");
    fc.key_type = 1;
    let r = c.call(2, &fc).await.unwrap();
    assert_eq!(r.error_code, codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    assert!(r
        .error_message
        .as_ref()
        .is_some_and(|m| m.contains("transactions")));
    let mut ip = InitProducerIdRequest::default();
    ip.transactional_id = Some(TransactionalId(s("my-txn")));
    ip.transaction_timeout_ms = 60_000;
    let r = c.call(1, &ip).await.unwrap();
    assert_eq!(
        (r.error_code, r.producer_id.0),
        (codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1)
    );
    // Idempotence without a transactional id still works.
    ip.transactional_id = None;
    let r = c.call(1, &ip).await.unwrap();
    assert_eq!(r.error_code, codes::NONE);
    assert!(r.producer_id.0 >= 0);
}
