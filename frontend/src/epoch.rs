//! Leader epochs. A single node has led every partition since it was created, so each
//! partition's leader epoch is 0: Metadata reports it, Fetch and ListOffsets check a client's
//! current_leader_epoch against it, and OffsetForLeaderEpoch answers the end of epoch 0 with
//! the high watermark (the durable end).

use std::sync::Arc;

use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};

use crate::broker::Broker;
use crate::codes;
use crate::conn::{Ctx, Reply};

/// Every partition's leader epoch.
pub const LEADER_EPOCH: i32 = 0;
/// "No epoch": the client does not know or ask for one.
const UNDEFINED: i32 = -1;

/// Kafka's check of a request's current_leader_epoch: none given (-1) passes; an older one is
/// FENCED_LEADER_EPOCH, a newer one (from a leader this node has not become) UNKNOWN_LEADER_EPOCH.
pub fn check_current(epoch: i32) -> Option<i16> {
    match epoch {
        UNDEFINED | LEADER_EPOCH => None,
        e if e > LEADER_EPOCH => Some(codes::UNKNOWN_LEADER_EPOCH),
        _ => Some(codes::FENCED_LEADER_EPOCH),
    }
}

/// (epoch, end offset) for a requested epoch, as Kafka's leader epoch cache answers: the
/// current epoch ends at the high watermark; any other (none is older than 0 here, and a
/// newer one does not exist yet) is UNDEFINED with offset -1.
fn end_of(requested: i32, high_watermark: i64) -> (i32, i64) {
    if requested == LEADER_EPOCH {
        (LEADER_EPOCH, high_watermark)
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
                Some((_, end)) => match check_current(p.current_leader_epoch) {
                    Some(code) => e.error_code = code,
                    None => (e.leader_epoch, e.end_offset) = end_of(p.leader_epoch, end as i64),
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
        assert_eq!(check_current(-1), None);
        assert_eq!(check_current(0), None);
        assert_eq!(check_current(1), Some(codes::UNKNOWN_LEADER_EPOCH));
        assert_eq!(check_current(-2), Some(codes::FENCED_LEADER_EPOCH));
        assert_eq!(end_of(0, 42), (0, 42));
        assert_eq!(end_of(3, 42), (-1, -1));
        assert_eq!(end_of(-1, 42), (-1, -1));
    }
}
