//! The logs `fuzz_recovery.rs` damages: built once, by the real writer driven step by step over
//! a simulated device, over several eras ended by power cuts, with what each may legitimately
//! serve afterwards (`Image::live`); and the stepped writer calls the fuzzing uses on them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use blockdev::sim::{Latency, Rng, SimClock, SimConfig, SimDevice, SimHandle};
use blockdev::BlockDevice;
use nvmq_log::format::{LOG_START, SUPERBLOCK_B};
use nvmq_log::mkfs::format;
use nvmq_log::{
    read_with, Appended, FlushMode, FormatOptions, LogConfig, LogError, OnFull, Record, Request,
    Writer,
};

use crate::fuzz_common::FORMAT_ID;
use crate::stepped::{self, step_once, stepped_read};

// ---------------------------------------------------------------------------------------------
// Geometry of the logs the mutation test damages: small, so that the ring wraps in a few eras.

pub const BLOCK: u64 = 4096;
pub const WINDOW: u64 = 16 << 10;
pub const MAX_BATCH: u32 = 8 << 10;
pub const LOG_SIZE: u64 = 96 << 10;
pub const CAPACITY: u64 = LOG_START + LOG_SIZE;
pub const DEVICE_BLOCKS: u64 = CAPACITY / BLOCK;
pub const PARTITIONS: u32 = 3;

pub fn format_options() -> FormatOptions {
    FormatOptions {
        window: WINDOW,
        max_batch: MAX_BATCH,
        log_size: Some(LOG_SIZE),
        format_id: Some(FORMAT_ID),
    }
}

pub fn log_config(retain_bytes: Option<u64>) -> LogConfig {
    LogConfig {
        flush: FlushMode::Always,
        on_full: OnFull::DropOldest,
        retain_bytes,
        retain_time: None,
        recovery_lag: 2 * u64::from(MAX_BATCH),
        queue_capacity: 64,
        max_flushes_in_flight: 2,
        max_writes_in_flight: 2,
        idle_superblock: Duration::from_millis(5),
        quiet_flush: LogConfig::default().quiet_flush,
        full_wait: Duration::from_millis(20),
        scrub_rate: 0,
        // Reads must reach the (damaged) device, not copies of what was written.
        tail_cache_bytes: 0,
        ..LogConfig::default()
    }
}

/// Steps the writer until `done` holds (or `limit` steps), moving virtual time while it waits.
pub fn drive<D: BlockDevice>(
    w: &mut Writer<D>,
    clock: &SimClock,
    limit: usize,
    mut done: impl FnMut() -> bool,
) {
    stepped::drive(w, clock, limit, |_| done());
}

/// One `read_with` call through the stepped writer.
pub fn read_once<D: BlockDevice>(
    w: &mut Writer<D>,
    clock: &SimClock,
    partition: u32,
    offset: u64,
) -> Result<Vec<Record>, LogError> {
    let shared = w.shared();
    let geo = w.geometry();
    let mut raw = |position: u64, len: u64| stepped_read(w, clock, position, len);
    read_with(&shared, &geo, partition, offset, 16 << 10, &mut raw)
}

/// Opens and, as `Log::start` would in the background, rebuilds the index below the recovery
/// point through the stepped writer.
pub fn open_stepped<D: BlockDevice>(
    dev: D,
    cfg: LogConfig,
    clock: &SimClock,
) -> Result<(Writer<D>, recovery::RecoveryReport), recovery::RecoveryError> {
    let (mut w, report) = recovery::open(dev, cfg)?;
    w.backfill_with(|w, p, l| stepped_read(w, clock, p, l));
    Ok((w, report))
}

/// (id, start offset, durable end) of every partition the writer serves, sorted.
pub fn partitions<D: BlockDevice>(w: &Writer<D>) -> Vec<(u32, u64, u64)> {
    let shared = w.shared();
    let s = shared.lock();
    let mut v: Vec<_> = s
        .partitions
        .iter()
        .map(|(id, p)| (*id, p.start_offset, p.durable_end))
        .collect();
    v.sort();
    v
}

// ---------------------------------------------------------------------------------------------
// The logs to damage: built once, by the real writer, over several eras ended by power cuts.

/// Device bytes that matter: both superblock blocks and the whole log region.
pub type Snapshot = Vec<(u64, Vec<u8>)>;

pub struct Image {
    pub label: String,
    /// The device at the end of the last era.
    pub regions: Snapshot,
    /// The device at the end of each earlier era: stale versions of every block.
    pub history: Vec<Snapshot>,
    /// The one payload that may be served at (partition, offset) after any damage: the one
    /// appended there in the latest era that appended there, as long as no later recovery cut it
    /// away.
    ///
    /// Why nothing else is legitimate: an era appends at offset k only when the recovery before
    /// it ended the partition at or below k, so every earlier era's record at k was cut away by
    /// that recovery, and a cut is fenced by a new epoch so that it never comes back (storage.md
    /// §5.4, §7.4), whatever damage comes later. A record of an older era at an offset that no
    /// later era reached is legitimate when every later recovery kept it (it was durable, or an
    /// unacknowledged survivor): it is then still the latest record there. Damage may make a
    /// record unreadable or get the log refused, but cannot legitimately put another era's
    /// record in its place: these logs hold no damage of their own, so every recovery cut is at a
    /// torn or lost batch, which never exists whole on the device afterwards; the cut-away
    /// batches behind it link to that batch, so no stale block, misdirected copy or forged
    /// superblock field can chain them in again (short of a hash collision).
    pub live: HashMap<(u32, u64), Vec<u8>>,
    /// Payloads a later recovery cut away at (partition, offset): serving one is a resurrection.
    pub cut_away: HashMap<(u32, u64), Vec<Vec<u8>>>,
    /// (id, start offset, durable end) of each partition just before the last cut.
    pub live_parts: Vec<(u32, u64, u64)>,
}

pub fn snapshot(handle: &SimHandle) -> Snapshot {
    vec![
        (0, handle.peek(0, BLOCK as usize)),
        (SUPERBLOCK_B, handle.peek(SUPERBLOCK_B, BLOCK as usize)),
        (LOG_START, handle.peek(LOG_START, LOG_SIZE as usize)),
    ]
}

/// The block at device byte `off` in a snapshot (zeros where the snapshot holds nothing).
pub fn snapshot_block(s: &Snapshot, off: u64) -> Vec<u8> {
    for (at, bytes) in s {
        if off >= *at && off + BLOCK <= at + bytes.len() as u64 {
            let i = (off - at) as usize;
            return bytes[i..i + BLOCK as usize].to_vec();
        }
    }
    vec![0u8; BLOCK as usize]
}

pub fn payload(rng: &mut Rng, label: u64, era: u32, seq: u64) -> Vec<u8> {
    let mut p = format!("img{label}e{era}n{seq}:").into_bytes();
    let extra = match rng.below(20) {
        0 => rng.below(7_000),
        1..=3 => 0,
        4..=6 => rng.below(2_000),
        _ => rng.below(300),
    } as usize;
    let start = p.len();
    p.resize(start + extra, 0);
    rng.fill(&mut p[start..]);
    p
}

/// Formats a device and runs `eras` rounds of: recover, check what survived, append, then either
/// settle (every append acknowledged, the idle superblock written) or cut mid-load.
pub fn build_image(
    label: u64,
    eras: u32,
    ragged_end: bool,
    retain: Option<u64>,
    load: u64,
) -> Image {
    let mut rng = Rng::new(label);
    let clock = SimClock::virtual_at_zero();
    let mut cfg = SimConfig::new(label, CAPACITY);
    cfg.clock = clock.clone();
    cfg.write_latency = Latency::Uniform {
        min: Duration::from_micros(5),
        max: Duration::from_micros(200),
    };
    cfg.flush_latency = Latency::Uniform {
        min: Duration::from_micros(100),
        max: Duration::from_millis(2),
    };
    let (mut dev, handle) = SimDevice::new(cfg);
    format(&mut dev, &format_options()).expect("format");
    let log_cfg = log_config(retain);
    let mut truth: HashMap<u32, Vec<Vec<u8>>> = HashMap::new();
    let mut live: HashMap<(u32, u64), Vec<u8>> = HashMap::new();
    let mut cut_away: HashMap<(u32, u64), Vec<Vec<u8>>> = HashMap::new();
    let mut history = Vec::new();
    let mut seq = 0u64;
    let mut live_parts = Vec::new();
    for era in 0..eras {
        let (mut w, _) = open_stepped(dev, log_cfg.clone(), &clock)
            .unwrap_or_else(|e| panic!("image {label}: clean open in era {era} failed: {e}"));
        // What survived the last cut: a prefix of what was sent, byte for byte.
        for (id, start, end) in partitions(&w) {
            let t = truth.entry(id).or_default();
            assert!(
                end as usize <= t.len(),
                "image {label}: partition {id} grew"
            );
            // Everything past the recovered end was cut away by this recovery.
            for off in end..t.len() as u64 {
                if let Some(p) = live.remove(&(id, off)) {
                    cut_away.entry((id, off)).or_default().push(p);
                }
            }
            t.truncate(end as usize);
            let mut at = start;
            while at < end {
                let recs = match read_once(&mut w, &clock, id, at) {
                    Ok(r) => r,
                    // Retention moved the head while we read: go on from the new start.
                    Err(LogError::OffsetOutOfRange { start: s, .. }) if s > at => {
                        at = s;
                        continue;
                    }
                    Err(e) => panic!("image {label}: clean read {id}/{at}: {e}"),
                };
                assert!(!recs.is_empty(), "image {label}: empty read {id}/{at}");
                for r in recs {
                    assert_eq!(r.offset, at, "image {label}: partition {id}");
                    assert!(
                        t[at as usize] == r.payload,
                        "image {label}: {id}/{at} differs"
                    );
                    at += 1;
                }
            }
        }
        if era == 0 {
            let done: Arc<Mutex<Vec<Result<Appended, LogError>>>> = Arc::default();
            for i in 0..PARTITIONS {
                let d = done.clone();
                w.submit(Request::CreatePartition {
                    topic: format!("topic-{i}"),
                    index: i,
                    ack: Box::new(move |r| d.lock().unwrap().push(r)),
                });
            }
            drive(&mut w, &clock, 100_000, || {
                done.lock().unwrap().len() == PARTITIONS as usize
            });
            for r in done.lock().unwrap().iter() {
                let a = r.as_ref().expect("create partition");
                truth.entry(a.partition).or_default();
            }
        }
        let mut ids: Vec<u32> = truth.keys().copied().collect();
        ids.sort();
        let cut_mid = if era + 1 == eras {
            ragged_end
        } else {
            rng.chance(0.5)
        };
        let n = rng.range(load / 2, load);
        type Acks = Arc<Mutex<Vec<(u32, u64, Result<Appended, LogError>)>>>;
        let acks: Acks = Arc::default();
        for _ in 0..n {
            let id = ids[rng.below(ids.len() as u64) as usize];
            seq += 1;
            let p = payload(&mut rng, label, era, seq);
            let t = truth.entry(id).or_default();
            let off = t.len() as u64;
            t.push(p.clone());
            let earlier = live.insert((id, off), p.clone());
            assert!(
                earlier.is_none(),
                "image {label}: {id}/{off} appended again without a cut"
            );
            let a = acks.clone();
            w.submit(Request::Append {
                partition: id,
                payload: p,
                span: 1,
                ack: Box::new(move |r| a.lock().unwrap().push((id, off, r))),
            });
            for _ in 0..rng.below(4) {
                step_once(&mut w, &clock);
            }
        }
        if cut_mid {
            for _ in 0..rng.below(30) {
                step_once(&mut w, &clock);
            }
        } else {
            drive(&mut w, &clock, 200_000, || {
                acks.lock().unwrap().len() as u64 == n
            });
            assert_eq!(
                acks.lock().unwrap().len() as u64,
                n,
                "image {label}: not all acked"
            );
            // Idle long enough for the superblock to record D.
            for _ in 0..3 {
                clock.advance(Duration::from_millis(20));
                drive(&mut w, &clock, 2_000, || false);
            }
        }
        assert!(w.fatal().is_none(), "image {label}: writer stopped");
        for (id, off, r) in acks.lock().unwrap().iter() {
            let a = r
                .as_ref()
                .unwrap_or_else(|e| panic!("image {label}: append failed: {e}"));
            assert_eq!(
                (a.partition, a.offset),
                (*id, *off),
                "image {label}: offsets"
            );
        }
        live_parts = partitions(&w);
        handle.power_cut();
        drop(w);
        history.push(snapshot(&handle));
        dev = handle.power_on();
    }
    let regions = history.pop().expect("at least one era");
    // The last era's cut is decided by the first recovery after it: the one recovery of an
    // undamaged copy would make. What it cuts away is as illegitimate as what earlier recoveries
    // cut (valid batches behind a torn one may still be on the device).
    let (trial, trial_handle) = SimDevice::new(SimConfig::new(label, CAPACITY));
    for (at, bytes) in &regions {
        trial_handle.poke_durable(*at, bytes);
    }
    let (w, _) = open_stepped(trial, log_cfg, &clock)
        .unwrap_or_else(|e| panic!("image {label}: clean open of the final image failed: {e}"));
    for (id, _, end) in partitions(&w) {
        let t = truth.entry(id).or_default();
        for off in end..t.len() as u64 {
            if let Some(p) = live.remove(&(id, off)) {
                cut_away.entry((id, off)).or_default().push(p);
            }
        }
    }
    drop(w);
    Image {
        label: format!("image {label} ({eras} eras, ragged end: {ragged_end}, retain: {retain:?})"),
        regions,
        history,
        live,
        cut_away,
        live_parts,
    }
}

pub fn images() -> &'static [Image] {
    static IMAGES: OnceLock<Vec<Image>> = OnceLock::new();
    IMAGES.get_or_init(|| {
        vec![
            build_image(1, 1, false, None, 12),
            build_image(2, 3, false, None, 160),
            build_image(3, 3, true, None, 160),
            build_image(4, 4, true, Some(40 << 10), 120),
            build_image(5, 2, false, None, 60),
            build_image(6, 5, false, Some(48 << 10), 100),
            // Holds cut-away batches still on the device (behind a torn one): what a resurrection
            // would serve (see `cut_away_records_are_on_the_device`). Which seed does depends
            // on the writer's exact I/O pattern: re-pick when that test fails after a writer
            // change (it did with multi-batch checkpoints: 7 no longer held one, 10 does).
            build_image(10, 3, true, None, 160),
        ]
    })
}
