//! The stepped writer on a virtual clock, as the deterministic tests drive it.

use std::time::Duration;

use blockdev::sim::SimClock;
use blockdev::BlockDevice;
use nvmq_log::{Now, Writer};

/// The writer's notion of now on the virtual clock (wall time from a fixed epoch).
pub fn now(clock: &SimClock) -> Now {
    let ns = clock.now_nanos();
    Now {
        mono_ns: ns,
        wall_ms: 1_700_000_000_000 + ns / 1_000_000,
    }
}

/// Steps the writer until `done` holds (or it stops, or `limit` steps), waiting on the device
/// while I/O is in flight and moving virtual time when nothing is.
pub fn drive<D: BlockDevice>(
    w: &mut Writer<D>,
    clock: &SimClock,
    limit: usize,
    mut done: impl FnMut(&Writer<D>) -> bool,
) {
    for _ in 0..limit {
        if done(w) || w.fatal().is_some() {
            return;
        }
        step_once(w, clock);
    }
}

/// One step; if it moved nothing, a wait on the device or a millisecond of virtual time.
pub fn step_once<D: BlockDevice>(w: &mut Writer<D>, clock: &SimClock) {
    if !w.step(now(clock)) {
        if w.has_io_in_flight() {
            w.wait_device(Duration::from_millis(10));
        } else {
            clock.advance(Duration::from_millis(1));
        }
    }
}
