//! Committed offsets: applied in log order once durable, replayed from `__consumer_offsets`
//! (commits, and the deletions of DeleteGroups, OffsetDelete and group expiry).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use crate::broker::lock;
use crate::meta::Commit;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
}

/// (topic, partition) → committed, for one group.
type GroupOffsets = HashMap<(String, i32), Committed>;

/// group → its offsets.
#[derive(Debug, Default)]
pub struct Offsets {
    map: Mutex<HashMap<String, GroupOffsets>>,
    /// When each group last committed (in this process: a replayed commit counts as made at
    /// start, since the records carry no time), for the expiry of empty groups.
    last_commit: Mutex<HashMap<String, Instant>>,
}

impl Offsets {
    pub fn apply(&self, group: &str, commits: &[Commit]) {
        lock(&self.last_commit).insert(group.to_string(), Instant::now());
        let mut m = lock(&self.map);
        let g = m.entry(group.to_string()).or_default();
        for c in commits {
            g.insert(
                (c.topic.clone(), c.partition),
                Committed {
                    offset: c.offset,
                    leader_epoch: c.leader_epoch,
                    metadata: c.metadata.clone(),
                },
            );
        }
    }

    /// Forgets every offset of a group (its `GroupDeleted` record is durable).
    pub fn remove_group(&self, group: &str) {
        lock(&self.map).remove(group);
        lock(&self.last_commit).remove(group);
    }

    /// Forgets some offsets of a group (its `OffsetsDeleted` record is durable); a group left
    /// with none is gone from `groups`.
    pub fn remove(&self, group: &str, partitions: &[(String, i32)]) {
        let mut m = lock(&self.map);
        if let Some(g) = m.get_mut(group) {
            for k in partitions {
                g.remove(k);
            }
            if g.is_empty() {
                m.remove(group);
            }
        }
    }

    pub fn has_group(&self, group: &str) -> bool {
        lock(&self.map).contains_key(group)
    }

    /// When the group last committed, if it has offsets.
    pub fn last_commit(&self, group: &str) -> Option<Instant> {
        if !self.has_group(group) {
            return None;
        }
        lock(&self.last_commit).get(group).copied()
    }

    pub fn get(&self, group: &str, topic: &str, partition: i32) -> Option<Committed> {
        lock(&self.map)
            .get(group)
            .and_then(|g| g.get(&(topic.to_string(), partition)))
            .cloned()
    }

    pub fn groups(&self) -> Vec<String> {
        let mut v: Vec<String> = lock(&self.map).keys().cloned().collect();
        v.sort();
        v
    }

    /// Every committed (topic, partition) of a group, sorted.
    pub fn all(&self, group: &str) -> Vec<((String, i32), Committed)> {
        let mut v: Vec<_> = lock(&self.map)
            .get(group)
            .map(|g| g.iter().map(|(k, c)| (k.clone(), c.clone())).collect())
            .unwrap_or_default();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}
