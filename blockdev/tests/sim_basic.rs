//! The sim as an ordinary block device: round trips with its counters, power states, its clock and
//! configuration. What every backend shares (refusals at submit, queue depth, flush, reopen) is the
//! contract suite's, run on the sim in tests/contract.rs.

mod sim_support;

use std::time::Duration;

use blockdev::sim::{Latency, SimClock, SimConfig, SimDevice};
use blockdev::{BlockDevice, DeviceError, Op, SyncIo};
use sim_support::*;

#[test]
fn round_trip_write_read_4k_and_512() {
    for lbs in [4096u32, 512] {
        let mut cfg = SimConfig::new(3, 4 * MIB);
        cfg.logical_block_size = lbs;
        cfg.physical_block_size = 4096;
        let (mut dev, h) = SimDevice::new(cfg);
        let info = dev.info().clone();
        assert_eq!(info.logical_block_size, lbs);
        assert_eq!(info.identity, "sim:3");
        assert_eq!(info.model, "nvmq sim");
        assert_eq!(info.fs_block_size, 0);
        assert!(info.volatile_write_cache);
        assert_eq!(info.write_unit(), 4096);

        let a = pattern(1, 3 * lbs as usize);
        let b = pattern(2, lbs as usize);
        write(&mut dev, 5, &a);
        write(&mut dev, 100, &b);
        assert_eq!(read(&mut dev, 5, a.len()).unwrap(), a, "lbs {lbs}");
        assert_eq!(read(&mut dev, 100, b.len()).unwrap(), b);
        assert!(read(&mut dev, 50, 2 * lbs as usize)
            .unwrap()
            .iter()
            .all(|&x| x == 0));
        assert_eq!(h.peek(5 * u64::from(lbs), a.len()), a);
        // Byte-addressed helpers go through the same path.
        dev.write_at(u64::from(lbs) * 200, &a).unwrap();
        assert_eq!(dev.read_at(u64::from(lbs) * 200, a.len()).unwrap(), a);
        flush(&mut dev).unwrap();
        let s = h.stats();
        assert_eq!(s.writes, 3);
        assert_eq!(s.flushes, 1);
        assert_eq!(s.reads, 4);
        assert_eq!(s.bytes_written, (a.len() * 2 + b.len()) as u64);
        assert_eq!(s.completed, 8);
        assert!(!s.off && !h.is_off());
    }
}

#[test]
fn cut_stops_the_old_device_and_power_on_gives_a_new_one() {
    let mut cfg = virtual_cfg(5);
    cfg.write_latency = Latency::Fixed(Duration::from_micros(10));
    let (mut dev, h) = SimDevice::new(cfg);
    let a = pattern(1, 8192);
    write(&mut dev, 0, &a);
    flush(&mut dev).unwrap();
    submit_write(&mut dev, 7, 10, &pattern(2, 4096));
    let rb = dev_buf(&mut dev);
    dev.submit_read(8, 0, rb).unwrap();
    assert_eq!(dev.in_flight(), 2);
    let report = h.power_cut();
    assert_eq!(report.dropped_ios, 2);
    assert_eq!(report.in_flight_writes, 1);
    assert!(h.is_off() && h.stats().off);
    assert_eq!(dev.in_flight(), 0);
    let mut out = Vec::new();
    assert!(matches!(
        dev.poll(&mut out),
        Err(DeviceError::Stopped { .. })
    ));
    assert!(matches!(
        dev.wait(&mut out, Duration::from_millis(1)),
        Err(DeviceError::Stopped { .. })
    ));
    let b = dev_buf(&mut dev);
    assert!(matches!(
        dev.submit_write(1, 0, b),
        Err(DeviceError::Stopped { op: Op::Write, .. })
    ));
    assert!(matches!(
        dev.submit_flush(1),
        Err(DeviceError::Stopped { op: Op::Flush, .. })
    ));
    assert!(out.is_empty(), "in-flight I/Os never complete after a cut");
    // A second cut finds nothing to do.
    assert_eq!(h.power_cut(), Default::default());

    let mut dev2 = h.power_on();
    assert!(!h.is_off());
    assert_eq!(read(&mut dev2, 0, 8192).unwrap(), a);
    write(&mut dev2, 3, &pattern(3, 4096));
    // The first device stays dead after the power-on.
    assert!(matches!(
        dev.poll(&mut out),
        Err(DeviceError::Stopped { .. })
    ));
    // power_on while on cuts first: the second device is now stopped.
    let mut dev3 = h.power_on();
    assert!(matches!(
        dev2.poll(&mut out),
        Err(DeviceError::Stopped { .. })
    ));
    assert_eq!(read(&mut dev3, 0, 8192).unwrap(), a);
    assert_eq!(h.stats().cuts, 2);
}

fn dev_buf(dev: &mut SimDevice) -> blockdev::IoBuffer {
    dev.alloc_buffer(4096).unwrap()
}

#[test]
fn nonsense_config_is_normalized_not_panicking() {
    let mut cfg = SimConfig::new(1, 10_000);
    cfg.logical_block_size = 1000;
    cfg.physical_block_size = 3;
    cfg.max_transfer = 5;
    cfg.queue_depth = 0;
    let (mut dev, h) = SimDevice::new(cfg);
    let info = dev.info().clone();
    assert_eq!(info.logical_block_size, 4096);
    assert_eq!(info.physical_block_size, 4096);
    assert_eq!(info.capacity, 8192);
    assert_eq!(info.max_transfer, 4096);
    assert_eq!(dev.queue_depth(), 1);
    assert_eq!(h.info(), info);
    write(&mut dev, 1, &pattern(1, 4096));
    // Handle calls with silly arguments do nothing harmful.
    h.flip_bit(u64::MAX, 200);
    h.set_read_error(u64::MAX, u64::MAX);
    h.poke_durable(u64::MAX - 1, &[1, 2, 3]);
    assert!(h.peek(u64::MAX, usize::MAX).is_empty());
    assert_eq!(h.peek(8000, 1000).len(), 192);
    h.misdirect_next_write(u64::MAX);
    write(&mut dev, 0, &pattern(2, 4096)); // lands nowhere, completes
    assert!(h.peek(0, 4096).iter().all(|&b| b == 0));
}

#[test]
fn sparse_multi_gib_capacity() {
    let cap = 8u64 << 30;
    let (mut dev, h) = SimDevice::new(SimConfig::new(4, cap));
    let last = cap / 4096 - 1;
    let a = pattern(4, 4096);
    write(&mut dev, last, &a);
    flush(&mut dev).unwrap();
    let mut dev = h.power_on();
    assert_eq!(read(&mut dev, last, 4096).unwrap(), a);
    assert!(read(&mut dev, last / 2, 4096)
        .unwrap()
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn writes_take_effect_at_completion_and_completions_reorder() {
    let mut cfg = virtual_cfg(11);
    cfg.write_latency = Latency::Fixed(Duration::from_micros(10));
    let (mut dev, h) = SimDevice::new(cfg);
    let a = pattern(1, 4096);
    submit_write(&mut dev, 1, 0, &a);
    assert!(
        h.peek(0, 4096).iter().all(|&b| b == 0),
        "not visible before completion"
    );
    let c = next(&mut dev);
    assert_eq!((c.tag, c.op, c.lba), (1, Op::Write, 0));
    assert!(c.result.is_ok());
    assert_eq!(c.buffer.as_deref(), Some(&a[..]), "the buffer comes back");
    assert_eq!(h.peek(0, 4096), a);

    // Completions due together (same virtual instant) come out in a seeded order, not always
    // submission order.
    let mut reordered = false;
    for seed in 0..20 {
        let (mut dev, _h) = SimDevice::new(virtual_cfg(seed));
        for t in 0..8 {
            submit_write(&mut dev, t, t, &pattern(t, 4096));
        }
        let tags: Vec<u64> = drain(&mut dev).iter().map(|c| c.tag).collect();
        let mut sorted = tags.clone();
        sorted.sort();
        assert_eq!(sorted, (0..8).collect::<Vec<_>>(), "seed {seed}");
        reordered |= tags != sorted;
    }
    assert!(reordered);
}

#[test]
fn real_clock_zero_latency_completes_on_next_poll() {
    let mut cfg = SimConfig::new(8, MIB);
    cfg.clock = SimClock::real();
    let (mut dev, _h) = SimDevice::new(cfg);
    submit_write(&mut dev, 1, 0, &pattern(1, 4096));
    let mut out = Vec::new();
    assert_eq!(dev.poll(&mut out).unwrap(), 1);
}

#[test]
fn handle_and_clock_are_send_and_sync() {
    fn send_sync<T: Send + Sync + Clone>() {}
    send_sync::<blockdev::sim::SimHandle>();
    send_sync::<SimClock>();
}

#[test]
fn cut_from_another_thread_stops_a_waiting_device() {
    let mut cfg = SimConfig::new(2, MIB);
    cfg.write_latency = Latency::Fixed(Duration::from_secs(30));
    let (mut dev, h) = SimDevice::new(cfg);
    submit_write(&mut dev, 1, 0, &pattern(1, 4096));
    let cutter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        h.power_cut()
    });
    let start = std::time::Instant::now();
    let mut out = Vec::new();
    let r = dev.wait(&mut out, Duration::from_secs(20));
    assert!(matches!(r, Err(DeviceError::Stopped { .. })), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(cutter.join().unwrap().dropped_ios, 1);
}

/// The completion fd (a timer on a real clock) is armed only by an owner about to sleep: a
/// device that is only polled never programs it (a timer due within microseconds costs a virtual
/// machine about 10 us per I/O), and an owner that arms it is woken when the I/O falls due, then
/// finds the completion with one poll.
#[cfg(target_os = "linux")]
#[test]
fn completion_fd_is_armed_only_for_an_owner_about_to_sleep() {
    use blockdev::file::fd_readable;
    use std::os::fd::AsRawFd;
    let mut cfg = SimConfig::new(9, MIB);
    cfg.clock = SimClock::real();
    cfg.write_latency = Latency::Fixed(Duration::from_millis(2));
    let (mut dev, _h) = SimDevice::new(cfg);
    let fd = dev
        .completion_fd()
        .expect("a real clock gives a completion fd")
        .as_raw_fd();
    // Polled only: the write falls due, yet nothing armed the timer, so the fd stays quiet and
    // the completion is there for the next poll.
    submit_write(&mut dev, 1, 0, &pattern(1, 4096));
    let mut out = Vec::new();
    assert_eq!(dev.poll(&mut out).unwrap(), 0);
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        !fd_readable(fd, Some(Duration::ZERO)).unwrap(),
        "armed without an owner asking"
    );
    assert_eq!(dev.poll(&mut out).unwrap(), 1);
    assert!(!fd_readable(fd, Some(Duration::ZERO)).unwrap());
    // An owner about to sleep arms it: the fd wakes it once the write is due.
    submit_write(&mut dev, 2, 1, &pattern(2, 4096));
    out.clear();
    assert_eq!(dev.poll(&mut out).unwrap(), 0);
    dev.arm_completion_fd();
    assert!(
        fd_readable(fd, Some(Duration::from_secs(5))).unwrap(),
        "the armed fd never woke"
    );
    assert_eq!(dev.poll(&mut out).unwrap(), 1);
    assert_eq!(out[0].tag, 2);
    // The poll took the firing: quiet again with nothing in flight, and arming changes nothing.
    dev.arm_completion_fd();
    assert!(!fd_readable(fd, Some(Duration::from_millis(10))).unwrap());
}
