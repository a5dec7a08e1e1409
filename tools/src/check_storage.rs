//! `nvmq check-storage`: a preflight before trusting a disk with ack-after-flush. The recipe is
//! the one fio users know as "4 KiB write + flush in a tight loop", with 1 and with 8 writers (the
//! second is the same disk under load), plus a streaming write to measure bandwidth. It judges the
//! flush latency, points out figures that cannot be honest, and projects what group commit can do.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use blockdev::file::{FileDevice, FileOptions};
use blockdev::{BlockDevice, Completion, IoBuffer};
use hdrhistogram::Histogram;
use nvmq_log::format::{record_size, BATCH_HEADER_LEN, LOG_START};
use serde::Serialize;

use crate::describe::{bytes, DeviceReport};
use crate::devspec::{parse_duration, parse_size, DeviceSpec};
use crate::Status;

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "Examples:\n  \
    nvmq check-storage --dir /var/lib/nvmq              # a temp file there, removed afterwards\n  \
    nvmq check-storage --device file:/dev/nvme0n1 --force   # DESTROYS what the device holds\n\n\
Verdict by the worst flush p99: < 1 ms ideal, 1-5 ms good, 5-50 ms workable, 50 ms-1 s marginal, \
> 1 s broken. A flush that is implausibly fast on a device that claims a volatile write cache is \
flagged as suspicious.\n\
Exit status: 0 usable (ideal to marginal); 1 error; 4 broken (too slow, or on memory that no \
flush makes durable).")]
pub struct CheckStorageArgs {
    /// Device to measure: `file:<path>` (existing file or block device; its contents are
    /// overwritten) or `sim[:flush=...]`.
    #[arg(long, required_unless_present = "dir", conflicts_with = "dir")]
    pub device: Option<String>,
    /// Directory to measure: a temporary file is created there and removed afterwards.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Total measuring time, split over the phases (e.g. 3s, 200ms).
    #[arg(long, value_parser = parse_duration, default_value = "3s")]
    pub duration: Duration,
    /// Size of the temporary file made with --dir.
    #[arg(long, value_parser = parse_size, default_value = "64M")]
    pub size: u64,
    /// Record payload size the group-commit projection assumes.
    #[arg(long, value_parser = parse_size, default_value = "1K")]
    pub record_size: u64,
    /// Measure a device that holds an nvmq log (the measurement overwrites it).
    #[arg(long)]
    pub force: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Flush latency figures of one phase.
#[derive(Serialize, Debug, Clone)]
pub struct Phase {
    pub writers: usize,
    pub cycles: u64,
    pub write_p50_us: f64,
    pub flush_p50_us: f64,
    pub flush_p99_us: f64,
    pub flush_max_us: f64,
    /// Completed write+flush cycles per second, all writers together.
    pub cycles_per_s: f64,
}

#[derive(Serialize, Debug, Clone)]
pub struct Projection {
    pub producers: u64,
    pub acks_per_s: f64,
    /// One group commit: writing the batch plus the flush.
    pub commit_ms: f64,
    /// Whether writing the batch takes longer than the flush: bandwidth, not flush latency, is
    /// the limit.
    pub bandwidth_bound: bool,
}

#[derive(Serialize, Debug)]
struct Report {
    target: String,
    device: DeviceReport,
    file_system: Option<String>,
    write_size: u32,
    phases: Vec<Phase>,
    write_bandwidth_bytes_per_s: f64,
    /// ideal, good, workable, marginal or broken.
    verdict: &'static str,
    verdict_reason: String,
    worst_flush_p99_us: f64,
    projection_record_size: u64,
    projection: Vec<Projection>,
    hints: Vec<String>,
    /// NVMe volatile write cache / power-loss protection and SMART critical warning.
    nvme_health: String,
}

/// Removes the temporary file however the command ends.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub fn run(a: CheckStorageArgs) -> Result<Status> {
    if a.duration.is_zero() {
        bail!("--duration must be positive, e.g. 3s or 200ms");
    }
    let (mut dev, target, backend, fs_path, _temp) = open_target(&a)?;
    let info = dev.info().clone();
    let write_size = info.write_unit().max(4096);
    let file_system = fs_path.as_deref().and_then(file_system_of);

    let pb = crate::progress::steps_bar(3, "measuring write+flush");
    let phase_time = a.duration.mul_f64(0.4);
    let one = flush_loop(&mut *dev, 1, phase_time, write_size).context("1 writer")?;
    pb.inc(1);
    let eight = flush_loop(&mut *dev, 8, phase_time, write_size).context("8 writers")?;
    pb.inc(1);
    pb.set_message("measuring write bandwidth");
    let bandwidth =
        write_bandwidth(&mut *dev, a.duration.mul_f64(0.2)).context("write bandwidth")?;
    pb.inc(1);
    pb.finish_and_clear();

    let worst = one.flush_p99_us.max(eight.flush_p99_us);
    let (mut verdict, mut reason) = judge(worst);
    let mut hints = Vec::new();
    let in_memory = file_system
        .as_deref()
        .is_some_and(|fs| matches!(fs, "tmpfs" | "ramfs"));
    if in_memory {
        verdict = "broken";
        reason = format!(
            "the file lives on {} (memory): no flush makes it survive a power cut",
            file_system.as_deref().unwrap_or("?")
        );
    }
    hints.extend(honesty_hints(&info, &one, &eight));
    // The drive's own word on its power-loss protection outranks any latency.
    if info.health.contains("power-loss protection) failed") {
        verdict = "broken";
        reason = "the drive reports its power-loss protection (volatile memory backup) failed"
            .to_string();
    }
    let projection = project(&one, bandwidth, a.record_size, write_size);
    let report = Report {
        target,
        device: DeviceReport::new(&info, backend),
        file_system,
        write_size,
        phases: vec![one, eight],
        write_bandwidth_bytes_per_s: bandwidth,
        verdict,
        verdict_reason: reason,
        worst_flush_p99_us: worst,
        projection_record_size: a.record_size,
        projection,
        hints,
        nvme_health: if info.health.is_empty() {
            format!(
                "VWC/PLP from Identify and the SMART critical warning: not available on the {backend} backend"
            )
        } else {
            format!(
                "volatile write cache {}; {}",
                if info.volatile_write_cache {
                    "present (flushes needed)"
                } else {
                    "absent (power-loss protected: completion is durable)"
                },
                info.health
            )
        },
    };
    tracing::info!(target = %report.target, verdict = report.verdict, worst_flush_p99_us = worst, "storage checked");
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_human(&report);
    }
    Ok(if report.verdict == "broken" {
        Status::Broken
    } else {
        Status::Ok
    })
}

type Target = (
    Box<dyn BlockDevice>,
    String,
    &'static str,
    Option<PathBuf>,
    Option<TempFile>,
);

fn open_target(a: &CheckStorageArgs) -> Result<Target> {
    if let Some(dir) = &a.dir {
        if !dir.is_dir() {
            bail!("--dir {}: not a directory", dir.display());
        }
        let path = dir.join(format!(".nvmq-check-storage-{}.img", std::process::id()));
        let dev = FileDevice::create(&path, a.size, FileOptions::default(), |_| Ok(()))
            .with_context(|| format!("creating the temporary file in {}", dir.display()))?;
        let temp = TempFile(path.clone());
        return Ok((
            Box::new(dev),
            format!("dir {} (temporary file, removed afterwards)", dir.display()),
            "file",
            Some(path),
            Some(temp),
        ));
    }
    let text = a
        .device
        .as_deref()
        .ok_or_else(|| anyhow!("give --device <spec> or --dir <path>"))?;
    let spec: DeviceSpec = text.parse()?;
    let mut dev = spec.open(None, |_| Ok(()))?;
    if !a.force {
        let copies = nvmq_log::mkfs::read_superblocks(&mut *dev);
        if copies.iter().any(|c| c.is_ok()) {
            bail!("{text} holds an nvmq log, which this measurement would overwrite; pass --force to go ahead, or use --dir");
        }
    }
    let fs_path = match &spec {
        DeviceSpec::File { path, .. } => Some(path.clone()),
        DeviceSpec::Sim(_) | DeviceSpec::Nvme { .. } => None,
    };
    Ok((dev, text.to_string(), spec.backend(), fs_path, None))
}

/// The verdict for a flush p99 in microseconds.
pub fn judge(p99_us: f64) -> (&'static str, String) {
    let ms = p99_us / 1e3;
    let (v, range) = if ms < 1.0 {
        ("ideal", "< 1 ms")
    } else if ms < 5.0 {
        ("good", "1-5 ms")
    } else if ms < 50.0 {
        ("workable", "5-50 ms")
    } else if ms <= 1000.0 {
        ("marginal", "50 ms-1 s")
    } else {
        ("broken", "> 1 s")
    };
    (v, format!("worst flush p99 {ms:.3} ms ({range})"))
}

/// Writers each loop over: write one block, then flush, then again. Each writer owns a range of
/// 64 blocks in the log region. Returns the latencies.
fn flush_loop(
    dev: &mut dyn BlockDevice,
    writers: usize,
    run_for: Duration,
    write_size: u32,
) -> Result<Phase> {
    let bs = u64::from(dev.info().logical_block_size);
    let blocks_per_write = u64::from(write_size) / bs;
    let base = LOG_START / bs;
    let span_blocks = (dev.info().capacity / bs).saturating_sub(base);
    if span_blocks < writers as u64 * blocks_per_write {
        bail!("device too small to measure: it needs room past the first 2 MiB");
    }
    let slots = (span_blocks / blocks_per_write / writers as u64).clamp(1, 64);
    let mut writes = Histogram::<u64>::new_with_bounds(1, 600_000_000_000, 3)?;
    let mut flushes = Histogram::<u64>::new_with_bounds(1, 600_000_000_000, 3)?;
    let mut started = vec![Instant::now(); writers];
    let mut count = vec![0u64; writers];
    let mut active = writers;
    let t0 = Instant::now();
    let lba_of = |w: usize, n: u64| base + (w as u64 * slots + n % slots) * blocks_per_write;
    for (w, s) in started.iter_mut().enumerate() {
        let mut b = dev.alloc_buffer(write_size as usize)?;
        b.fill(w as u8);
        *s = Instant::now();
        dev.submit_write(tag(w, false), lba_of(w, 0), b)?;
    }
    let mut done: Vec<Completion> = Vec::new();
    let mut spare: Vec<IoBuffer> = Vec::new();
    while active > 0 {
        dev.wait(&mut done, Duration::from_millis(100))?;
        for c in done.drain(..) {
            let w = (c.tag >> 1) as usize;
            if w >= writers {
                continue;
            }
            c.result.with_context(|| format!("writer {w}"))?;
            let now = Instant::now();
            if c.tag & 1 == 0 {
                writes.record((now - started[w]).as_nanos().max(1) as u64)?;
                if let Some(b) = c.buffer {
                    spare.push(b);
                }
                started[w] = now;
                dev.submit_flush(tag(w, true))?;
            } else {
                flushes.record((now - started[w]).as_nanos().max(1) as u64)?;
                count[w] += 1;
                if t0.elapsed() >= run_for {
                    active -= 1;
                    continue;
                }
                let mut b = match spare.pop() {
                    Some(b) => b,
                    None => dev.alloc_buffer(write_size as usize)?,
                };
                b.fill((count[w] & 0xff) as u8);
                started[w] = Instant::now();
                dev.submit_write(tag(w, false), lba_of(w, count[w]), b)?;
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let cycles: u64 = count.iter().sum();
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1e3;
    Ok(Phase {
        writers,
        cycles,
        write_p50_us: us(&writes, 0.5),
        flush_p50_us: us(&flushes, 0.5),
        flush_p99_us: us(&flushes, 0.99),
        flush_max_us: flushes.max() as f64 / 1e3,
        cycles_per_s: cycles as f64 / secs,
    })
}

fn tag(writer: usize, flush: bool) -> u64 {
    ((writer as u64) << 1) | u64::from(flush)
}

/// Large writes, four in flight, for `run_for`, then one flush: bytes per second including the
/// flush that makes them durable.
fn write_bandwidth(dev: &mut dyn BlockDevice, run_for: Duration) -> Result<f64> {
    let info = dev.info().clone();
    let bs = u64::from(info.logical_block_size);
    let size = u64::from(info.max_transfer.min(1 << 20)) / bs * bs;
    let base = LOG_START / bs;
    let room = (info.capacity / bs).saturating_sub(base) / (size / bs);
    if room == 0 {
        bail!("device too small to measure write bandwidth");
    }
    let t0 = Instant::now();
    let mut next = 0u64;
    let mut written = 0u64;
    let mut in_flight = 0usize;
    let mut done: Vec<Completion> = Vec::new();
    let mut spare: Vec<IoBuffer> = Vec::new();
    loop {
        while in_flight < 4 && t0.elapsed() < run_for {
            let b = match spare.pop() {
                Some(b) => b,
                None => dev.alloc_buffer(size as usize)?,
            };
            dev.submit_write(next, base + (next % room) * (size / bs), b)?;
            next += 1;
            in_flight += 1;
        }
        if in_flight == 0 {
            break;
        }
        dev.wait(&mut done, Duration::from_millis(100))?;
        for c in done.drain(..) {
            c.result.context("streaming write")?;
            in_flight -= 1;
            written += size;
            if let Some(b) = c.buffer {
                spare.push(b);
            }
        }
    }
    blockdev::flush_sync(dev).context("the flush after streaming writes")?;
    Ok(written as f64 / t0.elapsed().as_secs_f64())
}

fn honesty_hints(info: &blockdev::DeviceInfo, one: &Phase, eight: &Phase) -> Vec<String> {
    let mut h = Vec::new();
    if info.volatile_write_cache && one.flush_p50_us < 50.0 {
        h.push(format!(
            "SUSPICIOUS: flush p50 {:.1} us on a device that claims a volatile write cache; no medium persists its cache that fast. \
             Something below (a virtual disk, a controller, a file system) may acknowledge flushes it does not honour: \
             do not trust ack-after-flush here before a power-cut test passes",
            one.flush_p50_us
        ));
    }
    if !info.volatile_write_cache {
        h.push(
            "the device reports no volatile write cache (power-loss protected): the writer acknowledges at write completion without flushing"
                .into(),
        );
    }
    if one.flush_p50_us > 0.0 && one.flush_p99_us > 20.0 * one.flush_p50_us {
        h.push(format!(
            "flush latency is erratic: p99 is {:.0}x p50; expect ack latency spikes",
            one.flush_p99_us / one.flush_p50_us
        ));
    }
    if one.flush_p50_us > 0.0 && eight.flush_p50_us > 6.0 * one.flush_p50_us {
        h.push(format!(
            "concurrent flushes queue behind each other (8 writers: p50 {:.0}x one writer); group commit gathers them into one",
            eight.flush_p50_us / one.flush_p50_us
        ));
    }
    if cfg!(target_os = "macos") {
        h.push("macOS: the file backend flushes with F_FULLFSYNC (plain fsync does not reach the medium)".into());
    } else {
        h.push(format!(
            "plain fsync vs F_FULLFSYNC: compared on macOS only (not measured on {})",
            std::env::consts::OS
        ));
    }
    h
}

/// Group commit with `n` producers each waiting for its ack: one batch of n records per write
/// plus flush, so acks/s = n / (batch write time + flush time), capped by the write bandwidth.
pub fn project(one: &Phase, bandwidth: f64, record: u64, write_unit: u32) -> Vec<Projection> {
    let per_record = record_size(record as usize) as f64;
    let u = f64::from(write_unit);
    let flush_s = one.flush_p50_us / 1e6;
    let write_s = one.write_p50_us / 1e6;
    [1u64, 64, 1024]
        .iter()
        .map(|&n| {
            let batch = ((BATCH_HEADER_LEN as f64 + n as f64 * per_record) / u).ceil() * u;
            let write = write_s.max(batch / bandwidth.max(1.0));
            let commit = write + flush_s;
            let by_latency = n as f64 / commit.max(1e-9);
            let by_bandwidth = bandwidth / per_record;
            Projection {
                producers: n,
                acks_per_s: by_latency.min(by_bandwidth),
                commit_ms: commit * 1e3,
                bandwidth_bound: write > flush_s,
            }
        })
        .collect()
}

/// The file system type holding `path`, from /proc/self/mounts (longest mount point prefix).
fn file_system_of(path: &std::path::Path) -> Option<String> {
    let full = std::fs::canonicalize(path)
        .or_else(|_| {
            path.parent()
                .map_or(Err(()), |p| std::fs::canonicalize(p).map_err(|_| ()))
        })
        .ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, fs) = (f.next()?, f.next()?, f.next()?);
            full.starts_with(dir).then(|| (dir.len(), fs.to_string()))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, fs)| fs)
}

fn print_human(r: &Report) {
    println!("target               {}", r.target);
    println!("device");
    for l in r.device.lines() {
        println!("  {l}");
    }
    if let Some(fs) = &r.file_system {
        println!("  file system          {fs}");
    }
    println!("write + flush loop ({} B writes)", r.write_size);
    for p in &r.phases {
        println!(
            "  {} writer{}  {:>7} cycles  flush p50 {:>9.1} us  p99 {:>9.1} us  max {:>9.1} us  write p50 {:>8.1} us  {:>8.0} cycles/s",
            p.writers,
            if p.writers == 1 { " " } else { "s" },
            p.cycles,
            p.flush_p50_us,
            p.flush_p99_us,
            p.flush_max_us,
            p.write_p50_us,
            p.cycles_per_s
        );
    }
    println!(
        "write bandwidth      {}/s (large writes, 4 in flight, then a flush)",
        bytes(r.write_bandwidth_bytes_per_s as u64)
    );
    println!(
        "verdict              {} ({})",
        r.verdict.to_uppercase(),
        r.verdict_reason
    );
    println!(
        "group commit projection ({} B records, producers each waiting for their ack; a ceiling from the device figures alone, CPU costs not included)",
        r.projection_record_size
    );
    for p in &r.projection {
        println!(
            "  {:>5} producers  {:>12.0} acks/s  commit {:>8.3} ms{}",
            p.producers,
            p.acks_per_s,
            p.commit_ms,
            if p.bandwidth_bound {
                "  (bandwidth bound)"
            } else {
                ""
            }
        );
    }
    println!("nvme health          {}", r.nvme_health);
    for h in &r.hints {
        println!("hint: {h}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_follow_the_p99_bands() {
        assert_eq!(judge(400.0).0, "ideal");
        assert_eq!(judge(1_000.0).0, "good");
        assert_eq!(judge(4_999.0).0, "good");
        assert_eq!(judge(20_000.0).0, "workable");
        assert_eq!(judge(50_000.0).0, "marginal");
        assert_eq!(judge(1_000_000.0).0, "marginal");
        assert_eq!(judge(1_000_001.0).0, "broken");
    }

    #[test]
    fn projection_grows_with_producers_until_bandwidth_caps_it() {
        let one = Phase {
            writers: 1,
            cycles: 100,
            write_p50_us: 20.0,
            flush_p50_us: 1000.0,
            flush_p99_us: 2000.0,
            flush_max_us: 3000.0,
            cycles_per_s: 980.0,
        };
        let p = project(&one, 1e9, 1024, 4096);
        assert!((p[0].acks_per_s - 1.0 / 0.00102).abs() < 1.0, "{p:?}");
        assert!(p[1].acks_per_s > 50.0 * p[0].acks_per_s);
        assert!(
            !p[1].bandwidth_bound,
            "68 KiB at 1 GB/s is quicker than the flush"
        );
        let slow = project(&one, 10e6, 1024, 4096);
        assert!(slow[2].bandwidth_bound, "{slow:?}");
        assert!(slow[2].acks_per_s <= 10e6 / 1064.0 + 1.0);
    }
}
