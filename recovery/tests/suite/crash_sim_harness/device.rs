//! The device as the simulator hands it to recovery and the writer: the sim device, with the
//! power cut at its n-th submission (a cut *during* recovery or right after it) and batch writes
//! misdirected on cue; and the stepped writer on the virtual clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use blockdev::sim::{SimClock, SimDevice, SimHandle};
use blockdev::{BlockDevice, Completion, DeviceError, DeviceInfo, IoBuffer, Tag};
use nvmq_log::format::LOG_START;
use nvmq_log::{LogError, Now, Request, Writer};

/// Wall-clock milliseconds at virtual time zero. Later than any real clock this test runs under:
/// `format` stamps its first checkpoint with the real time, and a virtual clock behind it would
/// keep that checkpoint from ever expiring, so that retention by time could never move the head.
pub const WALL_BASE_MS: u64 = 4_000_000_000_000;

/// `NVMQ_DEBUG` set: the run narrates itself on stderr.
pub fn debug() -> bool {
    std::env::var("NVMQ_DEBUG").is_ok()
}

/// Results that callbacks on the writer hand back to the test.
pub type Shared<T> = Arc<Mutex<Vec<T>>>;

pub fn now(clock: &SimClock) -> Now {
    let ns = clock.now_nanos();
    Now {
        mono_ns: ns,
        wall_ms: WALL_BASE_MS + ns / 1_000_000,
    }
}

/// Steps the writer until `done` holds (or it stops), advancing virtual time while it waits on
/// the device, and idle time when nothing is in flight. Every loop of this test goes through here.
pub fn drive<D: BlockDevice>(
    clock: &SimClock,
    w: &mut Writer<D>,
    mut done: impl FnMut(&Writer<D>) -> bool,
) {
    for _ in 0..100_000 {
        if done(w) || w.fatal().is_some() {
            return;
        }
        if !w.step(now(clock)) {
            if w.has_io_in_flight() {
                w.wait_device(Duration::from_millis(10));
            } else {
                clock.advance(Duration::from_millis(1));
            }
        }
    }
}

/// Raw log bytes through the stepped writer, as `Log` reads them through its thread.
pub fn stepped_read<D: BlockDevice>(
    clock: &SimClock,
    w: &mut Writer<D>,
    position: u64,
    len: u64,
) -> Result<Vec<u8>, LogError> {
    let slot: Shared<Result<Vec<u8>, LogError>> = Arc::default();
    let s2 = slot.clone();
    w.submit(Request::Read {
        position,
        len,
        reply: Box::new(move |r| s2.lock().unwrap().push(r)),
    });
    drive(clock, w, |_| !slot.lock().unwrap().is_empty());
    let r = slot.lock().unwrap().pop();
    r.unwrap_or(Err(LogError::Shutdown))
}

/// A write that landed somewhere else than it was sent: ring offsets (bytes from the log start).
#[derive(Clone, Copy, Debug)]
pub struct Landed {
    pub from: u64,
    pub to: u64,
    pub len: u64,
}

/// What the test asks of the device while the writer owns it.
#[derive(Default)]
pub struct Plan {
    /// The next write into the log region lands at this ring offset (or as near as it fits).
    /// Superblock writes are left alone: their loss is planted separately.
    pub misdirect: Option<u64>,
    pub landed: Vec<Landed>,
    /// A misdirect was handed to the sim for a write it then refused: the sim would keep it
    /// armed for some later write (recovery's, say), which no plan accounts for.
    pub leaked: bool,
}

pub struct SimDev {
    pub inner: SimDevice,
    pub handle: SimHandle,
    /// Cut the power at this submission (1 = the next one).
    pub cut_after: Option<u64>,
    pub plan: Arc<Mutex<Plan>>,
    pub log_size: u64,
    pub unit: u64,
}

impl SimDev {
    fn tick(&mut self) {
        if let Some(left) = &mut self.cut_after {
            if *left == 1 {
                self.handle.power_cut();
            }
            *left = left.saturating_sub(1);
        }
    }

    /// Arms the sim's misdirect for this write if the plan wants one and the sim will take the
    /// write (it keeps an armed misdirect for the next write otherwise). True when armed.
    fn misdirect(&mut self, lba: u64, len: usize, pair: bool) -> bool {
        let lbs = u64::from(self.inner.info().logical_block_size);
        let (from, len) = (lba * lbs, len as u64);
        let mut plan = self.plan.lock().unwrap();
        let Some(target) = plan.misdirect else {
            return false;
        };
        let room = if pair {
            self.inner.in_flight() + 2 <= self.inner.queue_depth()
        } else {
            self.inner.in_flight() < self.inner.queue_depth()
        };
        if from < LOG_START || self.handle.is_off() || !room || len > self.log_size / 2 {
            return false;
        }
        let ring = from - LOG_START;
        // Inside the log region, on a write unit, and somewhere else than the write's own place.
        let mut to = target.min(self.log_size - len);
        to -= to % self.unit;
        if to == ring {
            to = if ring + 2 * len <= self.log_size {
                ring + len
            } else {
                0
            };
        }
        if to == ring {
            return false;
        }
        self.handle.misdirect_next_write((LOG_START + to) / lbs);
        plan.misdirect = None;
        plan.landed.push(Landed {
            from: ring,
            to,
            len,
        });
        true
    }

    fn leaked(&self, armed: bool, r: &Result<(), DeviceError>) {
        if armed && r.is_err() {
            self.plan.lock().unwrap().leaked = true;
        }
    }
}

impl BlockDevice for SimDev {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }
    fn alloc_buffer(&mut self, len: usize) -> Result<IoBuffer, DeviceError> {
        self.inner.alloc_buffer(len)
    }
    fn queue_depth(&self) -> usize {
        self.inner.queue_depth()
    }
    fn submit_write(&mut self, tag: Tag, lba: u64, b: IoBuffer) -> Result<(), DeviceError> {
        self.tick();
        let armed = self.misdirect(lba, b.len(), false);
        let r = self.inner.submit_write(tag, lba, b);
        self.leaked(armed, &r);
        r
    }
    fn submit_read(&mut self, tag: Tag, lba: u64, b: IoBuffer) -> Result<(), DeviceError> {
        self.tick();
        self.inner.submit_read(tag, lba, b)
    }
    fn submit_flush(&mut self, tag: Tag) -> Result<(), DeviceError> {
        self.tick();
        self.inner.submit_flush(tag)
    }
    fn submit_write_flush(
        &mut self,
        tag: Tag,
        lba: u64,
        b: IoBuffer,
        flush: Tag,
    ) -> Result<(), DeviceError> {
        self.tick();
        let armed = self.misdirect(lba, b.len(), true);
        let r = self.inner.submit_write_flush(tag, lba, b, flush);
        self.leaked(armed, &r);
        r
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, DeviceError> {
        self.inner.poll(out)
    }
    fn wait(&mut self, out: &mut Vec<Completion>, t: Duration) -> Result<usize, DeviceError> {
        self.inner.wait(out, t)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
}
