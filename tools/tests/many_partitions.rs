//! Huge partition counts through the real binary, as a new user would try them (issue 11):
//! `nvmq serve` on a file device, thousands of topics' partitions created with CreateTopics,
//! written past several checkpoints (each of many batches) and ring laps, deleted with
//! DeleteTopics; then a new producer still gets its acks, the broker's memory stays bounded,
//! SIGTERM stops it, and a restart finds the new topic alone.
//!
//! With every test: 100,000 partitions of 60-character names on a 512 MiB log (about 20 s and
//! 1.7 GiB written), and 4,000 on a 32 MiB log of 64 KiB batches. The run of the report (20,000
//! partitions) is left to `--ignored`:
//!
//! ```text
//! cargo test --release -p nvmq-tools --test many_partitions -- --include-ignored --nocapture
//! ```
//!
//! `frontend/tests/many_partitions.rs` runs 10,000 in-process on the sim device.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use bytes::Bytes;
use frontend::client::{record_batch, Client};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    CreateTopicsRequest, DeleteTopicsRequest, MetadataRequest, ProduceRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;

mod common;

/// How long one request may wait for its answer before the run calls the broker stalled.
const ANSWER_WAIT: Duration = Duration::from_secs(60);

struct Serve {
    child: Child,
    kafka: String,
    metrics: String,
    stderr: PathBuf,
}

impl Serve {
    fn start(device: &str, dir: &Path) -> Serve {
        let stderr = dir.join("serve.stderr");
        let err = std::fs::File::create(&stderr).expect("stderr file");
        let mut child = Command::new(env!("CARGO_BIN_EXE_nvmq"))
            .args([
                "serve",
                "--device",
                device,
                "--listen",
                "127.0.0.1:0",
                "--no-pin",
                "--log-level",
                "warn",
                "--metrics-addr",
                "127.0.0.1:0",
            ])
            .env_remove("RUST_LOG")
            .env_remove("NVMQ_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err))
            .spawn()
            .expect("start nvmq serve");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let (mut kafka, mut metrics, mut sent) = (None, None, false);
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                println!("serve: {line}");
                if let Some(a) = line.strip_prefix("metrics on http://") {
                    metrics = a.strip_suffix("/metrics").map(str::to_string);
                }
                if let Some(a) = line.strip_prefix("nvmq serving Kafka on ") {
                    kafka = a.split(' ').next().map(str::to_string);
                }
                if let (false, Some(k), Some(m)) = (sent, &kafka, &metrics) {
                    let _ = tx.send((k.clone(), m.clone()));
                    sent = true;
                }
            }
        });
        let (kafka, metrics) = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("serve printed its Kafka and metrics addresses");
        Serve {
            child,
            kafka,
            metrics,
            stderr,
        }
    }

    /// A value of the broker's Prometheus scrape.
    fn metric(&self, series: &str) -> f64 {
        let mut s = TcpStream::connect(&self.metrics).expect("connect to /metrics");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .expect("send the scrape");
        let mut body = String::new();
        s.read_to_string(&mut body).expect("read the scrape");
        body.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("no {series} in:\n{body}"))
            .parse()
            .expect("a number")
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// (VmRSS, VmHWM) in MiB.
    fn memory(&self) -> (u64, u64) {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        let kib = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        (kib("VmRSS:") >> 10, kib("VmHWM:") >> 10)
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// SIGTERM, then up to `wait` for a clean exit; the exit code, or None if it did not stop.
    fn terminate(&mut self, wait: Duration) -> Option<i32> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        let until = Instant::now() + wait;
        while Instant::now() < until {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st.code().unwrap_or(-1));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn topic_name(i: usize) -> String {
    // 60 characters, as in the report.
    let n = format!("huge-partitions-topic-{i:06}-");
    format!("{n}{}", "x".repeat(60 - n.len()))
}

fn tname(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

async fn connect(addr: &str) -> Client {
    Client::connect(addr, "many-partitions")
        .await
        .expect("connect")
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

/// One Produce of one record of `size` bytes to every partition of `topic`, acks=all: the
/// partition error codes that are not 0.
async fn produce_all(
    c: &mut Client,
    topic: &str,
    partitions: i32,
    size: usize,
) -> Result<Vec<i16>, String> {
    let value = vec![b'v'; size];
    let records = Bytes::from(record_batch(&[&value], None));
    let mut td = TopicProduceData::default();
    td.name = tname(topic);
    td.partition_data = (0..partitions)
        .map(|i| {
            let mut p = PartitionProduceData::default();
            p.index = i;
            p.records = Some(records.clone());
            p
        })
        .collect();
    let mut req = ProduceRequest::default();
    req.acks = -1;
    req.timeout_ms = 30_000;
    req.topic_data = vec![td];
    let resp = tokio::time::timeout(ANSWER_WAIT, c.call(7, &req))
        .await
        .map_err(|_| format!("no answer to a Produce to {topic} within {ANSWER_WAIT:?}"))?
        .map_err(|e| format!("Produce to {topic}: {e}"))?;
    Ok(resp
        .responses
        .iter()
        .flat_map(|t| t.partition_responses.iter().map(|p| p.error_code))
        .filter(|&e| e != 0)
        .collect())
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
}

fn run(plan: Plan) {
    let dir = common::temp_dir("many-partitions");
    let img = dir.join("log.img");
    let device = common::spec(&img);
    let mut args = vec!["format", "--device", &device];
    args.extend_from_slice(plan.format);
    let r = common::nvmq(&args);
    assert_eq!(r.code, 0, "{r}");
    let mut serve = Serve::start(&device, &dir);
    let names: Vec<String> = (0..plan.topics).map(topic_name).collect();
    let total = plan.topics as u64 * plan.partitions as u64;
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let addr = serve.kafka.clone();
    let log_size = serve.metric("nvmq_log_free_bytes") + serve.metric("nvmq_log_used_bytes");

    let t = Instant::now();
    let failed = rt.block_on(async {
        let mut c = connect(&addr).await;
        create_topics(&mut c, &names, plan.partitions).await
    });
    let created_in = t.elapsed();
    let (rss, hwm) = serve.memory();
    println!(
        "created {} topics x {} partitions = {total} partitions in {:.1} s; the registry takes {:.1} MiB of checkpoint (budget {:.1} MiB); broker VmRSS {rss} MiB, VmHWM {hwm} MiB",
        plan.topics,
        plan.partitions,
        created_in.as_secs_f64(),
        serve.metric("nvmq_registry_bytes") / 1048576.0,
        serve.metric("nvmq_checkpoint_budget_bytes") / 1048576.0,
    );
    assert!(failed.is_empty(), "CreateTopics failed: {failed:?}");
    assert_eq!(serve.metric("nvmq_partitions"), (total + 2) as f64);

    // Write: each connection takes every n-th topic in turn, one Produce (one record to each of
    // its partitions) at a time, until the log has gone round the ring `laps` times.
    let goal = (plan.laps as f64 * log_size) as u64;
    let before = serve.metric("nvmq_device_bytes_written_total") as u64;
    let (checkpoints_before, batches_before) = (
        serve.metric("nvmq_checkpoints_total"),
        serve.metric("nvmq_checkpoint_batches_total"),
    );
    let written = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let outcome: Vec<Result<(), String>> = rt.block_on(async {
        let mut tasks = Vec::new();
        for conn in 0..plan.connections {
            let names = names.clone();
            let written = written.clone();
            let addr = addr.clone();
            let (partitions, size, conns) = (plan.partitions, plan.record_size, plan.connections);
            // Each record takes its value, the Kafka batch around it and the log's record
            // header; the connections share the goal.
            let goal = goal / (size as u64 + 120);
            tasks.push(tokio::spawn(async move {
                let mut c = connect(&addr).await;
                let mut i = conn;
                while written.load(Ordering::Relaxed) < goal {
                    let topic = &names[i % names.len()];
                    let errors = produce_all(&mut c, topic, partitions, size).await?;
                    if !errors.is_empty() {
                        return Err(format!(
                            "Produce to {topic} after {} records: errors {errors:?}",
                            written.load(Ordering::Relaxed)
                        ));
                    }
                    written.fetch_add(partitions as u64, Ordering::Relaxed);
                    i += conns;
                }
                Ok(())
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap_or_else(|e| Err(format!("task: {e}"))));
        }
        out
    });
    let w = serve.metric("nvmq_device_bytes_written_total") as u64 - before;
    let checkpoints = serve.metric("nvmq_checkpoints_total") - checkpoints_before;
    let batches = serve.metric("nvmq_checkpoint_batches_total") - batches_before;
    let (rss, hwm) = serve.memory();
    println!(
        "wrote {} records, {} MiB of log ({:.1} ring laps) in {:.1} s: {checkpoints} checkpoints in {batches} batches (the newest {:.1} MiB); broker VmRSS {rss} MiB, VmHWM {hwm} MiB",
        written.load(Ordering::Relaxed),
        w >> 20,
        w as f64 / log_size,
        t.elapsed().as_secs_f64(),
        serve.metric("nvmq_checkpoint_bytes") / 1048576.0,
    );
    let errors: Vec<&String> = outcome.iter().filter_map(|r| r.as_ref().err()).collect();
    if !errors.is_empty() {
        let stderr = serve.stderr_text();
        let stopped = serve.terminate(Duration::from_secs(60));
        panic!(
            "writes stopped after {} MiB: {errors:?}; SIGTERM: {}\nserve stderr:\n{stderr}",
            w >> 20,
            match stopped {
                Some(code) => format!("exited with {code}"),
                None => "ignored for 60 s".into(),
            }
        );
    }
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
        let mut c = connect(&addr).await;
        delete_topics(&mut c, &names).await
    });
    let (rss, hwm) = serve.memory();
    println!(
        "deleted {} topics in {:.1} s; {} partitions left; broker VmRSS {rss} MiB, VmHWM {hwm} MiB",
        names.len(),
        t.elapsed().as_secs_f64(),
        serve.metric("nvmq_partitions")
    );
    assert!(failed.is_empty(), "DeleteTopics failed: {failed:?}");
    assert_eq!(
        serve.metric("nvmq_partitions"),
        2.0,
        "only the internal ones"
    );
    assert!(hwm <= plan.max_hwm_mib, "VmHWM {hwm} MiB");

    // A new producer on a new topic gets every ack.
    let fresh = "after-the-deletes".to_string();
    rt.block_on(async {
        let mut c = connect(&addr).await;
        assert!(create_topics(&mut c, std::slice::from_ref(&fresh), 1)
            .await
            .is_empty());
        for _ in 0..100 {
            let errors = produce_all(&mut c, &fresh, 1, 100)
                .await
                .expect("an answer");
            assert!(errors.is_empty(), "{errors:?}");
        }
    });
    println!("a new producer got 100/100 acks");

    let t = Instant::now();
    let code = serve.terminate(Duration::from_secs(60));
    assert_eq!(code, Some(0), "SIGTERM: {}", serve.stderr_text());
    println!("SIGTERM: stopped in {:.1} s", t.elapsed().as_secs_f64());
    // Dropping the oldest records for room is expected (and said at warn); nothing else is.
    let stderr = serve.stderr_text();
    let trouble: Vec<&str> = stderr
        .lines()
        .filter(|l| {
            l.contains("ERROR") || l.contains("WARN") && !l.contains("on_full = drop-oldest")
        })
        .collect();
    assert!(trouble.is_empty(), "{trouble:#?}");

    // Restarted: the recovery reads the newest checkpoint (one batch again) and replays.
    let mut serve = Serve::start(&device, &dir);
    let topics = rt.block_on(async {
        let mut c = connect(&serve.kafka).await;
        let mut md = MetadataRequest::default();
        md.topics = None;
        let resp = c.call(8, &md).await.expect("Metadata");
        resp.topics
            .into_iter()
            .filter_map(|t| t.name.map(|n| (n.as_str().to_string(), t.partitions.len())))
            .collect::<Vec<_>>()
    });
    assert_eq!(topics, vec![(fresh, 1)]);
    assert_eq!(serve.metric("nvmq_partitions"), 3.0);
    assert_eq!(serve.terminate(Duration::from_secs(60)), Some(0));
    let _ = std::fs::remove_dir_all(&dir);
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
    });
}

/// The issue's goal: 100,000 partitions of 60-character names on a 512 MiB log (a checkpoint
/// of nine batches of 1 MiB), three ring laps (1.7 GiB written): about 20 s, debug or release,
/// on the 2-core development machine.
#[test]
fn a_hundred_thousand_partitions() {
    run(Plan {
        topics: 1000,
        partitions: 100,
        format: &["--size", "512M"],
        laps: 3,
        record_size: 1000,
        connections: 4,
        max_hwm_mib: 1024,
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
    });
}
