//! The group APIs operators' tools call (ListGroups, DescribeGroups, DeleteGroups, OffsetDelete),
//! static membership on the wire, and the expiry of empty groups: each answer as Kafka gives
//! it, and every removal durable (it holds after a power cut, and after the ring wrapped over it).

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use frontend::client::Client;
use frontend::codes;
use frontend::meta::OFFSETS_TOPIC;
use frontend::Config;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_delete_request::{
    OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn gid(v: &str) -> GroupId {
    GroupId(s(v))
}

/// A consumer-protocol subscription (v0) to `topics`.
fn subscription(topics: &[&str]) -> Bytes {
    let mut b = 0i16.to_be_bytes().to_vec();
    b.extend((topics.len() as i32).to_be_bytes());
    for t in topics {
        b.extend((t.len() as i16).to_be_bytes());
        b.extend(t.as_bytes());
    }
    b.extend((-1i32).to_be_bytes());
    Bytes::from(b)
}

/// Joins `group` as its only member, subscribed to `topics`, and takes the assignment: a
/// Stable group. Returns (member id, generation).
async fn join_alone(
    c: &mut Client,
    group: &str,
    instance: Option<&str>,
    topics: &[&str],
) -> (String, i32) {
    let mut p = JoinGroupRequestProtocol::default();
    p.name = s("range");
    p.metadata = subscription(topics);
    let mut j = JoinGroupRequest::default();
    j.group_id = gid(group);
    j.session_timeout_ms = 30_000;
    j.rebalance_timeout_ms = 30_000;
    j.protocol_type = s("consumer");
    j.protocols = vec![p];
    j.group_instance_id = instance.map(s);
    let r = c.call(5, &j).await.unwrap();
    assert_eq!(r.error_code, codes::NONE);
    let mut a = SyncGroupRequestAssignment::default();
    a.member_id = r.member_id.clone();
    a.assignment = Bytes::from_static(b"assigned");
    let mut sg = SyncGroupRequest::default();
    sg.group_id = gid(group);
    sg.generation_id = r.generation_id;
    sg.member_id = r.member_id.clone();
    sg.group_instance_id = instance.map(s);
    sg.assignments = vec![a];
    let sr = c.call(3, &sg).await.unwrap();
    assert_eq!(sr.error_code, codes::NONE);
    (r.member_id.to_string(), r.generation_id)
}

/// Commits offset `offset` for partition 0 of each topic, outside any generation.
async fn commit(c: &mut Client, group: &str, topics: &[&str], offset: i64) {
    let mut oc = OffsetCommitRequest::default();
    oc.group_id = gid(group);
    oc.generation_id_or_member_epoch = -1;
    oc.topics = topics
        .iter()
        .map(|t| {
            let mut p = OffsetCommitRequestPartition::default();
            p.committed_offset = offset;
            let mut ot = OffsetCommitRequestTopic::default();
            ot.name = TopicName(s(t));
            ot.partitions = vec![p];
            ot
        })
        .collect();
    let r = c.call(7, &oc).await.unwrap();
    for t in r.topics {
        assert_eq!(t.partitions[0].error_code, codes::NONE, "{:?}", t.name);
    }
}

async fn list(c: &mut Client, states: &[&str]) -> Vec<(String, String, String)> {
    let mut r = ListGroupsRequest::default();
    r.states_filter = states.iter().map(|v| s(v)).collect();
    let resp = c.call(4, &r).await.unwrap();
    assert_eq!(resp.error_code, codes::NONE);
    resp.groups
        .into_iter()
        .map(|g| {
            (
                g.group_id.to_string(),
                g.protocol_type.to_string(),
                g.group_state.to_string(),
            )
        })
        .collect()
}

async fn delete(c: &mut Client, groups: &[&str]) -> Vec<i16> {
    let mut r = DeleteGroupsRequest::default();
    r.groups_names = groups.iter().map(|g| gid(g)).collect();
    c.call(2, &r)
        .await
        .unwrap()
        .results
        .into_iter()
        .map(|r| r.error_code)
        .collect()
}

async fn offset_delete(c: &mut Client, group: &str, topics: &[&str]) -> (i16, Vec<i16>) {
    let mut r = OffsetDeleteRequest::default();
    r.group_id = gid(group);
    r.topics = topics
        .iter()
        .map(|t| {
            let mut ot = OffsetDeleteRequestTopic::default();
            ot.name = TopicName(s(t));
            ot.partitions = vec![OffsetDeleteRequestPartition::default()];
            ot
        })
        .collect();
    let resp = c.call(0, &r).await.unwrap();
    let parts = resp
        .topics
        .iter()
        .map(|t| t.partitions[0].error_code)
        .collect();
    (resp.error_code, parts)
}

async fn connect(addr: SocketAddr) -> Client {
    Client::connect(addr, "admin-test").await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_are_listed_described_and_deleted_durably() {
    let (dev, handle) = common::sim_device(3, 64 << 20, 100);
    let server = common::server_on(dev, Config::default());
    let addr = server.local_addr();
    let mut c = connect(addr).await;
    for t in ["t1", "t2"] {
        common::create_topic(&mut c, t).await;
    }
    // Committed outside a generation before anyone joins (a member's commits need its own).
    commit(&mut c, "live", &["t1", "t2"], 5).await;
    let (member, _) = join_alone(&mut c, "live", None, &["t1"]).await;
    commit(&mut c, "offsets-only", &["t1"], 9).await;
    commit(&mut c, "trimmed", &["t1", "t2"], 3).await;

    let all = list(&mut c, &[]).await;
    assert!(
        all.contains(&("live".into(), "consumer".into(), "Stable".into())),
        "{all:?}"
    );
    assert!(
        all.contains(&("offsets-only".into(), "".into(), "Empty".into())),
        "{all:?}"
    );
    assert_eq!(
        list(&mut c, &["stable"]).await.len(),
        1,
        "the state filter is case-blind"
    );
    assert!(!list(&mut c, &["Empty"]).await.iter().any(|g| g.0 == "live"));

    let mut d = DescribeGroupsRequest::default();
    d.groups = vec![gid("live"), gid("offsets-only"), gid("nothing")];
    let dr = c.call(5, &d).await.unwrap();
    let live = &dr.groups[0];
    assert_eq!(
        (
            live.error_code,
            live.group_state.as_str(),
            live.protocol_type.as_str(),
            live.protocol_data.as_str()
        ),
        (codes::NONE, "Stable", "consumer", "range")
    );
    assert_eq!(live.members.len(), 1);
    let m = &live.members[0];
    assert_eq!(
        (m.member_id.as_str(), m.client_id.as_str()),
        (member.as_str(), "admin-test")
    );
    assert_eq!(m.client_host.as_str(), "/127.0.0.1");
    assert_eq!(m.member_assignment, Bytes::from_static(b"assigned"));
    assert_eq!(m.member_metadata, subscription(&["t1"]));
    assert_eq!(live.authorized_operations, i32::MIN);
    assert_eq!(dr.groups[1].group_state.as_str(), "Empty");
    assert_eq!(dr.groups[2].group_state.as_str(), "Dead");

    // A group with a member is not deleted; its subscribed topic's offsets are not either.
    assert_eq!(
        delete(&mut c, &["live"]).await,
        vec![codes::NON_EMPTY_GROUP]
    );
    assert_eq!(
        offset_delete(&mut c, "live", &["t1", "t2", "absent"]).await,
        (
            codes::NONE,
            vec![
                codes::GROUP_SUBSCRIBED_TO_TOPIC,
                codes::NONE,
                codes::UNKNOWN_TOPIC_OR_PARTITION
            ]
        )
    );
    assert_eq!(
        offset_delete(&mut c, "nothing", &["t1"]).await.0,
        codes::GROUP_ID_NOT_FOUND
    );
    assert_eq!(
        offset_delete(&mut c, "trimmed", &["t2"]).await,
        (codes::NONE, vec![codes::NONE])
    );
    let b = server.broker().clone();
    assert!(b.offsets().get("live", "t2", 0).is_none());
    assert_eq!(b.offsets().get("live", "t1", 0).map(|o| o.offset), Some(5));

    // Once its member left, it goes; deleting it twice finds nothing the second time.
    let mut l = LeaveGroupRequest::default();
    l.group_id = gid("live");
    let mut mi = MemberIdentity::default();
    mi.member_id = s(&member);
    l.members = vec![mi];
    assert_eq!(
        c.call(3, &l).await.unwrap().members[0].error_code,
        codes::NONE
    );
    assert_eq!(
        delete(&mut c, &["live", "offsets-only", "nothing"]).await,
        vec![codes::NONE, codes::NONE, codes::GROUP_ID_NOT_FOUND]
    );
    assert_eq!(
        delete(&mut c, &["live"]).await,
        vec![codes::GROUP_ID_NOT_FOUND]
    );
    let names: Vec<String> = list(&mut c, &[]).await.into_iter().map(|g| g.0).collect();
    assert_eq!(names, vec!["trimmed".to_string()]);

    // After a power cut the deletions hold: replay applies them after the commits.
    handle.power_cut();
    server.kill();
    let b2 = common::reopen(handle.power_on(), frontend::Config::default());
    let names: Vec<String> = b2.list_groups().into_iter().map(|g| g.name).collect();
    assert_eq!(names, vec!["trimmed".to_string()]);
    assert!(b2.offsets().get("live", "t1", 0).is_none());
    assert!(b2.offsets().get("offsets-only", "t1", 0).is_none());
    assert_eq!(
        b2.offsets().get("trimmed", "t1", 0).map(|o| o.offset),
        Some(3)
    );
    assert!(b2.offsets().get("trimmed", "t2", 0).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_group_stays_deleted_after_the_ring_wraps_over_it() {
    let (dev, handle) = common::small_ring(5);
    let server = common::server_on(dev, Config::default());
    let b = server.broker().clone();
    let mut c = connect(server.local_addr()).await;
    common::create_topic(&mut c, "data").await;
    commit(&mut c, "gone", &["data"], 11).await;
    commit(&mut c, "kept", &["data"], 12).await;
    commit(&mut c, "trimmed", &["data"], 13).await;
    assert_eq!(delete(&mut c, &["gone"]).await, vec![codes::NONE]);
    assert_eq!(
        offset_delete(&mut c, "trimmed", &["data"]).await.1,
        vec![codes::NONE]
    );
    common::lap_the_ring(&mut c, "data").await;
    let offsets_start = common::internal_start(&b, OFFSETS_TOPIC);
    // Records 0-2 are the commits, 3 and 4 the removals: all freed, only snapshots remain.
    assert!(
        offsets_start > 4,
        "the ring never freed the removals: the test proves nothing"
    );
    handle.power_cut();
    server.kill();
    let b2 = common::reopen(handle.power_on(), frontend::Config::default());
    assert_eq!(
        b2.offsets().get("kept", "data", 0).map(|o| o.offset),
        Some(12)
    );
    assert!(
        b2.offsets().get("gone", "data", 0).is_none(),
        "the deleted group came back"
    );
    assert!(
        b2.offsets().get("trimmed", "data", 0).is_none(),
        "the deleted offset came back"
    );
    let names: Vec<String> = b2.list_groups().into_iter().map(|g| g.name).collect();
    assert_eq!(names, vec!["kept".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_groups_expire_with_their_offsets_and_busy_ones_do_not() {
    let (dev, handle) = common::sim_device(4, 64 << 20, 100);
    let cfg = Config {
        offsets_retention: Duration::from_secs(3600),
        ..Config::default()
    };
    let server = common::server_on(dev, cfg);
    let b = server.broker().clone();
    let mut c = connect(server.local_addr()).await;
    common::create_topic(&mut c, "t").await;
    commit(&mut c, "idle", &["t"], 1).await;
    commit(&mut c, "busy", &["t"], 2).await;
    join_alone(&mut c, "busy", None, &["t"]).await;
    let now = Instant::now();
    assert!(
        b.expire_groups(now).await.unwrap().is_empty(),
        "nothing is idle for an hour yet"
    );
    // An hour and a bit on: the idle group goes, the one with a member stays.
    let later = now + Duration::from_secs(3700);
    assert_eq!(
        b.expire_groups(later).await.unwrap(),
        vec!["idle".to_string()]
    );
    assert!(b.offsets().get("idle", "t", 0).is_none());
    assert_eq!(b.offsets().get("busy", "t", 0).map(|o| o.offset), Some(2));
    let names: Vec<String> = list(&mut c, &[]).await.into_iter().map(|g| g.0).collect();
    assert_eq!(names, vec!["busy".to_string()]);
    handle.power_cut();
    server.kill();
    let b2 = common::reopen(handle.power_on(), frontend::Config::default());
    assert!(
        b2.offsets().get("idle", "t", 0).is_none(),
        "the expired group came back"
    );
    assert_eq!(b2.offsets().get("busy", "t", 0).map(|o| o.offset), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_members_are_fenced_and_leave_by_instance_id_on_the_wire() {
    let (addr, _s) = common::serve(Config::default()).await;
    let mut c = connect(addr).await;
    common::create_topic(&mut c, "t").await;
    let (old, generation) = join_alone(&mut c, "st", Some("host-1"), &["t"]).await;
    // The process restarts: same instance id, no member id. No rebalance: same generation.
    let (new, gen2) = join_alone(&mut c, "st", Some("host-1"), &["t"]).await;
    assert_ne!(old, new);
    assert_eq!(gen2, generation);
    let mut hb = HeartbeatRequest::default();
    hb.group_id = gid("st");
    hb.generation_id = generation;
    hb.member_id = s(&old);
    hb.group_instance_id = Some(s("host-1"));
    assert_eq!(
        c.call(3, &hb).await.unwrap().error_code,
        codes::FENCED_INSTANCE_ID
    );
    hb.member_id = s(&new);
    assert_eq!(c.call(3, &hb).await.unwrap().error_code, codes::NONE);
    let mut oc = OffsetCommitRequest::default();
    oc.group_id = gid("st");
    oc.generation_id_or_member_epoch = generation;
    oc.member_id = s(&old);
    oc.group_instance_id = Some(s("host-1"));
    let mut p = OffsetCommitRequestPartition::default();
    p.committed_offset = 1;
    let mut t = OffsetCommitRequestTopic::default();
    t.name = TopicName(s("t"));
    t.partitions = vec![p];
    oc.topics = vec![t];
    let r = c.call(7, &oc).await.unwrap();
    assert_eq!(
        r.topics[0].partitions[0].error_code,
        codes::FENCED_INSTANCE_ID
    );
    let mut d = DescribeGroupsRequest::default();
    d.groups = vec![gid("st")];
    let dr = c.call(4, &d).await.unwrap();
    let m = &dr.groups[0].members;
    assert_eq!(m.len(), 1);
    assert_eq!(
        m[0].group_instance_id.as_ref().map(|i| i.as_str()),
        Some("host-1")
    );
    // Batch leave by instance id (no member id), as tools remove static members.
    let mut l = LeaveGroupRequest::default();
    l.group_id = gid("st");
    let mut mi = MemberIdentity::default();
    mi.group_instance_id = Some(s("host-1"));
    let mut other = MemberIdentity::default();
    other.group_instance_id = Some(s("host-2"));
    l.members = vec![mi, other];
    let lr = c.call(3, &l).await.unwrap();
    let codes_: Vec<i16> = lr.members.iter().map(|m| m.error_code).collect();
    assert_eq!(codes_, vec![codes::NONE, codes::UNKNOWN_MEMBER_ID]);
    assert_eq!(
        list(&mut c, &[]).await,
        vec![("st".into(), "consumer".into(), "Empty".into())]
    );
}
