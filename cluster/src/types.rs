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

/// What a client writes through a group: opaque bytes (a produce batch). Shared rather than
/// owned: openraft and the log store clone entries (for each follower's replication, for
/// readers), and a clone is then a reference count, not a copy of the batch. A byte string to
/// serde: postcard writes it as it would a `Vec<u8>` (a length, then the bytes) and reads it in
/// one copy rather than a byte at a time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request(pub bytes::Bytes);

impl From<Vec<u8>> for Request {
    fn from(v: Vec<u8>) -> Request {
        Request(v.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transport's frames and every node's decoding rely on it: a request's bytes on the
    /// wire are what a plain `Vec<u8>` gave (nodes of the previous build read them alike).
    #[test]
    fn a_request_and_an_answer_encode_as_plain_byte_vectors_do() {
        let v: Vec<u8> = (0..300u32).map(|i| (i % 251) as u8).collect();
        let plain = postcard::to_allocvec(&v).unwrap_or_default();
        let req = postcard::to_allocvec(&Request::from(v.clone())).unwrap_or_default();
        assert_eq!(req, plain);
        let back: Result<Request, _> = postcard::from_bytes(&plain);
        assert_eq!(back.ok(), Some(Request::from(v.clone())));
        #[derive(Serialize)]
        struct Plain {
            index: u64,
            answer: Vec<u8>,
        }
        let answer = Response {
            index: 7,
            answer: v.clone(),
        };
        let plain = Plain {
            index: 7,
            answer: v,
        };
        assert_eq!(
            postcard::to_allocvec(&answer).ok(),
            postcard::to_allocvec(&plain).ok()
        );
    }
}

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
    #[serde(with = "serde_bytes")]
    pub answer: Vec<u8>,
}
