//! Forged but checksum-valid content: a batch that carries valid checksums and links into the
//! chain at the tail, so recovery replays it, holding the numbers nothing but a forger writes:
//! partition ids near u32::MAX, epochs and offsets near u64::MAX, spans of u32::MAX, timestamps
//! at the end of time. Recovery must refuse it or open, never panic and never wrap an epoch, and
//! the writer it opens must answer appends and creates (with an error where the numbers run out)
//! without panicking. Tests run with overflow checks, so any unchecked sum shows as a panic.
//!
//! `NVMQ_FUZZ_CASES=<n>` sets the case count (default 96); failures persist beside this file.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::fuzz_common;
use crate::stepped;
use fuzz_common::config;
use stepped::drive;

use blockdev::sim::{SimClock, SimConfig, SimDevice};
use nvmq_log::batch::BatchBuilder;
use nvmq_log::format::{BatchKind, RecordKind, LOG_START};
use nvmq_log::mkfs::format;
use nvmq_log::state::encode_create;
use nvmq_log::{Ack, FlushMode, FormatOptions, LogConfig, LogError, Request};
use proptest::collection::vec;
use proptest::prelude::*;

const LOG_SIZE: u64 = 96 << 10;
const CAPACITY: u64 = LOG_START + LOG_SIZE + (64 << 10);

fn log_config() -> LogConfig {
    LogConfig {
        flush: FlushMode::Always,
        recovery_lag: 16 << 10,
        idle_superblock: Duration::from_millis(5),
        scrub_rate: 0,
        tail_cache_bytes: 0,
        retain_time: Some(Duration::from_secs(60)),
        ..LogConfig::default()
    }
}

type Answers = Arc<Mutex<Vec<Result<u64, LogError>>>>;

fn answer(a: &Answers) -> Ack {
    let a = a.clone();
    Ack::Call(Box::new(move |r| {
        a.lock().unwrap().push(r.map(|x| x.offset));
    }))
}

/// The log the forged batches are planted in: two partitions with a few records each, stopped
/// cleanly. (The device bytes, built once.)
fn image() -> &'static Vec<u8> {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let clock = SimClock::virtual_at_zero();
        let mut c = SimConfig::new(5, CAPACITY);
        c.clock = clock.clone();
        let (mut dev, handle) = SimDevice::new(c);
        let fmt = FormatOptions {
            window: 16 << 10,
            max_batch: 8 << 10,
            log_size: Some(LOG_SIZE),
            format_id: None,
        };
        format(&mut dev, &fmt).expect("format");
        let (mut w, _) = recovery::open(dev, log_config()).expect("open");
        let answers: Answers = Arc::default();
        for i in 0..2 {
            let a = answers.clone();
            w.submit(Request::CreatePartition {
                topic: "t".into(),
                index: i,
                ack: Box::new(move |r| a.lock().unwrap().push(r.map(|x| x.offset))),
            });
        }
        drive(&mut w, &clock, 20_000, |_| {
            answers.lock().unwrap().len() == 2
        });
        for i in 0..12u32 {
            w.append(i % 2, vec![i as u8; 100].into(), 1, answer(&answers));
        }
        drive(&mut w, &clock, 20_000, |_| {
            answers.lock().unwrap().len() == 14
        });
        assert!(answers.lock().unwrap().iter().all(|r| r.is_ok()));
        w.close();
        drive(&mut w, &clock, 20_000, |w| w.is_idle());
        drop(w);
        handle.peek(0, CAPACITY as usize)
    })
}

#[derive(Debug, Clone)]
enum Num {
    /// The value a real writer would use here.
    Real,
    /// u64::MAX (or u32::MAX) minus a little.
    Top(u64),
    /// Just below or at the largest plausible value (2^62 for offsets, 2^63 for epochs).
    Edge(u64),
    Any(u64),
}

/// Mostly real values: a batch with one forged number among real ones gets furthest.
fn num() -> impl Strategy<Value = Num> {
    prop_oneof![
        5 => Just(Num::Real),
        2 => (0u64..4).prop_map(Num::Top),
        1 => (0u64..4).prop_map(Num::Edge),
        1 => any::<u64>().prop_map(Num::Any),
    ]
}

fn pick64(n: &Num, real: u64, edge: u64) -> u64 {
    match n {
        Num::Real => real,
        Num::Top(d) => u64::MAX - d,
        Num::Edge(d) => edge.wrapping_sub(*d),
        Num::Any(v) => *v,
    }
}

fn pick32(n: &Num, real: u32) -> u32 {
    match n {
        Num::Real => real,
        Num::Top(d) | Num::Edge(d) => u32::MAX - *d as u32,
        Num::Any(v) => *v as u32,
    }
}

#[derive(Debug, Clone)]
struct ForgedRecord {
    create: bool,
    partition: Num,
    offset: Num,
    span: Num,
}

fn record() -> impl Strategy<Value = ForgedRecord> {
    (any::<bool>(), num(), num(), num()).prop_map(|(create, partition, offset, span)| {
        ForgedRecord {
            create,
            partition,
            offset,
            span,
        }
    })
}

#[derive(Debug, Clone)]
struct Forged {
    epoch: Num,
    durable_through: Num,
    timestamp: Num,
    records: Vec<ForgedRecord>,
}

fn forged() -> impl Strategy<Value = Forged> {
    (num(), num(), num(), vec(record(), 1..5)).prop_map(
        |(epoch, durable_through, timestamp, records)| Forged {
            epoch,
            durable_through,
            timestamp,
            records,
        },
    )
}

/// What an open over a forged batch gave, when it opened.
struct Opened {
    /// Recovery took the forged batch in (rather than cutting the log before it).
    replayed: bool,
    /// (partition id, durable end) of every partition right after the open, sorted.
    parts: Vec<(u32, u64)>,
}

/// Plants `f` at the image's tail, opens, and drives the writer over it; None when the open
/// refused.
fn run(f: &Forged) -> Result<Option<Opened>, TestCaseError> {
    let clock = SimClock::virtual_at_zero();
    let mut c = SimConfig::new(9, CAPACITY);
    c.clock = clock.clone();
    let (mut dev, handle) = SimDevice::new(c);
    handle.poke_durable(0, image());
    let ex = recovery::examine(&mut dev).expect("the image examines");
    let geo = ex.geometry;
    let next_offset = |id: u32| ex.registry.get(id).map_or(0, |p| p.next_offset);
    let mut buf = vec![0u8; geo.max_batch as usize];
    let epoch = pick64(&f.epoch, ex.max_epoch, 1 << 63);
    let mut b = BatchBuilder::new(&mut buf, geo.format_id, epoch, ex.tail);
    let mut next_id = ex.registry.next_id();
    for r in &f.records {
        if r.create {
            let id = pick32(&r.partition, next_id);
            next_id = next_id.max(id.saturating_add(1));
            b.push(RecordKind::CreatePartition, id, 0, &encode_create("f", id));
        } else {
            let id = pick32(&r.partition, 0);
            let offset = pick64(&r.offset, next_offset(id), 1 << 62);
            let span = pick32(&r.span, 1).max(1);
            b.push_span(RecordKind::Data, id, offset, span, &[0xf0; 16]);
        }
    }
    let durable = pick64(&f.durable_through, ex.tail, 1 << 62);
    let ts = pick64(&f.timestamp, 1_700_000_000_000, 1 << 62);
    let (len, _) = b.finish(
        geo.write_unit as usize,
        BatchKind::Records,
        durable,
        ex.last_hash,
        ts,
    );
    let [(at, first), (at2, _)] = geo.segments(ex.tail, len as u64);
    handle.poke_durable(at, &buf[..first as usize]);
    handle.poke_durable(at2, &buf[first as usize..len]);
    drop(dev);
    let dev = handle.power_on();

    let (mut w, report) = match recovery::open(dev, log_config()) {
        Ok(x) => x,
        Err(e) => {
            // Forged numbers claim acknowledged data the log cannot hold: damage, named.
            prop_assert!(
                matches!(e, recovery::RecoveryError::Damage { .. }),
                "refused with {e:?}"
            );
            return Ok(None);
        }
    };
    let mut parts: Vec<(u32, u64)> = w
        .shared()
        .lock()
        .partitions
        .iter()
        .map(|(id, v)| (*id, v.durable_end))
        .collect();
    parts.sort_unstable();
    let opened = Opened {
        replayed: report.cut_at > ex.tail,
        parts,
    };
    let new_epoch = w.shared().lock().epoch;
    prop_assert!(
        new_epoch > ex.max_epoch,
        "epoch {new_epoch} after {}",
        ex.max_epoch
    );
    if epoch < 1 << 63 {
        // Replayed or fenced off, the forged batch's epoch is below the new one: a batch of its
        // epoch past the cut can never pass the fence.
        prop_assert!(
            new_epoch > epoch,
            "epoch {new_epoch} after a batch of {epoch}"
        );
    }
    // The writer over whatever was replayed: appends to every partition named, and a create.
    let answers: Answers = Arc::default();
    let mut ids: Vec<u32> = w.shared().lock().partitions.keys().copied().collect();
    ids.extend(f.records.iter().map(|r| pick32(&r.partition, 0)));
    for &id in &ids {
        w.append(id, vec![1u8; 10].into(), 1, answer(&answers));
    }
    let a = answers.clone();
    w.submit(Request::CreatePartition {
        topic: "new".into(),
        index: 0,
        ack: Box::new(move |r| a.lock().unwrap().push(r.map(|x| x.offset))),
    });
    let want = ids.len() + 1;
    drive(&mut w, &clock, 20_000, |_| {
        answers.lock().unwrap().len() == want
    });
    prop_assert_eq!(
        answers.lock().unwrap().len(),
        want,
        "every request answered"
    );
    // Retention with a forged timestamp: time passes, the writer frees what it may.
    clock.advance(Duration::from_secs(120));
    drive(&mut w, &clock, 20_000, |_| false);
    prop_assert!(w.fatal().is_none(), "writer stopped: {:?}", w.fatal());
    Ok(Some(opened))
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn forged_checksum_valid_batches_never_panic_nor_wrap_an_epoch(f in forged()) {
        run(&f)?;
    }
}

/// The property is only worth something if forged batches get replayed: a batch of real values
/// with a span of u32::MAX is, and the writer then appends past it.
#[test]
fn a_forged_batch_with_a_huge_span_is_replayed_and_the_writer_goes_on() {
    let f = Forged {
        epoch: Num::Real,
        durable_through: Num::Real,
        timestamp: Num::Top(0),
        records: vec![ForgedRecord {
            create: false,
            partition: Num::Real,
            offset: Num::Real,
            span: Num::Top(0),
        }],
    };
    let opened = run(&f).expect("runs").expect("opens");
    assert!(opened.replayed, "the forged batch was not replayed");
    // Partition 0 grew by the span (6 records in the image, then u32::MAX).
    assert_eq!(opened.parts[0], (0, 6 + u64::from(u32::MAX)));
}

/// A create of an id already assigned would restart that partition's offsets at 0: recovery
/// cuts the log before the batch instead, and both partitions keep what they had.
#[test]
fn a_forged_create_of_an_existing_id_is_not_replayed() {
    let f = Forged {
        epoch: Num::Real,
        durable_through: Num::Real,
        timestamp: Num::Real,
        records: vec![ForgedRecord {
            create: true,
            partition: Num::Any(0),
            offset: Num::Real,
            span: Num::Real,
        }],
    };
    let opened = run(&f).expect("runs").expect("opens");
    assert!(
        !opened.replayed,
        "a second create of partition 0 was replayed"
    );
    assert_eq!(opened.parts, vec![(0, 6), (1, 6)]);
}
