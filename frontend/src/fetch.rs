//! Fetch (with long polling) and ListOffsets. Only durable records are ever served: the high
//! watermark is the partition's durable end.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::FetchTopic;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{
    FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse,
};
use nvmq_log::LogError;

use crate::acl::{self, Operation};
use crate::batch;
use crate::broker::Broker;
use crate::codes;
use crate::conn::{Ctx, Outcome, Reply};
use crate::part::PartRef;
use crate::produce::log_error_code;

/// Longest a fetch may be held, whatever the client asks.
const MAX_WAIT: Duration = Duration::from_secs(30);

pub fn fetch(b: &Arc<Broker>, ctx: &Ctx, req: FetchRequest) -> Reply {
    let b = b.clone();
    let ctx = ctx.clone();
    Box::pin(async move {
        let wait = Duration::from_millis(req.max_wait_ms.max(0) as u64).min(MAX_WAIT);
        let deadline = tokio::time::Instant::now() + wait;
        let mut changes = b.durable_changes();
        let denied = denied_topics(&b, &ctx, &req);
        let req = Arc::new(req);
        loop {
            changes.borrow_and_update();
            let (resp, bytes, failed) = match read_once(&b, &ctx, &req, &denied, &mut cached) {
                Some(r) => r,
                None => {
                    // Older than the tail cache: read the device off the loop's thread.
                    let (b2, c2, r2, d2) = (b.clone(), ctx.clone(), req.clone(), denied.clone());
                    let read = b.blocking(0, move |_| {
                        read_once(&b2, &c2, &r2, &d2, &mut |b, id, o, m| {
                            Some(read_partition(b, id, o, m))
                        })
                    });
                    match read.await {
                        Ok(Some(r)) => r,
                        Ok(None) | Err(_) => {
                            let mut resp = FetchResponse::default();
                            resp.error_code = codes::KAFKA_STORAGE_ERROR;
                            return ctx.encode(&resp);
                        }
                    }
                }
            };
            if failed
                || bytes >= i64::from(req.min_bytes.max(1))
                || tokio::time::Instant::now() >= deadline
            {
                return ctx.encode(&resp);
            }
            tokio::select! {
                r = changes.changed() => if r.is_err() { return ctx.encode(&resp) },
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    })
}

/// Answers a Fetch at once if every partition it asks for can be read from the tail cache and
/// it need not wait (enough bytes, or no wait asked): the event loop's fast path. None: take the
/// long way (`fetch`).
pub fn try_now(b: &Broker, ctx: &Ctx, req: &FetchRequest) -> Option<Outcome> {
    let denied = denied_topics(b, ctx, req);
    let (resp, bytes, failed) = read_once(b, ctx, req, &denied, &mut cached)?;
    let wait = req.max_wait_ms > 0;
    (failed || bytes >= i64::from(req.min_bytes.max(1)) || !wait).then(|| ctx.encode(&resp))
}

/// Which of a Fetch's topics (by index) its principal may not Read; None when it may read them
/// all (always, with the authorizer off: then this costs a bool).
pub type Denied = Option<Arc<[bool]>>;

pub fn denied_topics(b: &Broker, ctx: &Ctx, req: &FetchRequest) -> Denied {
    if !b.acl().enabled() {
        return None;
    }
    let d: Vec<bool> = req
        .topics
        .iter()
        .map(|t| {
            // A topic id nvmq does not know is answered UNKNOWN_TOPIC_ID, not refused.
            topic_name(b, ctx, t).is_some_and(|n| !acl::check::topic(b, ctx, Operation::Read, &n))
        })
        .collect();
    d.contains(&true).then(|| d.into())
}

/// The topic a Fetch names: by name below v13, by id from v13 (None: an id nvmq does not know).
fn topic_name<'a>(b: &Broker, ctx: &Ctx, t: &'a FetchTopic) -> Option<Cow<'a, str>> {
    if ctx.version >= 13 {
        b.topics()
            .name_of(&t.topic_id)
            .map(|n| Cow::Owned(n.to_string()))
    } else {
        Some(Cow::Borrowed(t.topic.as_str()))
    }
}

/// Reads a partition's records for a fetch; None when it would block.
type PartitionRead<'a> =
    dyn FnMut(&Broker, PartRef, u64, usize) -> Option<Result<Bytes, LogError>> + 'a;

/// One pass over the requested partitions: (response, bytes of records, whether any partition
/// answered with an error); None if `read` could not read a partition without blocking.
fn read_once(
    b: &Broker,
    ctx: &Ctx,
    req: &FetchRequest,
    denied: &Denied,
    read: &mut PartitionRead<'_>,
) -> Option<(FetchResponse, i64, bool)> {
    let mut resp = FetchResponse::default();
    let mut budget = i64::from(req.max_bytes.max(0));
    if ctx.version < 3 || budget == 0 {
        budget = i64::from(i32::MAX);
    }
    // Whatever the client asks, one answer stays within the broker's cap (its memory is held
    // until the client reads it); a client gets at least one batch and asks again.
    budget = budget.min(i64::try_from(b.cfg.fetch_max_bytes).unwrap_or(i64::MAX));
    let mut total = 0i64;
    let mut failed = false;
    let mut readable = 0;
    for (ti, t) in req.topics.iter().enumerate() {
        let mut tr = FetchableTopicResponse::default();
        let name = topic_name(b, ctx, t);
        if ctx.version >= 13 {
            tr.topic_id = t.topic_id;
        } else {
            tr.topic = t.topic.clone();
        }
        let refused = denied.as_ref().is_some_and(|d| d.get(ti) == Some(&true));
        readable += usize::from(!refused);
        for p in &t.partitions {
            let mut pd = PartitionData::default();
            pd.partition_index = p.partition;
            if ctx.version >= 4 {
                pd.aborted_transactions = Some(Vec::new());
            }
            if refused {
                pd.error_code = codes::TOPIC_AUTHORIZATION_FAILED;
                pd.high_watermark = -1;
                pd.last_stable_offset = -1;
                tr.partitions.push(pd);
                continue;
            }
            let pid = name
                .as_deref()
                .and_then(|n| b.topics().partition(n, p.partition));
            let bounds = pid.and_then(|id| b.bounds(id).map(|bd| (id, bd)));
            let Some((id, (start, end))) = bounds else {
                pd.error_code = if name.is_none() {
                    codes::UNKNOWN_TOPIC_ID
                } else {
                    codes::UNKNOWN_TOPIC_OR_PARTITION
                };
                pd.high_watermark = -1;
                pd.last_stable_offset = -1;
                failed = true;
                tr.partitions.push(pd);
                continue;
            };
            pd.high_watermark = end as i64;
            pd.last_stable_offset = end as i64;
            if ctx.version >= 5 {
                pd.log_start_offset = start as i64;
            }
            let offset = p.fetch_offset;
            if let Some(code) = crate::epoch::check_current(b, p.current_leader_epoch) {
                pd.error_code = code;
                failed = true;
            } else if offset < start as i64 || offset > end as i64 {
                pd.error_code = codes::OFFSET_OUT_OF_RANGE;
                failed = true;
            } else if (offset as u64) < end && (budget > 0 || total == 0) {
                let max = i64::from(p.partition_max_bytes.max(1)).min(budget.max(1)) as usize;
                match read(b, id, offset as u64, max)? {
                    Ok(records) => {
                        total += records.len() as i64;
                        budget -= records.len() as i64;
                        if !records.is_empty() {
                            pd.records = Some(records);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(topic = name.as_deref().unwrap_or(""), partition = p.partition, error = %e, "fetch failed");
                        pd.error_code = log_error_code(&e);
                        failed = true;
                    }
                }
            }
            tr.partitions.push(pd);
        }
        resp.responses.push(tr);
    }
    // Nothing it may read: answered at once rather than held for data it would not get (a
    // refused topic among readable ones waits with them, as Kafka's does).
    failed |= readable == 0 && denied.is_some();
    Some((resp, total, failed))
}

/// A partition's records from the tail cache only (None: not all there).
fn cached(b: &Broker, p: PartRef, offset: u64, max: usize) -> Option<Result<Bytes, LogError>> {
    let log = b.log_of(p);
    let recs = nvmq_log::read_cached(log.shared(), &log.geometry(), p.id, offset, max)?;
    Some(recs.map(|r| concat(r, max)))
}

/// Whole stored batches from the one holding `offset`, each with the offset the log gave it
/// written into its baseOffset; the first always, the rest while they fit `max`. Blocking.
fn read_partition(b: &Broker, p: PartRef, offset: u64, max: usize) -> Result<Bytes, LogError> {
    Ok(concat(b.log_of(p).read(p.id, offset, max)?, max))
}

fn concat(records: Vec<nvmq_log::Record>, max: usize) -> Bytes {
    let mut out = Vec::new();
    for r in records {
        if !out.is_empty() && out.len() + r.payload.len() > max {
            break;
        }
        let at = out.len();
        out.extend_from_slice(&r.payload);
        batch::set_base_offset(&mut out[at..], r.offset);
    }
    Bytes::from(out)
}

pub fn list_offsets(b: &Arc<Broker>, ctx: &Ctx, req: ListOffsetsRequest) -> Reply {
    let b = b.clone();
    let ctx = ctx.clone();
    Box::pin(async move {
        let mut resp = ListOffsetsResponse::default();
        for t in req.topics {
            let mut tr = ListOffsetsTopicResponse::default();
            tr.name = t.name.clone();
            let allowed = acl::check::topic(&b, &ctx, Operation::Describe, t.name.as_str());
            for p in t.partitions {
                let mut pr = ListOffsetsPartitionResponse::default();
                pr.partition_index = p.partition_index;
                pr.timestamp = -1;
                pr.offset = -1;
                let pid = b.topics().partition(t.name.as_str(), p.partition_index);
                let bounds = pid.and_then(|id| b.bounds(id).map(|bd| (id, bd)));
                if bounds.is_some() && allowed && ctx.version >= 4 {
                    pr.leader_epoch = crate::epoch::current(&b).unwrap_or(-1);
                }
                match (
                    bounds,
                    crate::epoch::check_current(&b, p.current_leader_epoch),
                ) {
                    _ if !allowed => pr.error_code = codes::TOPIC_AUTHORIZATION_FAILED,
                    (None, _) => pr.error_code = codes::UNKNOWN_TOPIC_OR_PARTITION,
                    (Some(_), Some(code)) => pr.error_code = code,
                    // Earliest (-2), and earliest local (-4, v8+): everything is local here.
                    (Some((_, (start, _))), None) if matches!(p.timestamp, -2 | -4) => {
                        pr.offset = start as i64;
                    }
                    (Some((_, (_, end))), None) if p.timestamp == -1 => pr.offset = end as i64,
                    // Latest tiered (-5, v9+): nothing is tiered, so -1, as Kafka answers
                    // for a topic without remote storage.
                    (Some(_), None) if p.timestamp == -5 => {}
                    (Some((id, (start, end))), None) => {
                        match by_time(&b, id, start, end, p.timestamp).await {
                            Ok(Some((offset, ts))) => {
                                pr.offset = offset;
                                pr.timestamp = ts;
                            }
                            Ok(None) => {}
                            Err(e) => pr.error_code = log_error_code(&e),
                        }
                    }
                }
                tr.partitions.push(pr);
            }
            resp.topics.push(tr);
        }
        ctx.encode(&resp)
    })
}

/// The first record whose timestamp reaches `ts` (-3: the record with the largest timestamp),
/// through the partition's time index.
async fn by_time(
    b: &Broker,
    p: PartRef,
    start: u64,
    end: u64,
    ts: i64,
) -> Result<Option<(i64, i64)>, LogError> {
    let idx = b.time_index().clone();
    b.blocking(p.dev, move |log: &nvmq_log::Log| {
        idx.lookup(log, p, start, end, ts)
    })
    .await?
}
