//! Recovery over arbitrary device bytes never panics and never serves a record that fails its
//! checksum (storage.md §1 "Reads keep the promise too", §4, §5).
//!
//! A real log, built by the stepped writer over several power-cut eras, then damaged by
//!    arbitrary mutations (byte overwrites, bit flips, zeroed ranges, misdirected and stale
//!    blocks, superblock fields re-encoded with a valid CRC) either is refused with an error or
//!    opens, and then every record served is the one the log legitimately holds at that
//!    (partition, offset): never one an earlier recovery cut away (see [`fuzz_images::Image::live`]).
//!
//! The other properties: random devices (`fuzz_random_device.rs`), the decoders directly
//! (`fuzz_decoders.rs`), forged checksum-valid batches (`fuzz_forged.rs`).
//!
//! `NVMQ_FUZZ_CASES=<n>` replaces the case count of every property here (for longer runs); the
//! defaults keep the file well under a minute in the `test` profile. `found_by_fuzzing` replays
//! the minimal inputs of the bugs these properties found.

use std::sync::atomic::{AtomicU64, Ordering};

use blockdev::sim::{SimClock, SimConfig, SimDevice};
use nvmq_log::Request;
use proptest::collection::vec;
use proptest::prelude::*;

use crate::fuzz_common;
use crate::fuzz_images;
use crate::fuzz_mutations;
use fuzz_common::{cases, config};
use fuzz_images::{
    drive, images, log_config, open_stepped, partitions, read_once, Snapshot, CAPACITY,
};
use fuzz_mutations::{apply, mutation, FieldValue, Mutation};

// Counters for the summary printed at the end of the mutation test's run.
static CASES_RUN: AtomicU64 = AtomicU64::new(0);
static OPENED: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);
static SERVED: AtomicU64 = AtomicU64::new(0);
static READ_ERRORS: AtomicU64 = AtomicU64::new(0);
static GAPS: AtomicU64 = AtomicU64::new(0);
const MUTATION_CASES: u32 = 5000;

/// Applies `muts` to a copy of image `which`, recovers, and reads every partition fully.
fn recover_mutated(which: usize, muts: &[Mutation]) -> Result<(), TestCaseError> {
    let img = &images()[which % images().len()];
    let clock = SimClock::virtual_at_zero();
    let mut cfg = SimConfig::new(which as u64, CAPACITY);
    cfg.clock = clock.clone();
    let (dev, handle) = SimDevice::new(cfg);
    for (at, bytes) in &img.regions {
        handle.poke_durable(*at, bytes);
    }
    for m in muts {
        apply(&handle, img, m);
    }
    let log_cfg = log_config(None);
    let opened = open_stepped(dev, log_cfg, &clock);
    let mut w = match opened {
        Err(e) => {
            prop_assert!(
                !muts.is_empty(),
                "{}: an undamaged log was refused: {e}",
                img.label
            );
            prop_assert!(!e.to_string().is_empty());
            REFUSED.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        Ok((w, _report)) => w,
    };
    OPENED.fetch_add(1, Ordering::Relaxed);
    let mut served_total = 0u64;
    let mut read_errors = 0u64;
    let parts_after = partitions(&w);
    for &(id, start, end) in &parts_after {
        let mut at = start;
        let mut calls = 0;
        while at < end && calls < 256 {
            calls += 1;
            match read_once(&mut w, &clock, id, at) {
                Ok(recs) => {
                    let Some(last) = recs.last() else {
                        GAPS.fetch_add(1, Ordering::Relaxed);
                        break;
                    };
                    let next = last.offset + 1;
                    if recs[0].offset != at {
                        GAPS.fetch_add(1, Ordering::Relaxed);
                    }
                    for r in &recs {
                        let key = (id, r.offset);
                        let ok = img.live.get(&key).is_some_and(|p| *p == r.payload);
                        let what = if img
                            .cut_away
                            .get(&key)
                            .is_some_and(|ps| ps.iter().any(|p| *p == r.payload))
                        {
                            "a record an earlier recovery cut away there (resurrected)"
                        } else if img.live.contains_key(&key) {
                            "not the record the log holds there"
                        } else {
                            "a record never appended there"
                        };
                        prop_assert!(
                            ok,
                            "{}: served partition {id} offset {} ({} B from log position {}): {what}",
                            img.label,
                            r.offset,
                            r.payload.len(),
                            r.position
                        );
                        prop_assert!(r.offset >= at, "served offset {} below {at}", r.offset);
                    }
                    served_total += recs.len() as u64;
                    at = next.max(at + 1);
                }
                Err(e) => {
                    prop_assert!(!e.to_string().is_empty());
                    READ_ERRORS.fetch_add(1, Ordering::Relaxed);
                    read_errors += 1;
                    // Skip the batch that failed and go on reading past it.
                    let shared = w.shared();
                    let s = shared.lock();
                    let skip = s
                        .partitions
                        .get(&id)
                        .and_then(|v| v.locate(at))
                        .map_or(at + 1, |e| e.end_offset);
                    at = skip.max(at + 1);
                }
            }
        }
    }
    if muts.is_empty() {
        // An undamaged log: every partition the writer served before the cut is there, up to at
        // least the same end (retention may have moved its start), and all of it reads back.
        for (id, _, end_before) in &img.live_parts {
            let after = parts_after.iter().find(|p| p.0 == *id);
            prop_assert!(
                after.is_some_and(|p| p.2 >= *end_before),
                "{}: partition {id} ended at {end_before} before the cut, after recovery: {:?}",
                img.label,
                after
            );
        }
        let readable: u64 = parts_after.iter().map(|p| p.2 - p.1).sum();
        prop_assert!(
            served_total == readable && read_errors == 0,
            "{}: undamaged log served {served_total} of {readable} records, {read_errors} read errors",
            img.label
        );
    }
    SERVED.fetch_add(served_total, Ordering::Relaxed);
    // The writer keeps running over what it recovered: a few appends must not panic either.
    let ids: Vec<u32> = partitions(&w).iter().map(|p| p.0).collect();
    if let Some(&id) = ids.first() {
        for i in 0..3u8 {
            w.submit(Request::Append {
                partition: id,
                payload: vec![i; 100],
                span: 1,
                ack: Box::new(|_| {}),
            });
        }
        drive(&mut w, &clock, 5_000, || false);
    }
    Ok(())
}

fn note_case() {
    let n = CASES_RUN.fetch_add(1, Ordering::Relaxed) + 1;
    if n == u64::from(cases(MUTATION_CASES)) {
        println!(
            "mutated logs: {n} cases, {} opened, {} refused, {} records served (all verified), \
             {} read errors, {} reads that skipped offsets",
            OPENED.load(Ordering::Relaxed),
            REFUSED.load(Ordering::Relaxed),
            SERVED.load(Ordering::Relaxed),
            READ_ERRORS.load(Ordering::Relaxed),
            GAPS.load(Ordering::Relaxed),
        );
    }
}

proptest! {
    #![proptest_config(config(MUTATION_CASES))]

    /// Strategy 2: a real log with arbitrary damage.
    #[test]
    fn mutated_logs_never_panic_nor_serve_wrong_bytes(
        which in 0usize..7,
        muts in vec(mutation(), 0..7),
    ) {
        recover_mutated(which, &muts)?;
        note_case();
    }
}

// ---------------------------------------------------------------------------------------------
// The minimal inputs of the panics these properties found, replayed on every run.

#[test]
fn found_by_fuzzing() {
    let sb_field = |slot, field, value, relink| Mutation::SuperblockField {
        slot,
        field,
        value,
        relink,
    };
    // A valid-CRC superblock whose log size ends past u64::MAX (`log_start + log_size`
    // overflowed in recovery::recover).
    recover_mutated(0, &[sb_field(0, 6, FieldValue::High(0), 0)]).unwrap();
    // A sequence or an epoch with no successor (`sequence + 1`, `epoch + 1` overflowed when
    // recovery fenced the cut).
    recover_mutated(0, &[sb_field(0, 2, FieldValue::Top(0), 2)]).unwrap();
    recover_mutated(0, &[sb_field(0, 13, FieldValue::Top(0), 2)]).unwrap();
}

/// The resurrection check of the mutation test has something to find: some image holds records
/// that a recovery cut away, still whole on the device at its end or in an earlier era's blocks
/// (which `Mutation::Stale` puts back).
#[test]
fn cut_away_records_are_on_the_device() {
    let holds = |bytes: &[u8], p: &[u8]| bytes.windows(p.len()).any(|w| w == p);
    let mut found = 0;
    for img in images() {
        for p in img.cut_away.values().flatten().filter(|p| p.len() > 16) {
            let log = |s: &Snapshot| s.iter().any(|(_, b)| holds(b, p));
            if log(&img.regions) || img.history.iter().any(log) {
                found += 1;
            }
        }
    }
    assert!(found > 0, "no image holds a cut-away record on its device");
}
