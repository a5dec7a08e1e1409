//! What the property tests over device bytes share: their case counts and where their failures
//! are kept.
#![allow(dead_code)] // each test binary uses its own part

use nvmq_log::format::{Superblock, FORMAT_VERSION, LOG_START};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, FileFailurePersistence};

/// The format id the fuzzed logs are formatted with.
pub const FORMAT_ID: u64 = 0x6675_7a7a_5eed_0001;

pub fn cases(default: u32) -> u32 {
    std::env::var("NVMQ_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `default` cases (or `NVMQ_FUZZ_CASES`); failures are kept beside the test's file and replayed
/// first.
pub fn config(default: u32) -> ProptestConfig {
    ProptestConfig {
        cases: cases(default),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

/// Superblock fields to plant: mostly a valid geometry, with positions near 0, near u64::MAX, or
/// anywhere.
pub fn planted_superblock() -> impl Strategy<Value = Superblock> {
    let unit = prop_oneof![
        Just(512u32),
        Just(4096u32),
        Just(8192u32),
        Just(65536u32),
        Just(1u32 << 20),
        any::<u32>()
    ];
    (
        unit,
        (4u64..64, 1u32..4, 1u64..4),
        (0u8..3, 0u64..512, any::<u64>()),
        (0u64..4, 0u64..4, 0u64..8, any::<bool>()),
        (any::<u64>(), any::<u32>(), 0u64..4),
    )
        .prop_map(
            |(
                u,
                (log_k, mb_k, w_k),
                (where_, k, anywhere),
                (rp_k, cp_k, dt_k, es_rp),
                (fid, link, ep),
            )| {
                let u64u = u64::from(u).max(1);
                let base = match where_ {
                    0 => k * u64u,
                    1 => (u64::MAX / u64u).wrapping_sub(k % 16) * u64u,
                    _ => anywhere,
                };
                let rp = base.wrapping_add(rp_k * u64u);
                let max_batch = mb_k.wrapping_mul(u);
                Superblock {
                    version: FORMAT_VERSION,
                    format_id: fid,
                    copy: 0,
                    sequence: 1,
                    parent: 0,
                    write_unit: u,
                    log_start: LOG_START,
                    log_size: log_k * u64u,
                    max_batch,
                    head: base,
                    recovery_point: rp,
                    recovery_link: link,
                    checkpoint: base.wrapping_add(cp_k.min(rp_k) * u64u),
                    durable_through: rp.wrapping_add(dt_k * 512),
                    epoch: ep,
                    epoch_start: if es_rp { rp } else { base },
                    window: w_k * u64::from(max_batch),
                }
            },
        )
}
