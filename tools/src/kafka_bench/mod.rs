//! `nvmq kafka-bench`: a lean Kafka load generator measuring a broker in another process (an
//! `nvmq serve`, durable or `--ceiling`). Scenarios: closed-loop and pipelined producers of one
//! record per Produce, batched producers (one RecordBatch of many records per Produce), an
//! end-to-end run (producers and a tailing consumer: produce-to-consume latency), a catch-up read
//! of a filled partition, and many connections with the broker's memory. acks=all throughout.
//!
//! `load.rs` is the client loop, `wire.rs` the frames and the in-place answer parsing, `e2e.rs`
//! the produce-to-consume table, `report.rs` the table and JSON, `scenario.rs` the scenario
//! strings.

pub(crate) mod dial;
mod e2e;
mod load;
mod report;
mod scenario;
mod wire;

pub(crate) use wire::error_name;

use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    BrokerId, CreateTopicsRequest, ListOffsetsRequest, MetadataRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use dial::Dial;
use e2e::E2e;
use load::{FetchTask, ProduceTask, Task, Totals, Window};
use report::{CatchupFigures, E2eFigures, Latency, Line, Memory, Report};
use scenario::Scenario;

/// Connections and records per request of the catch-up scenario's fill.
const FILL_CONNS: usize = 8;
const FILL_BATCH: usize = 1000;
/// The e2e consumer's Fetch: long poll of 500 ms for at least one byte.
const E2E_MAX_WAIT_MS: i32 = 500;
const E2E_FETCH_BYTES: i32 = 1 << 20;
const TOPIC_TIMEOUT_MS: i32 = 30_000;

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "Examples:\n  \
    nvmq serve --device file:./nvmq-data/bench-serve.img --listen 127.0.0.1:9092 &\n  \
    nvmq kafka-bench --broker 127.0.0.1:9092 --scenario closed:1,closed:64,batched:64x100\n  \
    nvmq kafka-bench --scenario e2e:8,catchup:1000000 --json\n  \
    nvmq kafka-bench --scenario conns:1024 --server-pid $(pgrep -n nvmq)\n\n\
Scenarios (comma-separated, run in order; each prints one line):\n  \
    closed:N          N connections, one Produce of one record in flight each\n  \
    pipelined:CxW     C connections, W Produce requests in flight each\n  \
    batched:NxR       N connections, closed loop, R records per Produce (records/s)\n  \
    e2e:N             N closed-loop producers on one partition and a tailing consumer: ack to\n                    \
    receive and send to receive latency\n  \
    catchup[:R]       fill one partition with R records (--catchup-records), then read it from\n                    \
    its start with one consumer: records/s and MB/s\n  \
    conns[:N]         N connections (1024), all closed loop; with --server-pid, the broker's\n                    \
    VmRSS/VmHWM before and after and per connection\n\
Every figure comes from answers received in the window after a warm-up of a fifth of --duration \
(catchup: the whole read).")]
pub struct KafkaBenchArgs {
    /// The broker to measure (host:port): an `nvmq serve` (or any Kafka broker) in another
    /// process.
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub broker: String,
    /// Scenarios to run, in order (see below).
    #[arg(
        long = "scenario",
        value_delimiter = ',',
        default_value = "closed:1,closed:64,pipelined:16x64,batched:64x100,e2e:8,catchup,conns:1024"
    )]
    pub scenarios: Vec<String>,
    /// Bytes of each record's value.
    #[arg(long, default_value_t = 100)]
    pub record_size: usize,
    /// Partitions of the closed, pipelined, batched and conns topics (connection i writes to
    /// partition i mod this); e2e and catchup use one.
    #[arg(long, default_value_t = 8)]
    pub partitions: u32,
    /// How long each scenario is measured (after a warm-up of a fifth of it).
    #[arg(long, value_parser = crate::devspec::parse_duration, default_value = "3s")]
    pub duration: Duration,
    /// Client threads, each a single-threaded event loop; connections are dealt among them.
    #[arg(long, default_value_t = 1)]
    pub client_threads: usize,
    /// Records the catchup scenario fills its partition with (unless given as catchup:<R>).
    #[arg(long, default_value_t = 2_000_000)]
    pub catchup_records: u64,
    /// max_bytes of the catch-up consumer's Fetch requests.
    #[arg(long, value_parser = crate::devspec::parse_size, default_value = "4M")]
    pub fetch_max_bytes: u64,
    /// The broker's process id: the conns scenario reads its VmRSS and VmHWM from /proc.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Topics are named <prefix>-<kind> (created with CreateTopics when missing).
    #[arg(long, default_value = "kafka-bench")]
    pub topic_prefix: String,
    /// Print the results as one JSON object (one line) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// TLS (measures what it costs against the same broker without it).
    #[command(flatten)]
    pub tls: crate::tls_client_flags::TlsClientFlags,
}

struct Bench {
    args: KafkaBenchArgs,
    dial: Dial,
    rt: tokio::runtime::Runtime,
    fetch_max_bytes: i32,
}

pub fn run(args: KafkaBenchArgs) -> Result<()> {
    let scenarios: Vec<Scenario> = args
        .scenarios
        .iter()
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.parse::<Scenario>())
        .collect::<Result<_>>()
        .context("--scenario")?;
    if scenarios.is_empty() {
        bail!("--scenario: no scenario given (e.g. closed:1,closed:64)");
    }
    if args.duration.is_zero() {
        bail!("--duration must be positive, e.g. 3s");
    }
    if args.partitions == 0 {
        bail!("--partitions must be at least 1");
    }
    if !(1..=256).contains(&args.client_threads) {
        bail!("--client-threads {}: expected 1..=256", args.client_threads);
    }
    if args.record_size > 1 << 20 {
        bail!("--record-size {}: at most 1 MiB", args.record_size);
    }
    if args.catchup_records == 0 {
        bail!("--catchup-records must be at least 1");
    }
    let fetch_max_bytes = i32::try_from(args.fetch_max_bytes)
        .ok()
        .filter(|&b| b >= 1024)
        .ok_or_else(|| {
            anyhow!(
                "--fetch-max-bytes {}: expected 1K..2G",
                args.fetch_max_bytes
            )
        })?;
    if let Some(pid) = args.server_pid {
        report::rss_hwm(pid)?;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let files = args.tls.files();
    let dial = Dial::new(&args.broker, files)?;
    let b = Bench {
        args,
        dial,
        rt,
        fetch_max_bytes,
    };
    let a = &b.args;
    if !a.json {
        println!(
            "kafka-bench against {}: {} B records, acks=all, {:?} per scenario after a {:?} warm-up, {} client thread(s)",
            a.broker,
            a.record_size,
            a.duration,
            b.warmup(),
            a.client_threads
        );
        println!("{}", report::header());
    }
    let mut lines = Vec::new();
    for sc in scenarios {
        let line = b.scenario(sc).with_context(|| format!("scenario {sc}"))?;
        if !a.json {
            println!("{}", report::row(&line));
        }
        lines.push(line);
    }
    if a.json {
        let r = Report {
            broker: a.broker.clone(),
            record_size: a.record_size,
            partitions: a.partitions,
            warmup_s: b.warmup().as_secs_f64(),
            duration_s: a.duration.as_secs_f64(),
            client_threads: a.client_threads,
            scenarios: lines,
        };
        println!("{}", serde_json::to_string(&r)?);
    }
    Ok(())
}

fn topic_name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

impl Bench {
    fn warmup(&self) -> Duration {
        self.args.duration / 5
    }

    fn timed(&self) -> Window {
        Window::Timed {
            warmup: self.warmup(),
            run: self.args.duration,
        }
    }

    fn topic(&self, kind: &str) -> String {
        format!("{}-{kind}", self.args.topic_prefix)
    }

    fn scenario(&self, sc: Scenario) -> Result<Line> {
        match sc {
            Scenario::Closed { conns } | Scenario::Conns { conns } => {
                self.producers(sc, conns, 1, 1)
            }
            Scenario::Pipelined { conns, window } => self.producers(sc, conns, window, 1),
            Scenario::Batched { conns, records } => self.producers(sc, conns, 1, records),
            Scenario::E2e { producers } => self.e2e(sc, producers),
            Scenario::Catchup { records } => {
                self.catchup(sc, records.unwrap_or(self.args.catchup_records))
            }
        }
    }

    /// Creates the topic if missing; the partitions to use (what it has, at most `want`).
    fn ensure_topic(&self, name: &str, want: u32) -> Result<u32> {
        self.rt.block_on(async {
            let mut c = self.dial.client().await?;
            let mut t = CreatableTopic::default();
            t.name = topic_name(name);
            t.num_partitions = want as i32;
            // The broker's own: 1 on a single broker, every node of a cluster.
            t.replication_factor = -1;
            let mut r = CreateTopicsRequest::default();
            r.topics = vec![t];
            r.timeout_ms = TOPIC_TIMEOUT_MS;
            let resp = c.call(2, &r).await.context("CreateTopics")?;
            let code = resp.topics.first().map_or(-1, |t| t.error_code);
            // 36: TOPIC_ALREADY_EXISTS.
            if code != 0 && code != 36 {
                bail!("creating topic {name}: {}", wire::error_name(code));
            }
            let mut m = MetadataRequest::default();
            let mut mt = MetadataRequestTopic::default();
            mt.name = Some(topic_name(name));
            m.topics = Some(vec![mt]);
            m.allow_auto_topic_creation = false;
            let md = c.call(8, &m).await.context("Metadata")?;
            let t = md
                .topics
                .first()
                .ok_or_else(|| anyhow!("Metadata answered without topic {name}"))?;
            if t.error_code != 0 {
                bail!("Metadata for {name}: {}", wire::error_name(t.error_code));
            }
            let have = t.partitions.len() as u32;
            if have == 0 {
                bail!("topic {name} has no partitions");
            }
            Ok(have.min(want))
        })
    }

    /// The partition's end (the next offset it will give).
    fn end_offset(&self, topic: &str, partition: i32) -> Result<i64> {
        self.rt.block_on(async {
            let mut c = self.dial.client().await?;
            let mut p = ListOffsetsPartition::default();
            p.partition_index = partition;
            p.timestamp = -1;
            let mut t = ListOffsetsTopic::default();
            t.name = topic_name(topic);
            t.partitions = vec![p];
            let mut r = ListOffsetsRequest::default();
            r.replica_id = BrokerId(-1);
            r.topics = vec![t];
            let resp = c.call(1, &r).await.context("ListOffsets")?;
            let p = resp
                .topics
                .first()
                .and_then(|t| t.partitions.first())
                .ok_or_else(|| anyhow!("ListOffsets answered without {topic}/{partition}"))?;
            if p.error_code != 0 {
                bail!(
                    "ListOffsets for {topic}/{partition}: {}",
                    wire::error_name(p.error_code)
                );
            }
            Ok(p.offset)
        })
    }

    fn line(&self, sc: Scenario, conns: usize, window: usize, records: usize) -> Line {
        Line {
            scenario: sc.to_string(),
            kind: sc.kind(),
            connections: conns,
            in_flight: window,
            records_per_request: records,
            seconds: self.args.duration.as_secs_f64(),
            ops_per_s: 0.0,
            unit: "acks/s",
            requests: 0,
            records: 0,
            requests_per_s: 0.0,
            records_per_s: 0.0,
            latency: Latency::default(),
            e2e: None,
            catchup: None,
            memory: None,
        }
    }

    /// closed, pipelined, batched and conns: producers only.
    fn producers(&self, sc: Scenario, conns: usize, window: usize, records: usize) -> Result<Line> {
        let a = &self.args;
        let topic = self.topic(sc.kind());
        let parts = self.ensure_topic(&topic, a.partitions)?;
        let frames = (0..parts)
            .map(|p| wire::produce_frame(&topic, p as i32, records, a.record_size).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        let tasks = (0..conns)
            .map(|i| {
                Task::Produce(ProduceTask {
                    frame: frames[i % frames.len()].clone(),
                    window,
                    records: records as u64,
                    e2e: None,
                    budget: None,
                })
            })
            .collect();
        let pid = a.server_pid.filter(|_| sc.kind() == "conns");
        let before = pid.map(report::rss_hwm).transpose()?;
        let (t, held) = load::run(&self.dial, tasks, a.client_threads, self.timed(), |_| {})?;
        let memory = match (pid, before) {
            (Some(pid), Some((rss0, hwm0))) => {
                let (rss1, hwm1) = report::rss_hwm(pid)?;
                let per = |a: u64, b: u64| (b as f64 - a as f64) / conns as f64;
                Some(Memory {
                    server_pid: pid,
                    rss_before_kib: rss0,
                    hwm_before_kib: hwm0,
                    rss_after_kib: rss1,
                    hwm_after_kib: hwm1,
                    rss_per_connection_kib: per(rss0, rss1),
                    hwm_per_connection_kib: per(hwm0, hwm1),
                })
            }
            _ => None,
        };
        drop(held);
        if t.produce.requests == 0 {
            bail!("no Produce was answered in the measured window");
        }
        let mut l = self.line(sc, conns, window, records);
        let secs = l.seconds;
        l.requests = t.produce.requests;
        l.records = t.produce.records;
        l.requests_per_s = t.produce.requests as f64 / secs;
        l.records_per_s = t.produce.records as f64 / secs;
        if records > 1 {
            l.unit = "records/s";
            l.ops_per_s = l.records_per_s;
        } else {
            l.ops_per_s = l.requests_per_s;
        }
        l.latency = Latency::of(&t.produce_hist);
        l.memory = memory;
        Ok(l)
    }

    /// Producers on one partition and a consumer tailing it from its end.
    fn e2e(&self, sc: Scenario, producers: usize) -> Result<Line> {
        let a = &self.args;
        let topic = self.topic("e2e");
        self.ensure_topic(&topic, 1)?;
        let start = self.end_offset(&topic, 0)?;
        let table = Arc::new(Mutex::new(E2e::new(start)?));
        let (frame, offset_at) = wire::fetch_frame(&topic, 0, E2E_MAX_WAIT_MS, 1, E2E_FETCH_BYTES)?;
        let produce = Arc::new(wire::produce_frame(&topic, 0, 1, a.record_size)?);
        let mut tasks = vec![Task::Fetch(FetchTask {
            frame,
            offset_at,
            from: start,
            to: None,
            max_answer: E2E_FETCH_BYTES as usize + (1 << 20),
            e2e: Some(table.clone()),
        })];
        tasks.extend((0..producers).map(|_| {
            Task::Produce(ProduceTask {
                frame: produce.clone(),
                window: 1,
                records: 1,
                e2e: Some(table.clone()),
                budget: None,
            })
        }));
        let (t, held) = load::run(
            &self.dial,
            tasks,
            a.client_threads,
            self.timed(),
            |timing| {
                if let Ok(mut e) = table.lock() {
                    e.set_window(timing);
                }
            },
        )?;
        drop(held);
        let e = table
            .lock()
            .map_err(|_| anyhow!("the end-to-end table was poisoned"))?;
        if e.matched == 0 {
            bail!(
                "the consumer received {} records in the window, none of them acknowledged to the producers ({} acks): a broker in --ceiling mode stores nothing",
                t.fetch.records,
                t.produce.requests
            );
        }
        let mut l = self.line(sc, producers + 1, 1, 1);
        let secs = l.seconds;
        l.unit = "records/s";
        l.requests = t.produce.requests;
        l.records = t.fetch.records;
        l.requests_per_s = t.produce.requests as f64 / secs;
        l.records_per_s = t.fetch.records as f64 / secs;
        l.ops_per_s = l.records_per_s;
        l.latency = Latency::of(&e.ack_to_receive);
        l.e2e = Some(E2eFigures {
            matched: e.matched,
            early: e.early,
            ack_to_receive: l.latency,
            send_to_receive: Latency::of(&e.send_to_receive),
            producer_acks_per_s: l.requests_per_s,
            producer_ack: Latency::of(&t.produce_hist),
            fetches: t.fetch.requests,
            records_per_fetch: t.fetch.records as f64 / t.fetch.requests.max(1) as f64,
            fetch: Latency::of(&t.fetch_hist),
        });
        Ok(l)
    }

    /// Fills one partition, then reads it from the fill's start with one consumer.
    fn catchup(&self, sc: Scenario, records: u64) -> Result<Line> {
        let a = &self.args;
        let topic = self.topic("catchup");
        self.ensure_topic(&topic, 1)?;
        let start = self.end_offset(&topic, 0)?;
        let batch = FILL_BATCH.min(records as usize).max(1);
        let frame = Arc::new(wire::produce_frame(&topic, 0, batch, a.record_size)?);
        let budget = Arc::new(AtomicI64::new(i64::try_from(records).unwrap_or(i64::MAX)));
        let tasks = (0..FILL_CONNS)
            .map(|_| {
                Task::Produce(ProduceTask {
                    frame: frame.clone(),
                    window: 1,
                    records: batch as u64,
                    e2e: None,
                    budget: Some(budget.clone()),
                })
            })
            .collect();
        let (fill, _) = load::run(
            &self.dial,
            tasks,
            a.client_threads,
            Window::Unbounded,
            |_| {},
        )?;
        let end = self.end_offset(&topic, 0)?;
        if end - start < records as i64 {
            bail!(
                "the partition grew by {} records during a fill of {} acknowledged: a broker in --ceiling mode stores nothing",
                end - start,
                fill.produce.records
            );
        }
        let (frame, offset_at) = wire::fetch_frame(&topic, 0, 100, 1, self.fetch_max_bytes)?;
        let tasks = vec![Task::Fetch(FetchTask {
            frame,
            offset_at,
            from: start,
            to: Some(end),
            max_answer: self.fetch_max_bytes as usize + (4 << 20),
            e2e: None,
        })];
        let (read, _): (Totals, _) = load::run(&self.dial, tasks, 1, Window::Unbounded, |_| {})?;
        let secs = read.fetch.span().as_secs_f64().max(1e-9);
        let fill_secs = fill.produce.span().as_secs_f64().max(1e-9);
        let mut l = self.line(sc, 1, 1, batch);
        l.seconds = secs;
        l.unit = "records/s";
        l.requests = read.fetch.requests;
        l.records = read.fetch.records;
        l.requests_per_s = read.fetch.requests as f64 / secs;
        l.records_per_s = read.fetch.records as f64 / secs;
        l.ops_per_s = l.records_per_s;
        l.latency = Latency::of(&read.fetch_hist);
        l.catchup = Some(CatchupFigures {
            records: read.fetch.records,
            bytes: read.fetch.bytes,
            seconds: secs,
            mb_per_s: read.fetch.bytes as f64 / 1e6 / secs,
            fetches: read.fetch.requests,
            fill_records: fill.produce.records,
            fill_seconds: fill_secs,
            fill_records_per_s: fill.produce.records as f64 / fill_secs,
        });
        Ok(l)
    }
}
