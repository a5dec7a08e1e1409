//! Keeps a node's Raft log bounded (docs/cluster.md "Snapshots and compaction").
//!
//! The group's entries are purged only up to an index every voter's log holds, so that no
//! voter, whichever node leads later, ever needs an entry that is gone: a snapshot here carries
//! the broker's bookkeeping, not the batches, and cannot bring a lagging node up to date. The
//! leader knows what each voter holds; it writes that floor through the group
//! (`Command::Compact`) whenever it moved by `every` entries, and each node, once it applied
//! it, takes a snapshot covering it and purges up to it. The same task re-records the group's
//! records every quarter ring (`checkpoint_due`), so that the ring never frees the only copy
//! of the vote, the snapshot or a live entry.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nvmq_cluster::net::GroupRaft;
use nvmq_cluster::openraft::async_runtime::WatchReceiver;
use nvmq_cluster::openraft::ServerState;
use nvmq_cluster::{GroupLog, Request};

use super::command::Command;

/// How often each node looks.
const TICK: Duration = Duration::from_millis(250);
/// How long the leader waits for a compaction entry to commit before it looks again (a leader
/// that lost its quorum never sees it commit).
const LEAD_WAIT: Duration = Duration::from_secs(5);

/// The index every voter's log holds, as the leader sees it: the least matched index over the
/// voters (the leader's own is its flushed log), no higher than what is applied here (a snapshot
/// covers only applied entries). None while a voter's position is unknown.
pub(crate) fn floor(
    voters: impl IntoIterator<Item = u64>,
    matched: impl Fn(u64) -> Option<u64>,
    applied: Option<u64>,
) -> Option<u64> {
    let mut least = applied?;
    for v in voters {
        least = least.min(matched(v)?);
    }
    Some(least)
}

pub(crate) struct Compactor {
    pub(crate) raft: GroupRaft,
    pub(crate) log: GroupLog,
    /// The highest `Compact` applied on this node.
    pub(crate) compact_to: Arc<AtomicU64>,
    /// Entries the floor must move by before the leader writes it again.
    pub(crate) every: u64,
    /// A quarter of device 0's ring, in bytes: how often the group's records are re-recorded.
    pub(crate) quarter_ring: u64,
}

impl Compactor {
    /// Runs until the group stops: compaction and the checkpoints in tasks of their own, so
    /// that a compaction entry that does not commit never holds back a checkpoint.
    pub(crate) async fn run(self) {
        let log = self.log.clone();
        let quarter_ring = self.quarter_ring;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = log.checkpoint_due(quarter_ring).await {
                    // Only a stopped group fails here (every log error stops it).
                    tracing::warn!(error = %e, "re-recording the raft group's state failed");
                    return;
                }
            }
        });
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match tokio::time::timeout(LEAD_WAIT, self.lead()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "writing the raft group's compaction point failed")
                }
                Err(_) => tracing::warn!(
                    wait = ?LEAD_WAIT,
                    "the raft group's compaction point did not commit in time; trying again"
                ),
            }
            if let Err(e) = self.compact().await {
                // openraft stopped (its triggers fail only then): nothing more to compact.
                tracing::debug!(error = %e, "compaction stops");
                return;
            }
        }
    }

    /// On the leader: writes the floor through the group once it moved by `every`.
    async fn lead(&self) -> Result<(), String> {
        if self.every == 0 {
            return Ok(());
        }
        let upto = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow_watched();
            let (true, Some(rep)) = (m.state == ServerState::Leader, &m.replication) else {
                return Ok(());
            };
            floor(
                m.membership_config.voter_ids(),
                |v| rep.get(&v).copied().flatten().map(|l| l.index),
                m.last_applied.map(|l| l.index),
            )
        };
        let Some(upto) = upto else {
            return Ok(());
        };
        if upto
            < self
                .compact_to
                .load(Ordering::Relaxed)
                .saturating_add(self.every)
        {
            return Ok(());
        }
        let cmd = Command::Compact { upto };
        self.raft
            .client_write(Request::from(cmd.encode()))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// On every node: a snapshot that covers the applied floor, then the purge up to it.
    async fn compact(&self) -> Result<(), String> {
        let target = self.compact_to.load(Ordering::Relaxed);
        if target == 0 {
            return Ok(());
        }
        let (snapshot, purged) = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow_watched();
            (m.snapshot.map(|l| l.index), m.purged.map(|l| l.index))
        };
        if purged.is_some_and(|p| p >= target) {
            return Ok(());
        }
        let trigger = self.raft.trigger();
        // The floor was applied here, so a snapshot now covers it; openraft ignores the
        // request while one is being built.
        let r = match snapshot.is_some_and(|s| s >= target) {
            true => trigger.purge_log(target).await,
            false => trigger.snapshot().await,
        };
        r.map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_what_every_voter_holds_and_is_applied() {
        let matched = |v: u64| match v {
            1 => Some(90),
            2 => Some(70),
            3 => Some(85),
            _ => None,
        };
        assert_eq!(floor([1, 2, 3], matched, Some(80)), Some(70));
        assert_eq!(floor([1, 3], matched, Some(80)), Some(80));
        // A voter whose position is unknown holds nothing the leader can count on.
        assert_eq!(floor([1, 2, 4], matched, Some(80)), None);
        assert_eq!(floor([1, 2], matched, None), None);
    }
}
