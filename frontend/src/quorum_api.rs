//! DescribeQuorum (KIP-595, v0–2) on a node of a cluster: the Raft group that carries the
//! partitions, described as Kafka describes its metadata quorum, so that `nvmq cluster status`
//! (and Kafka's own quorum tools) can show who leads and how far each voter is behind.
//!
//! The group is the partition `__nvmq_raft`/1. Offsets here are Raft indexes plus one, Kafka's
//! "end offset" sense: a voter's log_end_offset is one past the last entry its log matches the
//! leader's at, the high watermark one past the last committed entry. Only the leader knows
//! the voters' positions; a follower answers NOT_LEADER_OR_FOLLOWER with the leader it knows.
//! Each voter also carries, in tagged field [`BYTES_BEHIND_TAG`] (8 bytes, big-endian), the
//! request bytes it has yet to receive: Kafka's clients skip a tag they do not know.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use kafka_protocol::messages::describe_quorum_response::{
    Listener, Node, PartitionData, ReplicaState, TopicData,
};
use kafka_protocol::messages::{BrokerId, DescribeQuorumRequest, DescribeQuorumResponse};
use kafka_protocol::protocol::StrBytes;

use crate::acl::{check, Operation};
use crate::broker::Broker;
use crate::codes;
use crate::conn::{Ctx, Reply};
use crate::replica::{QuorumStatus, Replica, GROUP};

/// The tagged field of a voter's ReplicaState that holds its bytes behind (nvmq's own).
pub const BYTES_BEHIND_TAG: i32 = 0x4e56;

/// The topic a cluster's group is described as (the log partition its records are).
pub const QUORUM_TOPIC: &str = nvmq_cluster::RAFT_TOPIC;

/// Wall-clock milliseconds since the Unix epoch (DescribeQuorum's timestamps).
pub fn ms_since_epoch(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The wall-clock milliseconds `ago` before `now_ms`.
fn ms_before(now_ms: i64, ago: Duration) -> i64 {
    now_ms.saturating_sub(i64::try_from(ago.as_millis()).unwrap_or(i64::MAX))
}

/// Kafka's end-offset sense of an index: one past it (0 for none).
fn end_offset(index: Option<u64>) -> i64 {
    index.map_or(0, |i| {
        i64::try_from(i.saturating_add(1)).unwrap_or(i64::MAX)
    })
}

fn broker_id(id: u64) -> BrokerId {
    BrokerId(i32::try_from(id).unwrap_or(i32::MAX))
}

fn partition_of(st: &QuorumStatus, now_ms: i64) -> PartitionData {
    let mut p = PartitionData::default();
    p.partition_index = GROUP as i32;
    p.leader_id = st.leader.map_or(BrokerId(-1), broker_id);
    p.leader_epoch = i32::try_from(st.term).unwrap_or(i32::MAX);
    if !st.is_leader {
        p.error_code = codes::NOT_LEADER_OR_FOLLOWER;
        p.error_message = Some(StrBytes::from_string(format!(
            "node {} does not lead the group: ask node {}",
            st.node_id,
            st.leader.map_or("(none yet)".into(), |l| l.to_string())
        )));
        return p;
    }
    p.high_watermark = end_offset(st.committed);
    for v in &st.voters {
        let mut r = ReplicaState::default();
        r.replica_id = broker_id(v.id);
        r.log_end_offset = end_offset(v.matched);
        r.last_fetch_timestamp = v.last_answer.map_or(-1, |ago| ms_before(now_ms, ago));
        r.last_caught_up_timestamp = ms_before(now_ms, v.behind_for);
        // Left out when the group's store stopped and cannot count them.
        if let Some(bytes) = v.bytes_behind {
            r.unknown_tagged_fields.insert(
                BYTES_BEHIND_TAG,
                Bytes::copy_from_slice(&bytes.to_be_bytes()),
            );
        }
        p.current_voters.push(r);
    }
    p
}

/// v2's nodes: every member and where clients reach it.
fn nodes_of(replica: &Replica) -> Vec<Node> {
    replica
        .members()
        .iter()
        .map(|(&id, a)| {
            let mut n = Node::default();
            n.node_id = broker_id(id);
            let (host, port) = a.kafka.rsplit_once(':').unwrap_or((&a.kafka, "0"));
            let mut l = Listener::default();
            l.name = StrBytes::from_static_str("PLAINTEXT");
            l.host = StrBytes::from_string(host.trim_matches(['[', ']']).to_string());
            l.port = port.parse().unwrap_or(0);
            n.listeners = vec![l];
            n
        })
        .collect()
}

pub fn describe_quorum(b: &Arc<Broker>, ctx: &Ctx, req: DescribeQuorumRequest) -> Reply {
    let mut resp = DescribeQuorumResponse::default();
    let refuse = |mut resp: DescribeQuorumResponse, code: i16, why: String| {
        resp.error_code = code;
        if ctx.version >= 2 {
            resp.error_message = Some(StrBytes::from_string(why));
        }
        ctx.ready(&resp)
    };
    // Kafka's: Describe on the cluster.
    if !check::cluster(b, ctx, Operation::Describe) {
        let why = "DescribeQuorum needs Describe on the cluster".to_string();
        return refuse(resp, codes::CLUSTER_AUTHORIZATION_FAILED, why);
    }
    let Some(replica) = b.replica() else {
        let why = "this broker runs alone (no --peers): it has no quorum to describe".to_string();
        return refuse(resp, codes::INVALID_REQUEST, why);
    };
    let st = replica.quorum_status();
    let now_ms = ms_since_epoch(SystemTime::now());
    for t in req.topics {
        let mut td = TopicData::default();
        td.topic_name = t.topic_name.clone();
        for p in t.partitions {
            let ours = t.topic_name.as_str() == QUORUM_TOPIC && p.partition_index == GROUP as i32;
            td.partitions.push(match ours {
                true => partition_of(&st, now_ms),
                false => {
                    let mut e = PartitionData::default();
                    e.partition_index = p.partition_index;
                    e.error_code = codes::UNKNOWN_TOPIC_OR_PARTITION;
                    e.error_message = Some(StrBytes::from_string(format!(
                        "no quorum {}/{}: the cluster's group is {QUORUM_TOPIC}/{GROUP}",
                        t.topic_name.as_str(),
                        p.partition_index
                    )));
                    e
                }
            });
        }
        resp.topics.push(td);
    }
    if ctx.version >= 2 {
        resp.nodes = nodes_of(replica);
    }
    ctx.ready(&resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_are_offsets_one_past_and_times_count_back_from_now() {
        assert_eq!(end_offset(None), 0);
        assert_eq!(end_offset(Some(0)), 1);
        assert_eq!(end_offset(Some(41)), 42);
        assert_eq!(end_offset(Some(u64::MAX)), i64::MAX);
        assert_eq!(ms_before(10_000, Duration::from_millis(250)), 9_750);
        assert_eq!(ms_before(10, Duration::from_secs(u64::MAX)), i64::MIN + 11);
    }
}
