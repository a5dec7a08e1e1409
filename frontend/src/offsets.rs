//! Committed offsets: applied in log order once durable, replayed from `__consumer_offsets`.

use std::collections::HashMap;
use std::sync::Mutex;

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
}

impl Offsets {
    pub fn apply(&self, group: &str, commits: &[Commit]) {
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
