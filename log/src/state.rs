//! What a checkpoint holds and a scan replays: the partition registry with each partition's next
//! and first retained offset (storage.md §4.5).
//!
//! A checkpoint is one or more consecutive checkpoint batches, one record each (a *part*); each
//! part holds a slice of the registry in the encoding of [`Registry::encode`], partitions in id
//! order, so that the registry fits its checkpoint however many partitions exist. Parts are cut
//! between entries. The record header says where a part stands: its `offset` is the part's index
//! (from 0) and its `partition` is [`PART_CONTINUES`] when another part follows in the next batch,
//! 0 on the last. A checkpoint of one batch written before parts existed reads as part 0 of 1.

use std::collections::{BTreeMap, HashMap};

use crate::format::{Reader, BATCH_HEADER_LEN, RECORD_HEADER_LEN};
use crate::layout::Geometry;

/// Longest topic name accepted (Kafka's limit).
pub const MAX_TOPIC_LEN: usize = 249;

/// Encoded bytes of one registry entry besides its topic name.
pub const ENTRY_FIXED_LEN: usize = 26;
/// The largest encoded entry (a topic name of [`MAX_TOPIC_LEN`] bytes).
pub const MAX_ENTRY_LEN: usize = ENTRY_FIXED_LEN + MAX_TOPIC_LEN;
/// Encoded bytes of a part's counts (next id, entry count) before its entries.
pub const PART_HEADER_LEN: usize = 8;
/// The `partition` field of a checkpoint record whose checkpoint goes on in the next batch.
pub const PART_CONTINUES: u32 = 1;

/// Payload bytes one checkpoint part may hold in a batch of `max_batch` bytes: the batch header,
/// the record header and the record's padding to 8 bytes come off.
pub fn part_capacity(max_batch: u64) -> usize {
    (max_batch as usize).saturating_sub(BATCH_HEADER_LEN + RECORD_HEADER_LEN + 8) & !7
}

/// Log bytes a checkpoint of a registry whose entries take `entry_bytes` takes at most: parts are
/// cut between entries, so each but the last holds at least a part's capacity less one entry,
/// and each takes at most one maximum batch.
pub fn checkpoint_bound(geo: &Geometry, entry_bytes: u64) -> u64 {
    let capacity = part_capacity(geo.max_batch);
    if PART_HEADER_LEN as u64 + entry_bytes <= capacity as u64 {
        return geo.max_batch;
    }
    let per_part = capacity.saturating_sub(PART_HEADER_LEN + MAX_ENTRY_LEN);
    let parts = 1 + entry_bytes.div_ceil(per_part.max(1) as u64);
    parts.saturating_mul(geo.max_batch)
}

/// Whether a registry of `partitions` entries taking `entry_bytes` takes `count` more entries
/// for `topic` within the checkpoint `budget`; the error names the figures when not.
pub fn check_registry_room(
    geo: &Geometry,
    partitions: usize,
    entry_bytes: u64,
    topic: &str,
    count: u32,
    budget: u64,
) -> Result<(), crate::LogError> {
    let more = u64::from(count) * (ENTRY_FIXED_LEN + topic.len()) as u64;
    let needed = checkpoint_bound(geo, entry_bytes + more);
    if needed > budget {
        return Err(crate::LogError::RegistryFull {
            partitions,
            needed,
            budget,
        });
    }
    Ok(())
}

/// Log bytes the registry's checkpoint may take: an eighth of what the ring has besides the
/// in-flight window and four maximum batches, and at least one batch (the checkpoint of a log too
/// small for more). The writer keeps this much room for a checkpoint (storage.md §4.3), so
/// creating a partition whose entry would take the checkpoint past it is refused.
pub fn checkpoint_budget(geo: &Geometry) -> u64 {
    let spare = geo.log_size.saturating_sub(geo.window + 4 * geo.max_batch) / 8;
    (spare / geo.max_batch.max(1) * geo.max_batch).max(geo.max_batch)
}

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
    /// Encoded bytes of every entry (the checkpoint's size, less its parts' counts).
    entry_bytes: u64,
}

/// One part of a checkpoint, encoded: its payload and where the next part starts (None when it is
/// the last).
pub struct EncodedPart {
    pub payload: Vec<u8>,
    pub next: Option<u32>,
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
    /// Encoded bytes of every entry: what the checkpoint holds besides its parts' counts.
    pub fn entry_bytes(&self) -> u64 {
        self.entry_bytes
    }

    /// Adds a partition with the given id (ids come from `next_id` at append, or from the log at
    /// replay); one already there under that id is replaced.
    pub fn insert(&mut self, id: u32, topic: String, index: u32) {
        self.remove(id);
        self.entry_bytes += (ENTRY_FIXED_LEN + topic.len()) as u64;
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

    /// Removes a partition; its id is never assigned again (`next_id` stays).
    pub fn remove(&mut self, id: u32) -> Option<PartitionState> {
        let p = self.partitions.remove(&id)?;
        self.entry_bytes -= (ENTRY_FIXED_LEN + p.topic.len()) as u64;
        if self.by_name.get(&(p.topic.clone(), p.index)) == Some(&id) {
            self.by_name.remove(&(p.topic.clone(), p.index));
        }
        Some(p)
    }

    /// Checkpoint encoding of the whole registry in one part: next_id, count, then each
    /// partition.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_part(0, usize::MAX).payload
    }

    /// Encodes the partitions from id `from` on, as many as fit `capacity` bytes (at least one,
    /// so that a part always moves the checkpoint on), as one checkpoint part.
    pub fn encode_part(&self, from: u32, capacity: usize) -> EncodedPart {
        let mut out = Vec::with_capacity(capacity.min(PART_HEADER_LEN + self.entry_bytes as usize));
        out.extend_from_slice(&self.next_id.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        let mut count = 0u32;
        let mut next = None;
        for p in self.partitions.range(from..).map(|(_, p)| p) {
            if count > 0 && out.len() + ENTRY_FIXED_LEN + p.topic.len() > capacity {
                next = Some(p.id);
                break;
            }
            out.extend_from_slice(&p.id.to_le_bytes());
            out.extend_from_slice(&p.index.to_le_bytes());
            out.extend_from_slice(&p.next_offset.to_le_bytes());
            out.extend_from_slice(&p.start_offset.to_le_bytes());
            out.extend_from_slice(&(p.topic.len() as u16).to_le_bytes());
            out.extend_from_slice(p.topic.as_bytes());
            count += 1;
        }
        out[4..8].copy_from_slice(&count.to_le_bytes());
        EncodedPart { payload: out, next }
    }

    /// Decodes a checkpoint payload (one part). The record's checksum already held, so a failure
    /// here means a writer bug or a format mismatch; it is still an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Registry, &'static str> {
        if bytes.len() < PART_HEADER_LEN {
            return Err("checkpoint shorter than its counts");
        }
        let mut r = Reader::new(bytes);
        let mut reg = Registry::default();
        let next_id = r.u32();
        let count = r.u32();
        for _ in 0..count {
            if r.remaining() < ENTRY_FIXED_LEN {
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
            if reg.partitions.contains_key(&id) || reg.lookup(&topic, index).is_some() {
                return Err("a partition listed twice");
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

    /// Adds the next part of a checkpoint being read (decoded with [`Registry::decode`]): its
    /// partitions must all come after this one's, as the writer cuts parts in id order.
    pub fn append_part(&mut self, part: Registry) -> Result<(), &'static str> {
        let last = self.partitions.keys().next_back().copied();
        for (id, p) in part.partitions {
            if last.is_some_and(|l| id <= l) {
                return Err("checkpoint part out of partition order");
            }
            if self.lookup(&p.topic, p.index).is_some() {
                return Err("a partition listed twice");
            }
            let (next_offset, start_offset) = (p.next_offset, p.start_offset);
            self.insert(id, p.topic, p.index);
            if let Some(q) = self.partitions.get_mut(&id) {
                q.next_offset = next_offset;
                q.start_offset = start_offset;
            }
        }
        self.next_id = self.next_id.max(part.next_id);
        Ok(())
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

    fn geo(max_batch: u64, log_size: u64, window: u64) -> Geometry {
        Geometry {
            format_id: 1,
            write_unit: 4096,
            log_start: 2 << 20,
            log_size,
            max_batch,
            window,
            logical_block: 512,
        }
    }

    /// A registry of `n` partitions with names of 1 to 80 bytes, some deleted.
    fn many(n: u32) -> Registry {
        let mut r = Registry::default();
        for id in 0..n {
            let name = format!("t{}", "x".repeat((id % 80) as usize));
            r.insert(id, name, id);
            if let Some(p) = r.get_mut(id) {
                p.next_offset = u64::from(id) * 3;
                p.start_offset = u64::from(id);
            }
        }
        for id in (0..n).step_by(5) {
            r.remove(id);
        }
        r
    }

    #[test]
    fn parts_cut_between_entries_add_up_to_the_registry() {
        let r = many(3000);
        assert_eq!(r.entry_bytes() as usize + 8, r.encode().len());
        for capacity in [300usize, 4096, 65536 - 120] {
            let mut from = 0;
            let mut back: Option<Registry> = None;
            let mut parts = 0;
            loop {
                let part = r.encode_part(from, capacity);
                assert!(
                    part.payload.len() <= capacity,
                    "{} > {capacity}",
                    part.payload.len()
                );
                let dec = Registry::decode(&part.payload).unwrap();
                assert!(!dec.is_empty());
                back = Some(match back {
                    None => dec,
                    Some(mut b) => {
                        b.append_part(dec).unwrap();
                        b
                    }
                });
                parts += 1;
                match part.next {
                    Some(n) => from = n,
                    None => break,
                }
            }
            assert_eq!(back.as_ref(), Some(&r), "capacity {capacity}");
            assert!(parts > 1 || capacity > r.encode().len());
        }
        // An empty registry is one part of no entries.
        let e = Registry::default().encode_part(0, 300);
        assert!(e.next.is_none());
        assert_eq!(Registry::decode(&e.payload).unwrap(), Registry::default());
    }

    #[test]
    fn parts_out_of_order_or_repeated_are_refused() {
        let r = many(100);
        let a = r.encode_part(0, 600);
        let b = r.encode_part(a.next.unwrap(), 600);
        let (a, b) = (
            Registry::decode(&a.payload).unwrap(),
            Registry::decode(&b.payload).unwrap(),
        );
        let mut twice = a.clone();
        assert!(twice.append_part(a.clone()).is_err());
        let mut backwards = b.clone();
        assert!(backwards.append_part(a).is_err());
        // The same (topic, index) under two ids, in one part.
        let mut dup = Registry::default();
        dup.insert(0, "t".into(), 0);
        let mut enc = dup.encode();
        enc[4] = 2;
        enc.extend_from_within(8..);
        enc[8] = 1;
        assert_eq!(Registry::decode(&enc), Err("a partition listed twice"));
    }

    #[test]
    fn a_checkpoint_takes_no_more_than_its_bound() {
        for max_batch in [4096u64, 65536, 1 << 20] {
            let g = geo(max_batch, 64 << 20, 1 << 20);
            for n in [0u32, 1, 50, 2000, 20_000] {
                let r = many(n);
                let cap = part_capacity(max_batch);
                let mut from = 0;
                let mut bytes = 0u64;
                loop {
                    let part = r.encode_part(from, cap);
                    let len = BATCH_HEADER_LEN + crate::format::record_size(part.payload.len());
                    assert!(len as u64 <= max_batch);
                    bytes += (len as u64).div_ceil(4096) * 4096;
                    match part.next {
                        Some(n) => from = n,
                        None => break,
                    }
                }
                let bound = checkpoint_bound(&g, r.entry_bytes());
                assert!(
                    bytes <= bound,
                    "{n} partitions, batches of {max_batch}: {bytes} > {bound}"
                );
            }
        }
    }

    #[test]
    fn the_checkpoint_budget_is_an_eighth_of_the_spare_ring_and_at_least_a_batch() {
        let mb = 1 << 20;
        // The smallest log a geometry allows keeps room for a checkpoint of one batch.
        assert_eq!(
            checkpoint_budget(&geo(mb, (16 << 20) + 4 * mb, 16 << 20)),
            mb
        );
        // 512 MiB with the defaults: 61 MiB, about 700,000 partitions of 60-byte names.
        let b = checkpoint_budget(&geo(mb, 510 << 20, 16 << 20));
        assert_eq!(b, 61 << 20);
        let entry = (ENTRY_FIXED_LEN + 60) as u64;
        let fits = (0u64..)
            .step_by(10_000)
            .take_while(|n| checkpoint_bound(&geo(mb, 510 << 20, 16 << 20), n * entry) <= b)
            .last()
            .unwrap();
        assert!(fits >= 700_000, "{fits}");
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
