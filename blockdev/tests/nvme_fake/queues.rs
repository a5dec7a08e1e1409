//! I/O through the queues: wrap-around, doorbell batching, PRP lists, MDTS splits, status
//! errors, out-of-order completions.

use super::*;

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

/// The driver benchmark (`benches/nvme_driver.rs`) subtracts the controller's own time: a timed
/// controller counts it for its register writes, an untimed one reads no clock.
#[test]
fn a_timed_controller_counts_its_own_time() {
    let timed = FakeConfig {
        timed: true,
        ..FakeConfig::default()
    };
    for (cfg, counts) in [(timed, true), (FakeConfig::default(), false)] {
        let (mut dev, h) = open_with(cfg, small_opts());
        let before = h.stats().controller_ns;
        let b = dev.alloc_buffer(4096).unwrap();
        dev.submit_write(1, 0, b).unwrap();
        assert_eq!(drain(&mut dev, 1).len(), 1);
        let spent = h.stats().controller_ns - before;
        assert_eq!(spent > 0, counts, "{spent} ns counted");
    }
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
