//! `nvme-check --pci <addr> [--ns N] --destroy-data`: opens an NVMe namespace with nvmq's
//! userspace driver (the function must be bound to vfio-pci) and runs the driver checks and then
//! the device contract suite every backend passes (`blockdev::contract`, as `CHECK contract:<name>`)
//! against the real (or QEMU-emulated) controller, one line per check, then `NVME-CHECK PASS` or
//! `NVME-CHECK FAIL` (exit status 1). It overwrites data on the namespace.
#![forbid(unsafe_code)]

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
fn main() {
    std::process::exit(linux::run());
}

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
fn main() {
    eprintln!("nvme-check: the NVMe driver needs Linux (VFIO) on x86_64 or aarch64");
    std::process::exit(2);
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod linux {
    use std::time::Duration;

    use anyhow::{anyhow, bail, ensure, Context, Result};
    use blockdev::contract::{DeviceFactory, FakeNvmeFactory, NvmeFactory, CHECKS};
    use blockdev::nvme::fake::{self, FakeConfig};
    use blockdev::nvme::{Host, NvmeDevice, NvmeOptions};
    use blockdev::{BlockDevice, Completion, DeviceError, IoBuffer, Op, SyncIo};

    const USAGE: &str =
        "usage: nvme-check --pci <0000:00:04.0> [--ns <id>] [--hot-loop <I/Os>] --destroy-data | nvme-check --fake";

    struct Args {
        /// None: run against the software controller.
        pci: Option<String>,
        nsid: u32,
        /// Instead of the checks: this many I/Os in a steady loop (for `strace -c`).
        hot_loop: Option<u64>,
    }

    fn args() -> Result<Args> {
        let mut pci = None;
        let mut nsid = 1u32;
        let mut destroy = false;
        let mut hot_loop = None;
        let mut it = std::env::args().skip(1);
        while let Some(a) = it.next() {
            match a.as_str() {
                "--pci" => pci = Some(it.next().ok_or_else(|| anyhow!("--pci needs a value"))?),
                "--ns" => {
                    let v = it.next().ok_or_else(|| anyhow!("--ns needs a value"))?;
                    nsid = v.parse().with_context(|| format!("--ns {v:?}"))?;
                }
                "--destroy-data" => destroy = true,
                "--hot-loop" => {
                    let v = it
                        .next()
                        .ok_or_else(|| anyhow!("--hot-loop needs a value"))?;
                    hot_loop = Some(v.parse().with_context(|| format!("--hot-loop {v:?}"))?);
                }
                "--fake" => {
                    return Ok(Args {
                        pci: None,
                        nsid: 1,
                        hot_loop: None,
                    });
                }
                "-h" | "--help" => bail!("{USAGE}"),
                other => bail!("unknown argument {other:?}; {USAGE}"),
            }
        }
        ensure!(
            destroy,
            "nvme-check overwrites data on the namespace; pass --destroy-data to confirm. {USAGE}"
        );
        let pci = pci.ok_or_else(|| anyhow!("{USAGE}"))?;
        Ok(Args {
            pci: Some(pci),
            nsid,
            hot_loop,
        })
    }

    pub fn run() -> i32 {
        let a = match args() {
            Ok(a) => a,
            Err(e) => {
                eprintln!("nvme-check: {e}");
                return 2;
            }
        };
        let Some(pci) = a.pci else {
            // The same checks against the software controller, configured like QEMU's NVMe
            // (MDTS 7, 4 KiB blocks, 2048-entry queues), to test this program without hardware.
            let cfg = FakeConfig {
                mdts: 7,
                blocks: 32768,
                ..FakeConfig::default()
            };
            let (host, _handle) = fake::controller(cfg.clone());
            let failed = match NvmeDevice::with_host(host, 1, NvmeOptions::default()) {
                Ok(dev) => checks(dev, "software controller"),
                Err(e) => return fail_open(&e),
            };
            let failed = failed + contract(&mut FakeNvmeFactory::new(cfg, NvmeOptions::default()));
            return verdict(failed);
        };
        if let Some(ios) = a.hot_loop {
            return match NvmeDevice::open(&pci, a.nsid, NvmeOptions::default())
                .map_err(anyhow::Error::from)
                .and_then(|mut dev| hot_loop(&mut dev, ios).map(|r| (r, dev)))
                .and_then(|(r, dev)| dev.close().map(|()| r).map_err(Into::into))
            {
                Ok(r) => {
                    println!("HOT-LOOP PASS: {r}");
                    0
                }
                Err(e) => {
                    println!("HOT-LOOP FAIL: {e:#}");
                    1
                }
            };
        }
        let (nn, mut failed) = match NvmeDevice::open(&pci, a.nsid, NvmeOptions::default()) {
            Ok(dev) => {
                let nn = dev.details().controller.nn;
                (nn, checks(dev, &format!("{pci} ns {}", a.nsid)))
            }
            Err(e) => return fail_open(&e),
        };
        failed += contract(&mut NvmeFactory {
            pci: pci.clone(),
            nsid: a.nsid,
            options: NvmeOptions::default(),
        });
        match bad_namespaces(&pci, a.nsid, nn) {
            Ok(detail) => println!("CHECK bad-namespace PASS: {detail}"),
            Err(e) => {
                println!("CHECK bad-namespace FAIL: {e:#}");
                failed += 1;
            }
        }
        verdict(failed)
    }

    /// The last line, and the exit status: 0 when every check passed.
    fn verdict(failed: usize) -> i32 {
        if failed == 0 {
            println!("NVME-CHECK PASS");
            0
        } else {
            println!("NVME-CHECK FAIL ({failed} checks failed)");
            1
        }
    }

    /// The device contract suite every backend passes (`blockdev::contract`), one line per check
    /// as `CHECK contract:<name>`; returns how many failed. It opens, reopens and closes the
    /// device itself.
    fn contract<F: DeviceFactory>(factory: &mut F) -> usize {
        let results = blockdev::contract::run_all(factory);
        for r in &results {
            println!("CHECK contract:{r}");
        }
        let failed = results.iter().filter(|r| !r.passed()).count();
        // A check that did not run is a failure too (run_all stops early when it cannot open).
        failed + CHECKS.len().saturating_sub(results.len())
    }

    /// Opening a namespace the controller lacks fails with the open error naming it, and leaves
    /// the controller fit for the next open.
    fn bad_namespaces(pci: &str, nsid: u32, nn: u32) -> Result<String> {
        let mut seen = Vec::new();
        for (bad, want) in [(nn + 1, "does not exist"), (0, "does not exist")]
            .into_iter()
            .chain((nn > 1).then_some((if nsid == 2 { 1 } else { 2 }, "is not active")))
        {
            match NvmeDevice::open(pci, bad, NvmeOptions::default()) {
                Ok(_) => bail!("namespace {bad} opened (the controller has {nn})"),
                Err(e) => {
                    let msg = e.to_string();
                    ensure!(
                        matches!(e, DeviceError::Open { .. })
                            && msg.contains(&format!("namespace {bad} {want}")),
                        "namespace {bad}: {msg}"
                    );
                    seen.push(format!("ns {bad}: \"{msg}\""));
                }
            }
        }
        let dev = NvmeDevice::open(pci, nsid, NvmeOptions::default())
            .context("reopening the good namespace afterwards")?;
        dev.close().context("closing it")?;
        Ok(format!("{}; ns {nsid} opens afterwards", seen.join("; ")))
    }

    fn fail_open(e: &DeviceError) -> i32 {
        println!("CHECK open FAIL: {e}");
        println!("NVME-CHECK FAIL");
        1
    }

    /// The driver's own checks, one line each; returns how many failed. Closes the device.
    fn checks<H: Host>(mut dev: NvmeDevice<H>, what: &str) -> usize {
        println!("CHECK open PASS: {what}");
        let mut failed = 0;
        let mut check =
            |name: &str, dev: &mut NvmeDevice<H>, f: fn(&mut NvmeDevice<H>) -> Result<String>| {
                match f(dev) {
                    Ok(detail) => println!("CHECK {name} PASS: {detail}"),
                    Err(e) => {
                        println!("CHECK {name} FAIL: {e:#}");
                        failed += 1;
                    }
                }
            };
        check("identify", &mut dev, identify);
        check("smart", &mut dev, smart);
        check("patterns-across-lbas", &mut dev, patterns_across_lbas);
        check("prp-lists", &mut dev, prp_lists);
        check("mdts-split", &mut dev, mdts_split);
        check("queue-wrap", &mut dev, queue_wrap);
        check("out-of-range", &mut dev, out_of_range);
        match dev.close() {
            Ok(()) => println!("CHECK shutdown PASS: CC.SHN normal shutdown completed"),
            Err(e) => {
                println!("CHECK shutdown FAIL: {e}");
                failed += 1;
            }
        }
        failed
    }

    /// `ios` writes of one block, the queue kept full, with a Flush after every `depth` writes (one
    /// at a time),
    /// after a warm-up of the same shape: the steady state `strace -c` looks at. Everything it
    /// needs is allocated before the loop, so a second run with more I/Os differs from the first
    /// in system calls only if the driver makes some per I/O.
    fn hot_loop<H: Host>(dev: &mut NvmeDevice<H>, ios: u64) -> Result<String> {
        let bs = dev.info().logical_block_size as usize;
        let depth = dev.queue_depth() - 1;
        let span = blocks(dev).min(1 << 16);
        let mut free: Vec<IoBuffer> = (0..depth)
            .map(|_| dev.alloc_buffer(bs))
            .collect::<Result<_, _>>()?;
        let mut out = Vec::with_capacity(depth + 1);
        let mut run = |dev: &mut NvmeDevice<H>, n: u64| -> Result<(u64, u64)> {
            let (mut next, mut done, mut flushes) = (0u64, 0u64, 0u64);
            let mut flushing = false;
            while done < n {
                while next < n {
                    let Some(b) = free.pop() else { break };
                    dev.submit_write(next, next % span, b)?;
                    next += 1;
                    if next.is_multiple_of(depth as u64) && !flushing {
                        dev.submit_flush(u64::MAX)?;
                        flushing = true;
                        flushes += 1;
                    }
                }
                wait_some(dev, &mut out)?;
                for c in out.drain(..) {
                    c.result.with_context(|| format!("I/O {}", c.tag))?;
                    match c.buffer {
                        Some(b) => {
                            free.push(b);
                            done += 1;
                        }
                        None => flushing = false,
                    }
                }
            }
            while dev.in_flight() > 0 {
                out.clear();
                dev.wait(&mut out, Duration::from_secs(10))?;
                for c in out.drain(..) {
                    c.result.with_context(|| format!("I/O {}", c.tag))?;
                }
            }
            Ok((n, flushes))
        };
        run(dev, 4 * depth as u64)?;
        let t = std::time::Instant::now();
        let (writes, flushes) = run(dev, ios)?;
        Ok(format!(
            "{writes} writes of {bs} B and {flushes} flushes, {depth} in flight, in {:.1?}",
            t.elapsed()
        ))
    }

    fn pattern(seed: u64, k: usize) -> u8 {
        (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (k % 8 * 8)) as u8 ^ (k / 8) as u8
    }

    fn fill(b: &mut IoBuffer, seed: u64) {
        for (k, x) in b.iter_mut().enumerate() {
            *x = pattern(seed, k);
        }
    }

    fn verify(b: &[u8], seed: u64, what: &str) -> Result<()> {
        match b.iter().enumerate().find(|&(k, &x)| x != pattern(seed, k)) {
            None => Ok(()),
            Some((k, &x)) => bail!(
                "{what}: byte {k} reads {x:#04x}, wrote {:#04x}",
                pattern(seed, k)
            ),
        }
    }

    /// Replaces `out` with the next completions; at least one within 10 s.
    fn wait_some<H: Host>(dev: &mut NvmeDevice<H>, out: &mut Vec<Completion>) -> Result<()> {
        out.clear();
        if dev.wait(out, Duration::from_secs(10))? == 0 {
            bail!("timed out with {} in flight", dev.in_flight());
        }
        Ok(())
    }

    fn wait_all<H: Host>(dev: &mut NvmeDevice<H>, n: usize) -> Result<Vec<Completion>> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            if dev.wait(&mut out, Duration::from_secs(10))? == 0 && out.len() < n {
                bail!("timed out: {} of {n} completions after 10 s", out.len());
            }
        }
        Ok(out)
    }

    /// Writes `len` bytes of pattern `seed` at `lba`, reads them back and compares.
    fn round_trip<H: Host>(dev: &mut NvmeDevice<H>, lba: u64, len: usize, seed: u64) -> Result<()> {
        let mut b = dev.alloc_buffer(len)?;
        fill(&mut b, seed);
        let b = blockdev::write_sync(dev, lba, b).with_context(|| format!("write at {lba}"))?;
        drop(b);
        let r = dev.alloc_buffer(len)?;
        let r = blockdev::read_sync(dev, lba, r).with_context(|| format!("read at {lba}"))?;
        verify(&r, seed, &format!("{len} bytes at block {lba}"))
    }

    fn blocks<H: Host>(dev: &NvmeDevice<H>) -> u64 {
        dev.info().capacity / u64::from(dev.info().logical_block_size)
    }

    /// The SMART / Health log page was read at open and shows in the device's health line.
    fn smart<H: Host>(dev: &mut NvmeDevice<H>) -> Result<String> {
        let s = dev
            .details()
            .smart
            .clone()
            .map_err(|e| anyhow!("SMART log not read: {e}"))?;
        ensure!(
            dev.info().health == s.summary(),
            "health line {:?} is not the SMART summary",
            dev.info().health
        );
        Ok(s.summary())
    }

    fn identify<H: Host>(dev: &mut NvmeDevice<H>) -> Result<String> {
        let d = dev.details().clone();
        let i = dev.info().clone();
        ensure!(
            i.logical_block_size.is_power_of_two() && i.logical_block_size >= 512,
            "block size {}",
            i.logical_block_size
        );
        ensure!(i.capacity > 0, "empty namespace");
        Ok(format!(
            "NVMe {}.{} vendor {:#06x} model {:?} serial {:?} fw {:?}; ns {} {} blocks of {} B; \
             MDTS {}; {} B per command; VWC present {} enabled {}; atomic unit {} B; queue {} entries, depth {}",
            d.version >> 16,
            d.version >> 8 & 0xFF,
            d.controller.vendor,
            d.controller.model,
            d.controller.serial,
            d.controller.firmware,
            d.nsid,
            blocks(dev),
            d.lba_size,
            d.mdts_bytes.map_or("none".to_string(), |b| format!("{b} B")),
            d.command_bytes,
            i.volatile_write_cache,
            d.write_cache_enabled,
            i.atomic_write_unit,
            d.queue_entries,
            dev.queue_depth()
        ))
    }

    fn patterns_across_lbas<H: Host>(dev: &mut NvmeDevice<H>) -> Result<String> {
        let n = blocks(dev);
        let bs = dev.info().logical_block_size as usize;
        // The first and last blocks and 254 spread between, written in one batch.
        let lbas: Vec<u64> = (0..256u64)
            .map(|i| if i == 255 { n - 1 } else { i * (n / 256) })
            .collect();
        let depth = dev.queue_depth();
        let mut checked = 0;
        for chunk in lbas.chunks(depth) {
            for &lba in chunk {
                let mut b = dev.alloc_buffer(bs)?;
                fill(&mut b, lba);
                dev.submit_write(lba, lba, b)?;
            }
            for c in wait_all(dev, chunk.len())? {
                c.result.with_context(|| format!("write at {}", c.lba))?;
            }
            for &lba in chunk {
                let b = dev.alloc_buffer(bs)?;
                dev.submit_read(lba, lba, b)?;
            }
            for c in wait_all(dev, chunk.len())? {
                c.result.with_context(|| format!("read at {}", c.lba))?;
                let b = c
                    .buffer
                    .ok_or_else(|| anyhow!("read at {} returned no buffer", c.lba))?;
                verify(&b, c.lba, &format!("block {}", c.lba))?;
                checked += 1;
            }
        }
        Ok(format!(
            "{checked} blocks from 0 to {} written and verified",
            n - 1
        ))
    }

    fn prp_lists<H: Host>(dev: &mut NvmeDevice<H>) -> Result<String> {
        let bs = u64::from(dev.info().logical_block_size);
        let page = dev.details().page_size;
        let max = dev
            .details()
            .command_bytes
            .min(dev.info().max_transfer as usize);
        let mut sizes = vec![page, 2 * page, 3 * page, 16 * page + bs as usize, max];
        sizes.retain(|&s| s <= max);
        let mut lba = 1024u64.min(blocks(dev) / 2);
        for (i, &len) in sizes.iter().enumerate() {
            round_trip(dev, lba, len, 1000 + i as u64)?;
            lba += len as u64 / bs + 3;
        }
        Ok(format!(
            "transfers of {sizes:?} bytes (PRP1 only, PRP2, PRP lists) verified"
        ))
    }

    fn mdts_split<H: Host>(dev: &mut NvmeDevice<H>) -> Result<String> {
        let max = dev.info().max_transfer as usize;
        let per = dev.details().command_bytes;
        let lba = blocks(dev) / 3;
        round_trip(dev, lba, max, 77)?;
        // Unaligned in blocks too: a length that leaves a partial last command.
        let bs = dev.info().logical_block_size as usize;
        let odd = (max - bs).max(bs);
        round_trip(dev, lba + 3, odd, 78)?;
        Ok(if max > per {
            format!(
                "{max} bytes = {} commands of up to {per} bytes, completed once, verified",
                max.div_ceil(per)
            )
        } else {
            format!("{max} bytes fit one command ({per} bytes allowed): splitting not exercised on this controller")
        })
    }

    fn queue_wrap<H: Host>(dev: &mut NvmeDevice<H>) -> Result<String> {
        let bs = dev.info().logical_block_size as usize;
        let total = 3 * usize::from(dev.details().queue_entries) + 7;
        let depth = dev.queue_depth();
        let base = blocks(dev) / 2;
        let span = (blocks(dev) / 4).max(1);
        let mut free: Vec<IoBuffer> = (0..depth)
            .map(|_| dev.alloc_buffer(bs))
            .collect::<Result<_, _>>()?;
        let (mut next, mut done) = (0usize, 0usize);
        let mut out = Vec::with_capacity(depth);
        while done < total {
            while next < total {
                let Some(mut b) = free.pop() else { break };
                fill(&mut b, next as u64);
                dev.submit_write(next as u64, base + next as u64 % span, b)?;
                next += 1;
            }
            wait_some(dev, &mut out)?;
            for c in out.drain(..) {
                c.result.with_context(|| format!("write {}", c.tag))?;
                free.push(
                    c.buffer
                        .ok_or_else(|| anyhow!("write {} returned no buffer", c.tag))?,
                );
                done += 1;
            }
        }
        // Each block holds the last write to it (block base + i for i < min(total, span)).
        let last = |i: usize| (0..total).rev().find(|t| (*t as u64 % span) as usize == i);
        for i in 0..(total as u64).min(span) as usize {
            let Some(t) = last(i) else { continue };
            let r = dev.read_at((base + i as u64) * bs as u64, bs)?;
            verify(&r, t as u64, &format!("block {}", base + i as u64))?;
        }
        Ok(format!(
            "{total} writes through {} queue entries (over 2x, phase flips), depth {depth}, verified",
            dev.details().queue_entries
        ))
    }

    fn out_of_range<H: Host>(dev: &mut NvmeDevice<H>) -> Result<String> {
        let n = blocks(dev);
        let bs = dev.info().logical_block_size as usize;
        let b = dev.alloc_buffer(bs)?;
        match dev.submit_write(1, n, b) {
            Err(DeviceError::OutOfRange { op: Op::Write, .. }) => {}
            other => bail!("a write at block {n} (the capacity) gave {other:?}"),
        }
        let b = dev.alloc_buffer(2 * bs)?;
        match dev.submit_read(2, n - 1, b) {
            Err(DeviceError::OutOfRange { op: Op::Read, .. }) => {}
            other => bail!("a read straddling the end gave {other:?}"),
        }
        ensure!(dev.in_flight() == 0, "a refused I/O is in flight");
        // The controller's own answer: a read straddling the end goes out unchecked and must
        // come back as LBA Out of Range (SCT 0 / SC 0x80) naming the block, with the queue usable.
        let b = dev.alloc_buffer(2 * bs)?;
        dev.submit_read_unchecked(3, n - 1, b)?;
        let c = wait_all(dev, 1)?;
        let controller = match &c[0].result {
            Err(
                e @ DeviceError::Nvme {
                    op: Op::Read,
                    sct: 0,
                    sc: 0x80,
                    lba,
                    ..
                },
            ) if *lba == n - 1 => e.to_string(),
            other => bail!(
                "a read of blocks {}..={n} sent to the controller gave {other:?}",
                n - 1
            ),
        };
        ensure!(c[0].buffer.is_some(), "the failed read kept its buffer");
        // The device still works afterwards.
        round_trip(dev, n - 1, bs, 99)?;
        Ok(format!(
            "I/O at and across the end refused with OutOfRange before submission; sent anyway, the \
             controller answered \"{controller}\"; the last block still works"
        ))
    }
}
