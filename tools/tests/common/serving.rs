//! `nvmq serve` as a child process: started, scraped, watched, stopped.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// How long serve may take to print where it serves (a restart recovers the log first).
const START_WAIT: Duration = Duration::from_secs(120);

/// `nvmq serve` running as a child, with the addresses it printed; killed when dropped.
pub struct Serving {
    pub child: std::process::Child,
    pub kafka: String,
    /// The metrics address, when `--metrics-addr` was given.
    pub metrics: Option<String>,
    /// Everything it wrote to stderr so far (also echoed to the test's stderr).
    stderr: Arc<Mutex<String>>,
}

/// Starts `nvmq serve <args>` (which should listen on port 0) and waits for it to print where it
/// serves Kafka (and metrics, when `--metrics-addr` is among `args`).
pub fn serve(args: &[&str]) -> Serving {
    serve_with(args, &[])
}

/// [`serve`] with `env` added to its environment (the test seams).
pub fn serve_with(args: &[&str], env: &[(&str, &str)]) -> Serving {
    let want_metrics = args.contains(&"--metrics-addr");
    let mut child = super::command(&[&["serve"], args].concat())
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start nvmq serve");
    let stderr = Arc::new(Mutex::new(String::new()));
    let err = child.stderr.take().expect("stderr");
    let sink = stderr.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("[serve] {line}");
            let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
            s.push_str(&line);
            s.push('\n');
        }
    });
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut kafka, mut metrics) = (None, None);
        let mut sent = false;
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            println!("[serve] {line}");
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
        .recv_timeout(START_WAIT)
        .expect("serve printed its addresses");
    Serving {
        child,
        kafka: kafka.expect("a Kafka address"),
        metrics,
        stderr,
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

    /// The value of an unlabelled series of a scrape of the broker's /metrics.
    pub fn metric(&self, series: &str) -> f64 {
        let addr = self
            .metrics
            .as_deref()
            .expect("serve runs with --metrics-addr");
        metric(&scrape(addr), series)
    }

    /// What serve wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether stderr shows every one of `needles` within a few seconds (its reader thread may
    /// lag behind stdout's, or behind the process's exit).
    pub fn stderr_shows(&self, needles: &[&str]) -> bool {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let err = self.stderr();
            if needles.iter().all(|n| err.contains(n)) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the process to end on its own, up to `bound`.
    pub fn exit_within(&mut self, bound: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + bound;
        while Instant::now() < until {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// SIGTERM, then up to `wait` for the process to end: its exit code, or None if it did not.
    pub fn terminate(&mut self, wait: Duration) -> Option<i32> {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.exit_within(wait).map(|s| s.code().unwrap_or(-1))
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One Prometheus scrape of `addr`'s /metrics, HTTP head included.
pub fn try_scrape(addr: &str) -> std::io::Result<String> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// [`try_scrape`], which must answer.
pub fn scrape(addr: &str) -> String {
    try_scrape(addr).expect("scrape /metrics")
}

/// The value of an unlabelled series in a scrape.
pub fn metric(body: &str, series: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {series} in:\n{body}"))
        .parse()
        .expect("a number")
}
