//! The crash simulator (storage.md §6–7): producers on the sim device, a power cut at a random
//! moment, reopen and recover, then every check of §7; many cut cycles per seed. The machinery
//! is in `crash_sim/`; this file holds the campaigns and the seeds that once failed.
//!
//! Fully deterministic: the writer is stepped on this thread, the device runs on a virtual clock,
//! and every decision comes from the seed. A failure prints the seed; `NVMQ_SEED=<seed>` replays
//! it (with the campaign's test name as the filter). `NVMQ_CUTS=<n>` sets how many cuts each
//! fresh-seed campaign makes (CI defaults below: 2,000 power cuts alone, 400 with write and flush
//! errors, 2,000 with misdirects and read errors, 2,000 with relaxed flush modes, 800 with formats
//! over an old log).
//!
//! What each cut checks, besides §7 (every acknowledged or served record there byte for byte,
//! offsets contiguous, survivors sent this era, nothing cut away back, partitions not vanished):
//! the head moved only as far as retention could free (`crash_sim/retention.rs`); the recovered
//! log ends no further than the format ever wrote and keeps what its superblock names durable;
//! planted damage is refused or reported naming its position and excuses exactly the records it
//! destroyed (`crash_sim/damage.rs`); a relaxed flush mode loses acknowledged records only within
//! the window it states; no partition of an old format survives a format.

#[path = "crash_sim_harness/mod.rs"]
mod harness;

use harness::{run, Knobs, Summary};

/// Seeds that once failed (power cuts, write and flush errors, bit rot; 30 cuts each).
const REGRESSION_SEEDS: &[u64] = &[
    16054591744087665212,
    9103845059019208009,
    16239631613298787526,
    2328776653661122804,
    4498949687150558716,
    12748223489214847492,
    6015399947746486942,
    // A cut at a submission during the load stopped the writer; the harness took the refused
    // appends for a failure (fixed in the harness, 2026-12-02).
    16178862113374003123,
    // The harness's cut-at-a-submission wrapper did not pass linked write+flush pairs on.
    14278390061500524072,
];

/// Seeds of the write/flush error campaign (20 cuts each, faults without bit rot) that once
/// failed. 10443299422320433550: a flush failing while an earlier flush still ran doomed data that
/// the earlier flush then reported durable (fixed in the sim's doom rule).
/// 7486691532735229746: a superblock flush submitted while a linked flush still waited for its
/// write reached the device first, failed out of order, and the linked one "succeeded" over its
/// lost data, which the writer then acknowledged (fixed: no flush is submitted while a linked
/// flush's write is in flight, so the device sees flushes in the writer's order).
const FAULT_REGRESSION_SEEDS: &[u64] = &[10443299422320433550, 7486691532735229746];

/// Seeds of the misdirect and read error campaign (20 cuts each) that once failed.
const DAMAGE_REGRESSION_SEEDS: &[u64] = &[
    // Retention freed a batch while a read of it met the planted read error; the harness looked
    // for the batch in the index to excuse the error (fixed in the harness: read again).
    15768387228292035856,
    // A write misdirected while a read stepped the writer was not yet noted when that read met
    // its copy (fixed in the harness: take note before judging a refused read).
    11154139765298538551,
    // The same, with no damage noted at all yet: the read's error was taken for a failure.
    2690148178371590988,
    // A skipped unreadable batch held records whose acks had not come yet: the next record
    // served looked like a gap (fixed in the harness: the skipped offsets are known unknowns).
    10004495497694968608,
];

/// Seeds of the relaxed flush mode campaign (20 cuts each) that once failed.
const RELAXED_REGRESSION_SEEDS: &[u64] = &[];

const POWER_CUTS: Knobs = Knobs {
    faults: false,
    bitrot: false,
    retain_time: true,
    damage: false,
    relaxed: false,
    reformat: false,
};

const FAULTS: Knobs = Knobs {
    faults: true,
    ..POWER_CUTS
};

const DAMAGE: Knobs = Knobs {
    damage: true,
    ..POWER_CUTS
};

const RELAXED: Knobs = Knobs {
    relaxed: true,
    ..POWER_CUTS
};

const REFORMAT: Knobs = Knobs {
    reformat: true,
    ..POWER_CUTS
};

/// (first seed, cuts, whether the seed is a replay): NVMQ_SEED replays one seed (NVMQ_CUTS cuts
/// of it, 25 by default), else a fresh one from the time.
fn seeds_from_env(default_count: u64) -> (u64, u64, bool) {
    let cuts: Option<u64> = std::env::var("NVMQ_CUTS").ok().and_then(|v| v.parse().ok());
    if let Ok(s) = std::env::var("NVMQ_SEED") {
        if let Ok(seed) = s.parse() {
            // One seed's run: as many cuts as the campaign gives a seed.
            return (seed, cuts.unwrap_or(25), true);
        }
    }
    let cuts = cuts.unwrap_or(default_count);
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    (base, cuts, false)
}

/// Runs seeds derived from the first until `total_cuts` cuts are done; `salt` tells the
/// campaigns' fresh seeds apart (a replayed seed is taken as it is).
fn campaign(name: &str, salt: u64, default_cuts: u64, per_seed: u64, knobs: Knobs) -> Summary {
    let (first, total_cuts, replay) = seeds_from_env(default_cuts);
    let first = if replay { first } else { first ^ salt };
    let started = std::time::Instant::now();
    let mut sum = Summary::default();
    let mut seed = first;
    let mut seeds = 0;
    while sum.cuts < total_cuts {
        let cuts = per_seed.min(total_cuts - sum.cuts).max(1);
        match run(seed, cuts, knobs) {
            Ok(s) => sum.add(&s),
            Err(e) => panic!(
                "{name}: {e}\nreplay: NVMQ_SEED={seed} NVMQ_CUTS={cuts} cargo test --release -p nvmq-recovery --test suite crash_sim::{name}"
            ),
        }
        seeds += 1;
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
    }
    println!(
        "{name}: {seeds} seeds, {} cuts in {:.1} s (first seed {first}): {} acknowledged records verified, \
         {} head moves within retention, {} linked flushes; {} misdirects, {} opens refused and {} reads refused naming damage, \
         {} latent read errors planted, {} read errors met, {} acknowledged records a misdirect destroyed; {} formats over an old log; \
         {} acknowledged records a relaxed mode lost (at most {} B above D, at most {:.3} ms past the interval)",
        sum.cuts,
        started.elapsed().as_secs_f64(),
        sum.acked,
        sum.freed_checked,
        sum.linked,
        sum.misdirects,
        sum.damage_refusals,
        sum.damage_reported,
        sum.latent_planted,
        sum.read_errors_seen,
        sum.exempt_lost,
        sum.formats,
        sum.relaxed_lost,
        sum.max_lost_bytes,
        sum.loss_past_interval_ns as f64 / 1e6,
    );
    // Relaxed modes never link a flush to a batch write (they acknowledge before flushing).
    if seeds >= 8 && !knobs.relaxed {
        assert!(
            sum.linked > 0,
            "{name}: no batch was written with a linked flush"
        );
    }
    sum
}

fn replay(list: &[u64], cuts: u64, knobs: Knobs, what: &str) {
    for &seed in list {
        if let Err(e) = run(seed, cuts, knobs) {
            panic!("{what} regression seed: {e}");
        }
    }
}

#[test]
fn regression_seeds() {
    let old = Knobs {
        faults: true,
        bitrot: true,
        ..Knobs::default()
    };
    replay(REGRESSION_SEEDS, 30, old, "power cut");
    let faults = Knobs {
        faults: true,
        ..Knobs::default()
    };
    replay(FAULT_REGRESSION_SEEDS, 20, faults, "fault");
    replay(DAMAGE_REGRESSION_SEEDS, 20, DAMAGE, "damage");
    replay(RELAXED_REGRESSION_SEEDS, 20, RELAXED, "relaxed flush");
}

#[test]
fn power_cuts_with_a_fresh_seed() {
    let s = campaign("power_cuts_with_a_fresh_seed", 0, 2000, 25, POWER_CUTS);
    if s.cuts >= 1000 {
        assert!(s.freed_checked > 0, "retention never moved a head");
    }
}

#[test]
fn write_and_flush_errors_with_a_fresh_seed() {
    campaign(
        "write_and_flush_errors_with_a_fresh_seed",
        0x5eed,
        400,
        20,
        FAULTS,
    );
}

#[test]
fn misdirects_and_read_errors_with_a_fresh_seed() {
    let s = campaign(
        "misdirects_and_read_errors_with_a_fresh_seed",
        0xd15d_1ec7,
        2000,
        20,
        DAMAGE,
    );
    if s.cuts >= 1000 {
        assert!(s.misdirects > 0, "no write was misdirected");
        assert!(
            s.damage_refusals + s.damage_reported > 0,
            "no misdirect or read error was ever refused or reported"
        );
        assert!(s.latent_planted > 0, "no latent read error was planted");
        assert!(s.read_errors_seen > 0, "no read met a read error");
    }
}

#[test]
fn relaxed_flush_modes_with_a_fresh_seed() {
    let s = campaign(
        "relaxed_flush_modes_with_a_fresh_seed",
        0x1a2ed,
        2000,
        20,
        RELAXED,
    );
    if s.cuts >= 1000 {
        assert!(
            s.relaxed_lost > 0,
            "no cut took an acknowledged record: the loss window was never checked"
        );
    }
}

/// storage.md §7.7: a device reformatted over an old log. Each seed fills a small ring past two
/// laps, formats over it (sometimes with another geometry), and goes on cutting: nothing of the
/// old log may be served, and none of its batches may extend the new chain.
#[test]
fn formats_over_an_old_log_never_bring_it_back() {
    let s = campaign(
        "formats_over_an_old_log_never_bring_it_back",
        0xf04a7,
        800,
        40,
        REFORMAT,
    );
    if s.cuts >= 800 {
        assert!(s.formats > 0, "no seed formatted over an old log");
    }
}

#[test]
fn bit_rot_in_acknowledged_data_is_refused() {
    let (first, _, _) = seeds_from_env(0);
    let mut refused = 0;
    let mut seed = first ^ 0xb17;
    for _ in 0..40 {
        match run(
            seed,
            3,
            Knobs {
                bitrot: true,
                ..Knobs::default()
            },
        ) {
            Ok(s) => refused += s.refused_damage,
            Err(e) => panic!("{e}\nreplay: NVMQ_SEED={seed}"),
        }
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    }
    assert!(
        refused >= 20,
        "only {refused} of 40 seeds planted bit rot (first seed {})",
        first ^ 0xb17
    );
}
