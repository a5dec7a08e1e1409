//! `nvmq kafka-bench`: producers speaking the Kafka protocol to nvmq (in process, or an external
//! broker), one 100-byte record per Produce request with acks=all; closed-loop producers and
//! pipelined ones (many requests in flight per connection). Prints acks/s and latency.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use frontend::client::{record_batch, Client};
use hdrhistogram::Histogram;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{MetadataRequest, ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use nvmq_log::{FlushMode, FormatOptions, Log, LogConfig};

use crate::devspec::DeviceSpec;

const PRODUCE_VERSION: i16 = 7;
const DEFAULT_FILE: &str = "./nvmq-data/kafka-bench.img";

#[derive(clap::Args, Debug, Clone)]
pub struct KafkaBenchArgs {
    /// An external broker to measure (host:port); without it the bench serves one in process.
    #[arg(long)]
    pub broker: Option<String>,
    /// Device of the in-process broker (formatted by the bench).
    #[arg(long, default_value = "file:./nvmq-data/kafka-bench.img")]
    pub device: String,
    #[arg(long, default_value = "1G")]
    pub size: String,
    /// always, interval:<ms>, never.
    #[arg(long, default_value = "always")]
    pub flush: String,
    /// Closed-loop producer counts (each its own connection, one request in flight).
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    pub producers: Vec<usize>,
    /// Pipelined scenarios: connections x requests in flight per connection.
    #[arg(long, value_delimiter = ',', default_value = "4x256,16x256")]
    pub pipelined: Vec<String>,
    #[arg(long, default_value_t = 100)]
    pub record_size: usize,
    /// Partitions of the bench topic (producer i writes to partition i mod this).
    #[arg(long, default_value_t = 8)]
    pub partitions: u32,
    #[arg(long, default_value = "3s")]
    pub duration: String,
    /// Format an existing device file that is not the bench's own.
    #[arg(long)]
    pub force: bool,
}

struct Outcome {
    acks: u64,
    hist: Histogram<u64>,
}

fn produce_request(topic: &str, partition: i32, batch: &Bytes) -> ProduceRequest {
    let mut p = PartitionProduceData::default();
    p.index = partition;
    p.records = Some(batch.clone());
    let mut t = TopicProduceData::default();
    t.name = TopicName(StrBytes::from_string(topic.to_string()));
    t.partition_data = vec![p];
    let mut r = ProduceRequest::default();
    r.acks = -1;
    r.timeout_ms = 30_000;
    r.topic_data = vec![t];
    r
}

fn check(r: &kafka_protocol::messages::ProduceResponse) -> Result<()> {
    let code = r
        .responses
        .first()
        .and_then(|t| t.partition_responses.first())
        .map_or(-1, |p| p.error_code);
    if code != 0 {
        bail!("produce answered with error code {code}");
    }
    Ok(())
}

/// One producer connection keeping `window` requests in flight until `until`.
async fn producer(
    addr: String,
    topic: String,
    partition: i32,
    window: usize,
    size: usize,
    warm: Instant,
    until: Instant,
) -> Result<Outcome> {
    let mut c = Client::connect(addr.as_str(), "kafka-bench").await?;
    let value = vec![0x5au8; size];
    let batch = Bytes::from(record_batch(&[&value], None));
    let req = produce_request(&topic, partition, &batch);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut acks = 0u64;
    let mut sent: VecDeque<Instant> = VecDeque::with_capacity(window);
    for _ in 0..window {
        c.send(PRODUCE_VERSION, &req).await?;
        sent.push_back(Instant::now());
    }
    while let Some(t) = sent.pop_front() {
        let (_, r) = c.recv::<ProduceRequest>(PRODUCE_VERSION).await?;
        check(&r)?;
        let now = Instant::now();
        if now > warm && t > warm {
            acks += 1;
            hist.record(now.duration_since(t).as_nanos() as u64)?;
        }
        if now < until {
            c.send(PRODUCE_VERSION, &req).await?;
            sent.push_back(Instant::now());
        }
    }
    Ok(Outcome { acks, hist })
}

async fn scenario(
    addr: &str,
    topic: &str,
    partitions: u32,
    conns: usize,
    window: usize,
    size: usize,
    duration: Duration,
) -> Result<(f64, Histogram<u64>)> {
    let start = Instant::now();
    let warm = start + duration / 5;
    let until = warm + duration;
    let mut tasks = Vec::new();
    for i in 0..conns {
        tasks.push(tokio::spawn(producer(
            addr.to_string(),
            topic.to_string(),
            (i as u32 % partitions) as i32,
            window,
            size,
            warm,
            until,
        )));
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut acks = 0;
    for t in tasks {
        let o = t.await.map_err(|e| anyhow!("producer task: {e}"))??;
        acks += o.acks;
        hist.add(&o.hist)?;
    }
    Ok((acks as f64 / duration.as_secs_f64(), hist))
}

pub fn run(args: KafkaBenchArgs) -> Result<()> {
    let duration = crate::devspec::parse_duration(&args.duration)?;
    let pipelined: Vec<(usize, usize)> = args
        .pipelined
        .iter()
        .filter(|s| !s.is_empty())
        .map(|s| {
            let (c, w) = s
                .split_once('x')
                .ok_or_else(|| anyhow!("--pipelined {s:?}: expected <connections>x<in-flight>"))?;
            let c: usize = c.parse().with_context(|| format!("--pipelined {s:?}"))?;
            let w: usize = w.parse().with_context(|| format!("--pipelined {s:?}"))?;
            if c == 0 || w == 0 {
                bail!("--pipelined {s:?}: counts must be positive");
            }
            Ok((c, w))
        })
        .collect::<Result<_>>()?;
    if args.producers.contains(&0) || args.partitions == 0 {
        bail!("--producers and --partitions want positive counts");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let mut log_handle: Option<Arc<Log>> = None;
    let mut server: Option<frontend::Server> = None;
    let addr = match &args.broker {
        Some(a) => a.clone(),
        None => {
            let spec: DeviceSpec = args.device.parse()?;
            if let DeviceSpec::File { path: p, .. } = &spec {
                if p.exists() && p != std::path::Path::new(DEFAULT_FILE) && !args.force {
                    bail!(
                        "{} exists; the bench formats its device. Pass --force, or name a new file",
                        p.display()
                    );
                }
            }
            let size = crate::devspec::parse_size(&args.size)?;
            let flush: FlushMode = args.flush.parse().map_err(|e: String| anyhow!(e))?;
            let mut dev = spec.open(Some(size), |_| Ok(()))?;
            nvmq_log::mkfs::format(&mut *dev, &FormatOptions::default())
                .context("formatting the bench device")?;
            let cfg = LogConfig {
                flush,
                ..LogConfig::default()
            };
            let queue = cfg.queue_capacity;
            let (w, _) = recovery::open(dev, cfg).context("opening the formatted device")?;
            let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
            let opts = frontend::ServerOptions {
                queue_capacity: queue,
                ..frontend::ServerOptions::default()
            };
            let s = frontend::Server::start(vec![w], listener, frontend::Config::default(), opts)?;
            log_handle = Some(s.broker().log().clone());
            let a = s.local_addr().to_string();
            server = Some(s);
            a
        }
    };
    println!(
        "kafka-bench against {} ({}), {} B records, acks=all, one record per Produce request, {} partitions, {:?} per scenario",
        addr,
        args.broker.as_deref().map_or_else(|| format!("in process on {}, flush {}", args.device, args.flush), |_| "external".into()),
        args.record_size,
        args.partitions,
        duration
    );
    println!(
        "{:>22} {:>11} {:>9} {:>9} {:>9} {:>10}",
        "scenario", "acks/s", "p50 us", "p99 us", "max us", "rec/flush"
    );
    rt.block_on(async {
        let topic = "kafka-bench";
        let mut c = Client::connect(addr.as_str(), "kafka-bench").await?;
        let mut m = MetadataRequest::default();
        let mut t = MetadataRequestTopic::default();
        t.name = Some(TopicName(StrBytes::from_static_str(topic)));
        m.topics = Some(vec![t]);
        m.allow_auto_topic_creation = true;
        let md = c.call(8, &m).await?;
        let have = md.topics.first().map_or(0, |t| t.partitions.len()) as u32;
        let partitions = have.clamp(1, args.partitions);
        let mut runs: Vec<(String, usize, usize)> = args
            .producers
            .iter()
            .map(|&p| (format!("{p} closed-loop"), p, 1))
            .collect();
        runs.extend(
            pipelined
                .iter()
                .map(|&(c, w)| (format!("{c} conn x {w} in flight"), c, w)),
        );
        for (name, conns, window) in runs {
            let before = log_handle.as_ref().map(|l| l.stats());
            let (rate, h) = scenario(
                &addr,
                topic,
                partitions,
                conns,
                window,
                args.record_size,
                duration,
            )
            .await?;
            let per_flush = match (before, log_handle.as_ref().map(|l| l.stats())) {
                (Some(b), Some(a)) if a.flushes > b.flushes => format!(
                    "{:.1}",
                    (a.appends_acked - b.appends_acked) as f64 / (a.flushes - b.flushes) as f64
                ),
                // No flushes (a device without a volatile cache) or an external broker.
                _ => "-".into(),
            };
            println!(
                "{:>22} {:>11.0} {:>9.0} {:>9.0} {:>9.0} {:>10}",
                name,
                rate,
                h.value_at_quantile(0.5) as f64 / 1e3,
                h.value_at_quantile(0.99) as f64 / 1e3,
                h.max() as f64 / 1e3,
                per_flush
            );
        }
        anyhow::Ok(())
    })?;
    rt.shutdown_timeout(Duration::from_secs(2));
    if let Some(s) = server {
        s.shutdown()?;
    }
    Ok(())
}
