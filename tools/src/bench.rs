//! `nvmq bench`: closed-loop producers against a device, printing what group commit achieves.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use blockdev::{BlockDevice, IoBuffer};
use crossbeam::channel::{unbounded, Receiver, RecvTimeoutError, Sender, TryRecvError};
use hdrhistogram::Histogram;
use nvmq_log::format::LOG_START;
use nvmq_log::{FlushMode, FormatOptions, Log, LogConfig, LogError, WriterStats};
use serde::Serialize;

use crate::bench_inline::InlineLog;
use crate::devspec::DeviceSpec;
use crate::plot;

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "Examples:\n  \
    nvmq bench --device sim:flush=4.4ms,write=20us --producers 1,64,1024 --record-size 100,1024\n  \
    nvmq bench --device file:/data/bench.img --device sim --flush always,interval:5 \\\n        \
    --out results.json --plot plots/\n\n\
Every combination of device x flush mode x record size x producers is one scenario. Each device \
is formatted (a file is created when missing; an existing file other than the default needs \
--force).")]
pub struct BenchArgs {
    /// Device, repeatable: `file:<path>[,engine=uring|threads|auto]` (created if missing), `nvme:<pci>[,ns=<id>][,io_timeout_ms=<ms>]` (needs --force), or `sim[:flush=4.4ms,write=20us,capacity=4G,plp=false,serialize=false]`.
    #[arg(long, action = clap::ArgAction::Append, default_value = "file:./nvmq-data/bench.img")]
    pub device: Vec<String>,
    /// Size of a device file the bench creates.
    #[arg(long, value_parser = crate::devspec::parse_size, default_value = "1G")]
    pub size: u64,
    /// Closed-loop producer counts to run, one scenario each (each waits for its ack before sending again).
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,256")]
    pub producers: Vec<usize>,
    /// Record payload sizes in bytes, one scenario each.
    #[arg(long, value_delimiter = ',', default_value = "100,1024")]
    pub record_size: Vec<usize>,
    /// How long each scenario runs (after a warm-up of a fifth of it).
    #[arg(long, value_parser = crate::devspec::parse_duration, default_value = "3s")]
    pub duration: Duration,
    /// Flush modes, one set of scenarios each: always (ack after flush), interval:<ms>, never.
    #[arg(long, value_delimiter = ',', default_value = "always")]
    pub flush: Vec<String>,
    /// I/O threads of the file backend's threads engine (`file:<path>,engine=threads`): with more
    /// than one, a batch write overlaps the running fdatasync (1 shows what that overlap is worth).
    #[arg(long, default_value_t = 4)]
    pub io_threads: usize,
    /// Flushes the writer keeps in flight.
    #[arg(long, default_value_t = 4)]
    pub flushes_in_flight: usize,
    /// How long the writer thread and the producers' driver threads keep polling after their
    /// last work before they sleep (0: at once). Polling saves a wake-up per hand-off (tens of
    /// microseconds on a virtual machine) at the price of a core's time, as SPDK polls.
    #[arg(long, value_parser = crate::devspec::parse_duration, default_value = "50us")]
    pub spin: Duration,
    /// Drive the producers on the writer's own thread, as `nvmq serve`'s event loops drive the
    /// writer they host: no hand-off between threads per ack, and the thread polls the device
    /// instead of sleeping while records are in flight. Shows the log's own cost per record.
    #[arg(long)]
    pub inline: bool,
    /// Format an existing file that is not the bench's own default file, or an NVMe namespace.
    #[arg(long)]
    pub force: bool,
    /// Print results as JSON (one object) instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON results to this file.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Write SVG charts into this directory: throughput.svg (acks/s and p99 against producers)
    /// and latency-histogram.svg.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
}

#[derive(Serialize, Debug, Clone)]
pub struct DeviceBaseline {
    pub write_p50_us: f64,
    pub flush_p50_us: f64,
    pub flush_p99_us: f64,
    /// Single writer, 4 KiB write + flush in a loop: operations per second.
    pub write_flush_per_s: f64,
}

/// One bar of an ack latency histogram: acks that took at most `le_us` (and more than the
/// previous bar's bound).
#[derive(Serialize, Debug, Clone)]
pub struct Bucket {
    pub le_us: f64,
    pub count: u64,
}

#[derive(Serialize, Debug, Clone)]
pub struct Scenario {
    pub producers: usize,
    pub record_size: usize,
    pub seconds: f64,
    pub acks: u64,
    pub acks_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub flushes_per_s: f64,
    pub records_per_flush: f64,
    pub write_amplification: f64,
    /// Acks/s over the single-writer write+flush rate of the same device.
    pub vs_single_writer: f64,
    pub latency_histogram: Vec<Bucket>,
}

/// The scenarios of one device and flush mode.
#[derive(Serialize, Debug)]
pub struct Run {
    pub device: String,
    pub identity: String,
    /// The file backend's I/O engine (`DeviceInfo::engine`); empty for other backends.
    pub engine: String,
    pub volatile_write_cache: bool,
    pub write_unit: u32,
    pub flush_mode: String,
    pub baseline: DeviceBaseline,
    pub memory_cap_bytes: u64,
    pub scenarios: Vec<Scenario>,
}

#[derive(Serialize, Debug)]
pub struct Report {
    pub runs: Vec<Run>,
}

/// Who steps the bench's writer. One value per run, so the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Host {
    /// Its own thread; producers are served by driver threads (`scenario`).
    Thread(Log, Vec<u32>),
    /// The bench's thread, with the producers (`--inline`).
    Inline(InlineLog, Vec<u32>),
}

const DEFAULT_BENCH_FILE: &str = "./nvmq-data/bench.img";

pub fn run(args: BenchArgs) -> Result<crate::Status> {
    if args.producers.is_empty() || args.producers.contains(&0) {
        bail!("--producers wants positive counts, e.g. 1,8,64");
    }
    if args.record_size.is_empty() {
        bail!("--record-size wants at least one size, e.g. 100,1024");
    }
    if args.duration.is_zero() {
        bail!("--duration must be positive, e.g. 3s");
    }
    let mut flushes = Vec::new();
    for f in &args.flush {
        let mode: FlushMode = f
            .parse()
            .map_err(|e: String| anyhow::anyhow!("--flush: {e}"))?;
        flushes.push((f.clone(), mode));
    }
    let mut specs = Vec::new();
    for d in &args.device {
        let spec: DeviceSpec = d.parse()?;
        if let DeviceSpec::File { path: p, .. } = &spec {
            let own = p == Path::new(DEFAULT_BENCH_FILE);
            if p.exists() && !own && !args.force {
                bail!(
                    "{} exists; the bench formats its device. Pass --force to format it, or name a new file",
                    p.display()
                );
            }
        }
        if let (DeviceSpec::Nvme { pci, nsid, .. }, false) = (&spec, args.force) {
            bail!(
                "the bench formats its device; pass --force to overwrite NVMe {pci} namespace {nsid}"
            );
        }
        specs.push((d.clone(), spec));
    }
    if let Some(dir) = &args.plot {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let total = specs.len() * flushes.len() * args.producers.len() * args.record_size.len();
    let pb = crate::progress::steps_bar(total as u64, "bench scenarios");
    let mut runs = Vec::new();
    for (text, spec) in &specs {
        for (name, mode) in &flushes {
            pb.set_message(format!("{text}, flush {name}"));
            runs.push(run_one(&args, text, spec, name, *mode, &pb)?);
        }
    }
    pb.finish_and_clear();
    let report = Report { runs };
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(out) = &args.out {
        std::fs::write(out, format!("{json}\n"))
            .with_context(|| format!("writing {}", out.display()))?;
    }
    if let Some(dir) = &args.plot {
        write_plots(&report, dir)?;
    }
    if args.json {
        println!("{json}");
    }
    Ok(crate::Status::Ok)
}

fn run_one(
    args: &BenchArgs,
    text: &str,
    spec: &DeviceSpec,
    flush_name: &str,
    flush: FlushMode,
    pb: &indicatif::ProgressBar,
) -> Result<Run> {
    let file_opts = blockdev::file::FileOptions {
        io_threads: args.io_threads,
        ..Default::default()
    };
    let mut dev = spec.open_with(Some(args.size), file_opts, |_| Ok(()))?;
    let baseline = measure_baseline(&mut *dev, args.duration.min(Duration::from_secs(1)))?;
    let info = dev.info().clone();
    let fmt = FormatOptions::default();
    nvmq_log::mkfs::format(&mut *dev, &fmt).context("formatting the bench device")?;
    let cfg = LogConfig {
        flush,
        max_flushes_in_flight: args.flushes_in_flight,
        spin: args.spin,
        ..LogConfig::default()
    };
    let (writer, _report) =
        recovery::open(dev, cfg.clone()).context("opening the formatted device")?;
    let queue = cfg.queue_capacity;
    let mut host = if args.inline {
        let (inline, partitions) = InlineLog::start(writer, queue, 16)?;
        Host::Inline(inline, partitions)
    } else {
        let log = Log::start(writer, queue);
        let mut partitions = Vec::new();
        for i in 0..16 {
            partitions.push(log.create_partition("bench", i)?);
        }
        Host::Thread(log, partitions)
    };
    let max_record = *args.record_size.iter().max().unwrap_or(&0);
    let max_producers = *args.producers.iter().max().unwrap_or(&1);
    // Bounded by: the request queue, one record per producer outside it, and the writer's batch
    // buffers (2 x writes in flight + 2, each a maximum batch).
    let memory_cap = (queue.max(max_producers) * (max_record + 64)) as u64
        + (2 * cfg.max_writes_in_flight as u64 + 2) * u64::from(fmt.max_batch);
    let human = !args.json;
    if human {
        pb.suspend(|| {
            println!(
                "device {text} ({}{}), write unit {} B, volatile write cache: {}, flush mode {flush_name}",
                info.identity,
                if info.engine.is_empty() { String::new() } else { format!(", engine {}", info.engine) },
                info.write_unit(),
                info.volatile_write_cache,
            );
            println!(
                "device alone (1 writer, 4 KiB write + flush): write p50 {:.0} us, flush p50 {:.0} us, flush p99 {:.0} us, {:.0} write+flush/s",
                baseline.write_p50_us, baseline.flush_p50_us, baseline.flush_p99_us, baseline.write_flush_per_s
            );
            println!(
                "memory cap with {max_producers} producers: {:.1} MiB",
                memory_cap as f64 / (1 << 20) as f64
            );
            println!(
                "{:>9} {:>7} {:>11} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>6} {:>8}",
                "producers", "bytes", "acks/s", "p50 us", "p99 us", "p999 us", "max us",
                "flushes/s", "rec/flush", "WA", "x single"
            );
        });
    }
    let mut scenarios = Vec::new();
    for &size in &args.record_size {
        for &p in &args.producers {
            let s = match &mut host {
                Host::Thread(log, partitions) => {
                    scenario(log, partitions, p, size, args, &baseline)?
                }
                Host::Inline(inline, partitions) => {
                    let m = inline.scenario(partitions, p, size, args.duration)?;
                    summarize(p, size, args.duration, &m.hist, &m.mid, &m.end, &baseline)
                }
            };
            pb.inc(1);
            if human {
                pb.suspend(|| {
                    println!(
                        "{:>9} {:>7} {:>11.0} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>10.0} {:>9.1} {:>6.2} {:>8.1}",
                        s.producers, s.record_size, s.acks_per_s, s.p50_us, s.p99_us, s.p999_us, s.max_us,
                        s.flushes_per_s, s.records_per_flush, s.write_amplification, s.vs_single_writer
                    )
                });
            }
            scenarios.push(s);
        }
    }
    match host {
        Host::Thread(log, _) => {
            if let Some(f) = log.fatal() {
                bail!("the writer stopped: {f}");
            }
            log.shutdown();
        }
        Host::Inline(inline, _) => inline.shutdown()?,
    }
    Ok(Run {
        device: text.to_string(),
        identity: info.identity.clone(),
        engine: info.engine.clone(),
        volatile_write_cache: info.volatile_write_cache,
        write_unit: info.write_unit(),
        flush_mode: flush_name.to_string(),
        baseline,
        memory_cap_bytes: memory_cap,
        scenarios,
    })
}

/// throughput.svg: acks/s and p99 against producers, one line per device, flush mode and record
/// size; latency-histogram.svg: the ack latency distribution of every scenario of the first run.
fn write_plots(report: &Report, dir: &Path) -> Result<()> {
    let mut tput = Vec::new();
    let mut p99 = Vec::new();
    for r in &report.runs {
        let mut sizes: Vec<usize> = r.scenarios.iter().map(|s| s.record_size).collect();
        sizes.dedup();
        for size in sizes {
            let of = |f: fn(&Scenario) -> f64| -> Vec<(f64, f64)> {
                r.scenarios
                    .iter()
                    .filter(|s| s.record_size == size)
                    .map(|s| (s.producers as f64, f(s)))
                    .collect()
            };
            let name = format!("{} flush={} {} B", r.device, r.flush_mode, size);
            tput.push(plot::Series {
                name: name.clone(),
                points: of(|s| s.acks_per_s),
            });
            p99.push(plot::Series {
                name,
                points: of(|s| s.p99_us),
            });
        }
    }
    let doc = plot::svg(&[
        plot::Panel {
            title: "throughput",
            x_label: "producers",
            y_label: "acks/s",
            series: &tput,
        },
        plot::Panel {
            title: "ack latency p99",
            x_label: "producers",
            y_label: "p99 (us)",
            series: &p99,
        },
    ]);
    let path = dir.join("throughput.svg");
    std::fs::write(&path, doc).with_context(|| format!("writing {}", path.display()))?;
    let hist: Vec<plot::Series> = report
        .runs
        .iter()
        .take(1)
        .flat_map(|r| {
            r.scenarios.iter().map(move |s| plot::Series {
                name: format!(
                    "{} flush={} {} producers {} B",
                    r.device, r.flush_mode, s.producers, s.record_size
                ),
                points: s
                    .latency_histogram
                    .iter()
                    .map(|b| (b.le_us, b.count as f64))
                    .collect(),
            })
        })
        .collect();
    let doc = plot::svg(&[plot::Panel {
        title: "ack latency histogram",
        x_label: "ack latency (us, bucket upper bound)",
        y_label: "acks",
        series: &hist,
    }]);
    let path = dir.join("latency-histogram.svg");
    std::fs::write(&path, doc).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The device alone: one writer doing 4 KiB write + flush in a loop, for `run_for` (at most
/// 2000 cycles).
fn measure_baseline(dev: &mut dyn BlockDevice, run_for: Duration) -> Result<DeviceBaseline> {
    let mut w = Histogram::<u64>::new(3)?;
    let mut f = Histogram::<u64>::new(3)?;
    let unit = dev.info().write_unit() as usize;
    let mut buf: Option<IoBuffer> = Some(dev.alloc_buffer(unit)?);
    let lba = LOG_START / u64::from(dev.info().logical_block_size);
    let start = Instant::now();
    let mut n = 0u64;
    while (n == 0 || start.elapsed() < run_for) && n < 2000 {
        let Some(mut b) = buf.take() else { break };
        b.fill((n & 0xff) as u8);
        let t = Instant::now();
        let b = blockdev::write_sync(
            dev,
            lba + (n % 64) * (unit as u64 / u64::from(dev.info().logical_block_size)),
            b,
        )?;
        let t2 = Instant::now();
        blockdev::flush_sync(dev)?;
        let t3 = Instant::now();
        w.record((t2 - t).as_nanos() as u64)?;
        f.record((t3 - t2).as_nanos() as u64)?;
        buf = Some(b);
        n += 1;
    }
    let total = start.elapsed().as_secs_f64();
    Ok(DeviceBaseline {
        write_p50_us: w.value_at_quantile(0.5) as f64 / 1e3,
        flush_p50_us: f.value_at_quantile(0.5) as f64 / 1e3,
        flush_p99_us: f.value_at_quantile(0.99) as f64 / 1e3,
        write_flush_per_s: n as f64 / total,
    })
}

/// One closed-loop scenario. Producers are logical: an ack hands the producer back to a few
/// driver threads, which send its next record, so 1024 producers need no 1024 threads.
fn scenario(
    log: &Log,
    partitions: &[u32],
    producers: usize,
    size: usize,
    args: &BenchArgs,
    baseline: &DeviceBaseline,
) -> Result<Scenario> {
    let (duration, spin) = (args.duration, args.spin);
    let (ready_tx, ready_rx) = unbounded::<(usize, Instant)>();
    let stop = Arc::new(AtomicBool::new(false));
    let failed: Arc<std::sync::Mutex<Option<LogError>>> = Arc::default();
    let payload = vec![0x5au8; size];
    let started = Instant::now();
    let drivers = 2usize.min(producers);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    // Every producer starts with one record in flight.
    let send = |p: usize,
                tx: &Sender<(usize, Instant)>,
                failed: &Arc<std::sync::Mutex<Option<LogError>>>|
     -> Result<(), LogError> {
        let tx = tx.clone();
        let failed = failed.clone();
        let t = Instant::now();
        log.append(
            partitions[p % partitions.len()],
            payload.clone(),
            Box::new(move |r| match r {
                Ok(_) => {
                    let _ = tx.send((p, t));
                }
                Err(e) => {
                    if let Ok(mut f) = failed.lock() {
                        *f = Some(e);
                    }
                    let _ = tx.send((usize::MAX, t));
                }
            }),
        )
    };
    for p in 0..producers {
        send(p, &ready_tx, &failed)?;
    }
    let warmup = duration / 5;
    // Producers whose last record has not come back since the stop.
    let outstanding = AtomicUsize::new(producers);
    let (hists, mid, end) = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for _ in 0..drivers {
            let rx = ready_rx.clone();
            let tx = ready_tx.clone();
            let stop = stop.clone();
            let failed = failed.clone();
            let send = &send;
            let outstanding = &outstanding;
            handles.push(s.spawn(move || {
                let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).ok();
                let mut last = Instant::now();
                loop {
                    let (p, t) = match next_ack(&rx, spin) {
                        Ok(m) => m,
                        Err(RecvTimeoutError::Timeout) => {
                            // Done once every producer's last record came back; a writer silent
                            // for 5 s is not coming back.
                            let drained = stop.load(Ordering::Relaxed)
                                && outstanding.load(Ordering::Relaxed) == 0;
                            if drained || last.elapsed() > Duration::from_secs(5) {
                                break;
                            }
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => break,
                    };
                    last = Instant::now();
                    if p == usize::MAX {
                        break;
                    }
                    let now = Instant::now();
                    if now.duration_since(started) > warmup {
                        if let Some(h) = h.as_mut() {
                            let _ = h.record(now.duration_since(t).as_nanos() as u64);
                        }
                    }
                    if stop.load(Ordering::Relaxed) {
                        outstanding.fetch_sub(1, Ordering::Relaxed);
                        continue;
                    }
                    if send(p, &tx, &failed).is_err() {
                        break;
                    }
                }
                h
            }));
        }
        std::thread::sleep(warmup);
        let mid = log.stats();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        let end = log.stats();
        // Drivers stop sending and drain the records still in flight, so the next scenario
        // starts clean.
        let hists: Vec<Histogram<u64>> = handles
            .into_iter()
            .filter_map(|h| h.join().ok().flatten())
            .collect();
        (hists, mid, end)
    });
    for h in &hists {
        hist.add(h)?;
    }
    if let Some(e) = failed.lock().ok().and_then(|f| f.clone()) {
        bail!("an append failed: {e}");
    }
    Ok(summarize(
        producers, size, duration, &hist, &mid, &end, baseline,
    ))
}

/// A scenario's figures from its latency histogram and the writer's counters at the start and
/// the end of its measured window.
fn summarize(
    producers: usize,
    size: usize,
    duration: Duration,
    hist: &Histogram<u64>,
    mid: &WriterStats,
    end: &WriterStats,
    baseline: &DeviceBaseline,
) -> Scenario {
    let secs = duration.as_secs_f64();
    let acks = end.appends_acked - mid.appends_acked;
    let flushes = (end.flushes - mid.flushes).max(1);
    let payload_bytes = (end.payload_bytes_acked - mid.payload_bytes_acked).max(1);
    let device_bytes = end.device_bytes_written - mid.device_bytes_written;
    let single = 1.0 / baseline.write_flush_per_s.max(1e-9);
    Scenario {
        producers,
        record_size: size,
        seconds: secs,
        acks,
        acks_per_s: acks as f64 / secs,
        p50_us: hist.value_at_quantile(0.5) as f64 / 1e3,
        p99_us: hist.value_at_quantile(0.99) as f64 / 1e3,
        p999_us: hist.value_at_quantile(0.999) as f64 / 1e3,
        max_us: hist.max() as f64 / 1e3,
        flushes_per_s: flushes as f64 / secs,
        records_per_flush: acks as f64 / flushes as f64,
        write_amplification: device_bytes as f64 / payload_bytes as f64,
        vs_single_writer: (acks as f64 / secs) * single,
        latency_histogram: buckets(hist),
    }
}

/// The next producer whose record came back: polled for up to `spin`, then waited for.
fn next_ack<T>(rx: &Receiver<T>, spin: Duration) -> Result<T, RecvTimeoutError> {
    if !spin.is_zero() {
        let since = Instant::now();
        loop {
            match rx.try_recv() {
                Ok(m) => return Ok(m),
                Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
                // Yield: a writer thread sharing this core runs at once, not after the spin.
                Err(TryRecvError::Empty) if since.elapsed() < spin => std::thread::yield_now(),
                Err(TryRecvError::Empty) => break,
            }
        }
    }
    rx.recv_timeout(Duration::from_millis(20))
}

/// Buckets from 1 µs growing by a quarter, empty ones left out.
fn buckets(h: &Histogram<u64>) -> Vec<Bucket> {
    h.iter_log(1000, 1.25)
        .filter(|v| v.count_since_last_iteration() > 0)
        .map(|v| Bucket {
            le_us: v.value_iterated_to() as f64 / 1e3,
            count: v.count_since_last_iteration(),
        })
        .collect()
}
