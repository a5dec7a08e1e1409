//! Idempotent producers: per (producer id, partition), the sequence ranges of the last batches
//! stored, so that a retry after a lost answer is answered with the original offset instead of
//! being stored twice, and a gap is refused (Kafka's rules, KIP-98).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::watch;

use crate::batch::BatchInfo;
use crate::broker::lock;
use crate::codes;

/// Batches remembered per producer and partition (Kafka keeps 5, as many as a producer may have
/// in flight).
const REMEMBERED: usize = 5;

/// Where a remembered batch landed: known once durable (None while in flight; Err if it failed).
pub type Landing = watch::Receiver<Option<Result<i64, ()>>>;

struct Remembered {
    first_seq: i32,
    last_seq: i32,
    landing: Landing,
}

struct State {
    epoch: i16,
    batches: VecDeque<Remembered>,
}

/// What to do with a produced batch.
pub enum Verdict {
    /// Not idempotent, or the next in sequence: store it; send where it landed to the sender.
    Store(Option<watch::Sender<Option<Result<i64, ()>>>>),
    /// A retry of a batch already stored (or in flight): answer with where that one landed.
    Duplicate(Landing),
    /// Refuse with this error code.
    Refuse(i16, String),
}

#[derive(Default)]
pub struct Producers {
    states: Mutex<HashMap<(i64, u32), State>>,
}

fn next_seq(s: i32) -> i32 {
    if s == i32::MAX {
        0
    } else {
        s + 1
    }
}

impl Producers {
    /// Startup: a batch found in the log.
    pub fn replay(&self, partition: u32, info: &BatchInfo, offset: u64) {
        if info.producer_id < 0 {
            return;
        }
        let (_, rx) = watch::channel(Some(Ok(offset as i64)));
        let mut m = lock(&self.states);
        let st = m.entry((info.producer_id, partition)).or_insert(State {
            epoch: info.producer_epoch,
            batches: VecDeque::new(),
        });
        if info.producer_epoch != st.epoch {
            st.epoch = info.producer_epoch;
            st.batches.clear();
        }
        remember(st, info, rx);
    }

    /// Decides on a produced batch. Called in request order; the batch is remembered at once (in
    /// flight) so that a retry arriving before it is durable finds it.
    pub fn check(&self, partition: u32, info: &BatchInfo) -> Verdict {
        if info.producer_id < 0 {
            return Verdict::Store(None);
        }
        let mut m = lock(&self.states);
        let key = (info.producer_id, partition);
        let (tx, rx) = watch::channel(None);
        let Some(st) = m.get_mut(&key) else {
            // Nothing known (a new producer, or one whose batches retention dropped): any
            // sequence starts it.
            let mut st = State {
                epoch: info.producer_epoch,
                batches: VecDeque::new(),
            };
            remember(&mut st, info, rx);
            m.insert(key, st);
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
            remember(st, info, rx);
            return Verdict::Store(Some(tx));
        }
        if let Some(b) = st
            .batches
            .iter()
            .find(|b| b.first_seq == info.base_sequence && b.last_seq == info.last_sequence())
        {
            return Verdict::Duplicate(b.landing.clone());
        }
        let expected = st
            .batches
            .back()
            .map_or(info.base_sequence, |b| next_seq(b.last_seq));
        if info.base_sequence == expected {
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

    /// A batch accepted by `check` could not be queued: forget it, so the retry is not taken for
    /// a duplicate of something never stored.
    pub fn forget(&self, partition: u32, info: &BatchInfo) {
        let mut m = lock(&self.states);
        if let Some(st) = m.get_mut(&(info.producer_id, partition)) {
            if st
                .batches
                .back()
                .is_some_and(|b| b.first_seq == info.base_sequence)
            {
                st.batches.pop_back();
            }
        }
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

    fn info(pid: i64, epoch: i16, seq: i32, n: i32) -> BatchInfo {
        batch::check(&batch::tests::make_batch(n, pid, epoch, seq, 1)).unwrap()
    }

    #[test]
    fn sequences_are_checked_per_producer_and_partition() {
        let p = Producers::default();
        assert!(matches!(
            p.check(0, &info(-1, -1, -1, 1)),
            Verdict::Store(None)
        ));
        let Verdict::Store(Some(tx)) = p.check(0, &info(1, 0, 0, 3)) else {
            panic!("first batch refused")
        };
        tx.send(Some(Ok(10))).unwrap();
        // The retry of the same batch is a duplicate that lands where the first did.
        let Verdict::Duplicate(l) = p.check(0, &info(1, 0, 0, 3)) else {
            panic!("retry not seen as a duplicate")
        };
        assert_eq!(*l.borrow(), Some(Ok(10)));
        assert!(matches!(
            p.check(0, &info(1, 0, 3, 1)),
            Verdict::Store(Some(_))
        ));
        // A gap is out of order; the other partition is independent.
        assert!(matches!(
            p.check(0, &info(1, 0, 9, 1)),
            Verdict::Refuse(codes::OUT_OF_ORDER_SEQUENCE_NUMBER, _)
        ));
        assert!(matches!(
            p.check(1, &info(1, 0, 0, 1)),
            Verdict::Store(Some(_))
        ));
        for s in 4..10 {
            assert!(matches!(
                p.check(0, &info(1, 0, s, 1)),
                Verdict::Store(Some(_))
            ));
        }
        assert!(matches!(
            p.check(0, &info(1, 0, 0, 3)),
            Verdict::Refuse(codes::DUPLICATE_SEQUENCE_NUMBER, _)
        ));
        // A fenced (older) epoch is refused; a newer one restarts at 0.
        assert!(matches!(
            p.check(0, &info(1, 1, 5, 1)),
            Verdict::Refuse(codes::OUT_OF_ORDER_SEQUENCE_NUMBER, _)
        ));
        assert!(matches!(
            p.check(0, &info(1, 1, 0, 1)),
            Verdict::Store(Some(_))
        ));
        assert!(matches!(
            p.check(0, &info(1, 0, 10, 1)),
            Verdict::Refuse(codes::INVALID_PRODUCER_EPOCH, _)
        ));
    }
}
