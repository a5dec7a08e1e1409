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
