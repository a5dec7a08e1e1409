//! Snapshots of a data partition's state written as several consecutive internal records
//! ("parts") when one record cannot hold them: cut on the way out, put together on replay, where
//! only a snapshot whose parts all arrived, in order, counts (a crash may cut one short).

use std::collections::HashMap;

/// The records of a snapshot of `items`, at most `per` items each (at least one record, so that
/// a snapshot of nothing is still recorded): `record(part, parts, its items)`.
pub fn cut<T, R>(items: Vec<T>, per: usize, record: impl Fn(u32, u32, Vec<T>) -> R) -> Vec<R> {
    let chunks = chunks(items, per);
    let parts = chunks.len() as u32;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, items)| record(i as u32, parts, items))
        .collect()
}

/// `items` cut into chunks of at most `per` (at least one, possibly empty).
fn chunks<T>(items: Vec<T>, per: usize) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = Vec::new();
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        out.push(items.by_ref().take(per.max(1)).collect());
    }
    if out.is_empty() {
        out.push(Vec::new());
    }
    out
}

struct Pending<H, T> {
    head: H,
    parts: u32,
    next: u32,
    items: Vec<T>,
}

/// Collects the parts of snapshots replayed in log order, each part carrying the snapshot's
/// `head` (what every part repeats) and some of its items; keeps the newest complete snapshot of
/// each partition.
pub struct Parts<H, T> {
    pending: HashMap<u32, Pending<H, T>>,
    complete: HashMap<u32, (H, Vec<T>)>,
}

impl<H, T> Default for Parts<H, T> {
    fn default() -> Self {
        Parts {
            pending: HashMap::new(),
            complete: HashMap::new(),
        }
    }
}

impl<H: PartialEq, T> Parts<H, T> {
    pub fn add(&mut self, partition: u32, head: H, part: u32, parts: u32, items: Vec<T>) {
        if part == 0 {
            self.pending.insert(
                partition,
                Pending {
                    head,
                    parts,
                    next: 0,
                    items: Vec::new(),
                },
            );
        } else {
            let matches = self
                .pending
                .get(&partition)
                .is_some_and(|p| p.head == head && p.parts == parts && p.next == part);
            if !matches {
                // Parts of a snapshot cut short, followed by parts of another: neither is whole.
                self.pending.remove(&partition);
                return;
            }
        }
        let Some(p) = self.pending.get_mut(&partition) else {
            return;
        };
        p.items.extend(items);
        p.next += 1;
        if p.next == p.parts {
            if let Some(p) = self.pending.remove(&partition) {
                self.complete.insert(partition, (p.head, p.items));
            }
        }
    }

    /// The newest complete snapshot of each partition.
    pub fn finish(self) -> HashMap<u32, (H, Vec<T>)> {
        self.complete
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_reassemble_and_a_snapshot_cut_short_is_not_used() {
        assert_eq!(
            chunks(vec![1, 2, 3, 4, 5], 2),
            vec![vec![1, 2], vec![3, 4], vec![5]]
        );
        assert_eq!(chunks(Vec::<u8>::new(), 2), vec![Vec::<u8>::new()]);
        let mut a: Parts<u64, u8> = Parts::default();
        a.add(4, 10, 0, 2, vec![1]);
        a.add(4, 10, 1, 2, vec![2]);
        // A newer one cut short after its first part: the older one stays.
        a.add(4, 20, 0, 2, vec![3]);
        // Parts of two snapshots interleaved: neither counts.
        a.add(5, 10, 0, 2, vec![1]);
        a.add(5, 11, 1, 2, vec![2]);
        let got = a.finish();
        assert_eq!(got[&4], (10, vec![1, 2]));
        assert!(!got.contains_key(&5));
    }
}
