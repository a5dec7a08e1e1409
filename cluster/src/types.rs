//! The openraft type configuration of an nvmq Raft group.

use std::fmt;

use serde::{Deserialize, Serialize};

openraft::declare_raft_types!(
    /// Standard Raft leader ids (one leader per term, log ids are (term, index)): a term is then
    /// exactly a Kafka leader epoch.
    pub TypeConfig:
        D = Request,
        R = Response,
        LeaderId = openraft::impls::leader_id_std::LeaderId<u64, u64>,
);

pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;

/// What a client writes through a group: opaque bytes (a produce batch, later).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request(pub Vec<u8>);

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request of {} bytes", self.0.len())
    }
}

/// What applying a request answers: the Raft index it was committed at, and the applier's
/// answer (empty without one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    pub index: u64,
    pub answer: Vec<u8>,
}
