//! One line per scenario: the table, the JSON, and the broker's memory from /proc.

use anyhow::{anyhow, Context, Result};
use hdrhistogram::Histogram;
use serde::Serialize;

/// p50, p99 and max of a histogram of ns, in µs.
#[derive(Serialize, Debug, Clone, Copy, Default)]
pub struct Latency {
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl Latency {
    pub fn of(h: &Histogram<u64>) -> Latency {
        if h.is_empty() {
            return Latency::default();
        }
        let us = |v: u64| v as f64 / 1e3;
        Latency {
            p50_us: us(h.value_at_quantile(0.5)),
            p99_us: us(h.value_at_quantile(0.99)),
            max_us: us(h.max()),
        }
    }
}

#[derive(Serialize, Debug, Clone)]
pub struct E2eFigures {
    /// Records the consumer received in the window whose ack the producers saw.
    pub matched: u64,
    /// Of those, received before their ack (counted as 0 in `ack_to_receive`).
    pub early: u64,
    pub ack_to_receive: Latency,
    pub send_to_receive: Latency,
    pub producer_acks_per_s: f64,
    pub producer_ack: Latency,
    /// The consumer's Fetch requests answered in the window, and their round trips.
    pub fetches: u64,
    pub records_per_fetch: f64,
    pub fetch: Latency,
}

#[derive(Serialize, Debug, Clone)]
pub struct CatchupFigures {
    pub records: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub mb_per_s: f64,
    pub fetches: u64,
    pub fill_records: u64,
    pub fill_seconds: f64,
    pub fill_records_per_s: f64,
}

/// The broker's memory (from /proc/<pid>/status), in KiB.
#[derive(Serialize, Debug, Clone, Copy)]
pub struct Memory {
    pub server_pid: u32,
    pub rss_before_kib: u64,
    pub hwm_before_kib: u64,
    /// Read with the connections still open, after the load.
    pub rss_after_kib: u64,
    pub hwm_after_kib: u64,
    pub rss_per_connection_kib: f64,
    pub hwm_per_connection_kib: f64,
}

#[derive(Serialize, Debug, Clone)]
pub struct Line {
    pub scenario: String,
    pub kind: &'static str,
    pub connections: usize,
    pub in_flight: usize,
    pub records_per_request: usize,
    /// Seconds measured (the window; for catchup, the read).
    pub seconds: f64,
    /// The line's rate: acks/s (one record per request) or records/s.
    pub ops_per_s: f64,
    pub unit: &'static str,
    pub requests: u64,
    pub records: u64,
    pub requests_per_s: f64,
    pub records_per_s: f64,
    /// Produce acks (closed, pipelined, batched, conns), the record's ack to its receipt (e2e),
    /// or a Fetch's round trip (catchup).
    pub latency: Latency,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub e2e: Option<E2eFigures>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub catchup: Option<CatchupFigures>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
}

#[derive(Serialize, Debug)]
pub struct Report {
    pub broker: String,
    pub record_size: usize,
    pub partitions: u32,
    pub warmup_s: f64,
    pub duration_s: f64,
    pub client_threads: usize,
    pub scenarios: Vec<Line>,
}

pub fn header() -> String {
    format!(
        "{:<18} {:>6} {:>12} {:<10} {:>9} {:>9} {:>9}  {}",
        "scenario", "conns", "ops/s", "unit", "p50 us", "p99 us", "max us", "notes"
    )
}

pub fn row(l: &Line) -> String {
    let notes = match (&l.e2e, &l.catchup, &l.memory) {
        (Some(e), _, _) => format!(
            "ack->receive; send->receive p50 {:.0} p99 {:.0} us; {} of {} received before their ack; producers {:.0} acks/s; {:.1} records per Fetch",
            e.send_to_receive.p50_us, e.send_to_receive.p99_us, e.early, e.matched, e.producer_acks_per_s,
            e.records_per_fetch
        ),
        (_, Some(c), _) => format!(
            "per Fetch; {:.1} MB/s, {} records in {:.2} s; fill {:.0} records/s",
            c.mb_per_s, c.records, c.seconds, c.fill_records_per_s
        ),
        (_, _, Some(m)) => format!(
            "server RSS {:.1} -> {:.1} MiB, HWM {:.1} MiB: {:.1} KiB per connection",
            m.rss_before_kib as f64 / 1024.0,
            m.rss_after_kib as f64 / 1024.0,
            m.hwm_after_kib as f64 / 1024.0,
            m.rss_per_connection_kib
        ),
        _ if l.kind == "batched" => format!("{:.0} requests/s", l.requests_per_s),
        _ if l.kind == "conns" => "pass --server-pid to see the broker's memory".into(),
        _ => String::new(),
    };
    format!(
        "{:<18} {:>6} {:>12.0} {:<10} {:>9.0} {:>9.0} {:>9.0}  {}",
        l.scenario,
        l.connections,
        l.ops_per_s,
        l.unit,
        l.latency.p50_us,
        l.latency.p99_us,
        l.latency.max_us,
        notes
    )
}

/// VmRSS and VmHWM of a process, in KiB.
pub fn rss_hwm(pid: u32) -> Result<(u64, u64)> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("--server-pid {pid}: reading {path}"))?;
    parse_status(&text).ok_or_else(|| anyhow!("--server-pid {pid}: no VmRSS/VmHWM in {path}"))
}

fn parse_status(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_in_kib() {
        let s = "Name:\tnvmq\nVmPeak:\t  99 kB\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(parse_status(s), Some((10240, 20480)));
        assert_eq!(parse_status("Name:\tx\n"), None);
        assert!(rss_hwm(std::process::id()).is_ok());
        let e = format!("{:#}", rss_hwm(u32::MAX).unwrap_err());
        assert!(e.contains("--server-pid"), "{e}");
    }
}
