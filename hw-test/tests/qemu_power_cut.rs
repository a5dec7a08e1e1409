//! A power cut of the guest's NVMe through nvmq's NBD server: the guest's kernel NVMe driver
//! writes a pattern with O_DIRECT and flushes it, writes more without flushing, the host kills
//! QEMU and cuts the server's power; the image must hold the flushed pattern intact and each
//! sector of the unflushed writes either old or new. Needs QEMU (fails, never skips, without it).
use std::io::Write;
use std::path::PathBuf;

use hw_test::qemu::{Disk, GuestCmd, NbdServer, Rig, RigOptions, Stage};

const DISK_BYTES: u64 = 64 << 20;
const SECTOR: usize = 512;
const MARKER: &str = "NVMQ-POWER-CUT-NOW";

/// Sector `s` of a region tagged `tag`: "<tag><s, 6 digits>." repeated, cut at 512 bytes. The
/// guest builds the same bytes with awk (see `awk_pattern`), so every sector names its origin.
fn pattern(tag: char, sectors: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(sectors * SECTOR);
    for s in 0..sectors {
        let unit = format!("{tag}{s:06}.");
        let sector: Vec<u8> = unit.bytes().cycle().take(SECTOR).collect();
        out.extend_from_slice(&sector);
    }
    out
}

/// A shell pipeline writing `pattern(tag, sectors)` to the namespace at byte `seek_kib` KiB with
/// O_DIRECT, in `bs_kib` KiB writes; `fsync` adds the flush (dd's conv=fsync).
fn awk_pattern(tag: char, sectors: usize, seek_kib: usize, bs_kib: usize, fsync: bool) -> String {
    let count = sectors * SECTOR / (bs_kib * 1024);
    format!(
        "awk 'BEGIN {{ for (s = 0; s < {sectors}; s++) {{ u = sprintf(\"{tag}%06d.\", s); l = \"\"; \
         while (length(l) < 512) l = l u; printf \"%s\", substr(l, 1, 512) }} }}' | \
         dd of=\"$NVMQ_NVME_BLOCK\" bs={bs_kib}k count={count} seek={} iflag=fullblock oflag=direct{} 2>&1",
        seek_kib / bs_kib,
        if fsync { " conv=fsync" } else { "" }
    )
}

#[test]
fn qemu_nvme_power_cut_keeps_flushed_writes_and_tears_unflushed_ones_at_sectors() {
    let seed: u64 = std::env::var("NVMQ_NBD_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261129);
    let dir = std::env::temp_dir().join(format!("nvmq-power-cut-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let image: PathBuf = dir.join("nvme.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(DISK_BYTES)
        .unwrap();
    let server =
        NbdServer::start_power_cut(&image, &dir.join("nbd.sock")).unwrap_or_else(|e| panic!("{e}"));
    let rig = Rig::new(RigOptions {
        disk: Disk::Nbd {
            socket: server.socket().to_path_buf(),
        },
        logical_block_size: 4096,
        physical_block_size: 4096,
        ..RigOptions::default()
    })
    .unwrap_or_else(|e| panic!("QEMU rig cannot start: {e}"));

    // A: 64 KiB at 0, flushed. B: 256 KiB at 1 MiB and C: 32 KiB over A's second half, not
    // flushed. Then the marker, and the guest waits to be killed.
    let script = [
        awk_pattern('A', 128, 0, 64, true),
        awk_pattern('B', 512, 1024, 64, false),
        awk_pattern('C', 64, 32, 32, false),
        format!("echo {MARKER}"),
        "sleep 600".to_string(),
    ]
    .join(" && ");
    let run = rig
        .run_until_marker(
            &[GuestCmd::shell(script).in_stage(Stage::KernelNvme)],
            MARKER,
        )
        .unwrap_or_else(|e| panic!("QEMU run failed: {e}"));
    let output = &run.commands[0].output;
    assert!(output.contains(MARKER), "guest output:\n{output}");

    let stats = server.power_cut_server().unwrap().stats();
    assert!(
        stats.flushes >= 1 && stats.cached_writes >= 1,
        "the guest's flush and its unflushed writes did not reach the server as such: {stats:?}\n{output}"
    );
    let cut = server.cut(seed).unwrap_or_else(|e| panic!("{e}"));
    let _ = writeln!(
        std::io::stderr(),
        "qemu-power-cut: killed QEMU after {:.2?}; cut {cut}",
        run.killed_after
    );
    assert_eq!(cut.unflushed, stats.cached_writes);
    assert_eq!(cut.survived + cut.lost + cut.torn, cut.unflushed);
    drop(server);

    let img = std::fs::read(&image).unwrap();
    let a = pattern('A', 128);
    let b = pattern('B', 512);
    let c = pattern('C', 64);
    let zero = vec![0u8; SECTOR];
    assert_eq!(
        &img[..32768],
        &a[..32768],
        "seed {seed}: flushed pattern A damaged"
    );
    let sectors = |at: usize, new: &[u8], old: &[u8], what: &str| -> (usize, usize) {
        let (mut n, mut o) = (0, 0);
        for (s, (got, (nw, od))) in img[at..at + new.len()]
            .chunks(SECTOR)
            .zip(new.chunks(SECTOR).zip(old.chunks(SECTOR)))
            .enumerate()
        {
            if got == nw {
                n += 1;
            } else if got == od {
                o += 1;
            } else {
                panic!("seed {seed}: {what} sector {s} holds neither the old nor the new bytes");
            }
        }
        (n, o)
    };
    let (cn, co) = sectors(32768, &c, &a[32768..], "C over A");
    let old_b = zero.repeat(512);
    let (bn, bo) = sectors(1 << 20, &b, &old_b, "B");
    let _ = writeln!(
        std::io::stderr(),
        "qemu-power-cut: seed {seed}: C sectors new/old {cn}/{co}, B sectors new/old {bn}/{bo}"
    );
    let outside = img[65536..1 << 20]
        .iter()
        .chain(&img[(1 << 20) + b.len()..])
        .all(|&x| x == 0);
    assert!(
        outside,
        "seed {seed}: bytes written outside the three regions"
    );
    // Everything survived would mean nothing was cut; the crash model at this seed must show it.
    assert!(
        cut.lost + cut.torn > 0 && cn + bn < 64 + 512,
        "seed {seed}: the cut changed nothing: {cut}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
