//! nvmq-nbd: serves a raw image over NBD with a volatile write cache whose power can be cut.
//!
//! Serve:   nvmq-nbd --image nbd.img --socket nbd.sock [--tcp 127.0.0.1:10809] [--seed 1]
//! Control: nvmq-nbd --control nbd.sock.ctl --send 'cut 42'   (or `stats`, `ping`)
#![forbid(unsafe_code)]
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Parser;
use hw_test::nbd::{control, Server, ServerConfig};

#[derive(Parser)]
#[command(
    about = "NBD server modelling a drive's volatile write cache, with a power-cut control socket"
)]
struct Args {
    /// Raw image to serve (the medium); created with --size if it does not exist.
    #[arg(long)]
    image: Option<PathBuf>,
    /// Size in bytes for a new image (a multiple of 512).
    #[arg(long)]
    size: Option<u64>,
    /// NBD Unix socket.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Also serve NBD on this TCP address.
    #[arg(long)]
    tcp: Option<String>,
    /// Control socket (default: <socket>.ctl). With --send: the socket to send to.
    #[arg(long)]
    control: Option<PathBuf>,
    /// Send this control command (e.g. "cut 42", "stats") and print the reply, then exit.
    #[arg(long)]
    send: Option<String>,
    #[arg(long, default_value = "nvmq")]
    export_name: String,
    /// Cache size (bytes) above which the oldest cached writes are written back to the image.
    #[arg(long, default_value_t = 256 << 20)]
    max_cached_bytes: u64,
    /// Seeds the seeds of cuts requested without one.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Microseconds each flush takes before it writes the cache back (a slow drive: a cut at a
    /// random moment then often finds writes not yet durable).
    #[arg(long, default_value_t = 0)]
    flush_delay_us: u64,
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvmq-nbd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    if let Some(cmd) = &args.send {
        let Some(path) = args.control.as_ref() else {
            bail!("--send needs --control <control socket>");
        };
        println!("{}", control::command(path, cmd)?);
        return Ok(());
    }
    let (Some(image), Some(socket)) = (args.image, args.socket) else {
        bail!("serving needs --image and --socket (or --send with --control)");
    };
    if !image.exists() {
        let Some(size) = args.size else {
            bail!(
                "{} does not exist; give --size to create it",
                image.display()
            );
        };
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(size))
            .with_context(|| format!("creating {} with {size} bytes", image.display()))?;
    }
    let mut cfg = ServerConfig::new(image, socket);
    if args.control.is_some() {
        cfg.control = args.control;
    }
    cfg.tcp = args.tcp;
    cfg.export_name = args.export_name;
    cfg.max_cached_bytes = args.max_cached_bytes;
    cfg.seed = args.seed;
    cfg.flush_delay = std::time::Duration::from_micros(args.flush_delay_us);
    cfg.log = !args.quiet;
    let _server = Server::start(cfg)?;
    // Serves until killed. Killing the server drops its cache: every unflushed write is lost.
    loop {
        std::thread::park();
    }
}
