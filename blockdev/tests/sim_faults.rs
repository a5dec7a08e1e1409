//! Injected faults (storage.md §6): write and flush errors, out-of-order flush failure, latent read
//! errors, bit flips, misdirected writes, raw pokes.

mod sim_support;

use std::time::Duration;

use blockdev::sim::{Latency, SimConfig, SimDevice};
use blockdev::{BlockDevice, DeviceError, Op};
use sim_support::*;

const SEEDS: u64 = 200;

#[test]
fn fail_next_write_reports_io_and_writes_nothing() {
    let (mut dev, h) = SimDevice::new(virtual_cfg(1));
    let a = pattern(1, 4096);
    write(&mut dev, 4, &a);
    h.fail_next_write();
    submit_write(&mut dev, 7, 4, &pattern(2, 4096));
    let c = next(&mut dev);
    assert_eq!((c.tag, c.op, c.lba), (7, Op::Write, 4));
    assert!(matches!(
        c.result,
        Err(DeviceError::Io {
            op: Op::Write,
            lba: 4,
            ..
        })
    ));
    assert!(c.buffer.is_some());
    assert_eq!(h.peek(4 * 4096, 4096), a);
    // Once only.
    let b = pattern(3, 4096);
    write(&mut dev, 4, &b);
    assert_eq!(h.peek(4 * 4096, 4096), b);
    assert_eq!(h.stats().write_errors, 1);
    // A failing write in flight at a cut never lands.
    flush(&mut dev).unwrap();
    for _ in 0..20 {
        h.fail_next_write();
        submit_write(&mut dev, 8, 4, &pattern(4, 4096));
        let r = h.power_cut();
        assert_eq!((r.in_flight_writes, r.dropped_ios), (0, 1));
        dev = h.power_on();
        assert_eq!(h.peek(4 * 4096, 4096), b);
    }
}

#[test]
fn failed_flush_dooms_its_writes_even_after_a_later_successful_flush() {
    let mut kept_whole = 0;
    for seed in 0..SEEDS {
        let mut cfg = virtual_cfg(seed);
        cfg.garbage_sectors = seed.is_multiple_of(3);
        let (mut dev, h) = SimDevice::new(cfg);
        let a = pattern(seed * 4, 4 * 4096);
        let c = pattern(seed * 4 + 1, 2 * 4096);
        write(&mut dev, 0, &a);
        h.fail_next_flush();
        let err = flush(&mut dev).unwrap_err();
        assert!(
            matches!(err, DeviceError::Io { op: Op::Flush, .. }),
            "seed {seed}: {err}"
        );
        assert_eq!(h.peek(0, a.len()), a, "seed {seed}: readable until the cut");
        write(&mut dev, 100, &c);
        flush(&mut dev).expect("the later flush reports success");
        let r = h.power_cut();
        assert_eq!((r.doomed, r.cached), (1, 0), "seed {seed}: {r:?}");
        let _dev = h.power_on();
        let got = h.peek(0, a.len());
        if got == a {
            kept_whole += 1;
        }
        assert_ne!(got, a, "seed {seed}: doomed data came back whole");
        assert_eq!(
            h.peek(100 * 4096, c.len()),
            c,
            "seed {seed}: covered data lost"
        );
    }
    assert_eq!(kept_whole, 0);
}

/// W1 completes; F1 (fails, delivered late) covers it; W2 completes; F2 (succeeds) covers both.
#[test]
fn out_of_order_flush_failure() {
    for latency in [Latency::Zero, Latency::Fixed(Duration::from_micros(10))] {
        for seed in 0..SEEDS {
            let mut cfg = virtual_cfg(seed);
            cfg.flush_latency = latency;
            let (mut dev, h) = SimDevice::new(cfg);
            let w1 = pattern(seed * 7, 2 * 4096);
            let w2 = pattern(seed * 7 + 1, 2 * 4096);
            h.fail_flush_out_of_order();
            write(&mut dev, 0, &w1);
            dev.submit_flush(1).unwrap();
            write(&mut dev, 10, &w2);
            dev.submit_flush(2).unwrap();
            let done = drain(&mut dev);
            let flushes: Vec<(u64, bool)> = done
                .iter()
                .filter(|c| c.op == Op::Flush)
                .map(|c| (c.tag, c.result.is_ok()))
                .collect();
            assert_eq!(
                flushes,
                vec![(2, true), (1, false)],
                "seed {seed}: the second succeeds before the first fails"
            );
            let _ = h.power_cut();
            let _dev = h.power_on();
            assert_ne!(
                h.peek(0, w1.len()),
                w1,
                "seed {seed}: F2's success saved F1's data"
            );
            assert_eq!(h.peek(10 * 4096, w2.len()), w2, "seed {seed}: W2 lost");
        }
    }
}

#[test]
fn out_of_order_failure_without_a_second_flush_does_not_hang() {
    let (mut dev, h) = SimDevice::new(virtual_cfg(3));
    h.fail_flush_out_of_order();
    write(&mut dev, 0, &pattern(1, 4096));
    assert!(flush(&mut dev).is_err());
    // The pair is used up: the next flush is normal.
    write(&mut dev, 1, &pattern(2, 4096));
    flush(&mut dev).unwrap();
}

#[test]
fn flush_error_rate_and_write_error_rate_are_seeded() {
    let run = |seed: u64| {
        let (mut dev, h) = SimDevice::new(virtual_cfg(seed));
        h.set_write_error_rate(0.5);
        h.set_flush_error_rate(0.5);
        let mut results = Vec::new();
        for i in 0..100 {
            submit_write(&mut dev, i, i % 64, &pattern(i, 4096));
            results.push(next(&mut dev).result.is_ok());
            if i % 4 == 0 {
                results.push(flush(&mut dev).is_ok());
            }
        }
        (results, h.stats())
    };
    for seed in 0..5 {
        let (r, s) = run(seed);
        assert_eq!(run(seed).0, r, "seed {seed}");
        let failed = r.iter().filter(|ok| !**ok).count() as u64;
        assert_eq!(failed, s.write_errors + s.flush_errors, "seed {seed}");
        assert!((30..100).contains(&s.write_errors), "seed {seed}: {s:?}");
        assert!((5..22).contains(&s.flush_errors), "seed {seed}: {s:?}");
    }
    let (mut dev, h) = SimDevice::new(virtual_cfg(9));
    h.set_flush_error_rate(1.0);
    assert!(flush(&mut dev).is_err());
    h.set_flush_error_rate(0.0);
    flush(&mut dev).unwrap();
}

#[test]
fn latent_read_error_until_rewritten() {
    let (mut dev, h) = SimDevice::new(virtual_cfg(4));
    let a = pattern(1, 8 * 4096);
    write(&mut dev, 0, &a);
    h.set_read_error(3, 2); // blocks 3 and 4
    for (lba, blocks, bad) in [
        (0, 3, false),
        (2, 2, true),
        (4, 1, true),
        (5, 3, false),
        (0, 8, true),
    ] {
        let r = read(&mut dev, lba, blocks * 4096);
        match (bad, r) {
            (
                true,
                Err(DeviceError::Io {
                    op: Op::Read,
                    lba: l,
                    ..
                }),
            ) => assert_eq!(l, lba),
            (false, Ok(got)) => {
                assert_eq!(got, &a[lba as usize * 4096..(lba as usize + blocks) * 4096])
            }
            (bad, r) => panic!("lba {lba}+{blocks}: expected bad={bad}, got {r:?}"),
        }
    }
    // The handle still sees the bytes.
    assert_eq!(h.peek(3 * 4096, 4096), a[3 * 4096..4 * 4096]);
    // Rewriting block 3 clears it; block 4 stays bad.
    let n = pattern(2, 4096);
    write(&mut dev, 3, &n);
    assert_eq!(read(&mut dev, 3, 4096).unwrap(), n);
    assert!(read(&mut dev, 4, 4096).is_err());
    write(&mut dev, 4, &a[4 * 4096..5 * 4096]);
    assert!(read(&mut dev, 0, 8 * 4096).is_ok());
    // A failed write does not clear it.
    h.set_read_error(6, 1);
    h.fail_next_write();
    submit_write(&mut dev, 1, 6, &n);
    assert!(next(&mut dev).result.is_err());
    assert!(read(&mut dev, 6, 4096).is_err());
    h.clear_read_errors();
    assert!(read(&mut dev, 6, 4096).is_ok());
    assert_eq!(h.stats().read_errors, 5);
}

#[test]
fn bit_flip_in_durable_and_cached_data() {
    for seed in 0..20 {
        let (mut dev, h) = SimDevice::new(virtual_cfg(seed));
        let a = pattern(seed, 4096);
        write(&mut dev, 0, &a);
        flush(&mut dev).unwrap();
        let b = pattern(seed + 1, 4096);
        write(&mut dev, 1, &b); // cached only
        h.flip_bit(100, 3);
        h.flip_bit(4096 + 7, 10); // bit 10 is bit 2
        let mut a2 = a.clone();
        a2[100] ^= 1 << 3;
        let mut b2 = b.clone();
        b2[7] ^= 1 << 2;
        assert_eq!(read(&mut dev, 0, 4096).unwrap(), a2, "seed {seed}");
        assert_eq!(read(&mut dev, 1, 4096).unwrap(), b2, "seed {seed}");
        h.power_cut();
        let mut dev = h.power_on();
        assert_eq!(
            read(&mut dev, 0, 4096).unwrap(),
            a2,
            "seed {seed}: flip in durable data"
        );
        let got = read(&mut dev, 1, 4096).unwrap();
        // Block 1 was never flushed: whatever landed, the flipped bit never reverts to b's value
        // while the rest of its sector is b's.
        assert_ne!(got[..512], b[..512], "seed {seed}");
    }
}

#[test]
fn misdirected_write_lands_elsewhere() {
    let (mut dev, h) = SimDevice::new(virtual_cfg(6));
    let old = pattern(1, 2 * 4096);
    write(&mut dev, 10, &old);
    flush(&mut dev).unwrap();
    let a = pattern(2, 2 * 4096);
    h.misdirect_next_write(10); // into retained, durable data
    submit_write(&mut dev, 5, 2, &a);
    let c = next(&mut dev);
    assert_eq!((c.tag, c.lba), (5, 2));
    assert!(c.result.is_ok(), "a misdirected write reports success");
    assert!(read(&mut dev, 2, a.len()).unwrap().iter().all(|&b| b == 0));
    assert_eq!(read(&mut dev, 10, a.len()).unwrap(), a);
    flush(&mut dev).unwrap();
    h.power_cut();
    let mut dev = h.power_on();
    assert_eq!(read(&mut dev, 10, a.len()).unwrap(), a);
    // Past the end: the part that fits lands, the rest is dropped.
    let blocks = dev.info().capacity / 4096;
    h.misdirect_next_write(blocks - 1);
    write(&mut dev, 0, &a);
    assert_eq!(h.peek((blocks - 1) * 4096, 4096), a[..4096]);
}

#[test]
fn poke_durable_survives_cuts_and_beats_cached_writes() {
    for seed in 0..SEEDS {
        let mut cfg = virtual_cfg(seed);
        cfg.garbage_sectors = true;
        cfg.logical_block_size = 512;
        cfg.physical_block_size = 4096;
        cfg.rmw_damage = seed.is_multiple_of(2);
        let (mut dev, h) = SimDevice::new(cfg);
        let a = pattern(seed, 4096);
        write(&mut dev, 0, &a); // cached, not flushed
        h.poke_durable(1000, b"damage"); // inside sector 1 of the cached write
        let mut expect = a[512..1024].to_vec();
        expect[1000 - 512..1006 - 512].copy_from_slice(b"damage");
        assert_eq!(h.peek(512, 512), expect, "seed {seed}");
        h.power_cut();
        let _dev = h.power_on();
        assert_eq!(
            h.peek(512, 512),
            expect,
            "seed {seed}: the poked sector changed at the cut"
        );
    }
    // Pokes of durable data show at once through reads.
    let (mut dev, h) = SimDevice::new(SimConfig::new(1, MIB));
    h.poke_durable(4096, &[0xAB; 10]);
    assert_eq!(read(&mut dev, 1, 4096).unwrap()[..10], [0xAB; 10]);
}
