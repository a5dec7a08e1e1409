//! A group's state as its records build it. The same `check` + `apply` run when a record is
//! written and when it is replayed at open, so what a restart rebuilds is exactly what the
//! store held before, minus whatever was not durable.

use std::collections::BTreeMap;

use crate::error::ClusterError;
use crate::record::{RaftRecord, State};
use crate::types::{Entry, LogId, SnapshotMeta, Vote};

#[derive(Debug, Clone, Default)]
pub struct GroupState {
    pub group: u32,
    pub vote: Option<Vote>,
    pub committed: Option<LogId>,
    pub purged: Option<LogId>,
    /// Entries after `purged`, by index, consecutive.
    pub entries: BTreeMap<u64, Entry>,
    /// The newest state machine snapshot written.
    pub snapshot: Option<(SnapshotMeta, Vec<u8>)>,
    /// The log's durable position once this group's last checkpoint since open was durable,
    /// and the bytes that checkpoint wrote (not records).
    pub checkpointed_at: Option<u64>,
    pub checkpoint_bytes: u64,
    /// Whether a full `State` record was replayed (needed once retention freed older records).
    saw_state: bool,
}

impl GroupState {
    pub fn new(group: u32) -> GroupState {
        GroupState {
            group,
            ..GroupState::default()
        }
    }

    /// The last log id: the last entry's, or the last purged one when no entry is left.
    pub fn last_log_id(&self) -> Option<LogId> {
        match self.entries.values().next_back() {
            Some(e) => Some(e.log_id),
            None => self.purged,
        }
    }

    pub fn state(&self) -> State {
        State {
            vote: self.vote,
            committed: self.committed,
            purged: self.purged,
        }
    }

    /// Refuses a record that would break the log: a hole, an entry below the purge point, or
    /// any drop of a committed entry (storage.md §8: fatal, never done).
    pub fn check(&self, rec: &RaftRecord) -> Result<(), ClusterError> {
        let group = self.group;
        let committed = self.committed.map(|c| c.index);
        match rec {
            RaftRecord::Entry(e) => {
                let index = e.log_id.index;
                let last = self.last_log_id().map(|l| l.index);
                let below_purge = self.purged.is_some_and(|p| index <= p.index);
                let hole = last.is_some_and(|l| index > l + 1);
                if below_purge || hole {
                    return Err(ClusterError::Hole { group, index, last });
                }
                // Overwriting a committed entry with a different one is a truncation of it.
                let differs = self.entries.get(&index).is_some_and(|old| old != e);
                if let Some(c) = committed.filter(|&c| differs && index <= c) {
                    return Err(ClusterError::TruncateCommitted {
                        group,
                        after: index.checked_sub(1),
                        committed: c,
                    });
                }
            }
            RaftRecord::TruncateAfter(after) => {
                let after_index = after.map(|a| a.index);
                if let Some(c) = committed.filter(|&c| after_index.is_none_or(|a| a < c)) {
                    return Err(ClusterError::TruncateCommitted {
                        group,
                        after: after_index,
                        committed: c,
                    });
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Applies a record that passed `check`.
    pub fn apply(&mut self, rec: RaftRecord) {
        match rec {
            RaftRecord::Entry(e) => {
                // A checkpoint re-records live entries, and a cut may land inside it: a copy
                // of an entry already held must not drop the entries after it (they were
                // reported stored). Raft overwrites a differing entry only after an explicit
                // TruncateAfter, so only an identical copy reaches here without one.
                if self.entries.get(&e.log_id.index) == Some(&e) {
                    return;
                }
                // Appending at the end (the usual case) drops nothing: no split to allocate.
                if self.entries.range(e.log_id.index..).next().is_some() {
                    self.entries.split_off(&e.log_id.index);
                }
                self.entries.insert(e.log_id.index, e);
            }
            RaftRecord::Vote(v) => self.vote = Some(v),
            RaftRecord::TruncateAfter(None) => self.entries.clear(),
            RaftRecord::TruncateAfter(Some(after)) => {
                self.entries.split_off(&(after.index + 1));
            }
            RaftRecord::Purge(upto) => self.purge(upto),
            RaftRecord::Committed(c) => self.committed = c,
            RaftRecord::Snapshot(meta, data) => self.snapshot = Some((meta, data)),
            RaftRecord::State(s) => {
                self.vote = s.vote;
                self.committed = s.committed;
                if let Some(p) = s.purged {
                    self.purge(p);
                }
                self.saw_state = true;
            }
            RaftRecord::Barrier => {}
        }
    }

    fn purge(&mut self, upto: LogId) {
        self.entries = self.entries.split_off(&(upto.index + 1));
        if self.purged.is_none_or(|p| p < upto) {
            self.purged = Some(upto);
        }
    }

    /// Rebuilds a group from its retained records, `(offset, bytes)` in log order, the first
    /// at `start_offset`.
    pub fn replay<'a>(
        group: u32,
        start_offset: u64,
        records: impl IntoIterator<Item = (u64, &'a [u8])>,
    ) -> Result<GroupState, ClusterError> {
        let mut st = GroupState::new(group);
        for (offset, bytes) in records {
            let rec = RaftRecord::decode(bytes).map_err(|why| ClusterError::BadRecord {
                group,
                offset,
                why,
            })?;
            st.check(&rec)?;
            st.apply(rec);
        }
        if start_offset > 0 && !st.saw_state {
            return Err(ClusterError::StateLost {
                group,
                start: start_offset,
            });
        }
        // openraft purges only what a snapshot covers; without that snapshot the state machine
        // could not be rebuilt.
        if let Some(p) = st.purged {
            let covered = st.snapshot.as_ref().and_then(|(m, _)| m.last_log_id);
            if covered.is_none_or(|c| c.index < p.index) {
                return Err(ClusterError::SnapshotLost {
                    group,
                    purged: p.index,
                    snapshot: covered.map(|c| c.index),
                });
            }
        }
        // A commit mark past every entry and snapshot held means entries reported stored
        // (and committed) are missing: refuse rather than serve a shorter log.
        if let Some(c) = st.committed {
            let held = st.last_log_id().map(|l| l.index);
            let snap = st
                .snapshot
                .as_ref()
                .and_then(|(m, _)| m.last_log_id)
                .map(|l| l.index);
            if held.max(snap).is_none_or(|h| h < c.index) {
                return Err(ClusterError::CommittedMissing {
                    group,
                    committed: c.index,
                    last: held.max(snap),
                });
            }
        }
        // Retention must not have freed entries the log still holds to be there.
        if let (Some(p), Some((&first, _))) = (st.purged, st.entries.iter().next()) {
            if first != p.index + 1 {
                return Err(ClusterError::Hole {
                    group,
                    index: first,
                    last: Some(p.index),
                });
            }
        }
        Ok(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::EntryPayload;

    fn id(term: u64, index: u64) -> LogId {
        LogId::new_term_index(term, index)
    }

    fn entry(term: u64, index: u64) -> RaftRecord {
        RaftRecord::Entry(Entry {
            log_id: id(term, index),
            payload: EntryPayload::Blank,
        })
    }

    fn replay(recs: &[RaftRecord]) -> Result<GroupState, ClusterError> {
        let bytes: Vec<Vec<u8>> = recs
            .iter()
            .map(|r| r.encode().unwrap_or_default())
            .collect();
        GroupState::replay(
            1,
            0,
            bytes
                .iter()
                .enumerate()
                .map(|(i, b)| (i as u64, b.as_slice())),
        )
    }

    #[test]
    fn a_truncate_record_keeps_the_dropped_entries_dead_and_new_ones_replace_them() {
        let st = replay(&[
            entry(1, 1),
            entry(1, 2),
            entry(1, 3),
            RaftRecord::TruncateAfter(Some(id(1, 1))),
            entry(2, 2),
        ])
        .map_err(|e| e.to_string());
        let st = st
            .as_ref()
            .map(|s| s.entries.values().map(|e| e.log_id).collect::<Vec<_>>());
        assert_eq!(st, Ok(vec![id(1, 1), id(2, 2)]));
    }

    #[test]
    fn truncating_below_the_committed_index_is_refused() {
        let err = replay(&[
            entry(1, 1),
            entry(1, 2),
            RaftRecord::Committed(Some(id(1, 2))),
            RaftRecord::TruncateAfter(Some(id(1, 1))),
        ])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(err.contains("below the committed index 2"), "{err}");
    }

    #[test]
    fn a_hole_and_freed_state_are_refused() {
        let hole = replay(&[entry(1, 1), entry(1, 3)])
            .err()
            .map(|e| e.to_string());
        assert!(hole.unwrap_or_default().contains("entry 3 does not follow"));
        let bytes = entry(1, 5).encode().unwrap_or_default();
        let lost = GroupState::replay(1, 4, [(4, bytes.as_slice())]).err();
        assert!(matches!(
            lost,
            Some(ClusterError::StateLost { start: 4, .. })
        ));
    }

    fn indexes(st: &GroupState) -> Vec<u64> {
        st.entries.keys().copied().collect()
    }

    /// A cut inside a checkpoint: the state and the first live entries re-recorded, the rest
    /// not. The entries after the copies were reported stored and must all stay.
    #[test]
    fn a_checkpoint_cut_short_keeps_every_entry_after_its_copies() {
        let mut recs: Vec<RaftRecord> = (1..=10).map(|i| entry(1, i)).collect();
        recs.push(RaftRecord::Committed(Some(id(1, 10))));
        recs.push(RaftRecord::State(State {
            vote: None,
            committed: Some(id(1, 10)),
            purged: None,
        }));
        recs.extend((1..=3).map(|i| entry(1, i)));
        let st = replay(&recs).map_err(|e| e.to_string());
        assert_eq!(st.as_ref().map(indexes), Ok((1..=10).collect::<Vec<_>>()));
    }

    #[test]
    fn a_commit_mark_past_every_entry_held_is_refused() {
        let missing = replay(&[entry(1, 1), RaftRecord::Committed(Some(id(1, 3)))]).err();
        assert!(
            matches!(
                missing,
                Some(ClusterError::CommittedMissing {
                    committed: 3,
                    last: Some(1),
                    ..
                })
            ),
            "{missing:?}"
        );
    }
}
