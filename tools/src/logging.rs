//! Structured logs on stderr with `tracing`: text for people, JSON lines for log collectors.

use std::io::IsTerminal;

use anyhow::{anyhow, Result};
use tracing_subscriber::EnvFilter;

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the subscriber. `NVMQ_LOG` (or `RUST_LOG`) overrides `level` when set; both take
/// tracing filter directives such as `info` or `warn,nvmq_log=debug`.
pub fn init(format: LogFormat, level: &str) -> Result<()> {
    let mut directives = std::env::var("NVMQ_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| level.to_string());
    // openraft warns at every heartbeat and append a down peer misses (about 20 lines a second
    // per peer): only its errors, unless the directives name it.
    if !directives.contains("openraft") {
        directives.push_str(",openraft=error");
    }
    let filter = EnvFilter::try_new(&directives)
        .map_err(|e| anyhow!("log level {directives:?} is not a valid filter: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    installed.map_err(|e| anyhow!("cannot install the logger: {e}"))
}
