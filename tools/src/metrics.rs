//! Prometheus metrics: the log's own counters and histograms (`WriterStats`: append-to-ack and
//! flush latency, records per flush), space, the fatal-error state and the last recovery, rendered
//! in the text exposition format and served on `/metrics` by a tiny HTTP server on its own thread.
//! `nvmq serve --metrics-addr <addr>` starts it.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nvmq_log::layout::Geometry;
use nvmq_log::shared::POW2_BUCKETS;
use nvmq_log::{Pow2Histogram, Shared};
use recovery::RecoveryReport;

#[derive(Debug, Clone, Copy)]
struct RecoveryFigures {
    seconds: f64,
    scanned_bytes: u64,
    indexed_bytes: u64,
}

/// Everything `/metrics` shows.
pub struct Metrics {
    /// Every device's log, in device order.
    logs: Mutex<Vec<(Arc<Shared>, Geometry)>>,
    recovery: Mutex<Option<RecoveryFigures>>,
    front: Mutex<Option<FrontProbe>>,
    cluster: Mutex<Option<ClusterProbe>>,
    partitions: Mutex<Option<PartitionsProbe>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// How a series is read from a device's figures.
type Reader<T> = fn(&DeviceFigures) -> T;

/// Reads the front door's (connections open, refused, queued bytes).
type FrontProbe = Box<dyn Fn() -> (usize, u64, usize) + Send + Sync>;

/// Reads a node of a cluster's Raft group.
type ClusterProbe = Box<dyn Fn() -> Option<frontend::replica::QuorumStatus> + Send + Sync>;

/// Reads every Kafka partition's start and end offsets (`metrics_partitions`).
type PartitionsProbe = Box<dyn Fn() -> crate::metrics_partitions::PartitionsRead + Send + Sync>;

/// A per-device series: name, help, and how to read it.
type Series<T> = (&'static str, &'static str, Reader<T>);

/// A per-device histogram: name, help, where it is, how a bucket's bound is shown, the scale.
type HistSeries = (
    &'static str,
    &'static str,
    fn(&DeviceFigures) -> &Pow2Histogram,
    fn(u64) -> f64,
    f64,
);

/// One device's figures, read once per scrape.
struct DeviceFigures {
    stats: nvmq_log::WriterStats,
    durable: u64,
    head: u64,
    fatal: Option<String>,
    scrub: nvmq_log::scrub::ScrubState,
    log_size: u64,
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics {
            logs: Mutex::new(Vec::new()),
            recovery: Mutex::new(None),
            front: Mutex::new(None),
            cluster: Mutex::new(None),
            partitions: Mutex::new(None),
        }
    }

    /// A running log whose writer figures, space and fatal state are shown: call it once per
    /// device, in device order. With more than one, every series carries `device="<i>"`.
    pub fn attach_log(&self, shared: Arc<Shared>, geometry: Geometry) {
        lock(&self.logs).push((shared, geometry));
    }

    /// The Kafka listener's connection and byte figures, once it runs.
    pub fn attach_front(&self, probe: impl Fn() -> (usize, u64, usize) + Send + Sync + 'static) {
        *lock(&self.front) = Some(Box::new(probe));
    }

    /// The Kafka partitions' offsets (`metrics_partitions`).
    pub fn attach_partitions(
        &self,
        probe: impl Fn() -> crate::metrics_partitions::PartitionsRead + Send + Sync + 'static,
    ) {
        *lock(&self.partitions) = Some(Box::new(probe));
    }

    /// A node of a cluster: its Raft group's figures (`metrics_cluster`).
    pub fn attach_cluster(
        &self,
        probe: impl Fn() -> Option<frontend::replica::QuorumStatus> + Send + Sync + 'static,
    ) {
        *lock(&self.cluster) = Some(Box::new(probe));
    }

    pub fn set_recovery(&self, r: &RecoveryReport) {
        *lock(&self.recovery) = Some(RecoveryFigures {
            seconds: (r.duration + r.index_duration).as_secs_f64(),
            scanned_bytes: r.scanned_bytes,
            indexed_bytes: r.indexed_bytes,
        });
    }

    /// The text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let devices: Vec<DeviceFigures> = lock(&self.logs)
            .iter()
            .map(|(shared, geo)| {
                let s = shared.lock();
                DeviceFigures {
                    stats: s.stats,
                    durable: s.durable,
                    head: s.head,
                    fatal: s.fatal.clone(),
                    scrub: s.scrub.clone(),
                    log_size: geo.log_size,
                }
            })
            .collect();
        // One device: plain series, as ever; several: a `device` label on each.
        let labels: Vec<String> = match devices.len() {
            1 => vec![String::new()],
            _ => (0..devices.len())
                .map(|i| format!("device=\"{i}\""))
                .collect(),
        };
        let each = |out: &mut String,
                    name: &str,
                    kind: &str,
                    help: &str,
                    v: &dyn Fn(&DeviceFigures) -> f64| {
            if devices.is_empty() {
                return;
            }
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (d, l) in devices.iter().zip(&labels) {
                let _ = writeln!(out, "{name}{} {}", braces(l), v(d));
            }
        };
        let counters: [Series<u64>; 12] = [
            ("nvmq_appends_acked_total", "Appends acknowledged.", |d| {
                d.stats.appends_acked
            }),
            (
                "nvmq_payload_bytes_acked_total",
                "Payload bytes acknowledged.",
                |d| d.stats.payload_bytes_acked,
            ),
            (
                "nvmq_batches_written_total",
                "Batches written (one group commit each).",
                |d| d.stats.batches_written,
            ),
            (
                "nvmq_device_bytes_written_total",
                "Bytes written to the device for batches (headers and padding included).",
                |d| d.stats.device_bytes_written,
            ),
            ("nvmq_flushes_total", "Device flushes submitted.", |d| {
                d.stats.flushes
            }),
            (
                "nvmq_superblock_writes_total",
                "Superblock copies written.",
                |d| d.stats.superblock_writes,
            ),
            (
                "nvmq_checkpoints_total",
                "Checkpoints written (each one batch or more).",
                |d| d.stats.checkpoints,
            ),
            (
                "nvmq_checkpoint_batches_total",
                "Checkpoint batches written.",
                |d| d.stats.checkpoint_batches,
            ),
            ("nvmq_reads_total", "Log reads served.", |d| d.stats.reads),
            (
                "nvmq_corrupt_reads_total",
                "Reads refused because a record failed its checks.",
                |d| d.stats.corrupt_reads,
            ),
            (
                "nvmq_dropped_unexpired_batches_total",
                "Batches on_full = drop-oldest freed for room before retention expired them.",
                |d| d.stats.dropped_unexpired_batches,
            ),
            (
                "nvmq_dropped_unexpired_bytes_total",
                "Log bytes on_full = drop-oldest freed for room before retention expired them.",
                |d| d.stats.dropped_unexpired_bytes,
            ),
        ];
        for (name, help, v) in counters {
            each(&mut out, name, "counter", help, &|d| v(d) as f64);
        }
        let histograms: [HistSeries; 3] = [
            (
                "nvmq_append_ack_latency_seconds",
                "Append to acknowledgement (after the covering flush in flush mode always), as the writer sees it.",
                |d| &d.stats.ack_latency_us,
                // Whole microseconds below 2^i are below 2^i µs.
                |b| b as f64 / 1e6,
                1e-6,
            ),
            (
                "nvmq_flush_latency_seconds",
                "Device flush latency, submission to completion.",
                |d| &d.stats.flush_latency_us,
                |b| b as f64 / 1e6,
                1e-6,
            ),
            (
                "nvmq_records_per_flush",
                "Appends acknowledged each time the durable position moved (per flush in the default mode).",
                |d| &d.stats.records_per_flush,
                // Whole counts below 2^i are at most 2^i - 1.
                |b| (b - 1) as f64,
                1.0,
            ),
        ];
        for (name, help, h, le, scale) in histograms {
            if devices.is_empty() {
                break;
            }
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (d, l) in devices.iter().zip(&labels) {
                render_pow2(&mut out, name, l, h(d), le, scale);
            }
        }
        let gauges: [Series<f64>; 9] = [
            (
                "nvmq_records_per_flush_mean",
                "Appends acknowledged per flush submitted, since start.",
                |d| ratio(d.stats.appends_acked, d.stats.flushes),
            ),
            (
                "nvmq_write_amplification",
                "Device bytes written per payload byte acknowledged, since start.",
                |d| ratio(d.stats.device_bytes_written, d.stats.payload_bytes_acked),
            ),
            (
                "nvmq_log_used_bytes",
                "Retained log bytes (head to durable position).",
                |d| d.durable.saturating_sub(d.head) as f64,
            ),
            ("nvmq_log_free_bytes", "Log bytes not retained.", |d| {
                d.log_size.saturating_sub(d.durable.saturating_sub(d.head)) as f64
            }),
            (
                "nvmq_durable_position_bytes",
                "The durable position D.",
                |d| d.durable as f64,
            ),
            (
                "nvmq_partitions",
                "Partitions in the log's registry (topics' partitions and the internal ones).",
                |d| d.stats.registry_partitions as f64,
            ),
            (
                "nvmq_registry_bytes",
                "Bytes the registry's entries take in a checkpoint.",
                |d| d.stats.registry_bytes as f64,
            ),
            (
                "nvmq_checkpoint_bytes",
                "Log bytes the newest checkpoint took.",
                |d| d.stats.checkpoint_bytes as f64,
            ),
            (
                "nvmq_checkpoint_budget_bytes",
                "The most log bytes the registry's checkpoint may take: creating partitions past it is refused.",
                |d| d.stats.checkpoint_budget as f64,
            ),
        ];
        for (name, help, v) in gauges {
            each(&mut out, name, "gauge", help, &v);
        }
        // (name, kind, help, value)
        let scrub: [(&str, &str, &str, Reader<u64>); 3] = [
            (
                "nvmq_scrub_passes_total",
                "counter",
                "Complete passes of the background scrub over the retained log.",
                |d| d.scrub.passes,
            ),
            (
                "nvmq_scrub_bytes_checked_total",
                "counter",
                "Log bytes the background scrub re-read and checked.",
                |d| d.scrub.bytes_checked,
            ),
            (
                "nvmq_scrub_damaged_batches",
                "gauge",
                "Distinct damaged batches the scrub found in acknowledged data (alert on > 0).",
                |d| d.scrub.damage.len() as u64,
            ),
        ];
        for (name, kind, help, v) in scrub {
            each(&mut out, name, kind, help, &|d| v(d) as f64);
        }
        if !devices.is_empty() {
            let _ = writeln!(
                out,
                "# HELP nvmq_writer_fatal 1 once the writer stopped after a device error (nothing more is acknowledged).\n# TYPE nvmq_writer_fatal gauge"
            );
        }
        for (d, l) in devices.iter().zip(&labels) {
            match &d.fatal {
                Some(reason) => {
                    let both = join(l, &format!("reason=\"{}\"", escape(reason)));
                    let _ = writeln!(out, "nvmq_writer_fatal{} 1", braces(&both));
                }
                None => {
                    let _ = writeln!(out, "nvmq_writer_fatal{} 0", braces(l));
                }
            }
        }
        if let Some(r) = *lock(&self.recovery) {
            let gauges: [(&str, &str, f64); 3] = [
                (
                    "nvmq_recovery_duration_seconds",
                    "How long the last recovery took (scan and index rebuild).",
                    r.seconds,
                ),
                (
                    "nvmq_recovery_scanned_bytes",
                    "Bytes the last recovery scanned from the recovery point.",
                    r.scanned_bytes as f64,
                ),
                (
                    "nvmq_recovery_indexed_bytes",
                    "Bytes the last recovery read to rebuild the index.",
                    r.indexed_bytes as f64,
                ),
            ];
            for (name, help, v) in gauges {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
            }
        }
        if let Some(probe) = lock(&self.front).as_ref() {
            let (open, refused, queued) = probe();
            let series = [
                ("nvmq_connections", "gauge", "Kafka connections open.", open as f64),
                (
                    "nvmq_connections_refused_total",
                    "counter",
                    "Connections closed at once for max_connections or max_connections_per_ip.",
                    refused as f64,
                ),
                (
                    "nvmq_queued_bytes",
                    "gauge",
                    "Bytes connections hold: requests read and not yet answered, answers not yet sent.",
                    queued as f64,
                ),
            ];
            for (name, kind, help, v) in series {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
                );
            }
        }
        if let Some(st) = lock(&self.cluster).as_ref().and_then(|probe| probe()) {
            crate::metrics_cluster::render(&mut out, &st);
        }
        if let Some(probe) = lock(&self.partitions).as_ref() {
            let (parts, more) = probe();
            crate::metrics_partitions::render(&mut out, &parts, more);
        }
        out
    }
}

/// `{labels}`, or nothing for none.
fn braces(labels: &str) -> String {
    if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    }
}

/// Two label lists as one.
fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a},{b}"),
    }
}

/// A writer histogram's samples (its HELP and TYPE written by the caller); `le` maps a bucket's
/// exclusive bound to the exposed inclusive bound.
fn render_pow2(
    out: &mut String,
    name: &str,
    labels: &str,
    h: &Pow2Histogram,
    le: fn(u64) -> f64,
    scale: f64,
) {
    let mut cumulative = 0u64;
    for i in 0..POW2_BUCKETS - 1 {
        cumulative += h.buckets[i];
        let bound = le(Pow2Histogram::bucket_bound(i));
        let l = join(labels, &format!("le=\"{bound}\""));
        let _ = writeln!(out, "{name}_bucket{{{l}}} {cumulative}");
    }
    let l = join(labels, "le=\"+Inf\"");
    let _ = writeln!(out, "{name}_bucket{{{l}}} {}", h.count);
    let _ = writeln!(out, "{name}_sum{} {}", braces(labels), h.sum as f64 * scale);
    let _ = writeln!(out, "{name}_count{} {}", braces(labels), h.count);
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves `GET /metrics` on its own thread until dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Longest request head read; scrapers send a few hundred bytes.
const MAX_REQUEST: usize = 8192;

impl MetricsServer {
    /// Binds `addr` (e.g. `127.0.0.1:9464`, port 0 for any) and starts serving.
    pub fn start(
        addr: impl ToSocketAddrs,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("nvmq-metrics".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if flag.load(Ordering::Relaxed) {
                        break;
                    }
                    match conn {
                        Ok(s) => {
                            if let Err(e) = answer(s, &metrics) {
                                tracing::debug!(error = %e, "metrics request failed");
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "metrics accept failed"),
                    }
                }
            })?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn answer(mut s: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    let mut first = text.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.render(),
        ),
        ("GET", _) => (
            "404 Not Found",
            "text/plain",
            "only /metrics is served\n".into(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET is served\n".into(),
        ),
    };
    write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    s.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockdev::sim::{SimConfig, SimDevice};
    use nvmq_log::{FormatOptions, Log, LogConfig};

    fn scrape(addr: SocketAddr, path: &str) -> (String, String) {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let (head, body) = resp.split_once("\r\n\r\n").unwrap();
        (head.to_string(), body.to_string())
    }

    fn value(body: &str, series: &str) -> f64 {
        body.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("no {series} in:\n{body}"))
            .parse()
            .unwrap()
    }

    #[test]
    fn a_scrape_over_tcp_shows_the_writer_space_recovery_and_fatal_state() {
        let (mut dev, handle) = SimDevice::new(SimConfig::new(11, 64 << 20));
        let fmt = FormatOptions {
            window: 4 << 20,
            max_batch: 256 << 10,
            ..FormatOptions::default()
        };
        nvmq_log::mkfs::format(&mut dev, &fmt).unwrap();
        let (w, report) = recovery::open(dev, LogConfig::default()).unwrap();
        let log = Log::start(w, 64);
        let metrics = Arc::new(Metrics::new());
        metrics.attach_log(log.shared().clone(), log.geometry());
        metrics.set_recovery(&report);
        let server = MetricsServer::start("127.0.0.1:0", metrics.clone()).unwrap();

        let p = log.create_partition("m", 0).unwrap();
        for i in 0..5 {
            log.append_wait(p, vec![i as u8; 100]).unwrap();
        }
        let (head, body) = scrape(server.local_addr(), "/metrics");
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert!(head.contains("text/plain; version=0.0.4"), "{head}");
        // The partition create is an acknowledged append too.
        assert_eq!(value(&body, "nvmq_appends_acked_total"), 6.0);
        assert!(value(&body, "nvmq_payload_bytes_acked_total") >= 500.0);
        // The writer measures every ack, the create's included.
        assert_eq!(value(&body, "nvmq_append_ack_latency_seconds_count"), 6.0);
        assert_eq!(
            value(&body, "nvmq_append_ack_latency_seconds_bucket{le=\"+Inf\"}"),
            6.0
        );
        let flushes = value(&body, "nvmq_flushes_total");
        assert!(
            flushes >= 6.0,
            "one per append and the create at least: {flushes}"
        );
        assert!(value(&body, "nvmq_flush_latency_seconds_count") >= 6.0);
        assert!(value(&body, "nvmq_write_amplification") > 1.0);
        assert!(value(&body, "nvmq_records_per_flush_mean") > 0.0);
        // One durable step per append_wait: six steps of one record each.
        assert_eq!(value(&body, "nvmq_records_per_flush_count"), 6.0, "{body}");
        assert_eq!(value(&body, "nvmq_records_per_flush_bucket{le=\"1\"}"), 6.0);
        assert_eq!(value(&body, "nvmq_records_per_flush_sum"), 6.0);
        let used = value(&body, "nvmq_log_used_bytes");
        let free = value(&body, "nvmq_log_free_bytes");
        assert!(used > 0.0);
        assert_eq!(used + free, log.geometry().log_size as f64);
        assert!(value(&body, "nvmq_recovery_scanned_bytes") > 0.0);
        assert_eq!(value(&body, "nvmq_writer_fatal"), 0.0);
        // Cumulative buckets never decrease.
        let buckets: Vec<f64> = body
            .lines()
            .filter(|l| l.starts_with("nvmq_flush_latency_seconds_bucket"))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");

        let (head, _) = scrape(server.local_addr(), "/other");
        assert!(head.starts_with("HTTP/1.1 404"), "{head}");

        handle.fail_next_flush();
        assert!(log.append_wait(p, vec![1; 10]).is_err());
        let (_, body) = scrape(server.local_addr(), "/metrics");
        let line = body
            .lines()
            .find(|l| l.starts_with("nvmq_writer_fatal{"))
            .unwrap_or_else(|| panic!("no fatal line:\n{body}"));
        assert!(line.ends_with(" 1") && line.contains("flush"), "{line}");
        drop(server);
        log.shutdown();
    }

    #[test]
    fn several_devices_are_labelled_one_family_each() {
        let mut logs = Vec::new();
        let metrics = Metrics::new();
        for seed in [21, 22] {
            let (mut dev, _h) = SimDevice::new(SimConfig::new(seed, 64 << 20));
            nvmq_log::mkfs::format(&mut dev, &FormatOptions::default()).unwrap();
            let (w, _) = recovery::open(dev, LogConfig::default()).unwrap();
            let log = Log::start(w, 64);
            metrics.attach_log(log.shared().clone(), log.geometry());
            logs.push(log);
        }
        let p = logs[1].create_partition("d", 0).unwrap();
        for i in 0..3 {
            logs[1].append_wait(p, vec![i; 10]).unwrap();
        }
        let body = metrics.render();
        assert_eq!(value(&body, "nvmq_appends_acked_total{device=\"0\"}"), 0.0);
        assert_eq!(value(&body, "nvmq_appends_acked_total{device=\"1\"}"), 4.0);
        assert_eq!(
            value(
                &body,
                "nvmq_append_ack_latency_seconds_bucket{device=\"1\",le=\"+Inf\"}"
            ),
            4.0
        );
        assert_eq!(value(&body, "nvmq_writer_fatal{device=\"0\"}"), 0.0);
        // One HELP per family, whatever the number of devices.
        let helps = body
            .lines()
            .filter(|l| l.starts_with("# HELP nvmq_appends_acked_total "))
            .count();
        assert_eq!(helps, 1, "{body}");
        for l in logs {
            l.shutdown();
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
