//! A simulated network between in-process Raft nodes, on tokio time: every message is delayed
//! by a seeded random amount, and (as `Faults` asks) requests or replies are dropped, requests
//! delivered twice, messages held back so that later ones overtake them, and links cut one way
//! or both (`cut`, `isolate`, `heal`; `nemesis` does it on a seeded schedule).
//!
//! A message travels on its own task: when openraft gives up on a call (its timeout), the
//! request still arrives later, as a stale message does on a real network.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nvmq_cluster::{StateMachine, TypeConfig};
use openraft::errors::{RPCError, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Raft};

pub type Node = Raft<TypeConfig, StateMachine>;
type Snapshot = openraft::alias::SnapshotOf<TypeConfig, Vec<u8>>;

/// splitmix64: a seeded, reproducible stream.
pub struct Rng(u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A draw in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    /// True `percent` % of the time.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// What the network does to messages. Percentages are per message.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    /// Each way: a request, and separately its reply, is lost.
    pub drop_percent: u64,
    /// Every message waits up to this long.
    pub max_delay_ms: u64,
    /// A request is delivered a second time, up to `hold_ms` later (its reply is lost).
    pub duplicate_percent: u64,
    /// A request is held up to `hold_ms` more, so that later messages overtake it.
    pub reorder_percent: u64,
    pub hold_ms: u64,
}

impl Faults {
    /// Lost and delayed messages only.
    pub fn lossy() -> Faults {
        Faults {
            drop_percent: 5,
            max_delay_ms: 5,
            duplicate_percent: 0,
            reorder_percent: 0,
            hold_ms: 0,
        }
    }

    /// Lost, delayed, duplicated and reordered messages.
    pub fn hostile() -> Faults {
        Faults {
            duplicate_percent: 10,
            reorder_percent: 10,
            hold_ms: 200,
            ..Faults::lossy()
        }
    }
}

pub struct Net {
    nodes: Mutex<BTreeMap<u64, Node>>,
    rng: Mutex<Rng>,
    faults: Faults,
    /// Directed links that carry nothing: (from, to).
    cut: Mutex<BTreeSet<(u64, u64)>>,
    stats: Stats,
}

/// What the network did, so that a test can tell its faults happened.
#[derive(Default)]
pub struct Stats {
    /// Second copies of a request that reached their target.
    pub duplicated: AtomicU64,
    /// Requests held back for later ones to overtake.
    pub held: AtomicU64,
    /// Requests or replies lost on a cut link.
    pub cut_off: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// What happens to one message.
struct Fate {
    delay: Duration,
    drop_request: bool,
    drop_reply: bool,
    /// When a second copy of the request arrives, if one does.
    copy: Option<Duration>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Net {
    pub fn new(seed: u64, faults: Faults) -> Arc<Net> {
        Arc::new(Net {
            nodes: Mutex::new(BTreeMap::new()),
            rng: Mutex::new(Rng(seed)),
            faults,
            cut: Mutex::new(BTreeSet::new()),
            stats: Stats::default(),
        })
    }

    /// (duplicated, held, cut off) so far.
    pub fn stats(&self) -> (u64, u64, u64) {
        let s = &self.stats;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        (get(&s.duplicated), get(&s.held), get(&s.cut_off))
    }

    pub fn add(&self, id: u64, node: Node) {
        lock(&self.nodes).insert(id, node);
    }

    /// Takes a node off the network (it is stopped, or cut off).
    pub fn remove(&self, id: u64) -> Option<Node> {
        lock(&self.nodes).remove(&id)
    }

    pub fn get(&self, id: u64) -> Option<Node> {
        lock(&self.nodes).get(&id).cloned()
    }

    pub fn ids(&self) -> Vec<u64> {
        lock(&self.nodes).keys().copied().collect()
    }

    /// Stops messages from `from` to `to` (one way).
    pub fn cut(&self, from: u64, to: u64) {
        lock(&self.cut).insert((from, to));
    }

    /// Cuts `id` off from `others` both ways.
    pub fn isolate(&self, id: u64, others: &[u64]) {
        for &o in others.iter().filter(|&&o| o != id) {
            self.cut(id, o);
            self.cut(o, id);
        }
    }

    /// Every link carries messages again.
    pub fn heal(&self) {
        lock(&self.cut).clear();
    }

    fn link_up(&self, from: u64, to: u64) -> bool {
        let up = !lock(&self.cut).contains(&(from, to));
        if !up {
            bump(&self.stats.cut_off);
        }
        up && self.get(from).is_some()
    }

    fn fate(&self) -> Fate {
        let f = self.faults;
        let mut rng = lock(&self.rng);
        let mut delay = rng.range(0, f.max_delay_ms);
        if rng.chance(f.reorder_percent) {
            delay += rng.range(1, f.hold_ms.max(1));
            bump(&self.stats.held);
        }
        let drop_request = rng.chance(f.drop_percent);
        let drop_reply = rng.chance(f.drop_percent);
        let copy = rng
            .chance(f.duplicate_percent)
            .then(|| Duration::from_millis(rng.range(0, f.hold_ms)));
        Fate {
            delay: Duration::from_millis(delay),
            drop_request,
            drop_reply,
            copy,
        }
    }

    /// Delivers a request from `from` to `to` and its reply, each possibly lost, held back or
    /// (the request) duplicated.
    async fn deliver<Q, T, E, F, Fut>(
        self: &Arc<Self>,
        from: u64,
        to: u64,
        req: Q,
        call: F,
    ) -> Result<T, Unreachable<TypeConfig>>
    where
        Q: Clone + Send + 'static,
        T: Send + 'static,
        E: std::fmt::Display,
        F: Fn(Node, Q) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        let fate = self.fate();
        if let Some(after) = fate.copy {
            let (net, req, call) = (self.clone(), req.clone(), call.clone());
            tokio::spawn(async move {
                tokio::time::sleep(fate.delay + after).await;
                if let Some(node) = net.get(to).filter(|_| net.link_up(from, to)) {
                    bump(&net.stats.duplicated);
                    let _ = call(node, req).await;
                }
            });
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let net = self.clone();
        tokio::spawn(async move {
            let _ = tx.send(net.carry(from, to, fate, req, call).await);
        });
        let r = rx.await.unwrap_or_else(|_| Err("message lost".into()));
        r.map_err(|why| Unreachable::from_string(format!("{from} -> {to}: {why}")))
    }

    async fn carry<Q, T, E, F, Fut>(
        &self,
        from: u64,
        to: u64,
        fate: Fate,
        req: Q,
        call: F,
    ) -> Result<T, String>
    where
        E: std::fmt::Display,
        F: Fn(Node, Q) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        tokio::time::sleep(fate.delay).await;
        if fate.drop_request || !self.link_up(from, to) {
            return Err("request lost".into());
        }
        let node = self.get(to).ok_or("target down")?;
        let reply = call(node, req).await.map_err(|e| e.to_string())?;
        tokio::time::sleep(fate.delay / 2).await;
        if fate.drop_reply || !self.link_up(to, from) || self.get(from).is_none() {
            return Err("reply lost".into());
        }
        Ok(reply)
    }
}

/// Cuts links on a seeded schedule until aborted: calm for 100-500 ms, then for 100-1000 ms
/// one of: a node cut off both ways, a node that can send but not receive, a node that can
/// receive but not send, or a single link cut one way; then healed. Times are tokio time.
pub fn nemesis(net: Arc<Net>, seed: u64, ids: Vec<u64>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut rng = Rng(seed ^ 0x006E_656D_6573_6973);
        let pick = |rng: &mut Rng| ids[(rng.next() % ids.len() as u64) as usize];
        loop {
            let calm = rng.range(100, 500);
            tokio::time::sleep(Duration::from_millis(calm)).await;
            let x = pick(&mut rng);
            match rng.next() % 4 {
                0 => net.isolate(x, &ids),
                1 => ids.iter().filter(|&&o| o != x).for_each(|&o| net.cut(o, x)),
                2 => ids.iter().filter(|&&o| o != x).for_each(|&o| net.cut(x, o)),
                _ => {
                    let y = pick(&mut rng);
                    if y != x {
                        net.cut(x, y);
                    }
                }
            }
            let fault = rng.range(100, 1000);
            tokio::time::sleep(Duration::from_millis(fault)).await;
            net.heal();
        }
    })
}

/// One node's view of the network.
#[derive(Clone)]
pub struct Factory {
    pub net: Arc<Net>,
    pub from: u64,
}

pub struct Client {
    net: Arc<Net>,
    from: u64,
    to: u64,
}

impl RaftNetworkFactory<TypeConfig> for Factory {
    type Network = Client;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> Client {
        Client {
            net: self.net.clone(),
            from: self.from,
            to: target,
        }
    }
}

impl RaftNetworkV2<TypeConfig> for Client {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let r = self
            .net
            .deliver(self.from, self.to, rpc, |n: Node, rpc| async move {
                n.append_entries(rpc).await
            });
        Ok(r.await?)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let r = self
            .net
            .deliver(self.from, self.to, rpc, |n: Node, rpc| async move {
                n.vote(rpc).await
            });
        Ok(r.await?)
    }

    async fn full_snapshot(
        &mut self,
        vote: openraft::alias::VoteOf<TypeConfig>,
        snapshot: Snapshot,
        _cancel: impl Future<Output = openraft::errors::ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let r = self.net.deliver(
            self.from,
            self.to,
            (vote, snapshot),
            |n: Node, (vote, snapshot)| async move { n.install_full_snapshot(vote, snapshot).await },
        );
        Ok(r.await?)
    }
}
