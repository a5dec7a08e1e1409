//! How the controller cuts the power and brings the broker back: shell commands on a real rig
//! (an IPMI or PDU call, a relay, the QEMU rig's script), a closure in process.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::powercut::RigError;

/// The power switch of the broker's machine. Calls block until the step is done.
pub trait PowerSwitch {
    /// Cuts the power now. Nothing the broker has not made durable may survive it.
    fn cut(&mut self) -> Result<(), RigError>;
    /// Powers on / restarts the broker; may return before it serves (the controller polls).
    fn restore(&mut self) -> Result<(), RigError>;
    /// The broker's own account of its last recovery, when the switch can get one.
    fn recovery_report(&mut self) -> Option<String>;
}

/// A switch made of shell commands (`sh -c`).
#[derive(Debug, Clone)]
pub struct CommandSwitch {
    pub cut: String,
    pub up: Option<String>,
    pub report: Option<String>,
    /// Longest any one command may run.
    pub timeout: Duration,
}

/// Runs `cmd` with `sh -c`; its stdout goes to ours only if `capture` is false (then to stderr,
/// keeping stdout for the report). Returns what it printed when captured.
pub fn shell(
    cmd: &str,
    what: &'static str,
    capture: bool,
    timeout: Duration,
) -> Result<String, RigError> {
    let failed = |detail: String| RigError::Command {
        what,
        cmd: cmd.to_string(),
        detail,
    };
    let mut c = Command::new("sh");
    c.arg("-c").arg(cmd).stdin(Stdio::null());
    if capture {
        c.stdout(Stdio::piped());
    } else {
        use std::os::fd::AsFd;
        let err = std::io::stderr()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| failed(format!("duplicating stderr: {e}")))?;
        c.stdout(Stdio::from(err));
    }
    let mut child = c
        .spawn()
        .map_err(|e| failed(format!("could not start: {e}")))?;
    let reader = child.stdout.take().map(|mut out| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        })
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if started.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(failed(format!("still running after {timeout:?}; killed")));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(failed(format!("waiting for it: {e}"))),
        }
    };
    if !status.success() {
        return Err(failed(format!("exited with {status}")));
    }
    Ok(reader
        .and_then(|r| r.join().ok())
        .unwrap_or_default()
        .trim_end()
        .to_string())
}

impl PowerSwitch for CommandSwitch {
    fn cut(&mut self) -> Result<(), RigError> {
        shell(&self.cut, "--cut-cmd", false, self.timeout).map(drop)
    }

    fn restore(&mut self) -> Result<(), RigError> {
        match &self.up {
            Some(up) => shell(up, "--up-cmd", false, self.timeout).map(drop),
            None => Ok(()),
        }
    }

    fn recovery_report(&mut self) -> Option<String> {
        let cmd = self.report.as_ref()?;
        match shell(cmd, "--report-cmd", true, self.timeout) {
            Ok(s) if s.is_empty() => None,
            Ok(s) => Some(s),
            Err(e) => Some(format!("(no report: {e})")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_run_and_failures_name_the_flag() {
        let t = Duration::from_secs(5);
        assert_eq!(
            shell("echo hello; echo there", "x", true, t).expect("runs"),
            "hello\nthere"
        );
        match shell("exit 3", "--cut-cmd", false, t) {
            Err(RigError::Command { what, detail, .. }) => {
                assert_eq!(what, "--cut-cmd");
                assert!(detail.contains('3'), "{detail}");
            }
            other => panic!("a failing command passed: {other:?}"),
        }
        assert!(shell("sleep 5", "--up-cmd", false, Duration::from_millis(100)).is_err());
    }
}
