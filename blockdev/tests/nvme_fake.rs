//! The NVMe driver against the software controller: bring-up, I/O through the queues (wrap-around,
//! PRP lists, MDTS splitting, doorbell batching, out-of-order completions), status errors,
//! controller-fatal handling, the I/O timeout, and the refusals at open.
#![cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]

use std::collections::HashMap;
use std::time::Duration;

use blockdev::nvme::command::io;
use blockdev::nvme::fake::{self, FakeConfig, FakeHandle};
use blockdev::nvme::sys::{IovaRange, Memlock};
use blockdev::nvme::{NvmeDevice, NvmeOptions};
use blockdev::{BlockDevice, Completion, DeviceError, IoBuffer, Op, SyncIo};

type Dev = NvmeDevice<fake::FakeHost>;

fn small_opts() -> NvmeOptions {
    NvmeOptions {
        queue_depth: 32,
        max_transfer: 256 << 10,
        arena_bytes: 8 << 20,
        max_arenas: 2,
        ..NvmeOptions::default()
    }
}

fn open_with(cfg: FakeConfig, opts: NvmeOptions) -> (Dev, FakeHandle) {
    let nsid = cfg.nsid;
    let (host, h) = fake::controller(cfg);
    (NvmeDevice::with_host(host, nsid, opts).unwrap(), h)
}

fn open_err(cfg: FakeConfig, nsid: u32, opts: NvmeOptions) -> String {
    let (host, _h) = fake::controller(cfg);
    match NvmeDevice::with_host(host, nsid, opts) {
        Ok(_) => panic!("open succeeded"),
        Err(e @ DeviceError::Open { .. }) => e.to_string(),
        Err(e) => panic!("not an open error: {e:?}"),
    }
}

fn drain(dev: &mut Dev, want: usize) -> Vec<Completion> {
    let mut out = Vec::with_capacity(want);
    let mut rounds = 0;
    while out.len() < want {
        dev.wait(&mut out, Duration::from_millis(100)).unwrap();
        rounds += 1;
        assert!(
            rounds < 1000,
            "only {} of {want} completions arrived",
            out.len()
        );
    }
    out
}

fn pattern(seed: u64, lba: u64, k: usize) -> u8 {
    (seed.wrapping_mul(31) as usize ^ (lba as usize * 7) ^ k.wrapping_mul(13)) as u8
}

fn filled(dev: &mut Dev, seed: u64, lba: u64, len: usize) -> IoBuffer {
    let mut b = dev.alloc_buffer(len).unwrap();
    for (k, x) in b.iter_mut().enumerate() {
        *x = pattern(seed, lba, k);
    }
    b
}

#[test]
fn bring_up_follows_the_admin_sequence_and_reports_the_geometry() {
    let cfg = FakeConfig {
        awupf: 3,
        ..FakeConfig::default()
    };
    let (dev, h) = open_with(cfg, NvmeOptions::default());
    let s = h.stats();
    assert_eq!(s.enables, 1);
    assert!(s.bus_master, "bus mastering enabled through config space");
    assert!(
        s.queues_requested,
        "Set Features Number of Queues before queue creation"
    );
    assert!(!s.admin_regs_written_while_enabled);
    // Identify controller (CNS 1), Identify namespace (CNS 0), Get Features VWC, Get Log Page
    // SMART, Set Features Number of Queues, Create I/O CQ, Create I/O SQ.
    assert_eq!(
        s.admin_log,
        vec![0x0106, 0x0006, 0x0A, 0x02, 0x09, 0x05, 0x01]
    );
    assert!(
        i_health(&dev).starts_with("SMART critical warning 0x00 (none)"),
        "{}",
        i_health(&dev)
    );
    let i = dev.info();
    assert_eq!(i.logical_block_size, 4096);
    assert_eq!(i.physical_block_size, 4096);
    assert_eq!(i.capacity, 16384 * 4096);
    assert_eq!(i.max_transfer, 1 << 20);
    assert_eq!(i.atomic_write_unit, 4 * 4096, "AWUPF is 0's based");
    assert!(i.volatile_write_cache);
    assert_eq!(i.identity, "nvme:FAKE-0001 ns=1");
    assert_eq!(i.model, "nvmq fake controller fw 1.0");
    let d = dev.details();
    assert_eq!(d.mdts_bytes, Some(128 << 10));
    assert_eq!(d.command_bytes, 128 << 10);
    assert!(d.write_cache_enabled);
    assert_eq!(d.version, 0x0001_0400);
    assert_eq!(dev.queue_depth(), 128);
    assert_eq!(h.pci_command() & 0b100, 0b100);
}

fn i_health<H: blockdev::nvme::sys::Host>(dev: &NvmeDevice<H>) -> String {
    dev.info().health.clone()
}

#[test]
fn a_failed_power_loss_protection_shows_in_the_device_health() {
    let cfg = FakeConfig {
        critical_warning: 0x10,
        ..FakeConfig::default()
    };
    let (dev, _h) = open_with(cfg, small_opts());
    let health = i_health(&dev);
    assert!(
        health.contains("volatile memory backup (power-loss protection) failed"),
        "{health}"
    );
    let smart = dev.details().smart.clone().expect("SMART read");
    assert!(smart.plp_failed());
}

#[test]
fn a_controller_left_enabled_is_disabled_before_the_admin_queues_are_set() {
    let cfg = FakeConfig {
        start_enabled: true,
        ..FakeConfig::default()
    };
    let (mut dev, h) = open_with(cfg, small_opts());
    let s = h.stats();
    assert_eq!((s.disables, s.enables), (1, 1));
    assert!(!s.admin_regs_written_while_enabled);
    dev.write_at(0, &[1u8; 4096]).unwrap();
}

#[test]
fn close_deletes_the_queues_before_the_shutdown() {
    let (dev, h) = open_with(FakeConfig::default(), small_opts());
    dev.close().unwrap();
    let log = h.stats().admin_log;
    assert_eq!(
        &log[log.len() - 2..],
        &[0x00, 0x04],
        "Delete SQ, then Delete CQ"
    );
    assert_eq!(h.stats().shutdowns, 1);
}

#[test]
fn queues_wrap_around_many_times_with_phase_flips() {
    // 8-entry queues: at most 7 commands in flight, so 7 caller I/Os of one command each.
    let cfg = FakeConfig {
        mqes: 7,
        ..FakeConfig::default()
    };
    let opts = NvmeOptions {
        queue_depth: 64,
        max_transfer: 64 << 10,
        ..small_opts()
    };
    let (mut dev, h) = open_with(cfg, opts);
    assert_eq!(dev.details().queue_entries, 8);
    assert_eq!(dev.queue_depth(), 7);
    let total = 20 * 8; // 20 passes over each queue, each pass flipping the phase.
    let mut buffers: Vec<IoBuffer> = (0..7).map(|_| dev.alloc_buffer(4096).unwrap()).collect();
    let mut next = 0u64;
    let mut done = 0u64;
    let mut out = Vec::with_capacity(8);
    while done < total {
        while next < total && dev.in_flight() < dev.queue_depth() {
            let mut b = buffers.pop().unwrap();
            b.fill(next as u8);
            dev.submit_write(next, next % 64, b).unwrap();
            next += 1;
        }
        out.clear();
        dev.wait(&mut out, Duration::from_secs(1)).unwrap();
        for c in out.drain(..) {
            c.result.unwrap();
            buffers.push(c.buffer.unwrap());
            done += 1;
        }
    }
    assert_eq!(h.stats().writes, total);
    // The last write to each block won.
    for lba in 0..64u64 {
        let last = (0..total).filter(|i| i % 64 == lba).max().unwrap();
        assert!(h
            .peek((lba * 4096) as usize, 4096)
            .iter()
            .all(|&x| x == last as u8));
    }
}

#[test]
fn doorbells_are_rung_once_per_batch() {
    let (mut dev, h) = open_with(FakeConfig::default(), small_opts());
    let before = h.stats();
    for tag in 0..10 {
        let b = dev.alloc_buffer(4096).unwrap();
        dev.submit_write(tag, tag, b).unwrap();
    }
    assert_eq!(
        h.stats().sq_doorbells,
        before.sq_doorbells,
        "submit does not ring"
    );
    assert_eq!(h.stats().writes, 0);
    let mut out = Vec::with_capacity(16);
    assert_eq!(dev.poll(&mut out).unwrap(), 10);
    let after = h.stats();
    assert_eq!(after.sq_doorbells - before.sq_doorbells, 1);
    assert_eq!(after.cq_doorbells - before.cq_doorbells, 1);
    // An idle poll rings nothing.
    assert_eq!(dev.poll(&mut out).unwrap(), 0);
    assert_eq!(h.stats().sq_doorbells, after.sq_doorbells);
    assert_eq!(h.stats().cq_doorbells, after.cq_doorbells);
}

#[test]
fn transfers_over_two_pages_use_prp_lists() {
    let (mut dev, h) = open_with(FakeConfig::default(), small_opts());
    for (tag, len) in [(1u64, 4096usize), (2, 8192)] {
        let b = filled(&mut dev, tag, tag * 100, len);
        dev.submit_write(tag, tag * 100, b).unwrap();
        drain(&mut dev, 1)[0].result.as_ref().unwrap();
    }
    assert_eq!(h.stats().prp_list_commands, 0);
    let b = filled(&mut dev, 3, 300, 96 << 10);
    dev.submit_write(3, 300, b).unwrap();
    drain(&mut dev, 1)[0].result.as_ref().unwrap();
    assert_eq!(h.stats().prp_list_commands, 1);
    let back = dev.read_at(300 * 4096, 96 << 10).unwrap();
    assert!(back
        .iter()
        .enumerate()
        .all(|(k, &x)| x == pattern(3, 300, k)));
}

#[test]
fn transfers_over_mdts_are_split_and_completed_once() {
    // MDTS 1: 8 KiB per command.
    let cfg = FakeConfig {
        mdts: 1,
        ..FakeConfig::default()
    };
    let (mut dev, h) = open_with(cfg, small_opts());
    assert_eq!(dev.details().command_bytes, 8192);
    h.log_commands();
    let b = filled(&mut dev, 9, 40, 64 << 10);
    dev.submit_write(9, 40, b).unwrap();
    let c = drain(&mut dev, 1);
    assert_eq!(c.len(), 1);
    c[0].result.as_ref().unwrap();
    assert_eq!(c[0].lba, 40);
    let log = h.command_log();
    let expect: Vec<(u8, u64, u32)> = (0..8).map(|i| (io::WRITE, 40 + 2 * i, 2)).collect();
    assert_eq!(log, expect);
    assert_eq!(h.stats().max_command_bytes, 8192);
    let back = dev.read_at(40 * 4096, 64 << 10).unwrap();
    assert!(back
        .iter()
        .enumerate()
        .all(|(k, &x)| x == pattern(9, 40, k)));
    let mut out = Vec::new();
    assert_eq!(
        dev.poll(&mut out).unwrap(),
        0,
        "no stray completions of parts"
    );
}

#[test]
fn a_failed_part_fails_the_whole_io_once_with_the_nvme_status() {
    let cfg = FakeConfig {
        mdts: 1,
        ..FakeConfig::default()
    };
    let (mut dev, h) = open_with(cfg, small_opts());
    h.fail_next(io::WRITE, 2, 0x80, false);
    let b = dev.alloc_buffer(32 << 10).unwrap();
    dev.submit_write(5, 100, b).unwrap();
    let c = drain(&mut dev, 1);
    let e = c[0].result.clone().unwrap_err();
    assert_eq!(
        e,
        DeviceError::Nvme {
            op: Op::Write,
            lba: 100,
            opcode: io::WRITE,
            sct: 2,
            sc: 0x80,
            dnr: false,
            meaning: "write fault"
        }
    );
    assert!(e.to_string().contains("write fault"));
    assert!(
        c[0].buffer.is_some(),
        "the buffer comes back with the error"
    );
    assert_eq!(dev.in_flight(), 0);
    // The device keeps working: the caller decides what a failed write means.
    let b = dev.alloc_buffer(4096).unwrap();
    dev.submit_write(6, 0, b).unwrap();
    drain(&mut dev, 1)[0].result.as_ref().unwrap();
}

#[test]
fn out_of_range_io_is_a_clean_error() {
    let (mut dev, h) = open_with(FakeConfig::default(), small_opts());
    let cap = dev.info().capacity / 4096;
    let b = dev.alloc_buffer(8192).unwrap();
    assert!(matches!(
        dev.submit_write(1, cap - 1, b),
        Err(DeviceError::OutOfRange { op: Op::Write, .. })
    ));
    let b = dev.alloc_buffer(4096).unwrap();
    assert!(dev.submit_read(2, u64::MAX, b).is_err());
    // The controller's own LBA Out of Range status (e.g. a namespace shrunk underneath).
    h.fail_next(io::READ, 0, 0x80, true);
    let b = dev.alloc_buffer(4096).unwrap();
    dev.submit_read(3, 7, b).unwrap();
    let e = drain(&mut dev, 1)[0]
        .result
        .clone()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("LBA out of range") && e.contains("block 7"),
        "{e}"
    );
    assert_eq!(dev.in_flight(), 0);
}

#[test]
fn completions_may_arrive_out_of_order() {
    let (mut dev, h) = open_with(FakeConfig::default(), small_opts());
    h.hold_completions();
    for tag in 0..5 {
        let b = filled(&mut dev, tag, tag, 4096);
        dev.submit_write(tag, tag, b).unwrap();
    }
    let mut out = Vec::with_capacity(8);
    assert_eq!(dev.poll(&mut out).unwrap(), 0);
    h.release();
    assert_eq!(dev.poll(&mut out).unwrap(), 5);
    let tags: Vec<u64> = out.iter().map(|c| c.tag).collect();
    assert_eq!(tags, vec![4, 3, 2, 1, 0]);
}

#[test]
fn a_fatal_controller_stops_the_device_and_fails_what_was_in_flight() {
    let (mut dev, h) = open_with(FakeConfig::default(), small_opts());
    h.hold_completions();
    for tag in 0..3 {
        let b = dev.alloc_buffer(4096).unwrap();
        dev.submit_write(tag, tag, b).unwrap();
    }
    let mut out = Vec::with_capacity(4);
    dev.poll(&mut out).unwrap();
    h.set_fatal();
    let c = drain(&mut dev, 3);
    for x in &c {
        let e = x.result.clone().unwrap_err().to_string();
        assert!(e.contains("fatal status") && e.contains("CSTS=0x"), "{e}");
        assert!(x.buffer.is_some());
    }
    assert!(dev.is_stopped());
    assert_eq!(dev.in_flight(), 0);
    assert_eq!(h.pci_command() & 0b100, 0, "bus mastering turned off");
    let b = dev.alloc_buffer(4096).unwrap();
    assert!(matches!(
        dev.submit_write(9, 0, b),
        Err(DeviceError::Stopped { .. })
    ));
    assert!(matches!(
        dev.submit_flush(9),
        Err(DeviceError::Stopped { .. })
    ));
}

#[test]
fn close_shuts_down_and_unmaps_everything() {
    let (mut dev, h) = open_with(FakeConfig::default(), small_opts());
    dev.write_at(0, &[7u8; 8192]).unwrap();
    assert!(h.live_mappings() >= 3);
    dev.close().unwrap();
    assert_eq!(h.stats().shutdowns, 1);
    assert_eq!(h.live_mappings(), 0);
}

#[test]
fn dropping_with_io_in_flight_neither_hangs_nor_panics() {
    let (mut dev, h) = open_with(FakeConfig::default(), small_opts());
    h.hold_completions();
    for tag in 0..4 {
        let b = dev.alloc_buffer(4096).unwrap();
        dev.submit_write(tag, tag, b).unwrap();
    }
    let mut out = Vec::new();
    dev.poll(&mut out).unwrap();
    drop(dev);
    assert_eq!(h.stats().shutdowns, 1);
    assert_eq!(h.live_mappings(), 0);
}

#[test]
fn buffers_outlive_the_device_safely() {
    let (mut dev, _h) = open_with(FakeConfig::default(), small_opts());
    let mut b = dev.alloc_buffer(4096).unwrap();
    drop(dev);
    b.fill(3);
    assert!(b.iter().all(|&x| x == 3));
}

#[test]
fn buffers_are_zeroed_page_aligned_and_arenas_grow_to_the_limit() {
    let opts = NvmeOptions {
        arena_bytes: 2 << 20,
        max_arenas: 2,
        ..small_opts()
    };
    let (mut dev, h) = open_with(FakeConfig::default(), opts);
    let maps = h.stats().dma_maps;
    let mut keep = Vec::new();
    // Nine 256 KiB buffers do not fit one 2 MiB arena.
    for _ in 0..9 {
        let b = dev.alloc_buffer(256 << 10).unwrap();
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert_eq!(b.iova() % 4096, 0);
        assert!(b.iter().all(|&x| x == 0));
        keep.push(b);
    }
    assert_eq!(h.stats().dma_maps, maps + 1, "a second arena was mapped");
    let mut e = None;
    for _ in 0..16 {
        match dev.alloc_buffer(256 << 10) {
            Ok(b) => keep.push(b),
            Err(x) => {
                e = Some(x);
                break;
            }
        }
    }
    assert_eq!(
        keep.len(),
        16,
        "two 2 MiB arenas hold sixteen 256 KiB buffers"
    );
    assert!(
        matches!(e, Some(DeviceError::BadRequest { why, .. }) if why.contains("arenas are full"))
    );
}

#[test]
fn iovas_stay_inside_the_reported_ranges() {
    // Only a window above 4 GiB with a hole; the fake refuses maps outside, so opening and doing
    // I/O proves the allocator honoured the ranges.
    let cfg = FakeConfig {
        iova_ranges: vec![
            IovaRange {
                start: 1 << 32,
                end: (1 << 32) + (3 << 20) - 1,
            },
            IovaRange {
                start: 1 << 33,
                end: (1 << 34) - 1,
            },
        ],
        ..FakeConfig::default()
    };
    let (mut dev, _h) = open_with(cfg, small_opts());
    let b = dev.alloc_buffer(4096).unwrap();
    assert!(b.iova() >= 1 << 33);
    dev.write_at(4096, &[1u8; 4096]).unwrap();
    assert_eq!(dev.read_at(4096, 4096).unwrap(), vec![1u8; 4096]);
}

#[test]
fn volatile_write_cache_follows_the_identify_bit() {
    let cfg = FakeConfig {
        vwc_present: false,
        ..FakeConfig::default()
    };
    let (dev, _h) = open_with(cfg, small_opts());
    assert!(!dev.info().volatile_write_cache);
    assert!(!dev.details().write_cache_enabled);
    // A present cache that is switched off still counts (storage.md §1).
    let cfg = FakeConfig {
        write_cache_enabled: false,
        ..FakeConfig::default()
    };
    let (dev, _h) = open_with(cfg, small_opts());
    assert!(dev.info().volatile_write_cache);
    assert!(!dev.details().write_cache_enabled);
}

#[test]
fn a_missing_or_inactive_namespace_is_refused() {
    let e = open_err(FakeConfig::default(), 2, small_opts());
    assert!(
        e.contains("namespace 2 does not exist") && e.contains("1..=1"),
        "{e}"
    );
    let e = open_err(FakeConfig::default(), 0, small_opts());
    assert!(e.contains("namespace 0 does not exist"), "{e}");
    let cfg = FakeConfig {
        nn: 4,
        ..FakeConfig::default()
    };
    let e = open_err(cfg, 3, small_opts());
    assert!(e.contains("namespace 3 is not active"), "{e}");
}

#[test]
fn a_format_with_metadata_is_refused() {
    let cfg = FakeConfig {
        ms: 8,
        ..FakeConfig::default()
    };
    let e = open_err(cfg, 1, small_opts());
    assert!(
        e.contains("8 metadata bytes") && e.contains("nvme format"),
        "{e}"
    );
}

#[test]
fn a_low_memlock_limit_is_named_with_the_fix() {
    let cfg = FakeConfig {
        memlock: Memlock {
            limit: Some(1 << 20),
            privileged: false,
        },
        ..FakeConfig::default()
    };
    let e = open_err(cfg, 1, small_opts());
    assert!(
        e.contains("RLIMIT_MEMLOCK is 1048576 bytes") && e.contains("ulimit -l"),
        "{e}"
    );
    // CAP_IPC_LOCK lifts the limit.
    let cfg = FakeConfig {
        memlock: Memlock {
            limit: Some(1 << 20),
            privileged: true,
        },
        ..FakeConfig::default()
    };
    open_with(cfg, small_opts());
}

#[test]
fn a_failing_dma_map_is_reported() {
    let (host, h) = fake::controller(FakeConfig::default());
    h.fail_next_dma_map();
    let e = NvmeDevice::with_host(host, 1, small_opts())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("VFIO_IOMMU_MAP_DMA") && e.contains("pinned memory limit"),
        "{e}"
    );
}

#[test]
fn a_controller_that_never_gets_ready_times_out() {
    let cfg = FakeConfig {
        never_ready: true,
        ..FakeConfig::default()
    };
    let e = open_err(cfg, 1, small_opts());
    assert!(
        e.contains("did not become ready") && e.contains("500 ms"),
        "{e}"
    );
}

#[test]
fn bad_options_are_refused() {
    for opts in [
        NvmeOptions {
            queue_depth: 0,
            ..small_opts()
        },
        NvmeOptions {
            max_transfer: 1000,
            ..small_opts()
        },
        NvmeOptions {
            max_arenas: 0,
            ..small_opts()
        },
        NvmeOptions {
            arena_bytes: 4096,
            ..small_opts()
        },
        NvmeOptions {
            io_timeout: Duration::ZERO,
            ..small_opts()
        },
        NvmeOptions {
            io_timeout: Duration::from_secs(7200),
            ..small_opts()
        },
    ] {
        let e = open_err(FakeConfig::default(), 1, opts);
        assert!(e.contains("NvmeOptions"), "{e}");
    }
}

/// xorshift64*, seeded; NVMQ_SEED replays a run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn random_io_matches_a_model() {
    let seed: u64 = std::env::var("NVMQ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED_0001);
    let result = std::panic::catch_unwind(|| random_run(seed));
    if result.is_err() {
        panic!("random_io_matches_a_model failed; replay with NVMQ_SEED={seed}");
    }
}

fn random_run(seed: u64) {
    let mut rng = Rng(seed | 1);
    let cfg = FakeConfig {
        mdts: 2,
        mqes: 63,
        blocks: 2048,
        lbads: 9,
        ..FakeConfig::default()
    };
    let (mut dev, h) = open_with(cfg, small_opts());
    let bs = 512usize;
    let blocks = 2048u64;
    let mut model = vec![0u8; blocks as usize * bs];
    let mut out = Vec::with_capacity(64);
    // Writes to disjoint ranges within one round, so completion order cannot matter.
    for round in 0..40u64 {
        let mut taken = vec![false; blocks as usize];
        let mut pending = HashMap::new();
        for i in 0..rng.below(dev.queue_depth() as u64) + 1 {
            let n = rng.below(200) + 1;
            let lba = rng.below(blocks - n);
            if (lba..lba + n).any(|b| taken[b as usize]) {
                continue;
            }
            (lba..lba + n).for_each(|b| taken[b as usize] = true);
            let tag = round * 1000 + i;
            let mut b = dev.alloc_buffer(n as usize * bs).unwrap();
            let fill = rng.next();
            for (k, x) in b.iter_mut().enumerate() {
                *x = (fill >> (k % 8 * 8)) as u8 ^ k as u8;
            }
            model[lba as usize * bs..(lba + n) as usize * bs].copy_from_slice(&b);
            dev.submit_write(tag, lba, b).unwrap();
            pending.insert(tag, lba);
        }
        while !pending.is_empty() {
            out.clear();
            dev.wait(&mut out, Duration::from_secs(1)).unwrap();
            for c in out.drain(..) {
                c.result.unwrap();
                assert_eq!(pending.remove(&c.tag), Some(c.lba));
            }
        }
    }
    assert_eq!(h.peek(0, model.len()), model);
    let back = dev.read_at(0, model.len()).unwrap();
    assert!(back == model, "read back differs from the model");
}

/// In the QEMU guest (clocksource HPET) every clock read is a `clock_gettime` system call, and
/// `wait` read the clock once per call: about one system call per batch of I/Os. A wait that the
/// controller answers at once must not read the clock at all; one that times out still does.
#[test]
fn waits_answered_at_once_read_no_clock() {
    let (mut dev, h) = open_with(FakeConfig::default(), small_opts());
    let before = h.stats().clock_reads;
    let mut out = Vec::new();
    for i in 0..200u64 {
        let b = dev.alloc_buffer(4096).unwrap();
        dev.submit_write(i, i, b).unwrap();
        dev.submit_flush(1000 + i).unwrap();
        out.clear();
        while dev.in_flight() > 0 {
            dev.wait(&mut out, Duration::from_secs(5)).unwrap();
        }
        assert_eq!(out.len(), 2);
    }
    assert_eq!(h.stats().clock_reads, before, "clock reads in 200 waits");

    h.hold_completions();
    let b = dev.alloc_buffer(4096).unwrap();
    dev.submit_write(7, 7, b).unwrap();
    let t = std::time::Instant::now();
    out.clear();
    assert_eq!(dev.wait(&mut out, Duration::from_millis(50)).unwrap(), 0);
    assert!(
        t.elapsed() >= Duration::from_millis(50),
        "{:?}",
        t.elapsed()
    );
    assert!(h.stats().clock_reads > before);
}

fn timeout_opts(ms: u64) -> NvmeOptions {
    NvmeOptions {
        io_timeout: Duration::from_millis(ms),
        ..small_opts()
    }
}

/// Waits until the device fails. Bounded (600 waits of 100 ms) so a timeout that never fires
/// fails the test instead of hanging it; nothing is asserted about when it fires.
fn wait_for_failure(dev: &mut Dev, out: &mut Vec<Completion>) -> DeviceError {
    for _ in 0..600 {
        if let Err(e) = dev.wait(out, Duration::from_millis(100)) {
            return e;
        }
    }
    panic!(
        "no error after 600 waits with {} I/Os in flight",
        dev.in_flight()
    );
}

#[test]
fn a_command_that_never_completes_fails_the_device_naming_it() {
    let (mut dev, h) = open_with(FakeConfig::default(), timeout_opts(20));
    h.stall_nth(1);
    let a = filled(&mut dev, 1, 4, 4096);
    dev.submit_write(1, 4, a).unwrap();
    let b = filled(&mut dev, 2, 9, 8192);
    dev.submit_write(2, 9, b).unwrap();
    let mut out = Vec::new();
    dev.poll(&mut out).unwrap();
    let stalled = h.stalled();
    assert_eq!(stalled.len(), 1, "the second write is stalled");
    let e = wait_for_failure(&mut dev, &mut out);
    let DeviceError::CommandTimeout {
        op,
        lba,
        opcode,
        cid,
        qid,
        waited_ms,
        timeout_ms,
        ref abort,
    } = e
    else {
        panic!("not a timeout: {e:?}");
    };
    assert_eq!(
        (op, lba, opcode, qid, timeout_ms),
        (Op::Write, 9, io::WRITE, 1, 20)
    );
    assert_eq!(
        (qid, cid),
        stalled[0],
        "the error names the stalled command"
    );
    assert!(waited_ms >= 20, "waited {waited_ms} ms");
    assert!(abort.contains("aborted the command"), "{abort}");
    let msg = e.to_string();
    for want in [
        "write at block 9 timed out",
        "NVMe command 0x01",
        &format!("command id {cid} on submission queue 1"),
        "io_timeout 20 ms",
        "the device is stopped",
    ] {
        assert!(msg.contains(want), "{msg:?} lacks {want:?}");
    }
    // The Abort went out, naming the command.
    let s = h.stats();
    assert_eq!(s.aborts, vec![(1, cid)]);
    assert!(s.admin_log.contains(&0x08));
    // The write that completed in time is unaffected; the stalled one fails with the timeout and
    // its buffer comes back.
    let mut by_tag: HashMap<u64, &Completion> = out.iter().map(|c| (c.tag, c)).collect();
    assert_eq!(out.len(), 2, "each I/O completes once");
    assert_eq!(by_tag.remove(&1).unwrap().result, Ok(()));
    let two = by_tag.remove(&2).unwrap();
    assert_eq!(two.result, Err(e.clone()));
    assert!(two.buffer.is_some());
    assert!(dev.is_stopped());
    assert_eq!(dev.in_flight(), 0);
    // Every later call reports it; every submit is refused with it.
    assert_eq!(dev.poll(&mut out), Err(e.clone()));
    assert_eq!(dev.wait(&mut out, Duration::from_millis(1)), Err(e.clone()));
    let c = dev.alloc_buffer(4096).unwrap();
    for (r, want) in [
        (dev.submit_write(3, 0, c), Op::Write),
        (dev.submit_flush(4), Op::Flush),
    ] {
        match r {
            Err(DeviceError::Failed { op, reason, .. }) => {
                assert_eq!(op, want);
                assert_eq!(*reason, e);
            }
            r => panic!("submit after the timeout: {r:?}"),
        }
    }
    assert_eq!(h.stats().flushes, 0, "nothing reached the controller");
}

#[test]
fn a_flush_that_times_out_is_never_reported_durable_nor_retried() {
    let (mut dev, h) = open_with(FakeConfig::default(), timeout_opts(20));
    h.ignore_aborts();
    h.stall_opcode(io::FLUSH);
    let b = filled(&mut dev, 3, 0, 4096);
    dev.submit_write(1, 0, b).unwrap();
    dev.submit_flush(2).unwrap();
    let mut out = Vec::new();
    let e = wait_for_failure(&mut dev, &mut out);
    assert!(
        matches!(
            &e,
            DeviceError::CommandTimeout {
                op: Op::Flush,
                opcode: io::FLUSH,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("did not abort"), "{e}");
    assert_eq!(h.stats().aborts.len(), 1);
    let flushes = h.stats().flushes;
    assert_eq!(flushes, 1);
    // The controller now completes the flush, late: it must not come back as a success.
    h.release_stalled();
    for _ in 0..1000 {
        assert_eq!(dev.poll(&mut out), Err(e.clone()));
    }
    assert_eq!(dev.wait(&mut out, Duration::from_millis(5)), Err(e.clone()));
    let flush: Vec<&Completion> = out.iter().filter(|c| c.tag == 2).collect();
    assert_eq!(flush.len(), 1, "the flush completes once");
    assert_eq!(flush[0].result, Err(e.clone()));
    assert_eq!(
        out.iter().find(|c| c.tag == 1).map(|c| c.result.clone()),
        Some(Ok(()))
    );
    // No retry: nothing gets to the controller any more.
    assert!(dev.submit_flush(3).is_err());
    assert_eq!(dev.poll(&mut out), Err(e));
    assert_eq!(h.stats().flushes, flushes);
}

/// Many short waits on held commands, over a hundred timeouts of wall time: the epochs advance
/// and the hint of the oldest command goes stale again and again, yet a command that completes
/// within the timeout is never failed.
#[test]
fn commands_that_complete_in_time_never_time_out() {
    let (mut dev, h) = open_with(FakeConfig::default(), timeout_opts(2));
    let start = std::time::Instant::now();
    let mut out = Vec::new();
    let mut rounds = 0u64;
    while rounds < 100 || start.elapsed() < Duration::from_millis(200) {
        h.hold_completions();
        let b = dev.alloc_buffer(4096).unwrap();
        dev.submit_write(rounds, rounds % 64, b).unwrap();
        // Returns after the first clock reading, which ages the command.
        assert_eq!(dev.wait(&mut out, Duration::ZERO).unwrap(), 0);
        h.release();
        let c = drain(&mut dev, 1);
        assert_eq!(c[0].result, Ok(()), "round {rounds}");
        rounds += 1;
    }
    assert!(h.stats().clock_reads >= rounds);
    assert!(h.stats().aborts.is_empty());
}

#[test]
fn an_idle_device_does_not_time_out() {
    let (mut dev, h) = open_with(FakeConfig::default(), timeout_opts(2));
    let mut out = Vec::new();
    let mut held_write = |dev: &mut Dev, tag: u64| {
        h.hold_completions();
        let b = dev.alloc_buffer(4096).unwrap();
        dev.submit_write(tag, tag, b).unwrap();
        assert_eq!(dev.wait(&mut out, Duration::ZERO).unwrap(), 0);
        h.release();
        assert_eq!(drain(dev, 1)[0].result, Ok(()));
    };
    held_write(&mut dev, 1);
    // Idle for many timeouts: nothing in flight, nothing to age.
    std::thread::sleep(Duration::from_millis(50));
    let mut none = Vec::new();
    assert_eq!(dev.poll(&mut none).unwrap(), 0);
    assert_eq!(dev.wait(&mut none, Duration::from_millis(10)).unwrap(), 0);
    // A command submitted after the idle spell starts young, though its epoch began long ago.
    held_write(&mut dev, 2);
    dev.write_at(8 * 4096, &[7u8; 4096]).unwrap();
    assert!(!dev.is_stopped());
}
