//! Running the built `nvmq` binary as a user would, and building logs for it to look at.
#![allow(dead_code)] // Each test file uses its own share of these helpers.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use blockdev::file::{FileDevice, FileOptions};
use nvmq_log::{Log, LogConfig};

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

pub fn nvmq(args: &[&str]) -> Run {
    let out: Output = Command::new(env!("CARGO_BIN_EXE_nvmq"))
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("NVMQ_LOG")
        .output()
        .expect("the nvmq binary runs");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A fresh directory for one test.
pub fn temp_dir(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// `file:<path>` for a path.
pub fn spec(p: &Path) -> String {
    format!("file:{}", p.display())
}

/// Formats a new 32 MiB device file with the binary.
pub fn formatted(dir: &Path) -> PathBuf {
    let p = dir.join("log.img");
    let r = nvmq(&["format", "--device", &spec(&p), "--size", "32M"]);
    assert_eq!(r.code, 0, "{r}");
    p
}

/// Opens the log through recovery, creates `orders/0` and appends `n` records one at a time
/// (each its own batch), then shuts down cleanly.
pub fn append_records(p: &Path, n: usize) {
    let dev = FileDevice::open(p, FileOptions::default()).expect("open the device file");
    let (w, _) = recovery::open(dev, LogConfig::default()).expect("recovery opens it");
    let log = Log::start(w, 64);
    let part = match log.partition_id("orders", 0) {
        Some(id) => id,
        None => log
            .create_partition("orders", 0)
            .expect("create a partition"),
    };
    for i in 0..n {
        log.append_wait(part, format!("record number {i}").into_bytes())
            .expect("append");
    }
    log.shutdown();
}

pub fn read_file(p: &Path) -> Vec<u8> {
    std::fs::read(p).expect("read the device file")
}

/// Overwrites bytes of the device file in place.
pub fn poke(p: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(p)
        .expect("open for damage");
    f.write_all_at(bytes, offset).expect("write damage");
    f.sync_all().expect("sync damage");
}

/// XORs one byte of the device file.
pub fn flip(p: &Path, offset: u64) {
    let old = read_file(p)[offset as usize];
    poke(p, offset, &[old ^ 0x40]);
}

/// `nvmq serve` running as a child, with the addresses it printed; killed when dropped.
pub struct Serving {
    pub child: std::process::Child,
    pub kafka: String,
    /// The metrics address, when `--metrics-addr` was given.
    pub metrics: Option<String>,
}

/// Starts `nvmq serve <args>` (which should listen on port 0) and waits for it to print where it
/// serves Kafka (and metrics, when `--metrics-addr` is among `args`).
pub fn serve(args: &[&str]) -> Serving {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let want_metrics = args.contains(&"--metrics-addr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_nvmq"))
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start nvmq serve");
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut kafka, mut metrics) = (None, None);
        let mut sent = false;
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(a) = line.strip_prefix("metrics on http://") {
                metrics = a.strip_suffix("/metrics").map(str::to_string);
            }
            if let Some(a) = line.strip_prefix("nvmq serving Kafka on ") {
                kafka = a.split(' ').next().map(str::to_string);
            }
            if !sent && kafka.is_some() && (metrics.is_some() || !want_metrics) {
                let _ = tx.send((kafka.clone(), metrics.clone()));
                sent = true;
            }
        }
    });
    let (kafka, metrics) = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("serve printed its addresses");
    Serving {
        child,
        kafka: kafka.expect("a Kafka address"),
        metrics,
    }
}

impl Serving {
    /// A field of the server's /proc status in KiB (e.g. "VmRSS:", "VmHWM:"); 0 if unknown.
    pub fn status_kib(&self, field: &str) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One Prometheus scrape of `addr`'s /metrics, HTTP head included.
pub fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to /metrics");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("send the scrape");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read the scrape");
    out
}

/// The value of an unlabelled series in a scrape.
pub fn metric(body: &str, series: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {series} in:\n{body}"))
        .parse()
        .expect("a number")
}
