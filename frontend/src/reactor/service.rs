//! One loop: its runtime, its shared context, and its service task, which turns the writers the
//! loop hosts, routes their acks, and carries messages to and from the other loops.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use blockdev::BlockDevice;
use bytes::Bytes;
use crossbeam::channel::Receiver;
use nvmq_log::{Appended, Hosted, LogError, TokenAck, Turn};
use slab::Slab;
use tokio::sync::Notify;

use super::bell::{AckMsg, AppendMsg, Inbox, LoopBell};
use super::conn::{self, ConnRef, Conns};
use super::driver::{Driver, HostedDriver};
use super::ServerShared;
use crate::broker::Broker;
use crate::part::PartRef;
use crate::producers::{BatchKey, LandingTx};

/// Handed to every loop once the broker is open.
pub(crate) struct Start {
    pub broker: Arc<Broker>,
    /// The listener, for the loop that accepts (loop 0).
    pub listener: Option<std::net::TcpListener>,
}

/// A hosted writer of any device type, to be made a driver on its loop's runtime.
pub(crate) trait Hostable: Send {
    fn into_driver(self: Box<Self>) -> Box<dyn Driver>;
}

impl<D: BlockDevice + 'static> Hostable for Hosted<D> {
    fn into_driver(self: Box<Self>) -> Box<dyn Driver> {
        Box::new(HostedDriver::new(*self))
    }
}

/// The idempotent producers' hook of an append to a data partition: run by the loop owning the
/// device when the append is answered, in log order.
pub(crate) struct ProducerHook {
    pub partition: PartRef,
    pub span: u32,
    pub key: Option<BatchKey>,
    pub landing: Option<LandingTx>,
}

/// Where the answer to an append goes.
pub(crate) enum Answer {
    /// A part of a Produce request in a connection of this loop.
    Conn {
        conn: ConnRef,
        seq: u64,
        topic: u16,
        part: u16,
        batch: u16,
    },
    /// Back to the loop that sent it.
    Remote { origin: usize, token: u64 },
    /// Nobody waits (acks=0): only the budget is given back, and a failed append closes the
    /// connection that sent it (its only way to learn of the failure, as in Kafka).
    Silent { conn: ConnRef },
}

/// A token's route.
pub(crate) struct Route {
    pub answer: Answer,
    pub producer: Option<ProducerHook>,
    /// Payload bytes counted against this loop's budget (0 when counted by another loop).
    pub bytes: usize,
}

/// A loop's state, shared by its tasks (never by another thread).
pub(crate) struct LoopCtx {
    pub id: usize,
    pub broker: Arc<Broker>,
    pub server: Arc<ServerShared>,
    pub bell: Arc<LoopBell>,
    /// (device, its writer) for the devices this loop hosts.
    pub drivers: RefCell<Vec<(usize, Box<dyn Driver>)>>,
    pub routes: RefCell<Slab<Route>>,
    pub conns: Conns,
    /// Connections rang it: appends are waiting for a writer of this loop.
    pub kick: Notify,
    /// Messages for other loops, sent at the end of the service's pass.
    pub outbox: RefCell<Vec<(Vec<AppendMsg>, Vec<AckMsg>)>>,
    /// Payload bytes of this loop's appends not yet answered, and the connections that wait
    /// for the budget to go down.
    pub budget_used: Cell<usize>,
    pub budget_waiters: RefCell<Vec<ConnRef>>,
    /// The durable positions last seen, to tell long-polling fetches when one moved.
    durable_seen: RefCell<Vec<u64>>,
    /// Appends for a device whose writer is gone, answered with its error in the service's next
    /// pass (not at once: the request's slot is not in its connection's FIFO yet).
    refused: RefCell<Vec<TokenAck>>,
}

impl LoopCtx {
    /// Queues an append of this loop's connection: straight into the writer when this loop
    /// hosts the device, else to the loop that does.
    pub fn append(
        &self,
        part: PartRef,
        payload: Bytes,
        span: u32,
        answer: Answer,
        producer: Option<ProducerHook>,
    ) {
        let (device, partition) = (part.device(), part.id);
        let bytes = payload.len();
        self.budget_used.set(self.budget_used.get() + bytes);
        // Counted before `stopping` is read, both sequentially consistent, while
        // `Server::shutdown` sets `stopping` before it reads the count: either this append sees
        // the stop and is refused, or the shutdown waits for it. None lands after the final
        // producer snapshot (a request whose checks were still running when the count was read
        // would otherwise be appended after it, and replayed at the next start).
        self.server.outstanding.fetch_add(1, Ordering::SeqCst);
        let stopping = self.server.stopping.load(Ordering::SeqCst);
        let owner = self.server.device_loop.get(device).copied().unwrap_or(0);
        if owner == self.id || stopping {
            let token = self.routes.borrow_mut().insert(Route {
                answer,
                producer,
                bytes,
            }) as u64;
            if stopping {
                self.refuse(device, token);
                self.kick.notify_one();
                return;
            }
            // An idle device gets the append at once (a lone producer waits for no pass); one
            // already busy collects appends for its next batch, group commit as usual. The acks
            // such a turn produces wait for the service's pass (the request's slot is not in its
            // connection's FIFO yet).
            let hosted = self.drive(device, |d| {
                d.append(partition, payload, span, token);
                if d.quiet() {
                    d.turn();
                }
            });
            if !hosted {
                self.refuse(device, token);
            }
            self.kick.notify_one();
            return;
        }
        let token = self.routes.borrow_mut().insert(Route {
            answer,
            producer: None,
            bytes,
        }) as u64;
        let (key, landing) = match producer {
            Some(p) => (p.key, p.landing),
            None => (None, None),
        };
        self.outbox.borrow_mut()[owner].0.push(AppendMsg {
            device,
            partition,
            payload,
            span,
            key,
            landing,
            origin: self.id,
            token,
        });
        self.kick.notify_one();
    }

    /// Runs `f` on the writer of `device`; false when this loop no longer hosts it (its writer
    /// stopped and was dropped).
    fn drive(&self, device: usize, f: impl FnOnce(&mut dyn Driver)) -> bool {
        let mut drivers = self.drivers.borrow_mut();
        match drivers.iter_mut().find(|(d, _)| *d == device) {
            Some((_, drv)) => {
                f(drv.as_mut());
                true
            }
            None => false,
        }
    }

    /// Answers an append whose device has no writer any more with the writer's own error (a
    /// Produce gets KAFKA_STORAGE_ERROR at once instead of waiting for its timeout).
    fn refuse(&self, device: usize, token: u64) {
        let fatal = self.broker.logs().get(device).and_then(|l| l.fatal());
        let err = match fatal {
            Some(reason) => LogError::WriterStopped(reason),
            None => {
                if !self.server.stopping.load(Ordering::SeqCst) {
                    tracing::error!(
                        device,
                        loop_id = self.id,
                        "append for a device this loop does not host"
                    );
                }
                LogError::Shutdown
            }
        };
        self.refused.borrow_mut().push((token, Err(err)));
    }

    /// An append from another loop, for a writer of this one.
    fn append_remote(&self, m: AppendMsg) {
        let producer = Some(ProducerHook {
            partition: PartRef::new(u16::try_from(m.device).unwrap_or(u16::MAX), m.partition),
            span: m.span,
            key: m.key,
            landing: m.landing,
        });
        let token = self.routes.borrow_mut().insert(Route {
            answer: Answer::Remote {
                origin: m.origin,
                token: m.token,
            },
            producer,
            bytes: 0,
        }) as u64;
        let (partition, payload, span) = (m.partition, m.payload, m.span);
        if !self.drive(m.device, |d| d.append(partition, payload, span, token)) {
            self.refuse(m.device, token);
        }
    }

    /// A writer of this loop answered `token`.
    fn device_ack(&self, token: u64, result: Result<Appended, LogError>) {
        let Some(route) = self.routes.borrow_mut().try_remove(token as usize) else {
            tracing::error!(token, "an ack for no route");
            return;
        };
        if let Some(p) = route.producer {
            let r = result.as_ref().map(|a| (a.offset, p.span)).map_err(|_| ());
            self.broker
                .producers()
                .acknowledged(p.partition, p.key, p.landing, r);
        }
        self.answer(route.answer, route.bytes, result);
    }

    /// An answer from another loop's writer to an append this loop sent.
    fn remote_ack(&self, token: u64, result: Result<Appended, LogError>) {
        let Some(route) = self.routes.borrow_mut().try_remove(token as usize) else {
            tracing::error!(token, "a remote ack for no route");
            return;
        };
        self.answer(route.answer, route.bytes, result);
    }

    fn answer(&self, answer: Answer, bytes: usize, result: Result<Appended, LogError>) {
        match answer {
            Answer::Conn {
                conn,
                seq,
                topic,
                part,
                batch,
            } => self.conns.complete(conn, seq, topic, part, batch, result),
            Answer::Remote { origin, token } => {
                self.outbox.borrow_mut()[origin]
                    .1
                    .push(AckMsg { token, result });
                return;
            }
            Answer::Silent { conn } => {
                if let Err(e) = &result {
                    tracing::info!(error = %e, "an acks=0 append failed; closing its connection");
                    self.conns.abort(conn);
                }
            }
        }
        self.server.outstanding.fetch_sub(1, Ordering::Relaxed);
        if bytes > 0 {
            self.budget_used
                .set(self.budget_used.get().saturating_sub(bytes));
            if self.budget_used.get() < self.server.opts.append_budget {
                let waiting = std::mem::take(&mut *self.budget_waiters.borrow_mut());
                for r in waiting {
                    self.conns.wake(r);
                }
            }
        }
    }

    /// Whether this loop's connections may queue more appends.
    pub fn budget_left(&self) -> bool {
        self.budget_used.get() < self.server.opts.append_budget
    }

    /// Sends what the pass left for other loops, one post (and at most one doorbell) per loop.
    fn flush_outbox(&self) {
        let mut out = self.outbox.borrow_mut();
        for (id, (appends, acks)) in out.iter_mut().enumerate() {
            if let Some(b) = self.server.bells.get(id) {
                b.post(appends, acks);
            }
        }
    }

    fn outbox_empty(&self) -> bool {
        self.outbox
            .borrow()
            .iter()
            .all(|(a, k)| a.is_empty() && k.is_empty())
    }
}

/// A loop's thread: its runtime, its tasks, until the server stops and its writers are done.
pub(crate) fn run_loop(
    id: usize,
    server: Arc<ServerShared>,
    devices: Vec<(usize, Box<dyn Hostable>)>,
    start: Receiver<Start>,
) {
    let bell = server.bells[id].clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, loop_id = id, "cannot start an event loop's runtime");
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let drivers: Vec<(usize, Box<dyn Driver>)> = devices
            .into_iter()
            .map(|(d, h)| (d, h.into_driver()))
            .collect();
        let loops = server.bells.len();
        // The writers turn before the broker exists: opening it reads through them.
        let early = Early {
            bell: bell.clone(),
            server: server.clone(),
            drivers,
        };
        let Some((start, drivers)) = early.turn_until_start(&start).await else {
            return;
        };
        let ctx = Rc::new(LoopCtx {
            id,
            broker: start.broker,
            server,
            bell,
            drivers: RefCell::new(drivers),
            routes: RefCell::new(Slab::new()),
            conns: Conns::default(),
            kick: Notify::new(),
            outbox: RefCell::new((0..loops).map(|_| (Vec::new(), Vec::new())).collect()),
            budget_used: Cell::new(0),
            budget_waiters: RefCell::new(Vec::new()),
            durable_seen: RefCell::new(Vec::new()),
            refused: RefCell::new(Vec::new()),
        });
        if let Some(l) = start.listener {
            match tokio::net::TcpListener::from_std(l) {
                Ok(l) => {
                    tokio::task::spawn_local(conn::accept(ctx.clone(), l));
                }
                Err(e) => tracing::error!(error = %e, "cannot listen on the event loop"),
            }
        }
        if id == 0 {
            crate::server::spawn_background(&ctx.broker);
        }
        tokio::task::spawn_local(conn::tick(ctx.clone()));
        service(ctx).await;
    });
}

/// A loop before the broker is open: its writers turn (the broker's replay reads through them).
struct Early {
    bell: Arc<LoopBell>,
    server: Arc<ServerShared>,
    drivers: Vec<(usize, Box<dyn Driver>)>,
}

impl Early {
    async fn turn_until_start(
        mut self,
        start: &Receiver<Start>,
    ) -> Option<(Start, Vec<(usize, Box<dyn Driver>)>)> {
        let mut acks = Vec::new();
        loop {
            if self.server.killed.load(Ordering::SeqCst) {
                return None;
            }
            if let Ok(s) = start.try_recv() {
                return Some((s, self.drivers));
            }
            let mut waits = Waits::default();
            self.drivers.retain_mut(|(_, d)| {
                let t = d.turn();
                // No token appends before the start: the log's own callbacks answer everything.
                d.drain_acks(&mut acks);
                waits.note(t, d.as_ref())
            });
            acks.clear();
            if self.drivers.is_empty() && self.server.stopping.load(Ordering::SeqCst) {
                return None;
            }
            if start.is_empty() {
                // The start message comes with a doorbell that a busy loop may not hear: look
                // again soon.
                waits.after = Some(Duration::from_millis(5));
                let drivers = RefCell::new(std::mem::take(&mut self.drivers));
                waits.wait(&self.bell, None, &drivers).await;
                self.drivers = drivers.into_inner();
            }
        }
    }
}

/// What a pass of the service found it may wait for.
#[derive(Default)]
struct Waits {
    moved: bool,
    /// A device that has no completion fd has I/O in flight: poll again soon.
    spin: bool,
    /// I/O is in flight on a device that has a completion fd.
    io_in_flight: bool,
    /// The earliest time a writer wants a turn anyway.
    after: Option<Duration>,
}

impl Waits {
    /// Notes a writer's turn; false when the writer has stopped (drop it).
    fn note(&mut self, t: Turn, d: &dyn Driver) -> bool {
        match t {
            Turn::Moved => {
                self.moved = true;
                true
            }
            Turn::Idle {
                io_in_flight,
                after,
            } => {
                if io_in_flight && !d.has_fd() {
                    self.spin = true;
                }
                self.io_in_flight |= io_in_flight;
                self.after = Some(self.after.map_or(after, |a| a.min(after)));
                true
            }
            Turn::Stopped => false,
        }
    }

    /// Waits until something may have arrived: another loop's doorbell, a connection's kick, a
    /// device completion, or a writer's own deadline. Returns at once after a pass that moved.
    async fn wait(
        &self,
        bell: &LoopBell,
        kick: Option<&Notify>,
        drivers: &RefCell<Vec<(usize, Box<dyn Driver>)>>,
    ) {
        if self.moved || self.spin || bell.arm() {
            tokio::task::yield_now().await;
            return;
        }
        for (_, d) in drivers.borrow_mut().iter_mut() {
            d.arm_fd();
        }
        let woken = bell.woken().notified();
        let kicked = kick.map(|k| k.notified());
        let sleep = tokio::time::sleep(self.after.unwrap_or(Duration::from_millis(100)));
        tokio::pin!(woken, sleep);
        let mut kicked = kicked.map(Box::pin);
        std::future::poll_fn(|cx| {
            if woken.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            if let Some(k) = kicked.as_mut() {
                if k.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(());
                }
            }
            let mut ready = false;
            // Borrowed only for this poll: connections append through it between polls.
            for (_, d) in drivers.borrow_mut().iter_mut() {
                ready |= d.poll_completion(cx).is_ready();
            }
            if ready || sleep.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await;
        bell.disarm();
    }
}

/// The service task: inbox, writers, acks, outbox, then wait.
async fn service(ctx: Rc<LoopCtx>) {
    let mut inbox = Inbox::default();
    let mut acks: Vec<TokenAck> = Vec::new();
    let mut stopping_seen = false;
    let spin_budget = ctx.server.opts.spin;
    let mut spin_since: Option<Instant> = None;
    loop {
        if ctx.server.killed.load(Ordering::SeqCst) {
            return;
        }
        ctx.bell.take(&mut inbox);
        for c in inbox.conns.drain(..) {
            conn::adopt(&ctx, c);
        }
        let had_mail = !inbox.appends.is_empty() || !inbox.acks.is_empty();
        for m in inbox.appends.drain(..) {
            ctx.append_remote(m);
        }
        for a in inbox.acks.drain(..) {
            ctx.remote_ack(a.token, a.result);
        }
        if ctx.server.stopping.load(Ordering::SeqCst) && !stopping_seen {
            stopping_seen = true;
            ctx.conns.close_all();
        }
        let mut waits = Waits {
            moved: had_mail,
            ..Waits::default()
        };
        let mut durable_moved = false;
        {
            let mut drivers = ctx.drivers.borrow_mut();
            let mut seen = ctx.durable_seen.borrow_mut();
            seen.resize(drivers.len(), 0);
            let mut i = 0;
            drivers.retain_mut(|(_, d)| {
                let t = d.turn();
                d.drain_acks(&mut acks);
                let dur = d.durable();
                if seen.get(i).copied() != Some(dur) {
                    durable_moved = true;
                    if let Some(s) = seen.get_mut(i) {
                        *s = dur;
                    }
                }
                i += 1;
                waits.note(t, d.as_ref())
            });
        }
        acks.append(&mut ctx.refused.borrow_mut());
        for (token, result) in acks.drain(..) {
            ctx.device_ack(token, result);
        }
        if durable_moved {
            ctx.broker.durable_moved();
        }
        if !ctx.outbox_empty() {
            ctx.flush_outbox();
        }
        // Briefly poll instead of sleeping while a completion is due soon (`ServerOptions::spin`):
        // on a virtual machine a wake-up from sleep costs more than the poll.
        if waits.moved {
            spin_since = None;
        } else if waits.io_in_flight && !spin_budget.is_zero() {
            let since = *spin_since.get_or_insert_with(Instant::now);
            if since.elapsed() < spin_budget {
                waits.spin = true;
            }
        }
        if stopping_seen && ctx.drivers.borrow().is_empty() && ctx.routes.borrow().is_empty() {
            // This loop's writers are done and every append it sent was answered; acks for
            // other loops were posted above.
            return;
        }
        waits.wait(&ctx.bell, Some(&ctx.kick), &ctx.drivers).await;
    }
}
