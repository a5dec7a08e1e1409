//! What readers on queue pairs of their own change, on the NVMe driver's software controller:
//! the same log read two ways, alternating, in one run (the machine may be busy, so compare the
//! ratios, not the absolute figures):
//!
//! - **through the writer**: a read is handed to the thread that owns the writer's queue pair
//!   (over the log's queue and its doorbell), which submits it beside its writes and hands the
//!   bytes back (as every device read went before);
//! - **own pairs**: the reader submits and reaps on an I/O queue pair of its own
//!   (`nvmq_log::direct`).
//!
//! Each case: `R` reader threads read single batches at random offsets (the tail cache off, so
//! every read goes to the device) while one producer appends, one record at a time, for the
//! length of the read phase.
//!
//!     cargo bench -p nvmq-recovery --bench direct_reads     # NVMQ_BENCH_READS=<n> per reader

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
fn main() {
    bench::main();
}

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
fn main() {
    eprintln!("the NVMe driver builds on Linux on x86_64 and aarch64 only");
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod bench {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc, Barrier};
    use std::time::Instant;

    use blockdev::nvme::fake::{self, FakeConfig};
    use blockdev::nvme::{NvmeDevice, NvmeOptions};
    use blockdev::BlockDevice;
    use nvmq_log::config::{FormatOptions, LogConfig};
    use nvmq_log::direct::DirectReads;
    use nvmq_log::Log;

    const RECORDS: u64 = 4000;
    const RECORD: usize = 1000;

    fn log(readers: u16) -> Result<Log, String> {
        let (host, _h) = fake::controller(FakeConfig {
            io_queues: readers + 1,
            blocks: 32768,
            ..FakeConfig::default()
        });
        let opts = NvmeOptions {
            queue_pairs: readers + 1,
            ..NvmeOptions::default()
        };
        let mut dev = NvmeDevice::with_host(host, 1, opts).map_err(|e| e.to_string())?;
        let fmt = FormatOptions {
            window: 4 << 20,
            max_batch: 256 << 10,
            ..FormatOptions::default()
        };
        nvmq_log::mkfs::format(&mut dev, &fmt).map_err(|e| e.to_string())?;
        let mut pairs: Vec<Box<dyn BlockDevice>> = Vec::new();
        for _ in 0..readers {
            match dev.queue_pair().map_err(|e| e.to_string())? {
                Some(p) => pairs.push(Box::new(p)),
                None => return Err("the fake granted fewer pairs than asked".into()),
            }
        }
        let cfg = LogConfig {
            tail_cache_bytes: 0,
            scrub_rate: 0,
            ..LogConfig::default()
        };
        let (mut w, _) = recovery::open(dev, cfg.clone()).map_err(|e| e.to_string())?;
        w.set_direct_reads(DirectReads::new(pairs));
        Ok(Log::start(w, cfg.queue_capacity))
    }

    struct Figures {
        reads_per_s: f64,
        us_per_read: f64,
        acks_per_s: f64,
        direct: u64,
        reads: u64,
    }

    /// `readers` threads, `reads` each; pairs of their own when `own`.
    fn run(readers: usize, own: bool, reads: u64) -> Result<Figures, String> {
        let log = Arc::new(log(if own { readers as u16 } else { 0 })?);
        let part = log.create_partition("t", 0).map_err(|e| e.to_string())?;
        // Fill: appends in flight together, so batches hold many records.
        let (tx, rx) = mpsc::channel();
        for i in 0..RECORDS {
            let tx = tx.clone();
            let ack = Box::new(move |r: Result<_, _>| {
                let _ = tx.send(r.is_ok());
            });
            log.append(part, vec![i as u8; RECORD], ack)
                .map_err(|e| e.to_string())?;
        }
        drop(tx);
        if !rx.iter().all(|ok| ok) {
            return Err("an append failed".into());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let producer = {
            let (log, stop) = (log.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut acks = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if log.append_wait(part, vec![7; RECORD]).is_err() {
                        break;
                    }
                    acks += 1;
                }
                acks
            })
        };
        let start = Arc::new(Barrier::new(readers + 1));
        let threads: Vec<_> = (0..readers)
            .map(|t| {
                let (log, start) = (log.clone(), start.clone());
                std::thread::spawn(move || -> Result<(), String> {
                    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
                    start.wait();
                    for _ in 0..reads {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let got = log.read(part, x % RECORDS, 1).map_err(|e| e.to_string())?;
                        if got.first().is_none_or(|r| r.payload.len() != RECORD) {
                            return Err("a read came back without its record".into());
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        for t in threads {
            t.join().map_err(|_| "a reader panicked")??;
        }
        let elapsed = t0.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let acks = producer.join().map_err(|_| "the producer panicked")?;
        let st = log.stats();
        let total = readers as f64 * reads as f64;
        Ok(Figures {
            reads_per_s: total / elapsed,
            us_per_read: elapsed * 1e6 * readers as f64 / total,
            acks_per_s: acks as f64 / elapsed,
            direct: st.direct_reads,
            reads: st.reads,
        })
    }

    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }

    pub fn main() {
        let reads: u64 = std::env::var("NVMQ_BENCH_READS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5000);
        println!(
            "log reads on the NVMe software controller, {reads} single-batch reads per reader, \
             one producer appending meanwhile; 3 alternating rounds, medians"
        );
        println!(
            "{:<8} {:<20} {:>10} {:>10} {:>14}",
            "readers", "reads", "reads/s", "us/read", "producer acks/s"
        );
        for readers in [1usize, 2, 4] {
            let mut by_mode: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> =
                vec![(Vec::new(), Vec::new(), Vec::new()); 2];
            for _round in 0..3 {
                for (m, own) in [false, true].into_iter().enumerate() {
                    match run(readers, own, reads) {
                        Ok(f) => {
                            if own != (f.direct == f.reads) {
                                eprintln!("mode {own}: {} of {} reads direct", f.direct, f.reads);
                                std::process::exit(1);
                            }
                            by_mode[m].0.push(f.reads_per_s);
                            by_mode[m].1.push(f.us_per_read);
                            by_mode[m].2.push(f.acks_per_s);
                        }
                        Err(e) => {
                            eprintln!("{readers} readers (own pairs: {own}) failed: {e}");
                            std::process::exit(1);
                        }
                    }
                }
            }
            let med: Vec<(f64, f64, f64)> = by_mode
                .into_iter()
                .map(|(a, b, c)| (median(a), median(b), median(c)))
                .collect();
            for (name, f) in ["through the writer", "own pairs"].iter().zip(&med) {
                println!(
                    "{:<8} {:<20} {:>10.0} {:>10.1} {:>14.0}",
                    readers, name, f.0, f.1, f.2
                );
            }
            println!(
                "{:<8} {:<20} {:>9.2}x {:>9.2}x {:>13.2}x",
                readers,
                "own / writer",
                med[1].0 / med[0].0,
                med[1].1 / med[0].1,
                med[1].2 / med[0].2
            );
        }
    }
}
