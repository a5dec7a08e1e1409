//! The loop's fast path: Produce without a task, a future or a channel per request, and Fetch
//! answered from the tail cache when it can be.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{FetchRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use nvmq_log::{Appended, LogError};
use uuid::Uuid;

use super::checker::Group;
use super::checking::{self, Batches, Prepared};
use super::conn::{ConnRef, Slot};
use super::service::{Answer, LoopCtx, ProducerHook};
use crate::batch::BatchFault;
use crate::conn::{decode, Ctx, Outcome};
use crate::part::PartRef;
use crate::produce::log_error_code;
use crate::producers::{BatchKey, Verdict};
use crate::{codes, fetch};

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
    /// Each topic's name and id, and its partitions' answers.
    topics: Vec<(TopicName, Uuid, Vec<PartAnswer>)>,
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
            .and_then(|(_, _, ps)| ps.get_mut(part as usize))
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
        for (_, _, parts) in &mut self.topics {
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
        for (name, id, parts) in self.topics {
            let mut tr = TopicProduceResponse::default();
            // The codec writes the one the version has: the name to v12, the id from v13.
            tr.name = name;
            tr.topic_id = id;
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

/// What became of a Produce as it arrived.
pub(crate) enum Arrival {
    /// Started (or refused) at once: its slot, None when nothing is answered (acks=0).
    Now(Option<Slot>),
    /// Waiting for checks off the loop, or behind a request of its connection that is: queue
    /// it (`checking::Waiting`).
    Later(Prepared, Vec<Group>),
}

/// A Produce arrives: its batches are checked (on the loop where that is cheap) and, unless some
/// checks go to the pool or `behind` (its connection has requests waiting for theirs), started.
pub(crate) fn produce(
    lp: &LoopCtx,
    conn: ConnRef,
    seq: u64,
    c: &Ctx,
    body: Bytes,
    behind: bool,
) -> Arrival {
    match checking::prepare(lp, c, body) {
        Err(slot) => Arrival::Now(Some(slot)),
        Ok((p, groups)) if groups.is_empty() && !behind => {
            Arrival::Now(start(lp, conn, seq, p, &[]))
        }
        Ok((p, groups)) => Arrival::Later(p, groups),
    }
}

/// Starts a checked Produce (`faults`: what the pool found, per group): queues each partition's
/// batches for its writer with a token that routes its ack back to this request. None when
/// nothing is answered (acks=0).
pub(crate) fn start(
    lp: &LoopCtx,
    conn: ConnRef,
    seq: u64,
    p: Prepared,
    faults: &[Option<BatchFault>],
) -> Option<Slot> {
    let b = &lp.broker;
    let acks = p.acks;
    let mut refused_any = false;
    let mut slot = ProduceSlot {
        ctx: p.ctx,
        topics: Vec::with_capacity(p.topics.len()),
        waiting: 0,
        deadline: p.deadline,
        landings: Vec::new(),
    };
    for (ti, (name, id, parts)) in p.topics.into_iter().enumerate() {
        let mut answers = Vec::with_capacity(parts.len());
        for (pi, part) in parts.into_iter().enumerate() {
            let mut pa = PartAnswer {
                index: part.index,
                code: codes::NONE,
                message: None,
                base: -1,
                log_start: -1,
                waiting: 0,
            };
            let refused = match checking::outcome(part.state, faults) {
                Err(refused) => Some(refused),
                Ok((pid, batches)) => {
                    pa.log_start = b.bounds(pid).map_or(-1, |(s, _)| s as i64);
                    let at = Place {
                        conn,
                        seq,
                        topic: ti as u16,
                        part: pi as u16,
                        answered: acks != 0,
                    };
                    start_partition(lp, pid, batches, at, &mut pa, &mut slot)
                }
            };
            if let Some((code, what)) = refused {
                tracing::debug!(topic = name.as_str(), partition = part.index, code, %what, "produce refused");
                refused_any = true;
                pa.code = code;
                pa.message = Some(what);
            }
            answers.push(pa);
        }
        slot.topics.push((name, id, answers));
    }
    if acks == 0 {
        // No answer goes back, so a failure can only be told by closing the connection, as
        // Kafka does; what the request had queued still lands. (An append the device fails
        // later closes it too: `Answer::Silent`.)
        if refused_any {
            tracing::info!(
                client = %p.client_id,
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

/// Queues a partition's checked batches in order; an error when one is refused (those before
/// it are queued and still land, as Kafka's own partial appends do not exist: the client retries
/// the partition, and idempotence answers the retry of the stored ones).
fn start_partition(
    lp: &LoopCtx,
    pid: PartRef,
    batches: Batches,
    at: Place,
    pa: &mut PartAnswer,
    slot: &mut ProduceSlot,
) -> Option<(i16, String)> {
    let b = &lp.broker;
    if b.cfg.ceiling {
        // Checked like any batch, answered without the log: the bench's ceiling.
        pa.base = 0;
        return None;
    }
    if let Some(refused) = crate::produce::oversized(&batches, b.batch_limit(pid)) {
        return Some(refused);
    }
    for (i, (info, payload)) in batches.into_iter().enumerate() {
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
