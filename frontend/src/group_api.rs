//! The group APIs on the wire: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
//! OffsetFetch (static members' `group.instance.id` in each from the version that has it).

use std::collections::HashMap;
use std::sync::Arc;

use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
    LeaveGroupResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest,
    OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::acl::{self, Operation};
use crate::broker::Broker;
use crate::codes;
use crate::conn::{Ctx, Reply};
use crate::groups::{Answer, JoinRequest, JoinResult, SyncResult};
use crate::meta::{Commit, MetaRecord};

/// Per partition of a commit: its index and its error, or None to be committed.
type PartitionPlan = Vec<(i32, Option<i16>)>;

/// Kafka's offset.metadata.max.bytes default.
const MAX_COMMIT_METADATA: usize = 4096;
const OFFSET_METADATA_TOO_LARGE: i16 = 12;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// Whether the request's principal may do `op` on the group.
fn may(b: &Broker, ctx: &Ctx, op: Operation, group: &str) -> bool {
    acl::check::group(b, ctx, op, group)
}

/// A static member's `group.instance.id`, if the request carries one.
fn instance(id: &Option<StrBytes>) -> Option<String> {
    id.as_ref()
        .map(|i| i.as_str().to_string())
        .filter(|i| !i.is_empty())
}

/// The client's address as Kafka's DescribeGroups shows it ("/127.0.0.1").
fn client_host(ctx: &Ctx) -> String {
    ctx.session
        .peer
        .map(|p| format!("/{}", p.ip()))
        .unwrap_or_default()
}

pub fn join(b: &Arc<Broker>, ctx: &Ctx, req: JoinGroupRequest) -> Reply {
    if !may(b, ctx, Operation::Read, req.group_id.as_str()) {
        let mut resp = JoinGroupResponse::default();
        resp.error_code = codes::GROUP_AUTHORIZATION_FAILED;
        resp.generation_id = -1;
        resp.protocol_name = Some(s(""));
        resp.member_id = req.member_id;
        return ctx.ready(&resp);
    }
    let jr = JoinRequest {
        group: req.group_id.as_str().to_string(),
        member_id: req.member_id.as_str().to_string(),
        instance_id: instance(&req.group_instance_id),
        client_id: ctx.client_id.clone(),
        client_host: client_host(ctx),
        session_timeout_ms: req.session_timeout_ms,
        rebalance_timeout_ms: if ctx.version >= 1 {
            req.rebalance_timeout_ms
        } else {
            req.session_timeout_ms
        },
        protocol_type: req.protocol_type.as_str().to_string(),
        protocols: req
            .protocols
            .into_iter()
            .map(|p| (p.name.as_str().to_string(), p.metadata))
            .collect(),
    };
    tracing::debug!(group = %jr.group, member = %jr.member_id, "join group");
    let held = b.groups.join(jr);
    let ctx = ctx.clone();
    Box::pin(async move {
        let r = match held {
            Answer::Now(r) => r,
            Answer::Held(rx) => rx.await.unwrap_or(JoinResult {
                error: codes::REBALANCE_IN_PROGRESS,
                generation: -1,
                ..Default::default()
            }),
        };
        let mut resp = JoinGroupResponse::default();
        resp.error_code = r.error;
        resp.generation_id = r.generation;
        resp.protocol_name = Some(s(r.protocol.as_deref().unwrap_or("")));
        if ctx.version >= 7 {
            // The group's protocol type (null until the group has one).
            resp.protocol_type = r.protocol_type.as_deref().map(s);
        }
        resp.leader = s(&r.leader);
        resp.member_id = s(&r.member_id);
        resp.members = r
            .members
            .into_iter()
            .map(|(id, meta)| {
                let mut m = JoinGroupResponseMember::default();
                m.member_id = s(&id);
                m.metadata = meta;
                m
            })
            .collect();
        ctx.encode(&resp)
    })
}

pub fn sync(b: &Arc<Broker>, ctx: &Ctx, req: SyncGroupRequest) -> Reply {
    if !may(b, ctx, Operation::Read, req.group_id.as_str()) {
        let mut resp = SyncGroupResponse::default();
        resp.error_code = codes::GROUP_AUTHORIZATION_FAILED;
        return ctx.ready(&resp);
    }
    // v5+ say which protocol the member synced for; Kafka refuses a mismatch.
    let expected = (req.protocol_type.clone(), req.protocol_name.clone());
    let assignments = req
        .assignments
        .into_iter()
        .map(|a| (a.member_id.as_str().to_string(), a.assignment))
        .collect();
    let held = b.groups.sync(
        req.group_id.as_str(),
        req.generation_id,
        req.member_id.as_str(),
        instance(&req.group_instance_id).as_deref(),
        assignments,
    );
    let ctx = ctx.clone();
    Box::pin(async move {
        let r = match held {
            Answer::Now(r) => r,
            Answer::Held(rx) => rx.await.unwrap_or(SyncResult {
                error: codes::REBALANCE_IN_PROGRESS,
                ..Default::default()
            }),
        };
        let mut resp = SyncGroupResponse::default();
        let differs = |asked: &Option<StrBytes>, group: &Option<String>| {
            asked
                .as_ref()
                .is_some_and(|a| group.as_deref() != Some(a.as_str()))
        };
        if r.error == codes::NONE
            && (differs(&expected.0, &r.protocol_type) || differs(&expected.1, &r.protocol))
        {
            resp.error_code = codes::INCONSISTENT_GROUP_PROTOCOL;
            return ctx.encode(&resp);
        }
        resp.error_code = r.error;
        resp.assignment = r.assignment;
        if ctx.version >= 5 {
            resp.protocol_type = r.protocol_type.as_deref().map(s);
            resp.protocol_name = r.protocol.as_deref().map(s);
        }
        ctx.encode(&resp)
    })
}

pub fn heartbeat(b: &Arc<Broker>, ctx: &Ctx, req: HeartbeatRequest) -> Reply {
    let mut resp = HeartbeatResponse::default();
    if !may(b, ctx, Operation::Read, req.group_id.as_str()) {
        resp.error_code = codes::GROUP_AUTHORIZATION_FAILED;
        return ctx.ready(&resp);
    }
    resp.error_code = b.groups.heartbeat(
        req.group_id.as_str(),
        req.generation_id,
        req.member_id.as_str(),
        instance(&req.group_instance_id).as_deref(),
    );
    ctx.ready(&resp)
}

pub fn leave(b: &Arc<Broker>, ctx: &Ctx, req: LeaveGroupRequest) -> Reply {
    if !may(b, ctx, Operation::Read, req.group_id.as_str()) {
        let mut resp = LeaveGroupResponse::default();
        resp.error_code = codes::GROUP_AUTHORIZATION_FAILED;
        return ctx.ready(&resp);
    }
    // v3+: a batch, each by member id or by static instance id.
    let ids: Vec<(String, Option<String>)> = if ctx.version >= 3 {
        req.members
            .iter()
            .map(|m| {
                (
                    m.member_id.as_str().to_string(),
                    instance(&m.group_instance_id),
                )
            })
            .collect()
    } else {
        vec![(req.member_id.as_str().to_string(), None)]
    };
    let errors = b.groups.leave(req.group_id.as_str(), &ids);
    tracing::debug!(group = req.group_id.as_str(), ?ids, ?errors, "leave group");
    let mut resp = LeaveGroupResponse::default();
    if ctx.version >= 3 {
        resp.members = ids
            .iter()
            .zip(&errors)
            .map(|((id, inst), &e)| {
                let mut m = MemberResponse::default();
                m.member_id = s(id);
                m.group_instance_id = inst.as_deref().map(s);
                m.error_code = e;
                m
            })
            .collect();
    } else {
        resp.error_code = errors.first().copied().unwrap_or(codes::NONE);
    }
    ctx.ready(&resp)
}

pub async fn offset_commit(b: &Arc<Broker>, ctx: &Ctx, req: OffsetCommitRequest) -> Reply {
    let group = req.group_id.as_str().to_string();
    let group_allowed = may(b, ctx, Operation::Read, &group);
    let allowed = b.groups.may_commit(
        &group,
        req.generation_id_or_member_epoch,
        req.member_id.as_str(),
        instance(&req.group_instance_id).as_deref(),
    );
    tracing::debug!(
        group = %group,
        generation = req.generation_id_or_member_epoch,
        member = req.member_id.as_str(),
        allowed,
        "offset commit"
    );
    // Per partition: its error, or None to be committed.
    let mut plan: Vec<(TopicName, PartitionPlan)> = Vec::new();
    let mut commits = Vec::new();
    for t in &req.topics {
        let known = b.topics().map.get(t.name.as_str()).map(|p| p.len());
        let topic_allowed =
            group_allowed && acl::check::topic(b, ctx, Operation::Read, t.name.as_str());
        let mut parts = Vec::new();
        for p in &t.partitions {
            let meta_len = p.committed_metadata.as_ref().map_or(0, |m| m.len());
            let err = if !group_allowed {
                Some(codes::GROUP_AUTHORIZATION_FAILED)
            } else if !topic_allowed {
                Some(codes::TOPIC_AUTHORIZATION_FAILED)
            } else if allowed != codes::NONE {
                Some(allowed)
            } else if known.is_none_or(|n| p.partition_index < 0 || p.partition_index as usize >= n)
            {
                Some(codes::UNKNOWN_TOPIC_OR_PARTITION)
            } else if meta_len > MAX_COMMIT_METADATA {
                Some(OFFSET_METADATA_TOO_LARGE)
            } else {
                commits.push(Commit {
                    topic: t.name.as_str().to_string(),
                    partition: p.partition_index,
                    offset: p.committed_offset,
                    leader_epoch: if ctx.version >= 6 {
                        p.committed_leader_epoch
                    } else {
                        -1
                    },
                    metadata: p
                        .committed_metadata
                        .as_ref()
                        .map(|m| m.as_str().to_string()),
                });
                None
            };
            parts.push((p.partition_index, err));
        }
        plan.push((t.name.clone(), parts));
    }
    // The commits go in as few durable records as fit (a request for many partitions with
    // large metadata takes several); each record's offsets become visible in log order once it
    // is durable, and each partition answers with the outcome of the record that holds it.
    let max = b.log_of(b.offsets_partition).max_payload();
    let mut pending = Vec::new();
    for rec in crate::meta::commits_records(&group, commits, max) {
        let MetaRecord::Commits { commits: held, .. } = &rec else {
            continue;
        };
        let keys: Vec<(String, i32)> = held
            .iter()
            .map(|c| (c.topic.clone(), c.partition))
            .collect();
        let offsets = b.offsets.clone();
        let g = group.clone();
        let c2 = held.clone();
        let wait = b
            .append_with(b.offsets_partition, rec.encode(), 1, move |r| {
                if r.is_ok() {
                    offsets.apply(&g, &c2);
                }
            })
            .await;
        pending.push((keys, wait));
    }
    let ctx = ctx.clone();
    Box::pin(async move {
        let mut outcome: HashMap<(String, i32), i16> = HashMap::new();
        for (keys, wait) in pending {
            let code = match wait {
                Err(_) => codes::KAFKA_STORAGE_ERROR,
                Ok(rx) => match rx.await {
                    Ok(Ok(_)) => codes::NONE,
                    _ => codes::KAFKA_STORAGE_ERROR,
                },
            };
            outcome.extend(keys.into_iter().map(|k| (k, code)));
        }
        let mut resp = OffsetCommitResponse::default();
        for (name, parts) in plan {
            let mut tr = OffsetCommitResponseTopic::default();
            tr.name = name;
            for (idx, err) in parts {
                let mut pr = OffsetCommitResponsePartition::default();
                pr.partition_index = idx;
                pr.error_code = err.unwrap_or_else(|| {
                    outcome
                        .get(&(tr.name.as_str().to_string(), idx))
                        .copied()
                        .unwrap_or(codes::KAFKA_STORAGE_ERROR)
                });
                tr.partitions.push(pr);
            }
            resp.topics.push(tr);
        }
        ctx.encode(&resp)
    })
}

pub fn offset_fetch(b: &Arc<Broker>, ctx: &Ctx, req: OffsetFetchRequest) -> Reply {
    let mut resp = OffsetFetchResponse::default();
    if ctx.version >= 8 {
        // Several groups at once (KIP-709), each answered in the same layout.
        resp.groups = req
            .groups
            .into_iter()
            .map(|g| {
                let asked = g.topics.map(|ts| {
                    ts.into_iter()
                        .map(|t| (t.name, t.partition_indexes))
                        .collect()
                });
                let mut gr = OffsetFetchResponseGroup::default();
                let (code, topics) = committed(b, ctx, g.group_id.as_str(), asked);
                gr.error_code = code;
                gr.topics = topics
                    .into_iter()
                    .map(|(name, parts)| {
                        let mut tr = OffsetFetchResponseTopics::default();
                        tr.name = name;
                        tr.partitions = parts
                            .into_iter()
                            .map(|(idx, c)| {
                                let mut p = OffsetFetchResponsePartitions::default();
                                p.partition_index = idx;
                                (p.committed_offset, p.committed_leader_epoch, p.metadata) =
                                    fields(c.as_ref().ok().cloned().flatten());
                                p.error_code = c.err().unwrap_or(codes::NONE);
                                p
                            })
                            .collect();
                        tr
                    })
                    .collect();
                gr.group_id = g.group_id;
                gr
            })
            .collect();
        return ctx.ready(&resp);
    }
    let asked = req.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.name, t.partition_indexes))
            .collect()
    });
    let (code, topics) = committed(b, ctx, req.group_id.as_str(), asked);
    if ctx.version >= 2 {
        resp.error_code = code; // v0-1 have only the partitions' codes
    }
    resp.topics = topics
        .into_iter()
        .map(|(name, parts)| {
            let mut tr = OffsetFetchResponseTopic::default();
            tr.name = name;
            tr.partitions = parts
                .into_iter()
                .map(|(idx, c)| {
                    let mut p = OffsetFetchResponsePartition::default();
                    p.partition_index = idx;
                    (p.committed_offset, p.committed_leader_epoch, p.metadata) =
                        fields(c.as_ref().ok().cloned().flatten());
                    p.error_code = c.err().unwrap_or(codes::NONE);
                    p
                })
                .collect();
            tr
        })
        .collect();
    ctx.ready(&resp)
}

/// A partition's committed offset (None: nothing committed), or the error it is answered with.
type Entry = (i32, Result<Option<crate::offsets::Committed>, i16>);

/// A group's committed offsets for the partitions asked (None: every one it has), by topic.
type Committed = Vec<(TopicName, Vec<Entry>)>;

/// The group's error code and its committed offsets for the partitions asked, as the principal
/// may see them (Kafka's checks: Describe on the group, then on each topic; an unauthorized topic
/// named gets TOPIC_AUTHORIZATION_FAILED per partition, asked for all it is left out).
fn committed(
    b: &Broker,
    ctx: &Ctx,
    group: &str,
    asked: Option<Vec<(TopicName, Vec<i32>)>>,
) -> (i16, Committed) {
    let refused = |code: i16, idxs: Vec<i32>| idxs.into_iter().map(|i| (i, Err(code))).collect();
    if !may(b, ctx, Operation::Describe, group) {
        let code = codes::GROUP_AUTHORIZATION_FAILED;
        let topics = asked
            .unwrap_or_default()
            .into_iter()
            .map(|(name, idxs)| (name, refused(code, idxs)))
            .collect();
        return (code, topics);
    }
    let describe = |topic: &str| acl::check::topic(b, ctx, Operation::Describe, topic);
    let topics = match asked {
        Some(topics) => topics
            .into_iter()
            .map(|(name, idxs)| {
                if !describe(name.as_str()) {
                    return (name, refused(codes::TOPIC_AUTHORIZATION_FAILED, idxs));
                }
                let parts = idxs
                    .into_iter()
                    .map(|i| (i, Ok(b.offsets.get(group, name.as_str(), i))))
                    .collect();
                (name, parts)
            })
            .collect(),
        None => {
            let mut by_topic: Committed = Vec::new();
            for ((topic, idx), c) in b.offsets.all(group) {
                if !describe(&topic) {
                    continue;
                }
                if by_topic.last().is_none_or(|(t, _)| t.as_str() != topic) {
                    by_topic.push((TopicName(s(&topic)), Vec::new()));
                }
                if let Some((_, parts)) = by_topic.last_mut() {
                    parts.push((idx, Ok(Some(c))));
                }
            }
            by_topic
        }
    };
    (codes::NONE, topics)
}

/// (offset, leader epoch, metadata) of a partition's answer: -1s and "" when nothing is
/// committed.
fn fields(c: Option<crate::offsets::Committed>) -> (i64, i32, Option<StrBytes>) {
    match c {
        Some(c) => (
            c.offset,
            c.leader_epoch,
            Some(s(c.metadata.as_deref().unwrap_or(""))),
        ),
        None => (-1, -1, Some(s(""))),
    }
}
