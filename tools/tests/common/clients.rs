//! Real Kafka clients driven against `nvmq serve` (`kafka_clients.rs`, `kafka_security.rs`): the
//! clients installed by `tests/clients/setup.sh`, the scenarios of `tests/clients/scenarios.py`,
//! kcat, and a broker whose printed address they connect to.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

pub fn tmp(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("creating a test directory");
    d
}

/// The tests take turns: each runs a broker and real clients (the librdkafka one builds a C
/// library too), and on a small machine running them side by side only invites timeouts.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// The venv's python, after installing the clients once per test run.
pub fn python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kafka-clients-venv");
        let st = Command::new("bash")
            .arg(clients_dir().join("setup.sh"))
            .arg(&venv)
            .status()
            .expect("running tests/clients/setup.sh");
        assert!(
            st.success(),
            "installing the Kafka clients failed (tests/clients/setup.sh)"
        );
        venv.join("bin/python")
    })
}

/// A running `nvmq serve`; killed on drop.
pub struct Server {
    pub child: Child,
    pub addr: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    pub fn start(device: &str) -> Server {
        Server::start_with(device, &[])
    }

    pub fn start_with(device: &str, extra: &[&str]) -> Server {
        let mut args = vec![
            "--device",
            device,
            "--listen",
            "127.0.0.1:0",
            "--size",
            "256M",
        ];
        args.extend_from_slice(extra);
        Server::spawn(&args)
    }

    /// `nvmq serve` with exactly these flags.
    pub fn spawn(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_nvmq"))
            .arg("serve")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting nvmq serve");
        let out = child.stdout.take().expect("serve's stdout");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if let Some(a) = line.strip_prefix("nvmq serving Kafka on ") {
                        let _ = tx.send(a.split(' ').next().unwrap_or("").to_string());
                    }
                    log.lock().unwrap().push(line);
                }
            });
        }
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("nvmq serve did not start: {:?}", log.lock().unwrap()));
        Server { child, addr, log }
    }

    pub fn sigkill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn sigterm(mut self) {
        // SAFETY-free: signalling our own child by its pid through the kill command.
        let st = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(st.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                assert!(s.success(), "nvmq serve exited with {s} after SIGTERM");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "nvmq serve did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = self.log.lock().unwrap().clone();
        assert!(
            log.iter().any(|l| l == "nvmq stopped"),
            "no clean stop: {log:?}"
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a scenario to completion; returns its stdout (printed too).
pub fn scenario(addr: &str, what: &str, args: &[&str]) -> String {
    let text = scenario_quiet(addr, what, args);
    println!("{what}: {text}");
    text
}

pub fn scenario_quiet(addr: &str, what: &str, args: &[&str]) -> String {
    let out = Command::new(python())
        .arg(clients_dir().join("scenarios.py"))
        .arg(addr)
        .arg(what)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .expect("running scenarios.py");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let last = text.lines().last().unwrap_or("");
    assert!(out.status.success(), "scenario {what} failed: {last}");
    text
}

pub fn kcat(args: &[&str], input: &[u8]) -> String {
    python(); // kcat comes with the same setup
    let mut child = Command::new("kcat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting kcat");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().expect("kcat");
    assert!(out.status.success(), "kcat {args:?} failed");
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// kcat's `-X` flags for these librdkafka settings (`key=value`).
pub fn kcat_settings<S: AsRef<str>>(settings: &[S]) -> Vec<String> {
    settings
        .iter()
        .flat_map(|s| ["-X".to_string(), s.as_ref().to_string()])
        .collect()
}

/// kcat produces `input` (a message per line) to `topic` with acks=all, with `extra` flags.
pub fn kcat_produce(addr: &str, topic: &str, extra: &[String], input: &[u8]) {
    let mut args = vec!["-P", "-b", addr, "-t", topic, "-X", "acks=all"];
    args.extend(extra.iter().map(String::as_str));
    kcat(&args, input);
}

/// What kcat consumes of partition 0 of `topic` from `offset` (`beginning`, an offset, or `-n`
/// for the last n) to its end, each message printed with `format`, with `extra` flags.
pub fn kcat_consume(
    addr: &str,
    topic: &str,
    offset: &str,
    format: &str,
    extra: &[String],
) -> String {
    let mut args = vec![
        "-C", "-b", addr, "-t", topic, "-p", "0", "-o", offset, "-e", "-f", format,
    ];
    args.extend(extra.iter().map(String::as_str));
    kcat(&args, b"")
}

/// Runs `tests/clients/librdkafka.sh` (which builds librdkafka's test suite once under
/// target/tmp) against the broker at `addr`, with the script's `args` (`--broker KIND`, `--conf
/// key=value`); every test it picks must pass.
pub fn librdkafka_suite(addr: &str, args: &[&str]) {
    python(); // the same setup installs kcat's librdkafka; the suite builds its own
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("librdkafka");
    let st = Command::new("bash")
        .arg(clients_dir().join("librdkafka.sh"))
        .arg(&work)
        .arg(addr)
        .args(args)
        .status()
        .expect("running tests/clients/librdkafka.sh");
    assert!(
        st.success(),
        "librdkafka tests {args:?} failed (logs under {})",
        work.display()
    );
}
