//! Snapshots of the idempotent producers' state, so that start-up replays only the records that
//! follow them instead of every data partition from its first retained record.
//!
//! A snapshot of data partition p is `(through, producers)` in `__nvmq_meta` records
//! (`MetaRecord::ProducerState`, split into consecutive parts when it does not fit one record).
//! Start-up takes the newest complete snapshot of p, restores it, and replays p's records at
//! offsets >= `through`.
//!
//! Why that rebuilds what a replay of the whole partition would:
//!
//! 1. **What a snapshot holds.** It is taken under the `Producers` lock, from the acknowledged
//!    view: every append to p (idempotent or not) is acknowledged on the log's writer thread in
//!    log order, and each acknowledgement, under the same lock, raises p's acknowledged end
//!    (`through`) to the end of that append and applies the batch to its producer with the same
//!    rule a start-up replay uses. So at any moment under the lock, the acknowledged view is
//!    exactly the replay of p's appends below `through`, and no append at or above `through` is
//!    in it: appends not yet acknowledged come later in log order, and batches not yet queued
//!    (checked but waiting to be appended) get offsets at or above every offset assigned so far.
//!    Batches in flight therefore never block a snapshot and never enter it; a busy partition is
//!    snapshotted like an idle one (`through` simply stays below its oldest append in flight).
//! 2. **A durable snapshot covers durable records.** Every append below `through` was queued
//!    before the snapshot record was (it was acknowledged before the snapshot was taken), and the
//!    log places and makes appends durable in queue order, as one prefix across all partitions.
//!    If the snapshot record survived a crash, so did every record of p below `through`: the
//!    recovered end of p is >= `through`. That holds in the relaxed flush modes too, where an
//!    acknowledgement can precede durability: the prefix argument does not depend on acks.
//! 3. **A cut re-uses offsets, which is harmless.** After a crash the log continues p at its
//!    recovered end, re-using the offsets of records the cut removed. A snapshot that survived
//!    has `through` <= that end (2), so the records below `through` it describes are the ones
//!    the log still holds, and the records re-using offsets are all at or above `through`, which
//!    start-up replays. Snapshots taken after the cut describe the new records.
//! 4. **Defences.** A snapshot whose `through` is past p's recovered end (which 2 rules out, so
//!    only damage could produce it) is ignored with a warning and p is replayed in full. So is
//!    one whose `through` lies below p's first retained offset: retention freed records the
//!    snapshot does not cover, and a full replay of what is retained is what nvmq did before
//!    snapshots existed. A snapshot cut short by a crash (some parts missing) is not complete
//!    and an older complete one is used.
//! 5. **Retention.** The broker re-records every partition's snapshot at least every quarter
//!    ring (with the rest of its internal state), so the newest snapshot is never freed while a
//!    newer record of p is kept; in between, partitions whose acknowledged end moved are
//!    snapshotted every `PRODUCER_SNAPSHOT_BYTES` of log written, which bounds what start-up
//!    replays after a crash; a clean shutdown snapshots every partition once nothing is in
//!    flight, so a clean restart replays nothing.
//!
//! Producer-id expiry: a snapshot leaves out producers not seen for the expiration time, and
//! start-up drops those that expired since. Producers found in the replayed records count as
//! seen at start-up (the log does not keep an append time, and producers' own timestamps may be
//! anything), so a restart can only delay an expiry, never bring it forward.

use std::collections::HashMap;

use crate::meta::{
    MetaRecord, ProducerSnap, ProducerStatePart, PRODUCER_SNAP_MAX_LEN, PRODUCER_STATE_HEADER_LEN,
};
use crate::producers::PartitionSnap;
use crate::snapshot_parts::{self, Parts};

/// Log bytes written between snapshots of the partitions whose producers changed (besides the
/// full snapshot every quarter ring): what start-up replays after a crash is about this much.
pub const PRODUCER_SNAPSHOT_BYTES: u64 = 32 << 20;

/// The records of one partition's snapshot, in order, each at most `max_payload` bytes.
pub fn records(partition: u32, snap: PartitionSnap, max_payload: usize) -> Vec<MetaRecord> {
    let per =
        (max_payload.saturating_sub(PRODUCER_STATE_HEADER_LEN) / PRODUCER_SNAP_MAX_LEN).max(1);
    // A partition without idempotent producers still gets its `through` (one empty part):
    // start-up then skips its records.
    snapshot_parts::cut(snap.producers, per, |part, parts, producers| {
        MetaRecord::ProducerState(ProducerStatePart {
            partition,
            through: snap.through,
            part,
            parts,
            producers,
        })
    })
}

/// Collects snapshot parts replayed from `__nvmq_meta` in log order; keeps the newest complete
/// snapshot of each partition.
#[derive(Default)]
pub struct Assembler(Parts<u64, ProducerSnap>);

impl Assembler {
    pub fn add(&mut self, rec: ProducerStatePart) {
        self.0.add(
            rec.partition,
            rec.through,
            rec.part,
            rec.parts,
            rec.producers,
        );
    }

    /// The newest complete snapshot of each partition.
    pub fn finish(self) -> HashMap<u32, PartitionSnap> {
        self.0
            .finish()
            .into_iter()
            .map(|(p, (through, producers))| (p, PartitionSnap { through, producers }))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::StoredBatch;

    fn producer(id: i64) -> ProducerSnap {
        ProducerSnap {
            id,
            epoch: 0,
            last_seen_ms: 5,
            batches: vec![StoredBatch {
                first_seq: 0,
                last_seq: 0,
                offset: 1,
            }],
        }
    }

    fn feed(a: &mut Assembler, recs: &[MetaRecord]) {
        for r in recs {
            if let MetaRecord::ProducerState(part) = r.clone() {
                a.add(part);
            }
        }
    }

    #[test]
    fn parts_fit_the_payload_and_reassemble_and_a_cut_snapshot_is_not_used() {
        let snap = |through, n: i64| PartitionSnap {
            through,
            producers: (0..n).map(producer).collect(),
        };
        let max = PRODUCER_STATE_HEADER_LEN + 3 * PRODUCER_SNAP_MAX_LEN;
        let first = records(4, snap(10, 7), max);
        assert_eq!(first.len(), 3);
        assert!(first.iter().all(|r| r.encode().len() <= max));
        assert_eq!(records(4, snap(10, 0), max).len(), 1);

        let mut a = Assembler::default();
        feed(&mut a, &first);
        // A newer snapshot cut short after its first part: the older one stays.
        let second = records(4, snap(20, 7), max);
        feed(&mut a, &second[..1]);
        let got = a.finish();
        assert_eq!(got[&4], snap(10, 7));

        // Parts of two snapshots interleaved by a cut: only the whole later one counts.
        let mut a = Assembler::default();
        feed(&mut a, &second[..2]);
        feed(&mut a, &first);
        feed(&mut a, &second[2..]);
        assert_eq!(a.finish()[&4], snap(10, 7));
    }
}
