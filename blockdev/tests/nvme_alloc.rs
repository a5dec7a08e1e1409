//! Steady-state NVMe I/O allocates nothing: a counting global allocator watches many writes,
//! reads and flushes go through the driver and the software controller. Its own test binary, so
//! the allocator counts nobody else's work.
#![cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use blockdev::nvme::fake::{self, FakeConfig};
use blockdev::nvme::{NvmeDevice, NvmeOptions};
use blockdev::BlockDevice;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if COUNTING.with(Cell::get) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn steady_state_io_allocates_nothing() {
    // MDTS 3 (32 KiB commands) so that 64 KiB I/Os are split and use PRP lists; a small queue so
    // that it wraps hundreds of times.
    let cfg = FakeConfig {
        mdts: 3,
        mqes: 63,
        ..FakeConfig::default()
    };
    let (host, h) = fake::controller(cfg);
    let opts = NvmeOptions {
        queue_depth: 16,
        max_transfer: 64 << 10,
        arena_bytes: 4 << 20,
        max_arenas: 1,
        ..NvmeOptions::default()
    };
    let mut dev = NvmeDevice::with_host(host, 1, opts).unwrap();
    let depth = dev.queue_depth();
    // One slot stays free for the flush of each round.
    let mut free: Vec<_> = (0..depth - 1)
        .map(|i| {
            dev.alloc_buffer(if i.is_multiple_of(2) { 4096 } else { 64 << 10 })
                .unwrap()
        })
        .collect();
    let mut out = Vec::with_capacity(2 * depth);
    let mut round = |dev: &mut NvmeDevice<fake::FakeHost>, tag0: u64| {
        let mut submitted = 0;
        while let Some(b) = free.pop() {
            let tag = tag0 + submitted;
            let lba = (tag * 16) % 4096;
            if tag.is_multiple_of(3) {
                dev.submit_read(tag, lba, b).unwrap();
            } else {
                dev.submit_write(tag, lba, b).unwrap();
            }
            submitted += 1;
        }
        dev.submit_flush(u64::MAX).unwrap();
        let mut back = 0;
        while back < submitted {
            out.clear();
            dev.wait(&mut out, Duration::from_secs(1)).unwrap();
            for c in out.drain(..) {
                c.result.unwrap();
                if let Some(b) = c.buffer {
                    free.push(b);
                    back += 1;
                }
            }
        }
        while dev.in_flight() > 0 {
            out.clear();
            dev.wait(&mut out, Duration::from_secs(1)).unwrap();
        }
        submitted
    };
    // Warm up once, then count.
    round(&mut dev, 0);
    let before = h.stats();
    COUNTING.with(|c| c.set(true));
    let mut ios = 0;
    for r in 1..=300u64 {
        ios += round(&mut dev, r * 100);
    }
    COUNTING.with(|c| c.set(false));
    let allocations = ALLOCATIONS.load(Ordering::Relaxed);
    let after = h.stats();
    assert!(ios >= 300 * (depth as u64 - 1), "{ios} I/Os");
    assert!(
        after.prp_list_commands > before.prp_list_commands,
        "PRP lists were used"
    );
    assert!(after.writes + after.reads - before.writes - before.reads > 2 * 64);
    assert_eq!(after.flushes - before.flushes, 300);
    assert_eq!(
        allocations, 0,
        "{allocations} heap allocations during {ios} I/Os"
    );
}
