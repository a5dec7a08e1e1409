//! `nvmq inspect` and `verify` on a device whose geometry makes open refuse the log (a physical
//! block larger than the write unit U, a maximum transfer below U, a queue too shallow for the
//! writer): both say so in a warning that names the sizes and what to do, and `verify` fails,
//! because `serve` would refuse the device. A file on a file system cannot change its block size,
//! so the device's report is changed through the binary's geometry seam (`NVMQ_FAULT_GEOMETRY`).

use std::time::Duration;

use crate::common::*;

/// A new log holding a few records, with a window of 1 MiB so that a scan (which probes a window
/// past the tail) stays short even in reads of half a write unit; its path, its write unit and
/// its maximum batch, as inspect reports them.
fn small_log(name: &str) -> (std::path::PathBuf, u64, u64) {
    let p = temp_dir(name).join("log.img");
    let r = nvmq(&[
        "format",
        "--device",
        &spec(&p),
        "--size",
        "32M",
        "--window",
        "1M",
    ]);
    assert_eq!(r.code, 0, "{r}");
    append_records(&p, 3);
    let (u, batch) = write_unit_and_max_batch(&p);
    (p, u, batch)
}

/// The write unit and the maximum batch of the log on `p`, as inspect reports them.
fn write_unit_and_max_batch(p: &std::path::Path) -> (u64, u64) {
    let r = nvmq(&["inspect", "--device", &spec(p), "--json"]);
    assert_eq!(r.code, 0, "{r}");
    let g = &r.json()["superblock"];
    let unit = g["write_unit"].as_u64().expect("write unit");
    let batch = g["max_batch"].as_u64().expect("max batch");
    (unit, batch)
}

/// `nvmq <args>` with the device reporting `geometry`.
fn reshaped(args: &[&str], geometry: &str) -> Run {
    nvmq_with(args, &[(GEOMETRY_SEAM, geometry)], Duration::from_secs(120))
}

/// Runs inspect, verify and serve on `p` with the device reporting `geometry`: inspect and
/// verify print the same warning that serve refuses with, which holds every one of `needles`;
/// inspect exits 0, verify 1, serve 1, and none of them wrote a byte.
fn refused_alike(p: &std::path::Path, geometry: &str, needles: &[String]) {
    let before = read_file(p);
    let device = spec(p);
    let holds_all = |text: &str| needles.iter().all(|n| text.contains(n.as_str()));

    let inspect = reshaped(&["inspect", "--device", &device], geometry);
    assert_eq!(inspect.code, 0, "inspect shows what it read: {inspect}");
    assert!(
        inspect
            .stderr
            .contains("FAULT INJECTION (NVMQ_FAULT_GEOMETRY)"),
        "{inspect}"
    );
    let warning = inspect
        .stdout
        .lines()
        .find(|l| l.starts_with("WARNING"))
        .unwrap_or_else(|| panic!("no warning line: {inspect}"));
    assert!(
        warning.contains("nvmq serve would refuse to open this log on this device")
            && holds_all(warning),
        "{warning}"
    );
    let j = reshaped(&["inspect", "--device", &device, "--json"], geometry);
    assert_eq!(j.code, 0, "{j}");
    let why = j.json()["open_refused"].as_str().map(str::to_string);
    assert!(why.as_deref().is_some_and(holds_all), "{j}");

    let verify = reshaped(&["verify", "--device", &device], geometry);
    assert_eq!(
        verify.code, 1,
        "verify fails where serve would refuse: {verify}"
    );
    assert!(
        verify
            .stdout
            .lines()
            .any(|l| l.starts_with("WARNING") && holds_all(l)),
        "{verify}"
    );
    assert!(
        verify
            .stdout
            .contains("result               DEVICE REFUSED"),
        "{verify}"
    );
    let vj = reshaped(&["verify", "--device", &device, "--json"], geometry);
    assert_eq!(vj.code, 1, "{vj}");
    let v = vj.json();
    assert_eq!(v["verdict"], "ok", "the data itself is fine: {vj}");
    assert_eq!(v["open_refused"].as_str(), why.as_deref(), "{vj}");

    // The same check is the one open runs: serve refuses with the same words.
    let serve = reshaped(
        &["serve", "--device", &device, "--listen", "127.0.0.1:0"],
        geometry,
    );
    assert_eq!(serve.code, 1, "{serve}");
    assert!(
        why.as_deref().is_some_and(|w| serve.stderr.contains(w)),
        "serve's refusal is inspect's warning: {serve}"
    );
    assert_eq!(read_file(p), before, "nothing wrote to the device");
}

#[test]
fn a_physical_block_larger_than_the_write_unit_is_warned_about_and_fails_verify() {
    let (p, u, _) = small_log("geometry-block");
    refused_alike(
        &p,
        &format!("physical_block={}", 2 * u),
        &[
            format!("physical block is {} B", 2 * u),
            format!("write unit of {u} B"),
            "needs a new format".into(),
        ],
    );
}

#[test]
fn a_maximum_transfer_below_the_write_unit_is_warned_about_and_fails_verify() {
    let (p, u, _) = small_log("geometry-transfer");
    refused_alike(
        &p,
        &format!("max_transfer={}", u / 2),
        &[
            format!("maximum transfer is {} B", u / 2),
            format!("write unit of {u} B"),
            format!("takes transfers of at least {u} B"),
        ],
    );
}

#[test]
fn a_queue_too_shallow_for_the_writer_is_warned_about_and_fails_verify() {
    let (p, _, _) = small_log("geometry-queue");
    refused_alike(
        &p,
        "queue_depth=4",
        &[
            "queue depth 4 is too shallow".into(),
            "lower max_writes_in_flight or max_flushes_in_flight".into(),
        ],
    );
}

/// A maximum transfer smaller than the maximum batch but at least U only splits the batches:
/// open takes it, so inspect and verify say nothing of it.
#[test]
fn a_maximum_transfer_that_only_splits_batches_is_no_warning() {
    let (p, u, batch) = small_log("geometry-split");
    assert!(batch >= 2 * u, "max batch {batch} B, write unit {u} B");
    // Half a batch: two pieces each, well within the queue (a transfer of one write unit would
    // cut a batch into so many pieces that the queue could not hold them: refused, as above).
    let geometry = format!("max_transfer={}", batch / 2);
    for cmd in ["inspect", "verify"] {
        let r = reshaped(&[cmd, "--device", &spec(&p)], &geometry);
        assert_eq!(r.code, 0, "{r}");
        assert!(!r.stdout.contains("WARNING"), "{r}");
        let j = reshaped(&[cmd, "--device", &spec(&p), "--json"], &geometry);
        assert!(j.json()["open_refused"].is_null(), "{j}");
    }
}

/// The seam only lowers what the device can do, so that the I/O it lets through stays valid.
#[test]
fn the_seam_refuses_a_transfer_or_queue_beyond_the_device_and_unknown_keys() {
    let d = temp_dir("geometry-seam");
    let p = formatted(&d);
    for (geometry, says) in [
        ("max_transfer=1G", "max_transfer"),
        ("queue_depth=100000", "queue_depth"),
        ("logical_block=4096", "unknown key"),
        ("physical_block=3000", "power of two"),
    ] {
        let r = reshaped(&["inspect", "--device", &spec(&p)], geometry);
        assert_eq!(r.code, 1, "{geometry}: {r}");
        assert!(
            r.stderr.contains("NVMQ_FAULT_GEOMETRY") && r.stderr.contains(says),
            "{geometry}: {r}"
        );
    }
}
