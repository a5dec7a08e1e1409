//! A simulated network between in-process Raft nodes: every message is delayed by a seeded
//! random amount of (tokio) time, and some requests or their replies are dropped.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
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
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

pub struct Net {
    nodes: Mutex<BTreeMap<u64, Node>>,
    rng: Mutex<Rng>,
    /// Percent of requests (and, separately, of replies) dropped.
    drop_percent: u64,
    max_delay_ms: u64,
}

/// What happens to one message.
struct Fate {
    delay: Duration,
    drop_request: bool,
    drop_reply: bool,
}

impl Net {
    pub fn new(seed: u64, drop_percent: u64, max_delay_ms: u64) -> Arc<Net> {
        Arc::new(Net {
            nodes: Mutex::new(BTreeMap::new()),
            rng: Mutex::new(Rng(seed)),
            drop_percent,
            max_delay_ms,
        })
    }

    pub fn add(&self, id: u64, node: Node) {
        self.lock().insert(id, node);
    }

    /// Takes a node off the network (it is stopped, or cut off).
    pub fn remove(&self, id: u64) -> Option<Node> {
        self.lock().remove(&id)
    }

    pub fn get(&self, id: u64) -> Option<Node> {
        self.lock().get(&id).cloned()
    }

    pub fn ids(&self) -> Vec<u64> {
        self.lock().keys().copied().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Node>> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fate(&self) -> Fate {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        let delay = Duration::from_millis(rng.next() % (self.max_delay_ms + 1));
        Fate {
            delay,
            drop_request: rng.next() % 100 < self.drop_percent,
            drop_reply: rng.next() % 100 < self.drop_percent,
        }
    }

    /// Delivers a request from `from` to `to` and its reply, each possibly dropped.
    async fn deliver<T, E, F, Fut>(
        &self,
        from: u64,
        to: u64,
        call: F,
    ) -> Result<T, Unreachable<TypeConfig>>
    where
        E: std::fmt::Display,
        F: FnOnce(Node) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let fate = self.fate();
        let unreachable = |why: &str| Unreachable::from_string(format!("{from} -> {to}: {why}"));
        tokio::time::sleep(fate.delay).await;
        if fate.drop_request || self.get(from).is_none() {
            return Err(unreachable("request dropped"));
        }
        let Some(node) = self.get(to) else {
            return Err(unreachable("target down"));
        };
        let reply = call(node).await.map_err(|e| unreachable(&e.to_string()))?;
        tokio::time::sleep(fate.delay / 2).await;
        if fate.drop_reply || self.get(from).is_none() {
            return Err(unreachable("reply dropped"));
        }
        Ok(reply)
    }
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
        let r = self.net.deliver(self.from, self.to, |n| async move {
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
            .deliver(self.from, self.to, |n| async move { n.vote(rpc).await });
        Ok(r.await?)
    }

    async fn full_snapshot(
        &mut self,
        vote: openraft::alias::VoteOf<TypeConfig>,
        snapshot: Snapshot,
        _cancel: impl Future<Output = openraft::errors::ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let r = self.net.deliver(self.from, self.to, |n| async move {
            n.install_full_snapshot(vote, snapshot).await
        });
        Ok(r.await?)
    }
}
