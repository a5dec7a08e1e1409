//! nvmq's Raft groups: openraft's storage traits implemented on nvmq's own log, so that one
//! device flush covers a record and its Raft entry (docs/cluster.md, storage.md §8).
//!
//! A group's entries, votes, truncations, purges, commit marks and snapshots are records of one
//! log partition (`__nvmq_raft`, index = group id), replayed in log order at open.
#![forbid(unsafe_code)]

mod apply;
mod error;
mod log_store;
pub mod net;
pub mod record;
pub mod replay;
mod state_machine;
mod store;
mod types;

pub use apply::{Applier, ApplyResult, Capture, Restore, Settled};
pub use error::ClusterError;
pub use log_store::{LogReader, LogStore};
/// The pinned openraft, for the crates that drive a group.
pub use openraft;
pub use state_machine::{Applied, Builder, StateMachine};
pub use store::{open_applied_group, open_group, GroupLog, RAFT_TOPIC};
pub use types::{Entry, LogId, Request, Response, SnapshotMeta, TypeConfig, Vote};
