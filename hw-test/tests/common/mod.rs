//! What the QEMU rig's integration tests share: one guest at a time, and boot reports on stderr.
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use hw_test::qemu::{GuestCmd, Rig, RigOptions, RigRun};

/// One guest at a time: the boot times printed stay meaningful, and two TCG guests on a 2-core
/// machine would slow each other past their timeouts.
pub static ONE_GUEST: Mutex<()> = Mutex::new(());

/// Straight to the stderr handle, past the test harness's capture, so CI logs show it.
pub fn log(line: impl AsRef<str>) {
    let _ = writeln!(std::io::stderr(), "{}", line.as_ref());
}

/// Boots once and reports the timings and each command's exit (and, with `outputs`, its output
/// lines) on stderr, each line prefixed with `tag`.
#[allow(dead_code)] // Not every test binary that includes this module boots through it.
pub fn boot(tag: &str, opts: RigOptions, cmds: &[GuestCmd], outputs: bool) -> RigRun {
    let _guard = ONE_GUEST.lock().unwrap_or_else(|p| p.into_inner());
    let rig = Rig::new(opts).unwrap_or_else(|e| panic!("QEMU rig cannot start: {e}"));
    let run = rig
        .run(cmds)
        .unwrap_or_else(|e| panic!("QEMU rig run failed: {e}"));
    log(format!(
        "{tag}: guest init after {:.2?}, QEMU exited after {:.2?} ({} commands)",
        run.boot_time,
        run.total_time,
        run.commands.len()
    ));
    for (n, c) in run.commands.iter().enumerate() {
        log(format!("{tag}: [{n}] {} -> exit {}", c.label, c.exit_code));
        if outputs {
            for l in c.output.lines() {
                log(format!("{tag}: [{n}]   {l}"));
            }
        }
    }
    run
}

/// The `nvmq` binary of the tools crate as the workspace's own test build makes it (the same
/// profile and features as this test): `cargo test --workspace` built it before running any
/// test, so in CI this rebuilds nothing. A plain `cargo build -p nvmq-tools` would compile the
/// whole dependency tree a second time under the dev profile and features (minutes on a
/// 2-core machine), and its unoptimized binary runs slowly in a TCG guest. Run alone (`cargo
/// test -p nvmq-hw-test`), this builds the workspace's tests first.
#[allow(dead_code)] // Not every test binary that includes this module boots nvmq.
pub fn nvmq_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .to_path_buf();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args([
        "test",
        "--workspace",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    // The variables cargo set for this test (its package's name, manifest dir, OUT_DIR...)
    // must not reach the inner cargo: build scripts that watch them (ring's does) would see
    // them changed and rebuild their crates and everything above them.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
            || k.starts_with("CARGO_BIN_")
            || matches!(
                &*k,
                "OUT_DIR" | "CARGO_CRATE_NAME" | "CARGO_PRIMARY_PACKAGE" | "CARGO_TARGET_TMPDIR"
            )
        {
            cmd.env_remove(&*k);
        }
    }
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("running cargo test --no-run for nvmq");
    assert!(
        out.status.success(),
        "cargo test --workspace --no-run failed"
    );
    // The artifact of the `nvmq` bin target built as the program, not as its unit-test
    // harness (which cargo reports under the same target name).
    let found = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|m| {
            m["reason"] == "compiler-artifact"
                && m["target"]["name"] == "nvmq"
                && m["profile"]["test"] == false
                && m["target"]["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "bin"))
        })
        .and_then(|m| m["executable"].as_str().map(PathBuf::from));
    found.expect("cargo reported no executable for the nvmq binary")
}
