//! The records a Raft group writes into its log partition, and their bytes.
//!
//! Every record starts with a magic byte, a format version and a kind. An entry carries its
//! (term, index) in a fixed header so the log can be checked without decoding payloads;
//! membership and snapshot metadata are JSON (openraft's serde derives), the rest is fixed-size
//! little-endian.

use openraft::vote::RaftLeaderId;
use openraft::{EntryPayload, Membership};

use crate::types::{Entry, LogId, Request, SnapshotMeta, Vote};

const MAGIC: u8 = b'R';
const VERSION: u8 = 1;

/// What the group's state is at a point of its log; what retention must never lose.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    pub vote: Option<Vote>,
    pub committed: Option<LogId>,
    pub purged: Option<LogId>,
}

/// One record of a group's partition.
#[derive(Debug, Clone, PartialEq)]
pub enum RaftRecord {
    Entry(Entry),
    Vote(Vote),
    /// Every entry after this log id (all of them for None) is dropped.
    TruncateAfter(Option<LogId>),
    /// Every entry up to and including this log id is dropped; the log starts after it.
    Purge(LogId),
    Committed(Option<LogId>),
    /// A state machine snapshot: its metadata and its bytes.
    Snapshot(SnapshotMeta, Vec<u8>),
    /// The whole [`State`] restated, so that it survives retention freeing older records.
    State(State),
    /// Nothing: a write that only orders (an empty append's completion waits for it).
    Barrier,
}

mod kind {
    pub const ENTRY: u8 = 1;
    pub const VOTE: u8 = 2;
    pub const TRUNCATE_AFTER: u8 = 3;
    pub const PURGE: u8 = 4;
    pub const COMMITTED: u8 = 5;
    pub const SNAPSHOT: u8 = 6;
    pub const STATE: u8 = 7;
    pub const BARRIER: u8 = 8;
}

mod payload {
    pub const BLANK: u8 = 0;
    pub const NORMAL: u8 = 1;
    pub const MEMBERSHIP: u8 = 2;
}

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new_term_index(term, index)
}

fn put_log_id(out: &mut Vec<u8>, id: &LogId) {
    out.extend_from_slice(&id.leader_id.term.to_le_bytes());
    out.extend_from_slice(&id.index.to_le_bytes());
}

fn put_opt_log_id(out: &mut Vec<u8>, id: &Option<LogId>) {
    match id {
        None => out.extend_from_slice(&[0; 17]),
        Some(id) => {
            out.push(1);
            put_log_id(out, id);
        }
    }
}

fn put_opt_vote(out: &mut Vec<u8>, vote: &Option<Vote>) {
    match vote {
        None => out.extend_from_slice(&[0; 18]),
        Some(v) => {
            out.push(1);
            out.extend_from_slice(&v.leader_id.term().to_le_bytes());
            out.extend_from_slice(&v.leader_id.node_id().to_le_bytes());
            out.push(u8::from(v.committed));
        }
    }
}

impl RaftRecord {
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let mut out = vec![MAGIC, VERSION];
        match self {
            RaftRecord::Entry(e) => {
                out.push(kind::ENTRY);
                put_log_id(&mut out, &e.log_id);
                match &e.payload {
                    EntryPayload::Blank => out.push(payload::BLANK),
                    EntryPayload::Normal(r) => {
                        out.push(payload::NORMAL);
                        out.extend_from_slice(&r.0);
                    }
                    EntryPayload::Membership(m) => {
                        out.push(payload::MEMBERSHIP);
                        let json = serde_json::to_vec(&m).map_err(|e| e.to_string())?;
                        out.extend_from_slice(&json);
                    }
                }
            }
            RaftRecord::Vote(v) => {
                out.push(kind::VOTE);
                put_opt_vote(&mut out, &Some(*v));
            }
            RaftRecord::TruncateAfter(id) => {
                out.push(kind::TRUNCATE_AFTER);
                put_opt_log_id(&mut out, id);
            }
            RaftRecord::Purge(id) => {
                out.push(kind::PURGE);
                put_log_id(&mut out, id);
            }
            RaftRecord::Committed(id) => {
                out.push(kind::COMMITTED);
                put_opt_log_id(&mut out, id);
            }
            RaftRecord::Snapshot(meta, data) => {
                out.push(kind::SNAPSHOT);
                let json = serde_json::to_vec(meta).map_err(|e| e.to_string())?;
                let len = u32::try_from(json.len()).map_err(|e| e.to_string())?;
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&json);
                out.extend_from_slice(data);
            }
            RaftRecord::State(s) => {
                out.push(kind::STATE);
                put_opt_vote(&mut out, &s.vote);
                put_opt_log_id(&mut out, &s.committed);
                put_opt_log_id(&mut out, &s.purged);
            }
            RaftRecord::Barrier => out.push(kind::BARRIER),
        }
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<RaftRecord, String> {
        let mut r = Reader { bytes, at: 0 };
        if r.u8()? != MAGIC {
            return Err("bad magic".into());
        }
        let version = r.u8()?;
        if version != VERSION {
            return Err(format!("unknown record version {version}"));
        }
        let rec = match r.u8()? {
            kind::ENTRY => {
                let id = r.log_id()?;
                let payload = match r.u8()? {
                    payload::BLANK => EntryPayload::Blank,
                    payload::NORMAL => EntryPayload::Normal(Request::from(r.rest().to_vec())),
                    payload::MEMBERSHIP => {
                        let m: Membership<u64, openraft::BasicNode> =
                            serde_json::from_slice(r.rest())
                                .map_err(|e| format!("membership: {e}"))?;
                        EntryPayload::Membership(m)
                    }
                    other => return Err(format!("unknown entry payload kind {other}")),
                };
                return Ok(RaftRecord::Entry(Entry {
                    log_id: id,
                    payload,
                }));
            }
            kind::VOTE => match r.opt_vote()? {
                Some(v) => RaftRecord::Vote(v),
                None => return Err("vote record without a vote".into()),
            },
            kind::TRUNCATE_AFTER => RaftRecord::TruncateAfter(r.opt_log_id()?),
            kind::PURGE => RaftRecord::Purge(r.log_id()?),
            kind::COMMITTED => RaftRecord::Committed(r.opt_log_id()?),
            kind::SNAPSHOT => {
                let len = r.u32()? as usize;
                let json = r.take(len)?;
                let meta: SnapshotMeta =
                    serde_json::from_slice(json).map_err(|e| format!("snapshot meta: {e}"))?;
                return Ok(RaftRecord::Snapshot(meta, r.rest().to_vec()));
            }
            kind::STATE => RaftRecord::State(State {
                vote: r.opt_vote()?,
                committed: r.opt_log_id()?,
                purged: r.opt_log_id()?,
            }),
            kind::BARRIER => RaftRecord::Barrier,
            other => return Err(format!("unknown record kind {other}")),
        };
        if r.at != bytes.len() {
            return Err(format!("{} trailing bytes", bytes.len() - r.at));
        }
        Ok(rec)
    }
}

/// Bounds-checked little-endian reads: record bytes come from the device.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(format!("truncated at byte {} (wanted {n} more)", self.at));
        };
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn rest(&mut self) -> &'a [u8] {
        let s = &self.bytes[self.at.min(self.bytes.len())..];
        self.at = self.bytes.len();
        s
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        let mut b = [0; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Result<u64, String> {
        let mut b = [0; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    fn flag(&mut self) -> Result<bool, String> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(format!("flag byte {other} is neither 0 nor 1")),
        }
    }

    fn log_id(&mut self) -> Result<LogId, String> {
        let term = self.u64()?;
        Ok(log_id(term, self.u64()?))
    }

    fn opt_log_id(&mut self) -> Result<Option<LogId>, String> {
        let some = self.flag()?;
        let id = self.log_id()?;
        Ok(some.then_some(id))
    }

    fn opt_vote(&mut self) -> Result<Option<Vote>, String> {
        let some = self.flag()?;
        let term = self.u64()?;
        let node = self.u64()?;
        let committed = self.flag()?;
        if !some {
            return Ok(None);
        }
        Ok(Some(if committed {
            Vote::new_committed(term, node)
        } else {
            Vote::new(term, node)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn roundtrip(r: RaftRecord) {
        let bytes = r.encode().unwrap_or_default();
        assert_eq!(RaftRecord::decode(&bytes), Ok(r));
    }

    #[test]
    fn every_kind_reads_back_as_written() {
        let nodes: BTreeMap<u64, openraft::BasicNode> = [
            (1, openraft::BasicNode::new("a:1")),
            (2, Default::default()),
        ]
        .into();
        let m = Membership::new(vec![BTreeSet::from([1, 2])], nodes).unwrap_or_default();
        roundtrip(RaftRecord::Entry(Entry {
            log_id: log_id(3, 7),
            payload: EntryPayload::Normal(Request::from(b"hello".to_vec())),
        }));
        roundtrip(RaftRecord::Entry(Entry {
            log_id: log_id(3, 8),
            payload: EntryPayload::Blank,
        }));
        roundtrip(RaftRecord::Entry(Entry {
            log_id: log_id(4, 9),
            payload: EntryPayload::Membership(m.clone()),
        }));
        roundtrip(RaftRecord::Vote(Vote::new(5, 2)));
        roundtrip(RaftRecord::Vote(Vote::new_committed(6, 1)));
        roundtrip(RaftRecord::TruncateAfter(None));
        roundtrip(RaftRecord::TruncateAfter(Some(log_id(2, 4))));
        roundtrip(RaftRecord::Purge(log_id(1, 3)));
        roundtrip(RaftRecord::Committed(Some(log_id(1, 3))));
        let meta = SnapshotMeta {
            last_log_id: Some(log_id(4, 9)),
            last_membership: openraft::StoredMembership::new(Some(log_id(4, 9)), m),
        };
        roundtrip(RaftRecord::Snapshot(meta, b"state".to_vec()));
        roundtrip(RaftRecord::State(State {
            vote: Some(Vote::new_committed(6, 1)),
            committed: Some(log_id(6, 10)),
            purged: None,
        }));
        roundtrip(RaftRecord::Barrier);
    }

    #[test]
    fn damaged_bytes_are_refused_with_a_reason_never_a_panic() {
        let good = RaftRecord::Vote(Vote::new(5, 2))
            .encode()
            .unwrap_or_default();
        for cut in 0..good.len() {
            assert!(RaftRecord::decode(&good[..cut]).is_err(), "prefix {cut}");
        }
        let mut bad = good.clone();
        bad[2] = 99;
        let err = RaftRecord::decode(&bad).err().unwrap_or_default();
        assert!(err.contains("unknown record kind 99"), "{err}");
        let mut flag = good;
        flag[3] = 7;
        assert!(RaftRecord::decode(&flag).is_err());
    }
}
