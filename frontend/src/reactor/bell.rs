//! What crosses between loops: per-loop inboxes of batched messages, and a doorbell rung only
//! when the receiving loop's service task waits (Seastar's `smp` queues, in small).
//!
//! The service task arms its bell, looks at its inbox once more, and only then waits; a sender
//! posts, then rings only if it finds the bell armed (and disarms it). With sequentially
//! consistent accesses on both sides one of the two always sees the other, so a message is never
//! left waiting while its loop's service sleeps, and while the service is busy its senders make
//! no system call at all. At most one ring per wait of the receiving service.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;
use crossbeam::channel::Receiver;
use nvmq_log::{Appended, LogError, Request};
use tokio::sync::Notify;

use crate::producers::{BatchKey, LandingTx};

/// An append whose partition lives on a device owned by another loop.
pub struct AppendMsg {
    pub device: usize,
    pub partition: u32,
    pub payload: Bytes,
    pub span: u32,
    /// The producer-state hooks, run by the owning loop in log order.
    pub key: Option<BatchKey>,
    pub landing: Option<LandingTx>,
    /// Where the answer goes back to.
    pub origin: usize,
    pub token: u64,
}

/// The answer to an [`AppendMsg`], back on the loop that sent it.
pub struct AckMsg {
    pub token: u64,
    pub result: Result<Appended, LogError>,
}

/// What other loops have sent one loop.
#[derive(Default)]
pub struct Inbox {
    pub appends: Vec<AppendMsg>,
    pub acks: Vec<AckMsg>,
    /// Connections the accepting loop handed over.
    pub conns: Vec<std::net::TcpStream>,
}

impl Inbox {
    fn is_empty(&self) -> bool {
        self.appends.is_empty() && self.acks.is_empty() && self.conns.is_empty()
    }
}

/// One loop's doorbell and inbox, shared with every other thread.
pub struct LoopBell {
    armed: AtomicBool,
    wake: Notify,
    inbox: Mutex<Inbox>,
    /// The request queues of the writers this loop hosts: looked at before it sleeps.
    queues: Mutex<Vec<Receiver<Request>>>,
}

impl Default for LoopBell {
    fn default() -> Self {
        LoopBell {
            armed: AtomicBool::new(false),
            wake: Notify::new(),
            inbox: Mutex::new(Inbox::default()),
            queues: Mutex::new(Vec::new()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl LoopBell {
    /// Wakes the loop's service task if it waits (or is about to).
    pub fn ring(&self) {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.wake.notify_one();
        }
    }

    /// Adds messages for this loop and rings once.
    pub fn post(&self, appends: &mut Vec<AppendMsg>, acks: &mut Vec<AckMsg>) {
        if appends.is_empty() && acks.is_empty() {
            return;
        }
        {
            let mut i = lock(&self.inbox);
            i.appends.append(appends);
            i.acks.append(acks);
        }
        self.ring();
    }

    /// Hands this loop a connection.
    pub fn post_conn(&self, c: std::net::TcpStream) {
        lock(&self.inbox).conns.push(c);
        self.ring();
    }

    /// Takes everything sent so far (the loop's own side).
    pub fn take(&self, into: &mut Inbox) {
        let mut i = lock(&self.inbox);
        std::mem::swap(&mut *i, into);
    }

    /// The loop watches this writer's queue before it sleeps.
    pub fn watch_queue(&self, rx: Receiver<Request>) {
        lock(&self.queues).push(rx);
    }

    /// What the loop's service task waits on.
    pub fn woken(&self) -> &Notify {
        &self.wake
    }

    /// The service task is about to wait: from now on a sender rings. True when something
    /// arrived meanwhile (then it should not wait).
    pub fn arm(&self) -> bool {
        self.armed.store(true, Ordering::SeqCst);
        let waiting =
            !lock(&self.inbox).is_empty() || lock(&self.queues).iter().any(|q| !q.is_empty());
        waiting && self.armed.swap(false, Ordering::SeqCst)
    }

    /// The service task woke up.
    pub fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }
}

impl nvmq_log::Doorbell for LoopBell {
    fn ring(&self) {
        LoopBell::ring(self);
    }
}
