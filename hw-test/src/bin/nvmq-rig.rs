//! The power-cut validation controller: loads a broker over the Kafka protocol (acks=all), keeps
//! a synced ledger of every ack on this machine, cuts the broker's power with --cut-cmd at a
//! seeded random moment, brings it back with --up-cmd, and checks every acknowledged record.
//! With --resume it picks up the run in an existing --ledger after the controller itself stopped:
//! every ack on it is checked first, then the cycles go on, appending to the same ledger.
//! Exit status: 0 pass; 1 error (bad flag, broker not back, ledger failure); 3 an acknowledged
//! record lost or a served record failing its checksum.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use hw_test::powercut::inproc::{SimBroker, SimBrokerConfig};
use hw_test::powercut::{self, CommandSwitch, PowerSwitch, RigError, RigOptions};
use nvmq_log::FlushMode;

#[derive(Parser, Debug)]
#[command(
    name = "nvmq-rig",
    about = "Cut a broker's power under acks=all load, again and again, and prove no acknowledged record is lost",
    after_help = "Exit status: 0 every acknowledged record read back bit-exact; 1 error; 3 an acknowledged record lost or a served record failing its checksum.\n\
Example (IPMI): nvmq-rig --broker 10.0.0.5:9092 --cut-cmd 'ipmitool -H bmc5 -U admin -E chassis power off' --up-cmd 'ipmitool -H bmc5 -U admin -E chassis power on' --report-cmd 'ssh 10.0.0.5 journalctl -u nvmq -b -o cat | grep ^recovered | tail -1' --cycles 1000"
)]
struct Args {
    /// host:port of the broker under test.
    #[arg(long, required_unless_present = "in_process_sim")]
    broker: Option<String>,
    /// Shell command (sh -c) that cuts the broker machine's power; returns once it is off.
    #[arg(long, required_unless_present_any = ["in_process_sim", "verify_only"])]
    cut_cmd: Option<String>,
    /// Shell command that powers it on / starts the broker again (may return before it serves).
    #[arg(long)]
    up_cmd: Option<String>,
    /// Shell command printing the broker's own recovery report (e.g. the `recovered from ...`
    /// line `nvmq serve` logs at start), shown with each cycle.
    #[arg(long)]
    report_cmd: Option<String>,
    /// Longest any of the three commands may run.
    #[arg(long, default_value = "120s", value_parser = duration)]
    cmd_timeout: Duration,
    /// Cut cycles to run.
    #[arg(long, default_value_t = 20)]
    cycles: u32,
    /// Seed of the cut moments and record bytes (printed; default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// Earliest cut, after each cycle's load starts.
    #[arg(long, default_value = "200ms", value_parser = duration)]
    cut_after_min: Duration,
    /// Latest cut, after each cycle's load starts.
    #[arg(long, default_value = "2s", value_parser = duration)]
    cut_after_max: Duration,
    /// How long after the cut the broker may take to answer Metadata again.
    #[arg(long, default_value = "300s", value_parser = duration)]
    up_timeout: Duration,
    /// Pause between connection attempts while waiting for the broker.
    #[arg(long, default_value = "20ms", value_parser = duration)]
    poll_interval: Duration,
    /// After the cut, how long answers still in flight are waited for.
    #[arg(long, default_value = "2s", value_parser = duration)]
    drain: Duration,
    /// Timeout of one request (and of a connection attempt).
    #[arg(long, default_value = "10s", value_parser = duration)]
    request_timeout: Duration,
    /// Producers (one connection each).
    #[arg(long, default_value_t = 4)]
    producers: u32,
    /// Partitions of the run's topic (producer i writes partition i mod this) [default: 2, or
    /// with --resume the ledger's].
    #[arg(long)]
    partitions: Option<i32>,
    /// Records per produce request.
    #[arg(long, default_value_t = 4)]
    batch: u32,
    /// Produce requests each producer keeps unanswered at once.
    #[arg(long, default_value_t = 4)]
    in_flight: usize,
    /// Smallest record body in bytes (a 36-byte header and a checksum come on top) [default: 16,
    /// or with --resume the ledger's].
    #[arg(long)]
    body_min: Option<usize>,
    /// Largest record body in bytes [default: 1024, or with --resume the ledger's].
    #[arg(long)]
    body_max: Option<usize>,
    /// Topic of the run (default: rig-<seed>-<unix time>, or with --resume the ledger's; created
    /// if missing).
    #[arg(long)]
    topic: Option<String>,
    /// The ledger file, on this machine's own disk (default: ./<topic>.ledger; must not exist,
    /// unless --resume).
    #[arg(long)]
    ledger: Option<PathBuf>,
    /// Go on with the run in the existing --ledger (after the controller stopped): check every
    /// ack on it against the broker first, then run --cycles more cuts, numbered on, appending
    /// to it. Topic, partitions and body sizes are the ledger's; --seed draws the new cut moments.
    #[arg(long, requires = "ledger", conflicts_with = "verify_only")]
    resume: bool,
    /// Do not resend a cycle's unacknowledged records in the next cycle.
    #[arg(long)]
    no_resend: bool,
    /// Print the report as one JSON document on stdout (per-cycle lines go to stderr).
    #[arg(long)]
    json: bool,
    /// Only check an existing --ledger against the broker (after a power cut made by hand).
    #[arg(long, requires = "ledger")]
    verify_only: bool,
    /// Run against a broker in this process on the sim device (no --broker/--cut-cmd): a demo
    /// and a check of the rig itself.
    #[arg(long, conflicts_with_all = ["broker", "cut_cmd", "up_cmd", "verify_only"])]
    in_process_sim: bool,
    /// Flush mode of the --in-process-sim broker: always, or never (acks before any flush: the
    /// rig must report losses).
    #[arg(long, default_value = "always", requires = "in_process_sim")]
    sim_flush: String,
}

fn duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map(|i| s.split_at(i))
        .ok_or_else(|| format!("{s:?}: give a unit (ms, s, m)"))?;
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: {num:?} is not a number"))?;
    let secs = match unit {
        "ms" => n / 1e3,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("{s:?}: unit {unit:?} is not ms, s or m")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    // In process, the writer of the broker whose power was just cut reports its dead device:
    // that is the cut working, not news.
    let default_filter = if args.in_process_sim {
        "warn,nvmq_log::writer=off"
    } else {
        "warn"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("NVMQ_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(3),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(a: Args) -> Result<bool> {
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64 % 1_000_000_000)
            .unwrap_or(1)
    });
    if a.verify_only {
        let (broker, ledger) = match (&a.broker, &a.ledger) {
            (Some(b), Some(l)) => (b.clone(), l.clone()),
            _ => bail!("--verify-only needs --broker and --ledger"),
        };
        return verify_only(&broker, &ledger, a.request_timeout, a.json);
    }
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // A resumed run's shape is its ledger's; flags given anyway must agree (checked on resume).
    let resumed = match (&a.ledger, a.resume) {
        (Some(path), true) => Some(powercut::ledger::read(path)?.header),
        _ => None,
    };
    let topic = a
        .topic
        .clone()
        .or_else(|| resumed.as_ref().map(|h| h.topic.clone()))
        .unwrap_or_else(|| format!("rig-{seed}-{unix}"));
    let ledger = a
        .ledger
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{topic}.ledger")));

    let mut sim;
    let mut cmd;
    let (switch, broker): (&mut dyn PowerSwitch, String) = if a.in_process_sim {
        let flush: FlushMode = a
            .sim_flush
            .parse()
            .map_err(|e: String| anyhow!("--sim-flush: {e}"))?;
        sim = SimBroker::start(SimBrokerConfig {
            seed,
            flush,
            ..SimBrokerConfig::default()
        })
        .context("starting the in-process sim broker")?;
        let addr = sim.addr().to_string();
        (&mut sim, addr)
    } else {
        cmd = CommandSwitch {
            cut: a.cut_cmd.clone().unwrap_or_default(),
            up: a.up_cmd.clone(),
            report: a.report_cmd.clone(),
            timeout: a.cmd_timeout,
        };
        (&mut cmd, a.broker.clone().unwrap_or_default())
    };

    let mut o = RigOptions::new(broker, topic, ledger);
    o.partitions = a
        .partitions
        .or(resumed.as_ref().map(|h| h.partitions))
        .unwrap_or(2);
    o.producers = a.producers;
    o.batch = a.batch;
    o.in_flight = a.in_flight;
    o.body_len = (
        a.body_min
            .or(resumed.as_ref().map(|h| h.body_len.0))
            .unwrap_or(16),
        a.body_max
            .or(resumed.as_ref().map(|h| h.body_len.1))
            .unwrap_or(1024),
    );
    o.resume = a.resume;
    o.cycles = a.cycles;
    o.seed = seed;
    o.cut_after = (a.cut_after_min, a.cut_after_max);
    o.drain = a.drain;
    o.up_timeout = a.up_timeout;
    o.poll_interval = a.poll_interval;
    o.request_timeout = a.request_timeout;
    o.resend_unacked = !a.no_resend;

    let intro = format!(
        "nvmq-rig: {}seed {seed} (replay with --seed {seed}), {} cycles against {}, topic {}, ledger {}",
        if o.resume { "resuming the run in its ledger, " } else { "" },
        o.cycles,
        o.broker,
        o.topic,
        o.ledger.display()
    );
    let json = a.json;
    let say = |line: &str| {
        if json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    say(&intro);
    let report = powercut::run(&o, switch, |c| say(&c.to_string())).map_err(|e| {
        let resumable = !matches!(e, RigError::Option { .. } | RigError::Ledger(_));
        // An in-process broker dies with this process: nothing of it is left to resume against.
        if resumable && !a.in_process_sim && o.ledger.exists() {
            eprintln!(
                "nvmq-rig: the run stopped; its acks are in {0}: `--resume --ledger {0}` checks them and goes on",
                o.ledger.display()
            );
        }
        anyhow::Error::new(e).context(format!("seed {seed}"))
    })?;

    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{report}");
    }
    Ok(report.passed())
}

fn verify_only(
    broker: &str,
    ledger: &std::path::Path,
    timeout: Duration,
    json: bool,
) -> Result<bool> {
    let v = powercut::verify_ledger(broker, ledger, timeout)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "{}: checked {} acknowledged records: lost-acked {}, checksum failures {}, survivors {}, duplicates {}{}",
            if v.passed { "PASS" } else { "FAIL" },
            v.checked,
            v.lost.len(),
            v.faults.len(),
            v.survivors,
            v.duplicates,
            if v.ledger_torn_tail { " (a torn last ledger line was ignored)" } else { "" }
        );
        for l in v.lost.iter().take(20) {
            println!(
                "  LOST {} at {}/{}: {}",
                l.id, l.partition, l.offset, l.what
            );
        }
        for f in v.faults.iter().take(20) {
            println!("  CHECKSUM {}/{}: {}", f.partition, f.offset, f.what);
        }
    }
    Ok(v.passed)
}
