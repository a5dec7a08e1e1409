//! openraft's `RaftLogStorage` and `RaftLogReader` over a group's records (storage.md §8).
//!
//! Every call, reads included, is refused with `ClusterError::Stopped` once the log failed
//! under the group: the memory may then hold records the device does not, and openraft takes
//! the error as fatal and stops the node.

use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::sync::Arc;

use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};

use crate::error::ClusterError;
use crate::record::RaftRecord;
use crate::store::{GroupLog, Shared};
use crate::types::{Entry, LogId, TypeConfig, Vote};

/// The log half of a group's storage: what RaftCore writes through.
pub struct LogStore {
    group: GroupLog,
}

/// A reader of a group's entries and vote; sees every entry as soon as `append` returns.
#[derive(Clone)]
pub struct LogReader {
    shared: Arc<Shared>,
}

impl LogStore {
    pub(crate) fn new(group: GroupLog) -> LogStore {
        LogStore { group }
    }

    /// The group's log handle (for `checkpoint`, and tests).
    pub fn group_log(&self) -> &GroupLog {
        &self.group
    }
}

/// The one read path of both the store and its readers.
fn read_entries(shared: &Shared, range: impl RangeBounds<u64>) -> Result<Vec<Entry>, io::Error> {
    let st = shared.state("read entries")?;
    Ok(st.entries.range(range).map(|(_, e)| e.clone()).collect())
}

fn read_vote(shared: &Shared) -> Result<Option<Vote>, io::Error> {
    Ok(shared.state("read vote")?.vote)
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        read_entries(&self.shared, range)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        read_vote(&self.shared)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        read_entries(&self.group.shared(), range)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        read_vote(&self.group.shared())
    }
}

/// The ack that completes an append's `callback`: a log failure is reported as the group's.
fn completion(group: u32, op: &'static str, callback: IOFlushed<TypeConfig>) -> nvmq_log::AckFn {
    Box::new(move |r| {
        let r = r
            .map(|_| ())
            .map_err(|source| ClusterError::Log { group, op, source });
        callback.io_completed(r.map_err(io::Error::from));
    })
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let st = self.group.state("get log state")?;
        Ok(LogState {
            last_purged_log_id: st.purged,
            last_log_id: st.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> LogReader {
        LogReader {
            shared: self.group.shared(),
        }
    }

    /// Returns only once the vote is below D: a vote is granted and a term acted on only after
    /// that (storage.md §8).
    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        Ok(self
            .group
            .write_durable(RaftRecord::Vote(*vote), "save vote")
            .await?)
    }

    /// A hint for re-applying after a restart: committed entries are in the log either way, so
    /// it does not wait for its flush (the next durable write covers it).
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        Ok(self.group.write(
            RaftRecord::Committed(committed),
            "save committed",
            Box::new(|_| {}),
        )?)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.group.state("read committed")?.committed)
    }

    /// Entries are readable when this returns; `callback` fires from the log writer once the
    /// last of them is durable. The log acknowledges in log order and only below D, so that one
    /// completion covers these entries and every earlier write (openraft's watermark).
    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut entries = entries.into_iter().peekable();
        if entries.peek().is_none() {
            // Nothing to store, but the completion must still mean "everything before is
            // durable": a barrier record's ack says exactly that.
            let op = "append (empty)";
            let done = completion(self.group.group(), op, callback);
            return Ok(self.group.write(RaftRecord::Barrier, op, done)?);
        }
        let mut callback = Some(callback);
        while let Some(e) = entries.next() {
            // Only the last entry's ack completes the callback: the log acks in order.
            let last = entries.peek().is_none();
            let ack = match callback.take_if(|_| last) {
                Some(cb) => completion(self.group.group(), "append", cb),
                None => Box::new(|_| {}),
            };
            self.group.write(RaftRecord::Entry(e), "append", ack)?;
        }
        Ok(())
    }

    /// Durable before it returns: the truncate record is in the log, after the entries it
    /// drops, so any recovery that keeps an entry written after it keeps it too, and the dropped
    /// entries are dead for every later replay. Refused (fatal) below the committed index.
    async fn truncate_after(&mut self, last: Option<LogId>) -> Result<(), io::Error> {
        Ok(self
            .group
            .write_durable(RaftRecord::TruncateAfter(last), "truncate")
            .await?)
    }

    /// Durable before it returns, so the log start never moves back.
    async fn purge(&mut self, upto: LogId) -> Result<(), io::Error> {
        Ok(self
            .group
            .write_durable(RaftRecord::Purge(upto), "purge")
            .await?)
    }
}
