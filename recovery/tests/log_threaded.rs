//! The threaded `Log` (writer thread + producers over the channel) on the sim and file devices
//! (both file engines: I/O threads and io_uring): concurrent appends, spans, reopen, the relaxed
//! flush modes and `on_full = refuse`.
//!
//! Without io_uring the io_uring variants fail, naming the reason, unless `NVMQ_NO_IO_URING=1`
//! says that is expected (then they print a loud notice and skip).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blockdev::file::{Engine, FileDevice, FileOptions};
use blockdev::sim::{Latency, SimConfig, SimDevice, SimHandle};
use blockdev::BlockDevice;
use nvmq_log::config::{FlushMode, FormatOptions, LogConfig, OnFull};
use nvmq_log::{Log, LogError, WriterStats};

const MIB: u64 = 1 << 20;

/// (partition, offset) -> payload of every acknowledged append.
type Acked = BTreeMap<(u32, u64), Vec<u8>>;

fn sim(seed: u64, capacity: u64) -> (SimDevice, SimHandle) {
    let mut c = SimConfig::new(seed, capacity);
    c.flush_latency = Latency::Fixed(Duration::from_micros(300));
    SimDevice::new(c)
}

fn start<D: BlockDevice + 'static>(mut dev: D, fmt: Option<&FormatOptions>, cfg: LogConfig) -> Log {
    if let Some(fmt) = fmt {
        nvmq_log::mkfs::format(&mut dev, fmt).expect("format");
    }
    let (w, _report) = recovery::open(dev, cfg.clone()).expect("open");
    Log::start(w, cfg.queue_capacity)
}

fn quiet_config(flush: FlushMode) -> LogConfig {
    LogConfig {
        flush,
        // No superblock update (and so no flush) while the test counts flushes.
        idle_superblock: Duration::from_secs(3600),
        quiet_flush: Duration::from_secs(3600),
        ..LogConfig::default()
    }
}

fn payload(producer: usize, i: usize) -> Vec<u8> {
    format!("producer {producer} record {i}").into_bytes()
}

/// File options for `engine`, or `None` (after a loud notice) when the io_uring engine is asked
/// for, io_uring is unavailable and `NVMQ_NO_IO_URING=1` says that is expected.
fn file_options(test: &str, engine: Engine) -> Option<FileOptions> {
    if engine != Engine::Threads {
        match blockdev::file::io_uring_support() {
            Ok(()) => {}
            Err(why) if std::env::var("NVMQ_NO_IO_URING").as_deref() == Ok("1") => {
                eprintln!(
                    "!!! {test}: SKIPPED, io_uring is unavailable ({why}), NVMQ_NO_IO_URING=1"
                );
                return None;
            }
            Err(why) => {
                panic!("{test}: io_uring is unavailable: {why} (NVMQ_NO_IO_URING=1 if expected)")
            }
        }
    }
    Some(FileOptions {
        engine,
        ..FileOptions::default()
    })
}

#[test]
fn concurrent_producers_get_every_offset_once_and_read_back_what_they_sent() {
    let (dev, _h) = sim(11, 64 * MIB);
    concurrent_producers(dev, LogConfig::default());
}

/// The writer thread that polls instead of sleeping (`LogConfig::spin`), on a power-loss
/// protected sim with a real clock (its completion fd armed only when the thread does sleep):
/// the same answers, and not one flush (completed writes are durable there).
#[test]
fn a_spinning_writer_thread_on_a_power_loss_protected_sim_gets_every_offset_once() {
    let mut c = SimConfig::new(12, 64 * MIB);
    c.volatile_cache = false;
    c.write_latency = Latency::Fixed(Duration::from_micros(10));
    let (dev, h) = SimDevice::new(c);
    let cfg = LogConfig {
        spin: Duration::from_micros(200),
        ..LogConfig::default()
    };
    let stats = concurrent_producers(dev, cfg);
    assert_eq!(
        stats.flushes, 0,
        "a device without a volatile cache needs no flush"
    );
    assert!(stats.appends_acked >= 2400 && h.stats().writes > 0);
}

fn concurrent_producers_on_a_file(test: &str, engine: Engine) {
    let Some(opts) = file_options(test, engine) else {
        return;
    };
    let dir = tempdir();
    let dev = FileDevice::create(&dir.join("log.img"), 64 * MIB, opts, |_| Ok(())).expect("create");
    assert_eq!(dev.engine(), engine);
    concurrent_producers(dev, LogConfig::default());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn concurrent_producers_on_the_file_device_with_io_threads() {
    concurrent_producers_on_a_file(
        "concurrent_producers_on_the_file_device_with_io_threads",
        Engine::Threads,
    );
}

#[test]
fn concurrent_producers_on_the_file_device_with_io_uring() {
    concurrent_producers_on_a_file(
        "concurrent_producers_on_the_file_device_with_io_uring",
        Engine::IoUring,
    );
}

/// Returns the writer's counters at the end.
fn concurrent_producers<D: BlockDevice + 'static>(dev: D, cfg: LogConfig) -> WriterStats {
    let log = Arc::new(start(dev, Some(&FormatOptions::default()), cfg));
    let parts: Vec<u32> = (0..4)
        .map(|i| log.create_partition("t", i).expect("create"))
        .collect();
    let acked: Arc<Mutex<Acked>> = Arc::default();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let log = log.clone();
            let acked = acked.clone();
            let part = parts[t % parts.len()];
            std::thread::spawn(move || {
                for i in 0..300 {
                    let p = payload(t, i);
                    let a = log.append_wait(part, p.clone()).expect("append");
                    assert_eq!(a.partition, part);
                    let old = acked.lock().unwrap().insert((part, a.offset), p);
                    assert!(old.is_none(), "offset {} of {part} acked twice", a.offset);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("producer thread");
    }
    let acked = acked.lock().unwrap();
    for &part in &parts {
        let mine: Vec<(&(u32, u64), &Vec<u8>)> = acked.range((part, 0)..(part, u64::MAX)).collect();
        assert_eq!(mine.len(), 600, "two producers x 300 on partition {part}");
        // Offsets are dense from 0: nothing skipped, nothing doubled.
        for (i, ((_, off), _)) in mine.iter().enumerate() {
            assert_eq!(*off, i as u64);
        }
        let mut got = Vec::new();
        while got.len() < mine.len() {
            let recs = log.read(part, got.len() as u64, 64 << 10).expect("read");
            assert!(!recs.is_empty(), "read stalled at {}", got.len());
            got.extend(recs);
        }
        for (r, ((_, off), p)) in got.iter().zip(mine) {
            assert_eq!(r.offset, *off);
            assert_eq!(&r.payload, p, "payload at offset {off} of {part}");
        }
    }
    assert!(log.fatal().is_none());
    log.stats()
}

#[test]
fn spans_take_offsets_and_survive_reopen_on_the_file_device_with_io_threads() {
    spans_on_a_file("spans_..._with_io_threads", Engine::Threads);
}

#[test]
fn spans_take_offsets_and_survive_reopen_on_the_file_device_with_io_uring() {
    spans_on_a_file("spans_..._with_io_uring", Engine::IoUring);
}

fn spans_on_a_file(test: &str, engine: Engine) {
    let Some(opts) = file_options(test, engine) else {
        return;
    };
    let dir = tempdir();
    let path = dir.join("log.img");
    let fmt = FormatOptions::default();
    let dev = FileDevice::create(&path, 64 * MIB, opts, |d| {
        nvmq_log::mkfs::format_device(d, &fmt)
    })
    .expect("create file device");
    let log = start(dev, None, LogConfig::default());
    let part = log.create_partition("kafka", 0).expect("create");
    let span_append = |log: &Log, bytes: &[u8], span: u32| {
        let (tx, rx) = std::sync::mpsc::channel();
        log.append_span(
            part,
            bytes.to_vec(),
            span,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )
        .expect("queue");
        rx.recv().expect("ack").expect("append")
    };
    assert_eq!(span_append(&log, b"one", 1).offset, 0);
    assert_eq!(span_append(&log, b"five", 5).offset, 1);
    assert_eq!(span_append(&log, b"one more", 1).offset, 6);
    let (tx, rx) = std::sync::mpsc::channel();
    let queued = log.append_span(
        part,
        b"none".to_vec(),
        0,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    // A record must take at least one offset: the writer refuses it through its ack.
    queued.expect("queued");
    let r = rx.recv().expect("ack");
    assert!(
        matches!(r, Err(LogError::Config(_))),
        "a zero span was acked: {r:?}"
    );
    let check = |log: &Log| {
        // Reading from an offset inside a span serves the record that holds it.
        let recs = log.read(part, 3, 1 << 20).expect("read");
        let got: Vec<(u64, u32, &[u8])> = recs
            .iter()
            .map(|r| (r.offset, r.span, &r.payload[..]))
            .collect();
        assert_eq!(got, vec![(1, 5, &b"five"[..]), (6, 1, &b"one more"[..])]);
        let view = log.partition(part).expect("partition");
        assert_eq!(view.durable_end, 7);
    };
    check(&log);
    log.shutdown();
    let dev = FileDevice::open(&path, opts).expect("reopen");
    assert_eq!(dev.engine(), engine);
    let log = start(dev, None, LogConfig::default());
    check(&log);
    assert_eq!(span_append(&log, b"after reopen", 2).offset, 7);
    log.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Appends `n` records and returns the device's flush count across them (after the creation of
/// the partition settled).
fn flushes_during_appends(flush: FlushMode, n: usize) -> (u64, SimHandle, Log) {
    let (dev, h) = sim(5, 64 * MIB);
    let log = start(dev, Some(&FormatOptions::default()), quiet_config(flush));
    let part = log.create_partition("t", 0).expect("create");
    let before = h.stats().flushes;
    for i in 0..n {
        log.append_wait(part, payload(0, i)).expect("append");
    }
    let after = h.stats().flushes;
    (after - before, h, log)
}

#[test]
fn flush_mode_always_flushes_for_every_ack() {
    // Closed loop, one producer: every ack waited for its own flush.
    let (flushes, _h, log) = flushes_during_appends(FlushMode::Always, 50);
    assert!(
        flushes >= 50,
        "50 sequential acks took only {flushes} flushes"
    );
    log.shutdown();
}

#[test]
fn flush_mode_never_acks_without_flushing() {
    let (flushes, h, log) = flushes_during_appends(FlushMode::Never, 50);
    assert_eq!(flushes, 0, "`never` flushed {flushes} times");
    // The acked records sit in the volatile cache: that is the loss window `never` admits...
    assert!(h.stats().cached_writes > 0);
    // ...until a clean shutdown, which flushes them.
    log.shutdown();
    assert_eq!(h.stats().cached_writes, 0, "shutdown left writes unflushed");
}

#[test]
fn flush_mode_interval_acks_first_and_flushes_soon_after() {
    let (flushes, h, log) =
        flushes_during_appends(FlushMode::Interval(Duration::from_millis(20)), 5);
    // Acked without waiting for five flushes of their own.
    assert!(
        flushes < 5,
        "interval mode flushed {flushes} times for 5 acks"
    );
    // ...and the interval flush follows without more appends.
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.stats().cached_writes > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(h.stats().cached_writes, 0, "no flush followed the acks");
    log.shutdown();
}

/// A log of `log_size` bytes on a sim device, records kept for an hour.
fn small_log(on_full: OnFull) -> Log {
    small_log_keeping(on_full, None)
}

/// A 2 MiB log keeping records an hour, and at most `retain_bytes` when given.
fn small_log_keeping(on_full: OnFull, retain_bytes: Option<u64>) -> Log {
    let fmt = FormatOptions {
        window: MIB,
        max_batch: 64 << 10,
        log_size: Some(2 * MIB),
        ..FormatOptions::default()
    };
    let (dev, _h) = sim(3, 8 * MIB);
    let cfg = LogConfig {
        on_full,
        retain_time: Some(Duration::from_secs(3600)),
        retain_bytes,
        full_wait: Duration::from_millis(100),
        ..LogConfig::default()
    };
    start(dev, Some(&fmt), cfg)
}

#[test]
fn on_full_refuse_fails_appends_with_log_full_and_keeps_every_acked_record() {
    let log = small_log(OnFull::Refuse);
    let part = log.create_partition("t", 0).expect("create");
    let mut acked = 0u64;
    let err = loop {
        match log.append_wait(part, vec![acked as u8; 4000]) {
            Ok(a) => {
                assert_eq!(a.offset, acked);
                acked += 1;
                assert!(
                    acked < 10_000,
                    "a 2 MiB log took {acked} records of 4000 bytes"
                );
            }
            Err(e) => break e,
        }
    };
    assert!(matches!(err, LogError::LogFull { .. }), "got {err}");
    assert!(err.to_string().contains("full"), "message: {err}");
    assert!(
        acked > 100,
        "only {acked} records fit before the log said full"
    );
    // Nothing acknowledged was dropped to make room.
    let view = log.partition(part).expect("partition");
    assert_eq!(view.start_offset, 0);
    assert_eq!(view.durable_end, acked);
    let first = log.read(part, 0, 1).expect("read");
    assert_eq!(first[0].payload, vec![0u8; 4000]);
    log.shutdown();
}

#[test]
fn on_full_drop_oldest_frees_the_oldest_records_instead() {
    let log = small_log(OnFull::DropOldest);
    let part = log.create_partition("t", 0).expect("create");
    for i in 0..2000u64 {
        let a = log.append_wait(part, vec![i as u8; 4000]).expect("append");
        assert_eq!(a.offset, i);
    }
    let view = log.partition(part).expect("partition");
    assert!(view.start_offset > 0, "nothing was dropped from a full log");
    assert_eq!(view.durable_end, 2000);
    let recs = log.read(part, view.start_offset, 1).expect("read oldest");
    assert_eq!(recs[0].payload, vec![view.start_offset as u8; 4000]);
    // Nothing had expired (records are kept an hour): every record dropped is counted.
    let stats = log.stats();
    assert!(stats.dropped_unexpired_batches > 0, "{stats:?}");
    assert!(
        stats.dropped_unexpired_bytes >= view.start_offset * 4000,
        "{} records of 4000 B dropped, counted {} B",
        view.start_offset,
        stats.dropped_unexpired_bytes
    );
    log.shutdown();
}

#[test]
fn retention_by_size_frees_space_before_drop_oldest_has_to() {
    // Keeping 512 KiB of a 2 MiB log: retention frees the oldest records long before the ring
    // is full, so drop-oldest never drops anything retention had not expired.
    let log = small_log_keeping(OnFull::DropOldest, Some(512 << 10));
    let part = log.create_partition("t", 0).expect("create");
    for i in 0..2000u64 {
        log.append_wait(part, vec![i as u8; 4000]).expect("append");
    }
    let view = log.partition(part).expect("partition");
    assert!(
        view.start_offset > 1000,
        "retention freed too little: {view:?}"
    );
    let stats = log.stats();
    assert_eq!(stats.dropped_unexpired_batches, 0, "{stats:?}");
    assert_eq!(stats.dropped_unexpired_bytes, 0, "{stats:?}");
    log.shutdown();
}

fn tempdir() -> std::path::PathBuf {
    let base = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let dir = base.join(format!(
        "log-threaded-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
fn reads_below_the_recovery_point_are_served_after_the_background_index_rebuild() {
    // A short recovery lag, so that most of the log lies below the recovery point at reopen.
    let cfg = LogConfig {
        recovery_lag: MIB,
        ..LogConfig::default()
    };
    let (dev, h) = sim(21, 64 * MIB);
    let log = start(dev, Some(&FormatOptions::default()), cfg.clone());
    let part = log.create_partition("t", 0).expect("create");
    for i in 0..3000u64 {
        let a = log.append_wait(part, vec![i as u8; 3000]).expect("append");
        assert_eq!(a.offset, i);
    }
    log.shutdown();
    h.power_cut();
    let dev = h.power_on();
    let (w, report) = recovery::open(dev, cfg.clone()).expect("reopen");
    let (from, to) = report
        .backfill
        .expect("most of the log lies below the recovery point");
    assert!(
        to - from > 4 * MIB,
        "only {} B below the recovery point",
        to - from
    );
    // Recovery itself read nothing below the recovery point.
    assert_eq!(report.indexed_bytes, 0);
    let log = Log::start(w, cfg.queue_capacity);
    let mut at = 0u64;
    while at < 3000 {
        let recs = log.read(part, at, 1 << 20).expect("read");
        assert!(!recs.is_empty(), "nothing served at offset {at}");
        for r in recs {
            assert_eq!(r.offset, at);
            assert_eq!(r.payload, vec![at as u8; 3000], "offset {at}");
            at += 1;
        }
    }
    let s = log.shared().lock();
    assert!(!s.backfill_pending);
    assert!(s.backfill_error.is_none());
    assert!(s.backfill_bytes >= to - from);
}

#[test]
fn the_scrub_finds_bit_rot_in_acknowledged_data_and_passes_a_clean_log() {
    let cfg = LogConfig {
        scrub_rate: 1 << 30,
        ..LogConfig::default()
    };
    let (dev, h) = sim(33, 64 * MIB);
    let log = start(dev, Some(&FormatOptions::default()), cfg);
    let part = log.create_partition("t", 0).expect("create");
    let mut positions = Vec::new();
    for i in 0..200u64 {
        positions.push(
            log.append_wait(part, vec![i as u8; 2000])
                .expect("append")
                .position,
        );
    }
    let shared = log.shared().clone();
    // A clean log: a full pass that started after the appends, nothing found.
    let p0 = shared.lock().scrub.passes;
    let s = shared.wait_until(Duration::from_secs(30), |s| s.scrub.passes >= p0 + 2);
    assert!(s.scrub.passes >= p0 + 2, "no scrub pass completed");
    assert!(s.scrub.damage.is_empty(), "clean log: {:?}", s.scrub.damage);
    assert!(s.scrub.bytes_checked > 200 * 2000);
    drop(s);
    // Rot one byte of record 150's payload on the medium.
    let at = nvmq_log::format::LOG_START + positions[150] + 48 + 100;
    h.flip_bit(at, 3);
    let s = shared.wait_until(Duration::from_secs(30), |s| !s.scrub.damage.is_empty());
    let found: Vec<u64> = s.scrub.damage.iter().map(|d| d.0).collect();
    assert_eq!(found.len(), 1, "damage reports: {:?}", s.scrub.damage);
    // Reported at the batch that holds the record.
    assert!(found[0] <= positions[150] && positions[150] - found[0] < (1 << 20));
    // Later passes find it again but report it once.
    let p1 = s.scrub.passes;
    drop(s);
    let s = shared.wait_until(Duration::from_secs(30), |s| s.scrub.passes >= p1 + 2);
    assert!(s.scrub.passes >= p1 + 2);
    assert_eq!(s.scrub.damage.len(), 1, "{:?}", s.scrub.damage);
    drop(s);
    log.shutdown();
}

#[test]
fn a_clean_shutdown_records_the_durable_point_in_the_superblock() {
    use nvmq_log::format::{superblock_offset, Superblock, SUPERBLOCK_LEN};
    let (dev, h) = sim(44, 64 * MIB);
    // Idle superblock updates far away: only the shutdown can write it.
    let log = start(
        dev,
        Some(&FormatOptions::default()),
        quiet_config(FlushMode::Always),
    );
    let part = log.create_partition("t", 0).expect("create");
    for i in 0..20 {
        log.append_wait(part, payload(1, i)).expect("append");
    }
    let durable = log.durable();
    log.shutdown();
    let newest = (0..2u8)
        .filter_map(|slot| {
            Superblock::decode(&h.peek(superblock_offset(slot), SUPERBLOCK_LEN), slot).ok()
        })
        .max_by_key(|sb| sb.sequence)
        .expect("a valid superblock");
    assert_eq!(newest.durable_through, durable);
}

#[test]
fn readers_never_take_the_queue_slots_a_batch_write_needs() {
    // A queue of 16: the writer's own I/Os (2 writes of up to 2 pieces, 2 flushes, a superblock:
    // 7) and room for one read (2) leave 7 slots for readers, and 32 threads read at once.
    let mut c = SimConfig::new(55, 64 * MIB);
    c.flush_latency = Latency::Fixed(Duration::from_micros(300));
    c.write_latency = Latency::Fixed(Duration::from_micros(100));
    c.queue_depth = 16;
    let (dev, _h) = SimDevice::new(c);
    let cfg = LogConfig {
        max_writes_in_flight: 2,
        max_flushes_in_flight: 2,
        // Reads go to the device.
        tail_cache_bytes: 0,
        scrub_rate: 0,
        ..LogConfig::default()
    };
    let log = Arc::new(start(dev, Some(&FormatOptions::default()), cfg));
    let part = log.create_partition("t", 0).expect("create");
    for i in 0..200u64 {
        log.append_wait(part, vec![i as u8; 1000]).expect("append");
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..32u64)
        .map(|t| {
            let (log, stop) = (log.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let at = (t * 37 + n * 13) % 200;
                    let recs = log.read(part, at, 1).expect("read");
                    assert_eq!(recs[0].payload, vec![at as u8; 1000]);
                    n += 1;
                }
                n
            })
        })
        .collect();
    for i in 200..1200u64 {
        let a = log
            .append_wait(part, vec![i as u8; 1000])
            .unwrap_or_else(|e| panic!("append {i} failed while readers read: {e}"));
        assert_eq!(a.offset, i);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads: u64 = readers.into_iter().map(|r| r.join().expect("reader")).sum();
    assert!(reads > 100, "only {reads} reads");
    assert!(log.fatal().is_none(), "{:?}", log.fatal());
}
