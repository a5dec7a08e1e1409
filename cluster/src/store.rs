//! A group's handle on the log: writes its records in order and replays them at open.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use nvmq_log::{AckFn, Appended, FlushMode, Log, LogError};
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

/// Locks `m`, taking over the value a panicking holder left: every holder in this crate
/// changes its value only in steps that cannot stop halfway (`GroupState::apply`, a whole
/// `Applied` replaced or one field set), so the value is still one the records built.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a group's log store, readers and state machine share: the state its records built,
/// and the first failure of the log under it.
pub(crate) struct Shared {
    group: u32,
    state: Mutex<GroupState>,
    /// The operation whose write failed, and why. Records are applied in memory before they
    /// are durable, so after a failure the memory may hold what the device never will: from
    /// then on every operation is refused. Outside the state's lock because the writer thread
    /// sets it from an ack, while a writer of the group may hold that lock waiting for room in
    /// the log's queue.
    failed: OnceLock<(&'static str, String)>,
}

impl Shared {
    /// The group's state for `op`, unless the log failed under the group.
    pub(crate) fn state(
        &self,
        op: &'static str,
    ) -> Result<MutexGuard<'_, GroupState>, ClusterError> {
        let st = lock(&self.state);
        self.healthy(op)?;
        Ok(st)
    }

    /// Refuses `op` once the log failed under the group.
    pub(crate) fn healthy(&self, op: &'static str) -> Result<(), ClusterError> {
        match self.failed.get() {
            None => Ok(()),
            Some((failed_op, why)) => Err(ClusterError::Stopped {
                group: self.group,
                op,
                failed_op,
                why: why.clone(),
            }),
        }
    }

    /// Records the first failure; later ones add nothing (the group is stopped already).
    fn fail(&self, op: &'static str, why: String) {
        if self.failed.set((op, why.clone())).is_ok() {
            tracing::error!(group = self.group, op, error = %why,
                "raft group stopped: every later operation is refused");
        }
    }
}

/// An ack that stops the group if the log answers its write with an error, or drops it
/// without an answer (then nothing says whether the write is durable).
struct Watched {
    shared: Arc<Shared>,
    op: &'static str,
    ack: Option<AckFn>,
}

impl Watched {
    fn boxed(shared: Arc<Shared>, op: &'static str, ack: AckFn) -> AckFn {
        let mut w = Watched {
            shared,
            op,
            ack: Some(ack),
        };
        Box::new(move |r: Result<Appended, LogError>| {
            if let Err(e) = &r {
                w.shared.fail(w.op, e.to_string());
            }
            if let Some(ack) = w.ack.take() {
                ack(r);
            }
        })
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if self.ack.is_some() {
            self.shared.fail(
                self.op,
                "the log dropped the write without answering".into(),
            );
        }
    }
}

/// One group's records in the log, and the state they build, shared by its log store, its
/// readers and its state machine.
#[derive(Clone)]
pub struct GroupLog {
    log: Arc<Log>,
    group: u32,
    partition: u32,
    shared: Arc<Shared>,
}

impl GroupLog {
    pub fn group(&self) -> u32 {
        self.group
    }

    /// The group's state for `op`; refused once the log failed under the group.
    pub(crate) fn state(
        &self,
        op: &'static str,
    ) -> Result<MutexGuard<'_, GroupState>, ClusterError> {
        self.shared.state(op)
    }

    /// Refuses `op` once the log failed under the group.
    pub(crate) fn healthy(&self, op: &'static str) -> Result<(), ClusterError> {
        self.shared.healthy(op)
    }

    /// Stops the group for a failure outside the log (the applier's).
    pub(crate) fn stop(&self, op: &'static str, why: String) {
        self.shared.fail(op, why);
    }

    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    fn log_err(&self, op: &'static str) -> impl FnOnce(LogError) -> ClusterError {
        let group = self.group;
        move |source| ClusterError::Log { group, op, source }
    }

    /// Queues `rec` to the log and applies it to `st` (readers see it at once); `ack` runs once
    /// it is durable. Called under the state lock, so the log holds records in the order they
    /// were applied. Any log error stops the group.
    fn queue(
        &self,
        st: &mut GroupState,
        rec: RaftRecord,
        op: &'static str,
        ack: AckFn,
    ) -> Result<u64, ClusterError> {
        let bytes = rec.encode().map_err(|why| ClusterError::Encode {
            group: self.group,
            op,
            why,
        })?;
        let len = bytes.len() as u64;
        let ack = Watched::boxed(self.shared.clone(), op, ack);
        if let Err(e) = self.log.append(self.partition, bytes, ack) {
            self.shared.fail(op, e.to_string());
            return Err(self.log_err(op)(e));
        }
        st.apply(rec);
        Ok(len)
    }

    /// Checks `rec`, applies it to the in-memory state and queues it to the log; `ack` runs
    /// once it is durable.
    pub(crate) fn write(
        &self,
        rec: RaftRecord,
        op: &'static str,
        ack: AckFn,
    ) -> Result<(), ClusterError> {
        let mut st = self.state(op)?;
        st.check(&rec)?;
        self.queue(&mut st, rec, op, ack).map(|_| ())
    }

    /// Waits for the ack of a write; a dropped ack stopped the group already (`Watched`).
    async fn durable(
        &self,
        op: &'static str,
        rx: oneshot::Receiver<Result<Appended, LogError>>,
    ) -> Result<(), ClusterError> {
        match rx.await {
            Ok(r) => r.map(|_| ()).map_err(self.log_err(op)),
            Err(_) => Err(ClusterError::NoAnswer {
                group: self.group,
                op,
            }),
        }
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
        self.durable(op, rx).await
    }

    /// Restates, durably and in one run of records, everything a replay needs: the newest
    /// snapshot, the state (vote, commit, purge point) and every live entry. The log frees its
    /// oldest data when the ring is full; a checkpoint every quarter ring (`checkpoint_due`)
    /// keeps a whole copy inside what is retained. Replaying it again changes nothing: entries
    /// re-recorded in order rebuild the same log.
    pub async fn checkpoint(&self) -> Result<(), ClusterError> {
        let op = "checkpoint";
        let (tx, rx) = oneshot::channel();
        let mut written = 0u64;
        {
            let mut st = self.state(op)?;
            // Entries share their request bytes: these clones copy no batch.
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
                let tx = if i == last { tx.take() } else { None };
                let ack: AckFn = Box::new(move |r| {
                    if let Some(tx) = tx {
                        let _ = tx.send(r);
                    }
                });
                written += self.queue(&mut st, rec, op, ack)?;
            }
        }
        self.durable(op, rx).await?;
        // Measured from where the checkpoint ends, so that its own bytes do not count toward
        // the next one.
        let mut st = self.state(op)?;
        st.checkpointed_at = Some(self.log.durable());
        st.checkpoint_bytes = written;
        Ok(())
    }

    /// Checkpoints when the log has grown by `every` bytes (a quarter of the ring) since the
    /// last checkpoint of this group ended (or it never had one since open). Returns whether it
    /// did. When the group's live records outgrow a quarter ring (a voter that is down holds
    /// back their purge), the next checkpoint waits for twice what the last one wrote instead,
    /// so checkpoints never take more than a third of what the log writes; past a third of the
    /// ring the oldest complete copy may be freed before the next one is durable, which a later
    /// open refuses by name (`StateLost`, `Hole`), and a warning says so beforehand.
    pub async fn checkpoint_due(&self, every: u64) -> Result<bool, ClusterError> {
        let (at, last) = {
            let st = self.state("checkpoint")?;
            (st.checkpointed_at, st.checkpoint_bytes)
        };
        let gap = every.max(last.saturating_mul(2));
        let due = at.is_none_or(|a| self.log.durable().saturating_sub(a) >= gap);
        if due {
            self.checkpoint().await?;
            let wrote = self.state("checkpoint")?.checkpoint_bytes;
            if wrote > every {
                tracing::warn!(
                    group = self.group,
                    checkpoint_bytes = wrote,
                    quarter_ring_bytes = every,
                    "the raft group's live records take more than a quarter of the ring: a \
                     voter that is down or behind keeps the others from purging; past a third \
                     of the ring a restart may find the group's state freed"
                );
            }
        }
        Ok(due)
    }

    /// The request bytes of the entries after `index` (all of them for None): how far a
    /// follower whose log matches up to `index` is behind, in the bytes it still has to receive
    /// (the normal entries' requests; blank and membership entries count none).
    pub fn bytes_after(&self, index: Option<u64>) -> Result<u64, ClusterError> {
        use std::ops::Bound::{Excluded, Unbounded};
        let st = self.state("count the bytes behind")?;
        let from = index.map_or(Unbounded, Excluded);
        Ok(st
            .entries
            .range((from, Unbounded))
            .map(|(_, e)| match &e.payload {
                openraft::EntryPayload::Normal(r) => r.0.len() as u64,
                _ => 0,
            })
            .sum())
    }

    /// How many entries the group's log holds (past its purge point): what the store keeps in
    /// memory.
    pub fn entries_held(&self) -> Result<u64, ClusterError> {
        Ok(self.state("count the entries held")?.entries.len() as u64)
    }

    /// A copy of the group's state as its records built it (tests and diagnostics); refused,
    /// like every read, once the log failed under the group.
    pub fn current(&self) -> Result<GroupState, ClusterError> {
        Ok(self.state("read the group's state")?.clone())
    }
}

/// Opens Raft group `group` on `log`: creates its partition on first use, replays its records
/// and returns its log store and state machine. Refuses a log that acknowledges appends before
/// their flush, since Raft counts this node's flush toward the quorum.
/// Times the replay starts again because the ring freed records under it.
const REPLAY_RESTARTS: usize = 8;

/// The group's retained records, from the partition's first retained offset to its durable end,
/// and that first offset. The ring may free the oldest records while they are read (a full log
/// frees its head for any write, such as the fence recovery writes after a cut): then the replay
/// starts again from the new head, so that it is always of one contiguous retained window.
fn read_group(
    log: &Log,
    group: u32,
    partition: u32,
) -> Result<(u64, Vec<nvmq_log::Record>), ClusterError> {
    let log_err = |op| move |source| ClusterError::Log { group, op, source };
    let mut restarts = 0;
    'replay: loop {
        let view = log.partition(partition).ok_or(ClusterError::Log {
            group,
            op: "look up the group's partition",
            source: LogError::UnknownPartition(partition),
        })?;
        let mut records = Vec::new();
        let mut next = view.start_offset;
        while next < view.durable_end {
            let batch = match log.read(partition, next, REPLAY_READ) {
                Ok(b) => b,
                Err(LogError::OffsetOutOfRange { start, .. })
                    if start > next && restarts < REPLAY_RESTARTS =>
                {
                    restarts += 1;
                    continue 'replay;
                }
                Err(e) => return Err(log_err("replay the group's records")(e)),
            };
            let Some(last) = batch.last() else {
                return Err(ClusterError::ReplayShort {
                    group,
                    at: next,
                    durable_end: view.durable_end,
                });
            };
            next = last.offset + u64::from(last.span.max(1));
            records.extend(batch);
        }
        return Ok((view.start_offset, records));
    }
}

pub fn open_group(log: Arc<Log>, group: u32) -> Result<(LogStore, StateMachine), ClusterError> {
    open_group_inner(log, group, None)
}

/// Like [`open_group`], with committed normal entries handed to `applier` (the node's own
/// state) instead of kept by the state machine. Snapshots carry the applier's bookkeeping
/// ([`crate::Applier::capture`]); the newest durable one is restored into the applier here.
pub fn open_applied_group(
    log: Arc<Log>,
    group: u32,
    applier: Arc<dyn crate::Applier>,
) -> Result<(LogStore, StateMachine), ClusterError> {
    open_group_inner(log, group, Some(applier))
}

fn open_group_inner(
    log: Arc<Log>,
    group: u32,
    applier: Option<Arc<dyn crate::Applier>>,
) -> Result<(LogStore, StateMachine), ClusterError> {
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
    let (start, records) = read_group(&log, group, partition)?;
    let state = GroupState::replay(
        group,
        start,
        records.iter().map(|r| (r.offset, r.payload.as_ref())),
    )?;
    let handle = GroupLog {
        log,
        group,
        partition,
        shared: Arc::new(Shared {
            group,
            state: Mutex::new(state),
            failed: OnceLock::new(),
        }),
    };
    let sm = StateMachine::open(handle.clone(), applier)?;
    Ok((LogStore::new(handle), sm))
}
