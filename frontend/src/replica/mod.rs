//! A broker that is one node of a cluster (issue 13, docs/cluster.md "Running a cluster"): its
//! Kafka partitions are replicated through one Raft group over the nodes' own logs.
//!
//! The leader checks a Produce's batches as a single broker does and writes each one through
//! the group; every node applies the committed batches, in the group's order, to its own
//! partitions (`applier`), so offsets are assigned at apply and are the same on every node,
//! and a partition holds only committed records. A Produce is answered once its batch is
//! applied on the leader, that is committed: durable on a majority of the nodes' devices.
//! Topic creation goes through the group too. Followers refuse Produce and Fetch with
//! NOT_LEADER_OR_FOLLOWER; Metadata names every node, the leader, the voters and those in
//! sync; the leader epoch is the Raft term.

mod applier;
pub mod command;
mod compact;
pub mod forward;
mod propose;
pub mod quorum;
mod settle;
mod start;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use nvmq_cluster::net::{GroupRaft, Node};
use nvmq_cluster::openraft::async_runtime::WatchReceiver;
use nvmq_cluster::openraft::ServerState;

pub use command::{Answer, Command};
pub use quorum::{QuorumStatus, VoterStatus};
pub use start::start;

/// Whether a node of a cluster serves `api`. Left out: the requests that change state the
/// group does not carry yet (topic deletion and growth, topic configs, log start offsets, ACLs,
/// SCRAM credentials), which would make the nodes differ; and the idempotent producers' ids
/// (their sequence state is not replicated). Consumer groups are served by the node asked,
/// kept on that node only.
pub fn served(api: kafka_protocol::messages::ApiKey) -> bool {
    use kafka_protocol::messages::ApiKey::*;
    !matches!(
        api,
        DeleteTopics
            | CreatePartitions
            | AlterConfigs
            | IncrementalAlterConfigs
            | DeleteRecords
            | CreateAcls
            | DeleteAcls
            | AlterUserScramCredentials
            | InitProducerId
    )
}

/// Whether `api` is served by a node of a cluster only (and so left out of a single broker's
/// ApiVersions): DescribeQuorum, which describes the Raft group.
pub fn cluster_only(api: kafka_protocol::messages::ApiKey) -> bool {
    api == kafka_protocol::messages::ApiKey::DescribeQuorum
}

/// A voter is in sync when its log matches the leader's up to the committed index (Metadata's
/// ISR, `cluster status`).
fn in_sync(matched: Option<u64>, committed: Option<u64>) -> bool {
    matched >= committed
}

/// The one Raft group that carries every Kafka partition of the cluster (partition sets are
/// the plan, docs/cluster.md).
pub const GROUP: u32 = 1;

/// How a broker joins a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterOptions {
    /// This node's id: a key of `members`.
    pub node_id: u64,
    /// Every node of the cluster, this one included.
    pub members: BTreeMap<u64, MemberAddrs>,
    /// Entries the group's log keeps past what every voter holds before the nodes snapshot and
    /// purge (0: never purge, the log grows without bound).
    pub compact_every: u64,
    /// The most commands the leader writes as one entry (`propose`); 1: each its own.
    pub merge_commands: usize,
}

/// The default of `ClusterOptions::compact_every`.
pub const COMPACT_EVERY: u64 = 4096;

/// The default of `ClusterOptions::merge_commands`.
pub const MERGE_COMMANDS: usize = 1024;

/// A node's two addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberAddrs {
    /// host:port Kafka clients reach it at (Metadata advertises it).
    pub kafka: String,
    /// host:port the nodes' Raft traffic goes to.
    pub internal: String,
}

/// Why a write through the group did not apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    #[error("this node does not lead the cluster (the leader is {leader:?})")]
    NotLeader { leader: Option<u64> },
    #[error("replicating the write failed: {0}")]
    Failed(String),
}

/// Who leads, in which term, and who holds what (from the group's metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    pub node_id: u64,
    pub leader: Option<u64>,
    /// The Raft term: every partition's leader epoch.
    pub term: u64,
    pub voters: Vec<u64>,
    /// Voters whose log matches the leader's up to the committed index (all voters when this
    /// node does not lead: it cannot tell).
    pub in_sync: Vec<u64>,
}

/// This node's part in the cluster.
pub struct Replica {
    opts: ClusterOptions,
    raft: GroupRaft,
    /// Where each voter stands (on the leader).
    quorum: Arc<quorum::Quorum>,
    /// The queue that merges commands into entries.
    proposer: propose::Proposer,
    /// The transport; taken at stop.
    node: Mutex<Option<Node>>,
    /// The runtime the group and the transport run on; taken at stop.
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

impl Replica {
    pub fn node_id(&self) -> u64 {
        self.opts.node_id
    }

    pub fn members(&self) -> &BTreeMap<u64, MemberAddrs> {
        &self.opts.members
    }

    pub fn raft(&self) -> &GroupRaft {
        &self.raft
    }

    pub fn view(&self) -> View {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        let voters: Vec<u64> = m.membership_config.voter_ids().collect();
        let in_sync = match (&m.replication, m.state == ServerState::Leader) {
            (Some(rep), true) => {
                let committed = m.cluster_committed.map(|c| c.index);
                voters
                    .iter()
                    .copied()
                    .filter(|v| {
                        *v == self.opts.node_id
                            || rep
                                .get(v)
                                .is_some_and(|l| in_sync(l.map(|l| l.index), committed))
                    })
                    .collect()
            }
            _ => voters.clone(),
        };
        View {
            node_id: self.opts.node_id,
            leader: m.current_leader,
            term: m.current_term,
            voters,
            in_sync,
        }
    }

    /// The group as this node sees it; the voters' figures only on the leader.
    pub fn quorum_status(&self) -> QuorumStatus {
        let (entries, commands) = self.proposer.proposed();
        QuorumStatus {
            proposed_entries: entries,
            proposed_commands: commands,
            ..self.quorum.status(self.opts.node_id, &self.raft)
        }
    }

    pub fn is_leader(&self) -> bool {
        self.leader_term().is_some()
    }

    /// The term while this node leads (every partition's leader epoch), else None: read on
    /// every partition of a Fetch, so without `view`'s lists.
    pub fn leader_term(&self) -> Option<u64> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        (m.state == ServerState::Leader).then_some(m.current_term)
    }

    /// Queues `cmd` for the group's log now (so that commands submitted one after another are
    /// applied in that order; `propose` may write several as one entry) and returns what waits
    /// for its answer: the command applied on this node, after a majority had it durable.
    pub fn submit(
        &self,
        cmd: &Command,
    ) -> Result<impl Future<Output = Result<Answer, WriteError>> + Send + 'static, WriteError> {
        self.submit_encoded(cmd.encode())
    }

    /// `submit` of a command already encoded (`command::encode_produce`).
    pub fn submit_encoded(
        &self,
        command: Vec<u8>,
    ) -> Result<impl Future<Output = Result<Answer, WriteError>> + Send + 'static, WriteError> {
        if !self.is_leader() {
            return Err(WriteError::NotLeader {
                leader: self.view().leader,
            });
        }
        let answer = self.proposer.submit(command);
        Ok(async move {
            answer.await.unwrap_or_else(|_| {
                Err(WriteError::Failed(
                    "the group stopped before answering".into(),
                ))
            })
        })
    }

    /// Submits `cmd` and waits for its answer.
    pub async fn write(&self, cmd: &Command) -> Result<Answer, WriteError> {
        self.submit(cmd)?.await
    }

    /// Stops the transport and the group (their runtime ends in the background: the caller may
    /// be inside another runtime).
    pub fn stop(&self) {
        let node = self.node.lock().unwrap_or_else(|p| p.into_inner()).take();
        let rt = self
            .runtime
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(rt) = rt {
            if let Some(node) = node {
                let stopped = std::thread::scope(|s| s.spawn(|| rt.block_on(node.stop())).join());
                if let Ok(Err(e)) = stopped {
                    tracing::warn!(error = %e, "stopping the cluster node");
                }
            }
            rt.shutdown_background();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.stop();
    }
}
