//! A cluster node: its id, its internal listener, its peer table, the Raft groups it runs and
//! its connections to the other nodes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use openraft::BasicNode;
use tokio::task::JoinHandle;

use super::error::NetError;
use super::network::Network;
use super::pool::{Peer, PeerTable, Pool};
use super::registry::{GroupRaft, Registry};
use super::server;

pub struct Node {
    id: u64,
    addr: SocketAddr,
    kafka: String,
    peers: PeerTable,
    registry: Registry,
    pool: Arc<Pool>,
    server: Option<JoinHandle<()>>,
}

impl Node {
    /// Listens on `internal` (port 0 picks a free one; [`Node::addr`] tells which) and starts
    /// with an empty peer table and no groups.
    pub async fn start(id: u64, internal: SocketAddr, kafka: String) -> Result<Node, NetError> {
        let registry = Registry::default();
        let (addr, server) = server::listen(id, internal, registry.clone()).await?;
        let peers: PeerTable = Arc::new(RwLock::new(BTreeMap::new()));
        Ok(Node {
            id,
            addr,
            kafka,
            pool: Arc::new(Pool::new(id, peers.clone())),
            peers,
            registry,
            server: Some(server),
        })
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// The address the internal listener is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// This node's own entry of a peer table.
    pub fn peer(&self) -> Peer {
        Peer {
            internal: self.addr.to_string(),
            kafka: self.kafka.clone(),
        }
    }

    /// Adds or replaces a peer; connections dialled from now on use its address.
    pub fn set_peer(&self, id: u64, peer: Peer) {
        self.peers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, peer);
    }

    pub fn peers(&self) -> BTreeMap<u64, Peer> {
        self.peers.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The members a group of this node and its peers starts with (`Raft::initialize`):
    /// openraft's node record holds the internal address.
    pub fn members(&self) -> BTreeMap<u64, BasicNode> {
        let mut members: BTreeMap<u64, BasicNode> = self
            .peers()
            .into_iter()
            .map(|(id, p)| (id, BasicNode::new(p.internal)))
            .collect();
        members.insert(self.id, BasicNode::new(self.addr.to_string()));
        members
    }

    /// The network a group's `Raft` is built with; every group shares the node's connections.
    pub fn network(&self, group: u32) -> Network {
        Network {
            pool: self.pool.clone(),
            group,
        }
    }

    /// Routes the group's incoming requests to `raft`.
    pub fn add_group(&self, group: u32, raft: GroupRaft) {
        self.registry.insert(group, raft);
    }

    pub fn group(&self, group: u32) -> Option<GroupRaft> {
        self.registry.get(group)
    }

    /// Stops the listener (peers see connections refused, i.e. unreachable), closes the
    /// connections to peers and shuts every group's Raft down.
    pub async fn stop(mut self) -> Result<(), NetError> {
        if let Some(server) = self.server.take() {
            server.abort();
            // Cancelled is the expected outcome; the listener is closed once it returns.
            let _ = server.await;
        }
        self.pool.stop();
        let mut first_err = None;
        for (group, raft) in self.registry.take_all() {
            if let Err(e) = raft.shutdown().await {
                first_err.get_or_insert(NetError::Shutdown {
                    node: self.id,
                    group,
                    why: e.to_string(),
                });
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
        self.pool.stop();
    }
}
