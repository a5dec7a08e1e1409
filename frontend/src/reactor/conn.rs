//! Connections on a loop: accepted, handed round the loops, and each served by one task that
//! owns its socket. Requests are started in order and answered in order from a FIFO of slots;
//! a Produce slot is completed by the service task as the acks come, and every answer ready in a
//! pass goes out in one write.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use kafka_protocol::messages::ApiKey;
use nvmq_log::{Appended, LogError};
use slab::Slab;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use super::checking::Waiting;
use super::fast::{self, Arrival, ProduceSlot};
use super::limits::{Admission, Charge};
use super::secure::{self, Transport};
use super::service::LoopCtx;
use crate::conn::{self, Outcome, Parsed, Reply};
use crate::sasl;
use crate::session::Session;

/// Input read at once when the buffer is empty; a frame larger than this grows it.
const INPUT_CHUNK: usize = 16 << 10;
/// An empty input or output buffer larger than this is given back.
const BUFFER_KEEP: usize = 256 << 10;
/// How often the loop looks for timed-out requests and idle connections.
const TICK: Duration = Duration::from_millis(100);
/// How long a closing connection may take to write the answers it already has (a client that
/// does not read must not hold up a shutdown).
const CLOSE_FLUSH: Duration = Duration::from_secs(1);

/// A connection of this loop, as tokens name it (slab key and generation, so that a late ack for
/// a closed connection never reaches a new one in the same slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnRef {
    key: usize,
    gen: u64,
}

/// One request's place in its connection's answer order.
pub(crate) enum Slot {
    Ready(Outcome),
    Produce(ProduceSlot),
    Future(Reply),
    /// A Produce waiting for the checks of its batches (or behind one that is): its slot
    /// replaces this one when it starts (`checking::Waiting`).
    Checking,
}

/// What a connection's task and the service task share.
pub(crate) struct ConnState {
    gen: u64,
    /// Each request's slot with the bytes it holds (its frame, and its answer when made at
    /// once); `held` is their sum.
    fifo: VecDeque<(Slot, usize)>,
    held: usize,
    /// Since when answers have waited to be sent without the client taking any.
    unsent_since: Option<Instant>,
    /// Not reading for the byte budget: the tick wakes it to look again.
    byte_wait: bool,
    /// Sequence number of `fifo[0]`.
    base_seq: u64,
    /// The connection's task, to be woken when its head slot completes.
    waker: Option<Waker>,
    woken: bool,
    closing: bool,
    /// Takes no more requests, answers those it holds, then closes (an acks=0 append failed).
    draining: bool,
    last_active: Instant,
}

impl ConnState {
    fn wake(&mut self) {
        self.woken = true;
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

/// The loop's connections.
#[derive(Default)]
pub(crate) struct Conns {
    slab: RefCell<Slab<Rc<RefCell<ConnState>>>>,
    next_gen: Cell<u64>,
    /// Round-robin position of the accepting loop.
    next_loop: Cell<usize>,
}

impl Conns {
    fn insert(&self) -> (ConnRef, Rc<RefCell<ConnState>>) {
        let gen = self.next_gen.get() + 1;
        self.next_gen.set(gen);
        let st = Rc::new(RefCell::new(ConnState {
            gen,
            fifo: VecDeque::new(),
            held: 0,
            unsent_since: None,
            byte_wait: false,
            base_seq: 0,
            waker: None,
            woken: false,
            closing: false,
            draining: false,
            last_active: Instant::now(),
        }));
        let key = self.slab.borrow_mut().insert(st.clone());
        (ConnRef { key, gen }, st)
    }

    fn get(&self, r: ConnRef) -> Option<Rc<RefCell<ConnState>>> {
        self.slab
            .borrow()
            .get(r.key)
            .filter(|c| c.borrow().gen == r.gen)
            .cloned()
    }

    fn remove(&self, r: ConnRef) {
        let mut slab = self.slab.borrow_mut();
        if slab.get(r.key).is_some_and(|c| c.borrow().gen == r.gen) {
            slab.remove(r.key);
        }
    }

    /// An append of a Produce request was answered.
    pub fn complete(
        &self,
        r: ConnRef,
        seq: u64,
        topic: u16,
        part: u16,
        batch: u16,
        result: Result<Appended, LogError>,
    ) {
        let Some(c) = self.get(r) else {
            return; // closed meanwhile: the client retries
        };
        let mut st = c.borrow_mut();
        let Some(i) = seq.checked_sub(st.base_seq) else {
            return; // answered already (timed out)
        };
        let head_done = match st.fifo.get_mut(i as usize) {
            Some((Slot::Produce(p), _)) => {
                p.complete(topic, part, batch, result);
                i == 0 && p.done()
            }
            _ => false,
        };
        if head_done {
            st.wake();
        }
    }

    /// An acks=0 append of the connection failed: it takes no more requests and closes once the
    /// ones it took are answered. Kafka, which handles a connection's requests one at a time,
    /// has answered every earlier one by then; here requests taken before the failure was known
    /// (earlier ones, and later pipelined ones already acted on) still get their answers rather
    /// than a bare disconnect.
    pub fn abort(&self, r: ConnRef) {
        if let Some(c) = self.get(r) {
            let mut st = c.borrow_mut();
            st.draining = true;
            st.wake();
        }
    }

    /// Wakes a connection's task (its budget came back).
    pub fn wake(&self, r: ConnRef) {
        if let Some(c) = self.get(r) {
            c.borrow_mut().wake();
        }
    }

    /// The server stops: every connection closes (what it had acknowledged is durable).
    pub fn close_all(&self) {
        for (_, c) in self.slab.borrow().iter() {
            let mut st = c.borrow_mut();
            st.closing = true;
            st.wake();
        }
    }

    fn each(&self, mut f: impl FnMut(&mut ConnState)) {
        for (_, c) in self.slab.borrow().iter() {
            f(&mut c.borrow_mut());
        }
    }
}

/// Accepts connections (on loop 0) and hands them round the loops that host a device: a
/// connection's appends then reach a writer on its own loop, or cross to one other loop (a loop
/// without a device would send every append across; measured on the 2-core development machine,
/// one device: 52.9k acks/s at 64 producers with every connection on the device's loop against
/// 37.4k dealt over both loops).
pub(crate) async fn accept(ctx: Rc<LoopCtx>, listener: TcpListener) {
    let mut targets: Vec<usize> = ctx.server.device_loop.clone();
    targets.sort_unstable();
    targets.dedup();
    if targets.is_empty() {
        targets.push(0);
    }
    loop {
        if ctx.server.stopping.load(Ordering::SeqCst) {
            return;
        }
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = tokio::time::sleep(TICK) => continue,
        };
        match accepted {
            Ok((stream, _)) => {
                let i = ctx.conns.next_loop.get();
                ctx.conns.next_loop.set(i.wrapping_add(1));
                let target = targets[i % targets.len()];
                if target == ctx.id {
                    spawn(&ctx, stream);
                    continue;
                }
                match stream.into_std() {
                    Ok(s) => ctx.server.bells[target].post_conn(s),
                    Err(e) => tracing::warn!(error = %e, "could not hand a connection over"),
                }
            }
            Err(e) => {
                // Out of descriptors and the like: wait a little rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// A connection another loop accepted for this one.
pub(crate) fn adopt(ctx: &Rc<LoopCtx>, s: std::net::TcpStream) {
    match TcpStream::from_std(s) {
        Ok(stream) => spawn(ctx, stream),
        Err(e) => tracing::warn!(error = %e, "could not take over a connection"),
    }
}

fn spawn(ctx: &Rc<LoopCtx>, stream: TcpStream) {
    if ctx.server.stopping.load(Ordering::SeqCst) {
        return;
    }
    let cfg = &ctx.broker.cfg;
    let peer = stream.peer_addr().ok();
    let admission = match ctx.server.limits.admit(
        peer.map(|p| p.ip()),
        cfg.max_connections,
        cfg.max_connections_per_ip,
    ) {
        Ok(a) => a,
        Err(why) => {
            // Closed at once, as Kafka does; logged now and then, counted always.
            if ctx.server.limits.warn_now() {
                tracing::warn!(?peer, %why, refused = ctx.server.limits.refused(), "refusing connections");
            }
            return;
        }
    };
    let _ = stream.set_nodelay(true);
    let ctx = ctx.clone();
    match ctx.server.opts.tls.clone() {
        None => {
            tokio::task::spawn_local(async move {
                let session = Session::offloading(peer, Some(ctx.server.checker.offload()));
                run(&ctx, stream, peer, session, admission).await;
            });
        }
        // The handshake runs in the connection's task, bounded, and holds its admission (its
        // place under the connection limits) meanwhile.
        Some(tls) => {
            tokio::task::spawn_local(async move {
                let Some((stream, session)) =
                    secure::handshake(&tls, stream, peer, ctx.server.checker.offload()).await
                else {
                    return;
                };
                if !ctx.server.stopping.load(Ordering::SeqCst) {
                    run(&ctx, stream, peer, session, admission).await;
                }
            });
        }
    }
}

/// Serves a connection as one of the loop's.
async fn run<S: Transport>(
    ctx: &Rc<LoopCtx>,
    stream: S,
    peer: Option<SocketAddr>,
    session: Arc<Session>,
    admission: Admission,
) {
    let (r, st) = ctx.conns.insert();
    serve(ctx, r, &st, stream, peer, session, admission).await;
    // Answers still owed are dropped: their appends complete, unrouted.
    ctx.conns.remove(r);
}

/// The loop's clock work: request timeouts at the head of each connection, idle connections.
pub(crate) async fn tick(ctx: Rc<LoopCtx>) {
    let mut every = tokio::time::interval(TICK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if ctx.server.stopping.load(Ordering::SeqCst) {
            return;
        }
        let now = Instant::now();
        let idle = ctx.broker.cfg.idle_timeout;
        let write_timeout = ctx.broker.cfg.write_timeout;
        ctx.conns.each(|st| {
            if st.byte_wait {
                st.byte_wait = false;
                st.wake();
            }
            if st
                .unsent_since
                .is_some_and(|t| now.duration_since(t) >= write_timeout)
            {
                tracing::info!("closing a connection whose client does not read its answers");
                st.closing = true;
                st.wake();
            }
            if let Some((Slot::Produce(p), _)) = st.fifo.front_mut() {
                if p.expire(now) {
                    st.wake();
                }
            }
            if st.fifo.is_empty() && now.duration_since(st.last_active) >= idle {
                tracing::info!("closing an idle connection");
                st.closing = true;
                st.wake();
            }
        });
    }
}

/// What woke a connection's task.
enum Event {
    /// Bytes arrived (0: the client closed its side), or reading failed.
    Input(std::io::Result<usize>),
    /// The head answer is ready, an append was answered, budget came back, or it must close.
    Woken,
    /// Output went out (or failed).
    Wrote(std::io::Result<usize>),
    /// What the stream buffered of it went out too (TLS).
    Flushed(std::io::Result<()>),
}

/// One connection: read and start requests, answer in order, one write per pass.
async fn serve<S: Transport>(
    ctx: &Rc<LoopCtx>,
    r: ConnRef,
    st: &Rc<RefCell<ConnState>>,
    mut stream: S,
    peer: Option<SocketAddr>,
    session: Arc<Session>,
    _admission: Admission,
) {
    let cfg = &ctx.broker.cfg;
    let max_in_flight = cfg.max_in_flight_per_connection.max(1);
    let max_frame = cfg.max_frame;
    let sasl_required = cfg.sasl.required();
    let limits = ctx.server.limits.clone();
    let mut charge = Charge::new(limits.clone());
    // Whether this connection may start requests (whose answers will take memory) or read
    // more. Its own bytes, counting what it has read of the next frame, stay under its budget,
    // unless it holds no requests and no answers: then it may always finish reading and start
    // the frame it is in (a frame up to max_frame comes in whole; a stall of everyone holding
    // only partial frames could never end), and may begin a new frame while all connections
    // together hold less than twice their budget. A connection that holds something needs the
    // global figure under the budget (so that clients which do not read, holding the budget
    // until the write timeout closes them, do not stall everyone else).
    let room = |st: &ConnState, unsent: usize, input: usize| {
        let answers = st.held + unsent;
        let queued = limits.queued();
        if answers == 0 {
            return input > 0 || queued / 2 < cfg.max_queued_bytes;
        }
        answers + input < cfg.max_connection_bytes && queued < cfg.max_queued_bytes
    };
    let mut input = BytesMut::with_capacity(INPUT_CHUNK);
    let mut out: Vec<u8> = Vec::new();
    let mut sent = 0usize;
    // Written into the stream's own buffer (TLS records) and not yet flushed to the socket.
    let mut unflushed = false;
    let mut eof = false;
    let mut next_seq = 0u64;
    // Produce requests waiting for their checks, and the charges their checks gave back (dropped
    // once this connection counts those bytes again).
    let mut checking = Waiting::default();
    let mut released: Vec<Charge> = Vec::new();
    loop {
        // The requests whose checks are done start first, in order. One that closes the
        // connection (a failed acks=0 produce) is the last one taken, as below.
        checking.resume(ctx, r, &mut released, |seq, slot| {
            if matches!(slot, Slot::Ready(Outcome::Close | Outcome::Last(_))) {
                eof = true;
            }
            let mut s = st.borrow_mut();
            let at = seq
                .checked_sub(s.base_seq)
                .and_then(|i| usize::try_from(i).ok());
            if let Some((waiting, _)) = at.and_then(|i| s.fifo.get_mut(i)) {
                *waiting = slot;
            }
        });
        // A draining connection (an acks=0 append failed) is at its end: it takes nothing more
        // and closes once what it holds is answered.
        eof |= st.borrow().draining;
        // Start every whole request that arrived, in order.
        let mut waiting_budget = false;
        while !eof
            && !checking.holds_back()
            && st.borrow().fifo.len() < max_in_flight
            && room(&st.borrow(), out.len() - sent, input.len())
        {
            let at_budget = !ctx.budget_left();
            if at_budget && input.len() >= 6 && api_of(&input) == Some(ApiKey::Produce) {
                waiting_budget = true;
                break;
            }
            // After a SaslHandshake v0 the client's tokens come bare (`sasl::raw`).
            let raw = sasl_required && !session.admitted() && sasl::raw::expected(&session);
            let next = match raw {
                true => sasl::raw::next_token(&mut input, max_frame),
                false => conn::next_frame(&mut input, max_frame),
            };
            let frame = match next {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(?peer, error = %e, "closing connection");
                    eof = true;
                    break;
                }
            };
            let size = frame.len();
            let parsed = match raw {
                true => Ok(sasl::raw::answer(&ctx.broker, &session, &frame)),
                false => conn::parse(frame, &session).and_then(|p| conn::admit(p, sasl_required)),
            };
            let slot = match parsed {
                Ok(Parsed::Answered(reply)) => Some(Slot::Future(reply)),
                Ok(Parsed::Request(c, body)) => match c.api {
                    // A cluster node's Produce goes through the group and its Fetch asks who
                    // leads: the general path (`replica`), not the loop's own.
                    ApiKey::Produce | ApiKey::Fetch if ctx.broker.replica().is_some() => {
                        match conn::dispatch(&ctx.broker, &c, body).await {
                            Ok(reply) => Some(Slot::Future(reply)),
                            Err(e) => {
                                tracing::warn!(?peer, error = %e, "closing connection");
                                eof = true;
                                None
                            }
                        }
                    }
                    ApiKey::Produce => {
                        let behind = !checking.is_empty();
                        match fast::produce(ctx, r, next_seq, &c, body, behind) {
                            Arrival::Now(slot) => slot,
                            Arrival::Later(p, groups) => {
                                checking.push(ctx, next_seq, size, p, groups);
                                Some(Slot::Checking)
                            }
                        }
                    }
                    ApiKey::Fetch => Some(fast::fetch(ctx, &c, body)),
                    _ => match conn::dispatch(&ctx.broker, &c, body).await {
                        Ok(reply) => Some(Slot::Future(reply)),
                        Err(e) => {
                            tracing::warn!(?peer, error = %e, "closing connection");
                            eof = true;
                            None
                        }
                    },
                },
                Err(e) => {
                    tracing::warn!(?peer, error = %e, "closing connection");
                    eof = true;
                    None
                }
            };
            if let Some(slot) = slot {
                // A request that closes the connection is the last one taken: Kafka handles a
                // connection's requests one at a time, so nothing after it is acted on.
                if matches!(slot, Slot::Ready(Outcome::Close | Outcome::Last(_))) {
                    eof = true;
                }
                // An answer made at once (a Fetch with data at hand) is held until its turn:
                // it counts too.
                let size = match &slot {
                    Slot::Ready(Outcome::Send(b)) => size + b.len(),
                    _ => size,
                };
                let mut s = st.borrow_mut();
                s.fifo.push_back((slot, size));
                s.held += size;
                next_seq += 1;
            }
        }
        if waiting_budget {
            ctx.budget_waiters.borrow_mut().push(r);
        }
        // Answers ready at the head go into the output, in order.
        let close = drain(st, &mut out);
        if close {
            flush_before_close(&mut stream, &out[sent..]).await;
            return;
        }
        if sent == out.len() && !out.is_empty() {
            out.clear();
            sent = 0;
            if out.capacity() > BUFFER_KEEP {
                out = Vec::new();
            }
        }
        let (closing, done) = {
            let s = st.borrow();
            (s.closing, eof && s.fifo.is_empty())
        };
        if closing {
            // The answers already made go out first: after a writer stopped, they are the errors
            // that tell producers their appends failed (rather than a bare disconnect).
            flush_before_close(&mut stream, &out[sent..]).await;
            return;
        }
        if done && sent == out.len() {
            return;
        }
        if input.is_empty() && input.capacity() > BUFFER_KEEP {
            input = BytesMut::with_capacity(INPUT_CHUNK);
        }
        let unsent = out.len() - sent;
        // Once per pass, not per request: the count is shared by every loop (one atomic update
        // per pass), and a pass adds at most what its input held to the global figure. The
        // frames of requests in the check pool are counted by their jobs.
        charge.set((st.borrow().held + unsent + input.len()).saturating_sub(checking.pooled()));
        released.clear();
        let has_room = {
            let mut s = st.borrow_mut();
            s.unsent_since = match (unsent, s.unsent_since) {
                (0, _) => None,
                (_, Some(t)) => Some(t),
                (_, None) => Some(Instant::now()),
            };
            let room = room(&s, unsent, input.len());
            s.byte_wait = !room;
            room
        };
        // A request not answered at once (a Fetch that reads the device, a long poll, an admin
        // request) cost only its frame to start: its answer is made when the head slot's future
        // is polled. So that answers held for a client that does not read stay bounded, it is
        // polled only while the answers not yet sent stay under the connection's budget (and,
        // with any unsent, the global figure under its budget); the client taking its answers
        // (a write event) or the tick makes it look again.
        let answering = unsent == 0
            || (unsent < cfg.max_connection_bytes && limits.queued() < cfg.max_queued_bytes);
        st.borrow_mut().byte_wait |= !answering;
        let reading = !eof
            && !waiting_budget
            && !checking.holds_back()
            && has_room
            && st.borrow().fifo.len() < max_in_flight;
        if reading && input.capacity() - input.len() < INPUT_CHUNK / 4 {
            // Grow with the bytes seen, not with the length a frame claims: a client that
            // announces 64 MiB and sends nothing gets no 64 MiB buffer.
            let want = pending_frame_len(&input)
                .unwrap_or(0)
                .saturating_sub(input.len())
                .min(input.len().max(INPUT_CHUNK));
            input.reserve(want.max(INPUT_CHUNK));
        }
        let event = std::future::poll_fn(|cx| {
            if checking.poll(cx) {
                return Poll::Ready(Event::Woken);
            }
            let wants = Wants {
                read: reading,
                answer: answering,
                flush: S::BUFFERS && unflushed,
            };
            poll_event(cx, st, &mut stream, &mut input, &out, sent, wants)
        })
        .await;
        match event {
            Event::Input(Ok(0)) | Event::Input(Err(_)) => eof = true,
            Event::Input(Ok(_)) => st.borrow_mut().last_active = Instant::now(),
            Event::Woken => {}
            Event::Wrote(Ok(n)) => {
                sent += n;
                unflushed = S::BUFFERS;
                if n > 0 {
                    // The client reads: the write timeout starts over.
                    st.borrow_mut().unsent_since = Some(Instant::now());
                }
            }
            Event::Flushed(Ok(())) => unflushed = false,
            Event::Wrote(Err(e)) | Event::Flushed(Err(e)) => {
                tracing::debug!(?peer, error = %e, "write failed; closing");
                return;
            }
        }
    }
}

/// Sends the answers owed to requests ahead of the one that closes the connection (briefly: a
/// client that does not read loses them), then half-closes it so they arrive before the end.
async fn flush_before_close<S: Transport>(stream: &mut S, rest: &[u8]) {
    let _ = tokio::time::timeout(CLOSE_FLUSH, async {
        if !rest.is_empty() {
            stream.write_all(rest).await?;
        }
        stream.shutdown().await
    })
    .await;
}

/// The API key of the frame at the start of `input`, if its header is there.
fn api_of(input: &[u8]) -> Option<ApiKey> {
    let k = i16::from_be_bytes([*input.get(4)?, *input.get(5)?]);
    ApiKey::try_from(k).ok()
}

/// Bytes of the frame at the start of `input`, length prefix included, when the prefix is there
/// (bounded later by `next_frame`).
fn pending_frame_len(input: &[u8]) -> Option<usize> {
    let l = i32::from_be_bytes([
        *input.first()?,
        *input.get(1)?,
        *input.get(2)?,
        *input.get(3)?,
    ]);
    usize::try_from(l)
        .ok()
        .map(|l| l.saturating_add(4).min(64 << 20))
}

/// Moves the answers ready at the head of the FIFO into `out`; true when the connection must
/// close (an answer could not be encoded).
fn drain(st: &Rc<RefCell<ConnState>>, out: &mut Vec<u8>) -> bool {
    let mut s = st.borrow_mut();
    loop {
        let ready = match s.fifo.front_mut() {
            None => return false,
            Some((Slot::Ready(_), _)) => true,
            Some((Slot::Produce(p), _)) => p.done(),
            Some((Slot::Future(_), _)) | Some((Slot::Checking, _)) => false,
        };
        if !ready {
            return false;
        }
        let Some((slot, size)) = s.fifo.pop_front() else {
            return false;
        };
        s.held -= size;
        s.base_seq += 1;
        match slot {
            Slot::Ready(Outcome::Send(b)) => out.extend_from_slice(&b),
            Slot::Ready(Outcome::Nothing) => {}
            Slot::Ready(Outcome::Close) => return true,
            Slot::Ready(Outcome::Last(b)) => {
                out.extend_from_slice(&b);
                return true;
            }
            Slot::Produce(p) => {
                if !p.encode_into(out) {
                    return true;
                }
            }
            Slot::Future(_) | Slot::Checking => {}
        }
    }
}

/// Polls what the head slot waits for by itself (its answer's future, when `answering`, or the
/// original of a duplicate batch); true when that moved.
fn poll_head(front: &mut Slot, cx: &mut Context<'_>, answering: bool) -> bool {
    match front {
        Slot::Future(_) if !answering => false,
        Slot::Future(f) => match f.as_mut().poll(cx) {
            Poll::Ready(o) => {
                *front = Slot::Ready(o);
                true
            }
            Poll::Pending => false,
        },
        Slot::Produce(p) => p.poll_landings(cx),
        Slot::Ready(_) | Slot::Checking => false,
    }
}

/// What a connection waits for besides output progress and wakes.
#[derive(Clone, Copy)]
struct Wants {
    /// More input (it has room to start requests).
    read: bool,
    /// The head slot's answer, from its future (its unsent answers leave room for one more).
    answer: bool,
    /// The stream's own buffer to be flushed once everything is written to it.
    flush: bool,
}

/// Waits for input, output progress, or a wake from the service task or the head answer.
fn poll_event<S: Transport>(
    cx: &mut Context<'_>,
    st: &Rc<RefCell<ConnState>>,
    stream: &mut S,
    input: &mut BytesMut,
    out: &[u8],
    sent: usize,
    wants: Wants,
) -> Poll<Event> {
    {
        let mut s = st.borrow_mut();
        if s.woken || s.closing {
            s.woken = false;
            return Poll::Ready(Event::Woken);
        }
        if let Some((front, _)) = s.fifo.front_mut() {
            if poll_head(front, cx, wants.answer) {
                return Poll::Ready(Event::Woken);
            }
        }
        match &s.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => s.waker = Some(cx.waker().clone()),
        }
    }
    if sent < out.len() {
        if let Poll::Ready(r) = Pin::new(&mut *stream).poll_write(cx, &out[sent..]) {
            return Poll::Ready(Event::Wrote(r));
        }
    } else if wants.flush {
        if let Poll::Ready(r) = Pin::new(&mut *stream).poll_flush(cx) {
            return Poll::Ready(Event::Flushed(r));
        }
    }
    if wants.read {
        if let Poll::Ready(r) = tokio_util::io::poll_read_buf(Pin::new(&mut *stream), cx, input) {
            return Poll::Ready(Event::Input(r));
        }
    }
    Poll::Pending
}
