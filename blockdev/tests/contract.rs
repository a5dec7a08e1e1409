//! The device contract suite (`blockdev::contract`) on every backend of this crate: the file
//! device on each engine (direct, buffered, a queue of two), the sim (with and without power-loss protection,
//! 512-byte blocks, a virtual clock with latency), and the NVMe driver against the software
//! controller. `nvme-check` runs the same suite on real NVMe.

mod file_support;

use std::time::Duration;

use blockdev::contract::{self, CheckResult, DeviceFactory, FileFactory, SimFactory, CHECKS};
use blockdev::file::{Engine, FileDevice, FileOptions};
use blockdev::sim::{Latency, SimClock, SimConfig};
use blockdev::BlockDevice;
use file_support::{io_uring_or_skip, plain_file, scratch};

fn assert_conforms(what: &str, results: &[CheckResult]) {
    let failed = contract::failures(results);
    assert!(
        failed.is_empty(),
        "{what} breaks the device contract:\n{}",
        failed.join("\n")
    );
}

/// Runs the whole suite, which must run every check and pass them all.
fn assert_suite_passes<F: DeviceFactory>(what: &str, factory: &mut F) {
    let results = contract::run_all(factory);
    assert_conforms(what, &results);
    let ran: Vec<&str> = results.iter().map(|r| r.check.name).collect();
    let all: Vec<&str> = CHECKS.iter().map(|c| c.name).collect();
    assert_eq!(ran, all, "{what}: the suite did not run every check");
}

fn file_suite(size: u64, options: FileOptions) {
    let dir = scratch();
    let mut f = FileFactory {
        path: plain_file(dir.path(), "dev", size),
        options,
    };
    // The event-loop checks have something to check here: a descriptor and linked pairs.
    let dev = f.open().unwrap();
    assert!(dev.completion_fd().is_some() && dev.info().linked_flush);
    drop(dev);
    assert_suite_passes(&format!("the file device {options:?}"), &mut f);
}

fn threads() -> FileOptions {
    FileOptions {
        engine: Engine::Threads,
        ..FileOptions::default()
    }
}

/// io_uring options, or `None` (after a loud notice) when io_uring is expected to be missing.
fn uring(test: &str) -> Option<FileOptions> {
    io_uring_or_skip(test).then(|| FileOptions {
        engine: Engine::IoUring,
        ..FileOptions::default()
    })
}

#[test]
fn file_device_direct() {
    file_suite(8 << 20, threads());
}

#[test]
fn file_device_buffered() {
    file_suite(
        4 << 20,
        FileOptions {
            direct: false,
            ..threads()
        },
    );
}

#[test]
fn file_device_with_a_queue_of_two() {
    file_suite(
        1 << 20,
        FileOptions {
            queue_depth: 2,
            io_threads: 2,
            ..threads()
        },
    );
}

#[test]
fn file_device_io_uring_direct() {
    if let Some(o) = uring("file_device_io_uring_direct") {
        file_suite(8 << 20, o);
    }
}

#[test]
fn file_device_io_uring_buffered() {
    if let Some(o) = uring("file_device_io_uring_buffered") {
        file_suite(4 << 20, FileOptions { direct: false, ..o });
    }
}

#[test]
fn file_device_io_uring_with_a_queue_of_two() {
    if let Some(o) = uring("file_device_io_uring_with_a_queue_of_two") {
        file_suite(
            1 << 20,
            FileOptions {
                queue_depth: 2,
                ..o
            },
        );
    }
}

/// The checks work through `Box<dyn BlockDevice>`, as the broker holds its device.
#[test]
fn file_device_boxed() {
    let dir = scratch();
    let p = plain_file(dir.path(), "dev", 1 << 20);
    let mut dev: Box<dyn BlockDevice> =
        Box::new(FileDevice::open(&p, FileOptions::default()).unwrap());
    assert_conforms(
        "a boxed file device",
        &contract::run_device_checks(&mut dev),
    );
}

fn sim_suite(what: &str, cfg: SimConfig) {
    let (seed, linked, real) = (cfg.seed, cfg.linked_flush, !cfg.clock.is_virtual());
    let mut f = SimFactory::new(cfg);
    // A completion fd (a timer) on a real clock, polled on a virtual one; linked pairs only when
    // configured (else the suite checks they are refused).
    let dev = f.open().unwrap();
    assert_eq!(
        dev.completion_fd().is_some(),
        real && cfg!(target_os = "linux")
    );
    assert_eq!(dev.info().linked_flush, linked);
    assert_suite_passes(&format!("the sim ({what}, seed {seed})"), &mut f);
    // Every reopen was a power cut.
    assert_eq!(f.handle().map(|h| h.stats().cuts), Some(2));
}

#[test]
fn sim_with_a_volatile_cache() {
    sim_suite("volatile cache", SimConfig::new(11, 4 << 20));
}

#[test]
fn sim_power_loss_protected() {
    let mut cfg = SimConfig::new(12, 4 << 20);
    cfg.volatile_cache = false;
    sim_suite("power-loss protected", cfg);
}

#[test]
fn sim_with_512_byte_blocks_and_read_modify_write_damage() {
    let mut cfg = SimConfig::new(13, 2 << 20);
    cfg.logical_block_size = 512;
    cfg.physical_block_size = 4096;
    cfg.max_transfer = 64 << 10;
    cfg.rmw_damage = true;
    cfg.garbage_sectors = true;
    sim_suite("512-byte blocks", cfg);
}

#[test]
fn sim_with_a_virtual_clock_latency_and_a_queue_of_four() {
    let mut cfg = SimConfig::new(14, 4 << 20);
    cfg.clock = SimClock::virtual_at_zero();
    cfg.queue_depth = 4;
    cfg.write_latency = Latency::Fixed(Duration::from_micros(5));
    cfg.flush_latency = Latency::Fixed(Duration::from_micros(50));
    cfg.serialize_flushes = true;
    sim_suite("virtual clock, latency, depth 4", cfg);
}

#[test]
fn sim_with_linked_write_and_flush() {
    let mut cfg = SimConfig::new(15, 4 << 20);
    cfg.linked_flush = true;
    cfg.clock = SimClock::virtual_at_zero();
    cfg.write_latency = Latency::Fixed(Duration::from_micros(20));
    cfg.flush_latency = Latency::Fixed(Duration::from_micros(100));
    sim_suite("linked write+flush, virtual clock", cfg);
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod nvme_fake {
    use blockdev::contract::FakeNvmeFactory;
    use blockdev::nvme::fake::{self, FakeConfig};
    use blockdev::nvme::{NvmeDevice, NvmeOptions};
    use blockdev::{BlockDevice, DeviceError, IoBuffer, Op};

    use super::{assert_suite_passes, Duration};

    /// Smaller than the defaults, so that the arenas fill and the queue limit is reached.
    fn small_opts() -> NvmeOptions {
        NvmeOptions {
            queue_depth: 48,
            max_transfer: 512 << 10,
            arena_bytes: 16 << 20,
            ..NvmeOptions::default()
        }
    }

    fn nvme_suite(what: &str, cfg: FakeConfig, opts: NvmeOptions) {
        let mut f = FakeNvmeFactory::new(cfg, opts);
        assert_suite_passes(&format!("the NVMe driver ({what})"), &mut f);
        // Each reopen left the controller running, as a dead process does; the next open found it
        // enabled and disabled it before setting up the admin queues.
        let h = f.handle().expect("opened");
        assert_eq!(f.reopens(), 2);
        assert_eq!(h.stats().disables, f.reopens());
        assert!(!h.stats().admin_regs_written_while_enabled);
    }

    #[test]
    fn nvme_on_the_software_controller() {
        nvme_suite("4096-byte blocks", FakeConfig::default(), small_opts());
    }

    #[test]
    fn nvme_with_a_queue_of_two() {
        let opts = NvmeOptions {
            queue_depth: 2,
            ..small_opts()
        };
        nvme_suite("queue depth 2", FakeConfig::default(), opts);
    }

    #[test]
    fn nvme_with_512_byte_blocks_and_split_transfers() {
        // MDTS 1: 8 KiB per command, so most transfers of the suite go out as several commands.
        let cfg = FakeConfig {
            lbads: 9,
            blocks: 8192,
            mdts: 1,
            ..FakeConfig::default()
        };
        nvme_suite("512-byte blocks, MDTS 8 KiB", cfg, small_opts());
    }

    // What the suite cannot see from outside the device: where the bytes went on the namespace,
    // how many commands a flush became, and that memory the device did not hand out is refused.

    fn drain(dev: &mut NvmeDevice<fake::FakeHost>, want: usize) -> Vec<blockdev::Completion> {
        let mut out = Vec::new();
        for _ in 0..1000 {
            if out.len() >= want {
                break;
            }
            dev.wait(&mut out, Duration::from_millis(100)).unwrap();
        }
        assert_eq!(out.len(), want, "completions");
        out
    }

    #[test]
    fn writes_land_on_the_namespace_and_a_flush_is_one_flush_command() {
        let (host, h) = fake::controller(FakeConfig::default());
        let mut dev = NvmeDevice::with_host(host, 1, small_opts()).unwrap();
        let mut b = dev.alloc_buffer(3 * 4096).unwrap();
        for (k, x) in b.iter_mut().enumerate() {
            *x = (k * 7 % 251) as u8;
        }
        let want = b.to_vec();
        dev.submit_write(1, 40, b).unwrap();
        drain(&mut dev, 1)[0].result.as_ref().unwrap();
        assert_eq!(h.peek(40 * 4096, 3 * 4096), want);
        assert!(h.peek(39 * 4096, 4096).iter().all(|&x| x == 0));
        assert!(h.peek(43 * 4096, 4096).iter().all(|&x| x == 0));
        dev.submit_flush(2).unwrap();
        drain(&mut dev, 1)[0].result.as_ref().unwrap();
        assert_eq!(h.stats().flushes, 1);
    }

    #[test]
    fn memory_not_from_alloc_buffer_is_refused() {
        let (host, _h) = fake::controller(FakeConfig::default());
        let mut dev = NvmeDevice::with_host(host, 1, small_opts()).unwrap();
        // The controller would DMA into memory that is not mapped for it.
        let heap = IoBuffer::new_heap(4096, 4096).unwrap();
        assert!(matches!(
            dev.submit_write(3, 0, heap),
            Err(DeviceError::BadRequest { op: Op::Write, why, .. }) if why.contains("alloc_buffer")
        ));
        assert_eq!(dev.in_flight(), 0);
    }
}

/// The suite reports a broken device instead of panicking, naming the check and the I/O.
#[test]
fn a_device_that_breaks_the_contract_is_reported() {
    let (dev, _h) = blockdev::sim::SimDevice::new(SimConfig::new(1, 1 << 20));
    // A sim that claims one block more than it has, so I/O at its claimed last block is refused.
    let mut broken = blockdev::reported::Reported::new(dev, |info| {
        info.capacity += u64::from(info.logical_block_size)
    });
    let results = contract::run_device_checks(&mut broken);
    let failed = contract::failures(&results);
    let last = failed
        .iter()
        .find(|l| l.starts_with("last-block FAIL"))
        .unwrap_or_else(|| panic!("last-block passed: {failed:?}"));
    assert!(
        last.contains("contract check last-block") && last.contains("block 256"),
        "{last}"
    );
    assert!(results.iter().any(|r| r.passed()), "{failed:?}");
}
