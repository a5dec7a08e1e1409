//! Opening a stopped broker's own state (users, ACLs) from its first device, for the commands
//! that change it offline (`nvmq user`, `nvmq acl`). They open the log exclusively, as `serve`
//! does, and write through the same durable meta records the Kafka APIs write.

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use frontend::Broker;
use nvmq_log::{Log, LogConfig};

use crate::devspec::DeviceSpec;

/// Opens the log on `device` (recovering it as serve would) and the broker state over it.
pub fn open(device: &str) -> Result<Arc<Broker>> {
    let spec: DeviceSpec = device.parse()?;
    if matches!(spec, DeviceSpec::Sim(_)) {
        bail!("--device {device}: a sim device lives only inside one process; a broker's users and ACLs are kept on a file or NVMe device");
    }
    let dev = spec
        .open(None, |_| Ok(()))
        .with_context(|| format!("opening {device} (is nvmq serve running on it? stop it first, or use a Kafka admin client against the running broker)"))?;
    let cfg = LogConfig::default();
    let (writer, _report) =
        recovery::open(dev, cfg.clone()).with_context(|| format!("opening the log on {device}"))?;
    let log = Log::start(writer, cfg.queue_capacity);
    Broker::open(log, cfg.queue_capacity, frontend::Config::default())
        .with_context(|| format!("opening the broker state on {device}"))
}

/// The runtime the broker's async calls run on (one thread: the command does one thing).
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a runtime")
}
