//! Joining the cluster at start: the transport, the group on device 0's log, and the first
//! membership.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};

use nvmq_cluster::net::{Node, Peer};
use nvmq_cluster::openraft::{BasicNode, Config, Raft, SnapshotPolicy};

use super::applier::BrokerApplier;
use super::compact::Compactor;
use super::propose::Proposer;
use super::quorum::Quorum;
use super::{ClusterOptions, Replica, GROUP};
use crate::broker::Broker;
use crate::FrontendError;

fn cluster_err(what: String) -> FrontendError {
    FrontendError::Config(format!("cluster: {what}"))
}

fn resolve(what: &str, addr: &str) -> Result<SocketAddr, FrontendError> {
    addr.to_socket_addrs()
        .map_err(|e| cluster_err(format!("{what} {addr:?}: {e}")))?
        .next()
        .ok_or_else(|| cluster_err(format!("{what} {addr:?} resolves to no address")))
}

/// The group's timing: openraft's defaults (heartbeat 50 ms, elections after 150-300 ms).
/// Snapshots and purges are the compactor's alone (`compact`): openraft's own policy would
/// purge entries a lagging voter still needs, which a snapshot of bookkeeping cannot replace.
fn raft_config() -> Result<Arc<Config>, FrontendError> {
    let c = Config {
        cluster_name: "nvmq".into(),
        snapshot_policy: SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: u64::MAX,
        ..Config::default()
    };
    c.validate()
        .map(Arc::new)
        .map_err(|e| cluster_err(format!("raft config: {e}")))
}

/// Starts this node's part of the cluster over `broker` (opened, its writers turning): listens
/// on its internal address, opens the group on device 0, and initializes the group with every
/// member if it never was (each node does so with the same membership, which openraft allows).
/// Blocking; call it outside any runtime's thread.
pub fn start(broker: &Arc<Broker>, opts: &ClusterOptions) -> Result<Arc<Replica>, FrontendError> {
    let id = opts.node_id;
    let me = opts
        .members
        .get(&id)
        .ok_or_else(|| cluster_err(format!("node {id} is not one of the members")))?;
    let internal = resolve("internal address of this node", &me.internal)?;
    let config = raft_config()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("nvmq-cluster")
        .enable_all()
        .build()
        .map_err(|source| FrontendError::Io {
            op: "starting the cluster's runtime",
            source,
        })?;
    let log = broker.log().clone();
    let quarter_ring = (log.geometry().log_size / 4).max(1);
    let applier = Arc::new(BrokerApplier::new(Arc::downgrade(broker)));
    let compact_to = applier.compact_to();
    let max_payload = log.max_payload();
    let (node, raft, quorum, proposer) = runtime.block_on(async {
        let node = Node::start(id, internal, me.kafka.clone())
            .await
            .map_err(|e| cluster_err(format!("node {id}: {e}")))?;
        for (&peer, addrs) in &opts.members {
            if peer != id {
                node.set_peer(
                    peer,
                    Peer {
                        internal: addrs.internal.clone(),
                        kafka: addrs.kafka.clone(),
                    },
                );
            }
        }
        // Reads the group's records through the writer, which a loop turns: off this runtime.
        let (ls, sm) = tokio::task::spawn_blocking(move || {
            nvmq_cluster::open_applied_group(log, GROUP, applier)
        })
        .await
        .map_err(|e| cluster_err(format!("opening the raft group: {e}")))?
        .map_err(|e| cluster_err(e.to_string()))?;
        let group_log = ls.group_log().clone();
        let quorum = Arc::new(Quorum::new(group_log.clone()));
        let raft = Raft::new(id, config, node.network(GROUP), ls, sm)
            .await
            .map_err(|e| cluster_err(format!("starting the raft group: {e}")))?;
        node.add_group(GROUP, raft.clone());
        tokio::spawn(quorum.clone().watch(raft.clone()));
        let compactor = Compactor {
            raft: raft.clone(),
            log: group_log,
            compact_to,
            every: opts.compact_every,
            quarter_ring,
        };
        tokio::spawn(compactor.run());
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| cluster_err(format!("reading the raft group's state: {e}")))?;
        if !initialized {
            let members: std::collections::BTreeMap<u64, BasicNode> = opts
                .members
                .iter()
                .map(|(&n, a)| (n, BasicNode::new(a.internal.clone())))
                .collect();
            // Every node initializes with the same members; one that another node's leader
            // reached first answers NotAllowed, which is the outcome wanted.
            if let Err(e) = raft.initialize(members).await {
                tracing::info!(node = id, outcome = %e, "raft group initialized elsewhere");
            }
        }
        // Half the log's largest record for the commands merged into one entry: the rest is
        // room for the entry's own header.
        let proposer = Proposer::start(raft.clone(), opts.merge_commands, max_payload / 2);
        Ok::<_, FrontendError>((node, raft, quorum, proposer))
    })?;
    tracing::info!(node = id, internal = %node.addr(), members = opts.members.len(),
        "joined the cluster");
    Ok(Arc::new(Replica {
        opts: opts.clone(),
        raft,
        quorum,
        proposer,
        node: Mutex::new(Some(node)),
        runtime: Mutex::new(Some(runtime)),
    }))
}
