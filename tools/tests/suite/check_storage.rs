//! `nvmq check-storage`, run as a user runs it.

use crate::common::*;

#[test]
fn a_directory_is_measured_on_a_temporary_file_that_is_removed() {
    let d = temp_dir("check-dir");
    let args = [
        "check-storage",
        "--dir",
        d.to_str().unwrap(),
        "--duration",
        "200ms",
        "--size",
        "16M",
    ];
    let r = nvmq(&args);
    // This machine's disk may be anything from ideal to marginal; only "broken" exits 4.
    assert!(r.code == 0 || r.code == 4, "{r}");
    for want in [
        "1 writer",
        "8 writers",
        "flush p50",
        "p99",
        "max",
        "verdict",
        "1024 producers",
        "write bandwidth",
        "not available on the file backend",
    ] {
        assert!(r.stdout.contains(want), "missing {want:?}: {r}");
    }
    assert_eq!(
        std::fs::read_dir(&d).unwrap().count(),
        0,
        "the temporary file is gone"
    );

    let j = nvmq(&[&args[..], &["--json"]].concat());
    let v = j.json();
    let phases = v["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2);
    assert_eq!(phases[0]["writers"], 1);
    assert_eq!(phases[1]["writers"], 8);
    for p in phases {
        assert!(p["cycles"].as_u64().unwrap() >= 1);
        let (p50, p99, max) = (
            p["flush_p50_us"].as_f64().unwrap(),
            p["flush_p99_us"].as_f64().unwrap(),
            p["flush_max_us"].as_f64().unwrap(),
        );
        assert!(0.0 < p50 && p50 <= p99 && p99 <= max * 1.001, "{p}");
    }
    let proj: Vec<u64> = v["projection"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["producers"].as_u64().unwrap())
        .collect();
    assert_eq!(proj, vec![1, 64, 1024]);
    assert!(v["write_bandwidth_bytes_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(v["file_system"].as_str().map(|s| !s.is_empty()), Some(true));
    assert_eq!(j.code == 4, v["verdict"] == "broken", "{j}");
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
}

#[test]
fn a_flush_slower_than_a_second_is_broken_and_fails_closed() {
    let r = nvmq(&[
        "check-storage",
        "--device",
        "sim:flush=1100ms,write=0",
        "--duration",
        "100ms",
        "--json",
    ]);
    assert_eq!(r.code, 4, "{r}");
    let v = r.json();
    assert_eq!(v["verdict"], "broken");
    assert!(v["worst_flush_p99_us"].as_f64().unwrap() >= 1_000_000.0);
    assert!(v["nvme_health"]
        .as_str()
        .unwrap()
        .contains("not available on the sim backend"));
}

/// The band storage.md's operators are promised for a flush p99, in microseconds.
fn band(p99_us: f64) -> &'static str {
    match p99_us {
        x if x < 1_000.0 => "ideal",
        x if x < 5_000.0 => "good",
        x if x < 50_000.0 => "workable",
        x if x <= 1_000_000.0 => "marginal",
        _ => "broken",
    }
}

fn check_json(device: &str) -> (Run, serde_json::Value) {
    let r = nvmq(&[
        "check-storage",
        "--device",
        device,
        "--duration",
        "300ms",
        "--json",
    ]);
    let v = r.json();
    (r, v)
}

#[test]
fn verdict_bands_and_honesty_hints_follow_the_device() {
    // Timings on a shared machine wander, so the verdict is checked against the p99 the run
    // measured, and the sim's configured latency bounds what it can measure from below.
    let (r, v) = check_json("sim:flush=2500us,write=20us");
    assert_eq!(r.code, 0, "{r}");
    let p99 = v["worst_flush_p99_us"].as_f64().unwrap();
    assert_eq!(v["verdict"], band(p99), "{r}");
    assert_ne!(v["verdict"], "ideal", "a 2.5 ms flush cannot be ideal: {r}");
    assert!(v["phases"][0]["flush_p50_us"].as_f64().unwrap() >= 2_500.0);
    let hints = v["hints"].to_string();
    assert!(!hints.contains("SUSPICIOUS"), "{r}");
    let human = nvmq(&[
        "check-storage",
        "--device",
        "sim:flush=2500us,write=20us",
        "--duration",
        "200ms",
    ]);
    assert!(human.stdout.contains("verdict              "), "{human}");
    assert!(!human.stdout.contains("SUSPICIOUS"), "{human}");

    // A flush that takes no time on a device claiming a volatile cache cannot be honest.
    let (r, v) = check_json("sim:flush=0,write=0");
    assert_eq!(r.code, 0, "{r}");
    assert_eq!(
        v["verdict"],
        band(v["worst_flush_p99_us"].as_f64().unwrap())
    );
    assert!(
        v["hints"].to_string().contains("SUSPICIOUS: flush p50"),
        "{r}"
    );

    // The same speed on a power-loss-protected device is fine.
    let (r, v) = check_json("sim:flush=0,write=0,plp=true");
    assert_eq!(r.code, 0, "{r}");
    let hints = v["hints"].to_string();
    assert!(!hints.contains("SUSPICIOUS"), "{r}");
    assert!(hints.contains("no volatile write cache"), "{r}");
}

#[test]
fn bad_input_is_refused_with_the_reason() {
    let r = nvmq(&["check-storage", "--duration", "200ms"]);
    assert_eq!(r.code, 2, "{r}");
    assert!(
        r.stderr.contains("--device") || r.stderr.contains("--dir"),
        "{r}"
    );
    let r = nvmq(&["check-storage", "--device", "sim", "--duration", "soon"]);
    assert_eq!(r.code, 2, "{r}");
    assert!(r.stderr.contains("soon"), "{r}");
    let d = temp_dir("check-bad");
    let r = nvmq(&["check-storage", "--dir", d.join("nope").to_str().unwrap()]);
    assert_eq!(r.code, 1, "{r}");
    assert!(r.stderr.contains("not a directory"), "{r}");
    // A device holding a log is not overwritten without --force.
    let p = formatted(&d);
    let before = read_file(&p);
    let r = nvmq(&[
        "check-storage",
        "--device",
        &spec(&p),
        "--duration",
        "100ms",
    ]);
    assert_eq!(r.code, 1, "{r}");
    assert!(
        r.stderr.contains("holds an nvmq log") && r.stderr.contains("--force"),
        "{r}"
    );
    assert_eq!(read_file(&p), before);
}

#[test]
fn a_directory_on_memory_is_broken_whatever_its_speed() {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let shm_is_tmpfs = mounts.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.get(1) == Some(&"/dev/shm") && f.get(2) == Some(&"tmpfs")
    });
    if !shm_is_tmpfs {
        eprintln!("skipped: /dev/shm is not a tmpfs on this machine");
        return;
    }
    let r = nvmq(&[
        "check-storage",
        "--dir",
        "/dev/shm",
        "--duration",
        "100ms",
        "--size",
        "8M",
        "--json",
    ]);
    assert_eq!(r.code, 4, "{r}");
    let v = r.json();
    assert_eq!(v["verdict"], "broken");
    assert_eq!(v["file_system"], "tmpfs");
    assert!(
        v["verdict_reason"].as_str().unwrap().contains("memory"),
        "{r}"
    );
}
