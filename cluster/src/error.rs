//! Errors of the Raft storage, each naming the operation and what was wrong.

use nvmq_log::LogError;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("raft group {group}: {op}: {source}")]
    Log {
        group: u32,
        op: &'static str,
        #[source]
        source: LogError,
    },
    #[error(
        "raft group {group}: the log acknowledges appends before their flush (flush mode {mode}); \
         a Raft store needs flush = always"
    )]
    RelaxedFlush { group: u32, mode: String },
    #[error("raft group {group}: record at offset {offset} is not a valid raft record: {why}")]
    BadRecord {
        group: u32,
        offset: u64,
        why: String,
    },
    #[error(
        "raft group {group}: asked to drop entries after index {after:?}, below the committed \
         index {committed}; committed entries are never truncated (fatal)"
    )]
    TruncateCommitted {
        group: u32,
        after: Option<u64>,
        committed: u64,
    },
    #[error(
        "raft group {group}: entry {index} does not follow the last entry {last:?} (a hole in \
         the log)"
    )]
    Hole {
        group: u32,
        index: u64,
        last: Option<u64>,
    },
    #[error(
        "raft group {group}: the log's retention freed the group's records below offset {start} \
         and no full state record is retained after it: the vote may be lost, refusing to open"
    )]
    StateLost { group: u32, start: u64 },
    #[error(
        "raft group {group}: entries up to {purged} were purged but no retained snapshot covers \
         them (newest snapshot: {snapshot:?}): the applied state is lost, refusing to open"
    )]
    SnapshotLost {
        group: u32,
        purged: u64,
        snapshot: Option<u64>,
    },
    #[error(
        "raft group {group}: committed through entry {committed} but the log holds entries and \
         snapshots only through {last:?}: entries reported stored are missing, refusing to open"
    )]
    CommittedMissing {
        group: u32,
        committed: u64,
        last: Option<u64>,
    },
    #[error(
        "raft group {group}: replay read nothing at offset {at}, below the durable end \
         {durable_end}: refusing to open with part of the group's records unread"
    )]
    ReplayShort {
        group: u32,
        at: u64,
        durable_end: u64,
    },
    #[error("raft group {group}: {op}: {why}")]
    Encode {
        group: u32,
        op: &'static str,
        why: String,
    },
    /// The node's applier refused a committed entry: its state no longer follows the group.
    #[error("raft group {group}: applying entry {index}: {why}")]
    Apply { group: u32, index: u64, why: String },
    /// The node's applier could not take its bookkeeping for a snapshot, or could not start
    /// from a snapshot's (its devices lack what the snapshot counts).
    #[error(
        "raft group {group}: {op} (entries through {}): {why}",
        index.map_or_else(|| "none".to_string(), |i| i.to_string())
    )]
    Snapshot {
        group: u32,
        op: &'static str,
        index: Option<u64>,
        why: String,
    },
    #[error("raft group {group}: {op}: the log writer stopped before answering")]
    NoAnswer { group: u32, op: &'static str },
    /// The log failed under the group (a write or flush error, a stopped writer, a write it
    /// never answered), or the node's applier refused a committed entry. Records are applied
    /// in memory before they are durable, so the memory may hold what the device does not:
    /// every later operation is refused until the group is reopened from its device.
    #[error(
        "raft group {group}: {op}: refused, the group stopped at a failure during {failed_op} \
         ({why}); what it holds in memory may not be on the device: reopen it from the device"
    )]
    Stopped {
        group: u32,
        op: &'static str,
        failed_op: &'static str,
        why: String,
    },
}

impl From<ClusterError> for std::io::Error {
    fn from(e: ClusterError) -> std::io::Error {
        std::io::Error::other(e)
    }
}
