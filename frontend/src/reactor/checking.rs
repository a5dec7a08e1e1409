//! A Produce on its way in: decoded, its batches' headers checked, their records checked on the
//! loop where that is cheap (`records::check_inline`) and handed to the check pool where it is
//! not (`checker`). A request with batches in the pool, and every Produce of the same connection
//! after it, waits in that connection's `Waiting` queue and is started (sequenced and appended)
//! in request order once the checks ahead of it came back: answers and appends keep the order
//! of the connection's requests, and the loop serves every other connection meanwhile.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::{ProduceRequest, TopicName};
use tokio::sync::oneshot;
use uuid::Uuid;

use super::checker::{Checked, Group, Job};
use super::conn::{ConnRef, Slot};
use super::limits::Charge;
use super::service::LoopCtx;
use crate::batch::{self, BatchFault, BatchInfo};
use crate::codes;
use crate::conn::{Ctx, Outcome};
use crate::part::PartRef;
use crate::produce::TopicGate;
use crate::records::{self, Checks};

/// A Produce request checked as far as the loop checks it.
pub(crate) struct Prepared {
    pub ctx: Ctx,
    pub client_id: String,
    pub acks: i16,
    pub deadline: Option<Instant>,
    pub checks: Checks,
    /// Each topic's name and id (the answer names it by the one its version has).
    pub topics: Vec<(TopicName, Uuid, Vec<PartPrep>)>,
}

/// One partition of a prepared Produce.
pub(crate) struct PartPrep {
    pub index: i32,
    pub state: PartState,
}

pub(crate) enum PartState {
    /// Refused before its batches were looked at (unknown topic id or partition, ACLs,
    /// transactions, acks).
    Refused(i16, String),
    Batches {
        pid: PartRef,
        /// The batches whose headers passed, in order.
        batches: Batches,
        /// Which group of the request's pool job holds those not checked yet.
        group: Option<usize>,
        /// The first batch refused after them (its header or, checked on the loop, its
        /// records), or why there was none.
        fault: Option<BatchFault>,
    },
}

/// A partition's batches, checked, as views of the request.
pub(crate) type Batches = Vec<(BatchInfo, Bytes)>;

/// Why a partition's batches cannot be stored, from its state and the faults the pool found
/// (`None` in `faults`: the group passed; missing: it was never checked).
pub(crate) fn outcome(
    state: PartState,
    faults: &[Option<BatchFault>],
) -> Result<(PartRef, Batches), (i16, String)> {
    let (pid, batches, group, fault) = match state {
        PartState::Refused(code, what) => return Err((code, what)),
        PartState::Batches {
            pid,
            batches,
            group,
            fault,
        } => (pid, batches, group, fault),
    };
    // The pool's batches all come before `fault`: a fault among them is the first.
    if let Some(g) = group {
        match faults.get(g) {
            Some(None) => {}
            Some(Some(f)) => return Err((f.code, f.what.clone())),
            None => {
                return Err((
                    codes::UNKNOWN_SERVER_ERROR,
                    "the check of a batch did not finish".into(),
                ))
            }
        }
    }
    match fault {
        Some(f) => Err((f.code, f.what)),
        None => Ok((pid, batches)),
    }
}

/// Decodes a Produce and checks what the loop checks itself; the batches left for the pool, one
/// group per partition. Err: the slot that answers it (a body that does not decode closes the
/// connection).
pub(crate) fn prepare(lp: &LoopCtx, c: &Ctx, body: Bytes) -> Result<(Prepared, Vec<Group>), Slot> {
    let req: ProduceRequest = match crate::produce::decode_request(c, body) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "closing connection");
            return Err(Slot::Ready(Outcome::Close));
        }
    };
    let b = &lp.broker;
    let acks = req.acks;
    let refused = crate::produce::request_refusal(&req);
    let checks = crate::produce::checks(&b.cfg, c.version);
    let mut groups = Vec::new();
    let mut topics = Vec::with_capacity(req.topic_data.len());
    for mut t in req.topic_data {
        let gate = TopicGate::decide(b, c, refused.as_ref(), &mut t);
        let mut parts = Vec::with_capacity(t.partition_data.len());
        for (i, p) in t.partition_data.into_iter().enumerate() {
            let state = match gate.partition(i, t.name.as_str(), p.index) {
                Err((code, what)) => PartState::Refused(code, what),
                Ok(pid) => {
                    let records = p.records.unwrap_or_default();
                    check_partition(pid, &records, &checks, &mut groups)
                }
            };
            parts.push(PartPrep {
                index: p.index,
                state,
            });
        }
        topics.push((t.name, t.topic_id, parts));
    }
    let prepared = Prepared {
        ctx: Ctx {
            api: c.api,
            version: c.version,
            correlation_id: c.correlation_id,
            client_id: String::new(),
            session: c.session.clone(),
        },
        client_id: c.client_id.clone(),
        acks,
        deadline: u64::try_from(req.timeout_ms)
            .ok()
            .filter(|&t| t > 0)
            .map(|t| Instant::now() + Duration::from_millis(t)),
        checks,
        topics,
    };
    Ok((prepared, groups))
}

/// A partition's batches: headers checked, records checked here when cheap, the others added to
/// `groups` as one group. Stops at the first batch refused, as the rest cannot matter.
fn check_partition(
    pid: PartRef,
    records: &Bytes,
    checks: &Checks,
    groups: &mut Vec<Group>,
) -> PartState {
    let (frames, mut fault) = batch::frames(records);
    let mut batches = Vec::with_capacity(frames.len());
    let mut pooled: Group = Vec::new();
    for (info, one) in frames {
        match records::check_inline(one, &info, checks) {
            Some(Ok(())) => {}
            Some(Err(f)) => {
                fault = Some(f);
                break;
            }
            None => pooled.push((info, records.slice_ref(one))),
        }
        batches.push((info, records.slice_ref(one)));
    }
    let group = (!pooled.is_empty()).then(|| {
        groups.push(pooled);
        groups.len() - 1
    });
    PartState::Batches {
        pid,
        batches,
        group,
        fault,
    }
}

/// Where a waiting request's check stands.
enum State {
    /// Nothing in the pool: it waits only for those ahead of it.
    Behind,
    Pending(oneshot::Receiver<Checked>),
    /// The pool answered (Err: it dropped the job unanswered).
    Answered(Result<Checked, ()>),
}

struct Entry {
    seq: u64,
    /// Bytes of its frame, counted by its pool job while `Pending`.
    size: usize,
    prepared: Prepared,
    state: State,
}

/// A connection's Produce requests waiting for their checks, oldest first.
#[derive(Default)]
pub(crate) struct Waiting {
    queue: VecDeque<Entry>,
    /// Bytes of the requests whose pool job counts them (the connection does not, meanwhile).
    pooled: usize,
    /// acks=0 requests among them.
    silent: usize,
}

impl Waiting {
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn pooled(&self) -> usize {
        self.pooled
    }

    /// An acks=0 Produce is waiting: nothing after it may start, as it may close the connection
    /// (Kafka handles a connection's requests one at a time).
    pub fn holds_back(&self) -> bool {
        self.silent > 0
    }

    /// Queues request `seq` (its frame `size` bytes), handing `groups` to the pool with the
    /// frame's bytes counted by the job.
    pub fn push(&mut self, lp: &LoopCtx, seq: u64, size: usize, p: Prepared, groups: Vec<Group>) {
        let state = if groups.is_empty() {
            State::Behind
        } else {
            let (tx, rx) = oneshot::channel();
            let mut charge = Charge::new(lp.server.limits.clone());
            charge.set(size);
            lp.server.checker.submit(Job {
                groups,
                checks: p.checks,
                charge,
                reply: tx,
            });
            self.pooled += size;
            State::Pending(rx)
        };
        if p.acks == 0 {
            self.silent += 1;
        }
        self.queue.push_back(Entry {
            seq,
            size,
            prepared: p,
            state,
        });
    }

    /// Polls the oldest request's check; true when it can be started.
    pub fn poll(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(e) = self.queue.front_mut() else {
            return false;
        };
        let State::Pending(rx) = &mut e.state else {
            return true;
        };
        match Pin::new(rx).poll(cx) {
            Poll::Ready(r) => {
                e.state = State::Answered(r.map_err(|_| ()));
                true
            }
            Poll::Pending => false,
        }
    }

    /// Starts, in order, every request whose check is done and has none ahead of it, and hands
    /// each one's slot to `place` (with its sequence number). The charges the pool gave back go
    /// to `released`, to be dropped once the connection counts those bytes again.
    pub fn resume(
        &mut self,
        lp: &LoopCtx,
        conn: ConnRef,
        released: &mut Vec<Charge>,
        mut place: impl FnMut(u64, Slot),
    ) {
        while let Some(e) = self.queue.front_mut() {
            if let State::Pending(rx) = &mut e.state {
                match rx.try_recv() {
                    Ok(c) => e.state = State::Answered(Ok(c)),
                    Err(oneshot::error::TryRecvError::Empty) => return,
                    Err(oneshot::error::TryRecvError::Closed) => e.state = State::Answered(Err(())),
                }
            }
            let Some(e) = self.queue.pop_front() else {
                return;
            };
            if e.prepared.acks == 0 {
                self.silent -= 1;
            }
            let faults = match e.state {
                State::Answered(Ok(c)) => {
                    self.pooled -= e.size;
                    released.push(c.charge);
                    c.faults
                }
                State::Answered(Err(())) => {
                    self.pooled -= e.size;
                    Vec::new()
                }
                State::Behind | State::Pending(_) => Vec::new(),
            };
            let slot = super::fast::start(lp, conn, e.seq, e.prepared, &faults);
            place(e.seq, slot.unwrap_or(Slot::Ready(Outcome::Nothing)));
        }
    }
}
