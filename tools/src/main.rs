//! The `nvmq` command.

mod bench;
mod devspec;
mod kafka_bench;
mod serve;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// nvmq: a durable message broker that acknowledges only what is on stable storage.
#[derive(Parser, Debug)]
#[command(name = "nvmq", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure group commit: closed-loop producers against a device; prints acks/s, ack latency
    /// percentiles, flushes/s, records per flush and write amplification, next to the device's own
    /// write+flush latency measured in the same run.
    Bench(bench::BenchArgs),
    /// Serve Kafka clients (the Kafka protocol frontend) over a device.
    Serve(serve::ServeArgs),
    /// Measure the Kafka frontend: producers speaking the protocol, acks=all.
    KafkaBench(kafka_bench::KafkaBenchArgs),
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(a) => bench::run(a),
        Command::Serve(a) => serve::run(a),
        Command::KafkaBench(a) => kafka_bench::run(a),
    }
}
