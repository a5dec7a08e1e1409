//! KIP-430's authorized operations, computed from the ACLs by the checks the requests go through
//! (Metadata's topic and cluster fields, DescribeGroups', DescribeCluster's), and KIP-679's
//! idempotent producers: InitProducerId needs IdempotentWrite on the cluster or Write on some
//! topic, and their Produce only Write on the topic.

use crate::common;

use std::sync::Arc;

use bytes::Bytes;
use common::inproc::*;
use frontend::acl::operations::{decode, supported, NOT_REQUESTED};
use frontend::acl::{Operation, Operation::*, ResourceType};
use frontend::client::record_batch;
use frontend::codes::*;
use frontend::{Broker, Config};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// What `who` is told it may do on topic `t`, the cluster (Metadata v10), group `g`, and the
/// cluster again (DescribeCluster), each asked for.
struct Told {
    topic: Vec<Operation>,
    metadata_cluster: Vec<Operation>,
    group: Vec<Operation>,
    cluster: Vec<Operation>,
}

async fn told(b: &Arc<Broker>, who: &str) -> Told {
    let me = session(who);
    let mut mt = MetadataRequestTopic::default();
    mt.name = Some(TopicName(s("t")));
    let mut m = MetadataRequest::default();
    m.topics = Some(vec![mt]);
    m.include_topic_authorized_operations = true;
    m.include_cluster_authorized_operations = true;
    let r = call(b, &me, 10, &m).await;
    assert_eq!(r.topics[0].error_code, NONE, "{who}: Metadata of t");
    let (topic, metadata_cluster) = (
        r.topics[0].topic_authorized_operations,
        r.cluster_authorized_operations,
    );
    // v12 has no cluster field, and still the topic's.
    m.include_cluster_authorized_operations = false;
    let r = call(b, &me, 12, &m).await;
    assert_eq!(r.topics[0].topic_authorized_operations, topic, "{who}: v12");

    let mut g = DescribeGroupsRequest::default();
    g.groups = vec![GroupId(s("g"))];
    g.include_authorized_operations = true;
    let r = call(b, &me, 5, &g).await;
    assert_eq!(r.groups[0].error_code, NONE, "{who}: DescribeGroups");
    let group = r.groups[0].authorized_operations;

    let mut c = DescribeClusterRequest::default();
    c.include_cluster_authorized_operations = true;
    c.endpoint_type = 1;
    let cluster = call(b, &me, 1, &c).await.cluster_authorized_operations;
    Told {
        topic: decode(topic),
        metadata_cluster: decode(metadata_cluster),
        group: decode(group),
        cluster: decode(cluster),
    }
}

fn sorted(ops: &[Operation]) -> Vec<Operation> {
    let mut v = ops.to_vec();
    v.sort_by_key(|o| o.code());
    v
}

async fn broker_with_t_and_g(cfg: Config) -> Arc<Broker> {
    let b = common::broker(cfg);
    assert!(b.create_topic("t", 1).await.unwrap());
    b
}

/// Read on the topic and the group gives Read and the Describe it implies, nothing else; the
/// cluster (no binding) nothing; adding Describe on the cluster shows up at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_is_told_exactly_read_and_describe() {
    let b = broker_with_t_and_g(authorizing()).await;
    grant(
        &b,
        vec![
            binding(TOPIC, "t", LITERAL, "User:alice", READ, "allow"),
            binding(GROUP, "g", LITERAL, "User:alice", READ, "allow"),
        ],
    )
    .await;
    let t = told(&b, "alice").await;
    assert_eq!(t.topic, vec![Read, Describe]);
    assert_eq!(t.group, vec![Read, Describe]);
    assert_eq!(t.metadata_cluster, vec![]);
    assert_eq!(t.cluster, vec![]);

    grant(
        &b,
        vec![binding(
            CLUSTER,
            "kafka-cluster",
            LITERAL,
            "User:alice",
            DESCRIBE,
            "allow",
        )],
    )
    .await;
    let t = told(&b, "alice").await;
    assert_eq!(t.cluster, vec![Describe]);
    assert_eq!(t.metadata_cluster, vec![Describe]);
}

/// All on the topic less a Deny of Write: every topic operation but Write (a Deny beats the
/// All, as in the checks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_takes_its_operation_out() {
    let b = broker_with_t_and_g(authorizing()).await;
    grant(
        &b,
        vec![
            binding(TOPIC, "t", PREFIXED, "User:*", ALL, "allow"),
            binding(TOPIC, "t", LITERAL, "User:alice", WRITE, "deny"),
            binding(GROUP, "*", LITERAL, "User:alice", DESCRIBE, "allow"),
        ],
    )
    .await;
    let t = told(&b, "alice").await;
    let want: Vec<Operation> = sorted(supported(ResourceType::Topic))
        .into_iter()
        .filter(|&o| o != Write)
        .collect();
    assert_eq!(t.topic, want);
    assert_eq!(t.group, vec![Describe]);
}

/// A super user and, with the authorizer off, anyone: every operation the resource supports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn super_users_and_no_authorizer_are_told_everything() {
    let on = broker_with_t_and_g(authorizing()).await;
    let off = broker_with_t_and_g(Config::default()).await;
    for (b, who) in [(&on, "admin"), (&off, "bob")] {
        let t = told(b, who).await;
        assert_eq!(t.topic, sorted(supported(ResourceType::Topic)), "{who}");
        assert_eq!(t.group, sorted(supported(ResourceType::Group)), "{who}");
        let cluster = sorted(supported(ResourceType::Cluster));
        assert_eq!(t.cluster, cluster, "{who}");
        assert_eq!(t.metadata_cluster, cluster, "{who}");
    }
}

/// Not asked, the fields say so (Kafka's -2147483648), whatever the principal may do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_asked_is_not_requested() {
    let b = broker_with_t_and_g(authorizing()).await;
    let admin = session("admin");
    let mut g = DescribeGroupsRequest::default();
    g.groups = vec![GroupId(s("g"))];
    let r = call(&b, &admin, 5, &g).await;
    assert_eq!(r.groups[0].authorized_operations, NOT_REQUESTED);
    let mut c = DescribeClusterRequest::default();
    c.endpoint_type = 1;
    let r = call(&b, &admin, 1, &c).await;
    assert_eq!(r.cluster_authorized_operations, NOT_REQUESTED);
    let mut m = MetadataRequest::default();
    m.topics = None;
    let r = call(&b, &admin, 10, &m).await;
    assert_eq!(r.topics[0].topic_authorized_operations, NOT_REQUESTED);
    assert_eq!(r.cluster_authorized_operations, NOT_REQUESTED);
}

fn init_producer_id() -> InitProducerIdRequest {
    let mut r = InitProducerIdRequest::default();
    r.transaction_timeout_ms = 60_000;
    r.producer_id = ProducerId(-1);
    r.producer_epoch = -1;
    r
}

/// One idempotent batch (sequence 0) of producer `pid` to partition 0 of `t`.
fn idempotent_produce(t: &str, pid: i64) -> ProduceRequest {
    let mut p = PartitionProduceData::default();
    p.records = Some(Bytes::from(record_batch(&[b"v"], Some((pid, 0, 0)))));
    let mut td = TopicProduceData::default();
    td.name = TopicName(s(t));
    td.partition_data = vec![p];
    let mut r = ProduceRequest::default();
    r.acks = -1;
    r.timeout_ms = 10_000;
    r.topic_data = vec![td];
    r
}

/// KIP-679: Write on a topic (and nothing on the cluster) is enough to get a producer id and
/// produce with it; a principal with neither is refused CLUSTER_AUTHORIZATION_FAILED, as is one
/// whose only Write is denied again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_producers_need_write_on_some_topic_or_idempotent_write() {
    let b = broker_with_t_and_g(authorizing()).await;
    grant(
        &b,
        vec![
            binding(TOPIC, "t", LITERAL, "User:writer", WRITE, "allow"),
            binding(TOPIC, "t", LITERAL, "User:reader", READ, "allow"),
            binding(TOPIC, "t", LITERAL, "User:fenced", WRITE, "allow"),
            binding(TOPIC, "*", LITERAL, "User:fenced", WRITE, "deny"),
            binding(
                CLUSTER,
                "kafka-cluster",
                LITERAL,
                "User:idem",
                IDEMPOTENT_WRITE,
                "allow",
            ),
        ],
    )
    .await;
    for v in [0, 4] {
        let r = call(&b, &session("writer"), v, &init_producer_id()).await;
        assert_eq!(r.error_code, NONE, "writer v{v}");
        assert!(r.producer_id.0 >= 0);
        if v == 4 {
            let p = call(
                &b,
                &session("writer"),
                9,
                &idempotent_produce("t", r.producer_id.0),
            )
            .await;
            let part = &p.responses[0].partition_responses[0];
            assert_eq!(part.error_code, NONE, "{:?}", part.error_message);
            assert_eq!(part.base_offset, 0);
        }
        let r = call(&b, &session("idem"), v, &init_producer_id()).await;
        assert_eq!(r.error_code, NONE, "idem v{v}");
        for who in ["reader", "fenced", "nobody"] {
            let r = call(&b, &session(who), v, &init_producer_id()).await;
            assert_eq!(r.error_code, CLUSTER_AUTHORIZATION_FAILED, "{who} v{v}");
            assert_eq!(r.producer_id.0, -1);
        }
    }
}
