//! Format versions across builds. Version 2 lets a checkpoint span several batches, which a
//! version-1 build would misread, so:
//! - a log written in version 1 (single-batch checkpoints) opens with this build, keeps every
//!   record, and recovery's superblock updates move both copies to version 2;
//! - a copy in a version this build does not read (a newer nvmq wrote it) is refused with an
//!   error naming the version, even when the other copy is readable: falling back to the older
//!   copy would replay a log the newer build wrote in its own format.

use blockdev::sim::{SimConfig, SimDevice, SimHandle};
use nvmq_log::config::{FormatOptions, LogConfig};
use nvmq_log::format::{
    superblock_offset, Superblock, FORMAT_VERSION, LOG_START, OLDEST_READABLE_VERSION,
};
use nvmq_log::mkfs::read_superblocks;
use nvmq_log::Log;
use recovery::RecoveryError;

const MIB: u64 = 1 << 20;
const CAPACITY: u64 = LOG_START + 8 * MIB;
const RECORDS: usize = 200;

fn payload(i: usize) -> Vec<u8> {
    format!("record {i} of the old log").into_bytes()
}

fn format_options() -> FormatOptions {
    FormatOptions {
        window: MIB,
        max_batch: (256 << 10) as u32,
        log_size: None,
        format_id: None,
    }
}

/// A formatted sim device holding RECORDS records in t/0, cleanly shut down.
fn written(seed: u64) -> (SimConfig, SimHandle) {
    let cfg = SimConfig::new(seed, CAPACITY);
    let (mut dev, handle) = SimDevice::new(cfg.clone());
    nvmq_log::mkfs::format(&mut dev, &format_options()).expect("format");
    let (w, _) = recovery::open(dev, LogConfig::default()).expect("open after format");
    let log = Log::start(w, 64);
    let part = log.create_partition("t", 0).expect("create");
    for i in 0..RECORDS {
        log.append_wait(part, payload(i)).expect("append");
    }
    log.shutdown();
    (cfg, handle)
}

/// The same bytes on a fresh device handle.
fn reopened(cfg: &SimConfig, from: &SimHandle) -> (SimDevice, SimHandle) {
    let bytes = from.peek(0, CAPACITY as usize);
    let (dev, handle) = SimDevice::new(cfg.clone());
    handle.poke_durable(0, &bytes);
    (dev, handle)
}

fn superblocks(cfg: &SimConfig, h: &SimHandle) -> [Superblock; 2] {
    let (mut dev, _) = reopened(cfg, h);
    read_superblocks(&mut dev).map(|c| c.expect("a valid superblock copy"))
}

/// Rewrites both copies in `version`, the newer naming the older (as re-encoded) as its parent,
/// as a build of that version would have written them.
fn rewrite_in_version(cfg: &SimConfig, h: &SimHandle, version: u32) {
    let [a, b] = superblocks(cfg, h);
    let (old, new) = if a.sequence < b.sequence {
        (a, b)
    } else {
        (b, a)
    };
    let old = Superblock { version, ..old };
    let new = Superblock {
        version,
        parent: old.checksum(),
        ..new
    };
    for sb in [old, new] {
        h.poke_durable(superblock_offset(sb.copy), &sb.encode());
    }
}

fn read_all(log: &Log) -> Vec<Vec<u8>> {
    let part = log.partition_id("t", 0).expect("partition t/0");
    let mut out = Vec::new();
    while out.len() < RECORDS {
        let recs = log.read(part, out.len() as u64, 1 << 20).expect("read t/0");
        assert!(!recs.is_empty(), "t/0 ends at {} records", out.len());
        out.extend(recs.into_iter().map(|r| r.payload.to_vec()));
    }
    out
}

#[test]
fn a_version_1_log_opens_keeps_its_records_and_is_moved_to_the_current_version() {
    const { assert!(OLDEST_READABLE_VERSION == 1 && FORMAT_VERSION == 2) };
    let (cfg, h) = written(1);
    rewrite_in_version(&cfg, &h, 1);
    assert!(superblocks(&cfg, &h).iter().all(|sb| sb.version == 1));

    let (dev, h2) = reopened(&cfg, &h);
    let (w, _) = recovery::open(dev, LogConfig::default()).expect("a version-1 log opens");
    let log = Log::start(w, 64);
    let got = read_all(&log);
    assert_eq!(got, (0..RECORDS).map(payload).collect::<Vec<_>>());
    log.shutdown();

    let now = superblocks(&cfg, &h2);
    assert!(
        now.iter().all(|sb| sb.version == FORMAT_VERSION),
        "after open: {now:?}"
    );
    // And the result opens again (the version-2 copies chain to each other).
    let (dev, _) = reopened(&cfg, &h2);
    let (w, _) = recovery::open(dev, LogConfig::default()).expect("reopen");
    let log = Log::start(w, 64);
    assert_eq!(read_all(&log).len(), RECORDS);
    log.shutdown();
}

#[test]
fn this_build_writes_the_current_version() {
    let (cfg, h) = written(2);
    assert!(superblocks(&cfg, &h)
        .iter()
        .all(|sb| sb.version == FORMAT_VERSION));
}

fn refused(cfg: &SimConfig, h: &SimHandle) -> RecoveryError {
    let (dev, _) = reopened(cfg, h);
    match recovery::open(dev, LogConfig::default()) {
        Ok(_) => panic!("a log in a newer format version opened"),
        Err(e) => e,
    }
}

#[test]
fn a_log_in_a_newer_version_is_refused_naming_the_version() {
    let (cfg, h) = written(3);
    rewrite_in_version(&cfg, &h, FORMAT_VERSION + 1);
    let e = refused(&cfg, &h);
    assert!(
        matches!(e, RecoveryError::UnreadableVersion { version, .. } if version == FORMAT_VERSION + 1),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains("format version 3") && text.contains("newer nvmq"),
        "{text}"
    );
}

#[test]
fn one_copy_in_a_newer_version_is_refused_not_passed_over_for_the_older_copy() {
    let (cfg, h) = written(4);
    let [a, b] = superblocks(&cfg, &h);
    let newer = if a.sequence > b.sequence { a } else { b };
    let bumped = Superblock {
        version: FORMAT_VERSION + 1,
        ..newer
    };
    h.poke_durable(superblock_offset(bumped.copy), &bumped.encode());
    let e = refused(&cfg, &h);
    assert!(
        matches!(e, RecoveryError::UnreadableVersion { slot, version, .. }
            if version == FORMAT_VERSION + 1 && slot == recovery::slot_name(bumped.copy)),
        "{e:?}"
    );
}
