//! A node's connections to its peers: one TCP connection per peer, dialled on first use and
//! again after it broke, carrying the requests of every group with their replies matched by
//! request id.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::error::NetError;
use super::wire::{self, Hello, Message, VERSION};

/// A peer's addresses: where its Raft groups listen, and where its Kafka clients connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub internal: String,
    pub kafka: String,
}

/// Node id -> addresses, shared by a node and its connections.
pub type PeerTable = Arc<RwLock<BTreeMap<u64, Peer>>>;

/// Frames queued for one connection's writer before callers wait.
const WRITE_QUEUE: usize = 1024;

/// A request that times out on a connection that has delivered nothing for this long gives the
/// connection up: a peer gone without a reset would otherwise hold it (and every request sent
/// on it) forever. Shorter silences are a slow peer, and heartbeats keep a live one talking.
const SILENCE: Duration = Duration::from_secs(1);

/// Why a call got no answer, in the terms openraft backs off by.
#[derive(Debug)]
pub enum CallError {
    /// The peer could not be reached (no connection, wrong node, its Raft is stopped):
    /// openraft backs off before trying it again.
    Unreachable(String),
    /// The connection failed under the request or the peer refused it: worth a prompt retry.
    Network(String),
    /// No answer before the deadline.
    Timeout,
}

type Waiter = oneshot::Sender<Result<Message, String>>;

/// A peer's connection, if one is open; locked while it is dialled, so a peer is dialled once.
type Slot = Arc<tokio::sync::Mutex<Option<Arc<Conn>>>>;

/// The requests in flight on a connection, and whether it is finished.
struct Pending {
    closed: Option<String>,
    waiters: HashMap<u64, Waiter>,
    /// When the connection last delivered a frame (see [`SILENCE`]).
    last_read: Instant,
}

struct Conn {
    tx: mpsc::Sender<Vec<u8>>,
    pending: Mutex<Pending>,
    tasks: Mutex<Vec<AbortHandle>>,
}

impl Conn {
    fn pending(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_open(&self) -> bool {
        self.pending().closed.is_none()
    }

    /// Fails every request in flight with `why` and stops the connection's tasks.
    fn close(&self, why: String) {
        let waiters: Vec<Waiter> = {
            let mut p = self.pending();
            if p.closed.is_none() {
                p.closed = Some(why.clone());
            }
            p.waiters.drain().map(|(_, w)| w).collect()
        };
        for w in waiters {
            let _ = w.send(Err(why.clone()));
        }
        for t in self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.close("connection dropped".into());
    }
}

/// Reads replies and hands each to the request that waits for it.
async fn read_replies(conn: Arc<Conn>, mut rd: tokio::net::tcp::OwnedReadHalf, target: u64) {
    let why = loop {
        let frame = match wire::read_frame(&mut rd).await {
            Ok(Some(f)) => f,
            Ok(None) => break format!("node {target} closed the connection"),
            Err(e) => break format!("node {target}: {e}"),
        };
        let msg = frame.message();
        let waiter = {
            let mut p = conn.pending();
            p.last_read = Instant::now();
            p.waiters.remove(&frame.id)
        };
        match msg {
            Ok(Message::Refused(why)) => {
                if let Some(w) = waiter {
                    let _ = w.send(Err(format!("node {target} refused the request: {why}")));
                }
                break format!("node {target} refused a frame: {why}");
            }
            Ok(msg) => {
                // No waiter: the request timed out and its caller is gone.
                if let Some(w) = waiter {
                    let _ = w.send(Ok(msg));
                }
            }
            Err(e) => break format!("node {target}: {e}"),
        }
    };
    conn.close(why);
}

async fn write_requests(
    conn: std::sync::Weak<Conn>,
    wr: tokio::net::tcp::OwnedWriteHalf,
    rx: mpsc::Receiver<Vec<u8>>,
    target: u64,
) {
    if let Err(e) = wire::write_frames(wr, rx).await {
        if let Some(c) = conn.upgrade() {
            c.close(format!("node {target}: {e}"));
        }
    }
}

pub(crate) struct Pool {
    me: u64,
    peers: PeerTable,
    slots: Mutex<HashMap<u64, Slot>>,
    next_id: AtomicU64,
    stopped: AtomicBool,
}

impl Pool {
    pub(crate) fn new(me: u64, peers: PeerTable) -> Pool {
        Pool {
            me,
            peers,
            slots: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            stopped: AtomicBool::new(false),
        }
    }

    pub(crate) fn me(&self) -> u64 {
        self.me
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The peer's internal address: the peer table's, else the one openraft's membership
    /// gave (`fallback`).
    fn address(&self, target: u64, fallback: &str) -> Result<String, CallError> {
        let peers = self.peers.read().unwrap_or_else(|p| p.into_inner());
        match peers.get(&target) {
            Some(p) => Ok(p.internal.clone()),
            None if !fallback.is_empty() => Ok(fallback.to_string()),
            None => Err(CallError::Unreachable(
                NetError::NoAddress {
                    target,
                    why: "and the membership gives none".into(),
                }
                .to_string(),
            )),
        }
    }

    fn slot(&self, target: u64) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.entry(target).or_default().clone()
    }

    /// Closes every connection; calls after this fail as unreachable.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let slots: Vec<_> = self
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, s)| s)
            .collect();
        for slot in slots {
            if let Ok(mut s) = slot.try_lock() {
                if let Some(c) = s.take() {
                    c.close("this node stopped".into());
                }
            }
        }
    }

    /// The open connection to `target`, dialling it (and checking who answers) if there is
    /// none.
    async fn conn(
        &self,
        target: u64,
        fallback: &str,
        deadline: Instant,
    ) -> Result<Arc<Conn>, CallError> {
        let slot = self.slot(target);
        let mut slot = slot.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| c.is_open()) {
            return Ok(c.clone());
        }
        if self.stopped.load(Ordering::SeqCst) {
            return Err(CallError::Unreachable(format!("node {} stopped", self.me)));
        }
        let addr = self.address(target, fallback)?;
        let conn = match tokio::time::timeout_at(deadline, self.dial(target, &addr)).await {
            Ok(r) => r.map_err(|e| CallError::Unreachable(e.to_string()))?,
            Err(_) => return Err(CallError::Timeout),
        };
        if self.stopped.load(Ordering::SeqCst) {
            // `stop` ran while this dial was under way and could not see the connection.
            conn.close(format!("node {} stopped", self.me));
            return Err(CallError::Unreachable(format!("node {} stopped", self.me)));
        }
        *slot = Some(conn.clone());
        Ok(conn)
    }

    async fn dial(&self, target: u64, addr: &str) -> Result<Arc<Conn>, NetError> {
        let connect = |op, source| NetError::Connect {
            target,
            addr: addr.to_string(),
            op,
            source,
        };
        let handshake = |why: String| NetError::Handshake {
            target,
            addr: addr.to_string(),
            why,
        };
        let mut sock = TcpStream::connect(addr)
            .await
            .map_err(|e| connect("connect", e))?;
        let _ = sock.set_nodelay(true);
        let hello = Message::Hello(Hello {
            version: VERSION,
            from: self.me,
            to: target,
        });
        let bytes = wire::encode(0, 0, &hello).map_err(|e| handshake(e.to_string()))?;
        tokio::io::AsyncWriteExt::write_all(&mut sock, &bytes)
            .await
            .map_err(|e| connect("send the hello", e))?;
        let answer = wire::read_frame(&mut sock)
            .await
            .map_err(|e| handshake(e.to_string()))?
            .ok_or_else(|| handshake("closed the connection after the hello".into()))?;
        match answer.message().map_err(|e| handshake(e.to_string()))? {
            Message::HelloAck(id) if id == target => {}
            Message::HelloAck(id) => {
                return Err(handshake(format!("node {id} answered, not node {target}")))
            }
            Message::Refused(why) => return Err(handshake(format!("refused the hello: {why}"))),
            other => {
                return Err(handshake(format!(
                    "answered the hello with a {} frame",
                    other.name()
                )))
            }
        }
        let (rd, wr) = sock.into_split();
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let conn = Arc::new(Conn {
            tx,
            pending: Mutex::new(Pending {
                closed: None,
                waiters: HashMap::new(),
                last_read: Instant::now(),
            }),
            tasks: Mutex::new(Vec::new()),
        });
        let reader = tokio::spawn(read_replies(conn.clone(), rd, target));
        let writer = tokio::spawn(write_requests(Arc::downgrade(&conn), wr, rx, target));
        conn.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend([reader.abort_handle(), writer.abort_handle()]);
        Ok(conn)
    }

    /// Sends one encoded request frame (its id is set here) for `group` to `target` and waits
    /// for its answer until `deadline`.
    pub(crate) async fn call(
        &self,
        target: u64,
        fallback: &str,
        mut frame: Vec<u8>,
        deadline: Instant,
    ) -> Result<Message, CallError> {
        let conn = self.conn(target, fallback, deadline).await?;
        let id = self.next_id();
        wire::set_id(&mut frame, id);
        let (tx, rx) = oneshot::channel();
        {
            let mut p = conn.pending();
            if let Some(why) = &p.closed {
                return Err(CallError::Network(why.clone()));
            }
            p.waiters.insert(id, tx);
        }
        if conn.tx.send(frame).await.is_err() {
            return Err(CallError::Network(format!(
                "node {target}: the connection's writer stopped"
            )));
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(Ok(Message::RemoteFatal(why)))) => Err(CallError::Unreachable(format!(
                "node {target}: its Raft group failed the request: {why}"
            ))),
            Ok(Ok(Ok(msg))) => Ok(msg),
            Ok(Ok(Err(why))) => Err(CallError::Network(why)),
            Ok(Err(_)) => Err(CallError::Network(format!(
                "node {target}: the connection closed under the request"
            ))),
            Err(_) => {
                let silent_for = {
                    let mut p = conn.pending();
                    p.waiters.remove(&id);
                    p.last_read.elapsed()
                };
                if silent_for >= SILENCE {
                    conn.close(format!("node {target}: nothing read for {silent_for:?}"));
                }
                Err(CallError::Timeout)
            }
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.stop();
    }
}
