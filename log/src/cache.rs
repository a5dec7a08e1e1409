//! The tail cache: copies of the newest durable batches, so that a consumer at the tail is
//! served from memory instead of reading the device (storage.md §1 still holds: a batch enters
//! only once it is durable, and a reader checks a cached batch exactly as one read from the
//! device: checksums, positions, epochs, format id).
//!
//! Bounded in bytes; the oldest batch leaves first. Batches are copied into large shared chunks
//! so that caching a batch costs no allocation of its own.

use std::collections::{HashMap, VecDeque};

use bytes::{Bytes, BytesMut};

/// Chunk size of the copies (a batch larger than this gets a chunk of its own size).
const CHUNK: usize = 4 << 20;

#[derive(Debug, Default)]
pub struct BatchCache {
    budget: usize,
    used: usize,
    by_position: HashMap<u64, Bytes>,
    /// Positions in the order they entered: eviction order.
    order: VecDeque<u64>,
    /// Copies of batches written but not yet durable: (position, end, bytes), in log order.
    staged: VecDeque<(u64, u64, Bytes)>,
    chunk: BytesMut,
    /// Batches served from the cache, and reads that missed it (for metrics).
    pub hits: u64,
    pub misses: u64,
}

impl BatchCache {
    pub fn new(budget: usize) -> BatchCache {
        BatchCache {
            budget,
            ..BatchCache::default()
        }
    }

    /// The cache's byte bound.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes of batches held.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Keeps a copy of the durable batch at `position`, evicting the oldest to stay in budget.
    pub fn insert(&mut self, position: u64, batch: &[u8]) {
        if batch.len() > self.budget || self.by_position.contains_key(&position) {
            return;
        }
        let copy = self.copy(batch);
        self.admit(position, copy);
    }

    fn copy(&mut self, batch: &[u8]) -> Bytes {
        if self.chunk.capacity() - self.chunk.len() < batch.len() {
            self.chunk = BytesMut::with_capacity(CHUNK.max(batch.len()));
        }
        self.chunk.extend_from_slice(batch);
        self.chunk.split().freeze()
    }

    fn admit(&mut self, position: u64, copy: Bytes) {
        while self.used + copy.len() > self.budget {
            if !self.evict_oldest() {
                break;
            }
        }
        self.used += copy.len();
        self.by_position.insert(position, copy);
        self.order.push_back(position);
    }

    /// Copies a batch just written at `position` (not durable yet: invisible until
    /// `publish_through` passes its end).
    pub fn stage(&mut self, position: u64, batch: &[u8]) {
        if batch.len() > self.budget {
            return;
        }
        let copy = self.copy(batch);
        self.staged
            .push_back((position, position + batch.len() as u64, copy));
    }

    /// Makes every staged batch that ends at or below `durable` visible.
    pub fn publish_through(&mut self, durable: u64) {
        while self
            .staged
            .front()
            .is_some_and(|(_, end, _)| *end <= durable)
        {
            if let Some((position, _, copy)) = self.staged.pop_front() {
                self.admit(position, copy);
            }
        }
    }

    /// Drops what was staged and never became durable (the writer stopped).
    pub fn discard_staged(&mut self) {
        self.staged.clear();
    }

    fn evict_oldest(&mut self) -> bool {
        match self.order.pop_front() {
            Some(p) => {
                if let Some(b) = self.by_position.remove(&p) {
                    self.used -= b.len();
                }
                true
            }
            None => false,
        }
    }

    /// The cached batch at `position` if it holds exactly `len` bytes.
    pub fn get(&mut self, position: u64, len: u64) -> Option<Bytes> {
        match self.by_position.get(&position) {
            Some(b) if b.len() as u64 == len => {
                self.hits += 1;
                Some(b.clone())
            }
            _ => {
                self.misses += 1;
                None
            }
        }
    }

    /// Forgets every batch below `head` (retention freed them).
    pub fn drop_below(&mut self, head: u64) {
        while self.order.front().is_some_and(|&p| p < head) {
            self.evict_oldest();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_batches_within_its_budget() {
        let mut c = BatchCache::new(3 * 4096);
        for i in 0..5u64 {
            c.insert(i * 4096, &vec![i as u8; 4096]);
        }
        assert_eq!(c.used(), 3 * 4096);
        assert!(c.get(0, 4096).is_none());
        assert!(c.get(4096, 4096).is_none());
        for i in 2..5u64 {
            let b = c.get(i * 4096, 4096).expect("cached");
            assert!(b.iter().all(|&x| x == i as u8));
        }
        assert!(
            c.get(2 * 4096, 8192).is_none(),
            "a different length is a miss"
        );
        assert_eq!((c.hits, c.misses), (3, 3));
    }

    #[test]
    fn retention_and_oversized_batches() {
        let mut c = BatchCache::new(8192);
        c.insert(0, &[1; 4096]);
        c.insert(4096, &[2; 4096]);
        c.drop_below(4096);
        assert!(c.get(0, 4096).is_none());
        assert!(c.get(4096, 4096).is_some());
        c.insert(8192, &[3; 16384]);
        assert!(c.get(8192, 16384).is_none(), "larger than the whole budget");
        assert_eq!(c.used(), 4096);
    }

    #[test]
    fn staged_batches_are_invisible_until_durable() {
        let mut c = BatchCache::new(1 << 20);
        c.stage(0, &[1; 4096]);
        c.stage(4096, &[2; 8192]);
        assert!(c.get(0, 4096).is_none());
        c.publish_through(8192);
        assert!(c.get(0, 4096).is_some());
        assert!(c.get(4096, 8192).is_none(), "ends past D");
        c.publish_through(12288);
        assert!(c.get(4096, 8192).is_some());
        c.stage(12288, &[3; 4096]);
        c.discard_staged();
        c.publish_through(1 << 30);
        assert!(c.get(12288, 4096).is_none());
    }
}
