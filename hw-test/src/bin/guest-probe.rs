//! Runs inside the rig's guest: reports what the guest sees of its PCI devices, the NVMe
//! function's driver, IOMMU group and VFIO device nodes, and (in the kernel NVMe stage) the
//! namespace's block sizes. Exit codes: 0 ok, 2 the named function is missing or not an NVMe
//! controller, 3 `--require-vfio` was given and the function is not usable through VFIO.
//! `--serve <port>` then answers one TCP connection (for checking the rig's port forwarding).
#![forbid(unsafe_code)]
use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;

#[derive(Parser)]
struct Args {
    /// PCI address of the NVMe function (default: $NVMQ_NVME_PCI, set by the rig's init).
    #[arg(long)]
    pci: Option<String>,
    /// Fail (exit 3) unless the function is bound to vfio-pci and its VFIO nodes open.
    #[arg(long)]
    require_vfio: bool,
    /// After probing, accept one TCP connection on this port: send a greeting naming the NVMe
    /// function, read one line and print it.
    #[arg(long)]
    serve: Option<u16>,
    /// How long `--serve` waits for its connection, in seconds.
    #[arg(long, default_value_t = 60)]
    serve_timeout: u64,
}

fn serve(port: u16, pci: &str, timeout: Duration) -> Result<()> {
    let listener =
        TcpListener::bind(("0.0.0.0", port)).with_context(|| format!("binding port {port}"))?;
    listener
        .set_nonblocking(true)
        .context("making the listener non-blocking")?;
    println!("serving on port {port}");
    let deadline = Instant::now() + timeout;
    // A client that gave up waiting for the greeting (a slow guest under TCG) closes without a
    // line and connects again; such a connection is skipped, not reported as the client's line.
    loop {
        let (mut stream, peer) = match listener.accept() {
            Ok(conn) => conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            Err(e) => return Err(e).with_context(|| format!("accepting on port {port}")),
        };
        stream
            .set_nonblocking(false)
            .context("making the connection blocking")?;
        stream
            .set_read_timeout(Some(
                deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_secs(1)),
            ))
            .context("setting a read timeout")?;
        let greeting = format!("hello from guest nvme {pci}\n");
        if stream.write_all(greeting.as_bytes()).is_err() {
            println!("connection from {peer} closed before the greeting");
            continue;
        }
        let mut line = String::new();
        let n = BufReader::new(&stream)
            .read_line(&mut line)
            .context("reading the client's line")?;
        if n == 0 {
            println!("connection from {peer} closed without a line");
            continue;
        }
        println!("connection from {peer}: {}", line.trim_end());
        return Ok(());
    }
}

fn attr(dev: &Path, name: &str) -> String {
    fs::read_to_string(dev.join(name))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

fn link_name(path: &Path) -> Option<String> {
    fs::read_link(path)
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
}

fn list_pci() -> Result<()> {
    let root = Path::new("/sys/bus/pci/devices");
    let mut devs: Vec<_> = fs::read_dir(root)
        .with_context(|| format!("listing {}", root.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    devs.sort();
    for d in devs {
        println!(
            "pci {} vendor={} device={} class={} driver={}",
            d.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            attr(&d, "vendor"),
            attr(&d, "device"),
            attr(&d, "class"),
            link_name(&d.join("driver")).unwrap_or_else(|| "none".into())
        );
    }
    Ok(())
}

fn open_rw(path: &str) -> Result<()> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map(drop)
        .with_context(|| format!("opening {path} read-write"))
}

fn memlock() -> String {
    fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|x| x.starts_with("Max locked memory"))
                .map(|x| x.split_whitespace().skip(3).collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_else(|| "?".into())
}

fn probe(args: Args) -> Result<ExitCode> {
    list_pci()?;
    let Some(pci) = args.pci.or_else(|| std::env::var("NVMQ_NVME_PCI").ok()) else {
        eprintln!("guest-probe: no --pci and no NVMQ_NVME_PCI");
        return Ok(ExitCode::from(2));
    };
    let dev = Path::new("/sys/bus/pci/devices").join(&pci);
    if !dev.exists() {
        eprintln!("guest-probe: no PCI device {pci}");
        return Ok(ExitCode::from(2));
    }
    let class = attr(&dev, "class");
    if class != "0x010802" {
        eprintln!("guest-probe: {pci} has class {class}, not an NVMe controller (0x010802)");
        return Ok(ExitCode::from(2));
    }
    let config =
        fs::read(dev.join("config")).with_context(|| format!("reading {pci} config space"))?;
    let id = |at: usize| {
        config
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let (Some(vendor), Some(device)) = (id(0), id(2)) else {
        anyhow::bail!("{pci} config space is only {} bytes", config.len());
    };
    println!(
        "nvme {pci} config-id={vendor:04x}:{device:04x} config-bytes={}",
        config.len()
    );
    let driver = link_name(&dev.join("driver")).unwrap_or_else(|| "none".into());
    let group = link_name(&dev.join("iommu_group")).unwrap_or_else(|| "none".into());
    let node = format!("/dev/vfio/{group}");
    println!(
        "nvme {pci} driver={driver} iommu_group={group} {node}={} memlock={}",
        if Path::new(&node).exists() {
            "present"
        } else {
            "absent"
        },
        memlock()
    );
    if let Ok(block) = std::env::var("NVMQ_NVME_BLOCK") {
        let name = block.trim_start_matches("/dev/");
        let q = Path::new("/sys/block").join(name).join("queue");
        println!(
            "block {block} logical_block_size={} physical_block_size={}",
            attr(&q, "logical_block_size"),
            attr(&q, "physical_block_size")
        );
    }
    if args.require_vfio {
        if driver != "vfio-pci" {
            eprintln!("guest-probe: {pci} is bound to {driver}, not vfio-pci");
            return Ok(ExitCode::from(3));
        }
        for path in ["/dev/vfio/vfio", node.as_str()] {
            if let Err(e) = open_rw(path) {
                eprintln!("guest-probe: {e:#}");
                return Ok(ExitCode::from(3));
            }
            println!("opened {path}");
        }
    }
    if let Some(port) = args.serve {
        serve(port, &pci, Duration::from_secs(args.serve_timeout))?;
    }
    println!("GUEST-PROBE OK");
    Ok(ExitCode::SUCCESS)
}

fn main() -> Result<ExitCode> {
    probe(Args::parse())
}
