//! The newest (flexible) versions do what their fields say: topic ids that name topics in
//! Metadata, Fetch, CreateTopics and DeleteTopics and survive a restart; Produce v11 and Fetch
//! v12/v17 round trips; batched FindCoordinator, multi-group OffsetFetch, the group protocol in
//! JoinGroup v9 and SyncGroup v5; ListOffsets v9's earliest-local and latest-tiered.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use frontend::client::{record_batch, Client};
use frontend::codes;
use frontend::Config;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn tn(v: &str) -> TopicName {
    TopicName(s(v))
}

/// Metadata v12 for one topic, by name (auto-creating it) or by id.
async fn metadata(c: &mut Client, name: Option<&str>, id: Uuid) -> MetadataResponse {
    let mut t = MetadataRequestTopic::default();
    t.name = name.map(tn);
    t.topic_id = id;
    let mut m = MetadataRequest::default();
    m.topics = Some(vec![t]);
    m.allow_auto_topic_creation = true;
    c.call(12, &m).await.unwrap()
}

/// Fetch at `v` of partition 0 from offset 0: by name below v13, by id from v13.
async fn fetch(c: &mut Client, v: i16, name: &str, id: Uuid) -> FetchResponse {
    let mut p = FetchPartition::default();
    p.partition_max_bytes = 1 << 20;
    let mut t = FetchTopic::default();
    if v >= 13 {
        t.topic_id = id;
    } else {
        t.topic = tn(name);
    }
    t.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.max_bytes = 1 << 20;
    r.topics = vec![t];
    c.call(v, &r).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_ids_name_topics_across_apis_and_survive_a_restart() {
    let (dev, handle) = common::sim_device(11, 64 << 20, 100);
    let server = common::server_on(dev, Config::default());
    let mut c = Client::connect(server.local_addr(), "ids").await.unwrap();

    // CreateTopics v7 reports the id, and what it created.
    let mut ct = CreatableTopic::default();
    ct.name = tn("ids");
    ct.num_partitions = 2;
    ct.replication_factor = 1;
    let mut cr = CreateTopicsRequest::default();
    cr.topics = vec![ct];
    cr.timeout_ms = 5000;
    let created = c.call(7, &cr).await.unwrap().topics.remove(0);
    assert_eq!(created.error_code, 0);
    assert_eq!((created.num_partitions, created.replication_factor), (2, 1));
    let id = created.topic_id;
    assert!(!id.is_nil());

    // Metadata v12 gives the same id by name, and the name by id.
    let by_name = metadata(&mut c, Some("ids"), Uuid::nil()).await;
    assert_eq!(by_name.topics[0].topic_id, id);
    assert_eq!(by_name.topics[0].partitions.len(), 2);
    let by_id = metadata(&mut c, None, id).await;
    assert_eq!(by_id.topics[0].error_code, 0);
    assert_eq!(
        by_id.topics[0].name.as_ref().map(|n| n.as_str()),
        Some("ids")
    );
    assert_eq!(
        by_id.topics[0].topic_authorized_operations,
        i32::MIN,
        "authorized operations not asked for"
    );
    let other = metadata(&mut c, Some("other"), Uuid::nil()).await;
    assert_ne!(other.topics[0].topic_id, id);

    // Produce v11, then Fetch: v12 by name and v17 by id read the same records.
    let p = common::produce_request("ids", 0, record_batch(&[b"a", b"b"], None), -1);
    let pr = c.call(11, &p).await.unwrap();
    assert_eq!(pr.responses[0].partition_responses[0].error_code, 0);
    for v in [12, 13, 16, 17] {
        let f = fetch(&mut c, v, "ids", id).await;
        let part = &f.responses[0].partitions[0];
        assert_eq!(part.error_code, 0, "Fetch v{v}");
        assert_eq!(part.high_watermark, 2, "Fetch v{v}");
        let records = part.records.clone().unwrap_or_default();
        assert!(records.len() > 61, "Fetch v{v}: no batch");
        if v >= 13 {
            assert_eq!(f.responses[0].topic_id, id, "Fetch v{v}");
        }
    }
    let unknown = fetch(&mut c, 17, "", Uuid::from_u128(42)).await;
    assert_eq!(
        unknown.responses[0].partitions[0].error_code,
        codes::UNKNOWN_TOPIC_ID
    );

    // DeleteTopics v6 by id; the id is then unknown, and the name, created again, has a new
    // one.
    let mut d = DeleteTopicState::default();
    d.topic_id = id;
    let mut dr = DeleteTopicsRequest::default();
    dr.topics = vec![d];
    dr.timeout_ms = 5000;
    let deleted = c.call(6, &dr).await.unwrap().responses.remove(0);
    assert_eq!(deleted.error_code, 0);
    assert_eq!(deleted.name.as_ref().map(|n| n.as_str()), Some("ids"));
    assert_eq!(deleted.topic_id, id);
    let gone = metadata(&mut c, None, id).await;
    assert_eq!(gone.topics[0].error_code, codes::UNKNOWN_TOPIC_ID);
    let again = c.call(6, &dr).await.unwrap().responses.remove(0);
    assert_eq!(again.error_code, codes::UNKNOWN_TOPIC_ID);
    let new_id = metadata(&mut c, Some("ids"), Uuid::nil()).await.topics[0].topic_id;
    assert!(!new_id.is_nil());
    assert_ne!(new_id, id, "a re-created topic must not take the old id");

    // After a power cut, the same names have the same ids.
    handle.power_cut();
    server.kill();
    let server = common::server_on(handle.power_on(), Config::default());
    let mut c = Client::connect(server.local_addr(), "ids").await.unwrap();
    let after = metadata(&mut c, Some("ids"), Uuid::nil()).await;
    assert_eq!(after.topics[0].topic_id, new_id);
    let after = metadata(&mut c, Some("other"), Uuid::nil()).await;
    assert_eq!(after.topics[0].topic_id, other.topics[0].topic_id);
    assert_eq!(
        metadata(&mut c, None, id).await.topics[0].error_code,
        codes::UNKNOWN_TOPIC_ID
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_apis_at_their_newest_versions() {
    let (addr, _server) = common::serve(Config::default()).await;
    let mut c = Client::connect(addr, "groups").await.unwrap();
    common::create_topic(&mut c, "gt").await;

    // FindCoordinator v4: one answer per key.
    let mut fc = FindCoordinatorRequest::default();
    fc.coordinator_keys = vec![s("g1"), s("g2")];
    let r = c.call(4, &fc).await.unwrap();
    let keys: Vec<(&str, i16, i32)> = r
        .coordinators
        .iter()
        .map(|k| (k.key.as_str(), k.error_code, k.node_id.0))
        .collect();
    assert_eq!(keys, vec![("g1", 0, 0), ("g2", 0, 0)]);
    fc.key_type = 1;
    let r = c.call(4, &fc).await.unwrap();
    assert!(r
        .coordinators
        .iter()
        .all(|k| k.error_code == codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED));

    // JoinGroup v9 tells the protocol type and name; SyncGroup v5 checks and echoes them.
    let mut p = JoinGroupRequestProtocol::default();
    p.name = s("range");
    p.metadata = Bytes::from_static(b"m");
    let mut j = JoinGroupRequest::default();
    j.group_id = GroupId(s("g1"));
    j.session_timeout_ms = 10_000;
    j.rebalance_timeout_ms = 10_000;
    j.protocol_type = s("consumer");
    j.protocols = vec![p];
    let joined = tokio::time::timeout(Duration::from_secs(20), c.call(9, &j))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(joined.error_code, 0);
    assert_eq!(
        joined.protocol_type.as_ref().map(|t| t.as_str()),
        Some("consumer")
    );
    assert_eq!(
        joined.protocol_name.as_ref().map(|t| t.as_str()),
        Some("range")
    );
    assert!(!joined.skip_assignment);
    let mut sync = SyncGroupRequest::default();
    sync.group_id = GroupId(s("g1"));
    sync.generation_id = joined.generation_id;
    sync.member_id = joined.member_id.clone();
    sync.protocol_type = Some(s("consumer"));
    sync.protocol_name = Some(s("roundrobin"));
    let mut a = SyncGroupRequestAssignment::default();
    a.member_id = joined.member_id.clone();
    a.assignment = Bytes::from_static(b"yours");
    sync.assignments = vec![a];
    let wrong = c.call(5, &sync).await.unwrap();
    assert_eq!(wrong.error_code, codes::INCONSISTENT_GROUP_PROTOCOL);
    sync.protocol_name = Some(s("range"));
    let synced = c.call(5, &sync).await.unwrap();
    assert_eq!(synced.error_code, 0);
    assert_eq!(&synced.assignment[..], b"yours");
    assert_eq!(
        synced.protocol_name.as_ref().map(|t| t.as_str()),
        Some("range")
    );
    assert_eq!(
        synced.protocol_type.as_ref().map(|t| t.as_str()),
        Some("consumer")
    );
    let mut hb = HeartbeatRequest::default();
    hb.group_id = GroupId(s("g1"));
    hb.generation_id = joined.generation_id;
    hb.member_id = joined.member_id.clone();
    assert_eq!(c.call(4, &hb).await.unwrap().error_code, 0);

    // OffsetCommit v9 in the group, then OffsetFetch v9 for two groups at once.
    let mut op = OffsetCommitRequestPartition::default();
    op.committed_offset = 7;
    op.committed_metadata = Some(s("seven"));
    let mut ot = OffsetCommitRequestTopic::default();
    ot.name = tn("gt");
    ot.partitions = vec![op];
    let mut oc = OffsetCommitRequest::default();
    oc.group_id = GroupId(s("g1"));
    oc.generation_id_or_member_epoch = joined.generation_id;
    oc.member_id = joined.member_id.clone();
    oc.topics = vec![ot];
    assert_eq!(
        c.call(9, &oc).await.unwrap().topics[0].partitions[0].error_code,
        0
    );
    let groups = ["g1", "g2"]
        .iter()
        .map(|g| {
            let mut t = OffsetFetchRequestTopics::default();
            t.name = tn("gt");
            t.partition_indexes = vec![0];
            let mut gr = OffsetFetchRequestGroup::default();
            gr.group_id = GroupId(s(g));
            gr.topics = Some(vec![t]);
            gr
        })
        .collect();
    let mut of = OffsetFetchRequest::default();
    of.groups = groups;
    let r = c.call(8, &of).await.unwrap();
    let got: Vec<(&str, i64, Option<&str>)> = r
        .groups
        .iter()
        .map(|g| {
            let p = &g.topics[0].partitions[0];
            (
                g.group_id.as_str(),
                p.committed_offset,
                p.metadata.as_ref().map(|m| m.as_str()),
            )
        })
        .collect();
    assert_eq!(got, vec![("g1", 7, Some("seven")), ("g2", -1, Some(""))]);
    // All topics of a group (null topics).
    let mut all = OffsetFetchRequestGroup::default();
    all.group_id = GroupId(s("g1"));
    all.topics = None;
    of.groups = vec![all];
    let r = c.call(9, &of).await.unwrap();
    assert_eq!(r.groups[0].topics[0].name.as_str(), "gt");
    assert_eq!(r.groups[0].topics[0].partitions[0].committed_offset, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_offsets_v9_and_init_producer_id_v4() {
    let (addr, _server) = common::serve(Config::default()).await;
    let mut c = Client::connect(addr, "lo").await.unwrap();
    common::create_topic(&mut c, "lo").await;
    let p = common::produce_request("lo", 0, record_batch(&[b"a", b"b", b"c"], None), -1);
    c.call(9, &p).await.unwrap();
    let mut offsets = Vec::new();
    for ts in [-1i64, -2, -4, -5] {
        let mut lp = ListOffsetsPartition::default();
        lp.timestamp = ts;
        let mut lt = ListOffsetsTopic::default();
        lt.name = tn("lo");
        lt.partitions = vec![lp];
        let mut r = ListOffsetsRequest::default();
        r.replica_id = BrokerId(-1);
        r.topics = vec![lt];
        let got = c
            .call(9, &r)
            .await
            .unwrap()
            .topics
            .remove(0)
            .partitions
            .remove(0);
        assert_eq!(got.error_code, 0, "timestamp {ts}");
        offsets.push(got.offset);
    }
    // latest, earliest, earliest local (everything is local), latest tiered (nothing is).
    assert_eq!(offsets, vec![3, 0, 0, -1]);

    let mut ip = InitProducerIdRequest::default();
    ip.transaction_timeout_ms = 60_000;
    let first = c.call(4, &ip).await.unwrap();
    assert_eq!((first.error_code, first.producer_epoch), (0, 0));
    // Naming the producer asks for a bump: a producer without a transactional id gets a new id.
    ip.producer_id = first.producer_id;
    ip.producer_epoch = 0;
    let bumped = c.call(4, &ip).await.unwrap();
    assert_eq!(bumped.error_code, 0);
    assert_ne!(bumped.producer_id, first.producer_id);
    // An id without an epoch is not a producer.
    ip.producer_epoch = -1;
    assert_eq!(
        c.call(4, &ip).await.unwrap().error_code,
        codes::INVALID_REQUEST
    );
}
