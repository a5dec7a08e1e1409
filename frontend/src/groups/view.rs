//! What operators' tools see of the coordinator (ListGroups, DescribeGroups), and what deleting
//! or expiring a group asks of it (DeleteGroups, OffsetDelete, the expiry of empty groups).

use std::collections::BTreeSet;
use std::time::Instant;

use bytes::{Buf, Bytes};

use super::{Group, Groups, State};
use crate::broker::lock;

/// One member as DescribeGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    /// Its metadata for the group's protocol and its assignment: only while the group is
    /// Stable (as Kafka shows them).
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// A group as DescribeGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupView {
    /// Kafka's names: Empty, PreparingRebalance, CompletingRebalance, Stable.
    pub state: &'static str,
    pub protocol_type: String,
    /// The chosen protocol (e.g. the assignor), empty while none is.
    pub protocol: String,
    pub members: Vec<MemberView>,
}

fn state_name(s: State) -> &'static str {
    match s {
        State::Empty => "Empty",
        State::Preparing { .. } => "PreparingRebalance",
        State::Completing => "CompletingRebalance",
        State::Stable => "Stable",
    }
}

fn view(g: &Group) -> GroupView {
    let stable = g.state == State::Stable;
    let members = g
        .members
        .iter()
        .map(|(id, m)| {
            let metadata = m
                .protocols
                .iter()
                .find(|(n, _)| Some(n) == g.protocol.as_ref())
                .map(|(_, b)| b.clone())
                .filter(|_| stable)
                .unwrap_or_default();
            MemberView {
                member_id: id.clone(),
                instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                metadata,
                assignment: if stable {
                    m.assignment.clone()
                } else {
                    Bytes::new()
                },
            }
        })
        .collect();
    GroupView {
        state: state_name(g.state),
        protocol_type: g.protocol_type.clone().unwrap_or_default(),
        protocol: g.protocol.clone().unwrap_or_default(),
        members,
    }
}

/// The topics of a consumer-protocol subscription (`ConsumerProtocolSubscription`: version,
/// then the topic names, in every version); None when the bytes are not one.
fn subscription_topics(mut b: Bytes) -> Option<Vec<String>> {
    if b.remaining() < 6 {
        return None;
    }
    let _version = b.get_i16();
    let n = b.get_i32();
    let mut out = Vec::new();
    for _ in 0..n.max(0) {
        if b.remaining() < 2 {
            return None;
        }
        let len = usize::try_from(b.get_i16()).ok()?;
        if b.remaining() < len {
            return None;
        }
        out.push(String::from_utf8(b.split_to(len).to_vec()).ok()?);
    }
    Some(out)
}

impl Groups {
    /// The groups the coordinator holds (with members, or emptied and not yet expired or
    /// deleted): (name, protocol type, state).
    pub fn list(&self) -> Vec<(String, String, &'static str)> {
        let m = lock(&self.groups);
        let mut v: Vec<_> = m
            .values()
            .map(|g| {
                (
                    g.name.clone(),
                    g.protocol_type.clone().unwrap_or_default(),
                    state_name(g.state),
                )
            })
            .collect();
        v.sort();
        v
    }

    pub fn describe(&self, group: &str) -> Option<GroupView> {
        lock(&self.groups).get(group).map(view)
    }

    /// Whether the group has members (one that does not exist has none).
    pub fn has_members(&self, group: &str) -> bool {
        lock(&self.groups)
            .get(group)
            .is_some_and(|g| !g.members.is_empty())
    }

    /// The topics the group's members are subscribed to: None for a group with members whose
    /// subscriptions are not the consumer protocol's (any topic may be theirs).
    pub fn subscribed_topics(&self, group: &str) -> Option<BTreeSet<String>> {
        let m = lock(&self.groups);
        let Some(g) = m.get(group) else {
            return Some(BTreeSet::new());
        };
        let mut topics = BTreeSet::new();
        for mem in g.members.values() {
            let meta = mem
                .protocols
                .iter()
                .find(|(n, _)| g.protocol.is_none() || Some(n) == g.protocol.as_ref())
                .map(|(_, b)| b.clone())?;
            if g.protocol_type.as_deref() != Some("consumer") {
                return None;
            }
            topics.extend(subscription_topics(meta)?);
        }
        Some(topics)
    }

    /// Forgets a group that has no members (DeleteGroups or expiry made its deletion durable);
    /// false if it has members again.
    pub fn forget_if_empty(&self, group: &str) -> bool {
        let mut m = lock(&self.groups);
        match m.get(group) {
            Some(g) if !g.members.is_empty() => false,
            _ => {
                m.remove(group);
                true
            }
        }
    }

    /// Groups without members, and since when they have had none.
    pub fn empty_since(&self) -> Vec<(String, Option<Instant>)> {
        lock(&self.groups)
            .values()
            .filter(|g| g.members.is_empty())
            .map(|g| (g.name.clone(), g.empty_since))
            .collect()
    }
}
