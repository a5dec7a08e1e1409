//! Sim devices with a running log under a Raft group, and power cycles of them.
#![allow(dead_code)]

pub mod net;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use blockdev::sim::{Latency, SimConfig, SimDevice, SimHandle};
use nvmq_cluster::{open_group, ClusterError, Entry, LogStore, StateMachine};
use nvmq_log::config::{FormatOptions, LogConfig};
use nvmq_log::Log;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::type_config::TypeConfigExt;

const MIB: u64 = 1 << 20;

/// A sim device (volatile cache, a flush that takes a while so that cuts land between writes
/// and their flush) and its power switch.
pub fn sim(seed: u64) -> (SimDevice, SimHandle) {
    let mut c = SimConfig::new(seed, 32 * MIB);
    c.flush_latency = Latency::Fixed(Duration::from_micros(200));
    SimDevice::new(c)
}

pub fn format_options() -> FormatOptions {
    FormatOptions {
        window: MIB,
        max_batch: 256 << 10,
        log_size: None,
        format_id: None,
    }
}

/// A small ring (1 MiB) that wraps after a few MiB of appends.
pub fn small_ring() -> (FormatOptions, LogConfig) {
    let fmt = FormatOptions {
        window: 64 << 10,
        max_batch: 16 << 10,
        log_size: Some(MIB),
        format_id: None,
    };
    let cfg = LogConfig {
        recovery_lag: 128 << 10,
        tail_cache_bytes: 0,
        ..LogConfig::default()
    };
    (fmt, cfg)
}

/// Recovers the log on `dev` (formatting it first when given options) and starts its writer.
pub fn start(
    mut dev: SimDevice,
    format: Option<&FormatOptions>,
    cfg: &LogConfig,
) -> Result<Arc<Log>, String> {
    if let Some(fmt) = format {
        nvmq_log::mkfs::format(&mut dev, fmt).map_err(|e| format!("format: {e}"))?;
    }
    let (w, _report) = recovery::open(dev, cfg.clone()).map_err(|e| format!("recover: {e}"))?;
    Ok(Arc::new(Log::start(w, cfg.queue_capacity)))
}

/// A node's device and the log on it.
pub struct Node {
    pub handle: SimHandle,
    pub log: Arc<Log>,
    cfg: LogConfig,
}

impl Node {
    pub fn new(seed: u64) -> Result<Node, String> {
        Node::with(seed, &format_options(), LogConfig::default())
    }

    pub fn with(seed: u64, fmt: &FormatOptions, cfg: LogConfig) -> Result<Node, String> {
        let (dev, handle) = sim(seed);
        Ok(Node {
            log: start(dev, Some(fmt), &cfg)?,
            handle,
            cfg,
        })
    }

    pub fn open(&self, group: u32) -> Result<(LogStore, StateMachine), ClusterError> {
        open_group(self.log.clone(), group)
    }

    /// Cuts the power (the volatile cache survives whole, torn or not at all, per write), then
    /// powers on and recovers. The caller must have dropped the group's stores.
    pub fn power_cycle(self) -> Result<Node, String> {
        self.handle.power_cut();
        let Node { handle, log, cfg } = self;
        drop(log);
        let dev = handle.power_on();
        Ok(Node {
            log: start(dev, None, &cfg)?,
            handle,
            cfg,
        })
    }
}

/// Normal entry `index` of `term`, carrying `data`.
pub fn normal(term: u64, index: u64, data: Vec<u8>) -> Entry {
    Entry {
        log_id: nvmq_cluster::LogId::new_term_index(term, index),
        payload: openraft::EntryPayload::Normal(nvmq_cluster::Request::from(data)),
    }
}

/// Appends `entries` and waits for the flush callback; returns what it reported.
pub async fn append(ls: &mut LogStore, entries: Vec<Entry>) -> io::Result<()> {
    let (tx, rx) = nvmq_cluster::TypeConfig::oneshot();
    ls.append(entries, IOFlushed::signal(tx)).await?;
    rx.await
        .map_err(|_| io::Error::other("append callback dropped"))?
}
