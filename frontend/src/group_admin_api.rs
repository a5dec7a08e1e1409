//! The group APIs operators' tools call, on the wire: ListGroups, DescribeGroups, DeleteGroups,
//! OffsetDelete; each checked as Kafka checks it (ListGroups lists the groups the principal may
//! describe, or all with Describe on the cluster; DescribeGroups needs Describe on the group,
//! DeleteGroups Delete, OffsetDelete Delete on the group and Read on each topic).

use std::sync::Arc;

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::{
    DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse,
    GroupId, ListGroupsRequest, ListGroupsResponse, OffsetDeleteRequest, OffsetDeleteResponse,
};
use kafka_protocol::protocol::StrBytes;

use crate::acl::{check, operations, Operation, ResourceType};
use crate::broker::Broker;
use crate::codes;
use crate::conn::{Ctx, Reply};

/// The only group type nvmq has (KIP-848's consumer groups are not served): what ListGroups v5
/// reports and its types filter matches.
const GROUP_TYPE: &str = "classic";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// Whether ListGroups' filter (v4's states, v5's types) takes `value`: Kafka compares
/// case-insensitively, and an empty filter takes everything.
fn filter_takes(filter: &[StrBytes], value: &str) -> bool {
    filter.is_empty() || filter.iter().any(|f| f.eq_ignore_ascii_case(value))
}

pub fn list_groups(b: &Arc<Broker>, ctx: &Ctx, req: ListGroupsRequest) -> Reply {
    let mut resp = ListGroupsResponse::default();
    // Every nvmq group is of one type: a types filter (v5) without it lists nothing.
    if !filter_takes(&req.types_filter, GROUP_TYPE) {
        return ctx.ready(&resp);
    }
    let all = check::cluster(b, ctx, Operation::Describe);
    resp.groups = b
        .list_groups()
        .into_iter()
        .filter(|g| filter_takes(&req.states_filter, g.state))
        .filter(|g| all || check::group(b, ctx, Operation::Describe, &g.name))
        .map(|g| {
            let mut l = ListedGroup::default();
            l.group_id = GroupId(s(&g.name));
            l.protocol_type = s(&g.protocol_type);
            l.group_state = s(g.state);
            l.group_type = s(GROUP_TYPE);
            l
        })
        .collect();
    ctx.ready(&resp)
}

pub fn describe_groups(b: &Arc<Broker>, ctx: &Ctx, req: DescribeGroupsRequest) -> Reply {
    let mut resp = DescribeGroupsResponse::default();
    for name in req.groups {
        let mut d = DescribedGroup::default();
        d.group_id = name.clone();
        d.authorized_operations = operations::NOT_REQUESTED;
        if !check::group(b, ctx, Operation::Describe, name.as_str()) {
            d.error_code = codes::GROUP_AUTHORIZATION_FAILED;
            if ctx.version >= 6 {
                d.error_message = Some(s(&format!(
                    "not authorized to describe group {}",
                    name.as_str()
                )));
            }
            resp.groups.push(d);
            continue;
        }
        if req.include_authorized_operations {
            d.authorized_operations =
                operations::authorized(b, ctx, ResourceType::Group, name.as_str());
        }
        match b.groups.describe(name.as_str()) {
            Some(v) => {
                d.group_state = s(v.state);
                d.protocol_type = s(&v.protocol_type);
                d.protocol_data = s(&v.protocol);
                d.members = v
                    .members
                    .into_iter()
                    .map(|m| {
                        let mut dm = DescribedGroupMember::default();
                        dm.member_id = s(&m.member_id);
                        dm.group_instance_id = m.instance_id.as_deref().map(s);
                        dm.client_id = s(&m.client_id);
                        dm.client_host = s(&m.client_host);
                        dm.member_metadata = m.metadata;
                        dm.member_assignment = m.assignment;
                        dm
                    })
                    .collect();
            }
            // A group holding only offsets: Empty, as Kafka shows a group of assign() consumers.
            None if b.offsets.has_group(name.as_str()) => d.group_state = s("Empty"),
            // No such group: Dead, and from v6 on (KIP-1043) GROUP_ID_NOT_FOUND too.
            None => {
                d.group_state = s("Dead");
                if ctx.version >= 6 {
                    d.error_code = codes::GROUP_ID_NOT_FOUND;
                    d.error_message = Some(s(&format!("group {} not found", name.as_str())));
                }
            }
        }
        resp.groups.push(d);
    }
    ctx.ready(&resp)
}

pub async fn delete_groups(b: &Arc<Broker>, ctx: &Ctx, req: DeleteGroupsRequest) -> Reply {
    let mut resp = DeleteGroupsResponse::default();
    for name in req.groups_names {
        let mut r = DeletableGroupResult::default();
        r.error_code = if !check::group(b, ctx, Operation::Delete, name.as_str()) {
            codes::GROUP_AUTHORIZATION_FAILED
        } else {
            match b.delete_group(name.as_str()).await {
                Ok(code) => code,
                Err(e) => {
                    tracing::warn!(group = name.as_str(), error = %e, "deleting a group failed");
                    codes::KAFKA_STORAGE_ERROR
                }
            }
        };
        r.group_id = name;
        resp.results.push(r);
    }
    ctx.ready(&resp)
}

/// OffsetDelete: the offsets of partitions no member is subscribed to are deleted durably;
/// a subscribed topic's partitions get GROUP_SUBSCRIBED_TO_TOPIC.
pub async fn offset_delete(b: &Arc<Broker>, ctx: &Ctx, req: OffsetDeleteRequest) -> Reply {
    let group = req.group_id.as_str().to_string();
    let mut resp = OffsetDeleteResponse::default();
    if !check::group(b, ctx, Operation::Delete, &group) {
        resp.error_code = codes::GROUP_AUTHORIZATION_FAILED;
        return ctx.ready(&resp);
    }
    if !b.group_exists(&group) {
        resp.error_code = codes::GROUP_ID_NOT_FOUND;
        return ctx.ready(&resp);
    }
    let Some(subscribed) = b.groups.subscribed_topics(&group) else {
        // Members of a protocol other than the consumer one: what they use is unknown.
        resp.error_code = codes::NON_EMPTY_GROUP;
        return ctx.ready(&resp);
    };
    let mut plan = Vec::new();
    let mut doomed = Vec::new();
    for t in &req.topics {
        let topic = t.name.as_str();
        let count = b.topics().map.get(topic).map(|p| p.len());
        let mut parts = Vec::new();
        for p in &t.partitions {
            let idx = p.partition_index;
            let code = if !check::topic(b, ctx, Operation::Read, topic) {
                codes::TOPIC_AUTHORIZATION_FAILED
            } else if count.is_none_or(|n| idx < 0 || idx as usize >= n) {
                codes::UNKNOWN_TOPIC_OR_PARTITION
            } else if subscribed.contains(topic) {
                codes::GROUP_SUBSCRIBED_TO_TOPIC
            } else {
                doomed.push((topic.to_string(), idx));
                codes::NONE
            };
            parts.push((idx, code));
        }
        plan.push((t.name.clone(), parts));
    }
    let stored = match b.delete_offsets(&group, doomed).await {
        Ok(()) => codes::NONE,
        Err(e) => {
            tracing::warn!(group = %group, error = %e, "deleting offsets failed");
            codes::KAFKA_STORAGE_ERROR
        }
    };
    for (name, parts) in plan {
        let mut tr = OffsetDeleteResponseTopic::default();
        tr.name = name;
        for (idx, code) in parts {
            let mut pr = OffsetDeleteResponsePartition::default();
            pr.partition_index = idx;
            pr.error_code = if code == codes::NONE { stored } else { code };
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    ctx.ready(&resp)
}
