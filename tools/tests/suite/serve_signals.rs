//! `nvmq serve` and SIGTERM/SIGINT from the moment it says it serves: a supervisor (or a test)
//! that stops it as soon as the "serving Kafka on" line appears gets a clean stop (status 0),
//! never the signal's default action (killed, no status). Before the fix the handlers were
//! installed only after that line, and `tools/tests/suite/many_partitions.rs` failed now and then on
//! its final SIGTERM of a restarted broker.

use std::time::Duration;

/// SIGINT and SIGTERM as bits of /proc's signal masks (bit n-1 for signal n).
const SIGINT_BIT: u64 = 1 << 1;
const SIGTERM_BIT: u64 = 1 << 14;

/// The signals `pid` catches (SigCgt of /proc/<pid>/status).
fn caught(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .expect("a SigCgt line");
    u64::from_str_radix(mask.trim(), 16).expect("a hex mask")
}

#[test]
fn a_signal_right_after_the_serving_line_stops_serve_cleanly() {
    for signal in ["-TERM", "-INT", "-TERM", "-INT", "-TERM"] {
        let mut serving =
            crate::common::serve(&["--device", "sim:capacity=64M", "--listen", "127.0.0.1:0"]);
        // Checked first, the moment the line is read: the handlers must be there already.
        let mask = caught(serving.child.id());
        assert_eq!(
            mask & (SIGINT_BIT | SIGTERM_BIT),
            SIGINT_BIT | SIGTERM_BIT,
            "SigCgt {mask:x} when serve said it serves"
        );
        let sent = std::process::Command::new("kill")
            .args([signal, &serving.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill {signal}");
        let status = serving
            .exit_within(Duration::from_secs(60))
            .expect("serve stopped within a minute");
        assert_eq!(
            status.code(),
            Some(0),
            "after {signal}: {status:?}; stderr:\n{}",
            serving.stderr()
        );
    }
}
