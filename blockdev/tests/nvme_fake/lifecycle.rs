//! A fatal controller, close, drop with I/O in flight, buffers and IOVAs.

use super::*;

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
    // Refused with the fatal status, not merely "stopped".
    let b = dev.alloc_buffer(4096).unwrap();
    for (r, want) in [
        (dev.submit_write(9, 0, b), Op::Write),
        (dev.submit_flush(9), Op::Flush),
    ] {
        match r {
            Err(DeviceError::Failed { op, reason, .. }) => {
                assert_eq!(op, want);
                assert!(reason.to_string().contains("fatal status"), "{reason}");
            }
            r => panic!("a submit after the fatal status: {r:?}"),
        }
    }
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
