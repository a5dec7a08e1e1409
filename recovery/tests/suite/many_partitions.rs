//! Huge partition counts at the log's level (issue 11): a registry whose checkpoint spans many
//! batches is written past many checkpoints and ring laps and recovered whole; deleted
//! partitions leave the registry for good; a registry past its budget is refused with a clear
//! error; and appends the writer cannot write fail naming why, instead of waiting for ever,
//! which also lets a closing writer stop.

use std::collections::HashMap;
use std::sync::mpsc::{sync_channel as bounded, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blockdev::sim::{Latency, SimClock, SimConfig, SimDevice, SimHandle};
use blockdev::BlockDevice;
use nvmq_log::{Appended, FormatOptions, Log, LogConfig, LogError, Request, Writer};

use crate::stepped;
use stepped::drive_for;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// A sim device on the real clock with instant I/O, formatted with `fmt`.
fn sim(seed: u64, fmt: &FormatOptions) -> (SimDevice, SimHandle) {
    let log = fmt.log_size.unwrap_or(64 * MIB);
    let c = SimConfig::new(seed, log + 2 * MIB);
    let (mut dev, h) = SimDevice::new(c);
    nvmq_log::mkfs::format(&mut dev, fmt).expect("format");
    (dev, h)
}

fn start(dev: SimDevice, cfg: &LogConfig) -> Log {
    let (w, _) = recovery::open(dev, cfg.clone()).expect("open");
    Log::start(w, cfg.queue_capacity)
}

/// A topic name of 60 characters, as in the report.
fn topic(i: u32) -> String {
    let n = format!("many-partitions-{i:05}-");
    format!("{n}{}", "x".repeat(60 - n.len()))
}

type Waits = Vec<(u32, Receiver<Result<Appended, LogError>>)>;

/// Queues one append per partition; the answers come through the receivers.
fn append_round(log: &Log, ids: &[u32], payload: &dyn Fn(u32) -> Vec<u8>) -> Waits {
    ids.iter()
        .map(|&id| {
            let (tx, rx) = bounded(1);
            log.append(
                id,
                payload(id),
                Box::new(move |r| {
                    let _ = tx.send(r);
                }),
            )
            .expect("queued");
            (id, rx)
        })
        .collect()
}

/// Every append of a round acknowledged, within 30 s each: a writer that stalls fails the test
/// here instead of hanging it.
fn acked(waits: Waits) -> Vec<(u32, Appended)> {
    waits
        .into_iter()
        .map(|(id, rx)| {
            let r = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| {
                    panic!("no answer to an append to partition {id} in 30 s: the writer stalled")
                });
            (id, r.unwrap_or_else(|e| panic!("append to {id}: {e}")))
        })
        .collect()
}

fn payload_of(round: u64) -> impl Fn(u32) -> Vec<u8> {
    move |id| {
        let mut p = format!("round {round} partition {id} ").into_bytes();
        p.resize(200, b'.');
        p
    }
}

/// Before multi-batch checkpoints, a registry larger than one batch could never be checkpointed:
/// once the recovery point lagged by the configured bytes the writer wanted a checkpoint before
/// anything else, never wrote one, and every append waited for ever (the reported stall).
#[test]
fn a_registry_of_many_batches_is_checkpointed_past_many_laps_and_recovered() {
    let fmt = FormatOptions {
        window: 256 * KIB,
        max_batch: 16 * KIB as u32,
        log_size: Some(8 * MIB),
        format_id: None,
    };
    let cfg = LogConfig {
        recovery_lag: 512 * KIB,
        tail_cache_bytes: 0,
        scrub_rate: 0,
        ..LogConfig::default()
    };
    let (dev, h) = sim(1, &fmt);
    let log = start(dev, &cfg);
    // 3,000 partitions of 60-character names: a checkpoint of about 260 KB, 17 batches or more.
    let mut ids = Vec::new();
    for t in 0..30 {
        let got = log
            .create_partitions(&topic(t), &(0..100).collect::<Vec<u32>>())
            .expect("queued");
        ids.extend(got.into_iter().map(|r| r.expect("created")));
    }
    // Checkpoints taken while the registry was still growing are smaller; how many there were
    // depends on how the writer grouped the creates (a faster writer makes more, smaller
    // batches), so the size check below counts only those after it is full.
    let full = log.stats();
    let rounds = 24u64;
    for round in 0..rounds {
        for (id, a) in acked(append_round(&log, &ids, &payload_of(round))) {
            assert_eq!(a.offset, round, "partition {id}");
        }
    }
    let st = log.stats();
    let laps = log.durable() / (8 * MIB);
    println!(
        "{} partitions, {} checkpoints in {} batches (the newest {} B), {laps} ring laps",
        ids.len(),
        st.checkpoints,
        st.checkpoint_batches,
        st.checkpoint_bytes
    );
    assert!(laps >= 2, "{laps} laps");
    assert!(st.checkpoints >= 10, "{} checkpoints", st.checkpoints);
    assert!(
        st.checkpoint_bytes >= 15 * 16 * KIB,
        "{} B",
        st.checkpoint_bytes
    );
    // One checkpoint may have been under way at `full` (some of its batches counted before).
    let (batches, checkpoints) = (
        st.checkpoint_batches - full.checkpoint_batches,
        st.checkpoints - full.checkpoints,
    );
    assert!(
        checkpoints >= 5,
        "{checkpoints} checkpoints of the full registry"
    );
    assert!(
        batches >= 15 * (checkpoints - 1),
        "{checkpoints} checkpoints of the full registry in {batches} batches"
    );
    log.shutdown();

    // Recovery reads every batch of the checkpoint at the recovery point, then replays.
    h.power_cut();
    let log = start(h.power_on(), &cfg);
    let parts = log.partitions();
    assert_eq!(parts.len(), ids.len());
    for (id, _, _, _, end) in &parts {
        assert_eq!(*end, rounds, "partition {id}");
    }
    for &id in ids.iter().step_by(97) {
        let recs = log.read(id, rounds - 1, 1 << 20).expect("read");
        assert_eq!(recs[0].payload, payload_of(rounds - 1)(id));
    }
    // And it goes on from there.
    acked(append_round(&log, &ids, &payload_of(rounds)));
    log.shutdown();
}

/// DeleteTopics used to leave every log partition in the registry (the DeletePartition record
/// kind existed but was neither written nor replayed), so the checkpoint only ever grew.
#[test]
fn deleted_partitions_leave_the_registry_and_stay_deleted_across_recoveries() {
    let fmt = FormatOptions {
        window: 256 * KIB,
        max_batch: 16 * KIB as u32,
        log_size: Some(4 * MIB),
        format_id: None,
    };
    let cfg = LogConfig {
        recovery_lag: 256 * KIB,
        ..LogConfig::default()
    };
    let (dev, h) = sim(2, &fmt);
    let log = start(dev, &cfg);
    let ids: Vec<u32> = log
        .create_partitions(&topic(0), &(0..200).collect::<Vec<u32>>())
        .expect("queued")
        .into_iter()
        .map(|r| r.expect("created"))
        .collect();
    for round in 0..3 {
        acked(append_round(&log, &ids, &payload_of(round)));
    }
    let before = log.stats();
    let (gone, kept): (Vec<u32>, Vec<u32>) = ids.iter().partition(|&&id| id % 2 == 1);
    log.delete_partitions(&gone).expect("deleted");
    let after = log.stats();
    assert_eq!(after.registry_partitions, before.registry_partitions - 100);
    assert!(after.registry_bytes < before.registry_bytes);
    let check = |log: &Log| {
        let live: Vec<u32> = log.partitions().iter().map(|p| p.0).collect();
        assert_eq!(live, kept);
        for &id in &gone {
            assert!(log.partition_id(&topic(0), id).is_none());
            assert_eq!(
                log.read(id, 0, 1 << 20).unwrap_err(),
                LogError::UnknownPartition(id)
            );
            assert_eq!(
                log.append_wait(id, b"late".to_vec()).unwrap_err(),
                LogError::UnknownPartition(id)
            );
        }
        for &id in &kept {
            assert_eq!(log.partition(id).expect("kept").durable_end, 3);
        }
        // Deleting one twice is refused.
        assert_eq!(
            log.delete_partitions(&gone[..1]).unwrap_err(),
            LogError::UnknownPartition(gone[0])
        );
    };
    check(&log);
    log.shutdown();

    // Replayed from the records (no checkpoint since the deletes yet).
    h.power_cut();
    let log = start(h.power_on(), &cfg);
    check(&log);
    // Past several checkpoints: the checkpoint holds only the kept ones.
    for round in 3..40 {
        acked(append_round(&log, &kept, &payload_of(round)));
    }
    assert!(log.stats().checkpoints >= 3);
    log.shutdown();
    h.power_cut();
    let log = start(h.power_on(), &cfg);
    assert_eq!(log.partitions().len(), kept.len());
    // Ids are never reused.
    let fresh = log.create_partition("fresh", 0).expect("create");
    assert!(fresh >= 200, "id {fresh} reused");
    log.shutdown();
}

#[test]
fn creating_past_the_registry_budget_is_refused_with_a_clear_error() {
    let fmt = FormatOptions {
        window: 32 * KIB,
        max_batch: 8 * KIB as u32,
        log_size: Some(512 * KIB),
        format_id: None,
    };
    let cfg = LogConfig {
        recovery_lag: 16 * KIB,
        ..LogConfig::default()
    };
    let (dev, h) = sim(3, &fmt);
    let log = start(dev, &cfg);
    let name = "n".repeat(200);
    let mut made = Vec::new();
    let err = loop {
        match log.create_partition(&name, made.len() as u32) {
            Ok(id) => made.push(id),
            Err(e) => break e,
        }
        assert!(made.len() < 10_000, "never refused");
    };
    let LogError::RegistryFull {
        partitions,
        needed,
        budget,
    } = &err
    else {
        panic!("{err}");
    };
    println!("{err}");
    assert_eq!(*partitions, made.len());
    assert!(needed > budget);
    assert_eq!(*budget, log.stats().checkpoint_budget);
    assert!(err.to_string().contains("no room for another partition"));
    assert!(log.registry_room(&name, 1).is_err());
    assert!(log.registry_room("s", 0).is_ok());
    // The log goes on: appends are acknowledged past many checkpoints of the full registry.
    for round in 0..20 {
        acked(append_round(&log, &made, &payload_of(round)));
    }
    assert!(log.stats().checkpoints >= 5);
    log.shutdown();
    h.power_cut();
    let log = start(h.power_on(), &cfg);
    assert_eq!(log.partitions().len(), made.len());
    log.shutdown();
}

type Answers = Arc<Mutex<Vec<Result<Appended, LogError>>>>;

fn submit_append<D: BlockDevice>(w: &mut Writer<D>, partition: u32, answers: &Answers) {
    let a = answers.clone();
    w.submit(Request::Append {
        partition,
        payload: vec![7u8; 4000],
        span: 1,
        ack: Box::new(move |r| a.lock().unwrap().push(r)),
    });
}

/// A stepped writer on a virtual clock over a 1 MiB ring (64 KiB window, 16 KiB batches) with
/// one partition, whose id it returns with the device's handle and the config it opened with.
fn small_ring(
    flush_latency: Duration,
    stall_wait: Duration,
) -> (Writer<SimDevice>, SimClock, SimHandle, u32, LogConfig) {
    let mut c = SimConfig::new(4, 4 * MIB);
    c.clock = SimClock::virtual_at_zero();
    c.flush_latency = Latency::Fixed(flush_latency);
    let clock = c.clock.clone();
    let (mut dev, h) = SimDevice::new(c);
    let fmt = FormatOptions {
        window: 64 * KIB,
        max_batch: 16 * KIB as u32,
        log_size: Some(MIB),
        format_id: None,
    };
    nvmq_log::mkfs::format(&mut dev, &fmt).expect("format");
    let cfg = LogConfig {
        recovery_lag: 64 * KIB,
        tail_cache_bytes: 0,
        scrub_rate: 0,
        stall_wait,
        ..LogConfig::default()
    };
    let (mut w, _) = recovery::open(dev, cfg.clone()).expect("open");
    let answers: Answers = Arc::default();
    let created = answers.clone();
    w.submit(Request::CreatePartition {
        topic: "t".into(),
        index: 0,
        ack: Box::new(move |r| created.lock().unwrap().push(r)),
    });
    assert!(drive_for(&mut w, &clock, Duration::from_secs(30), |_| {
        !answers.lock().unwrap().is_empty()
    }));
    let id = answers.lock().unwrap()[0]
        .clone()
        .expect("created")
        .partition;
    (w, clock, h, id, cfg)
}

/// A log whose recovery point is above its head, reopened with the index below the recovery
/// point never rebuilt: retention frees nothing until it is, so once the ring is full the
/// writer can write nothing. (The stall of the report had another cause, a checkpoint that could
/// not be written; the watchdog is the same for every cause.)
fn stalled_writer(stall_wait: Duration) -> (Writer<SimDevice>, SimClock, u32) {
    let (mut w, clock, h, id, cfg) = small_ring(Duration::from_micros(100), stall_wait);
    // Half a ring: the recovery point moves above the head.
    let answers: Answers = Arc::default();
    for _ in 0..128 {
        submit_append(&mut w, id, &answers);
    }
    assert!(drive_for(&mut w, &clock, Duration::from_secs(5), |w| w.is_idle()));
    drop(w);
    h.power_cut();
    let (mut w, report) = recovery::open(h.power_on(), cfg).expect("reopen");
    assert!(report.backfill.is_some(), "{report}");
    // Never run, so never installed.
    assert!(w.take_backfill().is_some());
    (w, clock, id)
}

/// Before the watchdog, appends the writer could not write waited for ever, with nothing in the
/// log, and a closing writer never became idle (so SIGTERM was ignored: the broker's stop waits
/// for its writers).
#[test]
fn appends_the_writer_cannot_write_fail_naming_why_and_a_closing_writer_stops() {
    let (mut w, clock, id) = stalled_writer(Duration::from_secs(2));
    let answers: Answers = Arc::default();
    for _ in 0..256 {
        submit_append(&mut w, id, &answers);
    }
    let answered = |answers: &Answers| answers.lock().unwrap().len() == 256;
    assert!(
        drive_for(&mut w, &clock, Duration::from_secs(30), |_| answered(
            &answers
        )),
        "{} of 256 appends answered in 30 s",
        answers.lock().unwrap().len()
    );
    let results = answers.lock().unwrap().clone();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let stalled: Vec<&LogError> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(ok > 0 && !stalled.is_empty(), "{ok} acknowledged");
    for e in &stalled {
        let LogError::Stalled { waited_ms, why } = e else {
            panic!("{e}");
        };
        assert!(*waited_ms >= 2000);
        assert!(
            why.contains("until the index below the recovery point"),
            "{why}"
        );
    }
    println!("{ok} acknowledged, then: {}", stalled[0]);

    // Closing with appends waiting that can never be written: the writer still stops.
    let more: Answers = Arc::default();
    for _ in 0..8 {
        submit_append(&mut w, id, &more);
    }
    w.close();
    assert!(
        drive_for(&mut w, &clock, Duration::from_secs(30), |w| w.is_idle()),
        "the closing writer did not become idle"
    );
    let more = more.lock().unwrap();
    assert_eq!(more.len(), 8, "every waiting append answered");
    assert!(
        more.iter()
            .all(|r| matches!(r, Err(LogError::Stalled { .. } | LogError::Shutdown))),
        "{more:?}"
    );
}

/// The same through the threaded `Log`: a shutdown (what SIGTERM does) returns although appends
/// wait that can never be written.
#[test]
fn a_log_shuts_down_while_appends_wait_that_cannot_be_written() {
    let (w, _clock, id) = stalled_writer(Duration::from_millis(500));
    // The writer thread steps on the real clock; the device's virtual one moves as it waits.
    let log = Log::start(w, 64);
    let mut waits = Vec::new();
    for _ in 0..400 {
        let (tx, rx) = bounded(1);
        log.append(
            id,
            vec![1u8; 4000],
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )
        .expect("queued");
        waits.push(rx);
    }
    let t = Instant::now();
    let mut errors: HashMap<String, usize> = HashMap::new();
    for rx in waits {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => *errors.entry(e.to_string()).or_default() += 1,
            Err(_) => panic!("an append got no answer in 20 s"),
        }
    }
    assert!(!errors.is_empty());
    assert!(
        errors
            .keys()
            .all(|e| e.contains("could not write for") || e.contains("shut down")),
        "{errors:?}"
    );
    let t = t.elapsed();
    assert!(t < Duration::from_secs(10), "{t:?}");
    let (tx, rx) = bounded(1);
    log.append(
        id,
        vec![1u8; 4000],
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    )
    .expect("queued");
    let t = Instant::now();
    log.shutdown();
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(rx.recv().expect("answered").is_err());
}

/// The watchdog counts every kind of I/O in flight: appends that wait only for a slow
/// superblock flush (the head moving, on a ring that wraps) are not stalled, however long the
/// device takes. It once looked at batch writes alone, and failed such appends as "stalled".
#[test]
fn a_slow_flush_is_not_a_stall() {
    let (mut w, clock, _h, id, _) = small_ring(Duration::from_secs(3), Duration::from_secs(1));
    // Three laps of the ring, each append waiting behind 3-second flushes.
    let answers: Answers = Arc::default();
    for _ in 0..768 {
        submit_append(&mut w, id, &answers);
    }
    assert!(
        drive_for(&mut w, &clock, Duration::from_secs(3600), |_| answers
            .lock()
            .unwrap()
            .len()
            == 768),
        "{} of 768 answered",
        answers.lock().unwrap().len()
    );
    let failed: Vec<String> = answers
        .lock()
        .unwrap()
        .iter()
        .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
        .collect();
    assert!(
        failed.is_empty(),
        "{} failed, first: {}",
        failed.len(),
        failed[0]
    );
}

/// With flush = always, a checkpoint of several batches takes one flush, issued once its last
/// batch is written: the parts before it carry no acknowledgement, and only the last one lets the
/// recovery point move. (Each part used to get a flush of its own.)
#[test]
fn a_checkpoint_of_several_batches_takes_one_flush() {
    let (mut w, clock, _h, _, _) = small_ring(Duration::from_micros(100), Duration::from_secs(10));
    // 300 partitions of 60-character names: a registry of about 25 KB, two 16 KiB batches.
    let answers: Answers = Arc::default();
    for i in 0..300 {
        let a = answers.clone();
        w.submit(Request::CreatePartition {
            topic: topic(1),
            index: i,
            ack: Box::new(move |r| a.lock().unwrap().push(r)),
        });
    }
    assert!(drive_for(
        &mut w,
        &clock,
        Duration::from_secs(30),
        |_| answers.lock().unwrap().len() == 300
    ));
    let id = answers.lock().unwrap()[5]
        .clone()
        .expect("created")
        .partition;
    assert!(drive_for(&mut w, &clock, Duration::from_secs(30), |w| w.is_idle()));
    let before = w.shared().lock().stats;
    // One append at a time, each acknowledged before the next: each takes one flush at most.
    let appends = 200u64;
    for i in 0..appends {
        let done: Answers = Arc::default();
        submit_append(&mut w, id, &done);
        assert!(
            drive_for(&mut w, &clock, Duration::from_secs(30), |w| !done
                .lock()
                .unwrap()
                .is_empty()
                && w.is_idle()),
            "append {i}"
        );
        assert!(done.lock().unwrap()[0].is_ok());
    }
    let after = w.shared().lock().stats;
    let checkpoints = after.checkpoints - before.checkpoints;
    let parts = after.checkpoint_batches - before.checkpoint_batches;
    let flushes = after.flushes - before.flushes;
    let superblocks = after.superblock_writes - before.superblock_writes;
    println!("{appends} appends, {checkpoints} checkpoints in {parts} batches, {superblocks} superblocks: {flushes} flushes");
    assert!(
        checkpoints >= 3 && parts >= 2 * checkpoints,
        "{checkpoints} in {parts}"
    );
    assert!(
        flushes <= appends + superblocks + checkpoints,
        "{flushes} flushes for {appends} appends, {superblocks} superblocks and {checkpoints} \
         checkpoints of {parts} batches"
    );
}
