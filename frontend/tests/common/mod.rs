#![allow(dead_code)] // each test binary uses its own part of these helpers
//! An in-process broker over a sim device, on an ephemeral port.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use blockdev::sim::{Latency, SimClock, SimConfig, SimDevice};
use frontend::{Broker, Config};
use nvmq_log::{FormatOptions, Log, LogConfig};

pub fn broker(cfg: Config) -> Arc<Broker> {
    let mut c = SimConfig::new(7, 128 << 20);
    c.flush_latency = Latency::Fixed(Duration::from_micros(200));
    c.clock = SimClock::real();
    let (mut dev, _h) = SimDevice::new(c);
    nvmq_log::mkfs::format(&mut dev, &FormatOptions::default()).expect("format");
    let lc = LogConfig::default();
    let (w, _) = recovery::open(dev, lc.clone()).expect("open");
    let log = Log::start(w, lc.queue_capacity);
    Broker::open(log, lc.queue_capacity, cfg).expect("broker")
}

/// Starts serving; returns the address.
pub async fn serve(cfg: Config) -> (SocketAddr, Arc<Broker>) {
    let b = broker(cfg);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    let b2 = b.clone();
    tokio::spawn(async move { frontend::serve(b2, l, std::future::pending()).await });
    (addr, b)
}
