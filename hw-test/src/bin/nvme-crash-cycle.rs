//! `nvme-crash-cycle --pci <addr> [--ns N] [--cycles 5] [--seed S] --destroy-data`: the storage
//! core on the NVMe backend, killed for real. The parent formats the namespace, then each cycle
//! starts a child process that reopens the log (recovery), checks every record acknowledged so far
//! is there bit-exact, and appends from several producers, reporting each ack on its stdout; the
//! parent writes those acks to a ledger (in memory and in a file, never on the NVMe) and SIGKILLs
//! the child at a seeded random moment. A last child only reopens and verifies. Prints one `CYCLE`
//! line per cycle and `NVME-CRASH-CYCLE PASS`, or `NVME-CRASH-CYCLE FAIL` (exit status 1) with
//! the seed that replays the run.
//!
//! The controller is left enabled, with I/O queues and commands in flight, by every killed child;
//! the next one must reset it. Killing a process loses nothing QEMU already wrote, so this tests
//! process crashes, recovery and controller reset, not power cuts.
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
    eprintln!("nvme-crash-cycle: the NVMe driver needs Linux (VFIO) on x86_64 or aarch64");
    std::process::exit(2);
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod linux {
    use std::collections::BTreeMap;
    use std::io::{BufRead, BufReader, Write};
    use std::path::{Path, PathBuf};
    use std::process::{Child, ChildStdout, Command, Stdio};
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::thread;
    use std::time::{Duration, Instant};

    use anyhow::{anyhow, bail, ensure, Context, Result};
    use blockdev::nvme::{NvmeDevice, NvmeOptions};
    use nvmq_log::{FormatOptions, Log, LogConfig};

    const USAGE: &str = "usage: nvme-crash-cycle --pci <0000:00:04.0> [--ns <id>] [--cycles <n>] \
                         [--seed <n>] [--max-kill-ms <ms>] --destroy-data";
    const TOPIC: &str = "crash-cycle";
    const PRODUCERS: u32 = 4;
    /// Largest payload; sizes vary from 1 byte up to it.
    const MAX_PAYLOAD: u64 = 3000;

    #[derive(Clone)]
    struct Args {
        pci: String,
        nsid: u32,
        cycles: u32,
        seed: u64,
        max_kill_ms: u64,
        /// Child modes: `--child <cycle>` (0 = verify only) with the ledger file and a byte cap.
        child: Option<u32>,
        ledger: Option<PathBuf>,
        max_bytes: u64,
    }

    fn parse_args() -> Result<Args> {
        let mut a = Args {
            pci: String::new(),
            nsid: 1,
            cycles: 5,
            seed: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1),
            max_kill_ms: 1500,
            child: None,
            ledger: None,
            max_bytes: u64::MAX,
        };
        let mut destroy = false;
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            let mut value = |name: &str| it.next().ok_or_else(|| anyhow!("{name} needs a value"));
            let num = |name: &str, v: String| {
                v.parse::<u64>()
                    .with_context(|| format!("{name} {v:?} is not a number"))
            };
            match arg.as_str() {
                "--pci" => a.pci = value("--pci")?,
                "--ns" => a.nsid = num("--ns", value("--ns")?)? as u32,
                "--cycles" => a.cycles = num("--cycles", value("--cycles")?)? as u32,
                "--seed" => a.seed = num("--seed", value("--seed")?)?,
                "--max-kill-ms" => a.max_kill_ms = num("--max-kill-ms", value("--max-kill-ms")?)?,
                "--child" => a.child = Some(num("--child", value("--child")?)? as u32),
                "--ledger" => a.ledger = Some(PathBuf::from(value("--ledger")?)),
                "--max-bytes" => a.max_bytes = num("--max-bytes", value("--max-bytes")?)?,
                "--destroy-data" => destroy = true,
                "-h" | "--help" => bail!("{USAGE}"),
                other => bail!("unknown argument {other:?}; {USAGE}"),
            }
        }
        ensure!(!a.pci.is_empty(), "--pci is required; {USAGE}");
        ensure!(
            destroy,
            "nvme-crash-cycle formats the namespace; pass --destroy-data to confirm. {USAGE}"
        );
        ensure!(a.cycles > 0, "--cycles must be at least 1");
        Ok(a)
    }

    pub fn run() -> i32 {
        let a = match parse_args() {
            Ok(a) => a,
            Err(e) => {
                eprintln!("nvme-crash-cycle: {e:#}");
                return 2;
            }
        };
        if let Some(cycle) = a.child {
            return match child(&a, cycle) {
                Ok(()) => 0,
                Err(e) => {
                    println!("CHILD-FAIL {e:#}");
                    1
                }
            };
        }
        println!("seed {} (replay with --seed {})", a.seed, a.seed);
        match parent(&a) {
            Ok(()) => {
                println!("NVME-CRASH-CYCLE PASS");
                0
            }
            Err(e) => {
                println!("NVME-CRASH-CYCLE FAIL: {e:#} (seed {})", a.seed);
                1
            }
        }
    }

    /// splitmix64: the payloads and kill times come from it, so a seed replays them.
    fn mix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// What one acknowledged append was: enough to rebuild its payload.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Acked {
        offset: u64,
        cycle: u32,
        producer: u32,
        seq: u64,
    }

    fn payload(seed: u64, cycle: u32, producer: u32, seq: u64) -> Vec<u8> {
        let key = mix(seed ^ mix(u64::from(cycle) << 40 ^ u64::from(producer) << 32 ^ seq));
        let len = 1 + (key % MAX_PAYLOAD) as usize;
        let mut out = Vec::with_capacity(len);
        let mut z = key;
        while out.len() < len {
            z = mix(z);
            out.extend_from_slice(&z.to_le_bytes()[..8.min(len - out.len())]);
        }
        out
    }

    fn ack_line(a: &Acked) -> String {
        format!("ACK {} {} {} {}", a.offset, a.cycle, a.producer, a.seq)
    }

    fn parse_ack(line: &str) -> Option<Acked> {
        let mut f = line.strip_prefix("ACK ")?.split(' ');
        let mut next = || f.next()?.parse::<u64>().ok();
        Some(Acked {
            offset: next()?,
            cycle: next()? as u32,
            producer: next()? as u32,
            seq: next()?,
        })
    }

    fn open_device(a: &Args) -> Result<NvmeDevice> {
        NvmeDevice::open(&a.pci, a.nsid, NvmeOptions::default())
            .with_context(|| format!("opening NVMe {} namespace {}", a.pci, a.nsid))
    }

    fn parent(a: &Args) -> Result<()> {
        let started = Instant::now();
        let mut dev = open_device(a)?;
        let sb = nvmq_log::mkfs::format(&mut dev, &FormatOptions::default())
            .context("formatting the namespace")?;
        dev.close().context("closing after format")?;
        // Every cycle gets an equal share of the ring, so nothing acknowledged is ever dropped
        // to make room and every ack stays checkable.
        let max_bytes = sb.log_size / (u64::from(a.cycles) + 2);
        println!(
            "formatted: log of {} B; up to {max_bytes} B of payload per cycle",
            sb.log_size
        );
        let ledger_path = std::env::temp_dir().join(format!("nvme-crash-ledger-{}", a.seed));
        let mut ledger: Vec<Acked> = Vec::new();
        let mut offsets = std::collections::BTreeSet::new();
        std::fs::write(&ledger_path, "").with_context(|| format!("{}", ledger_path.display()))?;
        for cycle in 1..=a.cycles {
            let kill_after =
                Duration::from_millis(mix(a.seed ^ u64::from(cycle)) % (a.max_kill_ms + 1));
            let t = Instant::now();
            let mut c = spawn(a, cycle, &ledger_path, max_bytes)?;
            let mut lines = wait_for(&mut c, "READY")?;
            let ready = lines.pop().unwrap_or_default();
            // The kill clock starts at the first ack, so every cycle kills a writer at work.
            lines.extend(wait_for(&mut c, "ACK ")?);
            thread::sleep(kill_after);
            c.child.kill().context("SIGKILL to the child")?;
            let status = c.child.wait().context("waiting for the killed child")?;
            let mut acks = 0u64;
            let mut done = false;
            let mut rest = Vec::new();
            for line in lines.into_iter().chain(c.lines.iter()) {
                if let Some(ack) = parse_ack(&line) {
                    ensure!(
                        ack.cycle == cycle,
                        "cycle {cycle}'s child reported an ack of cycle {}",
                        ack.cycle
                    );
                    // An offset handed out twice means recovery let the log reuse acked space.
                    ensure!(
                        offsets.insert(ack.offset),
                        "offset {} acknowledged twice, the second time as {ack:?}",
                        ack.offset
                    );
                    ledger.push(ack);
                    acks += 1;
                } else if line == "APPEND-DONE" {
                    done = true;
                } else {
                    rest.push(line);
                }
            }
            ensure!(
                !rest.iter().any(|l| l.starts_with("CHILD-FAIL")),
                "cycle {cycle}: {rest:?}"
            );
            let text: String = ledger.iter().map(|x| ack_line(x) + "\n").collect();
            std::fs::write(&ledger_path, text)
                .with_context(|| format!("writing the ledger {}", ledger_path.display()))?;
            println!(
                "CYCLE {cycle} PASS: {ready}; then {acks} acks, SIGKILL {kill_after:?} after the first ack {} ({status}); {:.1?}",
                if done { "(append cap reached before the kill)" } else { "mid-append" },
                t.elapsed()
            );
        }
        let t = Instant::now();
        let mut c = spawn(a, 0, &ledger_path, 0)?;
        let status = c.child.wait().context("waiting for the verifier")?;
        let out: Vec<String> = c.lines.iter().collect();
        let verified = out.iter().find(|l| l.starts_with("VERIFIED"));
        ensure!(
            status.success() && verified.is_some(),
            "the last reopen failed ({status}): {out:?}"
        );
        println!(
            "FINAL PASS: {}; {:.1?}",
            verified.map_or("", |s| s.as_str()),
            t.elapsed()
        );
        println!(
            "{} cycles, {} acknowledged records verified bit-exact after every kill, {:.1?} in all",
            a.cycles,
            ledger.len(),
            started.elapsed()
        );
        Ok(())
    }

    struct Running {
        child: Child,
        lines: mpsc::Receiver<String>,
    }

    fn spawn(a: &Args, cycle: u32, ledger: &Path, max_bytes: u64) -> Result<Running> {
        let exe = std::env::current_exe().context("finding my own executable")?;
        let mut child = Command::new(exe)
            .args(["--pci", &a.pci, "--ns", &a.nsid.to_string()])
            .args(["--seed", &a.seed.to_string(), "--child", &cycle.to_string()])
            .arg("--ledger")
            .arg(ledger)
            .args(["--max-bytes", &max_bytes.to_string(), "--destroy-data"])
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .context("starting a child")?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("the child has no stdout pipe"))?;
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || forward_lines(stdout, tx));
        Ok(Running { child, lines: rx })
    }

    /// Forwards complete lines only: a line cut short by the kill was never a whole report.
    fn forward_lines(stdout: ChildStdout, tx: mpsc::Sender<String>) {
        let mut r = BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if let Some(l) = line.strip_suffix('\n') {
                        if tx.send(l.to_string()).is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Collects the child's lines up to and including the first that starts with `prefix`.
    fn wait_for(c: &mut Running, prefix: &str) -> Result<Vec<String>> {
        let mut lines = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match c.lines.recv_timeout(left) {
                Ok(l) => {
                    let found = l.starts_with(prefix);
                    lines.push(l);
                    if found {
                        return Ok(lines);
                    }
                }
                Err(_) => {
                    let _ = c.child.kill();
                    let status = c.child.wait().ok();
                    bail!("no {prefix:?} line from the child (exit {status:?}); its output: {lines:?}");
                }
            }
        }
    }

    fn read_ledger(path: &Path) -> Result<Vec<Acked>> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the ledger {}", path.display()))?;
        text.lines()
            .map(|l| parse_ack(l).ok_or_else(|| anyhow!("ledger line {l:?} is malformed")))
            .collect()
    }

    /// Reopens the log; checks every ledger entry reads back bit-exact; with `cycle > 0` then
    /// appends until killed or `max_bytes` of payload were acknowledged.
    fn child(a: &Args, cycle: u32) -> Result<()> {
        let ledger_path = a
            .ledger
            .as_ref()
            .ok_or_else(|| anyhow!("--child needs --ledger"))?;
        let ledger = read_ledger(ledger_path)?;
        let t = Instant::now();
        let dev = open_device(a)?;
        let cfg = LogConfig::default();
        let (writer, report) = recovery::open(dev, cfg.clone()).context("recovery::open")?;
        let log = Arc::new(Log::start(writer, cfg.queue_capacity));
        let reopen = t.elapsed();
        let part = match log.partition_id(TOPIC, 0) {
            Some(p) => p,
            None if ledger.is_empty() => log
                .create_partition(TOPIC, 0)
                .context("creating the partition")?,
            None => bail!(
                "partition {TOPIC}/0 is gone after recovery ({} records were acknowledged)",
                ledger.len()
            ),
        };
        let n = verify(&log, part, a.seed, &ledger)?;
        let summary = format!(
            "reopened in {reopen:.1?} ({} batches, {} records scanned, cut at {}: {}), {n} acked records verified bit-exact",
            report.batches, report.records, report.cut_at, report.stop
        );
        if cycle == 0 {
            println!("VERIFIED {summary}");
            Arc::try_unwrap(log)
                .map_err(|_| anyhow!("the log is still shared"))?
                .shutdown();
            return Ok(());
        }
        println!("READY {summary}");
        std::io::stdout().flush().context("stdout")?;
        append_until_killed(&log, part, a.seed, cycle, a.max_bytes)
    }

    fn verify(log: &Log, part: u32, seed: u64, ledger: &[Acked]) -> Result<usize> {
        let Some(end) = ledger.iter().map(|x| x.offset + 1).max() else {
            return Ok(0);
        };
        let mut got: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut at = 0u64;
        while at < end {
            let recs = log
                .read(part, at, 256 << 10)
                .with_context(|| format!("reading partition {part} at offset {at}"))?;
            let Some(last) = recs.last() else {
                bail!(
                    "the log ends at offset {at}, but offsets up to {} were acknowledged",
                    end - 1
                );
            };
            at = last.offset + u64::from(last.span);
            got.extend(recs.into_iter().map(|r| (r.offset, r.payload.to_vec())));
        }
        for x in ledger {
            let want = payload(seed, x.cycle, x.producer, x.seq);
            match got.get(&x.offset) {
                None => bail!("acknowledged offset {} ({x:?}) is missing", x.offset),
                Some(p) if *p != want => bail!(
                    "acknowledged offset {} ({x:?}) reads back {} bytes that differ from the {} appended",
                    x.offset,
                    p.len(),
                    want.len()
                ),
                Some(_) => {}
            }
        }
        Ok(ledger.len())
    }

    /// Closed-loop producers; the main thread prints each ack as one line (the parent's ledger
    /// source). Returns only when the byte cap is reached or something fails.
    fn append_until_killed(
        log: &Arc<Log>,
        part: u32,
        seed: u64,
        cycle: u32,
        max_bytes: u64,
    ) -> Result<()> {
        let (tx, rx) = mpsc::channel::<Result<(Acked, usize), String>>();
        let share = max_bytes / u64::from(PRODUCERS);
        for producer in 0..PRODUCERS {
            let log = log.clone();
            let tx = tx.clone();
            thread::spawn(move || {
                let mut bytes = 0u64;
                let mut seq = 0u64;
                loop {
                    let p = payload(seed, cycle, producer, seq);
                    if bytes + p.len() as u64 > share {
                        return;
                    }
                    let len = p.len();
                    let r = log
                        .append_wait(part, p)
                        .map(|ap| {
                            let a = Acked {
                                offset: ap.offset,
                                cycle,
                                producer,
                                seq,
                            };
                            (a, len)
                        })
                        .map_err(|e| format!("producer {producer} append {seq}: {e}"));
                    let failed = r.is_err();
                    if tx.send(r).is_err() || failed {
                        return;
                    }
                    bytes += len as u64;
                    seq += 1;
                }
            });
        }
        drop(tx);
        let stdout = std::io::stdout();
        for r in rx {
            let (a, _) = r.map_err(|e| anyhow!(e))?;
            let mut out = stdout.lock();
            writeln!(out, "{}", ack_line(&a)).context("stdout")?;
            out.flush().context("stdout")?;
        }
        println!("APPEND-DONE");
        std::io::stdout().flush().context("stdout")?;
        // Stay alive holding the controller, so the kill still finds it enabled.
        loop {
            thread::sleep(Duration::from_secs(1));
        }
    }
}
