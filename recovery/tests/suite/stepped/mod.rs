//! The stepped writer on a virtual clock, as the deterministic tests drive it.
#![allow(dead_code)] // each test binary uses its own part of these helpers

use std::sync::{Arc, Mutex};
use std::time::Duration;

use blockdev::sim::SimClock;
use blockdev::BlockDevice;
use nvmq_log::{LogError, Now, Request, Writer};

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

/// Steps the writer until `done` holds, for at most `limit` of virtual time; whether it held.
pub fn drive_for<D: BlockDevice>(
    w: &mut Writer<D>,
    clock: &SimClock,
    limit: Duration,
    mut done: impl FnMut(&Writer<D>) -> bool,
) -> bool {
    let until = clock.now_nanos() + limit.as_nanos() as u64;
    while clock.now_nanos() < until {
        if done(w) {
            return true;
        }
        step_once(w, clock);
    }
    done(w)
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

type RawRead = Result<Vec<u8>, LogError>;

/// Raw log bytes through the stepped writer (a reader's request, as `Log` would send it).
pub fn stepped_read<D: BlockDevice>(
    w: &mut Writer<D>,
    clock: &SimClock,
    position: u64,
    len: u64,
) -> RawRead {
    let slot: Arc<Mutex<Option<RawRead>>> = Arc::default();
    let s2 = slot.clone();
    w.submit(Request::Read {
        position,
        len,
        reply: Box::new(move |r| *s2.lock().unwrap() = Some(r)),
    });
    drive(w, clock, 200_000, |_| slot.lock().unwrap().is_some());
    let r = slot.lock().unwrap().take();
    r.unwrap_or(Err(LogError::Shutdown))
}
