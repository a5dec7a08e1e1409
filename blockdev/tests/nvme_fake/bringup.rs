//! Bring-up, health, geometry and what open refuses.

use super::*;

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
