//! Produce: each partition's RecordBatch is checked and stored whole as one log record spanning
//! its messages; acks=-1 and acks=1 are answered once the flush covering it completed, and an
//! acks=0 request that fails closes the connection (Kafka's way of telling a client that gets
//! no answer). Also the request and answer layouts of v0–2, which the codec no longer knows.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::produce_request::TopicProduceData;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::{Decodable, StrBytes};
use nvmq_log::{Appended, LogError};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::acl::{self, Operation};
use crate::batch;
use crate::broker::{Broker, Config};
use crate::codes;
use crate::conn::{Ctx, Outcome, Refusal, Reply};
use crate::part::PartRef;
use crate::producers::{BatchKey, Landing, Verdict};
use crate::records::Checks;

/// The highest Produce version of message formats v0/v1 (KIP-896 took them out of Kafka 4 and
/// of the codec). Served by hand: see `decode_request` and `encode_response`.
pub const LEGACY_MAX: i16 = 2;

/// Decodes a Produce request body. A v0–2 body is v3's without its first field (the
/// transactional id), so it is decoded as v3 behind a null one.
pub fn decode_request(ctx: &Ctx, mut body: Bytes) -> Result<ProduceRequest, Refusal> {
    if ctx.version > LEGACY_MAX {
        return crate::conn::decode(ctx, &mut body);
    }
    let mut v3 = BytesMut::with_capacity(body.len() + 2);
    v3.put_i16(-1);
    v3.extend_from_slice(&body);
    let mut v3 = v3.freeze();
    ProduceRequest::decode(&mut v3, 3).map_err(|e| Refusal::Malformed {
        what: format!("Produce v{} request", ctx.version),
        why: e.to_string(),
    })
}

/// Appends the answer (length, header, body) to `out`; false, and `out` as it was, when it does
/// not encode. v0–2 are laid out here: v3's answer without log_append_time (v0–1) and
/// throttle_time (v0), with response header v0.
pub fn encode_response(ctx: &Ctx, resp: &ProduceResponse, out: &mut Vec<u8>) -> bool {
    if ctx.version > LEGACY_MAX {
        return ctx.encode_into(resp, out);
    }
    let at = out.len();
    let ok = encode_legacy(ctx.version, ctx.correlation_id, resp, out);
    match ok.and_then(|()| i32::try_from(out.len() - at - 4).ok()) {
        Some(len) => {
            out[at..at + 4].copy_from_slice(&len.to_be_bytes());
            true
        }
        None => {
            out.truncate(at);
            tracing::error!(version = ctx.version, "could not encode a Produce answer");
            false
        }
    }
}

fn encode_legacy(
    version: i16,
    correlation_id: i32,
    resp: &ProduceResponse,
    out: &mut Vec<u8>,
) -> Option<()> {
    out.extend_from_slice(&[0; 4]);
    out.extend(correlation_id.to_be_bytes());
    out.extend(i32::try_from(resp.responses.len()).ok()?.to_be_bytes());
    for t in &resp.responses {
        let name = t.name.as_str().as_bytes();
        out.extend(i16::try_from(name.len()).ok()?.to_be_bytes());
        out.extend(name);
        out.extend(
            i32::try_from(t.partition_responses.len())
                .ok()?
                .to_be_bytes(),
        );
        for p in &t.partition_responses {
            out.extend(p.index.to_be_bytes());
            out.extend(p.error_code.to_be_bytes());
            out.extend(p.base_offset.to_be_bytes());
            if version >= 2 {
                out.extend(p.log_append_time_ms.to_be_bytes());
            }
        }
    }
    if version >= 1 {
        out.extend(resp.throttle_time_ms.to_be_bytes());
    }
    Some(())
}

/// The answer to a Produce as an outcome for the writer.
fn answer(ctx: &Ctx, resp: &ProduceResponse) -> Outcome {
    let mut out = Vec::new();
    if encode_response(ctx, resp, &mut out) {
        Outcome::Send(Bytes::from(out))
    } else {
        Outcome::Close
    }
}

/// What the batches of a Produce at `version` must satisfy besides their own framing.
pub fn checks(cfg: &Config, version: i16) -> Checks {
    Checks {
        max_uncompressed: cfg.max_uncompressed_batch,
        zstd: version >= 7,
    }
}

/// A replicated batch's answer, once applied (`replica::Replica::submit`).
type Replicated = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = Result<crate::replica::Answer, crate::replica::WriteError>>
            + Send,
    >,
>;

enum Wait {
    Stored(oneshot::Receiver<Result<Appended, LogError>>),
    Replicated(Replicated),
    Duplicate(Landing),
    /// Ceiling mode: answered without storing.
    Ceiling,
}

struct PartWait {
    index: i32,
    partition: Option<PartRef>,
    error: Option<(i16, String)>,
    waits: Vec<Wait>,
}

/// What a Produce may do with one of its topics: decided once per topic per request, with one
/// lock of the topic registry, for both of Produce's paths (`produce` here and the event loop's
/// `reactor::checking`).
pub(crate) enum TopicGate {
    /// Every partition the request names of the topic is refused with this.
    Refused(i16, String),
    /// The partitions the request names, in its order (None: the topic has no such index).
    Open(Vec<Option<PartRef>>),
}

impl TopicGate {
    /// Decides for topic `t` of a Produce, in Kafka's order: from v13 (KIP-516) an id no live
    /// topic has (never had, or a topic since deleted, whose re-creation got a new id) is
    /// UNKNOWN_TOPIC_ID, before any ACL is read, as Kafka resolves ids first; then Write on the
    /// topic; then `request`, what the request as a whole is refused for (`request_refusal`).
    /// From v13 the live topic's name goes into `t.name`, so the answer and the logs read it as
    /// at v3–12.
    pub fn decide(
        b: &Broker,
        ctx: &Ctx,
        request: Option<&(i16, String)>,
        t: &mut TopicProduceData,
    ) -> TopicGate {
        let parts = {
            let topics = b.topics();
            if ctx.version >= 13 {
                match topics.name_of(&t.topic_id) {
                    Some(n) => t.name = TopicName(StrBytes::from_string(n.to_owned())),
                    None => {
                        return TopicGate::Refused(
                            codes::UNKNOWN_TOPIC_ID,
                            format!("no topic has id {}", t.topic_id),
                        )
                    }
                }
            }
            let name = t.name.as_str();
            t.partition_data
                .iter()
                .map(|p| topics.partition(name, p.index))
                .collect()
        };
        if !acl::check::topic(b, ctx, Operation::Write, t.name.as_str()) {
            return TopicGate::Refused(
                codes::TOPIC_AUTHORIZATION_FAILED,
                format!(
                    "{} may not write to topic {:?}",
                    ctx.session.principal(),
                    t.name.as_str()
                ),
            );
        }
        if let Some((code, what)) = request {
            return TopicGate::Refused(*code, what.clone());
        }
        TopicGate::Open(parts)
    }

    /// The `i`-th partition the request names of topic `name` (its index `index`), or why it is
    /// refused.
    pub fn partition(&self, i: usize, name: &str, index: i32) -> Result<PartRef, (i16, String)> {
        match self {
            TopicGate::Refused(code, what) => Err((*code, what.clone())),
            TopicGate::Open(parts) => parts.get(i).copied().flatten().ok_or_else(|| {
                (
                    codes::UNKNOWN_TOPIC_OR_PARTITION,
                    format!("{name}/{index} does not exist"),
                )
            }),
        }
    }
}

/// Why a Produce is refused as a whole (each of its partitions answers it, after the refusals
/// of its topic): a transactional id, or acks other than -1, 0 or 1.
pub(crate) fn request_refusal(req: &ProduceRequest) -> Option<(i16, String)> {
    if req.transactional_id.is_some() {
        Some((
            codes::INVALID_REQUEST,
            "transactions are not supported".into(),
        ))
    } else if !matches!(req.acks, -1..=1) {
        Some((codes::INVALID_REQUIRED_ACKS, format!("acks={}", req.acks)))
    } else {
        None
    }
}

pub fn log_error_code(e: &LogError) -> i16 {
    match e {
        LogError::RecordTooLarge { .. } => codes::MESSAGE_TOO_LARGE,
        LogError::UnknownPartition(_) => codes::UNKNOWN_TOPIC_OR_PARTITION,
        LogError::OffsetOutOfRange { .. } => codes::OFFSET_OUT_OF_RANGE,
        LogError::Corrupt { .. } => codes::CORRUPT_MESSAGE,
        _ => codes::KAFKA_STORAGE_ERROR,
    }
}

pub async fn produce(b: &Arc<Broker>, ctx: &Ctx, req: ProduceRequest) -> Reply {
    let acks = req.acks;
    let refused = request_refusal(&req);
    let checks = checks(&b.cfg, ctx.version);
    let mut topics: Vec<(TopicName, Uuid, Vec<PartWait>)> = Vec::new();
    for mut t in req.topic_data {
        let gate = TopicGate::decide(b, ctx, refused.as_ref(), &mut t);
        let mut parts = Vec::with_capacity(t.partition_data.len());
        for (i, p) in t.partition_data.into_iter().enumerate() {
            let pid = gate.partition(i, t.name.as_str(), p.index);
            let mut pw = PartWait {
                index: p.index,
                partition: pid.as_ref().ok().copied(),
                error: None,
                waits: Vec::new(),
            };
            pw.error = match pid {
                Err(refused) => Some(refused),
                Ok(pid) => {
                    let records = p.records.as_deref().unwrap_or(&[]);
                    match b.replica() {
                        Some(r) => {
                            let at = (t.name.as_str(), p.index);
                            start_replicated(b, r, pid, at, records, &checks, &mut pw.waits).await
                        }
                        None => start_partition(b, pid, records, &checks, &mut pw.waits).await,
                    }
                }
            };
            if let Some((code, what)) = &pw.error {
                tracing::debug!(topic = t.name.as_str(), partition = p.index, code, %what, "produce refused");
            }
            parts.push(pw);
        }
        topics.push((t.name, t.topic_id, parts));
    }
    if acks == 0 {
        // Nobody hears about a failure but through the connection: it is closed once one is
        // known (here after the appends finish; the loop's fast path does not wait).
        let refused = topics
            .iter()
            .flat_map(|(_, _, ps)| ps)
            .any(|p| p.error.is_some());
        let waits: Vec<Wait> = topics
            .into_iter()
            .flat_map(|(_, _, ps)| ps)
            .flat_map(|p| p.waits)
            .collect();
        return Box::pin(async move {
            if refused || finish(waits, None).await.0 != codes::NONE {
                Outcome::Close
            } else {
                Outcome::Nothing
            }
        });
    }
    let b = b.clone();
    let ctx = ctx.clone();
    let timeout = u64::try_from(req.timeout_ms).ok().filter(|&t| t > 0);
    Box::pin(async move {
        let mut resp = ProduceResponse::default();
        let deadline = timeout.map(|t| tokio::time::Instant::now() + Duration::from_millis(t));
        for (name, id, parts) in topics {
            let mut tr = TopicProduceResponse::default();
            // The codec writes the one the version has: the name to v12, the id from v13.
            tr.name = name;
            tr.topic_id = id;
            for pw in parts {
                let mut pr = PartitionProduceResponse::default();
                pr.index = pw.index;
                pr.log_append_time_ms = -1;
                match pw.error {
                    Some((code, what)) => {
                        pr.error_code = code;
                        pr.base_offset = -1;
                        if ctx.version >= 8 {
                            pr.error_message = Some(StrBytes::from_string(what));
                        }
                    }
                    None => {
                        let (code, base) = finish(pw.waits, deadline).await;
                        pr.error_code = code;
                        pr.base_offset = base;
                    }
                }
                if ctx.version >= 5 {
                    pr.log_start_offset = pw
                        .partition
                        .and_then(|p| b.bounds(p))
                        .map_or(-1, |(s, _)| s as i64);
                }
                tr.partition_responses.push(pr);
            }
            resp.responses.push(tr);
        }
        answer(&ctx, &resp)
    })
}

/// A partition's record batches as `batch::split` gives them: each one's header and bytes.
type Batches<'r> = Vec<(crate::batch::BatchInfo, &'r [u8])>;

/// The partition's record batches, split and checked, none larger than its limit.
fn checked_batches<'r>(
    b: &Broker,
    pid: PartRef,
    records: &'r [u8],
    checks: &Checks,
) -> Result<Batches<'r>, (i16, String)> {
    let batches = batch::split(records, checks).map_err(|f| (f.code, f.what))?;
    match oversized(&batches, b.batch_limit(pid)) {
        Some(refused) => Err(refused),
        None => Ok(batches),
    }
}

/// Checks and queues the partition's batches in order; None when all are queued.
async fn start_partition(
    b: &Broker,
    pid: PartRef,
    records: &[u8],
    checks: &Checks,
    waits: &mut Vec<Wait>,
) -> Option<(i16, String)> {
    let batches = match checked_batches(b, pid, records, checks) {
        Ok(v) => v,
        Err(refused) => return Some(refused),
    };
    if b.cfg.ceiling {
        // Checked like any batch, answered without the log: the bench's ceiling.
        waits.extend(batches.iter().map(|_| Wait::Ceiling));
        return None;
    }
    for (info, bytes) in batches {
        match b.producers.check(pid, &info) {
            Verdict::Refuse(code, what) => return Some((code, what)),
            Verdict::Duplicate(l) => waits.push(Wait::Duplicate(l)),
            Verdict::Store(landing) => {
                // Every append to a data partition reports its acknowledgement (in log order):
                // the producer snapshots rely on seeing all of them.
                let producers = b.producers().clone();
                let key = BatchKey::of(&info);
                let span = info.span();
                let r = b
                    .append_with(pid, bytes.to_vec(), span, move |r| {
                        let result = r.as_ref().map(|a| (a.offset, span)).map_err(|_| ());
                        producers.acknowledged(pid, key, landing, result);
                    })
                    .await;
                match r {
                    Ok(rx) => waits.push(Wait::Stored(rx)),
                    // The refused append dropped its landing's sender: the producers take the
                    // retry as a new batch (see `Producers::check`), not as a duplicate.
                    Err(e) => return Some((log_error_code(&e), e.to_string())),
                }
            }
        }
    }
    None
}

/// A cluster node's partition: checked as `start_partition` checks, then each batch is written
/// through the group in order; only the leader takes them.
async fn start_replicated(
    b: &Broker,
    replica: &crate::replica::Replica,
    pid: PartRef,
    (topic, index): (&str, i32),
    records: &[u8],
    checks: &Checks,
    waits: &mut Vec<Wait>,
) -> Option<(i16, String)> {
    use crate::replica::{command, WriteError};
    let batches = match checked_batches(b, pid, records, checks) {
        Ok(v) => v,
        Err(refused) => return Some(refused),
    };
    let partition = u32::try_from(index).unwrap_or(0);
    for (info, bytes) in batches {
        if info.producer_id >= 0 {
            return Some((
                codes::UNSUPPORTED_FOR_MESSAGE_FORMAT,
                "idempotent and transactional producers are not replicated yet: produce to a \
                 cluster with enable.idempotence=false"
                    .into(),
            ));
        }
        // Encoded straight from the request's bytes: the batch is copied once, into the entry.
        let entry = command::encode_produce(topic, partition, info.span(), bytes);
        match replica.submit_encoded(entry) {
            Ok(answer) => waits.push(Wait::Replicated(Box::pin(answer))),
            Err(WriteError::NotLeader { leader }) => {
                return Some((
                    codes::NOT_LEADER_OR_FOLLOWER,
                    format!(
                        "node {} does not lead (leader: {leader:?})",
                        replica.node_id()
                    ),
                ))
            }
            Err(e) => return Some((codes::KAFKA_STORAGE_ERROR, e.to_string())),
        }
    }
    None
}

/// MESSAGE_TOO_LARGE for the first batch larger than a record of the log may be.
pub(crate) fn oversized<B: AsRef<[u8]>>(
    batches: &[(crate::batch::BatchInfo, B)],
    max: usize,
) -> Option<(i16, String)> {
    let (info, _) = batches
        .iter()
        .find(|(_, bytes)| bytes.as_ref().len() > max)?;
    Some((
        codes::MESSAGE_TOO_LARGE,
        format!(
            "record batch of {} bytes exceeds the {max}-byte limit",
            info.len
        ),
    ))
}

/// Waits for the partition's batches; (error code, base offset of the first).
async fn finish(waits: Vec<Wait>, deadline: Option<tokio::time::Instant>) -> (i16, i64) {
    let all = async {
        let mut base = -1i64;
        for w in waits {
            let offset = match w {
                Wait::Stored(rx) => match rx.await {
                    Ok(Ok(a)) => a.offset as i64,
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "append failed");
                        return (log_error_code(&e), -1);
                    }
                    Err(_) => return (codes::KAFKA_STORAGE_ERROR, -1),
                },
                Wait::Ceiling => 0,
                Wait::Replicated(answer) => match answer.await {
                    Ok(crate::replica::Answer::Produced { base }) => base as i64,
                    Ok(crate::replica::Answer::Refused { code, why }) => {
                        tracing::warn!(code, %why, "replicated batch refused at apply");
                        return (code, -1);
                    }
                    Ok(other) => {
                        tracing::error!(?other, "a replicated batch answered as no batch does");
                        return (codes::KAFKA_STORAGE_ERROR, -1);
                    }
                    Err(crate::replica::WriteError::NotLeader { .. }) => {
                        return (codes::NOT_LEADER_OR_FOLLOWER, -1)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "replicated batch failed");
                        return (codes::KAFKA_STORAGE_ERROR, -1);
                    }
                },
                Wait::Duplicate(mut l) => match l.wait_for(|v| v.is_some()).await {
                    Ok(v) => match *v {
                        Some(Ok(o)) => o,
                        _ => return (codes::KAFKA_STORAGE_ERROR, -1),
                    },
                    Err(_) => return (codes::KAFKA_STORAGE_ERROR, -1),
                },
            };
            if base < 0 {
                base = offset;
            }
        }
        (codes::NONE, base)
    };
    match deadline {
        Some(d) => tokio::time::timeout_at(d, all)
            .await
            .unwrap_or((codes::REQUEST_TIMED_OUT, -1)),
        None => all.await,
    }
}
