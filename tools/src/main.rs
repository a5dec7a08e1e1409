//! The `nvmq` command.
#![forbid(unsafe_code)]

mod acl;
mod acl_flags;
mod bench;
mod bench_inline;
mod bench_recovery;
mod check_storage;
mod cluster_flags;
mod cluster_status;
mod config;
mod describe;
mod devspec;
mod examined;
mod geometry_seam;
mod inspect;
mod kafka_bench;
mod logging;
mod metrics;
mod metrics_cluster;
mod metrics_partitions;
mod mkfs;
mod offline;
mod plot;
mod progress;
mod readonly;
mod reference;
mod serve;
mod tls_client_flags;
mod user;
mod verify;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// nvmq: a durable message broker that acknowledges only what is on stable storage.
///
/// Devices are named `file:<path>` (a regular file or a block device node; `,engine=uring`,
/// `threads` or `auto` picks how its I/O is done, `,flush_fds=N` how many fdatasyncs may run at
/// once, 1 to 64, default 1) or `sim[:key=value,...]` (an in-memory simulated device for trying
/// things out).
#[derive(Parser, Debug)]
#[command(name = "nvmq", version)]
#[command(
    after_help = "Exit status: 0 success; 1 error (bad input, device refused, or by verify: a device serve \
would refuse); 2 usage error; \
3 damage found (inspect, verify); 4 storage judged broken (check-storage); 5 a device's \
writer stopped after an I/O error (serve; restart it so that recovery runs); 6 a voter of the \
cluster is not in sync (cluster status).\n\
Run `nvmq <command> --help` for each command's flags and examples."
)]
struct Cli {
    /// A TOML file whose keys mirror the flags: global flags at the top, then a [command] table
    /// per command (e.g. [verify] device = "file:/data/log.img"). Flags on the command line win.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// Log line format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: logging::LogFormat,
    /// Log filter: error, warn, info, debug, trace, or directives like `info,nvmq_log=debug`
    /// (the NVMQ_LOG or RUST_LOG environment variable wins when set).
    #[arg(long, global = true, default_value = "warn")]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Write a new, empty log onto a device (refuses a device holding a log unless --force).
    Format(mkfs::FormatArgs),
    /// Show a log's superblocks, positions, partitions and space, without writing anything.
    Inspect(inspect::InspectArgs),
    /// Check every retained batch and record against its checksums, without writing anything;
    /// exits 3 on damage inside acknowledged data.
    Verify(verify::VerifyArgs),
    /// Measure write+flush latency before trusting a disk with ack-after-flush; gives a verdict
    /// and exits 4 if the storage is too slow (or too suspicious) to use.
    CheckStorage(check_storage::CheckStorageArgs),
    /// Measure group commit: closed-loop producers against devices; acks/s, ack latency
    /// percentiles, flushes/s, records per flush and write amplification, with SVG plots.
    Bench(bench::BenchArgs),
    /// Measure recovery after a crash at full load: fill a file device's log with producers, kill
    /// the process mid-load, reopen; prints the open time and bytes scanned, and when the index
    /// below the recovery point (rebuilt in the background) is ready.
    BenchRecovery(bench_recovery::BenchRecoveryArgs),
    /// Serve Kafka clients (the Kafka protocol frontend) over a device.
    Serve(Box<serve::ServeArgs>),
    /// Measure the Kafka frontend: producers speaking the protocol, acks=all.
    KafkaBench(kafka_bench::KafkaBenchArgs),
    /// Add, remove and list SASL users (SCRAM credentials stored in the log) on a stopped
    /// broker's device.
    User(user::UserArgs),
    /// Add, remove and list ACL bindings (kept in the log, as CreateAcls keeps them) on a
    /// stopped broker's device.
    Acl(acl::AclArgs),
    /// A running cluster as its leader sees it (`nvmq cluster status --bootstrap HOST:PORT`).
    Cluster(cluster_status::ClusterArgs),
    /// Print the configuration reference (docs/config-reference.md) generated from these flags.
    #[command(hide = true)]
    ConfigReference,
}

/// How a command that ran to the end judged what it saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// Damage found inside acknowledged data (or both superblocks).
    Damage,
    /// Storage judged unfit (check-storage).
    Broken,
    /// A device's writer stopped after a failed write or flush (serve): nothing more can be
    /// acknowledged until a restart runs recovery.
    WriterStopped,
    /// The device does not fit the log (verify): serve would refuse to open it, as it refuses
    /// any device it cannot use (status 1), even though the data checked out.
    Refused,
    /// A voter of the cluster is not in sync with the leader (cluster status).
    Lagging,
}

impl Status {
    fn code(self) -> u8 {
        match self {
            Status::Ok => 0,
            Status::Refused => 1,
            Status::Damage => 3,
            Status::Broken => 4,
            Status::WriterStopped => 5,
            Status::Lagging => 6,
        }
    }
}

/// Runs a command's work on each of its devices in turn (a broker with several devices is checked
/// or formatted as a set): the worst status wins, and the first error is returned after every
/// device had its turn.
fn each_device(
    devices: &[String],
    json: bool,
    mut one: impl FnMut(&str) -> anyhow::Result<Status>,
) -> anyhow::Result<Status> {
    let mut worst = Status::Ok;
    let mut first_err = None;
    for (i, d) in devices.iter().enumerate() {
        if devices.len() > 1 && !json {
            println!("== device {i}: {d}");
        }
        match one(d) {
            Ok(s) if s.code() > worst.code() => worst = s,
            Ok(_) => {}
            Err(e) if devices.len() > 1 => {
                eprintln!("error: device {i} ({d}): {e:#}");
                first_err.get_or_insert(e.context(format!("device {i} ({d})")));
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(worst),
    }
}

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let argv = match config::merge(argv, &Cli::command()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(1);
        }
    };
    let cli = Cli::parse_from(argv);
    if let Err(e) = logging::init(cli.log_format, &cli.log_level) {
        eprintln!("error: {e:#}");
        return ExitCode::from(1);
    }
    let result = match cli.command {
        Command::Format(a) => mkfs::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Verify(a) => verify::run(a),
        Command::CheckStorage(a) => check_storage::run(a),
        Command::Bench(a) => bench::run(a),
        Command::BenchRecovery(a) => bench_recovery::run(a).map(|()| Status::Ok),
        Command::Serve(a) => serve::run(*a),
        Command::KafkaBench(a) => kafka_bench::run(a).map(|()| Status::Ok),
        Command::User(a) => user::run(a),
        Command::Acl(a) => acl::run(a),
        Command::Cluster(a) => cluster_status::run(a),
        Command::ConfigReference => {
            print!("{}", reference::render(&Cli::command()));
            Ok(Status::Ok)
        }
    };
    match result {
        Ok(s) => ExitCode::from(s.code()),
        Err(e) => {
            tracing::debug!(error = ?e, "command failed");
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
