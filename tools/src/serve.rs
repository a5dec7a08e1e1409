//! `nvmq serve`: the Kafka protocol broker over one device or several.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nvmq_log::Shared;
use nvmq_log::{FlushMode, FormatOptions, LogConfig};
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::devspec::DeviceSpec;
use crate::Status;

pub const DEFAULT_DEVICE: &str = "file:./nvmq-data/nvmq.img";

/// How often serve looks whether a writer stopped. Polled rather than waited for: a waiter on
/// the log's condition variable would make every flush's notification a system call.
const WATCH_EVERY: Duration = Duration::from_millis(50);
/// How long the broker may take to stop after a writer stopped before the process exits anyway
/// (recovery at the next start makes up for whatever it did not finish).
const FAILED_STOP_BOUND: Duration = Duration::from_secs(5);

/// The longest `--writer-stop-grace`: a broker whose writer stopped only keeps /metrics up, so a
/// longer wait only delays the restart that recovers it.
const MAX_WRITER_STOP_GRACE: Duration = Duration::from_secs(600);

#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub listen: String,
    /// Listen on an address other than loopback without TLS or SASL: anyone who reaches the port
    /// can read, write and delete every topic. Without it (or --tls-cert, or
    /// --sasl-mechanisms), a non-loopback --listen is refused.
    #[arg(long)]
    pub insecure_network: bool,
    /// Serve the Kafka listener over TLS with this certificate (PEM: the server's certificate
    /// first, then any intermediates clients need). Needs --tls-key. Re-read on SIGHUP.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM: PKCS#8, RSA or EC). Re-read on SIGHUP.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require a client certificate signed by one of these CAs (PEM) from every client (mTLS);
    /// the client's principal is then `User:<subject DN>`. Needs --tls-cert. Re-read on SIGHUP.
    #[arg(long, requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// SASL mechanisms offered, comma-separated: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512. When set,
    /// a connection must authenticate before any request but ApiVersions and SASL's own; users
    /// come from `nvmq user add` or AlterUserScramCredentials. PLAIN sends the password in the
    /// clear: use it only on a trusted network.
    #[arg(long, value_delimiter = ',', value_parser = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])]
    pub sasl_mechanisms: Vec<String>,
    /// How long a SASL authentication holds; clients re-authenticate on their connection before
    /// it ends (KIP-368), and a connection that did not is closed at its next request (Kafka's
    /// connections.max.reauth.ms). 0: for the connection's life.
    #[arg(long, value_parser = crate::devspec::parse_duration, default_value = "0")]
    pub sasl_session_lifetime: Duration,
    /// host:port clients are told to connect to (Metadata, FindCoordinator); defaults to the
    /// listening address.
    #[arg(long)]
    pub advertise: Option<String>,
    /// Device: `file:<path>[,engine=uring|threads|auto][,flush_fds=N]` (created and formatted if
    /// missing, else recovered), `nvme:<pci>[,ns=<id>][,io_timeout_ms=<ms>]` (a controller bound
    /// to vfio-pci, formatted first with `nvmq format`) or `sim[:...]` (in memory, formatted at
    /// every start). Repeat it for several
    /// devices: one log and one writer each, partitions spread over them; device i is written
    /// by event loop i mod --loops. Give the same set, in the same order, at every start.
    #[arg(long, default_value = DEFAULT_DEVICE, action = clap::ArgAction::Append)]
    pub device: Vec<String>,
    /// Size of a device file created on first start.
    #[arg(long, value_parser = crate::devspec::parse_size, default_value = "1G")]
    pub size: u64,
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
    #[arg(long, value_parser = crate::devspec::parse_positive_size, default_value = "8M")]
    pub max_frame: usize,
    /// Bytes one connection may hold (requests read and not yet answered, answers not yet
    /// sent); past it the connection reads nothing more until its client reads its answers.
    #[arg(long, value_parser = crate::devspec::parse_positive_size, default_value = "64M")]
    pub max_connection_bytes: usize,
    /// The same over all connections (Kafka's queued.max.request.bytes): past it only
    /// connections holding nothing start a request, past twice it none.
    #[arg(long, value_parser = crate::devspec::parse_positive_size, default_value = "256M")]
    pub max_queued_bytes: usize,
    /// Largest Fetch answer, whatever the client asks (Kafka's fetch.max.bytes).
    #[arg(long, value_parser = crate::devspec::parse_positive_size, default_value = "32M")]
    pub fetch_max_bytes: usize,
    /// Connections open at once; one more is closed at once.
    #[arg(long, default_value_t = 16_384)]
    pub max_connections: usize,
    /// Connections open at once from one client address.
    #[arg(long, default_value_t = 4_096)]
    pub max_connections_per_ip: usize,
    /// A connection whose answers wait this long for its client to read them is closed.
    #[arg(long, value_parser = crate::devspec::parse_duration, default_value = "60s")]
    pub write_timeout: Duration,
    /// Largest number of bytes the records of one compressed batch may decompress to: they
    /// are decompressed (as a stream) to be counted and checked, and a batch yielding more is
    /// refused with MESSAGE_TOO_LARGE. Bounds what a decompression bomb costs.
    #[arg(long, value_parser = crate::devspec::parse_positive_size, default_value = "16M")]
    pub max_uncompressed_batch: usize,
    /// An idempotent producer not seen for this long is forgotten, in memory and in the
    /// snapshots (Kafka's producer.id.expiration.ms); a later batch of it counts as from a new
    /// producer.
    #[arg(long, value_parser = crate::devspec::parse_duration, default_value = "1d")]
    pub producer_id_expiration: Duration,
    /// A consumer group with no members that commits nothing for this long is deleted with its
    /// committed offsets (Kafka's offsets.retention.minutes). A restart starts every group's
    /// clock afresh (commits are stored without a time), so offsets are never dropped early.
    #[arg(long, value_parser = crate::devspec::parse_duration, default_value = "7d")]
    pub offsets_retention: Duration,
    /// A consumer group that was empty waits this long for more members before its first
    /// rebalance completes, and as long again for each member that arrives meanwhile (within the
    /// rebalance timeout), so consumers started together share one generation (Kafka's
    /// group.initial.rebalance.delay.ms, whose default is 3s; 0 completes at the first join).
    #[arg(long, value_parser = crate::devspec::parse_duration, default_value = "0")]
    pub group_initial_rebalance_delay: Duration,
    /// Run as one node of a cluster (docs/cluster.md "Running a cluster"): this node's id,
    /// one of --peers. Every partition is then replicated over Raft on all nodes, and a
    /// Produce is answered once a majority has it durable.
    #[arg(long, requires = "peers")]
    pub node_id: Option<u64>,
    /// Every node of the cluster, this one included (at least 3), comma-separated, each
    /// `ID=KAFKA_HOST:PORT/INTERNAL_HOST:PORT`: the address Kafka clients reach it at, and the
    /// one the nodes' Raft traffic goes to (unauthenticated yet: off loopback only with
    /// --insecure-network). Give every node the same list.
    #[arg(long, value_delimiter = ',', requires = "node_id")]
    pub peers: Vec<String>,
    /// In a cluster: how many entries the Raft log keeps past what every node holds before
    /// each node snapshots its bookkeeping and purges them (docs/cluster.md "Snapshots and
    /// compaction"). A node that is down keeps every node's log growing until it returns. 0:
    /// never purge.
    #[arg(long, default_value_t = frontend::replica::COMPACT_EVERY)]
    pub raft_compact_entries: u64,
    /// In a cluster: the most commands (a Produce's record batch, a topic) the leader writes
    /// as one Raft entry. Those that arrive while earlier entries are being replicated wait
    /// and go together, without a timer (docs/cluster.md "Group commit at the group's door").
    /// 1: every command is an entry of its own.
    #[arg(long, default_value_t = frontend::replica::MERGE_COMMANDS)]
    pub raft_merge_commands: usize,
    /// Benchmark ceiling: answer Produce (decoded and checked as always) without touching the
    /// log, so nothing is stored. Shows what the request/response path alone allows; for
    /// `kafka-bench` comparisons only.
    #[arg(long)]
    pub ceiling: bool,
    /// Check every request against the ACLs (managed through CreateAcls, DescribeAcls and
    /// DeleteAcls, e.g. an AdminClient's create_acls); a request without an ACL allowing it is
    /// denied. Without it everything is allowed and the ACL APIs answer SECURITY_DISABLED.
    #[arg(long)]
    pub authorizer: bool,
    /// Principals the authorizer lets do anything, comma-separated (User:admin,User:ops).
    #[arg(long, value_delimiter = ',', value_parser = parse_principal)]
    pub super_users: Vec<frontend::session::Principal>,
    /// Event loops (threads), each owning its connections and, for the loop owning a device,
    /// that device's writer; 0: one per core.
    #[arg(long, default_value_t = 0)]
    pub loops: usize,
    /// Do not pin loop i to core i.
    #[arg(long)]
    pub no_pin: bool,
    /// How long a loop with device I/O in flight keeps polling before it sleeps (e.g. 50us; 0:
    /// it sleeps at once). Trades a core's time for the cost of waking up. `auto`: 50us when no
    /// device has a volatile write cache (power-loss-protected NVMe, `sim:plp=true`: an I/O
    /// completes sooner than a sleeping loop wakes), 0 otherwise (a flush of a volatile cache
    /// takes long enough that polling through it would only burn the core).
    #[arg(long, value_parser = parse_spin, default_value = "auto")]
    pub spin: Spin,
    /// Serve Prometheus metrics on http://<addr>/metrics (e.g. 127.0.0.1:9464).
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// After a device's writer stops (a failed write or flush), how long /metrics keeps
    /// answering before the process exits with status 5; Kafka connections are answered and
    /// closed at once. Raise it to your scrape interval to have the failure scraped (at most
    /// 10m).
    #[arg(long, value_parser = crate::devspec::parse_duration, default_value = "2s")]
    pub writer_stop_grace: Duration,
}

/// `--spin`: a duration, or `auto` (decided by the devices' write caches).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Spin {
    Auto,
    Fixed(Duration),
}

/// What `--spin auto` polls for when no device has a volatile write cache.
const PLP_SPIN: Duration = Duration::from_micros(50);

impl Spin {
    fn resolve<D: blockdev::BlockDevice>(self, writers: &[nvmq_log::Writer<D>]) -> Duration {
        match self {
            Spin::Fixed(d) => d,
            Spin::Auto
                if writers
                    .iter()
                    .all(|w| !w.device().info().volatile_write_cache) =>
            {
                PLP_SPIN
            }
            Spin::Auto => Duration::ZERO,
        }
    }
}

fn parse_spin(v: &str) -> Result<Spin, String> {
    if v.trim() == "auto" {
        return Ok(Spin::Auto);
    }
    crate::devspec::parse_duration(v)
        .map(Spin::Fixed)
        .map_err(|e| format!("{e}, or auto"))
}

fn parse_principal(s: &str) -> Result<frontend::session::Principal, String> {
    frontend::session::Principal::parse(s)
        .ok_or_else(|| format!("{s:?} is not a principal of the form Type:name (User:admin)"))
}

/// The serve settings DescribeConfigs lists for the broker besides those with a Kafka name
/// (read-only): (name, value, whether it is the default).
fn described_settings(args: &ServeArgs) -> Vec<(String, String, bool)> {
    let flag = |n: &str, v: String, default: &str| (format!("nvmq.{n}"), v.clone(), v == default);
    vec![
        flag("device", args.device.join(" "), DEFAULT_DEVICE),
        flag("flush", args.flush.clone(), "always"),
        flag("loops", args.loops.to_string(), "0"),
        flag(
            "max-uncompressed-batch",
            args.max_uncompressed_batch.to_string(),
            &(16usize << 20).to_string(),
        ),
    ]
}

/// Serves until SIGINT/SIGTERM (a clean stop, [`Status::Ok`]) or until a device's writer stops
/// after an I/O error ([`Status::WriterStopped`]: the caller exits with it so that a supervisor
/// restarts the broker and recovery runs).
pub fn run(args: ServeArgs) -> Result<Status> {
    let specs: Vec<DeviceSpec> = args
        .device
        .iter()
        .map(|d| d.parse())
        .collect::<Result<_>>()?;
    let size = args.size;
    let max_frame = args.max_frame;
    if args.offsets_retention < Duration::from_secs(60) {
        bail!(
            "--offsets-retention {:?} is below a minute (Kafka's least): an empty group's offsets would go between two commits",
            args.offsets_retention
        );
    }
    if args.write_timeout.is_zero() {
        bail!("--write-timeout must be positive (zero would close every connection with an answer to send)");
    }
    if args.writer_stop_grace > MAX_WRITER_STOP_GRACE {
        bail!(
            "--writer-stop-grace {:?} is longer than {} min: after a writer stops the broker serves nothing, and a supervisor restarts it (and recovery runs) only once it exits",
            args.writer_stop_grace,
            MAX_WRITER_STOP_GRACE.as_secs() / 60
        );
    }
    let max_connection_bytes = args.max_connection_bytes;
    let max_queued_bytes = args.max_queued_bytes;
    let fetch_max_bytes = args.fetch_max_bytes;
    if args.max_connections == 0 || args.max_connections_per_ip == 0 {
        bail!("--max-connections and --max-connections-per-ip must be at least 1");
    }
    let max_uncompressed = args.max_uncompressed_batch;
    let flush: FlushMode = args.flush.parse().map_err(|e: String| anyhow!(e))?;
    if args.default_partitions == 0 {
        bail!("--default-partitions must be at least 1");
    }
    // Kafka's setting is an int of milliseconds; clients read it back through DescribeConfigs.
    let cluster = crate::cluster_flags::parse(
        args.node_id,
        &args.peers,
        args.insecure_network,
        args.raft_compact_entries,
        args.raft_merge_commands,
    )?;
    if cluster.is_some() && args.ceiling {
        bail!("--ceiling answers without the log: it cannot run as a node of a cluster");
    }
    if args.group_initial_rebalance_delay.as_millis() > i32::MAX as u128 {
        bail!(
            "--group-initial-rebalance-delay {:?}: at most {} ms (about 24 days)",
            args.group_initial_rebalance_delay,
            i32::MAX
        );
    }
    let listen: SocketAddr = args
        .listen
        .parse()
        .with_context(|| format!("--listen {:?}: expected host:port", args.listen))?;
    let sasl = sasl_config(&args)?;
    // Safe by default: an unsecured listener serves only this host unless the operator says
    // otherwise in so many words.
    if !listen.ip().is_loopback() && !args.insecure_network && !listener_is_secured(&args, &sasl) {
        bail!(
            "--listen {listen}: not a loopback address, and the listener has neither TLS nor SASL (anyone who reaches the port could read, write and delete every topic); configure --tls-cert and --tls-key or --sasl-mechanisms, listen on 127.0.0.1, or pass --insecure-network on a trusted network"
        );
    }
    if sasl.mechanisms.contains(&frontend::sasl::Mechanism::Plain) && args.tls_cert.is_none() {
        tracing::warn!("SASL PLAIN is enabled without TLS: passwords cross the network in the clear; use SCRAM, TLS, or PLAIN only on a trusted network");
    }
    let tls = tls_settings(&args)?;
    let cfg = LogConfig {
        flush,
        ..LogConfig::default()
    };
    let queue = cfg.queue_capacity;
    let mut writers = Vec::new();
    let mut reports = Vec::new();
    // One reader pair per loop the server will run (the same count it resolves).
    let loop_count = frontend::ServerOptions {
        loops: args.loops,
        ..frontend::ServerOptions::default()
    }
    .loop_count();
    let reader_pairs = loop_count.min(usize::from(u16::MAX - 1)) as u16;
    for (spec, name) in specs.iter().zip(&args.device) {
        let fresh = match spec {
            DeviceSpec::File { path, .. } => !Path::new(path).exists(),
            DeviceSpec::Sim(_) => true,
            // A namespace is never formatted implicitly: `nvmq format --device nvme:...` first.
            DeviceSpec::Nvme { .. } => false,
        };
        // One read-only queue pair per loop (NVMe): a Fetch that reads the device reads it on
        // one, not through the loop that hosts the writer.
        let (dev, readers) = spec.open_with_readers(Some(size), reader_pairs, |dev| {
            if !fresh {
                return Ok(());
            }
            nvmq_log::mkfs::format_device(dev, &FormatOptions::default())
        })?;
        if fresh {
            println!("formatted a new log on {name}");
        }
        let (mut writer, report) = recovery::open(dev, cfg.clone())
            .with_context(|| format!("opening the log on {name}"))?;
        if !readers.is_empty() {
            println!(
                "{name}: {} I/O queue pairs for reads beside the writer's",
                readers.len()
            );
            writer.set_direct_reads(nvmq_log::direct::DirectReads::new(readers));
        }
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
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let _metrics_server = match &args.metrics_addr {
        Some(addr) => {
            for w in &writers {
                metrics.attach_log(w.shared(), w.geometry());
            }
            if let Some(report) = reports.first() {
                metrics.set_recovery(report);
            }
            let server = crate::metrics::MetricsServer::start(addr.as_str(), metrics.clone())
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
        max_frame,
        max_uncompressed_batch: max_uncompressed,
        producer_id_expiration: args.producer_id_expiration,
        offsets_retention: args.offsets_retention,
        group_initial_rebalance_delay: args.group_initial_rebalance_delay,
        ceiling: args.ceiling,
        max_connection_bytes,
        max_queued_bytes,
        fetch_max_bytes,
        max_connections: args.max_connections,
        max_connections_per_ip: args.max_connections_per_ip,
        write_timeout: args.write_timeout,
        authorizer: args.authorizer,
        super_users: args.super_users.clone(),
        sasl,
        log_dirs: args.device.clone(),
        settings: described_settings(&args),
        ..frontend::Config::default()
    };
    let opened = std::time::Instant::now();
    let spin = args.spin.resolve(&writers);
    let opts = frontend::ServerOptions {
        loops: args.loops,
        pin: !args.no_pin,
        spin,
        queue_capacity: queue,
        tls: tls.clone(),
        cluster,
        ..frontend::ServerOptions::default()
    };
    let shared: Vec<Arc<Shared>> = writers.iter().map(|w| w.shared()).collect();
    let server = match frontend::Server::start(writers, listener, fcfg, opts) {
        Ok(s) => s,
        Err(e) => {
            // A writer that stopped while the broker started (its replay, its startup records)
            // is the failure a running broker exits 5 for, and its restart needs recovery as much.
            if let Some((device, reason)) = first_stopped(&shared) {
                tracing::error!(error = %e, "the broker could not start");
                let name = args.device.get(device).map_or("?", String::as_str);
                stop_after_writer_failure(None, device, name, &reason, args.writer_stop_grace);
                return Ok(Status::WriterStopped);
            }
            return Err(e).context("opening the broker state");
        }
    };
    metrics.attach_front(server.front_probe());
    {
        // Weak: a scrape must not keep a stopped broker alive.
        let broker = Arc::downgrade(server.broker());
        metrics.attach_partitions(move || {
            broker
                .upgrade()
                .map(|b| b.partition_offsets(crate::metrics_partitions::MAX_PARTITIONS))
                .unwrap_or_default()
        });
    }
    if let Some(replica) = server.broker().replica() {
        // Weak: the scrape must not keep a stopped node's group alive.
        let replica = Arc::downgrade(replica);
        metrics.attach_cluster(move || replica.upgrade().map(|r| r.quorum_status()));
    }
    let st = server.broker().startup();
    println!(
        "producer state: {} partitions from snapshots, {} replayed in full, {} records replayed, {} producers expired ({:.3} s)",
        st.partitions_from_snapshot,
        st.partitions_replayed_in_full,
        st.records_replayed,
        st.producers_expired,
        opened.elapsed().as_secs_f64()
    );
    if args.authorizer {
        println!(
            "authorizer on: {} ACLs, super users: {}",
            server.broker().acl().bindings().len(),
            if args.super_users.is_empty() {
                "none".to_string()
            } else {
                args.super_users
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
    } else if !args.super_users.is_empty() {
        eprintln!("note: --super-users has no effect without --authorizer");
    }
    report_sasl(&server);
    if args.ceiling {
        println!("CEILING MODE: Produce is answered without storing anything (benchmark only)");
    }
    // The signals are watched before the line that says the broker serves: one sent as soon as
    // it does (a supervisor, a test) must stop it cleanly, not kill it by the default action.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the signal runtime")?;
    let (mut stop, hup) = {
        let _in_rt = rt.enter();
        (
            StopSignals::watch().context("watching SIGINT and SIGTERM")?,
            watch_hangup(tls.is_some()),
        )
    };
    println!(
        "nvmq serving Kafka on {bound} (advertised as {host}:{port}), {} event loops{}{}",
        server.loops(),
        if spin.is_zero() {
            String::new()
        } else {
            format!(", polling {} us for completions", spin.as_micros())
        },
        match &tls {
            Some(t) if t.requires_client_cert() => ", TLS with client certificates",
            Some(_) => ", TLS",
            None => "",
        }
    );
    let stopped = rt.block_on(async {
        tokio::select! {
            _ = stop.recv() => None,
            _ = reload_on_hangup(tls.as_ref(), hup) => None,
            s = writer_stopped(server.broker().logs().iter().map(|l| l.shared().clone()).collect()) => Some(s),
        }
    });
    if let Some((device, reason)) = stopped {
        let name = args.device.get(device).map_or("?", String::as_str);
        stop_after_writer_failure(Some(server), device, name, &reason, args.writer_stop_grace);
        return Ok(Status::WriterStopped);
    }
    println!("stopping: signal received");
    // A clean stop waits (boundedly) for appends in flight; a second signal stops at once, as
    // a crash would: what was acknowledged is durable, the rest is the clients' to retry.
    let forced = std::thread::Builder::new()
        .name("nvmq-signal".into())
        .spawn(move || {
            rt.block_on(stop.recv());
            eprintln!("second signal: stopping at once, without waiting for appends in flight");
            std::process::exit(1);
        });
    if let Err(e) = forced {
        tracing::warn!(error = %e, "no thread for a second signal; the clean stop runs to its end");
    }
    server.shutdown().context("stopping")?;
    println!("nvmq stopped");
    Ok(Status::Ok)
}

/// The SASL settings of the flags.
fn sasl_config(args: &ServeArgs) -> Result<frontend::sasl::SaslConfig> {
    let mut mechanisms = Vec::new();
    for name in &args.sasl_mechanisms {
        let m = frontend::sasl::Mechanism::parse(name)
            .ok_or_else(|| anyhow!("--sasl-mechanisms: unknown mechanism {name:?}"))?;
        if !mechanisms.contains(&m) {
            mechanisms.push(m);
        }
    }
    let lifetime = args.sasl_session_lifetime;
    if !lifetime.is_zero() && mechanisms.is_empty() {
        bail!("--sasl-session-lifetime needs --sasl-mechanisms");
    }
    Ok(frontend::sasl::SaslConfig {
        mechanisms,
        session_lifetime: (!lifetime.is_zero()).then_some(lifetime),
    })
}

/// Says what SASL requires, and warns when no one could log in.
fn report_sasl(server: &frontend::Server) {
    let sasl = &server.broker().config().sasl;
    if !sasl.required() {
        return;
    }
    let names: Vec<&str> = sasl.mechanisms.iter().map(|m| m.name()).collect();
    println!(
        "SASL required: {}; sessions {}",
        names.join(", "),
        sasl.session_lifetime
            .map_or("do not expire".to_string(), |d| format!("last {d:?}"))
    );
    if server.broker().credentials().list().is_empty() {
        tracing::warn!("SASL is required but no user exists: nobody can log in; stop serve and run nvmq user add");
    }
}

/// The first device whose writer stopped, and why (checked every [`WATCH_EVERY`]).
async fn writer_stopped(shared: Vec<Arc<Shared>>) -> (usize, String) {
    let mut every = tokio::time::interval(WATCH_EVERY);
    loop {
        every.tick().await;
        if let Some(stopped) = first_stopped(&shared) {
            return stopped;
        }
    }
}

/// The first device (by index) whose writer stopped, and why.
fn first_stopped(shared: &[Arc<Shared>]) -> Option<(usize, String)> {
    shared
        .iter()
        .enumerate()
        .find_map(|(i, s)| s.lock().fatal.clone().map(|reason| (i, reason)))
}

/// PostgreSQL's rule for a failed fsync: the broker does not go on looking healthy. It says why,
/// stops accepting, answers what it holds (appends to the stopped writer get
/// KAFKA_STORAGE_ERROR), closes its connections, and the caller exits non-zero so that the
/// supervisor restarts it and recovery decides what the device holds. The stop is bounded by
/// [`FAILED_STOP_BOUND`] whatever the clients do; /metrics keeps answering for `grace` after the
/// failure was seen (its server lives until the process exits). `server` is None when the
/// writer stopped while the broker started (which stopped what it had started).
fn stop_after_writer_failure(
    server: Option<frontend::Server>,
    device: usize,
    name: &str,
    reason: &str,
    grace: Duration,
) {
    let seen = Instant::now();
    let code = Status::WriterStopped.code();
    tracing::error!(
        device,
        name,
        reason,
        "writer for device {device} ({name}) stopped: {reason}; exiting with status {code} so that recovery runs on restart"
    );
    if let Some(server) = server {
        stop_bounded(server);
    }
    std::thread::sleep(grace.saturating_sub(seen.elapsed()));
}

/// Stops the broker on a thread of its own, so that a stop that hangs (a writer that never
/// answers) cannot keep the process alive: past [`FAILED_STOP_BOUND`] it is left behind.
fn stop_bounded(server: frontend::Server) {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("nvmq-stop".into())
        .spawn(move || {
            let r = server.shutdown().map(drop);
            let _ = tx.send(r);
        });
    match spawned {
        Ok(_) => match rx.recv_timeout(FAILED_STOP_BOUND) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "stopping the broker after the failure"),
            Err(_) => tracing::warn!(
                "the broker did not stop within {FAILED_STOP_BOUND:?}; exiting anyway"
            ),
        },
        // The closure, and the server in it, were dropped: that stopped the loops (`Server`'s
        // drop), without the bound.
        Err(e) => tracing::warn!(error = %e, "cannot start a thread to stop the broker"),
    }
}

/// Whether the listener may face a network, so that a non-loopback --listen needs no
/// --insecure-network: it authenticates the server to its clients (TLS), or clients must prove
/// who they are before they are served (SASL).
pub fn listener_is_secured(args: &ServeArgs, sasl: &frontend::sasl::SaslConfig) -> bool {
    args.tls_cert.is_some() || sasl.required()
}

/// The TLS settings the flags name, read now: a file that is missing or wrong stops the start
/// with an error naming it.
fn tls_settings(args: &ServeArgs) -> Result<Option<frontend::tls::Tls>> {
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        return Ok(None);
    };
    let files = frontend::tls::TlsFiles {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: args.tls_client_ca.clone(),
    };
    Ok(Some(frontend::tls::Tls::load(files)?))
}

/// SIGHUP, watched when there are TLS files to reload (without them SIGHUP keeps its default
/// action).
fn watch_hangup(tls: bool) -> Option<Signal> {
    if !tls {
        return None;
    }
    match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGHUP: the TLS files will not be reloaded");
            None
        }
    }
}

/// Re-reads the TLS files at each SIGHUP: new connections take them, open ones keep theirs, and
/// a reload that fails leaves the settings in use. Never returns.
async fn reload_on_hangup(tls: Option<&frontend::tls::Tls>, hup: Option<Signal>) {
    let (Some(tls), Some(mut hup)) = (tls, hup) else {
        return std::future::pending().await;
    };
    while hup.recv().await.is_some() {
        match tls.reload() {
            Ok(()) => {
                tracing::info!("SIGHUP: TLS certificate, key and client CA reloaded");
                println!("TLS files reloaded");
            }
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: TLS reload failed; the previous certificate stays in use")
            }
        }
    }
    std::future::pending().await
}

/// SIGINT and SIGTERM, watched from before the broker says it serves until it exits.
struct StopSignals {
    term: Signal,
    int: Signal,
}

impl StopSignals {
    /// Installs the handlers now (inside a tokio runtime): from here on neither signal kills.
    fn watch() -> std::io::Result<StopSignals> {
        Ok(StopSignals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The next SIGINT or SIGTERM.
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
