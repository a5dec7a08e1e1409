//! A group's handle on the log: writes its records in order and replays them at open.

use std::sync::{Arc, Mutex, MutexGuard};

use nvmq_log::{AckFn, FlushMode, Log, LogError};
use tokio::sync::oneshot;

use crate::error::ClusterError;
use crate::log_store::LogStore;
use crate::record::RaftRecord;
use crate::replay::GroupState;
use crate::state_machine::StateMachine;

/// The topic whose partition `g` holds Raft group `g`'s records.
pub const RAFT_TOPIC: &str = "__nvmq_raft";

/// Payload bytes read per call while replaying.
const REPLAY_READ: usize = 1 << 20;

/// One group's records in the log, and the state they build, shared by its log store, its
/// readers and its state machine.
#[derive(Clone)]
pub struct GroupLog {
    log: Arc<Log>,
    group: u32,
    partition: u32,
    state: Arc<Mutex<GroupState>>,
}

impl GroupLog {
    pub fn group(&self) -> u32 {
        self.group
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, GroupState> {
        // A poisoned lock means a panic while it was held; the state is still what the records
        // built, as `apply` does not panic between its steps.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn shared_state(&self) -> Arc<Mutex<GroupState>> {
        self.state.clone()
    }

    fn log_err(&self, op: &'static str) -> impl FnOnce(LogError) -> ClusterError {
        let group = self.group;
        move |source| ClusterError::Log { group, op, source }
    }

    fn encode(&self, rec: &RaftRecord, op: &'static str) -> Result<Vec<u8>, ClusterError> {
        rec.encode().map_err(|why| ClusterError::Encode {
            group: self.group,
            op,
            why,
        })
    }

    /// Checks `rec`, applies it to the in-memory state (readers see it at once) and queues it
    /// to the log; `ack` runs once it is durable. Both happen under the state lock, so the log
    /// holds records in the order they were applied.
    pub(crate) fn write(
        &self,
        rec: RaftRecord,
        op: &'static str,
        ack: AckFn,
    ) -> Result<(), ClusterError> {
        let bytes = self.encode(&rec, op)?;
        let mut st = self.state();
        st.check(&rec)?;
        self.log
            .append(self.partition, bytes, ack)
            .map_err(self.log_err(op))?;
        st.apply(rec);
        Ok(())
    }

    /// [`GroupLog::write`], returning only once the record is durable (below D).
    pub(crate) async fn write_durable(
        &self,
        rec: RaftRecord,
        op: &'static str,
    ) -> Result<(), ClusterError> {
        let (tx, rx) = oneshot::channel();
        self.write(
            rec,
            op,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )?;
        match rx.await {
            Ok(r) => r.map(|_| ()).map_err(self.log_err(op)),
            Err(_) => Err(ClusterError::NoAnswer {
                group: self.group,
                op,
            }),
        }
    }

    /// Restates, durably and in one run of records, everything a replay needs: the newest
    /// snapshot, the state (vote, commit, purge point) and every live entry. The log frees its
    /// oldest data when the ring is full; a checkpoint every quarter ring (`checkpoint_due`)
    /// keeps a whole copy inside what is retained. Replaying it again changes nothing: entries
    /// re-recorded in order rebuild the same log.
    pub async fn checkpoint(&self) -> Result<(), ClusterError> {
        let op = "checkpoint";
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.state();
            let mut recs = Vec::with_capacity(st.entries.len() + 2);
            if let Some((meta, data)) = st.snapshot.clone() {
                recs.push(RaftRecord::Snapshot(meta, data));
            }
            recs.push(RaftRecord::State(st.state()));
            recs.extend(st.entries.values().cloned().map(RaftRecord::Entry));
            let mut tx = Some(tx);
            let last = recs.len() - 1;
            // Queued under the state lock: no other record of the group lands in between.
            for (i, rec) in recs.into_iter().enumerate() {
                let bytes = self.encode(&rec, op)?;
                let tx = if i == last { tx.take() } else { None };
                let ack: AckFn = Box::new(move |r| {
                    if let Some(tx) = tx {
                        let _ = tx.send(r);
                    }
                });
                self.log
                    .append(self.partition, bytes, ack)
                    .map_err(self.log_err(op))?;
                st.apply(rec);
            }
            st.checkpointed_at = Some(self.log.durable());
        }
        match rx.await {
            Ok(r) => r.map(|_| ()).map_err(self.log_err(op)),
            Err(_) => Err(ClusterError::NoAnswer {
                group: self.group,
                op,
            }),
        }
    }

    /// Checkpoints when the log has grown by `every` bytes (a quarter of the ring) since the
    /// last checkpoint of this group (or it never had one since open). Returns whether it did.
    pub async fn checkpoint_due(&self, every: u64) -> Result<bool, ClusterError> {
        let at = self.state().checkpointed_at;
        let due = at.is_none_or(|a| self.log.durable().saturating_sub(a) >= every);
        if due {
            self.checkpoint().await?;
        }
        Ok(due)
    }

    /// A copy of the group's state as its records built it (tests and diagnostics).
    pub fn current(&self) -> GroupState {
        self.state().clone()
    }
}

/// Opens Raft group `group` on `log`: creates its partition on first use, replays its records
/// and returns its log store and state machine. Refuses a log that acknowledges appends before
/// their flush, since Raft counts this node's flush toward the quorum.
pub fn open_group(log: Arc<Log>, group: u32) -> Result<(LogStore, StateMachine), ClusterError> {
    let mode = log.flush_mode();
    if mode != FlushMode::Always {
        return Err(ClusterError::RelaxedFlush {
            group,
            mode: format!("{mode:?}"),
        });
    }
    let log_err = |op| move |source| ClusterError::Log { group, op, source };
    let partition = match log.partition_id(RAFT_TOPIC, group) {
        Some(p) => p,
        None => log
            .create_partition(RAFT_TOPIC, group)
            .map_err(log_err("create the group's partition"))?,
    };
    let view = log.partition(partition).ok_or(ClusterError::Log {
        group,
        op: "look up the group's partition",
        source: LogError::UnknownPartition(partition),
    })?;
    let mut records = Vec::new();
    let mut next = view.start_offset;
    while next < view.durable_end {
        let batch = log
            .read(partition, next, REPLAY_READ)
            .map_err(log_err("replay the group's records"))?;
        let Some(last) = batch.last() else {
            return Err(ClusterError::ReplayShort {
                group,
                at: next,
                durable_end: view.durable_end,
            });
        };
        next = last.offset + u64::from(last.span.max(1));
        records.extend(batch.into_iter().map(|r| (r.offset, r.payload)));
    }
    let state = GroupState::replay(
        group,
        view.start_offset,
        records.iter().map(|(o, b)| (*o, b.as_ref())),
    )?;
    let handle = GroupLog {
        log,
        group,
        partition,
        state: Arc::new(Mutex::new(state)),
    };
    let sm = StateMachine::open(handle.clone())?;
    Ok((LogStore::new(handle), sm))
}
