//! Idempotent producers: per (producer id, partition), the sequence ranges of the last batches
//! stored, so that a retry after a lost answer is answered with the original offset instead of
//! being stored twice, and a gap is refused (Kafka's rules, KIP-98).
//!
//! Each producer's state is kept twice: the live view `check` decides on (it holds batches still
//! in flight), and the acknowledged view, which is exactly what a replay of the partition's
//! records below its acknowledged end builds. The second one is what a snapshot records
//! (`producer_snapshots` says why that is sound).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use crate::batch::BatchInfo;
use crate::broker::lock;
use crate::codes;
use crate::meta::{ProducerSnap, StoredBatch, MAX_SNAP_BATCHES};
use crate::part::PartRef;

/// Batches remembered per producer and partition (Kafka keeps 5, as many as a producer may have
/// in flight).
pub const REMEMBERED: usize = MAX_SNAP_BATCHES;

/// Kafka's producer.id.expiration.ms default: one day.
pub const DEFAULT_EXPIRATION: Duration = Duration::from_secs(24 * 3600);

/// Where a remembered batch landed: known once durable (None while in flight; Err if it failed).
pub type Landing = watch::Receiver<Option<Result<i64, ()>>>;
/// The sending side of a `Landing`.
pub type LandingTx = watch::Sender<Option<Result<i64, ()>>>;

struct Remembered {
    first_seq: i32,
    last_seq: i32,
    landing: Landing,
}

impl Remembered {
    /// Its append was never queued: the request was dropped (its connection closed while it
    /// waited to append), so the sender is gone without a landing. Nothing was stored.
    fn abandoned(&self) -> bool {
        self.landing.borrow().is_none() && self.landing.has_changed().is_err()
    }

    fn in_flight(&self) -> bool {
        self.landing.borrow().is_none() && self.landing.has_changed().is_ok()
    }
}

struct State {
    epoch: i16,
    batches: VecDeque<Remembered>,
    /// The acknowledged view: the epoch and newest batches among the producer's batches whose
    /// append was acknowledged (None before the first one is).
    acked: Option<(i16, VecDeque<StoredBatch>)>,
    /// Wall-clock ms of the last batch taken (or replayed at start).
    last_seen_ms: i64,
}

impl State {
    fn new(epoch: i16, now_ms: i64) -> State {
        State {
            epoch,
            batches: VecDeque::new(),
            acked: None,
            last_seen_ms: now_ms,
        }
    }

    /// A batch is in flight until its landing is known, unless nobody can tell it any more (the
    /// request that checked it was dropped before queueing it).
    fn in_flight(&self) -> bool {
        self.batches.iter().any(Remembered::in_flight)
    }
}

#[derive(Default)]
struct Part {
    producers: HashMap<i64, State>,
    /// The end of the last append to the partition whose acknowledgement ran. Acknowledgements
    /// run in log order, so every append below it was acknowledged, and every append not yet
    /// acknowledged (or not yet queued) lands at or above it.
    acked_end: u64,
    /// `acked_end` when the partition's last snapshot was taken.
    snapped: Option<u64>,
}

/// The identity of an idempotent batch, handed back when its append is acknowledged.
#[derive(Debug, Clone, Copy)]
pub struct BatchKey {
    producer_id: i64,
    epoch: i16,
    first_seq: i32,
    last_seq: i32,
}

impl BatchKey {
    /// None for a batch of a producer that is not idempotent.
    pub fn of(info: &BatchInfo) -> Option<BatchKey> {
        (info.producer_id >= 0).then(|| BatchKey {
            producer_id: info.producer_id,
            epoch: info.producer_epoch,
            first_seq: info.base_sequence,
            last_seq: info.last_sequence(),
        })
    }
}

/// A snapshot of one partition's producers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionSnap {
    /// Every idempotent batch below it is reflected in `producers`; none at or above it is.
    pub through: u64,
    pub producers: Vec<ProducerSnap>,
}

/// What to do with a produced batch.
pub enum Verdict {
    /// Not idempotent, or the next in sequence: store it; send where it landed to the sender.
    Store(Option<LandingTx>),
    /// A retry of a batch already stored (or in flight): answer with where that one landed.
    Duplicate(Landing),
    /// Refuse with this error code.
    Refuse(i16, String),
}

pub struct Producers {
    parts: Mutex<HashMap<PartRef, Part>>,
    expiration_ms: i64,
}

impl Default for Producers {
    fn default() -> Self {
        Producers::new(DEFAULT_EXPIRATION)
    }
}

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn next_seq(s: i32) -> i32 {
    if s == i32::MAX {
        0
    } else {
        s + 1
    }
}

/// The replay rule, shared by start-up and acknowledgements: a batch of another epoch starts the
/// producer's history over; the newest `REMEMBERED` batches are kept.
fn push_stored(acked: &mut Option<(i16, VecDeque<StoredBatch>)>, key: &BatchKey, offset: u64) {
    let (e, batches) = acked.get_or_insert_with(|| (key.epoch, VecDeque::new()));
    if *e != key.epoch {
        *e = key.epoch;
        batches.clear();
    }
    batches.push_back(StoredBatch {
        first_seq: key.first_seq,
        last_seq: key.last_seq,
        offset,
    });
    while batches.len() > REMEMBERED {
        batches.pop_front();
    }
}

fn resolved(offset: u64) -> Landing {
    watch::channel(Some(Ok(offset as i64))).1
}

impl Producers {
    /// Producer state not seen for `expiration` is dropped (Kafka's producer.id.expiration.ms).
    pub fn new(expiration: Duration) -> Producers {
        Producers {
            parts: Mutex::new(HashMap::new()),
            expiration_ms: i64::try_from(expiration.as_millis()).unwrap_or(i64::MAX),
        }
    }

    fn expired(&self, st: &State, now_ms: i64) -> bool {
        now_ms.saturating_sub(st.last_seen_ms) >= self.expiration_ms
    }

    /// Startup: the partition's records end at `end` (everything below it is durable).
    pub fn set_end(&self, partition: PartRef, end: u64) {
        let mut m = lock(&self.parts);
        let part = m.entry(partition).or_default();
        part.acked_end = part.acked_end.max(end);
    }

    /// The partition was deleted: its producers' state goes with it (ids are never reused).
    pub fn forget(&self, partition: PartRef) {
        lock(&self.parts).remove(&partition);
    }

    /// Startup: the partition's state from a snapshot (its producers not expired at `now_ms`).
    /// Returns how many producers were expired and left out.
    pub fn restore(&self, partition: PartRef, producers: Vec<ProducerSnap>, now_ms: i64) -> usize {
        let mut m = lock(&self.parts);
        let part = m.entry(partition).or_default();
        let mut expired = 0;
        for p in producers {
            let mut st = State::new(p.epoch, p.last_seen_ms);
            if self.expired(&st, now_ms) {
                expired += 1;
                continue;
            }
            let mut acked = VecDeque::new();
            for b in p.batches.iter().rev().take(REMEMBERED).rev() {
                st.batches.push_back(Remembered {
                    first_seq: b.first_seq,
                    last_seq: b.last_seq,
                    landing: resolved(b.offset),
                });
                acked.push_back(*b);
            }
            st.acked = Some((p.epoch, acked));
            part.producers.insert(p.id, st);
        }
        expired
    }

    /// Startup: a batch found in the log (seen at `now_ms`, the time of the start: the log does
    /// not say when it was appended, and a producer's own timestamps may be anything).
    pub fn replay(&self, partition: PartRef, info: &BatchInfo, offset: u64, now_ms: i64) {
        let Some(key) = BatchKey::of(info) else {
            return;
        };
        let mut m = lock(&self.parts);
        let part = m.entry(partition).or_default();
        let st = part
            .producers
            .entry(key.producer_id)
            .or_insert_with(|| State::new(key.epoch, now_ms));
        st.last_seen_ms = now_ms;
        if key.epoch != st.epoch {
            st.epoch = key.epoch;
            st.batches.clear();
        }
        remember(st, info, resolved(offset));
        push_stored(&mut st.acked, &key, offset);
    }

    /// Decides on a produced batch. Called in request order; the batch is remembered at once (in
    /// flight) so that a retry arriving before it is durable finds it.
    pub fn check(&self, partition: PartRef, info: &BatchInfo) -> Verdict {
        self.check_at(partition, info, now_ms())
    }

    /// `check` at a given wall-clock time.
    pub fn check_at(&self, partition: PartRef, info: &BatchInfo, now_ms: i64) -> Verdict {
        if info.producer_id < 0 {
            return Verdict::Store(None);
        }
        let mut m = lock(&self.parts);
        let part = m.entry(partition).or_default();
        if part
            .producers
            .get(&info.producer_id)
            .is_some_and(|st| self.expired(st, now_ms) && !st.in_flight())
        {
            // An expired producer is a new one.
            part.producers.remove(&info.producer_id);
        }
        let (tx, rx) = watch::channel(None);
        let Some(st) = part.producers.get_mut(&info.producer_id) else {
            // Nothing known (a new producer, or one whose batches retention dropped, or one
            // that expired): any sequence starts it.
            let mut st = State::new(info.producer_epoch, now_ms);
            remember(&mut st, info, rx);
            part.producers.insert(info.producer_id, st);
            return Verdict::Store(Some(tx));
        };
        if info.producer_epoch < st.epoch {
            return Verdict::Refuse(
                codes::INVALID_PRODUCER_EPOCH,
                format!(
                    "producer {} epoch {} is older than its current epoch {}",
                    info.producer_id, info.producer_epoch, st.epoch
                ),
            );
        }
        if info.producer_epoch > st.epoch {
            if info.base_sequence != 0 {
                return Verdict::Refuse(
                    codes::OUT_OF_ORDER_SEQUENCE_NUMBER,
                    format!(
                        "producer {} starts epoch {} at sequence {}, expected 0",
                        info.producer_id, info.producer_epoch, info.base_sequence
                    ),
                );
            }
            st.epoch = info.producer_epoch;
            st.batches.clear();
            st.last_seen_ms = now_ms;
            remember(st, info, rx);
            return Verdict::Store(Some(tx));
        }
        // Requests start in order per connection, so an abandoned batch is the newest of its
        // producer: drop it, and its retry is stored instead of answered as a duplicate that
        // never landed (which the client would retry for ever).
        while st.batches.back().is_some_and(Remembered::abandoned) {
            st.batches.pop_back();
        }
        if let Some(b) = st
            .batches
            .iter()
            .find(|b| b.first_seq == info.base_sequence && b.last_seq == info.last_sequence())
        {
            st.last_seen_ms = now_ms;
            return Verdict::Duplicate(b.landing.clone());
        }
        let expected = st
            .batches
            .back()
            .map_or(info.base_sequence, |b| next_seq(b.last_seq));
        if info.base_sequence == expected {
            st.last_seen_ms = now_ms;
            remember(st, info, rx);
            return Verdict::Store(Some(tx));
        }
        // Below the remembered window: a duplicate whose answer is no longer known.
        let oldest = st.batches.front().map_or(expected, |b| b.first_seq);
        if info.base_sequence < oldest && oldest - info.base_sequence < i32::MAX / 2 {
            return Verdict::Refuse(
                codes::DUPLICATE_SEQUENCE_NUMBER,
                format!(
                    "producer {} sequence {} was stored long ago",
                    info.producer_id, info.base_sequence
                ),
            );
        }
        Verdict::Refuse(
            codes::OUT_OF_ORDER_SEQUENCE_NUMBER,
            format!(
                "producer {} sent sequence {}, expected {}",
                info.producer_id, info.base_sequence, expected
            ),
        )
    }

    /// The acknowledgement of an append to a data partition (every one, idempotent or not: the
    /// log runs them in log order). `landing` hears where an idempotent batch landed.
    pub fn acknowledged(
        &self,
        partition: PartRef,
        key: Option<BatchKey>,
        landing: Option<LandingTx>,
        result: Result<(u64, u32), ()>,
    ) {
        let mut m = lock(&self.parts);
        if let Some(tx) = landing {
            tx.send_replace(Some(result.map(|(offset, _)| offset as i64)));
        }
        let Ok((offset, span)) = result else {
            return;
        };
        let part = m.entry(partition).or_default();
        part.acked_end = part.acked_end.max(offset + u64::from(span));
        let Some(key) = key else {
            return;
        };
        if let Some(st) = part.producers.get_mut(&key.producer_id) {
            push_stored(&mut st.acked, &key, offset);
        }
    }

    /// The partition's producers as a replay of its records below its acknowledged end builds
    /// them, less those expired at `now_ms`. `changed_only`: None when the acknowledged end has
    /// not moved since the last snapshot.
    pub fn snapshot(
        &self,
        partition: PartRef,
        now_ms: i64,
        changed_only: bool,
    ) -> Option<PartitionSnap> {
        let mut m = lock(&self.parts);
        let part = m.entry(partition).or_default();
        if changed_only && part.snapped == Some(part.acked_end) {
            return None;
        }
        part.snapped = Some(part.acked_end);
        let mut producers: Vec<ProducerSnap> = part
            .producers
            .iter()
            .filter(|(_, st)| !self.expired(st, now_ms))
            .filter_map(|(&id, st)| {
                let (epoch, batches) = st.acked.as_ref()?;
                Some(ProducerSnap {
                    id,
                    epoch: *epoch,
                    last_seen_ms: st.last_seen_ms,
                    batches: batches.iter().copied().collect(),
                })
            })
            .collect();
        producers.sort_by_key(|p| p.id);
        Some(PartitionSnap {
            through: part.acked_end,
            producers,
        })
    }

    /// Drops the state of producers not seen for the expiration time (none with a batch in
    /// flight). Returns how many were dropped.
    pub fn expire(&self, now_ms: i64) -> usize {
        let mut m = lock(&self.parts);
        let mut dropped = 0;
        for part in m.values_mut() {
            let before = part.producers.len();
            part.producers
                .retain(|_, st| !self.expired(st, now_ms) || st.in_flight());
            dropped += before - part.producers.len();
        }
        dropped
    }

    /// Producers with state in the partition.
    pub fn count(&self, partition: PartRef) -> usize {
        lock(&self.parts)
            .get(&partition)
            .map_or(0, |p| p.producers.len())
    }
}

fn remember(st: &mut State, info: &BatchInfo, landing: Landing) {
    st.batches.push_back(Remembered {
        first_seq: info.base_sequence,
        last_seq: info.last_sequence(),
        landing,
    });
    while st.batches.len() > REMEMBERED {
        st.batches.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch;

    const P0: PartRef = PartRef { dev: 0, id: 0 };
    const P1: PartRef = PartRef { dev: 0, id: 1 };

    fn info(pid: i64, epoch: i16, seq: i32, n: i32) -> BatchInfo {
        batch::check(&batch::tests::make_batch(n, pid, epoch, seq, 1)).unwrap()
    }

    /// Checks a batch that must be taken and keeps its sender, as the produce path does until
    /// the append is acknowledged (a dropped sender means the append was never queued).
    fn take(p: &Producers, part: PartRef, i: &BatchInfo, held: &mut Vec<LandingTx>) {
        match p.check(part, i) {
            Verdict::Store(Some(tx)) => held.push(tx),
            _ => panic!("batch {i:?} not taken"),
        }
    }

    #[test]
    fn a_batch_whose_append_was_never_queued_is_stored_on_retry() {
        let p = Producers::default();
        let Verdict::Store(Some(first)) = p.check(P0, &info(4, 0, 0, 2)) else {
            panic!("first batch refused")
        };
        first.send(Some(Ok(0))).unwrap();
        let Verdict::Store(Some(second)) = p.check(P0, &info(4, 0, 2, 2)) else {
            panic!("second batch refused")
        };
        // The request is dropped before its append is queued: the sender goes, unanswered.
        drop(second);
        let Verdict::Store(Some(_retry)) = p.check(P0, &info(4, 0, 2, 2)) else {
            panic!("the retry of a batch never stored was not stored")
        };
        // A batch still in flight stays a duplicate; the stored one too.
        assert!(matches!(
            p.check(P0, &info(4, 0, 2, 2)),
            Verdict::Duplicate(_)
        ));
        assert!(matches!(
            p.check(P0, &info(4, 0, 0, 2)),
            Verdict::Duplicate(_)
        ));
    }

    #[test]
    fn sequences_are_checked_per_producer_and_partition() {
        let p = Producers::default();
        let mut held = Vec::new();
        assert!(matches!(
            p.check(P0, &info(-1, -1, -1, 1)),
            Verdict::Store(None)
        ));
        let Verdict::Store(Some(tx)) = p.check(P0, &info(1, 0, 0, 3)) else {
            panic!("first batch refused")
        };
        tx.send(Some(Ok(10))).unwrap();
        // The retry of the same batch is a duplicate that lands where the first did.
        let Verdict::Duplicate(l) = p.check(P0, &info(1, 0, 0, 3)) else {
            panic!("retry not seen as a duplicate")
        };
        assert_eq!(*l.borrow(), Some(Ok(10)));
        take(&p, P0, &info(1, 0, 3, 1), &mut held);
        // A gap is out of order; the other partition is independent.
        assert!(matches!(
            p.check(P0, &info(1, 0, 9, 1)),
            Verdict::Refuse(codes::OUT_OF_ORDER_SEQUENCE_NUMBER, _)
        ));
        take(&p, P1, &info(1, 0, 0, 1), &mut held);
        for s in 4..10 {
            take(&p, P0, &info(1, 0, s, 1), &mut held);
        }
        assert!(matches!(
            p.check(P0, &info(1, 0, 0, 3)),
            Verdict::Refuse(codes::DUPLICATE_SEQUENCE_NUMBER, _)
        ));
        // A fenced (older) epoch is refused; a newer one restarts at 0.
        assert!(matches!(
            p.check(P0, &info(1, 1, 5, 1)),
            Verdict::Refuse(codes::OUT_OF_ORDER_SEQUENCE_NUMBER, _)
        ));
        take(&p, P0, &info(1, 1, 0, 1), &mut held);
        assert!(matches!(
            p.check(P0, &info(1, 0, 10, 1)),
            Verdict::Refuse(codes::INVALID_PRODUCER_EPOCH, _)
        ));
    }
}

#[cfg(test)]
mod snapshot_tests {
    use super::*;

    const P0: PartRef = PartRef { dev: 0, id: 0 };
    const P1: PartRef = PartRef { dev: 0, id: 1 };
    use crate::batch;

    fn info(pid: i64, epoch: i16, seq: i32, n: i32) -> BatchInfo {
        batch::check(&batch::tests::make_batch(n, pid, epoch, seq, 1)).unwrap()
    }

    /// Checks and acknowledges a batch at `offset`, as the produce path does.
    fn store(p: &Producers, part: PartRef, i: &BatchInfo, offset: u64, now: i64) {
        let Verdict::Store(tx) = p.check_at(part, i, now) else {
            panic!("batch {i:?} not taken")
        };
        p.acknowledged(part, BatchKey::of(i), tx, Ok((offset, i.span())));
    }

    fn landed(v: Verdict) -> Option<Result<i64, ()>> {
        match v {
            Verdict::Duplicate(l) => *l.borrow(),
            _ => panic!("not a duplicate"),
        }
    }

    #[test]
    fn a_snapshot_restores_what_was_acknowledged() {
        let p = Producers::default();
        let now = 1_000;
        // Producer 1: seven batches of 2 (the newest five are remembered); producer 2: one.
        for k in 0..7 {
            store(&p, P0, &info(1, 0, 2 * k, 2), 10 * k as u64, now);
        }
        store(&p, P0, &info(2, 3, 0, 1), 70, now);
        // A batch without a producer id moves `through` too.
        p.acknowledged(P0, None, None, Ok((71, 4)));
        let snap = p.snapshot(P0, now, false).unwrap();
        assert_eq!(snap.through, 75);
        assert_eq!(snap.producers.len(), 2);
        assert_eq!(snap.producers[0].batches.len(), REMEMBERED);
        assert_eq!(snap.producers[0].batches[0].offset, 20);
        // Unchanged since: nothing new to record.
        assert!(p.snapshot(P0, now, true).is_none());

        let q = Producers::default();
        assert_eq!(q.restore(P0, snap.producers.clone(), now), 0);
        q.set_end(P0, snap.through);
        assert_eq!(q.snapshot(P0, now, false).unwrap(), snap);
        // Retries are answered with the original offsets; the next sequence is taken.
        assert_eq!(
            landed(q.check_at(P0, &info(1, 0, 12, 2), now)),
            Some(Ok(60))
        );
        assert_eq!(landed(q.check_at(P0, &info(2, 3, 0, 1), now)), Some(Ok(70)));
        assert!(matches!(
            q.check_at(P0, &info(1, 0, 0, 2), now),
            Verdict::Refuse(codes::DUPLICATE_SEQUENCE_NUMBER, _)
        ));
        assert!(matches!(
            q.check_at(P0, &info(1, 0, 20, 1), now),
            Verdict::Refuse(codes::OUT_OF_ORDER_SEQUENCE_NUMBER, _)
        ));
        assert!(matches!(
            q.check_at(P0, &info(1, 0, 14, 1), now),
            Verdict::Store(Some(_))
        ));
    }

    #[test]
    fn batches_in_flight_stay_out_of_the_snapshot_and_below_nothing_is_missing() {
        let p = Producers::default();
        let now = 1_000;
        store(&p, P0, &info(1, 0, 0, 1), 0, now);
        store(&p, P0, &info(1, 0, 1, 1), 1, now);
        // Checked, not yet acknowledged: offset unknown.
        let Verdict::Store(tx) = p.check_at(P0, &info(1, 0, 2, 1), now) else {
            panic!()
        };
        // A new epoch's first batch in flight on another partition clears the live view there;
        // the acknowledged view still holds the old epoch's batches.
        store(&p, P1, &info(1, 0, 0, 1), 0, now);
        let Verdict::Store(tx1) = p.check_at(P1, &info(1, 1, 0, 1), now) else {
            panic!()
        };
        let s0 = p.snapshot(P0, now, false).unwrap();
        assert_eq!(s0.through, 2);
        assert_eq!(s0.producers[0].batches.len(), 2);
        let s1 = p.snapshot(P1, now, false).unwrap();
        assert_eq!((s1.through, s1.producers[0].epoch), (1, 0));
        assert_eq!(s1.producers[0].batches.len(), 1);

        // Once acknowledged, the batches are in and `through` passes them.
        p.acknowledged(P0, BatchKey::of(&info(1, 0, 2, 1)), tx, Ok((2, 1)));
        p.acknowledged(P1, BatchKey::of(&info(1, 1, 0, 1)), tx1, Ok((1, 1)));
        let s0 = p.snapshot(P0, now, true).unwrap();
        assert_eq!((s0.through, s0.producers[0].batches.len()), (3, 3));
        let s1 = p.snapshot(P1, now, true).unwrap();
        assert_eq!((s1.through, s1.producers[0].epoch), (2, 1));
        assert_eq!(s1.producers[0].batches.len(), 1);
    }

    #[test]
    fn an_idle_producer_expires_and_comes_back_as_a_new_one() {
        let p = Producers::new(Duration::from_secs(60));
        store(&p, P0, &info(1, 0, 0, 1), 0, 1_000);
        store(&p, P0, &info(2, 0, 0, 1), 1, 1_000);
        store(&p, P0, &info(2, 0, 1, 1), 2, 50_000);
        let before = p.snapshot(P0, 50_000, false).unwrap();
        assert_eq!(before.producers.len(), 2);
        // At 61 s producer 1 (last seen at 1 s) is gone from snapshots and from memory.
        let later = 61_000;
        let snap = p.snapshot(P0, later, false).unwrap();
        assert_eq!(snap.producers.len(), 1);
        assert_eq!(snap.producers[0].id, 2);
        assert_eq!(p.expire(later), 1);
        assert_eq!(p.count(P0), 1);
        // A far-off sequence from it is a new producer, not a gap.
        assert!(matches!(
            p.check_at(P0, &info(1, 0, 500, 1), later),
            Verdict::Store(Some(_))
        ));
        // A snapshot restored after the expiry time leaves the producer out.
        let q = Producers::new(Duration::from_secs(60));
        assert_eq!(q.restore(P0, before.producers.clone(), later), 1);
        assert_eq!(q.count(P0), 1);
        // Without a sweep, `check` expires it by itself.
        let r = Producers::new(Duration::from_secs(60));
        store(&r, P0, &info(1, 0, 0, 1), 0, 1_000);
        assert!(matches!(
            r.check_at(P0, &info(1, 0, 500, 1), later),
            Verdict::Store(Some(_))
        ));
        // A producer with a batch in flight is never dropped.
        let Verdict::Store(Some(_tx)) = r.check_at(P0, &info(1, 0, 501, 1), later) else {
            panic!()
        };
        assert_eq!(r.expire(later + 3_600_000), 0);
        // ...unless the request that took it was dropped before queueing it.
        let s = Producers::new(Duration::from_secs(60));
        drop(s.check_at(P0, &info(1, 0, 0, 1), 1_000));
        assert_eq!(s.expire(later), 1);
    }
}
