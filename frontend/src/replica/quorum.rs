//! Where each voter stands against the leader (`nvmq cluster status`, DescribeQuorum,
//! `/metrics`): the index its log matches up to, the request bytes it still has to receive,
//! when it last answered, and for how long it has been behind.
//!
//! "Behind for" is measured the way Kafka measures a follower's lag in time: a follower is
//! caught up to the moment `t` when it holds everything the leader held at `t`, and it is
//! behind for `now - t`. The leader keeps samples of its own last log index over time (taken
//! whenever the group's metrics change, at most one per millisecond), so `t` is the newest
//! sample at or below what the follower matched.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nvmq_cluster::net::GroupRaft;
use nvmq_cluster::openraft::async_runtime::WatchReceiver;
use nvmq_cluster::openraft::{Instant as OpenraftInstant, ServerState};
use nvmq_cluster::GroupLog;

/// Samples kept: 65,536 at one per millisecond or less cover a minute of continuous appends
/// (1 MiB); a follower further behind is shown as behind for at least the oldest sample's age.
const SAMPLES: usize = 1 << 16;
/// The least time between two samples.
const SAMPLE_EVERY: Duration = Duration::from_millis(1);

/// The leader's last log index over time: (index, when it was first seen), both increasing.
#[derive(Debug, Default)]
pub struct History {
    samples: VecDeque<(u64, Instant)>,
    term: u64,
}

impl History {
    /// Records that the leader's log ended at `last` in `term` at `now`. A new term starts a new
    /// history: the new leader's log may end below the old one's.
    pub fn sample(&mut self, term: u64, last: u64, now: Instant) {
        if term != self.term {
            self.samples.clear();
            self.term = term;
        }
        match self.samples.back() {
            Some(&(i, _)) if i >= last => return,
            Some(&(_, at)) if now.saturating_duration_since(at) < SAMPLE_EVERY => {
                // Too soon for a new sample: move the newest one's index up, keeping its time
                // (the follower is then shown caught up to a moment slightly earlier).
                if let Some(newest) = self.samples.back_mut() {
                    newest.0 = last;
                }
                return;
            }
            _ => {}
        }
        if self.samples.len() == SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back((last, now));
    }

    /// How long a follower that matched up to `matched` has been behind, at `now`, when the
    /// leader's log ends at `last`: zero when it holds everything; else the time since the
    /// newest sample it covers, or since the oldest sample when it covers none (then it is
    /// behind for at least that long).
    pub fn behind_for(&self, matched: Option<u64>, last: u64, now: Instant) -> Duration {
        if matched.is_some_and(|m| m >= last) {
            return Duration::ZERO;
        }
        let covered = match matched {
            None => None,
            Some(m) => {
                let n = self.samples.partition_point(|&(i, _)| i <= m);
                n.checked_sub(1).and_then(|k| self.samples.get(k))
            }
        };
        match covered.or(self.samples.front()) {
            Some(&(_, at)) => now.saturating_duration_since(at),
            None => Duration::ZERO,
        }
    }
}

/// One voter as the leader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoterStatus {
    pub id: u64,
    /// The last index its log matches the leader's at (the leader's own last index for itself).
    pub matched: Option<u64>,
    /// Request bytes of the entries it does not hold yet (None: the group's store stopped
    /// and cannot count them).
    pub bytes_behind: Option<u64>,
    /// Since its last answer to the leader (None: never answered this leader; zero for the
    /// leader itself).
    pub last_answer: Option<Duration>,
    /// How long it has been missing entries the leader had (zero when it holds all of them).
    pub behind_for: Duration,
    /// Its log matches the leader's up to the committed index.
    pub in_sync: bool,
}

/// The group as this node sees it: everything but the voters' figures, which only the leader
/// has (empty elsewhere).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumStatus {
    pub node_id: u64,
    pub leader: Option<u64>,
    pub term: u64,
    pub is_leader: bool,
    pub last_index: Option<u64>,
    pub committed: Option<u64>,
    pub applied: Option<u64>,
    /// The last index this node's newest snapshot covers.
    pub snapshot: Option<u64>,
    /// The last index this node purged from its log (docs/cluster.md "Snapshots and
    /// compaction").
    pub purged: Option<u64>,
    /// The entries this node's log holds (in memory too), None when its store stopped.
    pub entries_held: Option<u64>,
    /// The entries this node submitted to the group since it started (as leader), and the
    /// commands they carried (`propose`: several per entry under load).
    pub proposed_entries: u64,
    pub proposed_commands: u64,
    pub voters: Vec<VoterStatus>,
}

/// The history and what it is read against.
pub struct Quorum {
    history: Mutex<History>,
    log: GroupLog,
}

impl Quorum {
    pub fn new(log: GroupLog) -> Quorum {
        Quorum {
            history: Mutex::new(History::default()),
            log,
        }
    }

    fn history(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Samples the leader's last index when the group's metrics change (at most once per
    /// [`SAMPLE_EVERY`]), until the group stops. Runs on the cluster's runtime.
    pub async fn watch(self: std::sync::Arc<Self>, raft: GroupRaft) {
        let mut rx = raft.metrics();
        loop {
            {
                let m = rx.borrow_watched();
                if m.state == ServerState::Leader {
                    if let Some(last) = m.last_log_index {
                        self.history().sample(m.current_term, last, Instant::now());
                    }
                }
            }
            // At most one wake per sample interval: the metrics change at every append and
            // ack, and this task shares the group's runtime with openraft's core.
            tokio::time::sleep(SAMPLE_EVERY).await;
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// The group now, from `raft`'s metrics and the history.
    pub fn status(&self, node_id: u64, raft: &GroupRaft) -> QuorumStatus {
        let now = Instant::now();
        let metrics = raft.metrics();
        let m = metrics.borrow_watched();
        let is_leader = m.state == ServerState::Leader;
        let mut st = QuorumStatus {
            node_id,
            leader: m.current_leader,
            term: m.current_term,
            is_leader,
            last_index: m.last_log_index,
            committed: m.cluster_committed.map(|c| c.index),
            applied: m.last_applied.map(|a| a.index),
            snapshot: m.snapshot.map(|s| s.index),
            purged: m.purged.map(|p| p.index),
            entries_held: self.log.entries_held().ok(),
            proposed_entries: 0,
            proposed_commands: 0,
            voters: Vec::new(),
        };
        let (Some(replication), true) = (&m.replication, is_leader) else {
            return st;
        };
        let last = m.last_log_index.unwrap_or(0);
        let history = self.history();
        for id in m.membership_config.voter_ids() {
            let me = id == node_id;
            let matched = match me {
                true => m.last_log_index,
                false => replication.get(&id).copied().flatten().map(|l| l.index),
            };
            let last_answer = match me {
                true => Some(Duration::ZERO),
                false => m
                    .heartbeat
                    .as_ref()
                    .and_then(|h| h.get(&id).copied().flatten())
                    // openraft's clock (tokio's): the time since, on that clock.
                    .map(|at| OpenraftInstant::elapsed(&*at)),
            };
            st.voters.push(VoterStatus {
                id,
                matched,
                // A store that stopped has no entries to count: the status still shows the rest.
                bytes_behind: self.log.bytes_after(matched).ok(),
                last_answer,
                behind_for: history.behind_for(matched, last, now),
                in_sync: me || super::in_sync(matched, st.committed),
            });
        }
        st
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follower_is_behind_since_the_leader_first_held_what_it_lacks() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut h = History::default();
        h.sample(3, 10, ms(0));
        h.sample(3, 20, ms(100));
        h.sample(3, 30, ms(200));
        let now = ms(250);
        // Holds everything: not behind.
        assert_eq!(h.behind_for(Some(30), 30, now), Duration::ZERO);
        // Holds up to 25: caught up to the moment the log ended at 20.
        assert_eq!(h.behind_for(Some(25), 30, now), Duration::from_millis(150));
        assert_eq!(h.behind_for(Some(20), 30, now), Duration::from_millis(150));
        assert_eq!(h.behind_for(Some(10), 30, now), Duration::from_millis(250));
        // Below every sample (or nothing matched): at least as old as the oldest sample.
        assert_eq!(h.behind_for(Some(5), 30, now), Duration::from_millis(250));
        assert_eq!(h.behind_for(None, 30, now), Duration::from_millis(250));
    }

    #[test]
    fn samples_within_a_millisecond_merge_and_a_new_term_starts_over() {
        let t0 = Instant::now();
        let mut h = History::default();
        h.sample(1, 10, t0);
        h.sample(1, 11, t0 + Duration::from_micros(300));
        h.sample(1, 11, t0 + Duration::from_millis(5));
        assert_eq!(h.samples.len(), 1, "{:?}", h.samples);
        h.sample(1, 12, t0 + Duration::from_millis(5));
        assert_eq!(h.samples.len(), 2);
        // A follower at 11 is caught up to t0 (the merged sample's time).
        let now = t0 + Duration::from_millis(10);
        assert_eq!(h.behind_for(Some(11), 12, now), Duration::from_millis(10));
        h.sample(2, 4, now);
        assert_eq!(h.samples.iter().map(|s| s.0).collect::<Vec<_>>(), vec![4]);
    }

    #[test]
    fn the_history_is_bounded() {
        let t0 = Instant::now();
        let mut h = History::default();
        for i in 0..(SAMPLES as u64 + 10) {
            h.sample(1, i + 1, t0 + Duration::from_millis(i));
        }
        assert_eq!(h.samples.len(), SAMPLES);
        assert_eq!(h.samples.front().map(|s| s.0), Some(11));
    }
}
