//! `nvmq serve`: the Kafka protocol broker over one device or several.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use nvmq_log::{FlushMode, FormatOptions, LogConfig};

use crate::devspec::DeviceSpec;

const DEFAULT_DEVICE: &str = "file:./nvmq-data/nvmq.img";

#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub listen: String,
    /// host:port clients are told to connect to (Metadata, FindCoordinator); defaults to the
    /// listening address.
    #[arg(long)]
    pub advertise: Option<String>,
    /// Device: `file:<path>[,engine=uring|threads|auto]` (created and formatted if missing, else
    /// recovered) or `sim[:...]` (in memory, formatted at every start). Repeat it for several
    /// devices: one log and one writer each, partitions spread over them; device i is written
    /// by event loop i mod --loops. Give the same set, in the same order, at every start.
    #[arg(long, default_value = DEFAULT_DEVICE, action = clap::ArgAction::Append)]
    pub device: Vec<String>,
    /// Size of a device file created on first start.
    #[arg(long, default_value = "1G")]
    pub size: String,
    /// always (ack after the covering flush), interval:<ms>, never.
    #[arg(long, default_value = "always")]
    pub flush: String,
    /// Partitions of auto-created topics.
    #[arg(long, default_value_t = 1)]
    pub default_partitions: u32,
    /// Do not create unknown topics named in Metadata requests.
    #[arg(long)]
    pub no_auto_create: bool,
    /// Largest request frame accepted.
    #[arg(long, default_value = "8M")]
    pub max_frame: String,
    /// An idempotent producer not seen for this long is forgotten, in memory and in the
    /// snapshots (Kafka's producer.id.expiration.ms); a later batch of it counts as from a new
    /// producer.
    #[arg(long, value_parser = crate::devspec::parse_duration, default_value = "1d")]
    pub producer_id_expiration: Duration,
    /// Benchmark ceiling: answer Produce (decoded and checked as always) without touching the
    /// log, so nothing is stored. Shows what the request/response path alone allows; for
    /// `kafka-bench` comparisons only.
    #[arg(long)]
    pub ceiling: bool,
    /// Event loops (threads), each owning its connections and, for the loop owning a device,
    /// that device's writer; 0: one per core.
    #[arg(long, default_value_t = 0)]
    pub loops: usize,
    /// Do not pin loop i to core i.
    #[arg(long)]
    pub no_pin: bool,
    /// How long a loop with device I/O in flight keeps polling before it sleeps (e.g. 50us; 0:
    /// it sleeps at once). Trades a core's time for the cost of waking up.
    #[arg(long, value_parser = crate::devspec::parse_duration, default_value = "0")]
    pub spin: Duration,
    /// Serve Prometheus metrics on http://<addr>/metrics (e.g. 127.0.0.1:9464).
    #[arg(long)]
    pub metrics_addr: Option<String>,
}

pub fn run(args: ServeArgs) -> Result<()> {
    let specs: Vec<DeviceSpec> = args
        .device
        .iter()
        .map(|d| d.parse())
        .collect::<Result<_>>()?;
    let size = crate::devspec::parse_size(&args.size)?;
    let max_frame = crate::devspec::parse_size(&args.max_frame)?;
    let flush: FlushMode = args.flush.parse().map_err(|e: String| anyhow!(e))?;
    if args.default_partitions == 0 {
        bail!("--default-partitions must be at least 1");
    }
    let listen: SocketAddr = args
        .listen
        .parse()
        .with_context(|| format!("--listen {:?}: expected host:port", args.listen))?;
    let cfg = LogConfig {
        flush,
        ..LogConfig::default()
    };
    let queue = cfg.queue_capacity;
    let mut writers = Vec::new();
    let mut reports = Vec::new();
    for (spec, name) in specs.iter().zip(&args.device) {
        let fresh = match spec {
            DeviceSpec::File { path, .. } => !Path::new(path).exists(),
            DeviceSpec::Sim(_) => true,
            // A namespace is never formatted implicitly: `nvmq format --device nvme:...` first.
            DeviceSpec::Nvme { .. } => false,
        };
        let dev = spec.open(Some(size), |dev| {
            if !fresh {
                return Ok(());
            }
            nvmq_log::mkfs::format_device(dev, &FormatOptions::default())
        })?;
        if fresh {
            println!("formatted a new log on {name}");
        }
        let (writer, report) = recovery::open(dev, cfg.clone())
            .with_context(|| format!("opening the log on {name}"))?;
        if specs.len() > 1 {
            println!("device {}: {name}", writers.len());
        }
        println!("{report}");
        writers.push(writer);
        reports.push(report);
    }
    let Some(writer) = writers.first() else {
        bail!("--device: at least one device is needed");
    };
    println!(
        "{}",
        flush.loss_window(writer.geometry().window).unwrap_or_else(|| {
            "flush mode always: every ack follows the device flush covering it; a power cut loses no acknowledged record".into()
        })
    );
    let _metrics_server = match &args.metrics_addr {
        Some(addr) => {
            let metrics = Arc::new(crate::metrics::Metrics::new());
            for w in &writers {
                metrics.attach_log(w.shared(), w.geometry());
            }
            if let Some(report) = reports.first() {
                metrics.set_recovery(report);
            }
            let server = crate::metrics::MetricsServer::start(addr.as_str(), metrics)
                .with_context(|| format!("--metrics-addr {addr}: cannot listen"))?;
            println!("metrics on http://{}/metrics", server.local_addr());
            Some(server)
        }
        None => None,
    };

    let listener =
        std::net::TcpListener::bind(listen).with_context(|| format!("listening on {listen}"))?;
    let bound = listener.local_addr().context("reading the bound address")?;
    let (host, port) = match &args.advertise {
        Some(a) => {
            let (h, p) = a
                .rsplit_once(':')
                .ok_or_else(|| anyhow!("--advertise {a:?}: expected host:port"))?;
            let p: i32 = p
                .parse()
                .ok()
                .filter(|p| (1..=65535).contains(p))
                .ok_or_else(|| anyhow!("--advertise {a:?}: port must be 1..65535"))?;
            (h.to_string(), p)
        }
        // Clients reconnect to the advertised address: 0.0.0.0 would send them nowhere.
        None if bound.ip().is_unspecified() => {
            eprintln!("note: listening on {bound}; advertising 127.0.0.1 (pass --advertise host:port for remote clients)");
            ("127.0.0.1".to_string(), i32::from(bound.port()))
        }
        None => (bound.ip().to_string(), i32::from(bound.port())),
    };
    let fcfg = frontend::Config {
        advertise_host: host.clone(),
        advertise_port: port,
        auto_create_topics: !args.no_auto_create,
        default_partitions: args.default_partitions,
        max_frame: usize::try_from(max_frame).unwrap_or(usize::MAX),
        producer_id_expiration: args.producer_id_expiration,
        ceiling: args.ceiling,
        ..frontend::Config::default()
    };
    let opened = std::time::Instant::now();
    let opts = frontend::ServerOptions {
        loops: args.loops,
        pin: !args.no_pin,
        spin: args.spin,
        queue_capacity: queue,
        ..frontend::ServerOptions::default()
    };
    let server = frontend::Server::start(writers, listener, fcfg, opts)
        .context("opening the broker state")?;
    let st = server.broker().startup();
    println!(
        "producer state: {} partitions from snapshots, {} replayed in full, {} records replayed, {} producers expired ({:.3} s)",
        st.partitions_from_snapshot,
        st.partitions_replayed_in_full,
        st.records_replayed,
        st.producers_expired,
        opened.elapsed().as_secs_f64()
    );
    if args.ceiling {
        println!("CEILING MODE: Produce is answered without storing anything (benchmark only)");
    }
    println!(
        "nvmq serving Kafka on {bound} (advertised as {host}:{port}), {} event loops",
        server.loops()
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the signal runtime")?;
    rt.block_on(stop_signal());
    println!("stopping: signal received");
    // A clean stop waits (boundedly) for appends in flight; a second signal stops at once, as
    // a crash would: what was acknowledged is durable, the rest is the clients' to retry.
    let forced = std::thread::Builder::new()
        .name("nvmq-signal".into())
        .spawn(move || {
            rt.block_on(stop_signal());
            eprintln!("second signal: stopping at once, without waiting for appends in flight");
            std::process::exit(1);
        });
    if let Err(e) = forced {
        tracing::warn!(error = %e, "no thread for a second signal; the clean stop runs to its end");
    }
    server.shutdown().context("stopping")?;
    println!("nvmq stopped");
    Ok(())
}

/// SIGINT or SIGTERM.
async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
