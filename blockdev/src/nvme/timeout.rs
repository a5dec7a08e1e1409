//! How long in-flight commands have waited, for the I/O timeout, without a clock read per command.
//!
//! On a guest whose clocksource is HPET every clock read is a system call, and the driver promises
//! none per I/O. So a submission does not read the clock: it copies a counter, the current
//! *epoch*, into its command slot. The epoch advances only when the driver reads the clock anyway,
//! which it does every `LOOK_EVERY` polls with commands in flight (`super::pair`; reaping or not),
//! and then only when at least `tick` (an eighth of the timeout) has passed since
//! the epoch began. A command stamped with epoch `e` was submitted before epoch `e + 1` began, and
//! epochs are at least `tick` apart, which gives a lower bound on its age from a single remembered
//! instant: the start of the current epoch. The bound never runs ahead of the truth, so a command
//! is never declared timed out early; it trails the truth by at most one tick plus the time
//! between clock reads (a command is only seen ageing while someone polls the device).

use std::time::{Duration, Instant};

/// Epochs per timeout: the precision of the timeout is about `timeout / TICKS_PER_TIMEOUT`.
const TICKS_PER_TIMEOUT: u32 = 8;

#[derive(Debug, Clone)]
pub struct Epochs {
    timeout: Duration,
    tick: Duration,
    current: u64,
    /// When the current epoch began; `None` before the first clock read.
    started: Option<Instant>,
    /// At most the stamp of every command in flight (a hint: the device rescans its slots before
    /// believing it).
    oldest: u64,
}

impl Epochs {
    pub fn new(timeout: Duration) -> Epochs {
        Epochs {
            timeout,
            tick: timeout / TICKS_PER_TIMEOUT,
            current: 0,
            started: None,
            oldest: 0,
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The stamp for a command submitted now: a copy of a counter, no clock.
    pub fn stamp(&self) -> u64 {
        self.current
    }

    /// Takes a clock reading the driver made anyway; starts a new epoch when the current one is
    /// at least a tick old (or when this is the first reading).
    pub fn observe(&mut self, now: Instant) {
        let due = self
            .started
            .is_none_or(|t| now.saturating_duration_since(t) >= self.tick);
        if due {
            self.current += 1;
            self.started = Some(now);
        }
    }

    /// A lower bound on how long a command stamped `stamp` has been in flight at `now`.
    pub fn age(&self, stamp: u64, now: Instant) -> Duration {
        let Some(started) = self.started else {
            return Duration::ZERO;
        };
        if stamp >= self.current {
            return Duration::ZERO;
        }
        // Epoch stamp+1 began after the submission; the epochs since are each a tick or longer.
        let whole = u32::try_from(self.current - stamp - 1).unwrap_or(u32::MAX);
        self.tick
            .saturating_mul(whole)
            .saturating_add(now.saturating_duration_since(started))
    }

    /// Whether the oldest command in flight may have timed out (cheap; a rescan confirms).
    pub fn may_have_expired(&self, now: Instant) -> bool {
        self.age(self.oldest, now) >= self.timeout
    }

    /// Records the oldest stamp in flight after a rescan; `None` when nothing is in flight (every
    /// later submission gets at least the current epoch).
    pub fn set_oldest(&mut self, stamp: Option<u64>) {
        self.oldest = stamp.unwrap_or(self.current);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_command_ages_only_across_epochs_and_never_early() {
        let t0 = Instant::now();
        let mut e = Epochs::new(80 * MS);
        let s = e.stamp();
        assert_eq!(
            e.age(s, t0 + 1000 * MS),
            Duration::ZERO,
            "no clock read yet"
        );
        e.observe(t0 + 5 * MS);
        // Submitted before the reading at 5 ms: at least 0 ms at 5 ms, 40 ms at 45 ms.
        assert_eq!(e.age(s, t0 + 5 * MS), Duration::ZERO);
        assert_eq!(e.age(s, t0 + 45 * MS), 40 * MS);
        // A reading less than a tick (10 ms) later starts no epoch.
        e.observe(t0 + 9 * MS);
        assert_eq!(e.stamp(), s + 1);
        let later = e.stamp();
        e.observe(t0 + 15 * MS);
        e.observe(t0 + 40 * MS);
        assert_eq!(e.stamp(), later + 2);
        // s: two whole epochs (>= 10 ms each) plus 10 ms into the current one; truly >= 45 ms.
        assert_eq!(e.age(s, t0 + 50 * MS), 30 * MS);
        // `later` went in between the 5 ms and 15 ms readings: truly >= 35 ms.
        assert_eq!(e.age(later, t0 + 50 * MS), 20 * MS);
        assert_eq!(e.age(e.stamp(), t0 + 50 * MS), Duration::ZERO);
    }

    #[test]
    fn the_oldest_hint_triggers_only_past_the_timeout() {
        let t0 = Instant::now();
        let mut e = Epochs::new(8 * MS);
        e.set_oldest(Some(e.stamp()));
        let mut now = t0;
        let mut expired_at = None;
        for _ in 0..40 {
            e.observe(now);
            if e.may_have_expired(now) {
                expired_at = Some(now);
                break;
            }
            now += MS;
        }
        let at = expired_at.expect("expires");
        assert!(at - t0 >= 8 * MS, "expired after {:?}", at - t0);
        // Nothing in flight: the hint moves to the current epoch, which has no age.
        e.set_oldest(None);
        assert!(!e.may_have_expired(now));
    }
}
