//! The file backend survives a process crash: a child process appends and reports every ack on
//! its stdout, the parent SIGKILLs it at a seeded random moment, reopens the file (recovery) and
//! checks that every acknowledged record is there, bit-exact, at its offset. Several cycles on the
//! same file, each one recovering what the last kill left.
//!
//! Replay a run with `NVMQ_SEED=<seed>`; `NVMQ_CRASH_CYCLES` sets the number of cycles.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use blockdev::file::{FileDevice, FileOptions};
use blockdev::sim::Rng;
use nvmq_log::config::{FormatOptions, LogConfig};
use nvmq_log::Log;

const CHILD_ENV: &str = "NVMQ_CRASH_CHILD";
const PRODUCERS: usize = 8;
const PARTITIONS: u32 = 3;

fn payload(cycle: u64, producer: usize, i: u64) -> Vec<u8> {
    // Varied sizes, including records larger than a block.
    let len = 20 + ((cycle * 7919 + producer as u64 * 131 + i * 17) % 6000) as usize;
    let tag = format!("c{cycle} p{producer} i{i} ");
    tag.bytes().cycle().take(len).collect()
}

fn open_log(path: &Path) -> Log {
    let dev = FileDevice::open(path, FileOptions::default()).expect("open the file device");
    let (w, report) = recovery::open(dev, LogConfig::default()).expect("recover");
    eprintln!("recovered: {report}");
    Log::start(w, 4096)
}

/// The child: appends from several threads until it is killed, printing `ACK` lines.
#[test]
fn child_process_entry() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return; // Not a child run: nothing to do.
    };
    let (path, cycle) = spec.split_once('|').expect("child spec path|cycle");
    let cycle: u64 = cycle.parse().expect("cycle number");
    let log = Arc::new(open_log(Path::new(path)));
    let parts: Vec<u32> = (0..PARTITIONS)
        .map(|i| match log.partition_id("crash", i) {
            Some(id) => id,
            None => log.create_partition("crash", i).expect("create partition"),
        })
        .collect();
    println!("READY");
    let threads: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let log = log.clone();
            let part = parts[p % parts.len()];
            std::thread::spawn(move || {
                for i in 0.. {
                    let a = log.append_wait(part, payload(cycle, p, i)).expect("append");
                    // One line per ack, written whole: the parent's ledger.
                    println!("ACK {part} {} {p} {i}", a.offset);
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

struct Acked {
    cycle: u64,
    producer: usize,
    i: u64,
}

fn run_cycle(path: &Path, cycle: u64, kill_after: Duration) -> BTreeMap<(u32, u64), Acked> {
    let exe = std::env::current_exe().expect("test binary");
    let mut child = Command::new(exe)
        .args([
            "child_process_entry",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{}|{cycle}", path.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child");
    let stdout = child.stdout.take().expect("child stdout");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut acked = BTreeMap::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // libtest may have printed "test child_process_entry ... " on the same line.
            if line.ends_with("READY") {
                let _ = ready_tx.send(());
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            // A line cut by the kill is not an ack the child finished reporting.
            if f.len() == 5 && f[0] == "ACK" {
                if let (Ok(part), Ok(off), Ok(p), Ok(i)) =
                    (f[1].parse(), f[2].parse(), f[3].parse(), f[4].parse())
                {
                    acked.insert(
                        (part, off),
                        Acked {
                            cycle,
                            producer: p,
                            i,
                        },
                    );
                }
            }
        }
        acked
    });
    // The kill lands at a random moment of the appending, after recovery and setup.
    let ready = ready_rx.recv_timeout(Duration::from_secs(60)).is_ok();
    std::thread::sleep(kill_after);
    child.kill().expect("SIGKILL the child");
    let status = child.wait().expect("reap the child");
    let acked = reader.join().expect("reader thread");
    assert!(ready, "cycle {cycle}: the child never got ready ({status})");
    acked
}

#[test]
fn every_ack_survives_sigkill_of_the_appending_process() {
    let seed = std::env::var("NVMQ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    let cycles: u64 = std::env::var("NVMQ_CRASH_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    println!("file process crash: seed {seed} ({cycles} cycles); replay with NVMQ_SEED={seed}");
    let mut rng = Rng::new(seed);
    let dir = tempdir(seed);
    let path = dir.join("log.img");
    let fmt = FormatOptions::default();
    FileDevice::create(&path, 256 << 20, FileOptions::default(), |d| {
        nvmq_log::mkfs::format(d, &fmt)
            .map(|_| ())
            .map_err(|e| blockdev::DeviceError::Io {
                op: blockdev::Op::Write,
                lba: 0,
                detail: e.to_string(),
            })
    })
    .expect("create the file device");

    let mut ledger: BTreeMap<(u32, u64), Acked> = BTreeMap::new();
    for cycle in 0..cycles {
        let kill_after = Duration::from_millis(rng.range(5, 400));
        let acked = run_cycle(&path, cycle, kill_after);
        let n = acked.len();
        for (k, a) in acked {
            let old = ledger.insert(k, a);
            assert!(
                old.is_none(),
                "seed {seed} cycle {cycle}: partition {} offset {} acknowledged twice",
                k.0,
                k.1
            );
        }
        // Reopen in this process and check the whole ledger so far.
        let log = open_log(&path);
        let mut checked = 0;
        for (&(part, off), a) in &ledger {
            let recs = log.read(part, off, 1).unwrap_or_else(|e| {
                panic!("seed {seed} cycle {cycle}: acknowledged {part}/{off} unreadable: {e}")
            });
            let r = recs.first().unwrap_or_else(|| {
                panic!("seed {seed} cycle {cycle}: acknowledged {part}/{off} is gone")
            });
            assert_eq!(r.offset, off, "seed {seed}: served another offset");
            assert!(
                r.payload == payload(a.cycle, a.producer, a.i),
                "seed {seed} cycle {cycle}: {part}/{off} holds other bytes than acknowledged"
            );
            checked += 1;
        }
        println!(
            "cycle {cycle}: killed after {} ms, {n} new acks, {checked} acknowledged records verified",
            kill_after.as_millis()
        );
        assert!(
            n > 0,
            "seed {seed} cycle {cycle}: the child acknowledged nothing"
        );
        log.shutdown();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempdir(seed: u64) -> PathBuf {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let dir = base.join(format!("process-crash-{}-{seed}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
