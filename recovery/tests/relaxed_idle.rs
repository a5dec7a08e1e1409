//! The relaxed flush modes when writes stop. Readers see only flushed data (below D), so:
//! - `flush = never` must flush the end of a burst once the writer goes quiet; before, records
//!   appended after the last window-filling flush stayed invisible to readers for as long as
//!   nothing more was written;
//! - `flush = interval:<ms>` must have its owner back when the interval falls due, or an idle
//!   writer flushed only at its next idle wake-up (100 ms), past the loss window it prints.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blockdev::sim::{Latency, SimConfig, SimDevice};
use nvmq_log::config::{FlushMode, FormatOptions, LogConfig};
use nvmq_log::{Doorbell, Log, Turn};

const MIB: u64 = 1 << 20;

fn device(seed: u64) -> SimDevice {
    let mut c = SimConfig::new(seed, 64 * MIB);
    c.flush_latency = Latency::Fixed(Duration::from_micros(300));
    let (mut dev, _h) = SimDevice::new(c);
    nvmq_log::mkfs::format(&mut dev, &FormatOptions::default()).expect("format");
    dev
}

fn config(flush: FlushMode) -> LogConfig {
    LogConfig {
        flush,
        // No superblock update (which flushes too) while the test waits.
        idle_superblock: Duration::from_secs(3600),
        ..LogConfig::default()
    }
}

#[test]
fn flush_never_makes_the_end_of_a_burst_visible_once_writes_stop() {
    let cfg = config(FlushMode::Never);
    let (w, _) = recovery::open(device(1), cfg.clone()).expect("open");
    let log = Log::start(w, cfg.queue_capacity);
    let part = log.create_partition("t", 0).expect("create");
    for i in 0..5u8 {
        log.append_wait(part, vec![i; 100]).expect("append");
    }
    // Acknowledged at write completion; readers get them once a flush covers them.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = 0;
    while Instant::now() < deadline {
        // The partition itself is known to readers only once its creation is flushed too.
        seen = log.read(part, 0, 1 << 20).map_or(0, |r| r.len());
        if seen == 5 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(seen, 5, "the burst's records never became readable");
    log.shutdown();
}

struct NoBell;
impl Doorbell for NoBell {
    fn ring(&self) {}
}

#[test]
fn an_idle_writer_in_interval_mode_asks_to_be_back_when_its_flush_falls_due() {
    let interval = Duration::from_millis(40);
    let cfg = config(FlushMode::Interval(interval));
    let (w, _) = recovery::open(device(2), cfg.clone()).expect("open");
    let (log, mut host) = Log::hosted(w, cfg.queue_capacity, Arc::new(NoBell));
    // The owner: turns the writer and notes every wait it asks for after the ack, with D and
    // whether I/O was in flight then (the ack comes at write completion, before any flush in
    // this mode).
    let asked: Arc<Mutex<Vec<(Duration, u64, bool)>>> = Arc::default();
    let acked = Arc::new(AtomicUsize::new(0));
    let owner = {
        let (asked, acked) = (asked.clone(), acked.clone());
        std::thread::spawn(move || loop {
            match host.turn() {
                Turn::Moved => {}
                Turn::Idle {
                    after,
                    io_in_flight,
                } => {
                    if acked.load(Ordering::SeqCst) == 1 {
                        let at = (after, host.durable(), io_in_flight);
                        asked.lock().expect("lock").push(at);
                    }
                    std::thread::sleep(after.min(Duration::from_millis(1)));
                }
                Turn::Stopped => return,
            }
        })
    };
    let part = log.create_partition("t", 0).expect("create");
    let d0 = log.durable();
    let a = acked.clone();
    log.append(
        part,
        vec![7; 100],
        Box::new(move |r| {
            r.expect("append");
            a.store(1, Ordering::SeqCst);
        }),
    )
    .expect("append");
    let deadline = Instant::now() + Duration::from_secs(10);
    while log.durable() == d0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(log.durable() > d0, "no flush followed the ack");
    log.shutdown();
    owner.join().expect("owner thread");
    let asked: Vec<Duration> = asked
        .lock()
        .expect("lock")
        .iter()
        // Waiting with nothing on the device (a flush in flight wakes it on completion).
        .filter(|(_, d, io)| *d == d0 && !io)
        .map(|(a, _, _)| *a)
        .collect();
    assert!(!asked.is_empty(), "the writer never idled before its flush");
    assert!(
        asked.iter().all(|a| *a <= interval),
        "an idle writer holding unflushed data asked to sleep past its {interval:?} interval: {asked:?}"
    );
}
