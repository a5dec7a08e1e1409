//! Running the built `nvmq` binary as a user would, and building logs for it to look at.
#![allow(dead_code)] // Each test file uses its own share of these helpers.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

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

/// The `nvmq` binary with `args`, in an environment without the log filters and the test seams
/// (a caller adds those it wants).
pub fn command(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nvmq"));
    c.args(args);
    for var in ["RUST_LOG", "NVMQ_LOG", FLUSH_FAIL_SEAM, GEOMETRY_SEAM] {
        c.env_remove(var);
    }
    c
}

/// The file device's flush-failure seam (`tools/src/devspec.rs`).
pub const FLUSH_FAIL_SEAM: &str = "NVMQ_FAULT_FLUSH_FAIL_AFTER";
/// The file device's geometry seam (`tools/src/devspec.rs`).
pub const GEOMETRY_SEAM: &str = "NVMQ_FAULT_GEOMETRY";

/// Runs `nvmq <args>` to its end.
pub fn nvmq(args: &[&str]) -> Run {
    nvmq_with(args, &[], Duration::from_secs(600))
}

/// Runs `nvmq <args>` with `env` added, killed if it has not ended within `limit` (then `code`
/// is -1).
pub fn nvmq_with(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Run {
    use std::io::Read;
    let mut child = command(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the nvmq binary runs");
    let drain = |mut from: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = from.read_to_end(&mut s);
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout")));
    let err = drain(Box::new(child.stderr.take().expect("stderr")));
    let until = Instant::now() + limit;
    let code = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st.code().unwrap_or(-1),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break -1;
            }
        }
    };
    Run {
        code,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
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

pub mod clients;
pub mod hostile;
pub mod kafka;
mod serving;
#[allow(unused_imports)] // Each test file uses its share.
pub use serving::{metric, scrape, serve, serve_with, try_scrape, Serving};
