//! Leader epochs. A single node has led every partition since it was created, so each
//! partition's leader epoch is 0. A node of a cluster serves the Raft term as every
//! partition's epoch, and only while it leads (followers answer NOT_LEADER_OR_FOLLOWER).
//! Metadata reports the epoch, Fetch and ListOffsets check a client's current_leader_epoch
//! against it, and OffsetForLeaderEpoch answers the end of any epoch up to the current one
//! with the high watermark: a partition holds only committed records, which no leader change
//! truncates, so no epoch ever ended before the high watermark of what a client read.

use std::sync::Arc;

use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};

use crate::broker::Broker;
use crate::codes;
use crate::conn::{Ctx, Reply};

/// Every partition's leader epoch on a single broker.
pub const LEADER_EPOCH: i32 = 0;
/// "No epoch": the client does not know or ask for one.
const UNDEFINED: i32 = -1;

/// The partitions' leader epoch on this node: 0 on a single broker, the Raft term on a node
/// of a cluster; None on a node that does not lead (it serves no partition).
pub fn current(b: &Broker) -> Option<i32> {
    match b.replica() {
        None => Some(LEADER_EPOCH),
        Some(r) => r
            .leader_term()
            .map(|t| i32::try_from(t).unwrap_or(i32::MAX)),
    }
}

/// Kafka's check of a request's current_leader_epoch against this node's: none given (-1)
/// passes; an older one is FENCED_LEADER_EPOCH, a newer one (from a leader this node has not
/// become) UNKNOWN_LEADER_EPOCH; on a node that does not lead, NOT_LEADER_OR_FOLLOWER.
pub fn check_current(b: &Broker, epoch: i32) -> Option<i16> {
    match current(b) {
        None => Some(codes::NOT_LEADER_OR_FOLLOWER),
        Some(now) => check_against(epoch, now),
    }
}

fn check_against(epoch: i32, now: i32) -> Option<i16> {
    match epoch {
        UNDEFINED => None,
        e if e == now => None,
        e if e > now => Some(codes::UNKNOWN_LEADER_EPOCH),
        _ => Some(codes::FENCED_LEADER_EPOCH),
    }
}

/// (epoch, end offset) for a requested epoch: any epoch from 0 to the current one ends at the
/// high watermark (see the module's comment); a newer one does not exist yet and a negative
/// one never did: UNDEFINED with offset -1.
fn end_of(requested: i32, now: i32, high_watermark: i64) -> (i32, i64) {
    if (0..=now).contains(&requested) {
        (requested, high_watermark)
    } else {
        (UNDEFINED, -1)
    }
}

pub fn offset_for_leader_epoch(
    b: &Arc<Broker>,
    ctx: &Ctx,
    req: OffsetForLeaderEpochRequest,
) -> Reply {
    let mut resp = OffsetForLeaderEpochResponse::default();
    for t in req.topics {
        let mut tr = OffsetForLeaderTopicResult::default();
        tr.topic = t.topic.clone();
        let allowed =
            crate::acl::check::topic(b, ctx, crate::acl::Operation::Describe, t.topic.as_str());
        for p in t.partitions {
            let mut e = EpochEndOffset::default();
            e.partition = p.partition;
            e.leader_epoch = UNDEFINED;
            e.end_offset = -1;
            let pid = b.topics().partition(t.topic.as_str(), p.partition);
            match pid.and_then(|id| b.bounds(id)) {
                _ if !allowed => e.error_code = codes::TOPIC_AUTHORIZATION_FAILED,
                None => e.error_code = codes::UNKNOWN_TOPIC_OR_PARTITION,
                Some((_, end)) => match current(b) {
                    None => e.error_code = codes::NOT_LEADER_OR_FOLLOWER,
                    Some(now) => match check_against(p.current_leader_epoch, now) {
                        Some(code) => e.error_code = code,
                        None => {
                            (e.leader_epoch, e.end_offset) = end_of(p.leader_epoch, now, end as i64)
                        }
                    },
                },
            }
            tr.partitions.push(e);
        }
        resp.topics.push(tr);
    }
    ctx.ready(&resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_are_checked_as_kafka_checks_them() {
        assert_eq!(check_against(-1, 0), None);
        assert_eq!(check_against(0, 0), None);
        assert_eq!(check_against(1, 0), Some(codes::UNKNOWN_LEADER_EPOCH));
        assert_eq!(check_against(-2, 0), Some(codes::FENCED_LEADER_EPOCH));
        assert_eq!(check_against(4, 4), None);
        assert_eq!(check_against(3, 4), Some(codes::FENCED_LEADER_EPOCH));
        assert_eq!(check_against(5, 4), Some(codes::UNKNOWN_LEADER_EPOCH));
        assert_eq!(end_of(0, 0, 42), (0, 42));
        assert_eq!(end_of(3, 0, 42), (-1, -1));
        assert_eq!(end_of(-1, 0, 42), (-1, -1));
        assert_eq!(end_of(2, 4, 42), (2, 42));
        assert_eq!(end_of(4, 4, 42), (4, 42));
        assert_eq!(end_of(5, 4, 42), (-1, -1));
    }
}
