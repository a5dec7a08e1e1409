//! The crash model (storage.md §6): what a power cut keeps, loses and tears. Every randomized test
//! loops over seeds and names the seed in its assertion messages.

mod sim_support;

use std::time::Duration;

use blockdev::sim::{CutReport, Latency, Rng, SimDevice};
use blockdev::{BlockDevice, Completion, Op};
use sim_support::*;

const SEEDS: u64 = 200;

#[test]
fn flush_covers_only_writes_completed_before_it() {
    let (mut b_damaged, mut b_kept, mut c_damaged) = (0, 0, 0);
    for seed in 0..SEEDS {
        let mut cfg = virtual_cfg(seed);
        cfg.write_latency = Latency::Fixed(Duration::from_micros(1));
        cfg.flush_latency = Latency::Fixed(Duration::from_micros(20));
        cfg.garbage_sectors = seed.is_multiple_of(2);
        let (mut dev, h) = SimDevice::new(cfg);
        let a = pattern(seed * 10 + 1, 8192);
        let b = pattern(seed * 10 + 2, 8192);
        let c = pattern(seed * 10 + 3, 8192);
        write(&mut dev, 0, &a); // completed before the flush: covered
        submit_write(&mut dev, 3, 20, &c); // submitted before the flush, completes after: not covered
        dev.submit_flush(100).unwrap();
        submit_write(&mut dev, 2, 10, &b); // submitted after the flush, completes before it: not covered
        let done: Vec<Completion> = drain(&mut dev);
        let order: Vec<u64> = done.iter().map(|c| c.tag).collect();
        assert_eq!(
            order[2], 100,
            "seed {seed}: the flush completes last ({order:?})"
        );
        assert!(done.iter().all(|c| c.result.is_ok()), "seed {seed}");
        assert_eq!(
            h.peek(10 * 4096, 8192),
            b,
            "seed {seed}: B readable before the cut"
        );

        h.power_cut();
        let _dev = h.power_on();
        assert_eq!(
            h.peek(0, 8192),
            a,
            "seed {seed}: a write covered by a completed flush was lost"
        );
        if h.peek(10 * 4096, 8192) == b {
            b_kept += 1;
        } else {
            b_damaged += 1;
        }
        if h.peek(20 * 4096, 8192) != c {
            c_damaged += 1;
        }
    }
    assert!(
        b_damaged > 0,
        "a write completed after submit_flush was never lost or torn"
    );
    assert!(
        c_damaged > 0,
        "a write completing after submit_flush was never lost or torn"
    );
    assert!(b_kept > 0, "an uncovered write may also survive whole");
}

#[test]
fn power_loss_protected_mode_keeps_completed_writes_and_may_tear_in_flight_ones() {
    let (mut landed, mut lost) = (0, 0);
    for seed in 0..SEEDS {
        let mut cfg = virtual_cfg(seed);
        cfg.volatile_cache = false;
        cfg.garbage_sectors = true;
        cfg.write_latency = Latency::Fixed(Duration::from_micros(5));
        let (mut dev, h) = SimDevice::new(cfg);
        assert!(!dev.info().volatile_write_cache);
        let data: Vec<Vec<u8>> = (0..6).map(|i| pattern(seed * 100 + i, 4096 * 2)).collect();
        for (i, d) in data.iter().enumerate() {
            write(&mut dev, i as u64 * 2, d);
        }
        assert_eq!(h.stats().cached_writes, 0, "seed {seed}");
        let inflight = pattern(seed * 100 + 99, 4 * 4096);
        submit_write(&mut dev, 9, 50, &inflight);
        let report = h.power_cut();
        assert_eq!(report.cached, 0, "seed {seed}");
        assert_eq!(report.in_flight_writes, 1, "seed {seed}");
        let _dev = h.power_on();
        for (i, d) in data.iter().enumerate() {
            assert_eq!(
                &h.peek(i as u64 * 2 * 4096, d.len()),
                d,
                "seed {seed}: write {i}"
            );
        }
        let old = vec![0u8; inflight.len()];
        let map = sector_map(&h.peek(50 * 4096, inflight.len()), &old, &inflight);
        if map.contains('n') {
            landed += 1;
        }
        if map.chars().all(|c| c == 'o') {
            lost += 1;
        }
    }
    assert!(landed > 0 && lost > 0, "landed {landed} lost {lost}");
}

/// Writes `old` durably over 4 blocks, then `new` over the same blocks without a flush, cuts, and
/// returns the per-sector map of what survived plus the report.
fn tear_case(seed: u64, garbage: bool) -> (String, CutReport) {
    let mut cfg = virtual_cfg(seed);
    cfg.garbage_sectors = garbage;
    let (mut dev, h) = SimDevice::new(cfg);
    let old = pattern(seed * 2, 4 * 4096);
    let new = pattern(seed * 2 + 1, 4 * 4096);
    write(&mut dev, 8, &old);
    flush(&mut dev).unwrap();
    write(&mut dev, 8, &new);
    let report = h.power_cut();
    let _dev = h.power_on();
    (sector_map(&h.peek(8 * 4096, new.len()), &old, &new), report)
}

#[test]
fn tearing_is_at_512_byte_sectors() {
    let mut mixed = None;
    for seed in 0..SEEDS {
        let (map, r) = tear_case(seed, false);
        assert!(
            !map.contains('g'),
            "seed {seed}: garbage without garbage_sectors: {map}"
        );
        assert_eq!(r.cached, 1, "seed {seed}");
        let all_new = map.chars().all(|c| c == 'n');
        let all_old = map.chars().all(|c| c == 'o');
        assert_eq!(r.survived, u64::from(all_new), "seed {seed}: {map} {r:?}");
        assert_eq!(r.lost, u64::from(all_old), "seed {seed}: {map} {r:?}");
        assert_eq!(
            r.torn,
            u64::from(!all_new && !all_old),
            "seed {seed}: {map} {r:?}"
        );
        // A torn 4 KiB block mixes old and new 512-byte sectors (finer than the logical block).
        if mixed.is_none() && map[..8].contains('n') && map[..8].contains('o') {
            mixed = Some(seed);
        }
    }
    assert!(
        mixed.is_some(),
        "no seed tore a logical block into old and new sectors"
    );
}

#[test]
fn garbage_sectors_appear_only_when_enabled() {
    let mut found = false;
    for seed in 0..SEEDS {
        let (map, r) = tear_case(seed, true);
        let g = map.chars().filter(|&c| c == 'g').count() as u64;
        assert_eq!(g, r.garbage_sectors, "seed {seed}: {map} {r:?}");
        found |= g > 0;
    }
    assert!(found, "garbage_sectors never produced a garbage sector");
}

#[test]
fn rmw_damage_hits_only_neighbours_in_the_same_physical_block() {
    let mut damaged = false;
    for rmw in [true, false] {
        for seed in 0..SEEDS {
            let mut cfg = virtual_cfg(seed);
            cfg.logical_block_size = 512;
            cfg.physical_block_size = 4096;
            cfg.rmw_damage = rmw;
            let (mut dev, h) = SimDevice::new(cfg);
            let old = pattern(seed * 3, 8192); // two physical blocks, durable
            write(&mut dev, 0, &old);
            flush(&mut dev).unwrap();
            let new = pattern(seed * 3 + 1, 512);
            write(&mut dev, 3, &new); // one sector inside physical block 0, not flushed
            let r = h.power_cut();
            let _dev = h.power_on();
            let got = h.peek(0, 8192);
            let mut expect_new = old.clone();
            expect_new[3 * 512..4 * 512].copy_from_slice(&new);
            let map = sector_map(&got, &old, &expect_new);
            // Sector 3 is old or new ('o'/'n' both fine); others must be old unless damaged.
            let bad: Vec<usize> = (0..16)
                .filter(|&i| i != 3 && got[i * 512..(i + 1) * 512] != old[i * 512..(i + 1) * 512])
                .collect();
            assert!(
                bad.iter().all(|&i| i < 8),
                "seed {seed}: damage outside the block: {map}"
            );
            assert_eq!(
                bad.len() as u64,
                r.rmw_damaged_sectors,
                "seed {seed}: {map} {r:?}"
            );
            if !rmw {
                assert!(
                    bad.is_empty(),
                    "seed {seed}: damage with rmw_damage off: {map}"
                );
            }
            damaged |= !bad.is_empty();
        }
    }
    assert!(damaged, "rmw_damage never damaged a neighbouring sector");
}

#[test]
fn doomed_data_never_returns_over_a_newer_durable_write() {
    for seed in 0..SEEDS {
        let mut cfg = virtual_cfg(seed);
        cfg.garbage_sectors = true;
        let (mut dev, h) = SimDevice::new(cfg);
        let a = pattern(seed * 5, 3 * 4096);
        let b = pattern(seed * 5 + 1, 4096);
        write(&mut dev, 0, &a);
        h.fail_next_flush();
        assert!(flush(&mut dev).is_err(), "seed {seed}");
        assert_eq!(
            h.peek(0, a.len()),
            a,
            "seed {seed}: doomed data stays readable"
        );
        write(&mut dev, 1, &b); // overwrites the middle of the doomed write
        flush(&mut dev).unwrap();
        let r = h.power_cut();
        assert_eq!(r.doomed, 1, "seed {seed}");
        assert_eq!(
            r.survived, 0,
            "seed {seed}: a doomed write was kept whole: {r:?}"
        );
        let _dev = h.power_on();
        assert_eq!(
            h.peek(4096, 4096),
            b,
            "seed {seed}: durable B overwritten by doomed A"
        );
    }
}

#[test]
fn durable_data_survives_many_cycles() {
    for seed in 0..20 {
        let mut cfg = virtual_cfg(seed);
        cfg.logical_block_size = 512;
        cfg.physical_block_size = 4096;
        cfg.rmw_damage = true;
        cfg.garbage_sectors = true;
        let (mut dev, h) = SimDevice::new(cfg);
        let a = pattern(seed, 4096);
        write(&mut dev, 0, &a);
        flush(&mut dev).unwrap();
        for cycle in 0..5u64 {
            // Unflushed noise in other physical blocks.
            write(&mut dev, 8 + cycle * 8, &pattern(seed + cycle, 1024));
            submit_write(&mut dev, 1, 100, &pattern(cycle, 512));
            h.power_cut();
            dev = h.power_on();
            assert_eq!(
                read(&mut dev, 0, 4096).unwrap(),
                a,
                "seed {seed} cycle {cycle}"
            );
        }
    }
}

/// Everything a run shows: the final media, the cut reports, and (tag, op, ok) per completion.
type Observed = (Vec<u8>, Vec<CutReport>, Vec<(u64, Op, bool)>);

/// A random workload over every feature, returning everything observable.
fn scenario(seed: u64) -> Observed {
    let mut cfg = virtual_cfg(seed);
    cfg.logical_block_size = 512;
    cfg.physical_block_size = 4096;
    cfg.capacity = 256 * 1024;
    cfg.garbage_sectors = true;
    cfg.rmw_damage = true;
    cfg.serialize_flushes = seed.is_multiple_of(2);
    cfg.write_latency = Latency::Uniform {
        min: Duration::from_micros(1),
        max: Duration::from_micros(30),
    };
    cfg.flush_latency = Latency::Uniform {
        min: Duration::from_micros(10),
        max: Duration::from_micros(100),
    };
    let (mut dev, h) = SimDevice::new(cfg);
    h.set_write_error_rate(0.05);
    h.set_flush_error_rate(0.05);
    let mut rng = Rng::new(seed ^ 0xABCD);
    let mut log = Vec::new();
    let mut reports = Vec::new();
    let mut out = Vec::new();
    for step in 0..300u64 {
        match rng.below(10) {
            0..=4 if dev.in_flight() < dev.queue_depth() => {
                let blocks = rng.range(1, 17);
                let lba = rng.below(512 - blocks);
                submit_write(
                    &mut dev,
                    step,
                    lba,
                    &pattern(step + seed, blocks as usize * 512),
                );
            }
            5 => {
                let _ = dev.submit_flush(step);
            }
            6 => {
                let b = dev.alloc_buffer(2048).unwrap();
                let _ = dev.submit_read(step, rng.below(500), b);
            }
            7 => match rng.below(4) {
                0 => h.fail_next_flush(),
                1 => h.fail_flush_out_of_order(),
                2 => h.flip_bit(rng.below(256 * 1024), rng.below(8) as u8),
                _ => h.misdirect_next_write(rng.below(400)),
            },
            8 => {
                let _ = dev.wait(&mut out, Duration::from_micros(rng.below(50)));
            }
            _ => {
                let _ = dev.poll(&mut out);
            }
        }
        if step % 100 == 99 {
            reports.push(h.power_cut());
            dev = h.power_on();
        }
        for c in out.drain(..) {
            log.push((c.tag, c.op, c.result.is_ok()));
        }
    }
    reports.push(h.power_cut());
    let _dev = h.power_on();
    (h.peek(0, 256 * 1024), reports, log)
}

#[test]
fn same_seed_same_run() {
    let mut distinct = false;
    for seed in 0..10 {
        let first = scenario(seed);
        let again = scenario(seed);
        assert!(first.0 == again.0, "seed {seed}: media differ");
        assert_eq!(first.1, again.1, "seed {seed}: cut reports differ");
        assert_eq!(first.2, again.2, "seed {seed}: completions differ");
        assert!(!first.2.is_empty(), "seed {seed}");
        distinct |= scenario(seed + 1000).0 != first.0;
    }
    assert!(distinct, "different seeds gave the same media");
}
