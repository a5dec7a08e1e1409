//! The end-to-end table: per offset of the one e2e partition, when its Produce was sent, when the
//! producer got the ack, when the tailing consumer got the record. Producers and the consumer run
//! in the same process, so all three come from the same monotonic clock.

use std::collections::VecDeque;
use std::time::Instant;

use hdrhistogram::Histogram;

use super::load::{new_histogram, Timing};

/// Times in ns since the table's `t0`, plus one (0: not yet seen).
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    sent: u64,
    acked: u64,
    received: u64,
}

impl Slot {
    fn done(&self) -> bool {
        self.acked != 0 && self.received != 0
    }
}

pub struct E2e {
    t0: Instant,
    /// Offset of `slots[0]`.
    first: i64,
    slots: VecDeque<Slot>,
    window: Option<(u64, u64)>,
    /// Ack to receive; a record received before its ack counts as 0.
    pub ack_to_receive: Histogram<u64>,
    pub send_to_receive: Histogram<u64>,
    /// Records received (in the measured window) before their producer had the ack.
    pub early: u64,
    /// Records received in the measured window whose ack was seen too.
    pub matched: u64,
}

impl E2e {
    /// A table for offsets from `first` (the partition's end when the scenario starts).
    pub fn new(first: i64) -> anyhow::Result<E2e> {
        Ok(E2e {
            t0: Instant::now(),
            first,
            slots: VecDeque::with_capacity(1 << 16),
            window: None,
            ack_to_receive: new_histogram()?,
            send_to_receive: new_histogram()?,
            early: 0,
            matched: 0,
        })
    }

    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.t0).as_nanos() as u64 + 1
    }

    /// Records received in this window are measured.
    pub fn set_window(&mut self, t: &Timing) {
        self.window = Some((self.ns(t.warm), self.ns(t.until)));
    }

    fn slot(&mut self, offset: i64) -> Option<&mut Slot> {
        let i = usize::try_from(offset.checked_sub(self.first)?).ok()?;
        if i >= self.slots.len() {
            // Acks of different connections arrive out of offset order: leave room.
            self.slots.resize(i + 1, Slot::default());
        }
        self.slots.get_mut(i)
    }

    /// Drops finished slots at the front.
    fn trim(&mut self) {
        while self.slots.front().is_some_and(Slot::done) {
            self.slots.pop_front();
            self.first += 1;
        }
    }

    /// A producer's ack for the record at `offset`, sent at `sent`.
    pub fn acked(&mut self, offset: i64, sent: Instant, acked: Instant) {
        let (s, a) = (self.ns(sent), self.ns(acked));
        let Some(slot) = self.slot(offset) else {
            return;
        };
        slot.sent = s;
        slot.acked = a;
        let r = slot.received;
        if r != 0 {
            // The consumer had it first.
            self.measure(s, a, r);
            self.trim();
        }
    }

    /// The consumer received the records `from..=to` at `at`.
    pub fn received(&mut self, from: i64, to: i64, at: Instant) {
        let r = self.ns(at);
        for offset in from.max(self.first)..=to {
            let Some(slot) = self.slot(offset) else {
                continue;
            };
            if slot.received != 0 {
                continue;
            }
            slot.received = r;
            let (s, a) = (slot.sent, slot.acked);
            if a != 0 {
                self.measure(s, a, r);
            }
        }
        self.trim();
    }

    fn measure(&mut self, sent: u64, acked: u64, received: u64) {
        let Some((lo, hi)) = self.window else {
            return;
        };
        if received < lo || received > hi {
            return;
        }
        self.matched += 1;
        if received < acked {
            self.early += 1;
        }
        self.ack_to_receive
            .saturating_record(received.saturating_sub(acked).max(1));
        self.send_to_receive
            .saturating_record(received.saturating_sub(sent).max(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn ack_first_and_receive_first_are_both_measured() {
        let t0 = Instant::now();
        let mut e = E2e::new(100).unwrap();
        e.set_window(&Timing {
            warm: t0,
            until: t0 + Duration::from_secs(60),
        });
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // 100: acked at 2 ms, received at 3 ms.
        e.acked(100, ms(1), ms(2));
        // 101 and 102 received at 5 ms; 102 acked at 6 ms (early), 101 at 4 ms.
        e.acked(101, ms(1), ms(4));
        e.received(100, 100, ms(3));
        e.received(101, 102, ms(5));
        e.acked(102, ms(2), ms(6));
        assert_eq!(e.matched, 3);
        assert_eq!(e.early, 1);
        assert_eq!(e.ack_to_receive.len(), 3);
        assert!(e.ack_to_receive.min() <= 1, "the early record counts as 0");
        let p = e.ack_to_receive.value_at_quantile(1.0);
        assert!((900_000..1_100_000).contains(&p), "{p}");
        assert!(e.slots.is_empty(), "finished slots are dropped");
        assert_eq!(e.first, 103);
        // Records below the table's start and before the window are ignored.
        e.received(50, 60, ms(7));
        assert_eq!(e.matched, 3);
    }
}
