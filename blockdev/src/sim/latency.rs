//! Service time of one operation.

use std::time::Duration;

use super::Rng;

/// How long the sim takes to serve one operation, from the start of its service to its completion.
/// Uniform draws come from the device's seeded [`Rng`], so they are reproducible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Latency {
    /// Completes as soon as it is polled.
    #[default]
    Zero,
    Fixed(Duration),
    /// Uniform in `[min, max]` (the bounds are swapped if given in the wrong order).
    Uniform {
        min: Duration,
        max: Duration,
    },
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Latency {
    /// One service time in nanoseconds. Draws from `rng` only for `Uniform`.
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        match *self {
            Latency::Zero => 0,
            Latency::Fixed(d) => nanos(d),
            Latency::Uniform { min, max } => {
                let (lo, hi) = if min <= max { (min, max) } else { (max, min) };
                let (lo, hi) = (nanos(lo), nanos(hi));
                lo + rng.below((hi - lo).saturating_add(1))
            }
        }
    }
}
