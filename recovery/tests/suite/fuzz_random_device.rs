//! Recovery over a device of random bytes, with or without planted superblock copies that carry a
//! valid CRC: it is refused with an error, never a panic (storage.md §5).
//!
//! `NVMQ_FUZZ_CASES=<n>` replaces the case count; failures persist beside this file.

use blockdev::sim::{Rng, SimConfig, SimDevice};
use nvmq_log::format::{superblock_offset, Superblock, FORMAT_VERSION, LOG_START};
use proptest::prelude::*;

use crate::fuzz_common;
use fuzz_common::{config, planted_superblock};

// ---------------------------------------------------------------------------------------------
// Strategy 1: a device of random bytes.

/// Log area of the random device: 256 KiB after the 2 MiB of superblocks.
const RANDOM_LOG: u64 = 256 << 10;

/// A device of random bytes from `seed`, with `plant` superblock copies (0: A, 1: B, 2: both,
/// chained) over it: recovery must refuse it.
fn recover_random(
    seed: u64,
    logical: u32,
    plant: Option<(Superblock, u8)>,
) -> Result<(), TestCaseError> {
    let capacity = LOG_START + RANDOM_LOG;
    let mut cfg = SimConfig::new(seed, capacity);
    cfg.logical_block_size = logical;
    cfg.physical_block_size = 4096;
    let (mut dev, handle) = SimDevice::new(cfg);
    let mut bytes = vec![0u8; capacity as usize];
    Rng::new(seed).fill(&mut bytes);
    handle.poke_durable(0, &bytes);
    if let Some((a, which)) = plant {
        let b = Superblock {
            copy: 1,
            sequence: a.sequence.wrapping_add(1),
            parent: a.checksum(),
            ..a
        };
        if which != 1 {
            handle.poke_durable(superblock_offset(0), &a.encode());
        }
        if which != 0 {
            handle.poke_durable(superblock_offset(1), &b.encode());
        }
    }
    match recovery::recover(&mut dev) {
        Ok((resume, report)) => prop_assert!(
            false,
            "random bytes recovered: tail {}, {report}",
            resume.tail
        ),
        Err(e) => prop_assert!(!e.to_string().is_empty()),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    /// Strategy 1: random bytes hold no log. Recovery refuses them, with or without planted
    /// superblocks that pass their CRC (no checkpoint batch can check at their recovery point).
    #[test]
    fn random_devices_are_refused(
        seed in any::<u64>(),
        logical in prop_oneof![Just(512u32), Just(4096u32)],
        plant in prop::option::of((planted_superblock(), 0u8..3)),
    ) {
        recover_random(seed, logical, plant)?;
    }
}

/// The minimal inputs of the panics this property found, replayed on every run.
#[test]
fn found_by_fuzzing() {
    // Positions near u64::MAX: the read-ahead cursor's bounds and the probe's end overflowed.
    for (u, max_batch, window, at) in [(512u32, 512u32, 512u64, 4608u64), (512, 1024, 2048, 2048)] {
        let p = u64::MAX - at + 1;
        let sb = Superblock {
            version: FORMAT_VERSION,
            format_id: 0,
            copy: 0,
            sequence: 1,
            parent: 0,
            write_unit: u,
            log_start: LOG_START,
            log_size: 5120,
            max_batch,
            head: p,
            recovery_point: p,
            recovery_link: 0,
            checkpoint: p,
            durable_through: p,
            epoch: 0,
            epoch_start: p,
            window,
        };
        recover_random(0, 512, Some((sb, 0))).unwrap();
    }
}
