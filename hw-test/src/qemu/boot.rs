//! Runs one QEMU boot: streams the serial console into a log and the marker parser, enforces the
//! hard timeout (killing QEMU) and times the boot.
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::console::ConsoleReport;
use super::error::{IoContext, Result, RigError};
use super::host;

/// Pulled from another thread to SIGKILL a running guest at that moment: a power cut at a moment
/// the host chooses (the console marker form picks a moment the guest chooses).
#[derive(Debug, Clone, Default)]
pub struct KillSwitch(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl KillSwitch {
    pub fn new() -> KillSwitch {
        KillSwitch::default()
    }

    pub fn pull(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_pulled(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

pub struct BootOutcome {
    pub console: String,
    pub report: ConsoleReport,
    /// QEMU start to the guest init's first marker.
    pub boot_time: Option<Duration>,
    /// QEMU start to QEMU exit.
    pub total_time: Duration,
    pub status: ExitStatus,
    pub stderr: String,
    /// The host killed QEMU because a console line held the `kill_at` marker.
    pub killed_at_marker: bool,
}

const TAIL_LINES: usize = 40;

pub fn tail(console: &str) -> String {
    let lines: Vec<&str> = console.lines().collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..]
        .iter()
        .map(|l| l.trim_end_matches('\r'))
        .collect::<Vec<_>>()
        .join("\n")
}

fn kill(child: &mut Child) {
    // The child may have exited on its own in the meantime; either way it is gone afterwards.
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs QEMU until it exits, the deadline passes (an error), or, with `kill_at`, a console line
/// contains that marker: then QEMU gets SIGKILL at once, so the guest neither shuts down nor
/// flushes anything (a power cut as the guest sees it).
pub fn boot(
    mut cmd: Command,
    timeout: Duration,
    log_path: &Path,
    echo: bool,
    kill_at: Option<&str>,
    switch: Option<&KillSwitch>,
) -> Result<BootOutcome> {
    let mut log = File::create(log_path).ctx("creating console log", log_path)?;
    let start = Instant::now();
    let deadline = start + timeout;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| RigError::Spawn {
            command: host::describe(&cmd),
            source,
        })?;
    let (Some(stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take()) else {
        kill(&mut child);
        return Err(RigError::Provision(
            "QEMU's stdout/stderr were not captured".into(),
        ));
    };
    let (tx, rx) = mpsc::channel::<(Instant, String)>();
    let reader = thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf).into_owned();
                    if tx.send((Instant::now(), line)).is_err() {
                        break;
                    }
                }
            }
        }
    });
    let err_reader = thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });

    let mut console = String::new();
    let mut report = ConsoleReport::default();
    let mut boot_time = None;
    let mut timed_out = false;
    let mut killed_at_marker = false;
    loop {
        let now = Instant::now();
        if now >= deadline {
            timed_out = true;
            break;
        }
        if switch.is_some_and(|k| k.is_pulled()) {
            kill(&mut child);
            killed_at_marker = true;
            break;
        }
        // With a kill switch, look at it every few milliseconds even when the console is quiet.
        let wait = match switch {
            Some(_) => (deadline - now).min(Duration::from_millis(5)),
            None => deadline - now,
        };
        match rx.recv_timeout(wait) {
            Ok((at, line)) => {
                log.write_all(line.as_bytes())
                    .ctx("writing console log", log_path)?;
                if echo {
                    eprint!("{line}");
                }
                let text = line.trim_end_matches('\n');
                report.line(text);
                if boot_time.is_none() && report.init_started {
                    boot_time = Some(at - start);
                }
                console.push_str(&line);
                if kill_at.is_some_and(|m| text.contains(m)) {
                    kill(&mut child);
                    killed_at_marker = true;
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout)
                if switch.is_some() && Instant::now() < deadline => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    // stdout closed (QEMU is exiting) or the deadline passed: give QEMU what is left of the
    // deadline to exit, then kill it.
    let status = loop {
        match child.try_wait().ctx("waiting for", "qemu-system-x86_64")? {
            Some(s) => break Some(s),
            None if timed_out || Instant::now() >= deadline => {
                timed_out = true;
                kill(&mut child);
                break None;
            }
            None => thread::sleep(Duration::from_millis(20)),
        }
    };
    let total_time = start.elapsed();
    let _ = reader.join();
    let stderr = err_reader.join().unwrap_or_default();
    let Some(status) = status.filter(|_| !timed_out) else {
        return Err(RigError::Timeout {
            limit: timeout,
            log: log_path.to_path_buf(),
            tail: tail(&console),
        });
    };
    Ok(BootOutcome {
        console,
        report,
        boot_time,
        total_time,
        status,
        stderr,
        killed_at_marker,
    })
}
