//! What the newest served versions (Kafka 4.1's) mean, over a real connection: Produce v13 names
//! topics by id (KIP-516), with UNKNOWN_TOPIC_ID for an id no live topic has (a deleted topic's
//! among them) and the ACLs of the topic the id names; FindCoordinator v6 refuses the share-group
//! key type (and any nvmq does not serve) with INVALID_REQUEST; Fetch v18 and InitProducerId v5
//! are served as before.

use crate::common;

use bytes::Bytes;
use common::inproc::*;
use frontend::client::{record_batch, Client};
use frontend::codes::*;
use frontend::Config;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// A Produce v13 of one batch holding `value` to each of `parts` of the topic with id `id`.
fn produce_by_id(id: Uuid, parts: &[i32], value: &[u8]) -> ProduceRequest {
    let mut t = TopicProduceData::default();
    t.topic_id = id;
    for &i in parts {
        let mut p = PartitionProduceData::default();
        p.index = i;
        p.records = Some(Bytes::from(record_batch(&[value], None)));
        t.partition_data.push(p);
    }
    let mut r = ProduceRequest::default();
    r.acks = -1;
    r.timeout_ms = 10_000;
    r.topic_data = vec![t];
    r
}

/// The id Metadata v12 gives topic `t`, as a client learns it.
async fn id_of(c: &mut Client, t: &str) -> Uuid {
    let mut mt = MetadataRequestTopic::default();
    mt.name = Some(TopicName(s(t)));
    let mut m = MetadataRequest::default();
    m.topics = Some(vec![mt]);
    let r = c.call(12, &m).await.expect("metadata");
    assert_eq!(r.topics[0].error_code, NONE, "{t}");
    r.topics[0].topic_id
}

/// (error code, base offset) of each partition of each topic of a Produce answer, with the id
/// each topic is answered under.
fn outcome(r: &ProduceResponse) -> Vec<(Uuid, Vec<(i16, i64)>)> {
    r.responses
        .iter()
        .map(|t| {
            let parts = t
                .partition_responses
                .iter()
                .map(|p| (p.error_code, p.base_offset))
                .collect();
            (t.topic_id, parts)
        })
        .collect()
}

/// Fetch v18 by id of partition 0 from offset 0; a follower's high watermark set, which a
/// broker without followers leaves aside.
async fn fetch_v18(c: &mut Client, id: Uuid) -> (i16, Bytes) {
    let mut p = FetchPartition::default();
    p.partition_max_bytes = 1 << 20;
    p.high_watermark = 5;
    let mut t = FetchTopic::default();
    t.topic_id = id;
    t.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.replica_id = BrokerId(-1);
    r.max_bytes = 1 << 20;
    r.topics = vec![t];
    let a = c.call(18, &r).await.expect("fetch");
    assert_eq!(a.responses[0].topic_id, id);
    let p = &a.responses[0].partitions[0];
    (p.error_code, p.records.clone().unwrap_or_default())
}

fn holds(records: &[u8], value: &[u8]) -> bool {
    records.windows(value.len()).any(|w| w == value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_v13_names_topics_by_id() {
    let (addr, server) = common::serve(Config::default()).await;
    let b = server.broker().clone();
    assert!(b.create_topic("ids", 2).await.unwrap());
    let mut c = Client::connect(addr, "t").await.unwrap();
    let id = id_of(&mut c, "ids").await;
    assert!(!id.is_nil());

    // A known id: stored in the topic it names, answered under that id.
    let r = c
        .call(13, &produce_by_id(id, &[0, 1], b"by-id"))
        .await
        .unwrap();
    assert_eq!(outcome(&r), vec![(id, vec![(NONE, 0), (NONE, 0)])]);
    assert_eq!(
        (common::end_of(&b, "ids", 0), common::end_of(&b, "ids", 1)),
        (1, 1)
    );
    let (code, records) = fetch_v18(&mut c, id).await;
    assert_eq!(code, NONE);
    assert!(holds(&records, b"by-id"), "the batch produced by id");

    // An id no topic has: UNKNOWN_TOPIC_ID for each partition, the known topic beside it in the
    // same request stored all the same.
    let stranger = Uuid::from_u128(0xfeed);
    let mut both = produce_by_id(id, &[1], b"second");
    both.topic_data
        .extend(produce_by_id(stranger, &[0, 1], b"lost").topic_data);
    let r = c.call(13, &both).await.unwrap();
    assert_eq!(
        outcome(&r),
        vec![
            (id, vec![(NONE, 1)]),
            (
                stranger,
                vec![(UNKNOWN_TOPIC_ID, -1), (UNKNOWN_TOPIC_ID, -1)]
            )
        ]
    );
    let m = r.responses[1].partition_responses[0]
        .error_message
        .as_ref()
        .expect("a message");
    assert!(m.contains(&stranger.to_string()), "{m}");
    assert_eq!(
        (common::end_of(&b, "ids", 0), common::end_of(&b, "ids", 1)),
        (1, 2)
    );

    // v12 still names topics by name (and answers by name).
    let mut by_name = produce_by_id(Uuid::nil(), &[0], b"v12");
    by_name.topic_data[0].name = TopicName(s("ids"));
    let r = c.call(12, &by_name).await.unwrap();
    assert_eq!(r.responses[0].name.as_str(), "ids");
    assert_eq!(r.responses[0].partition_responses[0].error_code, NONE);
    assert_eq!(r.responses[0].partition_responses[0].base_offset, 1);

    // Deleted and created again, the topic has a new id; the old one names nothing.
    assert!(b.delete_topic("ids").await.unwrap());
    assert!(b.create_topic("ids", 1).await.unwrap());
    let new_id = id_of(&mut c, "ids").await;
    assert_ne!(new_id, id);
    let r = c
        .call(13, &produce_by_id(id, &[0], b"stale"))
        .await
        .unwrap();
    assert_eq!(outcome(&r), vec![(id, vec![(UNKNOWN_TOPIC_ID, -1)])]);
    assert_eq!(
        common::end_of(&b, "ids", 0),
        0,
        "a batch for the old id was stored"
    );
    let r = c
        .call(13, &produce_by_id(new_id, &[0], b"fresh"))
        .await
        .unwrap();
    assert_eq!(outcome(&r), vec![(new_id, vec![(NONE, 0)])]);
    let (code, records) = fetch_v18(&mut c, new_id).await;
    assert_eq!(code, NONE);
    assert!(holds(&records, b"fresh") && !holds(&records, b"by-id"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_v13_by_id_is_checked_against_the_topic_the_id_names() {
    let cfg = Config {
        authorizer: true,
        super_users: vec![frontend::session::Principal::user("admin")],
        ..Config::default()
    };
    let (addr, server) = common::serve(cfg).await;
    let b = server.broker().clone();
    assert!(b.create_topic("a", 1).await.unwrap());
    assert!(b.create_topic("b", 1).await.unwrap());
    grant(&b, read_write("a", "User:ANONYMOUS")).await;
    let (ida, idb) = {
        let t = b.topics();
        (t.id("a").expect("id of a"), t.id("b").expect("id of b"))
    };
    let mut c = Client::connect(addr, "t").await.unwrap();

    let r = c.call(13, &produce_by_id(idb, &[0], b"no")).await.unwrap();
    assert_eq!(
        outcome(&r),
        vec![(idb, vec![(TOPIC_AUTHORIZATION_FAILED, -1)])]
    );
    let m = r.responses[0].partition_responses[0]
        .error_message
        .as_ref()
        .expect("a message");
    assert!(m.contains("User:ANONYMOUS") && m.contains("\"b\""), "{m}");
    assert_eq!(common::end_of(&b, "b", 0), 0, "a denied batch was stored");

    let r = c.call(13, &produce_by_id(ida, &[0], b"yes")).await.unwrap();
    assert_eq!(outcome(&r), vec![(ida, vec![(NONE, 0)])]);
    assert_eq!(common::end_of(&b, "a", 0), 1);

    // An id naming no topic tells nothing of any topic's ACLs: UNKNOWN_TOPIC_ID.
    let r = c
        .call(13, &produce_by_id(Uuid::from_u128(7), &[0], b"?"))
        .await
        .unwrap();
    assert_eq!(
        r.responses[0].partition_responses[0].error_code,
        UNKNOWN_TOPIC_ID
    );

    // The same on the slow path (requests started off the event loop), as User:bob and the
    // super user.
    let bob = session("bob");
    let r = call(&b, &bob, 13, &produce_by_id(ida, &[0], b"bob")).await;
    assert_eq!(
        outcome(&r),
        vec![(ida, vec![(TOPIC_AUTHORIZATION_FAILED, -1)])]
    );
    let stranger = Uuid::from_u128(8);
    let r = call(&b, &bob, 13, &produce_by_id(stranger, &[0], b"?")).await;
    assert_eq!(outcome(&r), vec![(stranger, vec![(UNKNOWN_TOPIC_ID, -1)])]);
    let r = call(
        &b,
        &session("admin"),
        13,
        &produce_by_id(idb, &[0], b"admin"),
    )
    .await;
    assert_eq!(outcome(&r), vec![(idb, vec![(NONE, 0)])]);
    assert_eq!(
        (common::end_of(&b, "a", 0), common::end_of(&b, "b", 0)),
        (1, 1)
    );
}

/// The answers to a FindCoordinator of `keys` of `key_type` at `v` (v4+: one per key).
async fn coordinators(
    c: &mut Client,
    v: i16,
    key_type: i8,
    keys: &[&str],
) -> Vec<(i16, i32, String)> {
    let mut r = FindCoordinatorRequest::default();
    r.key_type = key_type;
    if v >= 4 {
        r.coordinator_keys = keys.iter().map(|k| s(k)).collect();
    } else {
        r.key = s(keys[0]);
    }
    let a = c.call(v, &r).await.expect("find coordinator");
    if v >= 4 {
        a.coordinators
            .iter()
            .map(|k| {
                let why = k.error_message.as_ref().map(|m| m.to_string());
                (k.error_code, k.node_id.0, why.unwrap_or_default())
            })
            .collect()
    } else {
        let why = a.error_message.as_ref().map(|m| m.to_string());
        vec![(a.error_code, a.node_id.0, why.unwrap_or_default())]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_coordinator_v6_refuses_key_types_nvmq_does_not_serve() {
    let (addr, _s) = common::serve(Config::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    for v in [4, 5, 6] {
        let groups = coordinators(&mut c, v, 0, &["g1", "g2"]).await;
        assert_eq!(
            groups.iter().map(|g| (g.0, g.1)).collect::<Vec<_>>(),
            vec![(NONE, 0), (NONE, 0)],
            "v{v}"
        );
        let tx = coordinators(&mut c, v, 1, &["tx"]).await;
        assert_eq!(tx[0].0, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "v{v}");
    }
    // Share groups (key type 2, KIP-932): INVALID_REQUEST for each key, with the reason, and
    // no coordinator; so for a type no Kafka version defines.
    let share = coordinators(&mut c, 6, 2, &["s1", "s2"]).await;
    assert_eq!(share.len(), 2);
    for (code, node, why) in &share {
        assert_eq!((*code, *node), (INVALID_REQUEST, -1));
        assert!(why.contains("share groups"), "{why}");
    }
    let odd = coordinators(&mut c, 6, 9, &["x"]).await;
    assert_eq!((odd[0].0, odd[0].1), (INVALID_REQUEST, -1));
    assert!(odd[0].2.contains("key type 9"), "{}", odd[0].2);
    // Below v4 the one key's answer says the same.
    let old = coordinators(&mut c, 3, 2, &["s"]).await;
    assert_eq!((old[0].0, old[0].1), (INVALID_REQUEST, -1));
    // The connection is still served.
    assert_eq!(coordinators(&mut c, 6, 0, &["g"]).await[0].0, NONE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_producer_id_v5_serves_idempotent_producers_and_refuses_transactions() {
    let (addr, _s) = common::serve(Config::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    let mut r = InitProducerIdRequest::default();
    r.transaction_timeout_ms = 60_000;
    r.producer_id = ProducerId(-1);
    r.producer_epoch = -1;
    let a = c.call(5, &r).await.unwrap();
    assert_eq!((a.error_code, a.producer_epoch), (NONE, 0));
    assert!(a.producer_id.0 >= 0);
    let b = c.call(5, &r).await.unwrap();
    assert_ne!(b.producer_id, a.producer_id, "each producer a new id");
    r.transactional_id = Some(TransactionalId(s("tx")));
    let t = c.call(5, &r).await.unwrap();
    assert_eq!(t.error_code, TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    assert_eq!(t.producer_id.0, -1);
}
