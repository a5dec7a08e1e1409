//! The NVMe driver's own cost per I/O, without a drive: the real driver (`NvmeDevice`) against
//! the software controller in the same thread, which runs each command and posts its completion
//! when the submission doorbell is written. The controller times its own work (register writes:
//! the lock, the commands, the 4 KiB copies, the completions); the driver's cost is the rest.
//!
//!     cargo bench -p nvmq-blockdev --bench nvme_driver            # NVMQ_BENCH_IOS=<n> per case
//!
//! What "driver" includes: building submission entries and PRPs, the slot and request tables,
//! ringing doorbells (one per poll), reaping completion entries and handing back buffers, plus
//! this loop's own bookkeeping (a Vec push and pop per I/O). What it leaves out: a real MMIO
//! write costs more than a call into the fake, and a real completion arrives from another agent
//! (a cache miss on the completion entry), so on hardware add those.

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
fn main() {
    driver::main();
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
mod driver {
    use std::time::Instant;

    use blockdev::nvme::fake::{self, FakeConfig, FakeHandle, FakeHost};
    use blockdev::nvme::{NvmeDevice, NvmeOptions};
    use blockdev::{BlockDevice, Completion, DeviceError, IoBuffer};

    const BLOCK: usize = 4096;
    /// Blocks of the software controller's namespace the I/Os cycle over (64 MiB).
    const BLOCKS: u64 = 16384;

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Op {
        Write,
        Read,
        Flush,
    }

    impl Op {
        fn name(self) -> &'static str {
            match self {
                Op::Write => "write 4 KiB",
                Op::Read => "read 4 KiB",
                Op::Flush => "flush",
            }
        }
    }

    struct Figures {
        total_ns: f64,
        controller_ns: f64,
    }

    fn open(depth: usize) -> Result<(NvmeDevice<FakeHost>, FakeHandle), DeviceError> {
        let cfg = FakeConfig {
            blocks: BLOCKS,
            timed: true,
            ..FakeConfig::default()
        };
        let (host, handle) = fake::controller(cfg);
        let opts = NvmeOptions {
            queue_depth: depth.max(2),
            arena_bytes: 8 << 20,
            max_arenas: 2,
            ..NvmeOptions::default()
        };
        Ok((NvmeDevice::with_host(host, 1, opts)?, handle))
    }

    /// `ios` I/Os of `op`, `depth` kept in flight, submitted and reaped by one thread.
    fn run(op: Op, depth: usize, ios: u64) -> Result<Figures, String> {
        measure(op, depth, ios)
            .map_err(|e| e.to_string())?
            .check(op, ios)
    }

    fn measure(op: Op, depth: usize, ios: u64) -> Result<Measured, DeviceError> {
        let (mut dev, handle) = open(depth)?;
        let mut free: Vec<Option<IoBuffer>> = Vec::with_capacity(depth);
        for i in 0..depth {
            free.push(match op {
                Op::Flush => None,
                _ => {
                    let mut b = dev.alloc_buffer(BLOCK)?;
                    b.fill(i as u8);
                    Some(b)
                }
            });
        }
        let mut out: Vec<Completion> = Vec::with_capacity(depth);
        let (mut submitted, mut done) = (0u64, 0u64);
        let before = handle.stats().controller_ns;
        let start = Instant::now();
        while done < ios {
            while submitted < ios {
                let Some(slot) = free.pop() else { break };
                let lba = submitted % BLOCKS;
                match (op, slot) {
                    (Op::Write, Some(b)) => dev.submit_write(submitted, lba, b)?,
                    (Op::Read, Some(b)) => dev.submit_read(submitted, lba, b)?,
                    _ => dev.submit_flush(submitted)?,
                }
                submitted += 1;
            }
            dev.poll(&mut out)?;
            for c in out.drain(..) {
                c.result?;
                free.push(c.buffer);
                done += 1;
            }
        }
        let elapsed = start.elapsed();
        let st = handle.stats();
        dev.close()?;
        Ok(Measured {
            elapsed_ns: elapsed.as_nanos() as f64,
            controller_ns: (st.controller_ns - before) as f64,
            stats: st,
        })
    }

    struct Measured {
        elapsed_ns: f64,
        controller_ns: f64,
        stats: fake::FakeStats,
    }

    impl Measured {
        /// Per I/O, once the controller confirms it ran every command the loop saw complete.
        fn check(self, op: Op, ios: u64) -> Result<Figures, String> {
            let executed = match op {
                Op::Write => self.stats.writes,
                Op::Read => self.stats.reads,
                Op::Flush => self.stats.flushes,
            };
            if executed < ios {
                return Err(format!(
                    "the controller ran {executed} commands for {ios} completions"
                ));
            }
            Ok(Figures {
                total_ns: self.elapsed_ns / ios as f64,
                controller_ns: self.controller_ns / ios as f64,
            })
        }
    }

    pub fn main() {
        let ios: u64 = std::env::var("NVMQ_BENCH_IOS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(400_000);
        println!("NVMe driver against the software controller, one thread, {ios} I/Os per case");
        println!(
            "{:<12} {:>6} {:>12} {:>16} {:>12}",
            "op", "depth", "total ns/IO", "controller ns/IO", "driver ns/IO"
        );
        for op in [Op::Write, Op::Read, Op::Flush] {
            for depth in [1usize, 32, 128] {
                // A warm-up run (page faults of the arena and the namespace), then the measured one.
                let measured = run(op, depth, ios / 10).and_then(|_| run(op, depth, ios));
                match measured {
                    Ok(f) => println!(
                        "{:<12} {:>6} {:>12.0} {:>16.0} {:>12.0}",
                        op.name(),
                        depth,
                        f.total_ns,
                        f.controller_ns,
                        f.total_ns - f.controller_ns
                    ),
                    Err(e) => {
                        eprintln!("{} at depth {depth} failed: {e}", op.name());
                        std::process::exit(1);
                    }
                }
            }
        }
        println!(
            "target: driver <= 250 ns per I/O at depth 32. SPDK, for scale: 13.85M 512 B random \
             reads per second on one core, about 72 ns per I/O (spdk.io, 2021-05-06, \"80 Million \
             I/O Per Second\"); over 10M 4 KiB reads per second from one thread, about 100 ns \
             (SNIA SDC 2019, \"10 Million I/Ops From a Single Thread\")."
        );
    }
}
