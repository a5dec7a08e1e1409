//! The topic registry: each live topic's partitions and id, and how often each name was deleted
//! (which names the log partitions of its current incarnation).

use std::collections::{BTreeMap, HashMap};

use uuid::Uuid;

use crate::meta::{META_TOPIC, OFFSETS_TOPIC};
use crate::part::PartRef;
use crate::topic_ids;

/// Longest Kafka topic name nvmq takes: the log allows 249 bytes and a re-created topic's log
/// name carries a `#<incarnation>` suffix.
pub const MAX_TOPIC_NAME: usize = 240;

/// Kafka's topic name rule, plus nvmq's shorter limit and its reserved internal names.
pub fn valid_topic_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TOPIC_NAME
        && name != "."
        && name != ".."
        && name != META_TOPIC
        && name != OFFSETS_TOPIC
        // A cluster node's Raft group (`replica`): never a Kafka topic.
        && name != nvmq_cluster::RAFT_TOPIC
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'_' || c == b'-')
}

/// Topic name → its partitions (device and log partition id) by partition index.
#[derive(Debug, Default)]
pub struct Topics {
    pub map: BTreeMap<String, Vec<PartRef>>,
    /// How often each name was deleted: the log name of its current incarnation.
    pub(super) incarnation: HashMap<String, u32>,
    /// Each live topic's id (`topic_ids`), both ways: requests name topics by id too.
    ids: HashMap<String, Uuid>,
    names: HashMap<Uuid, String>,
}

impl Topics {
    pub(super) fn new(
        map: BTreeMap<String, Vec<PartRef>>,
        incarnation: HashMap<String, u32>,
    ) -> Topics {
        let mut t = Topics {
            map: BTreeMap::new(),
            incarnation,
            ids: HashMap::new(),
            names: HashMap::new(),
        };
        for (name, parts) in map {
            t.insert(name, parts);
        }
        t
    }

    pub(super) fn insert(&mut self, name: String, parts: Vec<PartRef>) {
        let id = topic_ids::of(&self.log_name(&name));
        self.ids.insert(name.clone(), id);
        self.names.insert(id, name.clone());
        self.map.insert(name, parts);
    }

    /// Takes a deleted topic out; `incarnation`: how often its name has been deleted now.
    pub(super) fn remove(&mut self, name: &str, incarnation: u32) {
        self.map.remove(name);
        if let Some(id) = self.ids.remove(name) {
            self.names.remove(&id);
        }
        self.incarnation.insert(name.to_string(), incarnation);
    }

    /// A live topic's id.
    pub fn id(&self, name: &str) -> Option<Uuid> {
        self.ids.get(name).copied()
    }

    /// The live topic with id `id`.
    pub fn name_of(&self, id: &Uuid) -> Option<&str> {
        self.names.get(id).map(String::as_str)
    }

    pub(super) fn log_name(&self, name: &str) -> String {
        match self.incarnation.get(name).copied().unwrap_or(0) {
            0 => name.to_string(),
            k => format!("{name}#{k}"),
        }
    }

    pub fn partition(&self, topic: &str, index: i32) -> Option<PartRef> {
        let idx = usize::try_from(index).ok()?;
        self.map.get(topic)?.get(idx).copied()
    }
}
