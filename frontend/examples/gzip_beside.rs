//! What a connection sees while another connection on the same event loop produces large gzip
//! batches: the latency of its small produces, alone and beside the gzip producer, plus what one
//! check of such a batch costs. In process, over a sim device (200 µs flushes), one event loop.
//!
//!     cargo run --release -p nvmq-frontend --example gzip_beside [-- SECONDS [BATCH_KIB]]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use frontend::client::{record_batch, Client};
use frontend::{Config, Server, ServerOptions};
use kafka_protocol::messages::ProduceRequest;
use kafka_protocol::records::Compression;

#[path = "../tests/common/mod.rs"]
mod common;
use common::kafka_batches::batch_of;

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let kib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let run = Duration::from_secs(secs.max(1));

    let batch = gzip_batch(kib << 10);
    let server = start();
    let addr = server.local_addr();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let mut c = Client::connect(addr, "setup").await.expect("connect");
        for t in ["small", "gzip"] {
            common::create_topic(&mut c, t).await;
        }
        println!(
            "gzip batch: {} KiB on the wire, one check of its records {:.2} ms (median of 9)",
            batch.len() >> 10,
            check_ms(&batch)
        );
        let alone = small_latencies(addr, run).await;
        report("small produces alone", &alone, None);
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let bg = {
            let (stop, done, batch) = (stop.clone(), done.clone(), batch.clone());
            tokio::spawn(async move {
                let mut g = Client::connect(addr, "gzip").await.expect("connect");
                let req = produce("gzip", batch);
                while !stop.load(Ordering::Relaxed) {
                    let r = g.call(7, &req).await.expect("gzip produce");
                    assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before = done.load(Ordering::Relaxed);
        let beside = small_latencies(addr, run).await;
        let rate = (done.load(Ordering::Relaxed) - before) as f64 / run.as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let _ = bg.await;
        report(
            "small produces beside the gzip producer",
            &beside,
            Some(rate),
        );
    });
    drop(server);
}

/// One closed-loop connection producing one small record at a time for `run`: each latency.
async fn small_latencies(addr: std::net::SocketAddr, run: Duration) -> Vec<Duration> {
    let mut c = Client::connect(addr, "small").await.expect("connect");
    let req = produce("small", record_batch(&[&[7u8; 100]], None));
    let mut out = Vec::new();
    let end = Instant::now() + run;
    while Instant::now() < end {
        let t = Instant::now();
        let r = c.call(7, &req).await.expect("small produce");
        out.push(t.elapsed());
        assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
    }
    out
}

fn report(what: &str, lat: &[Duration], gzip_per_s: Option<f64>) {
    let mut v = lat.to_vec();
    v.sort();
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
    let gz = gzip_per_s.map_or(String::new(), |r| format!(", gzip batches {r:.1}/s"));
    println!(
        "{what}: {} acks, p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms{gz}",
        v.len(),
        at(0.5),
        at(0.99),
        at(0.999),
        at(1.0)
    );
}

/// Median time of `records::check` over the batch, in ms.
fn check_ms(b: &[u8]) -> f64 {
    let info = frontend::batch::check(b).expect("batch");
    let checks = frontend::records::Checks::default();
    let mut t: Vec<f64> = (0..9)
        .map(|_| {
            let s = Instant::now();
            frontend::records::check(b, &info, &checks).expect("records");
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[4]
}

fn start() -> Server {
    // Batches of up to 4 MiB, so that a 1 MiB Kafka batch fits one log record.
    let (dev, _) = common::sim_device_batches(5, 1 << 30, 200, 4 << 20);
    let opts = ServerOptions {
        loops: 1,
        ..ServerOptions::default()
    };
    common::serve_devices_opts(vec![dev], Default::default(), Config::default(), opts)
}

fn produce(t: &str, batch: Vec<u8>) -> ProduceRequest {
    common::produce_request(t, 0, batch, -1)
}

/// A gzip batch of about `wire` bytes of text-like records (words from a small vocabulary,
/// compressing about 3:1 as log lines do).
fn gzip_batch(wire: usize) -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "GET",
        "/api/v1/items",
        "200",
        "user=",
        "latency_ms=",
        "POST",
        "ok",
        "error",
        "retry",
        "session",
        "region=eu",
        "cache",
        "miss",
        "hit",
        "bytes=",
        "trace",
    ];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut line = |n: usize| {
        let mut v = String::new();
        while v.len() < n {
            let r = next();
            v.push_str(WORDS[(r % 16) as usize]);
            v.push_str(&(r >> 40).to_string());
            v.push(' ');
        }
        Bytes::from(v)
    };
    let mut values: Vec<Bytes> = (0..256).map(|_| line(200)).collect();
    loop {
        let b = batch_of(&values, Compression::Gzip);
        if b.len() >= wire {
            return b;
        }
        let more = (values.len() * (wire - b.len()) / b.len()).max(16);
        values.extend((0..more).map(|_| line(200)));
    }
}
