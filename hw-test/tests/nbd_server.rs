//! The power-cut NBD server through a real socket and a minimal NBD client: negotiation, the
//! volatile cache and its flush, the seeded power cut, FUA, and what bad input gets.
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use blockdev::sim::Rng;
use hw_test::nbd::{control, list_exports, Client, NbdError, Server, ServerConfig};
use hw_test::nbd::{CMD_READ, CMD_WRITE, EINVAL, ENOSPC};

const SIZE: u64 = 1 << 20;
const SECTOR: usize = 512;

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("nvmq-nbd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    fn image(&self) -> PathBuf {
        let p = self.0.join("disk.img");
        std::fs::File::create(&p).unwrap().set_len(SIZE).unwrap();
        p
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start(dir: &Dir) -> (Server, PathBuf) {
    let image = dir.image();
    let mut cfg = ServerConfig::new(&image, dir.0.join("nbd.sock"));
    cfg.log = false;
    (Server::start(cfg).unwrap(), image)
}

/// Bytes unique to (write number, sector), so any sector on the image names its origin.
fn pattern(write: u32, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    for (sector, chunk) in out.chunks_mut(SECTOR).enumerate() {
        Rng::new((u64::from(write) << 32) | sector as u64).fill(chunk);
    }
    out
}

#[test]
fn nbd_negotiation_go_export_name_and_list() {
    let dir = Dir::new("negotiate");
    let (server, _) = start(&dir);
    let c = Client::connect(server.socket(), "nvmq").unwrap();
    assert_eq!(c.size(), SIZE);
    // HAS_FLAGS, SEND_FLUSH, SEND_FUA: exactly what is implemented.
    assert_eq!(c.flags(), 1 | 4 | 8);
    let c2 = Client::connect(server.socket(), "").unwrap();
    assert_eq!(c2.size(), SIZE);
    let mut c3 = Client::connect_export_name(server.socket(), "nvmq").unwrap();
    assert_eq!(c3.size(), SIZE);
    c3.write(0, &pattern(1, 4096), false).unwrap();
    assert_eq!(
        list_exports(server.socket()).unwrap(),
        vec!["nvmq".to_string()]
    );
    let err = Client::connect(server.socket(), "other")
        .err()
        .expect("unknown export accepted");
    assert!(
        err.to_string().contains("no export named \"other\""),
        "{err}"
    );
    c.disconnect().unwrap();
}

#[test]
fn nbd_writes_are_cached_until_a_flush_puts_them_on_the_image() {
    let dir = Dir::new("flush");
    let (server, image) = start(&dir);
    let mut c = Client::connect(server.socket(), "nvmq").unwrap();
    let data = pattern(7, 8192);
    c.write(65536, &data, false).unwrap();
    assert_eq!(c.read(65536, 8192).unwrap(), data, "a read sees the cache");
    let on_image = std::fs::read(&image).unwrap();
    assert!(
        on_image.iter().all(|&b| b == 0),
        "an unflushed write reached the image"
    );
    assert_eq!(server.stats().cached_writes, 1);
    c.flush().unwrap();
    let on_image = std::fs::read(&image).unwrap();
    assert_eq!(&on_image[65536..65536 + 8192], &data[..]);
    assert_eq!(server.stats().cached_writes, 0);
    // A partial overwrite in the cache reads merged with what is on the image.
    let over = pattern(8, 512);
    c.write(65536 + 1024, &over, false).unwrap();
    let back = c.read(65536, 8192).unwrap();
    assert_eq!(&back[..1024], &data[..1024]);
    assert_eq!(&back[1024..1536], &over[..]);
    assert_eq!(&back[1536..], &data[1536..]);
}

/// What the image holds for each write after a cut: per sector, the write's bytes or the base.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Whole,
    Absent,
    Torn,
}

/// Flushed base everywhere, then unflushed writes at distinct places, then a cut with `seed`.
/// Returns the image and what became of each write.
fn cut_run(seed: u64, writes: u32) -> (Vec<u8>, Vec<Seen>, hw_test::nbd::CutOutcome) {
    let dir = Dir::new(&format!("cut-{seed}"));
    let (server, image) = start(&dir);
    let mut c = Client::connect(server.socket(), "nvmq").unwrap();
    let base = pattern(0, SIZE as usize);
    c.write(0, &base, false).unwrap();
    c.flush().unwrap();
    let len = 8 * SECTOR;
    for w in 1..=writes {
        c.write(u64::from(w) * 16384, &pattern(w, len), false)
            .unwrap();
    }
    let out = server.cut(Some(seed)).unwrap();
    let err = c.read(0, 512).err();
    assert!(err.is_some(), "a connection survived the power cut");
    let img = std::fs::read(&image).unwrap();
    let mut seen = Vec::new();
    for w in 1..=writes {
        let off = w as usize * 16384;
        let new = pattern(w, len);
        let (mut n, mut o) = (0, 0);
        for s in 0..8 {
            let r = s * SECTOR..(s + 1) * SECTOR;
            let got = &img[off + r.start..off + r.end];
            if got == &new[r.clone()] {
                n += 1;
            } else if got == &base[off + r.start..off + r.end] {
                o += 1;
            } else {
                panic!(
                    "seed {seed}: write {w} sector {s} holds neither its bytes nor the old ones"
                );
            }
        }
        seen.push(match (n, o) {
            (8, 0) => Seen::Whole,
            (0, 8) => Seen::Absent,
            _ => Seen::Torn,
        });
    }
    // Outside the unflushed writes the flushed base is intact.
    for (i, (a, b)) in img.iter().zip(&base).enumerate() {
        let w = i / 16384;
        let inside = (1..=writes as usize).contains(&w) && i % 16384 < len;
        assert!(inside || a == b, "seed {seed}: flushed byte {i} changed");
    }
    // The power came back: a new connection reads what the image holds, with an empty cache.
    let mut again = Client::connect(server.socket(), "nvmq").unwrap();
    assert_eq!(again.read(16384, 4096).unwrap(), img[16384..16384 + 4096]);
    assert_eq!(server.stats().cached_writes, 0);
    (img, seen, out)
}

#[test]
fn nbd_cut_loses_or_tears_unflushed_writes_per_seed_and_keeps_flushed_ones() {
    for seed in [1u64, 2, 3] {
        let (img, seen, out) = cut_run(seed, 30);
        let count = |k: Seen| seen.iter().filter(|s| **s == k).count() as u64;
        assert_eq!(out.unflushed, 30, "seed {seed}");
        assert_eq!(
            (out.survived, out.lost, out.torn),
            (count(Seen::Whole), count(Seen::Absent), count(Seen::Torn)),
            "seed {seed}: the report disagrees with the image"
        );
        assert!(
            out.survived > 0 && out.lost > 0 && out.torn > 0,
            "seed {seed}: 30 writes should show every fate: {out}"
        );
        let (img2, seen2, out2) = cut_run(seed, 30);
        assert_eq!((&seen2, &out2), (&seen, &out), "seed {seed} did not replay");
        assert!(img2 == img, "seed {seed}: same seed, different image");
    }
    let (a, _, _) = cut_run(11, 30);
    let (b, _, _) = cut_run(12, 30);
    assert!(a != b, "seeds 11 and 12 gave the same cut");
}

#[test]
fn nbd_fua_write_survives_a_cut_and_older_cached_bytes_never_return_over_it() {
    let dir = Dir::new("fua");
    let (server, image) = start(&dir);
    let mut c = Client::connect(server.socket(), "nvmq").unwrap();
    let old = pattern(1, 4096);
    let fua = pattern(2, 4096);
    for seed in 0..20u64 {
        c.write(0, &old, false).unwrap();
        c.write(0, &fua, true).unwrap();
        c.write(8192, &fua, true).unwrap();
        server.cut(Some(seed)).unwrap();
        let img = std::fs::read(&image).unwrap();
        assert_eq!(
            &img[..4096],
            &fua[..],
            "seed {seed}: cached older write landed over FUA"
        );
        assert_eq!(&img[8192..12288], &fua[..], "seed {seed}");
        c = Client::connect(server.socket(), "nvmq").unwrap();
    }
    assert_eq!(server.stats().fua_writes, 40);
}

fn errno<T: std::fmt::Debug>(r: Result<T, NbdError>) -> u32 {
    match r {
        Err(NbdError::Request { errno, .. }) => errno,
        other => panic!("expected an error reply, got {other:?}"),
    }
}

#[test]
fn nbd_bad_requests_get_errors_and_leave_other_connections_alone() {
    let dir = Dir::new("bad");
    let (server, _) = start(&dir);
    let mut good = Client::connect(server.socket(), "nvmq").unwrap();
    good.write(0, &pattern(3, 4096), false).unwrap();
    let mut c = Client::connect(server.socket(), "nvmq").unwrap();
    assert_eq!(errno(c.read(SIZE, 512)), EINVAL, "read past the end");
    assert_eq!(
        errno(c.read(u64::MAX - 511, 512)),
        EINVAL,
        "offset + length overflows"
    );
    assert_eq!(errno(c.read(100, 512)), EINVAL, "unaligned read");
    assert_eq!(
        errno(c.write(SIZE - 512, &[1u8; 1024], false)),
        ENOSPC,
        "write past the end"
    );
    assert_eq!(
        errno(c.write(0, &[1u8; 100], false)),
        EINVAL,
        "unaligned length"
    );
    let (e, _) = c.request(CMD_READ, 0, 0, 64 << 20, &[], 0).unwrap();
    assert_eq!(e, EINVAL, "oversized read");
    let (e, _) = c.request(CMD_READ, 1 << 7, 0, 512, &[], 0).unwrap();
    assert_eq!(e, EINVAL, "unknown command flag");
    let (e, _) = c.request(77, 0, 0, 0, &[], 0).unwrap();
    assert_eq!(e, EINVAL, "unknown command");
    // Still usable after those.
    assert_eq!(c.read(0, 4096).unwrap(), pattern(3, 4096));
    // An oversized write cannot be skipped: the server hangs up on that connection only.
    let r = c.request(CMD_WRITE, 0, 0, u32::MAX, &[], 0);
    assert!(r.is_err(), "an oversized write was answered: {r:?}");
    // A broken request header and a broken handshake: dropped, nothing else.
    let mut raw = UnixStream::connect(server.socket()).unwrap();
    let mut greet = [0u8; 18];
    raw.read_exact(&mut greet).unwrap();
    raw.write_all(&[0xff; 4]).unwrap(); // unknown client flags
    let mut rest = Vec::new();
    let _ = raw.read_to_end(&mut rest);
    assert!(rest.is_empty());
    let mut raw = UnixStream::connect(server.socket()).unwrap();
    raw.read_exact(&mut greet).unwrap();
    raw.write_all(&1u32.to_be_bytes()).unwrap();
    raw.write_all(&0x4948_4156_454f_5054u64.to_be_bytes())
        .unwrap();
    raw.write_all(&7u32.to_be_bytes()).unwrap();
    raw.write_all(&u32::MAX.to_be_bytes()).unwrap(); // a 4 GiB option
    let _ = raw.read_to_end(&mut rest);
    assert!(rest.is_empty());
    assert_eq!(good.read(0, 4096).unwrap(), pattern(3, 4096));
    good.flush().unwrap();
}

#[test]
fn nbd_control_socket_cuts_reports_and_refuses_nonsense() {
    let dir = Dir::new("control");
    let (server, image) = start(&dir);
    let ctl = server.control_socket().unwrap().to_path_buf();
    assert_eq!(control::command(&ctl, "ping").unwrap(), "ok");
    let mut c = Client::connect(server.socket(), "nvmq").unwrap();
    for w in 0..10u32 {
        c.write(u64::from(w) * 4096, &pattern(w + 1, 4096), false)
            .unwrap();
    }
    let stats = control::command(&ctl, "stats").unwrap();
    assert!(
        stats.contains("writes=10") && stats.contains("cached_writes=10"),
        "{stats}"
    );
    let out = control::cut(&ctl, Some(5)).unwrap();
    assert_eq!(out.seed, 5);
    assert_eq!(out.unflushed, 10);
    assert_eq!(out.survived + out.lost + out.torn, 10);
    assert!(c.read(0, 512).is_err(), "the connection outlived the cut");
    let img = std::fs::read(&image).unwrap();
    let whole = (0..10u32)
        .filter(|&w| img[w as usize * 4096..(w as usize + 1) * 4096] == pattern(w + 1, 4096)[..])
        .count() as u64;
    assert_eq!(whole, out.survived);
    // A cut with nothing cached changes nothing; a cut without a seed takes the server's next.
    let empty = control::cut(&ctl, None).unwrap();
    assert_eq!(empty.unflushed, 0);
    assert_eq!(std::fs::read(&image).unwrap(), img);
    for bad in ["cut x", "explode", "cut 1 2"] {
        let err = control::command(&ctl, bad).unwrap_err();
        assert!(matches!(err, NbdError::Control { .. }), "{bad}: {err}");
    }
}

#[test]
fn nbd_an_oversized_cache_destages_its_oldest_writes() {
    let dir = Dir::new("destage");
    let image = dir.image();
    let mut cfg = ServerConfig::new(&image, dir.0.join("nbd.sock"));
    cfg.log = false;
    cfg.max_cached_bytes = 16384;
    let server = Server::start(cfg).unwrap();
    let mut c = Client::connect(server.socket(), "nvmq").unwrap();
    for w in 0..8u32 {
        c.write(u64::from(w) * 4096, &pattern(w + 1, 4096), false)
            .unwrap();
    }
    let s = server.stats();
    assert!(s.destaged > 0 && s.cached_bytes <= 16384, "{s:?}");
    let img = std::fs::read(&image).unwrap();
    assert_eq!(
        &img[..4096],
        &pattern(1, 4096)[..],
        "the oldest write was not destaged"
    );
    for w in 0..8u32 {
        assert_eq!(
            c.read(u64::from(w) * 4096, 4096).unwrap(),
            pattern(w + 1, 4096)
        );
    }
}

#[test]
fn nbd_binary_serves_and_takes_control_commands_from_the_command_line() {
    use std::process::{Command, Stdio};
    let bin = env!("CARGO_BIN_EXE_nvmq-nbd");
    let dir = Dir::new("binary");
    let image = dir.0.join("new.img");
    let socket = dir.0.join("nbd.sock");
    let ctl = dir.0.join("ctl.sock");
    let mut child = Command::new(bin)
        .arg("--image")
        .arg(&image)
        .args(["--size", "1048576", "--quiet"])
        .arg("--socket")
        .arg(&socket)
        .arg("--control")
        .arg(&ctl)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !ctl.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut c = Client::connect(&socket, "nvmq").unwrap();
    assert_eq!(c.size(), 1 << 20);
    for w in 0..6u32 {
        c.write(u64::from(w) * 4096, &pattern(w + 1, 4096), false)
            .unwrap();
    }
    let send = |cmd: &str| {
        Command::new(bin)
            .arg("--control")
            .arg(&ctl)
            .args(["--send", cmd])
            .output()
            .unwrap()
    };
    let out = send("cut 17");
    let reply = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{reply} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(reply.starts_with("ok cut seed=17 unflushed=6 "), "{reply}");
    let bad = send("melt");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown command"));
    let _ = child.kill();
    let _ = child.wait();
}
