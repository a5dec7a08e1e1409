//! The loop's fast path: Produce without a task, a future or a channel per request, and Fetch
//! answered from the tail cache when it can be.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{FetchRequest, ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use nvmq_log::{Appended, LogError};

use super::conn::{ConnRef, Slot};
use super::service::{Answer, LoopCtx, ProducerHook};
use crate::conn::{decode, Ctx, Outcome};
use crate::part::PartRef;
use crate::produce::log_error_code;
use crate::producers::{BatchKey, Verdict};
use crate::records::Checks;
use crate::{batch, codes, fetch};

/// Where an idempotent retry of a batch still in flight will land.
type LandingWait = Pin<Box<dyn Future<Output = Option<Result<i64, ()>>>>>;

struct PartAnswer {
    index: i32,
    code: i16,
    message: Option<String>,
    base: i64,
    log_start: i64,
    /// Batches of this partition not answered yet.
    waiting: u32,
}

/// A Produce request waiting for its acks (or answered, once `waiting` is 0).
pub(crate) struct ProduceSlot {
    ctx: Ctx,
    topics: Vec<(TopicName, Vec<PartAnswer>)>,
    waiting: u32,
    deadline: Option<Instant>,
    /// (topic, part, batch, where a duplicate of an in-flight batch lands).
    landings: Vec<(u16, u16, u16, LandingWait)>,
}

impl ProduceSlot {
    pub fn done(&self) -> bool {
        self.waiting == 0
    }

    fn settle(&mut self, topic: u16, part: u16, batch: u16, result: Result<i64, i16>) {
        let Some(p) = self
            .topics
            .get_mut(topic as usize)
            .and_then(|(_, ps)| ps.get_mut(part as usize))
        else {
            return;
        };
        if p.waiting == 0 {
            return; // timed out already
        }
        p.waiting -= 1;
        self.waiting -= 1;
        match result {
            Ok(offset) if batch == 0 => p.base = offset,
            Ok(_) => {}
            Err(code) => {
                if p.code == codes::NONE {
                    p.code = code;
                    p.base = -1;
                }
            }
        }
    }

    /// An append of batch `batch` of a partition was answered.
    pub fn complete(&mut self, topic: u16, part: u16, batch: u16, r: Result<Appended, LogError>) {
        let r = match r {
            Ok(a) => Ok(a.offset as i64),
            Err(e) => {
                tracing::error!(error = %e, "append failed");
                Err(log_error_code(&e))
            }
        };
        self.settle(topic, part, batch, r);
    }

    /// Polls the duplicates still waiting for their original; true when one was answered.
    pub fn poll_landings(&mut self, cx: &mut Context<'_>) -> bool {
        let mut answered = Vec::new();
        self.landings
            .retain_mut(|(t, p, b, l)| match l.as_mut().poll(cx) {
                Poll::Ready(v) => {
                    answered.push((*t, *p, *b, v));
                    false
                }
                Poll::Pending => true,
            });
        let any = !answered.is_empty();
        for (t, p, b, v) in answered {
            let r = match v {
                Some(Ok(o)) => Ok(o),
                _ => Err(codes::KAFKA_STORAGE_ERROR),
            };
            self.settle(t, p, b, r);
        }
        any
    }

    /// Past its deadline, what is still waiting is answered REQUEST_TIMED_OUT (the appends still
    /// become durable). True when that happened now.
    pub fn expire(&mut self, now: Instant) -> bool {
        if self.waiting == 0 || self.deadline.is_none_or(|d| now < d) {
            return false;
        }
        for (_, parts) in &mut self.topics {
            for p in parts.iter_mut().filter(|p| p.waiting > 0) {
                p.waiting = 0;
                p.code = codes::REQUEST_TIMED_OUT;
                p.base = -1;
            }
        }
        self.waiting = 0;
        self.landings.clear();
        true
    }

    /// The answer, appended to `out`; false if it does not encode.
    pub fn encode_into(self, out: &mut Vec<u8>) -> bool {
        let mut resp = ProduceResponse::default();
        let v = self.ctx.version;
        for (name, parts) in self.topics {
            let mut tr = TopicProduceResponse::default();
            tr.name = name;
            for p in parts {
                let mut pr = PartitionProduceResponse::default();
                pr.index = p.index;
                pr.error_code = p.code;
                pr.base_offset = if p.code == codes::NONE { p.base } else { -1 };
                pr.log_append_time_ms = -1;
                if v >= 5 {
                    pr.log_start_offset = p.log_start;
                }
                if v >= 8 {
                    pr.error_message = p.message.map(StrBytes::from_string);
                }
                tr.partition_responses.push(pr);
            }
            resp.responses.push(tr);
        }
        crate::produce::encode_response(&self.ctx, &resp, out)
    }
}

/// Starts a Produce: checks every batch and queues it for its partition's writer with a token
/// that routes its ack back to this request. None when nothing is answered (acks=0).
pub(crate) fn produce(lp: &LoopCtx, conn: ConnRef, seq: u64, c: &Ctx, body: Bytes) -> Option<Slot> {
    let req: ProduceRequest = match crate::produce::decode_request(c, body) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "closing connection");
            return Some(Slot::Ready(Outcome::Close));
        }
    };
    let b = &lp.broker;
    let acks = req.acks;
    let checks = crate::produce::checks(&b.cfg, c.version);
    let mut refused_any = false;
    let ctx = Ctx {
        api: c.api,
        version: c.version,
        correlation_id: c.correlation_id,
        client_id: String::new(),
    };
    let mut slot = ProduceSlot {
        ctx,
        topics: Vec::with_capacity(req.topic_data.len()),
        waiting: 0,
        deadline: u64::try_from(req.timeout_ms)
            .ok()
            .filter(|&t| t > 0)
            .map(|t| Instant::now() + Duration::from_millis(t)),
        landings: Vec::new(),
    };
    for (ti, t) in req.topic_data.into_iter().enumerate() {
        let mut parts = Vec::with_capacity(t.partition_data.len());
        for (pi, p) in t.partition_data.into_iter().enumerate() {
            let pid = b.topics().partition(t.name.as_str(), p.index);
            let mut pa = PartAnswer {
                index: p.index,
                code: codes::NONE,
                message: None,
                base: -1,
                log_start: pid
                    .and_then(|id| b.bounds(id))
                    .map_or(-1, |(s, _)| s as i64),
                waiting: 0,
            };
            let refused = if req.transactional_id.is_some() {
                Some((
                    codes::INVALID_REQUEST,
                    "transactions are not supported".into(),
                ))
            } else if !matches!(acks, -1..=1) {
                Some((codes::INVALID_REQUIRED_ACKS, format!("acks={acks}")))
            } else if let Some(pid) = pid {
                let at = Place {
                    conn,
                    seq,
                    topic: ti as u16,
                    part: pi as u16,
                    answered: acks != 0,
                };
                let records = p.records.unwrap_or_default();
                start_partition(lp, pid, &records, &checks, at, &mut pa, &mut slot)
            } else {
                Some((
                    codes::UNKNOWN_TOPIC_OR_PARTITION,
                    format!("{}/{} does not exist", t.name.as_str(), p.index),
                ))
            };
            if let Some((code, what)) = refused {
                tracing::debug!(topic = t.name.as_str(), partition = p.index, code, %what, "produce refused");
                refused_any = true;
                pa.code = code;
                pa.message = Some(what);
            }
            parts.push(pa);
        }
        slot.topics.push((t.name, parts));
    }
    if acks == 0 {
        // No answer goes back, so a failure can only be told by closing the connection, as
        // Kafka does; what the request had queued still lands. (An append the device fails
        // later closes it too: `Answer::Silent`.)
        if refused_any {
            tracing::info!(
                client = %c.client_id,
                "an acks=0 produce failed; closing the connection"
            );
            return Some(Slot::Ready(Outcome::Close));
        }
        return None;
    }
    Some(Slot::Produce(slot))
}

/// Where a batch's ack goes.
#[derive(Clone, Copy)]
struct Place {
    conn: ConnRef,
    seq: u64,
    topic: u16,
    part: u16,
    answered: bool,
}

/// Checks and queues a partition's batches in order; an error when one is refused (those before
/// it are queued and still land, as Kafka's own partial appends do not exist: the client retries
/// the partition, and idempotence answers the retry of the stored ones).
fn start_partition(
    lp: &LoopCtx,
    pid: PartRef,
    records: &Bytes,
    checks: &Checks,
    at: Place,
    pa: &mut PartAnswer,
    slot: &mut ProduceSlot,
) -> Option<(i16, String)> {
    let b = &lp.broker;
    let batches = match batch::split(records, checks) {
        Ok(v) => v,
        Err(f) => return Some((f.code, f.what)),
    };
    if b.cfg.ceiling {
        // Checked like any batch, answered without the log: the bench's ceiling.
        pa.base = 0;
        return None;
    }
    if let Some(refused) = crate::produce::oversized(&batches, b.log_of(pid).max_payload()) {
        return Some(refused);
    }
    for (i, (info, bytes)) in batches.into_iter().enumerate() {
        let batch = i as u16;
        match b.producers().check(pid, &info) {
            Verdict::Refuse(code, what) => return Some((code, what)),
            Verdict::Duplicate(mut l) => {
                let now = *l.borrow();
                match now {
                    Some(Ok(o)) if batch == 0 => pa.base = o,
                    Some(Ok(_)) => {}
                    Some(Err(())) => {
                        return Some((
                            codes::KAFKA_STORAGE_ERROR,
                            "the original append failed".into(),
                        ))
                    }
                    None => {
                        pa.waiting += 1;
                        slot.waiting += 1;
                        let wait: LandingWait = Box::pin(async move {
                            l.wait_for(|v| v.is_some()).await.ok().and_then(|v| *v)
                        });
                        slot.landings.push((at.topic, at.part, batch, wait));
                    }
                }
            }
            Verdict::Store(landing) => {
                let answer = if at.answered {
                    pa.waiting += 1;
                    slot.waiting += 1;
                    Answer::Conn {
                        conn: at.conn,
                        seq: at.seq,
                        topic: at.topic,
                        part: at.part,
                        batch,
                    }
                } else {
                    Answer::Silent { conn: at.conn }
                };
                // Every append to a data partition reports its acknowledgement (in log order):
                // the producer snapshots rely on seeing all of them.
                let hook = ProducerHook {
                    partition: pid,
                    span: info.span(),
                    key: BatchKey::of(&info),
                    landing,
                };
                let payload = records.slice_ref(bytes);
                lp.append(pid, payload, info.span(), answer, Some(hook));
            }
        }
    }
    None
}

/// A Fetch: answered now from the tail cache when it can be, else by the long way (reads off the
/// loop's thread, long polling woken when D moves).
pub(crate) fn fetch(lp: &LoopCtx, c: &Ctx, mut body: Bytes) -> Slot {
    let req: FetchRequest = match decode(c, &mut body) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "closing connection");
            return Slot::Ready(Outcome::Close);
        }
    };
    match fetch::try_now(&lp.broker, c, &req) {
        Some(o) => Slot::Ready(o),
        None => Slot::Future(fetch::fetch(&lp.broker, c, req)),
    }
}
