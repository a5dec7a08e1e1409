//! nvmq's userspace NVMe driver against QEMU's emulated controller, one boot per logical block
//! size (512 and 4096): the driver checks (`nvme-check`), the operator-path errors, the storage
//! core killed with SIGKILL and recovered for several cycles (`nvme-crash-cycle`), the system
//! calls of a steady I/O loop under `strace -c` (512) and `nvmq bench` on the namespace (4096).
//! These tests need QEMU and fail (never skip) without it; the rig installs what it needs when run
//! as root. `NVMQ_CRASH_SEED` replays a crash-cycle run (each run prints its seed).
use std::collections::BTreeMap;

use hw_test::qemu::{CmdResult, Disk, GuestCmd, RigOptions, RigRun, Stage};

mod common;
use common::log;

const CHECK: &str = env!("CARGO_BIN_EXE_nvme-check");
const CRASH: &str = env!("CARGO_BIN_EXE_nvme-crash-cycle");
const STRACE: &str = "/usr/bin/strace";
/// The driver checks `nvme-check` runs against a controller, in order; the device contract suite
/// (`blockdev::contract::CHECKS`, as `contract:<name>`) runs between `shutdown` and
/// `bad-namespace`.
const CHECKS: &[&str] = &[
    "open",
    "identify",
    "smart",
    "patterns-across-lbas",
    "prp-lists",
    "mdts-split",
    "queue-wrap",
    "out-of-range",
    "shutdown",
    "bad-namespace",
];

fn boot(opts: RigOptions, cmds: &[GuestCmd]) -> RigRun {
    common::boot("nvme-guest", opts, cmds, true)
}

fn seed() -> String {
    std::env::var("NVMQ_CRASH_SEED").unwrap_or_else(|_| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64 % 1_000_000_007)
            .unwrap_or(1)
            .to_string()
    })
}

fn options(block: u32, disk_bytes: u64) -> RigOptions {
    RigOptions {
        disk: Disk::Image {
            path: None,
            size: disk_bytes,
        },
        logical_block_size: block,
        physical_block_size: block,
        timeout: std::time::Duration::from_secs(240),
        ..RigOptions::default()
    }
}

fn nvme_check() -> GuestCmd {
    GuestCmd::host(CHECK, ["--pci", "{pci}", "--destroy-data"])
}

fn crash_cycle(seed: &str) -> GuestCmd {
    GuestCmd::host(
        CRASH,
        [
            "--pci",
            "{pci}",
            "--destroy-data",
            "--cycles",
            "5",
            "--seed",
            seed,
        ],
    )
}

/// The first output line that starts with `head`.
fn line<'a>(c: &'a CmdResult, head: &str) -> &'a str {
    c.output
        .lines()
        .find(|l| l.starts_with(head))
        .unwrap_or_else(|| panic!("no line starting {head:?}:\n{}", c.output))
}

/// The line of check `name`, which must have passed.
fn passed<'a>(c: &'a CmdResult, name: &str) -> &'a str {
    let line = line(c, &format!("CHECK {name} "));
    assert!(
        line.starts_with(&format!("CHECK {name} PASS: ")),
        "{line}\n{}",
        c.output
    );
    line
}

fn assert_checks_pass(c: &CmdResult, block: u32) {
    assert_eq!(c.exit_code, 0, "nvme-check:\n{}", c.output);
    for name in CHECKS {
        passed(c, name);
    }
    // Every check of the contract suite the other backends pass, on the emulated controller.
    for check in blockdev::contract::CHECKS {
        passed(c, &format!("contract:{}", check.name));
    }
    let lines: Vec<&str> = c.output.lines().collect();
    let at = |head: &str| lines.iter().position(|l| l.starts_with(head));
    assert!(
        at("CHECK shutdown ") < at("CHECK contract:geometry ")
            && at("CHECK contract:reopen-in-flight ") < at("CHECK bad-namespace "),
        "the contract suite runs after the driver checks and before bad-namespace:\n{}",
        c.output
    );
    assert_eq!(
        c.output.lines().last(),
        Some("NVME-CHECK PASS"),
        "{}",
        c.output
    );
    let id = passed(c, "identify");
    assert!(
        id.contains("model \"QEMU NVMe Ctrl\" serial \"nvmq0\"")
            && id.contains(&format!("blocks of {block} B"))
            && id.contains("VWC present true enabled true"),
        "{id}"
    );
    // QEMU's controller reports a healthy SMART page: no critical warning.
    assert!(
        passed(c, "smart").contains("SMART critical warning 0x00 (none)"),
        "{}",
        passed(c, "smart")
    );
    assert!(passed(c, "prp-lists").contains("PRP lists"));
    // QEMU's MDTS is 512 KiB: the 1 MiB transfer goes out as two commands.
    assert!(passed(c, "mdts-split").contains("= 2 commands"));
    assert!(passed(c, "queue-wrap").contains("(over 2x, phase flips)"));
    // The controller's own status for blocks past the end, decoded.
    assert!(passed(c, "out-of-range")
        .contains("SCT 0x0 / SC 0x80 (LBA out of range), do-not-retry=true"));
    assert!(passed(c, "bad-namespace").contains("is not active"));
}

fn assert_crash_cycles_pass(c: &CmdResult) {
    assert_eq!(c.exit_code, 0, "nvme-crash-cycle:\n{}", c.output);
    for k in 1..=5 {
        let cycle = line(c, &format!("CYCLE {k} PASS: "));
        assert!(cycle.contains("signal: 9 (SIGKILL)"), "{cycle}");
    }
    assert!(
        c.output
            .lines()
            .any(|l| l.starts_with("FINAL PASS: VERIFIED")),
        "{}",
        c.output
    );
    assert_eq!(
        c.output.lines().last(),
        Some("NVME-CRASH-CYCLE PASS"),
        "{}",
        c.output
    );
    let verified: u64 = c
        .output
        .lines()
        .find_map(|l| {
            l.strip_prefix("5 cycles, ")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no summary line:\n{}", c.output));
    assert!(verified > 0, "nothing was acknowledged:\n{}", c.output);
}

/// `strace -c` summary rows: syscall -> calls.
fn syscall_counts(out: &str) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for l in out.lines() {
        let t: Vec<&str> = l.split_whitespace().collect();
        if t.len() >= 5 && t[0].parse::<f64>().is_ok() {
            if let (Ok(calls), Some(name)) = (t[3].parse::<u64>(), t.last()) {
                if *name != "total" {
                    m.insert(name.to_string(), calls);
                }
            }
        }
    }
    m
}

fn strace_hot_loop(ios: u32) -> GuestCmd {
    let n = ios.to_string();
    GuestCmd::host(
        STRACE,
        [
            "-c",
            "-f",
            "{bin:nvme-check}",
            "--pci",
            "{pci}",
            "--destroy-data",
            "--hot-loop",
            &n,
        ],
    )
    .with_binary(CHECK)
}

#[test]
fn lba_512_driver_checks_operator_errors_crash_cycles_and_syscalls() {
    let seed = seed();
    let run = boot(
        options(512, 64 << 20),
        &[
            // While the kernel's nvme driver owns the function.
            nvme_check().in_stage(Stage::KernelNvme),
            nvme_check(),
            // q35's LPC bridge: no NVMe controller.
            GuestCmd::host(CHECK, ["--pci", "0000:00:1f.0", "--destroy-data"]),
            crash_cycle(&seed),
            strace_hot_loop(1000),
            strace_hot_loop(10000),
        ],
    );
    let c = &run.commands;
    let pci = &run.nvme_pci;
    assert_eq!(c[0].exit_code, 1, "{}", c[0].output);
    assert!(
        c[0].output.contains(&format!(
            "{pci} is bound to the nvme driver, not vfio-pci; rebind it with `hw-test/scripts/vfio-bind.sh {pci}`"
        )),
        "{}",
        c[0].output
    );
    assert_checks_pass(&c[1], 512);
    assert_eq!(c[2].exit_code, 1, "{}", c[2].output);
    assert!(
        c[2].output
            .contains("0000:00:1f.0 is not an NVMe controller: its PCI class is 0x060100"),
        "{}",
        c[2].output
    );
    assert_crash_cycles_pass(&c[3]);

    // 9000 more I/Os (and 70 more flushes) must not add a single system call. The clock is the
    // exception the driver allows itself: a wait the controller leaves unanswered for 256 polls
    // reads it (a syscall here: the guest's clocksource is HPET), as do the sleeps of start-up
    // and shutdown, so those counts follow time spent waiting, not I/Os.
    for r in &c[4..6] {
        assert_eq!(r.exit_code, 0, "{}", r.output);
        assert!(r.output.contains("HOT-LOOP PASS"), "{}", r.output);
    }
    let time_driven = ["clock_gettime", "clock_nanosleep"];
    let [small, large] = [&c[4], &c[5]].map(|r| {
        let mut m = syscall_counts(&r.output);
        let clock: Vec<String> = time_driven
            .iter()
            .map(|s| format!("{s} {}", m.remove(*s).unwrap_or(0)))
            .collect();
        log(format!("nvme-guest: {}: {}", r.label, clock.join(", ")));
        m
    });
    assert!(
        small.get("ioctl").is_some_and(|&n| n > 0),
        "no strace summary:\n{}",
        c[4].output
    );
    assert_eq!(
        small, large,
        "system calls of 1000 vs 10000 I/Os:\n{}\n{}",
        c[4].output, c[5].output
    );
}

#[test]
fn lba_4096_driver_checks_crash_cycles_and_bench() {
    let seed = seed();
    let nvmq = common::nvmq_binary();
    let run = boot(
        options(4096, 256 << 20),
        &[
            nvme_check(),
            crash_cycle(&seed),
            GuestCmd::host(
                nvmq,
                [
                    "bench",
                    "--device",
                    "nvme:{pci}",
                    "--force",
                    "--producers",
                    "1,8",
                    "--record-size",
                    "100",
                    "--duration",
                    "2s",
                ],
            ),
        ],
    );
    let c = &run.commands;
    assert_checks_pass(&c[0], 4096);
    assert_crash_cycles_pass(&c[1]);
    let bench = &c[2];
    assert_eq!(bench.exit_code, 0, "nvmq bench:\n{}", bench.output);
    assert!(
        bench.output.contains(&format!(
            "device nvme:{} (nvme:nvmq0 ns=1), write unit 4096 B, volatile write cache: true",
            run.nvme_pci
        )),
        "{}",
        bench.output
    );
    assert!(bench
        .output
        .contains("device alone (1 writer, 4 KiB write + flush)"));
    for producers in ["1", "8"] {
        let row = bench
            .output
            .lines()
            .find(|l| {
                let t: Vec<&str> = l.split_whitespace().collect();
                t.first() == Some(&producers) && t.get(1) == Some(&"100")
            })
            .unwrap_or_else(|| panic!("no row for {producers} producers:\n{}", bench.output));
        let acks: f64 = row
            .split_whitespace()
            .nth(2)
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("acks/s in {row:?}"));
        assert!(acks > 0.0, "{row}");
    }
}
