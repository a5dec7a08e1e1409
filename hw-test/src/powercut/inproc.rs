//! CI mode 1: a broker in this process on the sim device, with a power switch that cuts the sim
//! device's power (its volatile cache torn by the crash model), drops the broker without a clean
//! shutdown, and recovers it on the same port.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use blockdev::sim::{CutReport, Latency, SimClock, SimConfig, SimDevice, SimHandle};
use frontend::{Config, Server, ServerOptions};
use nvmq_log::{FlushMode, FormatOptions, LogConfig};

use crate::powercut::{PowerSwitch, RigError};

/// The sim broker's device and log settings.
#[derive(Debug, Clone)]
pub struct SimBrokerConfig {
    /// Seeds the sim device (latencies, tie-breaks, the crash model).
    pub seed: u64,
    pub capacity: u64,
    pub write_latency: Duration,
    pub flush_latency: Duration,
    /// `Always` is nvmq's promise; `Never` acknowledges before any flush (the verifier must
    /// catch what a cut then loses).
    pub flush: FlushMode,
    /// Torn sectors may hold garbage after a cut.
    pub garbage_sectors: bool,
}

impl Default for SimBrokerConfig {
    fn default() -> Self {
        SimBrokerConfig {
            seed: 1,
            capacity: 256 << 20,
            write_latency: Duration::from_micros(20),
            flush_latency: Duration::from_micros(500),
            flush: FlushMode::Always,
            garbage_sectors: true,
        }
    }
}

struct Running {
    server: Server,
}

/// A broker serving on 127.0.0.1 over a sim device; a [`PowerSwitch`] for the controller.
pub struct SimBroker {
    handle: SimHandle,
    cfg: SimBrokerConfig,
    addr: SocketAddr,
    running: Option<Running>,
    report: Option<String>,
    last_cut: Option<CutReport>,
}

fn err(what: impl std::fmt::Display) -> RigError {
    RigError::InProcess(what.to_string())
}

impl SimBroker {
    /// Formats a fresh sim device and starts serving on an ephemeral port.
    pub fn start(cfg: SimBrokerConfig) -> Result<SimBroker, RigError> {
        let mut sc = SimConfig::new(cfg.seed, cfg.capacity);
        sc.write_latency = Latency::Fixed(cfg.write_latency);
        sc.flush_latency = Latency::Fixed(cfg.flush_latency);
        sc.garbage_sectors = cfg.garbage_sectors;
        sc.clock = SimClock::real();
        let (mut dev, handle) = SimDevice::new(sc);
        nvmq_log::mkfs::format(&mut dev, &FormatOptions::default())
            .map_err(|e| err(format!("formatting the sim device: {e}")))?;
        let (running, addr, report) = serve(dev, 0, cfg.flush)?;
        Ok(SimBroker {
            handle,
            cfg,
            addr,
            running: Some(running),
            report: Some(report),
            last_cut: None,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn handle(&self) -> &SimHandle {
        &self.handle
    }

    /// The flush mode the broker recovers with at its next power-on (a test turns a sound broker
    /// into one that acknowledges before flushing, mid-run).
    pub fn set_flush(&mut self, flush: FlushMode) {
        self.cfg.flush = flush;
    }
}

/// Recovers the log on `dev` and serves it on 127.0.0.1:`port` (0: any free port).
fn serve(
    dev: SimDevice,
    port: u16,
    flush: FlushMode,
) -> Result<(Running, SocketAddr, String), RigError> {
    let lc = LogConfig {
        flush,
        ..LogConfig::default()
    };
    let queue = lc.queue_capacity;
    let (writer, report) =
        recovery::open(dev, lc).map_err(|e| err(format!("recovering the log: {e}")))?;
    // The old listener goes away with its loop, in the background: retry for a while.
    let started = Instant::now();
    let listener = loop {
        match std::net::TcpListener::bind(("127.0.0.1", port)) {
            Ok(l) => break l,
            Err(e) if started.elapsed() > Duration::from_secs(10) => {
                return Err(err(format!("binding 127.0.0.1:{port}: {e}")))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    let addr = listener
        .local_addr()
        .map_err(|e| err(format!("reading the bound address: {e}")))?;
    let fc = Config {
        advertise_host: "127.0.0.1".into(),
        advertise_port: i32::from(addr.port()),
        ..Config::default()
    };
    let opts = ServerOptions {
        queue_capacity: queue,
        ..ServerOptions::default()
    };
    let server = Server::start(vec![writer], listener, fc, opts)
        .map_err(|e| err(format!("opening the broker: {e}")))?;
    Ok((Running { server }, addr, report.to_string()))
}

impl PowerSwitch for SimBroker {
    /// The power goes first, so that nothing more reaches the medium while the broker is torn
    /// down (dropping the log would otherwise stop it cleanly, flushing in relaxed modes).
    fn cut(&mut self) -> Result<(), RigError> {
        self.last_cut = Some(self.handle.power_cut());
        if let Some(r) = self.running.take() {
            // Off this thread: the old writer may wait on I/O the dead device never completes.
            let spawned = std::thread::Builder::new()
                .name("nvmq-sim-teardown".into())
                .spawn(move || {
                    r.server.kill();
                });
            spawned.map_err(|e| err(format!("starting the teardown thread: {e}")))?;
        }
        Ok(())
    }

    fn restore(&mut self) -> Result<(), RigError> {
        let dev = self.handle.power_on();
        let (running, _, report) = serve(dev, self.addr.port(), self.cfg.flush)?;
        self.running = Some(running);
        self.report = Some(report);
        Ok(())
    }

    fn recovery_report(&mut self) -> Option<String> {
        let mut s = self.report.take()?;
        if let Some(c) = self.last_cut.take() {
            s.push_str(&format!(
                "\nsim cut: {} cached + {} in-flight writes: {} landed, {} lost, {} torn ({} garbage sectors); {} I/Os dropped",
                c.cached, c.in_flight_writes, c.survived, c.lost, c.torn, c.garbage_sectors, c.dropped_ios
            ));
        }
        Some(s)
    }
}

impl Drop for SimBroker {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            r.server.kill();
        }
    }
}
