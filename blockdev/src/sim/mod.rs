//! Sim backend: an in-memory block device, deterministic from a seed, with the crash model of
//! storage.md §6.
//!
//! The sim exists so that the broker's durability promise can be tested by the thousand: every
//! crash test drives a [`SimDevice`] through the ordinary [`BlockDevice`] contract, cuts the power
//! at a chosen moment through its [`SimHandle`], powers it back on and checks what recovery finds.
//! A run is a function of its seed and its sequence of calls, so a failing seed replays exactly.
//!
//! The model, in short:
//! - **Durable medium** (sparse; absent blocks read as zeros) and a **volatile cache**: the list of
//!   writes that completed but are not yet durable, in completion order. Reads see the cache over
//!   the medium. Without a volatile cache (`volatile_cache = false`, power-loss protected) a write
//!   is durable the moment it completes.
//! - **Completion is delivery**: an I/O takes effect when `poll`/`wait` hands out its completion,
//!   which happens once the device clock has reached its due time (start of service + a latency
//!   sample). Completions due together come out in a seeded order, not submission order.
//! - **A flush covers exactly the writes delivered before it was submitted** (storage.md §1); when
//!   it completes successfully those writes move from the cache to the medium.
//! - **Faults** are armed through the handle and decided at submission, from the seeded RNG.
//! - **A power cut** is the only way non-durable data reaches the medium afterwards: see `crash.rs`.
//!
//! Reproducibility: with a virtual clock (or zero latencies) a run is a pure function of the seed
//! and the calls. With a real clock and non-zero latencies, which completions are due at a given
//! poll depends on wall time, so only the random draws, not the interleaving, are reproducible.

mod clock;
mod crash;
mod latency;
mod media;
mod rng;
mod state;
#[cfg(target_os = "linux")]
mod timer;

pub use clock::SimClock;
pub use crash::{land_unflushed, Landing, WriteFate};
pub use latency::Latency;
pub use media::{CacheEntry, SECTOR};
pub use rng::Rng;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::{BlockDevice, Completion, DeviceError, DeviceInfo, IoBuffer, Tag};
use state::State;

/// How a sim device is built. Start from [`SimConfig::new`] and change fields.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Seeds every random decision of the device (latencies, tie-breaks, faults, the cut).
    pub seed: u64,
    /// 512 or 4096 (any power of two from 512 to 64 KiB is taken).
    pub logical_block_size: u32,
    /// At least the logical block size; a write covering part of a physical block is a
    /// read-modify-write on the medium (see `rmw_damage`).
    pub physical_block_size: u32,
    /// Bytes; rounded down to a multiple of the logical block size.
    pub capacity: u64,
    /// Largest I/O in bytes; rounded down to a multiple of the logical block size.
    pub max_transfer: u32,
    pub queue_depth: usize,
    /// False = power-loss protected: completed writes always survive a cut.
    pub volatile_cache: bool,
    /// Service time of writes, and of reads (one medium).
    pub write_latency: Latency,
    pub flush_latency: Latency,
    /// If true, a flush's service starts only after the previous flush's has ended (as on drives
    /// that serialize cache flushes), so flushes queue behind each other.
    pub serialize_flushes: bool,
    /// At a cut, a torn sector may hold garbage instead of the old or new bytes.
    pub garbage_sectors: bool,
    /// At a cut, an unflushed write covering part of a physical block may damage that block's other
    /// sectors.
    pub rmw_damage: bool,
    pub clock: SimClock,
    /// Takes a write and a flush linked (`submit_write_flush`): the flush is submitted by the
    /// device at the moment the write completes, so the crash model treats it exactly as a flush
    /// submitted then.
    pub linked_flush: bool,
}

impl SimConfig {
    /// 4096-byte logical and physical blocks, 1 MiB maximum transfer, queue depth 256, a volatile
    /// cache, zero latency, a real clock, no garbage and no read-modify-write damage.
    pub fn new(seed: u64, capacity: u64) -> SimConfig {
        SimConfig {
            seed,
            logical_block_size: 4096,
            physical_block_size: 4096,
            capacity,
            max_transfer: 1 << 20,
            queue_depth: 256,
            volatile_cache: true,
            write_latency: Latency::Zero,
            flush_latency: Latency::Zero,
            serialize_flushes: false,
            garbage_sectors: false,
            rmw_damage: false,
            clock: SimClock::real(),
            linked_flush: false,
        }
    }

    /// Makes a configuration consistent instead of panicking on it: the device reports the
    /// geometry it actually uses through `info()`, so a caller is never misled.
    fn normalized(mut self) -> SimConfig {
        let lbs = self.logical_block_size;
        if !(lbs.is_power_of_two() && (512..=65536).contains(&lbs)) {
            self.logical_block_size = 4096;
        }
        let lbs = self.logical_block_size;
        let pbs = self.physical_block_size;
        if !(pbs.is_power_of_two() && pbs >= lbs && pbs <= 1 << 20) {
            self.physical_block_size = lbs;
        }
        self.capacity -= self.capacity % u64::from(lbs);
        self.max_transfer = (self.max_transfer - self.max_transfer % lbs).max(lbs);
        self.queue_depth = self.queue_depth.max(1);
        self
    }
}

/// What a power cut did. Every count is of writes, except the sector counts and `dropped_ios`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CutReport {
    /// Completed writes still in the volatile cache (not doomed).
    pub cached: u64,
    /// Completed writes whose flush had failed (doomed: lost or torn, never kept whole).
    pub doomed: u64,
    /// Writes in flight that could have landed (not counting writes armed to fail).
    pub in_flight_writes: u64,
    /// Of `cached + doomed + in_flight_writes`: how many landed whole, were lost, or were torn.
    pub survived: u64,
    pub lost: u64,
    pub torn: u64,
    /// Sectors of torn writes that were left holding garbage.
    pub garbage_sectors: u64,
    /// Sectors outside a write, in its physical block, damaged by a read-modify-write.
    pub rmw_damaged_sectors: u64,
    /// Every I/O (read, write or flush) that was in flight and will never complete.
    pub dropped_ios: u64,
}

/// Counters since the handle was made (they survive power cycles).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Submissions accepted.
    pub writes: u64,
    pub flushes: u64,
    /// Write+flush pairs taken linked (`submit_write_flush`); both also count above.
    pub linked_flushes: u64,
    pub reads: u64,
    /// Bytes of writes that completed successfully.
    pub bytes_written: u64,
    /// Completions delivered (successful or not).
    pub completed: u64,
    pub write_errors: u64,
    pub flush_errors: u64,
    pub read_errors: u64,
    pub cuts: u64,
    /// Now: completed writes not yet durable, and I/Os in flight.
    pub cached_writes: u64,
    pub in_flight: u64,
    pub off: bool,
}

fn lock(shared: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic in a test thread while holding the lock must not turn every later call into a panic.
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

fn info_for(cfg: &SimConfig) -> DeviceInfo {
    DeviceInfo {
        logical_block_size: cfg.logical_block_size,
        physical_block_size: cfg.physical_block_size,
        capacity: cfg.capacity,
        max_transfer: cfg.max_transfer,
        // The sim tears at 512-byte sectors, so it promises no atomic write unit.
        atomic_write_unit: 0,
        preferred_write: 0,
        volatile_write_cache: cfg.volatile_cache,
        fs_block_size: 0,
        identity: format!("sim:{}", cfg.seed),
        model: "nvmq sim".into(),
        health: String::new(),
        engine: String::new(),
        linked_flush: cfg.linked_flush,
    }
}

/// One power cycle's view of a simulated device. After a cut it answers `Stopped` to everything;
/// [`SimHandle::power_on`] gives the next cycle's device.
pub struct SimDevice {
    shared: Arc<Mutex<State>>,
    generation: u64,
    info: DeviceInfo,
    clock: SimClock,
    /// The completion fd (a real clock on Linux): fires when the earliest I/O in flight is due.
    /// Armed only when the owner is about to sleep on it (`arm_completion_fd`), never on submit
    /// or poll: arming a timer due within microseconds costs a virtual machine about 10 us, which
    /// an owner that polls (as the NVMe backend is polled) must not pay.
    #[cfg(target_os = "linux")]
    timer: Option<timer::DueTimer>,
}

/// Control of a simulated device for tests: power, faults, raw access, counters. Clone-able and
/// usable from any thread; it shares the device's state.
#[derive(Clone)]
pub struct SimHandle {
    shared: Arc<Mutex<State>>,
}

impl SimDevice {
    pub fn new(cfg: SimConfig) -> (SimDevice, SimHandle) {
        let cfg = cfg.normalized();
        let info = info_for(&cfg);
        let clock = cfg.clock.clone();
        let shared = Arc::new(Mutex::new(State::new(cfg, info.clone())));
        let dev = SimDevice {
            shared: shared.clone(),
            generation: 0,
            info,
            #[cfg(target_os = "linux")]
            timer: due_timer(&clock),
            clock,
        };
        (dev, SimHandle { shared })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.shared)
    }

    /// Arms the completion fd for the earliest I/O now in flight.
    fn arm(&mut self) {
        #[cfg(target_os = "linux")]
        if self.timer.is_some() {
            let due = {
                let st = lock(&self.shared);
                if st.off || st.generation != self.generation {
                    None
                } else {
                    st.earliest_due()
                }
            };
            let now = self.clock.now_nanos();
            if let Some(t) = self.timer.as_mut() {
                t.arm(due, now);
            }
        }
    }
}

/// A timer for the completion fd, on a real clock (a virtual one is moved by its test, which
/// never sleeps on it); none if the kernel refuses one (the device is then polled).
#[cfg(target_os = "linux")]
fn due_timer(clock: &SimClock) -> Option<timer::DueTimer> {
    if clock.is_virtual() {
        return None;
    }
    timer::DueTimer::new().ok()
}

impl std::fmt::Debug for SimDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDevice")
            .field("identity", &self.info.identity)
            .field("generation", &self.generation)
            .finish()
    }
}

impl std::fmt::Debug for SimHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = lock(&self.shared);
        f.debug_struct("SimHandle")
            .field("identity", &st.info.identity)
            .field("generation", &st.generation)
            .field("off", &st.off)
            .finish()
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl BlockDevice for SimDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc_buffer(&mut self, len: usize) -> Result<IoBuffer, DeviceError> {
        // Page alignment, like the DMA buffers of the NVMe backend.
        IoBuffer::new_heap(len, (self.info.logical_block_size as usize).max(4096))
    }

    fn queue_depth(&self) -> usize {
        self.state().cfg.queue_depth
    }

    fn submit_write(&mut self, tag: Tag, lba: u64, buffer: IoBuffer) -> Result<(), DeviceError> {
        let generation = self.generation;
        self.state().submit_write(generation, tag, lba, buffer)
    }

    fn submit_read(&mut self, tag: Tag, lba: u64, buffer: IoBuffer) -> Result<(), DeviceError> {
        let generation = self.generation;
        self.state().submit_read(generation, tag, lba, buffer)
    }

    fn submit_flush(&mut self, tag: Tag) -> Result<(), DeviceError> {
        let generation = self.generation;
        self.state().submit_flush(generation, tag)
    }

    fn submit_write_flush(
        &mut self,
        write_tag: Tag,
        lba: u64,
        buffer: IoBuffer,
        flush_tag: Tag,
    ) -> Result<(), DeviceError> {
        let generation = self.generation;
        self.state()
            .submit_write_flush(generation, write_tag, lba, buffer, flush_tag)
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, DeviceError> {
        let generation = self.generation;
        // The fd is reset before the reap (a syscall only while the timer is armed); it is
        // armed again only by an owner about to sleep.
        #[cfg(target_os = "linux")]
        if let Some(t) = self.timer.as_mut() {
            t.reset();
        }
        self.state().poll(generation, out)
    }

    #[cfg(target_os = "linux")]
    fn completion_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.timer.as_ref().map(|t| t.fd())
    }

    fn arm_completion_fd(&mut self) {
        self.arm();
    }

    /// With a virtual clock this never sleeps: when nothing is due it moves the clock to the
    /// earliest due time (at most `timeout` ahead) and delivers. With a real clock it sleeps until
    /// the earliest due time or the timeout. Returns at once when nothing is in flight.
    fn wait(&mut self, out: &mut Vec<Completion>, timeout: Duration) -> Result<usize, DeviceError> {
        let deadline = self.clock.now_nanos().saturating_add(nanos(timeout));
        loop {
            let (n, earliest) = {
                let mut st = self.state();
                let n = st.poll(self.generation, out)?;
                (n, st.earliest_due())
            };
            if n > 0 {
                return Ok(n);
            }
            let Some(due) = earliest else {
                return Ok(0);
            };
            let now = self.clock.now_nanos();
            if now >= deadline {
                return Ok(0);
            }
            if self.clock.is_virtual() {
                self.clock.advance_to(due.min(deadline));
            } else {
                // Sleep in slices of at most 1 ms so that a power cut from another thread stops
                // a waiting caller promptly.
                let gap = due.min(deadline).saturating_sub(now).min(1_000_000);
                if gap >= 100_000 {
                    std::thread::sleep(Duration::from_nanos(gap));
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// I/Os of this power cycle not yet delivered; zero once the power is cut (they never will be).
    fn in_flight(&self) -> usize {
        let st = self.state();
        if st.off || st.generation != self.generation {
            0
        } else {
            // A linked flush waiting for its write counts too.
            st.inflight.len() + st.linked.len()
        }
    }
}

impl SimHandle {
    /// Cuts the power: applies the crash model to everything not yet durable; the current device
    /// then answers `Stopped` and its in-flight I/Os never complete. A second cut without a
    /// power-on changes nothing and reports nothing.
    pub fn power_cut(&self) -> CutReport {
        lock(&self.shared).power_cut()
    }

    /// Powers the device back on over what survived (cutting first if it is still on): an empty
    /// cache, nothing in flight, the same configuration; the RNG carries on, so the sequence of
    /// cycles is reproducible too. Armed faults stay armed.
    pub fn power_on(&self) -> SimDevice {
        let mut st = lock(&self.shared);
        if !st.off {
            st.power_cut();
        }
        st.generation += 1;
        st.off = false;
        st.cache.clear();
        st.inflight.clear();
        st.linked.clear();
        st.last_flush_finish = 0;
        let clock = st.cfg.clock.clone();
        SimDevice {
            shared: self.shared.clone(),
            generation: st.generation,
            info: st.info.clone(),
            #[cfg(target_os = "linux")]
            timer: due_timer(&clock),
            clock,
        }
    }

    pub fn is_off(&self) -> bool {
        lock(&self.shared).off
    }

    /// The next write (one per call) completes with an I/O error and writes nothing.
    pub fn fail_next_write(&self) {
        lock(&self.shared).faults.fail_writes += 1;
    }

    /// The next flush (one per call) completes with an I/O error. The writes it covered that are
    /// still in the cache when it fails are doomed: readable until the next cut, lost or torn at
    /// it, and no later flush, even one that reports success, makes them durable.
    pub fn fail_next_flush(&self) {
        lock(&self.shared).faults.fail_flushes += 1;
    }

    /// The next two flushes: the first fails, but its error is delivered only after the second
    /// has completed with success, a success that does not include the first's data (doomed as in
    /// [`SimHandle::fail_next_flush`]). If the first is the only I/O left in flight before a second
    /// flush is submitted, it completes (with its error) right away rather than hang its caller.
    pub fn fail_flush_out_of_order(&self) {
        lock(&self.shared).faults.ooo_armed += 1;
    }

    /// A latent sector error: reads touching blocks `[lba, lba + blocks)` fail with an I/O error
    /// until a successful write covers the block (each block written is cleared, as a drive remaps
    /// it). Clipped to the capacity.
    pub fn set_read_error(&self, lba: u64, blocks: u64) {
        let mut st = lock(&self.shared);
        let cap_blocks = st.cfg.capacity / st.lbs();
        let end = lba.saturating_add(blocks).min(cap_blocks);
        st.read_errors.insert(lba.min(cap_blocks), end);
    }

    /// Removes every latent read error.
    pub fn clear_read_errors(&self) {
        lock(&self.shared).read_errors.clear();
    }

    /// Flips bit `bit % 8` of the byte at `byte_offset` on the medium and in every cached write
    /// holding that byte, so the flip shows in reads now and survives any cut. Ignored past the end.
    pub fn flip_bit(&self, byte_offset: u64, bit: u8) {
        lock(&self.shared).flip_bit(byte_offset, bit);
    }

    /// The next write (one per call) lands at `to_lba` instead of its own address and completes
    /// successfully. The part that would fall past the end of the device is lost.
    pub fn misdirect_next_write(&self, to_lba: u64) {
        lock(&self.shared).faults.misdirects.push_back(to_lba);
    }

    /// Each later write fails with probability `p` (seeded), like [`SimHandle::fail_next_write`].
    pub fn set_write_error_rate(&self, p: f64) {
        lock(&self.shared).faults.write_error_rate = p;
    }

    /// Each later flush fails with probability `p` (seeded), like [`SimHandle::fail_next_flush`].
    pub fn set_flush_error_rate(&self, p: f64) {
        lock(&self.shared).faults.flush_error_rate = p;
    }

    /// The bytes a read would return now (the cache over the medium), without faults or latency.
    /// Clipped at the capacity, so the result may be shorter than `len`.
    pub fn peek(&self, byte_offset: u64, len: usize) -> Vec<u8> {
        let st = lock(&self.shared);
        let n = st.cfg.capacity.saturating_sub(byte_offset).min(len as u64) as usize;
        let mut buf = vec![0u8; n];
        st.read_view(byte_offset, &mut buf);
        buf
    }

    /// Writes straight to the durable medium, for tests that plant damage (a lost superblock copy,
    /// a corrupt record). The bytes show in reads at once and no cut can undo them: every 512-byte
    /// sector touched is made durable as it reads now with `data` written over it, and cached
    /// writes give up those sectors. Clipped at the capacity.
    pub fn poke_durable(&self, byte_offset: u64, data: &[u8]) {
        lock(&self.shared).poke_durable(byte_offset, data);
    }

    pub fn stats(&self) -> SimStats {
        let st = lock(&self.shared);
        let mut s = st.stats.clone();
        s.cached_writes = st.cache.len() as u64;
        s.in_flight = st.inflight.len() as u64;
        s.off = st.off;
        s
    }

    /// The device's clock (shared): tests advance a virtual clock through it.
    pub fn clock(&self) -> SimClock {
        lock(&self.shared).cfg.clock.clone()
    }

    /// The geometry the device actually uses (after normalization of the config).
    pub fn info(&self) -> DeviceInfo {
        lock(&self.shared).info.clone()
    }
}
