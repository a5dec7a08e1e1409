//! Time for the sim: real or virtual.
//!
//! With a real clock the sim behaves like a device with service times (benchmarks, tests of the
//! threaded broker). With a virtual clock nothing ever sleeps: time moves only when someone calls
//! [`SimClock::advance`] or when [`crate::BlockDevice::wait`] jumps it to the next due completion,
//! so a single-threaded crash test is fully driven by its own loop and reproducible from a seed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
enum Inner {
    Real(Instant),
    Virtual(Arc<AtomicU64>),
}

/// A nanosecond time source. Clones share it: a virtual clock advanced through one clone is
/// advanced for every device and test that holds another.
#[derive(Clone, Debug)]
pub struct SimClock(Inner);

impl SimClock {
    /// Wall time (monotonic), counted from the moment this clock was made.
    pub fn real() -> SimClock {
        SimClock(Inner::Real(Instant::now()))
    }

    /// A manually driven clock that starts at zero.
    pub fn virtual_at_zero() -> SimClock {
        SimClock(Inner::Virtual(Arc::new(AtomicU64::new(0))))
    }

    pub fn is_virtual(&self) -> bool {
        matches!(self.0, Inner::Virtual(_))
    }

    /// Nanoseconds since the clock's origin.
    pub fn now_nanos(&self) -> u64 {
        match &self.0 {
            Inner::Real(origin) => u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX),
            Inner::Virtual(t) => t.load(Ordering::SeqCst),
        }
    }

    /// Moves a virtual clock forward by `d` (saturating). Does nothing on a real clock: real time
    /// cannot be pushed, and a test that runs on either kind should not have to check.
    pub fn advance(&self, d: Duration) {
        if let Inner::Virtual(t) = &self.0 {
            let d = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            let _ = t.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(v.saturating_add(d))
            });
        }
    }

    /// Moves a virtual clock forward to `nanos` if it is behind; never moves it back (another
    /// holder may have advanced it further meanwhile). No-op on a real clock.
    pub fn advance_to(&self, nanos: u64) {
        if let Inner::Virtual(t) = &self.0 {
            t.fetch_max(nanos, Ordering::SeqCst);
        }
    }
}

impl Default for SimClock {
    fn default() -> Self {
        SimClock::real()
    }
}
