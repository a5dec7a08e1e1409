//! Huge partition counts through the real binary, as a new user would try them (issue 11):
//! `nvmq serve` on a file device, thousands of topics' partitions created with CreateTopics,
//! written past several checkpoints (each of many batches) and ring laps, deleted with
//! DeleteTopics; then a new producer still gets its acks, the broker's memory stays bounded,
//! SIGTERM stops it, and a restart finds the new topic alone.
//!
//! With every test: 100,000 partitions of 60-character names on a 512 MiB log (1.7 GiB written)
//! with everything hostile at once (`common::hostile`): 2,000 idle connections and 100 stalled
//! halfway through a frame from the start, and from the second lap on waves of clients that
//! pipeline large Fetches and never read, beside a normal producer. It prints the broker's memory
//! and queued bytes and bounds them by what the flags allow (about 25 s). Also 4,000 partitions
//! on a 32 MiB log of 64 KiB batches. The run of the report (20,000 partitions) is left to
//! `--ignored`:
//!
//! ```text
//! cargo test --release -p nvmq-tools --test suite many_partitions:: -- --include-ignored --nocapture
//! ```
//!
//! `frontend/tests/many_partitions.rs` runs 10,000 in-process on the sim device.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use frontend::client::Client;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::{CreateTopicsRequest, DeleteTopicsRequest, MetadataRequest};

use crate::common::hostile::{self, Crowd, Waves};
use crate::common::kafka::{connect, produce, tname};
use crate::common::Serving;

fn topic_name(i: usize) -> String {
    // 60 characters, as in the report.
    let n = format!("huge-partitions-topic-{i:06}-");
    format!("{n}{}", "x".repeat(60 - n.len()))
}

/// Creates `names` with `partitions` each, a few per request; the error codes of the topics
/// that failed.
async fn create_topics(c: &mut Client, names: &[String], partitions: i32) -> Vec<(String, i16)> {
    let mut failed = Vec::new();
    for chunk in names.chunks(10) {
        let mut req = CreateTopicsRequest::default();
        req.timeout_ms = 600_000;
        req.topics = chunk
            .iter()
            .map(|n| {
                let mut t = CreatableTopic::default();
                t.name = tname(n);
                t.num_partitions = partitions;
                t.replication_factor = 1;
                t
            })
            .collect();
        let resp = tokio::time::timeout(Duration::from_secs(600), c.call(4, &req))
            .await
            .expect("CreateTopics answered within 10 minutes")
            .expect("CreateTopics");
        for t in resp.topics {
            if t.error_code != 0 {
                failed.push((t.name.as_str().to_string(), t.error_code));
            }
        }
    }
    failed
}

async fn delete_topics(c: &mut Client, names: &[String]) -> Vec<(String, i16)> {
    let mut failed = Vec::new();
    for chunk in names.chunks(50) {
        let mut req = DeleteTopicsRequest::default();
        req.timeout_ms = 600_000;
        req.topic_names = chunk.iter().map(|n| tname(n)).collect();
        let resp = tokio::time::timeout(Duration::from_secs(600), c.call(3, &req))
            .await
            .expect("DeleteTopics answered within 10 minutes")
            .expect("DeleteTopics");
        for t in resp.responses {
            if t.error_code != 0 {
                let n = t.name.map(|n| n.as_str().to_string()).unwrap_or_default();
                failed.push((n, t.error_code));
            }
        }
    }
    failed
}

struct Plan {
    topics: usize,
    partitions: i32,
    /// `nvmq format` flags besides the device (the file is formatted before the first start).
    format: &'static [&'static str],
    /// Ring laps to write, over every partition in turn.
    laps: u64,
    record_size: usize,
    connections: usize,
    /// The most the broker's VmHWM may reach, in MiB.
    max_hwm_mib: u64,
    /// Hostile clients beside the load (see `hostile_laps`).
    hostile: bool,
}

/// The writers' share of the run: the topics, and the records written so far.
struct Load {
    names: Arc<Vec<String>>,
    partitions: i32,
    record_size: usize,
    written: Arc<AtomicU64>,
}

impl Load {
    /// Each client takes every n-th topic in turn, one Produce (one record to each of its
    /// partitions) at a time, until `goal` records are written in all. The clients come back
    /// (their connections stay open), with the first error of each that failed.
    async fn write(&self, clients: Vec<Client>, goal: u64) -> (Vec<Client>, Vec<String>) {
        let n = clients.len();
        let mut tasks = Vec::new();
        for (k, mut c) in clients.into_iter().enumerate() {
            let (names, written) = (self.names.clone(), self.written.clone());
            let (partitions, value) = (self.partitions, vec![b'v'; self.record_size]);
            tasks.push(tokio::spawn(async move {
                let mut i = k;
                while written.load(Ordering::Relaxed) < goal {
                    let topic = &names[i % names.len()];
                    match produce(&mut c, topic, partitions, &value).await {
                        Ok((_, errors)) if errors.is_empty() => {}
                        Ok((_, errors)) => {
                            let at = written.load(Ordering::Relaxed);
                            let e = format!("Produce to {topic} after {at} records: {errors:?}");
                            return (c, Err(e));
                        }
                        Err(e) => return (c, Err(e)),
                    }
                    written.fetch_add(partitions as u64, Ordering::Relaxed);
                    i += n;
                }
                (c, Ok(()))
            }));
        }
        let (mut clients, mut errors) = (Vec::new(), Vec::new());
        for t in tasks {
            let (c, r) = t.await.expect("a writer task");
            clients.push(c);
            errors.extend(r.err());
        }
        (clients, errors)
    }
}

/// Records of `size` bytes that fill `laps` of a log of `log_size` bytes: each takes its value,
/// the Kafka batch around it and the log's record header.
fn records_for(laps: f64, log_size: f64, size: usize) -> u64 {
    (laps * log_size) as u64 / (size as u64 + 120)
}

/// Broker memory in KiB: (VmRSS, VmHWM).
fn memory(serve: &Serving) -> (u64, u64) {
    (serve.status_kib("VmRSS:"), serve.status_kib("VmHWM:"))
}

fn run(plan: Plan) {
    let dir = crate::common::temp_dir("many-partitions");
    let img = dir.join("log.img");
    let device = crate::common::spec(&img);
    let mut args = vec!["format", "--device", &device];
    args.extend_from_slice(plan.format);
    let r = crate::common::nvmq(&args);
    assert_eq!(r.code, 0, "{r}");
    let mut flags = vec![
        "--device",
        &device,
        "--listen",
        "127.0.0.1:0",
        "--no-pin",
        "--log-level",
        "warn",
        "--metrics-addr",
        "127.0.0.1:0",
    ];
    if plan.hostile {
        flags.extend(hostile::SERVE_FLAGS);
    }
    let mut serve = crate::common::serve(&flags);
    let names: Vec<String> = (0..plan.topics).map(topic_name).collect();
    let total = plan.topics as u64 * plan.partitions as u64;
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let addr = serve.kafka.clone();
    let log_size = serve.metric("nvmq_log_free_bytes") + serve.metric("nvmq_log_used_bytes");
    // The idle and stalled connections come first and stay to the end.
    let crowd = plan.hostile.then(|| crowd(&serve));

    let t = Instant::now();
    let failed = rt.block_on(async {
        let mut c = connect(&addr, "creator").await;
        create_topics(&mut c, &names, plan.partitions).await
    });
    let created_in = t.elapsed();
    let (rss, hwm) = memory(&serve);
    println!(
        "created {} topics x {} partitions = {total} partitions in {:.1} s; the registry takes {:.1} MiB of checkpoint (budget {:.1} MiB); broker VmRSS {} MiB, VmHWM {} MiB",
        plan.topics,
        plan.partitions,
        created_in.as_secs_f64(),
        serve.metric("nvmq_registry_bytes") / 1048576.0,
        serve.metric("nvmq_checkpoint_budget_bytes") / 1048576.0,
        rss >> 10,
        hwm >> 10,
    );
    assert!(failed.is_empty(), "CreateTopics failed: {failed:?}");
    assert_eq!(serve.metric("nvmq_partitions"), (total + 2) as f64);

    // Write until the log has gone round the ring `laps` times; in a hostile run, the laps after
    // the first beside the non-readers.
    let load = Load {
        names: Arc::new(names),
        partitions: plan.partitions,
        record_size: plan.record_size,
        written: Arc::default(),
    };
    let before = serve.metric("nvmq_device_bytes_written_total") as u64;
    let (checkpoints_before, batches_before) = (
        serve.metric("nvmq_checkpoints_total"),
        serve.metric("nvmq_checkpoint_batches_total"),
    );
    let goal = |laps: u64| records_for(laps as f64, log_size, plan.record_size);
    let t = Instant::now();
    let writers = rt.block_on(async {
        let mut v = Vec::new();
        for _ in 0..plan.connections {
            v.push(connect(&addr, "writer").await);
        }
        v
    });
    let first_laps = if plan.hostile { 1 } else { plan.laps };
    let (writers, mut errors) = rt.block_on(load.write(writers, goal(first_laps)));
    if plan.hostile {
        let (rss, _) = memory(&serve);
        println!(
            "the first lap in {:.1} s beside the idle and stalled connections; broker VmRSS {} MiB",
            t.elapsed().as_secs_f64(),
            rss >> 10
        );
    }
    let mut last_wave = None;
    let writers = if plan.hostile && errors.is_empty() {
        let (writers, e, wave) = hostile_laps(&serve, &rt, &load, writers, goal(plan.laps), &plan);
        errors = e;
        last_wave = Some(wave);
        writers
    } else {
        writers
    };
    let w = serve.metric("nvmq_device_bytes_written_total") as u64 - before;
    let checkpoints = serve.metric("nvmq_checkpoints_total") - checkpoints_before;
    let batches = serve.metric("nvmq_checkpoint_batches_total") - batches_before;
    let (rss, hwm) = memory(&serve);
    println!(
        "wrote {} records, {} MiB of log ({:.1} ring laps) in {:.1} s: {checkpoints} checkpoints in {batches} batches (the newest {:.1} MiB); broker VmRSS {} MiB, VmHWM {} MiB",
        load.written.load(Ordering::Relaxed),
        w >> 20,
        w as f64 / log_size,
        t.elapsed().as_secs_f64(),
        serve.metric("nvmq_checkpoint_bytes") / 1048576.0,
        rss >> 10,
        hwm >> 10,
    );
    if !errors.is_empty() {
        let stopped = serve.terminate(Duration::from_secs(60));
        panic!(
            "writes stopped after {} MiB: {errors:?}; SIGTERM: {}\nserve stderr:\n{}",
            w >> 20,
            match stopped {
                Some(code) => format!("exited with {code}"),
                None => "ignored for 60 s".into(),
            },
            serve.stderr()
        );
    }
    drop(writers);
    assert!(
        w as f64 >= (plan.laps as f64 - 0.5) * log_size,
        "{w} B written"
    );
    assert!(checkpoints >= 3.0, "{checkpoints} checkpoints");
    assert!(
        batches >= 2.0 * checkpoints,
        "{batches} batches for {checkpoints} checkpoints"
    );

    let t = Instant::now();
    let failed = rt.block_on(async {
        let mut c = connect(&addr, "deleter").await;
        delete_topics(&mut c, &load.names).await
    });
    let (rss, hwm) = memory(&serve);
    println!(
        "deleted {} topics in {:.1} s; {} partitions left; broker VmRSS {} MiB, VmHWM {} MiB",
        load.names.len(),
        t.elapsed().as_secs_f64(),
        serve.metric("nvmq_partitions"),
        rss >> 10,
        hwm >> 10,
    );
    assert!(failed.is_empty(), "DeleteTopics failed: {failed:?}");
    let internal = if plan.hostile { 4.0 } else { 2.0 };
    assert_eq!(
        serve.metric("nvmq_partitions"),
        internal,
        "only the internal ones (and the hostile run's two topics)"
    );
    assert!(hwm >> 10 <= plan.max_hwm_mib, "VmHWM {hwm} KiB");

    // A new producer on a new topic gets every ack.
    let fresh = "after-the-deletes".to_string();
    rt.block_on(async {
        let mut c = connect(&addr, "fresh").await;
        assert!(create_topics(&mut c, std::slice::from_ref(&fresh), 1)
            .await
            .is_empty());
        for _ in 0..100 {
            let (_, errors) = produce(&mut c, &fresh, 1, &[b'v'; 100])
                .await
                .expect("an answer");
            assert!(errors.is_empty(), "{errors:?}");
        }
    });
    println!("a new producer got 100/100 acks");
    if let Some(wave) = last_wave {
        wave.closed(&serve);
    }
    drop(crowd);

    let t = Instant::now();
    let code = serve.terminate(Duration::from_secs(60));
    assert_eq!(code, Some(0), "SIGTERM: {}", serve.stderr());
    println!("SIGTERM: stopped in {:.1} s", t.elapsed().as_secs_f64());
    // Dropping the oldest records for room is expected (and said at warn); nothing else is.
    let stderr = serve.stderr();
    let trouble: Vec<&str> = stderr
        .lines()
        .filter(|l| {
            l.contains("ERROR") || l.contains("WARN") && !l.contains("on_full = drop-oldest")
        })
        .collect();
    assert!(trouble.is_empty(), "{trouble:#?}");

    // Restarted: the recovery reads the newest checkpoint (one batch again) and replays.
    let mut serve = crate::common::serve(&flags);
    let topics = rt.block_on(async {
        let mut c = connect(&serve.kafka, "after-restart").await;
        let mut md = MetadataRequest::default();
        md.topics = None;
        let resp = c.call(8, &md).await.expect("Metadata");
        resp.topics
            .into_iter()
            .filter_map(|t| t.name.map(|n| (n.as_str().to_string(), t.partitions.len())))
            .filter(|(n, _)| !HOSTILE_TOPICS.contains(&n.as_str()))
            .collect::<Vec<_>>()
    });
    let partitions = serve.metric("nvmq_partitions");
    assert_eq!(
        topics,
        vec![(fresh, 1)],
        "the topics (name, partitions) Metadata listed after the restart ({} in all; nvmq_partitions {partitions}); serve stderr:\n{}",
        topics.len(),
        serve.stderr()
    );
    assert_eq!(partitions, internal + 1.0);
    assert_eq!(serve.terminate(Duration::from_secs(60)), Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The normal producer's topic in the hostile run.
const NORMAL_TOPIC: &str = "normal-producer";
/// The topics the hostile run adds (kept to the end).
const HOSTILE_TOPICS: [&str; 2] = [NORMAL_TOPIC, hostile::TOPIC];

/// The idle and stalled connections, and what they cost the broker (checked and printed).
fn crowd(serve: &Serving) -> Crowd {
    let before = serve.status_kib("VmRSS:");
    let crowd = hostile::crowd(&serve.kafka);
    let n = hostile::IDLE + hostile::STALLED;
    let until = Instant::now() + Duration::from_secs(30);
    while serve.metric("nvmq_connections") < n as f64 {
        assert!(
            Instant::now() < until,
            "the broker never took {n} connections"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let grew = serve.status_kib("VmRSS:").saturating_sub(before) << 10;
    println!(
        "{} idle and {} stalled connections: broker RSS +{} MiB ({} B each)",
        hostile::IDLE,
        hostile::STALLED,
        grew >> 20,
        grew / n as u64
    );
    let bound = (n * hostile::CROWD_MEMORY) as u64;
    assert!(
        grew <= bound,
        "{grew} B for {n} connections, bound {bound} B"
    );
    crowd
}

/// Writes the laps after the first (to `goal` records in all) beside waves of non-readers (see
/// `hostile::Waves`) and a normal producer, then lets the normal producer produce beside the last
/// wave alone. The broker's peak memory and queued bytes are printed and bounded by what the
/// flags allow, and the normal producer is acknowledged all along. The last wave is left to the
/// write timeout (see `LastWave`).
fn hostile_laps(
    serve: &Serving,
    rt: &tokio::runtime::Runtime,
    load: &Load,
    writers: Vec<Client>,
    goal: u64,
    plan: &Plan,
) -> (Vec<Client>, Vec<String>, LastWave) {
    let metrics = serve.metrics.clone().expect("metrics address");
    let (base_rss, _) = memory(serve);
    let mut normal = rt.block_on(async {
        let mut c = connect(&serve.kafka, "normal").await;
        crate::common::kafka::auto_create(&mut c, NORMAL_TOPIC).await;
        c
    });
    let most_queued = Arc::new(AtomicU64::new(0));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (most, on, metrics) = (most_queued.clone(), sampling.clone(), metrics.clone());
        std::thread::spawn(move || {
            while on.load(Ordering::SeqCst) {
                let q =
                    crate::common::metric(&crate::common::scrape(&metrics), "nvmq_queued_bytes");
                most.fetch_max(q as u64, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let waves = Waves::start(&serve.kafka, &metrics);
    let writing = Arc::new(AtomicBool::new(true));
    let producer = {
        let writing = writing.clone();
        rt.spawn(async move {
            let (mut acks, mut slowest) = (0u64, Duration::ZERO);
            while writing.load(Ordering::SeqCst) {
                let t = Instant::now();
                let (_, errors) = produce(&mut normal, NORMAL_TOPIC, 1, b"normal")
                    .await
                    .expect("the normal producer's answer");
                assert!(errors.is_empty(), "{errors:?}");
                acks += 1;
                slowest = slowest.max(t.elapsed());
            }
            (normal, acks, slowest)
        })
    };
    let t = Instant::now();
    let (writers, errors) = rt.block_on(load.write(writers, goal));
    writing.store(false, Ordering::SeqCst);
    let (mut normal, acks, slowest) = rt.block_on(producer).expect("the normal producer");
    let (waves_ran, last_wave) = waves.stop();
    // Beside the last wave, alone now.
    let mut slowest_after = Duration::ZERO;
    rt.block_on(async {
        for _ in 0..50 {
            let t = Instant::now();
            let (_, errors) = produce(&mut normal, NORMAL_TOPIC, 1, b"normal")
                .await
                .expect("an answer");
            assert!(errors.is_empty(), "{errors:?}");
            slowest_after = slowest_after.max(t.elapsed());
        }
    });
    sampling.store(false, Ordering::SeqCst);
    sampler.join().expect("the sampler");
    let queued = most_queued.load(Ordering::Relaxed);
    let (rss, hwm) = memory(serve);
    println!(
        "beside {} idle, {} stalled and {waves_ran} waves of {} non-reading clients ({} pipelined 50 MB Fetches each) for {:.1} s: at most {:.1} MiB queued; broker VmRSS {} MiB (was {} MiB before the waves), VmHWM {} MiB; a normal producer got {acks} acks, the slowest in {} ms, then 50 more beside the last wave, the slowest in {} ms",
        hostile::IDLE,
        hostile::STALLED,
        hostile::NON_READERS,
        100,
        t.elapsed().as_secs_f64(),
        queued as f64 / 1048576.0,
        rss >> 10,
        base_rss >> 10,
        hwm >> 10,
        slowest.as_millis(),
        slowest_after.as_millis()
    );
    // What the broker held: one wave's non-readers at most (each its budget and one answer),
    // the stalled connections' partial frames, and the requests of the well-behaved ones.
    let requests =
        plan.connections * plan.partitions as usize * (plan.record_size + 128) + (1 << 20);
    let bound = hostile::NON_READERS * hostile::NON_READER_HOLDS
        + hostile::STALLED * hostile::STALLED_SENT
        + requests;
    assert!(
        queued as usize <= bound,
        "{queued} B queued, bound {bound} B"
    );
    // What the broker's memory grew by: one wave's non-readers at most (each its buffers and the
    // copies of the answer being made), the requests' bytes on top.
    let grown = hwm.saturating_sub(base_rss) << 10;
    let bound = (hostile::NON_READERS * hostile::NON_READER_MEMORY + requests) as u64;
    assert!(
        grown <= bound,
        "VmHWM {grown} B above the RSS before the waves, bound {bound} B"
    );
    assert!(acks > 0, "the normal producer got no ack beside the waves");
    // The normal producer did not wait for the non-readers to be closed.
    assert!(slowest < hostile::WRITE_TIMEOUT, "slowest ack {slowest:?}");
    assert!(
        slowest_after < hostile::WRITE_TIMEOUT,
        "slowest ack {slowest_after:?}"
    );

    let last = LastWave {
        clients: last_wave,
        until: Instant::now() + hostile::WRITE_TIMEOUT + Duration::from_secs(10),
    };
    (writers, errors, last)
}

/// The clients of the last wave of non-readers, still open when the writes ended.
struct LastWave {
    clients: Vec<std::net::TcpStream>,
    /// By when the broker must have closed them.
    until: Instant,
}

impl LastWave {
    /// Waits for the broker to close them after the write timeout (it may have by now: the run
    /// goes on meanwhile); the idle and stalled connections stay, and nothing else is open then.
    fn closed(self, serve: &Serving) {
        let stay = (hostile::IDLE + hostile::STALLED) as f64;
        let mut open = serve.metric("nvmq_connections");
        while open > stay && Instant::now() < self.until {
            std::thread::sleep(Duration::from_millis(100));
            open = serve.metric("nvmq_connections");
        }
        assert_eq!(open, stay, "the last wave's non-readers were not closed");
        drop(self.clients);
    }
}

/// The reported case: 200 topics x 100 partitions of 60-character names on a 512 MiB log
/// (before: every ack stopped after about 173 MB, with nothing in the log, DeleteTopics timed
/// out, a new producer got 0/100 and SIGTERM was ignored).
#[test]
#[ignore = "the 100,000 run covers it; run with --ignored (see the module docs)"]
fn twenty_thousand_partitions_as_reported() {
    run(Plan {
        topics: 200,
        partitions: 100,
        format: &["--size", "512M"],
        laps: 3,
        record_size: 1000,
        connections: 4,
        max_hwm_mib: 512,
        hostile: false,
    });
}

/// The issue's goal, with everything hostile at once: 100,000 partitions of 60-character names on
/// a 512 MiB log (a checkpoint of nine batches of 1 MiB), three ring laps (1.7 GiB written),
/// beside 2,000 idle connections and 100 stalled halfway through a frame from the start, and
/// waves of clients that never read their answers from the second lap.
#[test]
fn a_hundred_thousand_partitions_beside_hostile_clients() {
    run(Plan {
        topics: 1000,
        partitions: 100,
        format: &["--size", "512M"],
        laps: 3,
        record_size: 1000,
        connections: 4,
        max_hwm_mib: 1024,
        hostile: true,
    });
}

/// The same, smaller, with every test: 4,000 partitions, batches of 64 KiB (a checkpoint of six
/// of them), a 32 MiB log.
#[test]
fn four_thousand_partitions_on_a_small_log() {
    run(Plan {
        topics: 40,
        partitions: 100,
        format: &["--size", "34M", "--window", "1M", "--max-batch", "64K"],
        laps: 3,
        record_size: 500,
        connections: 4,
        max_hwm_mib: 512,
        hostile: false,
    });
}
