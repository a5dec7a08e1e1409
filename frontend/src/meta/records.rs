//! The records nvmq keeps in its internal partitions, as values: what each says, and how a
//! group's commits are cut into records that fit. Their bytes are `codec`'s.

use crate::sasl::{ScramCredential, ScramMechanism};

/// One committed offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
}

/// A batch of an idempotent producer as the log holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredBatch {
    pub first_seq: i32,
    pub last_seq: i32,
    /// Its first offset in the partition.
    pub offset: u64,
}

/// One idempotent producer's state in one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerSnap {
    pub id: i64,
    pub epoch: i16,
    /// Wall-clock milliseconds when its last batch was taken (for producer-id expiry).
    pub last_seen_ms: i64,
    /// Its newest batches (at most `producers::REMEMBERED`), oldest first.
    pub batches: Vec<StoredBatch>,
}

/// Part `part` of `parts` of a snapshot of the idempotent producers of data partition
/// `partition`: their state as a replay of the partition's records below `through` builds it
/// (see `producer_snapshots`). The parts of one snapshot are consecutive records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerStatePart {
    pub partition: u32,
    pub through: u64,
    pub part: u32,
    pub parts: u32,
    pub producers: Vec<ProducerSnap>,
}

/// Most batches one producer's snapshot may hold (Kafka's window of 5).
pub const MAX_SNAP_BATCHES: usize = 5;

/// Encoded bytes of one producer in a `ProducerState` record at most.
pub const PRODUCER_SNAP_MAX_LEN: usize = 8 + 2 + 8 + 1 + MAX_SNAP_BATCHES * 16;

/// Encoded bytes of a `ProducerState` record without its producers.
pub const PRODUCER_STATE_HEADER_LEN: usize = 1 + 4 + 8 + 4 + 4 + 4;

/// What every part of a time index snapshot repeats: the index's state but for its samples
/// (see `time_index::Times`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimesHead {
    /// The offsets indexed: [from, to).
    pub from: u64,
    pub to: u64,
    /// The largest timestamp below `to`.
    pub running: i64,
    /// The largest timestamp and the base offset of the batch holding it.
    pub max: Option<(i64, u64)>,
    /// Payload bytes indexed since the last sample.
    pub since_sample: u64,
}

/// Part `part` of `parts` of a snapshot of data partition `partition`'s time index: its samples
/// (batch base offset, largest timestamp below it), in order, split over consecutive records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeIndexPart {
    pub partition: u32,
    pub head: TimesHead,
    pub part: u32,
    pub parts: u32,
    pub samples: Vec<(u64, i64)>,
}

/// Encoded bytes of a `TimeIndex` record without its samples (at most), and of one sample.
pub const TIME_INDEX_HEADER_LEN: usize = 1 + 4 + 8 + 8 + 8 + 1 + 16 + 8 + 4 + 4 + 4;
pub const TIME_SAMPLE_LEN: usize = 16;

/// A user's SCRAM credential for one mechanism: salt, iterations and the two keys, never the
/// password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialRecord {
    pub user: String,
    pub mechanism: ScramMechanism,
    pub credential: ScramCredential,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaRecord {
    /// The topic is deleted: a topic of that name created later is `incarnation` (the count of
    /// deletions so far, so that re-recording it in a snapshot changes nothing).
    DeleteTopic { name: String, incarnation: u32 },
    /// Producer ids up to this one are handed out.
    ProducerId { id: i64 },
    /// The group completed a rebalance to this generation (the highest recorded counts).
    Generation { group: String, generation: i32 },
    /// Offsets a group committed in one request.
    Commits { group: String, commits: Vec<Commit> },
    /// Part of a snapshot of a data partition's idempotent producers.
    ProducerState(ProducerStatePart),
    /// Part of a snapshot of a data partition's time index (ListOffsets by timestamp).
    TimeIndex(TimeIndexPart),
    /// An ACL binding was created (CreateAcls; re-recorded by every snapshot).
    AclAdded(crate::acl::Binding),
    /// An ACL binding was deleted (DeleteAcls).
    AclRemoved(crate::acl::Binding),
    /// A user's credential is set (replacing the one for that mechanism).
    Credential(CredentialRecord),
    /// A user's credential for that mechanism is removed.
    CredentialRemoved {
        user: String,
        mechanism: ScramMechanism,
    },
    /// Every config set on a topic (those not named are at their defaults), for the topic's
    /// incarnation (its deletions so far): a later incarnation starts from defaults.
    TopicConfig {
        name: String,
        incarnation: u32,
        configs: Vec<(String, String)>,
    },
    /// Data partition `partition` (of the device whose `__nvmq_meta` holds it) serves nothing
    /// below `start` (DeleteRecords, retention): its log start offset.
    LogStart { partition: u32, start: u64 },
    /// The group is deleted (DeleteGroups, or expired empty): its offsets committed before this
    /// record are gone. In `__consumer_offsets`, ordered with the commits it cancels.
    GroupDeleted { group: String },
    /// These committed offsets of the group are deleted (OffsetDelete).
    OffsetsDeleted {
        group: String,
        partitions: Vec<(String, i32)>,
    },
}

impl Commit {
    /// Bytes it takes in a `Commits` record.
    pub fn encoded_len(&self) -> usize {
        let s = |v: &str| 2 + v.len().min(usize::from(u16::MAX));
        s(&self.topic) + 4 + 8 + 4 + 1 + self.metadata.as_deref().map_or(0, s)
    }
}

/// A group's commits in `Commits` records of at most `max_payload` bytes each, cut by their
/// encoded size (commit metadata may take up to 4 KiB each). A commit that does not fit a record
/// alone goes in one of its own, to fail there rather than take the others with it; one that a
/// log took once always fits again.
pub fn commits_records(group: &str, commits: Vec<Commit>, max_payload: usize) -> Vec<MetaRecord> {
    let head = 1 + 2 + group.len().min(usize::from(u16::MAX)) + 4;
    let mut out = Vec::new();
    let mut chunk: Vec<Commit> = Vec::new();
    let mut size = head;
    for c in commits {
        let len = c.encoded_len();
        if !chunk.is_empty() && size + len > max_payload {
            out.push(MetaRecord::Commits {
                group: group.to_string(),
                commits: std::mem::take(&mut chunk),
            });
            size = head;
        }
        size += len;
        chunk.push(c);
    }
    if !chunk.is_empty() {
        out.push(MetaRecord::Commits {
            group: group.to_string(),
            commits: chunk,
        });
    }
    out
}
