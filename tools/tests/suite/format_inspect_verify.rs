//! `nvmq format`, `inspect` and `verify`, run as a user runs them.

use crate::common::*;
use nvmq_log::batch::BatchBuilder;
use nvmq_log::format::{BatchKind, RecordKind, LOG_START, SUPERBLOCK_B};

#[test]
fn format_creates_a_file_and_reports_the_device_in_text_and_json() {
    let d = temp_dir("format");
    let p = d.join("new.img");
    let r = nvmq(&["format", "--device", &spec(&p), "--size", "32M"]);
    assert_eq!(r.code, 0, "{r}");
    assert!(
        r.stdout.contains("formatted") && r.stdout.contains("(created)"),
        "{r}"
    );
    assert!(r.stdout.contains("volatile write cache yes"), "{r}");
    assert!(
        r.stdout.contains("atomic write unit    not reported"),
        "{r}"
    );
    assert!(
        r.stdout.contains("not available on the file backend"),
        "{r}"
    );
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 32 << 20);

    // Refused without --force, with the reason; the log is left as it was.
    let before = read_file(&p);
    let again = nvmq(&["format", "--device", &spec(&p)]);
    assert_eq!(again.code, 1, "{again}");
    assert!(
        again.stderr.contains("already holds an nvmq log") && again.stderr.contains("--force"),
        "{again}"
    );
    assert_eq!(read_file(&p), before);

    let forced = nvmq(&["format", "--device", &spec(&p), "--force", "--json"]);
    assert_eq!(forced.code, 0, "{forced}");
    let j = forced.json();
    assert_eq!(j["created"], false);
    assert_eq!(j["device"]["capacity"], 32u64 << 20);
    assert_eq!(j["device"]["volatile_write_cache"], true);
    assert_eq!(j["device"]["atomic_write_unit"], 0);
    assert!(j["device"]["model"].is_null());
    assert_eq!(j["log_start"], 2u64 << 20);
    assert_eq!(j["log_size"], 30u64 << 20);
    assert_ne!(
        read_file(&p)[..4096],
        before[..4096],
        "a new format id was written"
    );
}

#[test]
fn format_refuses_bad_sizes_and_missing_files_with_clear_errors() {
    let d = temp_dir("format-bad");
    let p = d.join("x.img");
    let r = nvmq(&["format", "--device", &spec(&p)]);
    assert_eq!(r.code, 1, "{r}");
    assert!(
        r.stderr.contains("does not exist") && r.stderr.contains("--size"),
        "{r}"
    );
    let r = nvmq(&["format", "--device", &spec(&p), "--size", "12parsecs"]);
    assert_eq!(r.code, 2, "{r}");
    assert!(
        r.stderr.contains("12parsecs") && r.stderr.contains("unknown unit"),
        "{r}"
    );
    let r = nvmq(&["format", "--device", &spec(&p), "--size", "8M"]);
    assert_eq!(r.code, 1, "{r}");
    assert!(r.stderr.contains("too small"), "{r}");
    let r = nvmq(&["format", "--device", &spec(&p), "--size", "40000"]);
    assert_eq!(r.code, 1, "{r}");
    assert!(r.stderr.contains("multiple of 4096"), "{r}");
    assert!(!p.exists(), "a failed create leaves no file behind");
    let leftovers: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
    assert!(
        leftovers.is_empty(),
        "no temporary file left: {leftovers:?}"
    );
}

#[test]
fn format_on_a_sim_device_reports_it() {
    let r = nvmq(&["format", "--device", "sim:capacity=64M,plp=true"]);
    assert_eq!(r.code, 0, "{r}");
    assert!(r.stdout.contains("volatile write cache no"), "{r}");
    assert!(r.stdout.contains("gone when the command exits"), "{r}");
}

#[test]
fn inspect_shows_positions_partitions_and_records_without_writing() {
    let d = temp_dir("inspect");
    let p = formatted(&d);
    append_records(&p, 5);
    let before = read_file(&p);
    let r = nvmq(&["inspect", "--device", &spec(&p)]);
    assert_eq!(r.code, 0, "{r}");
    for want in [
        "superblock A",
        "superblock B",
        "recovery point",
        "epoch",
        "head",
        "tail",
        "space",
        "orders/0",
    ] {
        assert!(r.stdout.contains(want), "missing {want:?}: {r}");
    }
    let j = nvmq(&["inspect", "--device", &spec(&p), "--records", "--json"]);
    assert_eq!(j.code, 0, "{j}");
    let v = j.json();
    assert_eq!(v["superblocks"][0]["valid"], true);
    assert_eq!(v["superblocks"][1]["valid"], true);
    let log = &v["log"];
    assert_eq!(log["end"]["kind"], "clean");
    assert!(log["tail"].as_u64().unwrap() > v["superblock"]["head"].as_u64().unwrap());
    assert_eq!(log["retained_records"], 5);
    let parts = v["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0]["topic"], "orders");
    assert_eq!(parts[0]["start_offset"], 0);
    assert_eq!(parts[0]["next_offset"], 5);
    let data: Vec<_> = v["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "data")
        .collect();
    assert_eq!(data.len(), 5);
    for (i, rec) in data.iter().enumerate() {
        assert_eq!(rec["offset"], i as u64);
        assert_eq!(rec["len"], format!("record number {i}").len() as u64);
    }
    let positions: Vec<u64> = data
        .iter()
        .map(|r| r["position"].as_u64().unwrap())
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    let human = nvmq(&["inspect", "--device", &spec(&p), "--records"]);
    assert!(
        human.stdout.contains(&format!(" {} ", positions[2])),
        "{human}"
    );
    assert_eq!(read_file(&p), before, "inspect never writes");
}

#[test]
fn inspect_names_a_damaged_superblock_copy_and_refuses_when_both_are() {
    let d = temp_dir("inspect-sb");
    let p = formatted(&d);
    append_records(&p, 2);
    flip(&p, 20);
    let r = nvmq(&["inspect", "--device", &spec(&p)]);
    assert_eq!(r.code, 0, "{r}");
    assert!(
        r.stdout
            .contains("superblock A         NOT VALID: checksum mismatch"),
        "{r}"
    );
    assert!(r.stdout.contains("using superblock     B"), "{r}");
    let j = nvmq(&["inspect", "--device", &spec(&p), "--json"]).json();
    assert_eq!(j["superblocks"][0]["valid"], false);
    assert_eq!(j["superblocks"][0]["fault"], "checksum mismatch");
    assert_eq!(j["superblocks"][1]["valid"], true);

    flip(&p, SUPERBLOCK_B + 20);
    let r = nvmq(&["inspect", "--device", &spec(&p)]);
    assert_eq!(r.code, 3, "{r}");
    assert!(
        r.stdout.contains("both superblock copies are damaged"),
        "{r}"
    );
    let v = nvmq(&["verify", "--device", &spec(&p), "--json"]);
    assert_eq!(v.code, 3, "{v}");
    assert_eq!(v.json()["verdict"], "damage");
    // Format treats a damaged log like a log: only --force erases it.
    let f = nvmq(&["format", "--device", &spec(&p)]);
    assert_eq!(f.code, 1, "{f}");
    assert!(
        f.stderr.contains("looks like a damaged nvmq log") && f.stderr.contains("--force"),
        "{f}"
    );
    let f = nvmq(&["format", "--device", &spec(&p), "--force"]);
    assert_eq!(f.code, 0, "{f}");
    assert_eq!(nvmq(&["verify", "--device", &spec(&p)]).code, 0);
}

#[test]
fn unformatted_and_missing_devices_are_clear_errors() {
    let d = temp_dir("unformatted");
    let p = d.join("zeros.img");
    std::fs::write(&p, vec![0u8; 8 << 20]).unwrap();
    for cmd in ["inspect", "verify"] {
        let r = nvmq(&[cmd, "--device", &spec(&p)]);
        assert_eq!(r.code, 1, "{r}");
        assert!(r.stderr.contains("holds no nvmq log"), "{r}");
        let r = nvmq(&[cmd, "--device", &spec(&d.join("missing.img"))]);
        assert_eq!(r.code, 1, "{r}");
        assert!(r.stderr.contains("does not exist"), "{r}");
        // A sim device starts blank.
        let r = nvmq(&[cmd, "--device", "sim"]);
        assert_eq!(r.code, 1, "{r}");
        assert!(r.stderr.contains("holds no nvmq log"), "{r}");
        let r = nvmq(&[cmd, "--device", &spec(&p), "--bogus"]);
        assert_eq!(r.code, 2, "{r}");
        assert!(r.stderr.contains("--bogus"), "{r}");
    }
}

#[test]
fn verify_passes_a_clean_log_and_never_changes_a_byte() {
    let d = temp_dir("verify-clean");
    let p = formatted(&d);
    append_records(&p, 8);
    let before = read_file(&p);
    let r = nvmq(&["verify", "--device", &spec(&p)]);
    assert_eq!(r.code, 0, "{r}");
    assert!(r.stdout.contains("result               OK"), "{r}");
    assert!(r.stdout.contains("8 records"), "{r}");
    let j = nvmq(&["verify", "--device", &spec(&p), "--json"]);
    assert_eq!(j.code, 0, "{j}");
    let v = j.json();
    assert_eq!(v["verdict"], "ok");
    assert_eq!(v["records"], 8);
    assert!(v["damage"].as_array().unwrap().is_empty());
    assert_eq!(read_file(&p), before, "verify never writes");
}

/// (batch position, record position) of every data record, as `inspect --records` lists them.
fn data_records(p: &std::path::Path) -> Vec<(u64, u64)> {
    let listing = nvmq(&["inspect", "--device", &spec(p), "--records", "--json"]).json();
    listing["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "data")
        .map(|r| {
            (
                r["batch"].as_u64().unwrap(),
                r["position"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The device offset of a log position in a 32 MiB device made by `formatted`.
/// "A" or "B": the valid superblock copy with the higher sequence, read from the file itself.
fn newest_superblock(p: &std::path::Path) -> &'static str {
    use nvmq_log::format::{superblock_offset, Superblock, SUPERBLOCK_LEN};
    let bytes = read_file(p);
    let seq = |slot: u8| {
        let at = superblock_offset(slot) as usize;
        Superblock::decode(&bytes[at..at + SUPERBLOCK_LEN], slot).map_or(0, |sb| sb.sequence)
    };
    if seq(0) > seq(1) {
        "A"
    } else {
        "B"
    }
}

fn device_offset(position: u64) -> u64 {
    LOG_START + position % (30 << 20)
}

#[test]
fn verify_reports_damage_inside_acknowledged_data_with_its_position() {
    let d = temp_dir("verify-damage");
    let p = formatted(&d);
    append_records(&p, 6);
    let (batch, pos) = data_records(&p)[1];
    // A bit flip in the payload of an acknowledged record (later batches vouch for it).
    flip(&p, device_offset(pos) + 44);
    let before = read_file(&p);
    let r = nvmq(&["verify", "--device", &spec(&p)]);
    assert_eq!(r.code, 3, "{r}");
    assert!(
        r.stdout.contains(&format!("DAMAGE at position {batch}")),
        "{r}"
    );
    assert!(
        r.stdout
            .contains(&format!("position {pos}: record checksum mismatch")),
        "{r}"
    );
    let j = nvmq(&["verify", "--device", &spec(&p), "--json"]);
    assert_eq!(j.code, 3);
    let v = j.json();
    assert_eq!(v["verdict"], "damage");
    assert_eq!(v["damage"][0]["position"], batch);
    assert_eq!(read_file(&p), before, "verify never writes, even on damage");
    let i = nvmq(&["inspect", "--device", &spec(&p), "--json"]);
    assert_eq!(i.code, 3, "{i}");
    let iv = i.json();
    assert_eq!(iv["damage_position"], batch);
    assert!(iv["log"].is_null(), "no scan results past damage");
    assert_eq!(
        iv["superblock"]["chosen"],
        newest_superblock(&p),
        "the superblock in use is still shown"
    );
    let ih = nvmq(&["inspect", "--device", &spec(&p)]);
    assert_eq!(ih.code, 3, "{ih}");
    assert!(
        ih.stdout.contains("recovery point")
            && ih.stdout.contains(&format!(
                "DAMAGE               damage inside acknowledged data at log position {batch}"
            )),
        "{ih}"
    );
}

#[test]
fn verify_lists_every_damaged_place_not_just_the_first() {
    let d = temp_dir("verify-two");
    let p = formatted(&d);
    append_records(&p, 8);
    let data = data_records(&p);
    flip(&p, device_offset(data[1].1) + 44);
    flip(&p, device_offset(data[4].1) + 44);
    let v = nvmq(&["verify", "--device", &spec(&p), "--json"]);
    assert_eq!(v.code, 3, "{v}");
    let found: Vec<u64> = v.json()["damage"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["position"].as_u64().unwrap())
        .collect();
    assert_eq!(found, vec![data[1].0, data[4].0], "{v}");
}

#[test]
fn verify_calls_a_torn_tail_past_the_durable_point_normal() {
    let d = temp_dir("verify-torn");
    let p = formatted(&d);
    append_records(&p, 3);
    let v = nvmq(&["inspect", "--device", &spec(&p), "--json"]).json();
    let tail = v["log"]["tail"].as_u64().unwrap();
    let epoch = v["superblock"]["epoch"].as_u64().unwrap();
    let fid = u64::from_str_radix(
        v["superblock"]["format_id"]
            .as_str()
            .unwrap()
            .trim_start_matches("0x"),
        16,
    )
    .unwrap();
    // A batch written at the tail that did not land whole: its header is intact, its record not.
    let mut buf = vec![0u8; 4096];
    let part = v["partitions"][0]["id"].as_u64().unwrap() as u32;
    let mut b = BatchBuilder::new(&mut buf, fid, epoch, tail);
    b.push(RecordKind::Data, part, 3, b"never acknowledged");
    let (len, _) = b.finish(4096, BatchKind::Records, tail, 0, 0);
    buf[100] ^= 0xff;
    poke(&p, device_offset(tail), &buf[..len]);
    let r = nvmq(&["verify", "--device", &spec(&p)]);
    assert_eq!(r.code, 0, "{r}");
    assert!(r.stdout.contains(&format!("torn tail at {tail}")), "{r}");
    let j = nvmq(&["verify", "--device", &spec(&p), "--json"]).json();
    assert_eq!(j["verdict"], "torn-tail");
    assert_eq!(j["end"]["kind"], "torn");
    assert_eq!(j["end"]["position"], tail);

    // Recovery cuts the torn batch and fences its epoch; what stays on disk past the new tail
    // is then no tear at all.
    append_records(&p, 0);
    let j = nvmq(&["verify", "--device", &spec(&p), "--json"]);
    assert_eq!(j.code, 0, "{j}");
    let v = j.json();
    assert_eq!(v["verdict"], "ok", "{j}");
    assert_eq!(v["end"]["kind"], "fenced", "{j}");
    assert_eq!(v["end"]["position"], tail);
}

#[test]
fn inspect_and_verify_run_beside_a_writer_that_format_and_a_second_writer_are_refused_by() {
    let d = temp_dir("beside-writer");
    let p = formatted(&d);
    append_records(&p, 20);
    // This process holds the device as a running broker would: read-write, locked.
    let writer = blockdev::file::FileDevice::open(&p, blockdev::file::FileOptions::default())
        .expect("open the device as its writer");
    let before = read_file(&p);

    let inspect = nvmq(&["inspect", "--device", &spec(&p), "--json"]);
    assert_eq!(inspect.code, 0, "{inspect}");
    let verify = nvmq(&["verify", "--device", &spec(&p)]);
    assert_eq!(verify.code, 0, "{verify}");
    assert!(verify.stdout.contains("20 records"), "{verify}");

    let format = nvmq(&["format", "--device", &spec(&p), "--force"]);
    assert_eq!(format.code, 1, "{format}");
    assert!(
        format
            .stderr
            .contains("another process has it open for writing"),
        "{format}"
    );
    assert_eq!(
        read_file(&p),
        before,
        "nothing was written beside the writer"
    );
    drop(writer);
    let format = nvmq(&["format", "--device", &spec(&p), "--force"]);
    assert_eq!(format.code, 0, "{format}");
}

#[test]
fn format_inspect_and_verify_take_every_device_of_a_broker() {
    let d = temp_dir("devices");
    let (a, b) = (d.join("a.img"), d.join("b.img"));
    let (sa, sb) = (spec(&a), spec(&b));
    let r = nvmq(&["format", "--device", &sa, "--device", &sb, "--size", "32M"]);
    assert_eq!(r.code, 0, "{r}");
    assert!(
        r.stdout.contains(&format!("== device 0: {sa}"))
            && r.stdout.contains(&format!("== device 1: {sb}")),
        "{r}"
    );
    assert!(a.exists() && b.exists());
    let r = nvmq(&["inspect", "--device", &sa, "--device", &sb, "--json"]);
    assert_eq!(r.code, 0, "{r}");
    let lines: Vec<&str> = r.stdout.lines().filter(|l| l.starts_with('{')).collect();
    assert_eq!(lines.len(), 2, "one JSON object per device: {r}");
    let r = nvmq(&["verify", "--device", &sa, "--device", &sb]);
    assert_eq!(r.code, 0, "{r}");
    // One bad device among good ones: the command says which, and fails.
    let missing = spec(&d.join("missing.img"));
    let r = nvmq(&["verify", "--device", &sa, "--device", &missing]);
    assert_eq!(r.code, 1, "{r}");
    assert!(r.stderr.contains("device 1"), "{r}");
}
