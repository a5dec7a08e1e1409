//! `nvmq bench-recovery`: how long opening takes after a crash at full load on a large log.
//!
//! A child process (this binary again) fills the log with closed-loop producers and keeps them
//! running; once the log holds `--fill` bytes it is SIGKILLed mid-load. The parent then opens the
//! device as the broker would and reports the open time (what a producer waits for) and the
//! background index rebuild below the recovery point (what a reader of old data waits for), with
//! the bytes each read.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use blockdev::file::{FileDevice, FileOptions};
use blockdev::BlockDevice;
use clap::Args;
use nvmq_log::{FormatOptions, Log, LogConfig};

use crate::devspec::parse_size;

#[derive(Args, Debug)]
pub struct BenchRecoveryArgs {
    /// Device file (created at --size if missing; an existing file is reformatted only with --force).
    #[arg(long, default_value = "./nvmq-data/recovery.img")]
    pub file: PathBuf,
    /// Size of the device file when it is created.
    #[arg(long, default_value = "5G", value_parser = parse_size)]
    pub size: u64,
    /// Log bytes written before the crash.
    #[arg(long, default_value = "4G", value_parser = parse_size)]
    pub fill: u64,
    /// Closed-loop producers during the fill (the load the crash interrupts).
    #[arg(long, default_value_t = 64)]
    pub producers: usize,
    /// Payload bytes per record.
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    pub record_size: u64,
    /// Reformat an existing device file.
    #[arg(long)]
    pub force: bool,
    /// Print the figures as JSON.
    #[arg(long)]
    pub json: bool,
    /// Internal: run as the child that fills the log until it is killed.
    #[arg(long, hide = true)]
    pub child: bool,
}

pub fn run(a: BenchRecoveryArgs) -> Result<()> {
    if a.child {
        return fill_until_killed(&a);
    }
    if a.fill >= a.size {
        bail!(
            "--fill {} must be smaller than the device --size {}",
            a.fill,
            a.size
        );
    }
    if a.file.exists() && !a.force {
        bail!(
            "{} exists; pass --force to reformat it (the benchmark destroys its contents)",
            a.file.display()
        );
    }
    if a.file.exists() {
        std::fs::remove_file(&a.file).with_context(|| format!("removing {}", a.file.display()))?;
    }
    if let Some(dir) = a.file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    eprintln!(
        "creating {} ({} MiB) and filling {} MiB of log with {} producers of {} B records ...",
        a.file.display(),
        a.size >> 20,
        a.fill >> 20,
        a.producers,
        a.record_size
    );
    let fmt = FormatOptions::default();
    FileDevice::create(&a.file, a.size, FileOptions::default(), |d| {
        nvmq_log::mkfs::format(d, &fmt)
            .map(|_| ())
            .map_err(|e| blockdev::DeviceError::Io {
                op: blockdev::Op::Write,
                lba: 0,
                detail: e.to_string(),
            })
    })
    .with_context(|| format!("creating {}", a.file.display()))?;

    // Fill in a child, then kill it at full load.
    let fill_started = Instant::now();
    let exe = std::env::current_exe().context("finding this binary")?;
    let mut child = Command::new(exe)
        .arg("bench-recovery")
        .arg("--child")
        .arg("--file")
        .arg(&a.file)
        .arg(format!("--fill={}", a.fill))
        .arg(format!("--producers={}", a.producers))
        .arg(format!("--record-size={}", a.record_size))
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the filling process")?;
    let out = child.stdout.take().context("child stdout")?;
    let mut filled = false;
    for line in BufReader::new(out).lines() {
        let line = line.context("reading the child's progress")?;
        if line.starts_with("FILLED") {
            filled = true;
            break;
        }
        if !a.json {
            eprintln!("  {line}");
        }
    }
    if !filled {
        let status = child.wait()?;
        bail!("the filling process ended before the log was full ({status})");
    }
    // Let the load run on for a moment: the cut lands in the middle of writes and flushes.
    std::thread::sleep(Duration::from_millis(200));
    child.kill().context("SIGKILL the filling process")?;
    child.wait()?;
    let fill_time = fill_started.elapsed();

    // Reopen as the broker would.
    let opened = Instant::now();
    let dev = FileDevice::open(&a.file, FileOptions::default())
        .with_context(|| format!("opening {}", a.file.display()))?;
    let cfg = LogConfig::default();
    let (w, report) = recovery::open(dev, cfg.clone()).context("recovering")?;
    let open_time = opened.elapsed();
    let log = Log::start(w, cfg.queue_capacity);
    let shared = log.shared().clone();
    let s = shared.wait_until(Duration::from_secs(600), |s| !s.backfill_pending);
    let index_time = opened.elapsed();
    let (head, durable, backfill_bytes, backfill_error) = (
        s.head,
        s.durable,
        s.backfill_bytes,
        s.backfill_error.clone(),
    );
    drop(s);
    log.shutdown();
    if let Some(e) = backfill_error {
        bail!("the background index rebuild found damage: {e}");
    }
    let retained = durable - head;
    if a.json {
        let j = serde_json::json!({
            "device": a.file.display().to_string(),
            "log_bytes": retained,
            "fill_seconds": fill_time.as_secs_f64(),
            "open_seconds": open_time.as_secs_f64(),
            "recovery_scan_seconds": report.duration.as_secs_f64(),
            "scanned_bytes": report.scanned_bytes,
            "index_rebuilt_seconds": index_time.as_secs_f64(),
            "index_rebuilt_bytes": backfill_bytes + report.indexed_bytes,
            "recovery_point": report.recovery_point,
            "cut_at": report.cut_at,
        });
        println!("{j}");
    } else {
        println!("{report}");
        println!(
            "log retained: {} MiB (head {head}, durable through {durable}); filled in {:.1} s",
            retained >> 20,
            fill_time.as_secs_f64()
        );
        println!(
            "open (recovery until writes are accepted): {:.3} s, {} MiB scanned (recovery scan {:.3} s)",
            open_time.as_secs_f64(),
            report.scanned_bytes >> 20,
            report.duration.as_secs_f64()
        );
        println!(
            "index below the recovery point ready after {:.3} s, {} MiB read in the background",
            index_time.as_secs_f64(),
            (backfill_bytes + report.indexed_bytes) >> 20
        );
    }
    Ok(())
}

/// The child: produce at full load, say FILLED once the log holds `fill` bytes, go on until killed.
fn fill_until_killed(a: &BenchRecoveryArgs) -> Result<()> {
    let dev = FileDevice::open(&a.file, FileOptions::default())
        .with_context(|| format!("opening {}", a.file.display()))?;
    let max_transfer = dev.info().max_transfer;
    let cfg = LogConfig::default();
    let (w, _) = recovery::open(dev, cfg.clone()).context("opening the fresh log")?;
    let log = Arc::new(Log::start(w, cfg.queue_capacity));
    if a.record_size as usize > log.max_payload() {
        bail!(
            "--record-size {} is larger than a record can be ({} B with maximum transfer {max_transfer})",
            a.record_size,
            log.max_payload()
        );
    }
    let part = log.create_partition("recovery-bench", 0)?;
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..a.producers)
        .map(|p| {
            let log = log.clone();
            let stop = stop.clone();
            let size = a.record_size as usize;
            std::thread::spawn(move || {
                let payload = vec![p as u8; size];
                while !stop.load(Ordering::Relaxed) {
                    if log.append_wait(part, payload.clone()).is_err() {
                        break;
                    }
                }
            })
        })
        .collect();
    let mut last = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let (head, durable) = {
            let s = log.shared().lock();
            (s.head, s.durable)
        };
        if let Some(f) = log.fatal() {
            bail!("the writer stopped: {f}");
        }
        if durable - head >= a.fill {
            println!("FILLED {}", durable - head);
            break;
        }
        if last.elapsed() > Duration::from_secs(2) {
            println!("{} MiB of {} MiB", (durable - head) >> 20, a.fill >> 20);
            last = Instant::now();
        }
    }
    // Keep the load on until the parent kills this process.
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}
