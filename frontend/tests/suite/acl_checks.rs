//! With the authorizer on, every request is checked against the ACLs and a denied one gets the
//! error code Kafka's clients expect: TOPIC_AUTHORIZATION_FAILED per partition (and nothing
//! stored), GROUP_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED; Metadata leaves out what
//! the principal may not describe.

use crate::common;

use std::sync::Arc;

use bytes::Bytes;
use common::inproc::*;
use frontend::client::{record_batch, Client};
use frontend::codes::*;
use frontend::{Broker, Config};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// One batch to each of `parts` of topic `t`.
fn produce(t: &str, parts: &[i32]) -> ProduceRequest {
    let mut td = TopicProduceData::default();
    td.name = TopicName(s(t));
    for &i in parts {
        let mut p = PartitionProduceData::default();
        p.index = i;
        p.records = Some(Bytes::from(record_batch(&[b"v"], None)));
        td.partition_data.push(p);
    }
    let mut r = ProduceRequest::default();
    r.acks = -1;
    r.timeout_ms = 10_000;
    r.topic_data = vec![td];
    r
}

fn fetch(t: &str) -> FetchRequest {
    let mut p = FetchPartition::default();
    p.partition_max_bytes = 1 << 20;
    let mut ft = FetchTopic::default();
    ft.topic = TopicName(s(t));
    ft.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.replica_id = BrokerId(-1);
    r.max_bytes = 1 << 20;
    r.max_wait_ms = 100;
    r.topics = vec![ft];
    r
}

/// The served fast paths (Produce and Fetch on the event loop) refuse what the principal
/// (`User:ANONYMOUS` on a plain connection) may not do, per partition, and store nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_paths_refuse_denied_produce_and_fetch_per_partition() {
    let (addr, server) = common::serve(authorizing()).await;
    let b = server.broker().clone();
    assert!(b.create_topic("a", 2).await.unwrap());
    assert!(b.create_topic("b", 2).await.unwrap());
    grant(&b, read_write("a", "User:ANONYMOUS")).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    for v in [3, 8] {
        let r = c.call(v, &produce("b", &[0, 1])).await.unwrap();
        let codes: Vec<i16> = r.responses[0]
            .partition_responses
            .iter()
            .map(|p| p.error_code)
            .collect();
        assert_eq!(codes, vec![TOPIC_AUTHORIZATION_FAILED; 2], "v{v}");
        if v >= 8 {
            let m = r.responses[0].partition_responses[0]
                .error_message
                .as_ref()
                .unwrap();
            assert!(m.contains("User:ANONYMOUS"), "{m}");
        }
    }
    assert_eq!(
        (common::end_of(&b, "b", 0), common::end_of(&b, "b", 1)),
        (0, 0),
        "a denied batch was stored"
    );
    let r = c.call(8, &produce("a", &[0, 1])).await.unwrap();
    assert!(r.responses[0]
        .partition_responses
        .iter()
        .all(|p| p.error_code == NONE));
    assert_eq!(common::end_of(&b, "a", 0), 1);

    let r = c.call(11, &fetch("b")).await.unwrap();
    assert_eq!(
        r.responses[0].partitions[0].error_code,
        TOPIC_AUTHORIZATION_FAILED
    );
    assert!(r.responses[0].partitions[0]
        .records
        .as_ref()
        .is_none_or(|x| x.is_empty()));
    let r = c.call(11, &fetch("a")).await.unwrap();
    assert_eq!(r.responses[0].partitions[0].error_code, NONE);
    assert!(r.responses[0].partitions[0]
        .records
        .as_ref()
        .is_some_and(|x| !x.is_empty()));
    // From v13 a Fetch names topics by id: the check reads the topic the id names.
    let by_id = |t: &str| {
        let mut r = fetch(t);
        r.topics[0].topic_id = b.topics().id(t).expect("topic id");
        r.topics[0].topic = TopicName::default();
        r
    };
    let r = c.call(13, &by_id("b")).await.unwrap();
    assert_eq!(
        r.responses[0].partitions[0].error_code,
        TOPIC_AUTHORIZATION_FAILED
    );
    let r = c.call(13, &by_id("a")).await.unwrap();
    assert_eq!(r.responses[0].partitions[0].error_code, NONE);
    assert!(r.responses[0].partitions[0]
        .records
        .as_ref()
        .is_some_and(|x| !x.is_empty()));

    // A deny added later takes effect on the same connection (its cached decision is dropped).
    grant(
        &b,
        vec![binding(TOPIC, "a", PREFIXED, "User:*", WRITE, "deny")],
    )
    .await;
    let r = c.call(8, &produce("a", &[0])).await.unwrap();
    assert_eq!(
        r.responses[0].partition_responses[0].error_code,
        TOPIC_AUTHORIZATION_FAILED
    );
    assert_eq!(common::end_of(&b, "a", 0), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slow_paths_and_list_offsets_are_checked_too() {
    let b = common::broker(authorizing());
    b.create_topic("a", 1).await.unwrap();
    b.create_topic("b", 1).await.unwrap();
    grant(&b, read_write("a", "User:alice")).await;
    let alice = session("alice");
    let r = call(&b, &alice, 8, &produce("b", &[0])).await;
    assert_eq!(
        r.responses[0].partition_responses[0].error_code,
        TOPIC_AUTHORIZATION_FAILED
    );
    assert_eq!(common::end_of(&b, "b", 0), 0);
    let r = call(&b, &alice, 8, &produce("a", &[0])).await;
    assert_eq!(r.responses[0].partition_responses[0].error_code, NONE);
    let r = call(&b, &alice, 11, &fetch("b")).await;
    assert_eq!(
        r.responses[0].partitions[0].error_code,
        TOPIC_AUTHORIZATION_FAILED
    );

    let lo = |t: &str| {
        let mut p = ListOffsetsPartition::default();
        p.timestamp = -1;
        let mut lt = ListOffsetsTopic::default();
        lt.name = TopicName(s(t));
        lt.partitions = vec![p];
        let mut r = ListOffsetsRequest::default();
        r.replica_id = BrokerId(-1);
        r.topics = vec![lt];
        r
    };
    let r = call(&b, &alice, 5, &lo("b")).await;
    assert_eq!(
        r.topics[0].partitions[0].error_code,
        TOPIC_AUTHORIZATION_FAILED
    );
    // Write implies Describe, which ListOffsets needs.
    let r = call(&b, &alice, 5, &lo("a")).await;
    assert_eq!(
        (
            r.topics[0].partitions[0].error_code,
            r.topics[0].partitions[0].offset
        ),
        (NONE, 1)
    );
    // A super user needs no ACL.
    let r = call(&b, &session("admin"), 8, &produce("b", &[0])).await;
    assert_eq!(r.responses[0].partition_responses[0].error_code, NONE);
}

fn metadata(names: Option<&[&str]>) -> MetadataRequest {
    let mut m = MetadataRequest::default();
    m.topics = names.map(|ns| {
        ns.iter()
            .map(|n| {
                let mut t = MetadataRequestTopic::default();
                t.name = Some(TopicName(s(n)));
                t
            })
            .collect()
    });
    m.allow_auto_topic_creation = true;
    m
}

fn topic_codes(r: &MetadataResponse) -> Vec<(String, i16)> {
    r.topics
        .iter()
        .map(|t| {
            (
                t.name
                    .as_ref()
                    .map(|n| n.as_str().to_string())
                    .unwrap_or_default(),
                t.error_code,
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_hides_topics_and_auto_create_needs_create() {
    let b = common::broker(authorizing());
    for t in ["a", "b", "c"] {
        b.create_topic(t, 1).await.unwrap();
    }
    grant(
        &b,
        vec![
            binding(TOPIC, "a", LITERAL, "User:alice", DESCRIBE, "allow"),
            binding(TOPIC, "b", LITERAL, "User:alice", READ, "allow"),
            binding(TOPIC, "new-", PREFIXED, "User:alice", DESCRIBE, "allow"),
        ],
    )
    .await;
    let alice = session("alice");
    let all = call(&b, &alice, 8, &metadata(None)).await;
    assert_eq!(
        topic_codes(&all),
        vec![("a".into(), NONE), ("b".into(), NONE)]
    );
    let named = call(&b, &alice, 8, &metadata(Some(&["c", "a", "zzz"]))).await;
    assert_eq!(
        topic_codes(&named),
        vec![
            ("c".into(), TOPIC_AUTHORIZATION_FAILED),
            ("a".into(), NONE),
            // Not even its absence is told.
            ("zzz".into(), TOPIC_AUTHORIZATION_FAILED),
        ]
    );
    // May describe new-x but not create it: refused, not created.
    let r = call(&b, &alice, 8, &metadata(Some(&["new-x"]))).await;
    assert_eq!(
        topic_codes(&r),
        vec![("new-x".into(), TOPIC_AUTHORIZATION_FAILED)]
    );
    assert!(!b.topics().map.contains_key("new-x"));
    grant(
        &b,
        vec![binding(
            TOPIC,
            "new-",
            PREFIXED,
            "User:alice",
            CREATE,
            "allow",
        )],
    )
    .await;
    let r = call(&b, &alice, 8, &metadata(Some(&["new-x"]))).await;
    assert_eq!(topic_codes(&r), vec![("new-x".into(), NONE)]);
    assert!(b.topics().map.contains_key("new-x"));
    // Bob has no ACL at all: sees nothing.
    let r = call(&b, &session("bob"), 8, &metadata(None)).await;
    assert!(r.topics.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_apis_need_create_delete_alter_and_idempotent_write() {
    use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    let b = common::broker(authorizing());
    b.create_topic("a", 1).await.unwrap();
    let alice = session("alice");
    let mut ct = CreatableTopic::default();
    ct.name = TopicName(s("x"));
    ct.num_partitions = 1;
    ct.replication_factor = 1;
    let mut create = CreateTopicsRequest::default();
    create.topics = vec![ct];
    let mut del = DeleteTopicsRequest::default();
    del.topic_names = vec![TopicName(s("a"))];
    let mut cpt = CreatePartitionsTopic::default();
    cpt.name = TopicName(s("a"));
    cpt.count = 2;
    let mut grow = CreatePartitionsRequest::default();
    grow.topics = vec![cpt];
    let ipid = InitProducerIdRequest::default();

    assert_eq!(
        call(&b, &alice, 4, &create).await.topics[0].error_code,
        TOPIC_AUTHORIZATION_FAILED
    );
    assert_eq!(
        call(&b, &alice, 3, &del).await.responses[0].error_code,
        TOPIC_AUTHORIZATION_FAILED
    );
    assert_eq!(
        call(&b, &alice, 1, &grow).await.results[0].error_code,
        TOPIC_AUTHORIZATION_FAILED
    );
    assert_eq!(
        call(&b, &alice, 1, &ipid).await.error_code,
        CLUSTER_AUTHORIZATION_FAILED
    );
    assert!(!b.topics().map.contains_key("x"));
    assert_eq!(b.topics().map["a"].len(), 1);

    grant(
        &b,
        vec![
            binding(
                CLUSTER,
                "kafka-cluster",
                LITERAL,
                "User:alice",
                CREATE,
                "allow",
            ),
            binding(
                CLUSTER,
                "kafka-cluster",
                LITERAL,
                "User:alice",
                IDEMPOTENT_WRITE,
                "allow",
            ),
            binding(TOPIC, "a", LITERAL, "User:alice", ALTER, "allow"),
        ],
    )
    .await;
    assert_eq!(
        call(&b, &alice, 4, &create).await.topics[0].error_code,
        NONE
    );
    assert_eq!(call(&b, &alice, 1, &grow).await.results[0].error_code, NONE);
    assert_eq!(call(&b, &alice, 1, &ipid).await.error_code, NONE);
    assert_eq!(
        call(&b, &alice, 3, &del).await.responses[0].error_code,
        TOPIC_AUTHORIZATION_FAILED
    );
    grant(
        &b,
        vec![binding(TOPIC, "*", LITERAL, "User:alice", ALL, "allow")],
    )
    .await;
    assert_eq!(
        call(&b, &alice, 3, &del).await.responses[0].error_code,
        NONE
    );
    assert!(!b.topics().map.contains_key("a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_requests_need_read_on_the_group_and_commits_read_on_the_topic() {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    let b = common::broker(authorizing());
    b.create_topic("t", 1).await.unwrap();
    let alice = session("alice");
    let g = || GroupId(s("g"));
    let mut find = FindCoordinatorRequest::default();
    find.key = s("g");
    let mut p = JoinGroupRequestProtocol::default();
    p.name = s("range");
    p.metadata = Bytes::from_static(&[0; 10]);
    let mut join = JoinGroupRequest::default();
    join.group_id = g();
    join.session_timeout_ms = 10_000;
    join.rebalance_timeout_ms = 10_000;
    join.protocol_type = s("consumer");
    join.protocols = vec![p];
    let mut sync = SyncGroupRequest::default();
    sync.group_id = g();
    let mut hb = HeartbeatRequest::default();
    hb.group_id = g();
    let mut leave = LeaveGroupRequest::default();
    leave.group_id = g();
    let mut cp = OffsetCommitRequestPartition::default();
    cp.committed_offset = 5;
    let mut ctopic = OffsetCommitRequestTopic::default();
    ctopic.name = TopicName(s("t"));
    ctopic.partitions = vec![cp];
    let mut commit = OffsetCommitRequest::default();
    commit.group_id = g();
    commit.generation_id_or_member_epoch = -1;
    commit.retention_time_ms = -1;
    commit.topics = vec![ctopic];
    let mut ftopic = OffsetFetchRequestTopic::default();
    ftopic.name = TopicName(s("t"));
    ftopic.partition_indexes = vec![0];
    let mut ofetch = OffsetFetchRequest::default();
    ofetch.group_id = g();
    ofetch.topics = Some(vec![ftopic]);

    let denied = GROUP_AUTHORIZATION_FAILED;
    assert_eq!(call(&b, &alice, 2, &find).await.error_code, denied);
    assert_eq!(call(&b, &alice, 5, &join).await.error_code, denied);
    assert_eq!(call(&b, &alice, 3, &sync).await.error_code, denied);
    assert_eq!(call(&b, &alice, 3, &hb).await.error_code, denied);
    assert_eq!(call(&b, &alice, 3, &leave).await.error_code, denied);
    assert_eq!(
        call(&b, &alice, 7, &commit).await.topics[0].partitions[0].error_code,
        denied
    );
    assert_eq!(call(&b, &alice, 5, &ofetch).await.error_code, denied);
    assert_eq!(
        call(&b, &alice, 1, &ofetch).await.topics[0].partitions[0].error_code,
        denied
    );
    assert!(b.offsets().get("g", "t", 0).is_none());

    // Read on the group, none on the topic: the commit is refused for the topic.
    grant(
        &b,
        vec![binding(GROUP, "g", LITERAL, "User:alice", READ, "allow")],
    )
    .await;
    assert_eq!(call(&b, &alice, 2, &find).await.error_code, NONE);
    let r = call(&b, &alice, 7, &commit).await;
    assert_eq!(
        r.topics[0].partitions[0].error_code,
        TOPIC_AUTHORIZATION_FAILED
    );
    let r = call(&b, &alice, 5, &ofetch).await;
    assert_eq!(
        (r.error_code, r.topics[0].partitions[0].error_code),
        (NONE, TOPIC_AUTHORIZATION_FAILED)
    );
    grant(
        &b,
        vec![binding(TOPIC, "t", LITERAL, "User:alice", READ, "allow")],
    )
    .await;
    assert_eq!(
        call(&b, &alice, 7, &commit).await.topics[0].partitions[0].error_code,
        NONE
    );
    let r = call(&b, &alice, 5, &ofetch).await;
    assert_eq!(r.topics[0].partitions[0].committed_offset, 5);
}

/// With the authorizer off (the default) nothing is checked: a principal without any ACL does
/// everything, and there is no cost beyond a bool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_by_default_everything_is_allowed() {
    let b: Arc<Broker> = common::broker(Config::default());
    b.create_topic("a", 1).await.unwrap();
    let bob = session("bob");
    assert!(!b.acl().enabled());
    let r = call(&b, &bob, 8, &produce("a", &[0])).await;
    assert_eq!(r.responses[0].partition_responses[0].error_code, NONE);
    let r = call(&b, &bob, 8, &metadata(None)).await;
    assert_eq!(topic_codes(&r), vec![("a".into(), NONE)]);
}

/// The config, DeleteRecords and DescribeLogDirs APIs: DescribeConfigs / AlterConfigs on the
/// topic (or the cluster, for the broker's), Delete on the topic, Describe on the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configs_delete_records_and_log_dirs_are_checked() {
    let b = common::broker(authorizing());
    b.create_topic("a", 1).await.unwrap();
    grant(&b, read_write("a", "User:alice")).await;
    let alice = session("alice");
    let admin = session("admin");
    let resource = |rt: i8, name: &str| {
        let mut r = describe_configs_request::DescribeConfigsResource::default();
        r.resource_type = rt;
        r.resource_name = s(name);
        r
    };
    let mut describe = DescribeConfigsRequest::default();
    describe.resources = vec![resource(2, "a"), resource(4, "0")];
    let r = call(&b, &alice, 4, &describe).await;
    let codes: Vec<i16> = r.results.iter().map(|x| x.error_code).collect();
    assert_eq!(
        codes,
        vec![TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED]
    );
    assert!(r.results.iter().all(|x| x.configs.is_empty()));
    let r = call(&b, &admin, 4, &describe).await;
    assert!(r.results.iter().all(|x| x.error_code == NONE), "{r:?}");

    let mut alter = IncrementalAlterConfigsRequest::default();
    let mut res = incremental_alter_configs_request::AlterConfigsResource::default();
    res.resource_type = 2;
    res.resource_name = s("a");
    let mut c = incremental_alter_configs_request::AlterableConfig::default();
    c.name = s("retention.ms");
    c.value = Some(s("60000"));
    res.configs = vec![c];
    alter.resources = vec![res];
    let r = call(&b, &alice, 1, &alter).await;
    assert_eq!(r.responses[0].error_code, TOPIC_AUTHORIZATION_FAILED);
    assert!(b.topic_configs("a").set.is_empty(), "a denied alter took");
    // AlterConfigs implies DescribeConfigs: granted, alice may do both.
    grant(
        &b,
        vec![binding(TOPIC, "a", LITERAL, "User:alice", 11, "allow")],
    )
    .await;
    let r = call(&b, &alice, 1, &alter).await;
    assert_eq!(r.responses[0].error_code, NONE);
    let r = call(&b, &alice, 4, &describe).await;
    assert_eq!(r.results[0].error_code, NONE);

    let mut p = delete_records_request::DeleteRecordsPartition::default();
    p.offset = -1;
    let mut t = delete_records_request::DeleteRecordsTopic::default();
    t.name = TopicName(s("a"));
    t.partitions = vec![p];
    let mut del = DeleteRecordsRequest::default();
    del.topics = vec![t];
    let r = call(&b, &alice, 2, &del).await;
    assert_eq!(
        r.topics[0].partitions[0].error_code,
        TOPIC_AUTHORIZATION_FAILED
    );
    let r = call(&b, &admin, 2, &del).await;
    assert_eq!(r.topics[0].partitions[0].error_code, NONE);

    let r = call(&b, &alice, 4, &DescribeLogDirsRequest::default()).await;
    assert_eq!(
        (r.error_code, r.results.len()),
        (CLUSTER_AUTHORIZATION_FAILED, 0)
    );
    let r = call(&b, &admin, 4, &DescribeLogDirsRequest::default()).await;
    assert_eq!((r.error_code, r.results.len()), (NONE, 1));
}

/// The group tooling: ListGroups shows only the groups the principal may describe,
/// DescribeGroups needs Describe on the group, DeleteGroups Delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_tooling_is_checked() {
    let b = common::broker(authorizing());
    b.create_topic("a", 1).await.unwrap();
    let admin = session("admin");
    // Two groups holding offsets (committed outside a group generation).
    for g in ["mine", "theirs"] {
        let mut p = OffsetCommitRequestPartition::default();
        p.committed_offset = 1;
        let mut t = OffsetCommitRequestTopic::default();
        t.name = TopicName(s("a"));
        t.partitions = vec![p];
        let mut oc = OffsetCommitRequest::default();
        oc.group_id = GroupId(s(g));
        oc.generation_id_or_member_epoch = -1;
        oc.topics = vec![t];
        let r = call(&b, &admin, 2, &oc).await;
        assert_eq!(r.topics[0].partitions[0].error_code, NONE);
    }
    grant(
        &b,
        vec![binding(
            GROUP,
            "mine",
            LITERAL,
            "User:alice",
            DESCRIBE,
            "allow",
        )],
    )
    .await;
    let alice = session("alice");
    let r = call(&b, &alice, 4, &ListGroupsRequest::default()).await;
    let names: Vec<String> = r.groups.iter().map(|g| g.group_id.to_string()).collect();
    assert_eq!(names, vec!["mine".to_string()]);
    let r = call(&b, &admin, 4, &ListGroupsRequest::default()).await;
    assert_eq!(r.groups.len(), 2);

    let mut d = DescribeGroupsRequest::default();
    d.groups = vec![GroupId(s("mine")), GroupId(s("theirs"))];
    let r = call(&b, &alice, 5, &d).await;
    let codes: Vec<i16> = r.groups.iter().map(|g| g.error_code).collect();
    assert_eq!(codes, vec![NONE, GROUP_AUTHORIZATION_FAILED]);

    let mut del = DeleteGroupsRequest::default();
    del.groups_names = vec![GroupId(s("theirs"))];
    let r = call(&b, &alice, 2, &del).await;
    assert_eq!(r.results[0].error_code, GROUP_AUTHORIZATION_FAILED);
    let r = call(&b, &admin, 2, &del).await;
    assert_eq!(r.results[0].error_code, NONE);
}

/// Each topic's error codes in a Produce answer, in the request's order.
fn produce_codes(r: &ProduceResponse) -> Vec<Vec<i16>> {
    r.responses
        .iter()
        .map(|t| t.partition_responses.iter().map(|p| p.error_code).collect())
        .collect()
}

/// One Produce naming every partition of a denied topic beside an allowed topic (one of whose
/// indexes does not exist) and a topic that does not exist: each partition answers its topic's
/// refusal (decided once per topic), the allowed partitions are stored and nothing else is, the
/// same on the event loop's path and on the in-process one. A request refused as a whole (acks=2)
/// still answers a topic's own refusal first, and from v13 an id no topic has is refused as
/// such beside a denied topic named by id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_partitions_of_refused_and_mixed_topics_in_one_produce() {
    let (addr, server) = common::serve(authorizing()).await;
    let b = server.broker().clone();
    assert!(b.create_topic("a", 4).await.unwrap());
    assert!(b.create_topic("b", 64).await.unwrap());
    grant(&b, read_write("a", "User:ANONYMOUS")).await;
    grant(&b, read_write("a", "User:carol")).await;
    let every_b: Vec<i32> = (0..64).collect();
    let request = || {
        let mut r = produce("b", &every_b);
        for (t, parts) in [("a", &[0, 1, 2, 3, 9][..]), ("nope", &[0, 1][..])] {
            r.topic_data.extend(produce(t, parts).topic_data);
        }
        r
    };
    let want = vec![
        vec![TOPIC_AUTHORIZATION_FAILED; 64],
        vec![NONE, NONE, NONE, NONE, UNKNOWN_TOPIC_OR_PARTITION],
        vec![TOPIC_AUTHORIZATION_FAILED; 2],
    ];
    let mut c = Client::connect(addr, "t").await.unwrap();
    let carol = session("carol");
    let served = c.call(8, &request()).await.unwrap();
    let inproc = call(&b, &carol, 8, &request()).await;
    for (r, who) in [(&served, "User:ANONYMOUS"), (&inproc, "User:carol")] {
        assert_eq!(produce_codes(r), want, "{who}");
        for p in &r.responses[0].partition_responses {
            let m = p.error_message.as_ref().expect("a message");
            assert!(m.contains(who) && m.contains("\"b\""), "{m}");
        }
        let missing = &r.responses[1].partition_responses[4];
        let m = missing.error_message.as_ref().expect("a message");
        assert!(m.contains("a/9"), "{m}");
    }
    assert!(
        every_b.iter().all(|&i| common::end_of(&b, "b", i) == 0),
        "a denied batch was stored"
    );
    for i in 0..4 {
        assert_eq!(common::end_of(&b, "a", i), 2, "partition {i} of a");
    }

    let mut refused_whole = request();
    refused_whole.acks = 2;
    let want = vec![
        vec![TOPIC_AUTHORIZATION_FAILED; 64],
        vec![INVALID_REQUIRED_ACKS; 5],
        vec![TOPIC_AUTHORIZATION_FAILED; 2],
    ];
    let r = c.call(8, &refused_whole).await.unwrap();
    assert_eq!(produce_codes(&r), want);
    assert_eq!(
        produce_codes(&call(&b, &carol, 8, &refused_whole).await),
        want
    );

    let mut by_id = request();
    by_id.topic_data.truncate(2);
    for (t, name) in by_id.topic_data.iter_mut().zip(["b", "a"]) {
        t.topic_id = b.topics().id(name).expect("topic id");
        t.name = TopicName::default();
    }
    by_id.topic_data[1].topic_id = Uuid::from_u128(0x6e76_6d71_0000_0000_0000_0000_0000_0001);
    let want = vec![
        vec![TOPIC_AUTHORIZATION_FAILED; 64],
        vec![UNKNOWN_TOPIC_ID; 5],
    ];
    let r = c.call(13, &by_id).await.unwrap();
    assert_eq!(produce_codes(&r), want);
    assert_eq!(produce_codes(&call(&b, &carol, 13, &by_id).await), want);
    for i in 0..4 {
        assert_eq!(common::end_of(&b, "a", i), 2, "partition {i} of a");
    }
}
