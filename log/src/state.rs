//! What a checkpoint holds and a scan replays: the partition registry with each partition's next
//! and first retained offset (storage.md §4.5).

use std::collections::{BTreeMap, HashMap};

use crate::format::Reader;

/// Longest topic name accepted (Kafka's limit).
pub const MAX_TOPIC_LEN: usize = 249;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionState {
    pub id: u32,
    pub topic: String,
    pub index: u32,
    /// The offset the next record appended to this partition gets.
    pub next_offset: u64,
    /// The first offset still retained.
    pub start_offset: u64,
}

/// The partition registry: ids are assigned in order and never reused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registry {
    partitions: BTreeMap<u32, PartitionState>,
    by_name: HashMap<(String, u32), u32>,
    next_id: u32,
}

impl Registry {
    pub fn get(&self, id: u32) -> Option<&PartitionState> {
        self.partitions.get(&id)
    }
    pub fn get_mut(&mut self, id: u32) -> Option<&mut PartitionState> {
        self.partitions.get_mut(&id)
    }
    pub fn lookup(&self, topic: &str, index: u32) -> Option<u32> {
        self.by_name.get(&(topic.to_string(), index)).copied()
    }
    pub fn iter(&self) -> impl Iterator<Item = &PartitionState> {
        self.partitions.values()
    }
    pub fn len(&self) -> usize {
        self.partitions.len()
    }
    pub fn is_empty(&self) -> bool {
        self.partitions.is_empty()
    }
    pub fn next_id(&self) -> u32 {
        self.next_id
    }

    /// Adds a partition with the given id (ids come from `next_id` at append, or from the log at
    /// replay).
    pub fn insert(&mut self, id: u32, topic: String, index: u32) {
        self.by_name.insert((topic.clone(), index), id);
        self.partitions.insert(
            id,
            PartitionState {
                id,
                topic,
                index,
                next_offset: 0,
                start_offset: 0,
            },
        );
        // Ids are below u32::MAX (the writer never assigns it, replay and decode refuse it).
        self.next_id = self.next_id.max(id.saturating_add(1));
    }

    pub fn remove(&mut self, id: u32) {
        if let Some(p) = self.partitions.remove(&id) {
            self.by_name.remove(&(p.topic, p.index));
        }
    }

    /// Checkpoint encoding: next_id, count, then each partition.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.partitions.len() * 40);
        out.extend_from_slice(&self.next_id.to_le_bytes());
        out.extend_from_slice(&(self.partitions.len() as u32).to_le_bytes());
        for p in self.partitions.values() {
            out.extend_from_slice(&p.id.to_le_bytes());
            out.extend_from_slice(&p.index.to_le_bytes());
            out.extend_from_slice(&p.next_offset.to_le_bytes());
            out.extend_from_slice(&p.start_offset.to_le_bytes());
            out.extend_from_slice(&(p.topic.len() as u16).to_le_bytes());
            out.extend_from_slice(p.topic.as_bytes());
        }
        out
    }

    /// Decodes a checkpoint payload. The record's checksum already held, so a failure here means
    /// a writer bug or a format mismatch; it is still an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Registry, &'static str> {
        if bytes.len() < 8 {
            return Err("checkpoint shorter than its counts");
        }
        let mut r = Reader::new(bytes);
        let mut reg = Registry::default();
        let next_id = r.u32();
        let count = r.u32();
        for _ in 0..count {
            if r.remaining() < 26 {
                return Err("checkpoint ends inside a partition entry");
            }
            let id = r.u32();
            let index = r.u32();
            let next_offset = r.u64();
            let start_offset = r.u64();
            let len = usize::from(r.u16());
            let name = r.bytes(len).ok_or("checkpoint ends inside a topic name")?;
            if id == u32::MAX {
                // Ids are assigned below `next_id`, itself a u32: this one cannot have been.
                return Err("partition id out of range");
            }
            let topic = std::str::from_utf8(name)
                .map_err(|_| "topic name is not UTF-8")?
                .to_string();
            if start_offset > next_offset {
                return Err("partition start offset above its next offset");
            }
            if next_offset > crate::format::MAX_OFFSET {
                return Err("partition next offset beyond any a log reaches (2^62)");
            }
            reg.insert(id, topic, index);
            if let Some(p) = reg.partitions.get_mut(&id) {
                p.next_offset = next_offset;
                p.start_offset = start_offset;
            }
        }
        if r.remaining() != 0 {
            return Err("trailing bytes after the checkpoint");
        }
        reg.next_id = reg.next_id.max(next_id);
        Ok(reg)
    }
}

/// Payload of a CreatePartition record: index then the topic name.
pub fn encode_create(topic: &str, index: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + topic.len());
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(topic.as_bytes());
    out
}

pub fn decode_create(payload: &[u8]) -> Result<(String, u32), &'static str> {
    if payload.len() < 4 {
        return Err("create-partition record too short");
    }
    let index = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
    let topic = std::str::from_utf8(&payload[4..]).map_err(|_| "topic name is not UTF-8")?;
    Ok((topic.to_string(), index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_round_trips_through_a_checkpoint() {
        let mut r = Registry::default();
        r.insert(0, "orders".into(), 0);
        r.insert(1, "orders".into(), 1);
        r.insert(5, "élan".into(), 3);
        r.get_mut(1).unwrap().next_offset = 42;
        r.get_mut(1).unwrap().start_offset = 7;
        r.remove(0);
        let back = Registry::decode(&r.encode()).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.next_id(), 6);
        assert_eq!(back.lookup("orders", 1), Some(1));
        assert_eq!(back.lookup("orders", 0), None);
    }

    #[test]
    fn truncated_checkpoints_are_errors() {
        let mut r = Registry::default();
        r.insert(0, "t".into(), 0);
        let enc = r.encode();
        for cut in 0..enc.len() {
            assert!(Registry::decode(&enc[..cut]).is_err(), "cut at {cut}");
        }
    }
}
