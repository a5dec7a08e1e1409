#![allow(dead_code)] // each test binary uses its own part of these helpers
//! An in-process broker over a sim device, on an ephemeral port.

pub mod inproc;
pub mod kafka_batches;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use blockdev::sim::{Latency, SimClock, SimConfig, SimDevice, SimHandle};
use frontend::{Broker, Config, Server, ServerOptions};
use nvmq_log::{FormatOptions, Log, LogConfig};

/// A formatted sim device on a real clock with a flush of `flush_us`.
pub fn sim_device(seed: u64, capacity: u64, flush_us: u64) -> (SimDevice, SimHandle) {
    sim_device_batches(seed, capacity, flush_us, 1 << 20)
}

/// `sim_device` formatted for log batches (and device transfers) of up to `max_batch` bytes.
pub fn sim_device_batches(
    seed: u64,
    capacity: u64,
    flush_us: u64,
    max_batch: u32,
) -> (SimDevice, SimHandle) {
    let mut c = SimConfig::new(seed, capacity);
    c.flush_latency = Latency::Fixed(Duration::from_micros(flush_us));
    c.clock = SimClock::real();
    c.max_transfer = c.max_transfer.max(max_batch);
    let (mut dev, h) = SimDevice::new(c);
    let fo = FormatOptions {
        max_batch,
        ..FormatOptions::default()
    };
    nvmq_log::mkfs::format(&mut dev, &fo).expect("format");
    (dev, h)
}

fn device() -> SimDevice {
    sim_device(7, 128 << 20, 200).0
}

/// A broker over a log on its own writer thread, not serving (requests are started directly).
pub fn broker(cfg: Config) -> Arc<Broker> {
    let lc = LogConfig::default();
    let (w, _) = recovery::open(device(), lc.clone()).expect("open");
    let log = Log::start(w, lc.queue_capacity);
    Broker::open(log, lc.queue_capacity, cfg).expect("broker")
}

/// Serves the log on `dev` on an ephemeral port with two event loops.
pub fn server_on(dev: SimDevice, cfg: Config) -> Server {
    serve_devices(vec![dev], cfg)
}

/// Serves one log per device (device i on loop i mod 2) on an ephemeral port.
pub fn serve_devices(devs: Vec<SimDevice>, cfg: Config) -> Server {
    serve_devices_with(devs, LogConfig::default(), cfg)
}

/// `serve_devices` with the logs' configuration `lc`.
pub fn serve_devices_with(devs: Vec<SimDevice>, lc: LogConfig, cfg: Config) -> Server {
    let opts = ServerOptions {
        loops: 2,
        ..ServerOptions::default()
    };
    serve_devices_opts(devs, lc, cfg, opts)
}

/// `serve_devices_with` with the loops laid out as `opts` say (unpinned, with the log's queue
/// capacity).
pub fn serve_devices_opts(
    devs: Vec<SimDevice>,
    lc: LogConfig,
    cfg: Config,
    opts: ServerOptions,
) -> Server {
    let writers = devs
        .into_iter()
        .map(|d| recovery::open(d, lc.clone()).expect("open").0)
        .collect();
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let opts = ServerOptions {
        pin: false,
        queue_capacity: lc.queue_capacity,
        ..opts
    };
    Server::start(writers, l, cfg, opts).expect("server")
}

/// Starts serving a fresh sim device; returns the address and the server (dropping it stops it).
pub async fn serve(cfg: Config) -> (SocketAddr, Server) {
    let s = server_on(device(), cfg);
    (s.local_addr(), s)
}

/// A Produce of one batch to partition `part` of topic `t`, with a 10 s timeout.
pub fn produce_request(
    t: &str,
    part: i32,
    batch: Vec<u8>,
    acks: i16,
) -> kafka_protocol::messages::ProduceRequest {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ProduceRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let mut p = PartitionProduceData::default();
    p.index = part;
    p.records = Some(bytes::Bytes::from(batch));
    let mut td = TopicProduceData::default();
    td.name = TopicName(StrBytes::from_string(t.to_string()));
    td.partition_data = vec![p];
    let mut r = ProduceRequest::default();
    r.acks = acks;
    r.timeout_ms = 10_000;
    r.topic_data = vec![td];
    r
}

/// Creates topic `t` (one partition) the way clients do: a Metadata request that may
/// auto-create it.
pub async fn create_topic(c: &mut frontend::client::Client, t: &str) {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{MetadataRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let mut m = MetadataRequest::default();
    let mut mt = MetadataRequestTopic::default();
    mt.name = Some(TopicName(StrBytes::from_string(t.to_string())));
    m.topics = Some(vec![mt]);
    m.allow_auto_topic_creation = true;
    let r = c.call(8, &m).await.expect("metadata");
    assert_eq!(r.topics[0].error_code, 0, "creating {t}");
}

/// A 12 MiB sim device (1 MiB window, 256 KiB batches) whose ring a few hundred 100 KiB
/// records wrap: for tests that state survives the ring freeing its first records.
pub fn small_ring(seed: u64) -> (SimDevice, SimHandle) {
    let mut c = SimConfig::new(seed, 12 << 20);
    c.flush_latency = Latency::Fixed(Duration::from_micros(100));
    c.clock = SimClock::real();
    let (mut dev, handle) = SimDevice::new(c);
    let fmt = FormatOptions {
        window: 1 << 20,
        max_batch: 256 << 10,
        ..FormatOptions::default()
    };
    nvmq_log::mkfs::format(&mut dev, &fmt).expect("format");
    (dev, handle)
}

/// About four laps of a `small_ring` through topic `t` (partition 0), slowly enough for the
/// snapshot ticker to keep up.
pub async fn lap_the_ring(c: &mut frontend::client::Client, t: &str) {
    let value = vec![7u8; 100 << 10];
    for _ in 0..400 {
        let batch = frontend::client::record_batch(&[&value], None);
        let r = c.call(7, &produce_request(t, 0, batch, -1)).await.unwrap();
        assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The first retained offset of internal partition `name` on device 0.
pub fn internal_start(b: &Broker, name: &str) -> u64 {
    b.log()
        .partitions()
        .into_iter()
        .find(|p| p.1 == name)
        .map(|p| p.3)
        .expect("internal partition")
}

/// The durable end (next offset) of partition `i` of topic `t`.
pub fn end_of(b: &Broker, t: &str, i: i32) -> u64 {
    let p = b.topics().partition(t, i).expect("partition");
    b.bounds(p).expect("bounds").1
}

/// A broker over a device as it comes back after a power cut.
pub fn reopen(dev: SimDevice, cfg: Config) -> Arc<Broker> {
    let lc = LogConfig::default();
    let (w, _) = recovery::open(dev, lc.clone()).expect("open");
    Broker::open(Log::start(w, lc.queue_capacity), lc.queue_capacity, cfg).expect("broker")
}

/// A Fetch of partition 0 of `t` from `offset`, answered at once (up to 1 MiB).
pub fn fetch_request(t: &str, offset: i64) -> kafka_protocol::messages::FetchRequest {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{BrokerId, FetchRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let mut p = FetchPartition::default();
    p.fetch_offset = offset;
    p.partition_max_bytes = 1 << 20;
    let mut ft = FetchTopic::default();
    ft.topic = TopicName(StrBytes::from_string(t.to_string()));
    ft.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.replica_id = BrokerId(-1);
    r.max_wait_ms = 0;
    r.min_bytes = 1;
    r.max_bytes = 1 << 20;
    r.topics = vec![ft];
    r
}

/// Only to tell a stalled broker from a working one: a working one answers at once.
pub const STALL: Duration = Duration::from_secs(30);

/// `f`'s result; panics with `what` if the broker stalled (nothing came within `STALL`).
pub async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(STALL, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}"),
    }
}

/// Waits until `cond` holds (it must come about without anything more from the test).
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}
