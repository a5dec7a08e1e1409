//! What is particular to the file device's engines beyond the contract suite (tests/contract.rs,
//! which runs on both): choosing and reporting the engine, a ring that cannot be set up, dropping
//! a device with I/O in the kernel, and failures reported the same way by both engines.
//!
//! Without io_uring these tests fail, naming the reason, unless `NVMQ_NO_IO_URING=1` says the
//! machine is expected to lack it (then they print a loud notice and skip).

mod file_support;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use blockdev::file::{fail_next_io_uring_setup, Engine, FileDevice, FileOptions};
use blockdev::{flush_sync, read_sync, write_sync, BlockDevice, Completion, DeviceError, Op};
use file_support::{io_uring_or_skip, plain_file, scratch};

fn opts(engine: Engine) -> FileOptions {
    FileOptions {
        engine,
        ..FileOptions::default()
    }
}

/// Waits until `want` completions have arrived (at most ten seconds).
fn collect(dev: &mut FileDevice, want: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    for _ in 0..100 {
        if out.len() >= want {
            break;
        }
        dev.wait(&mut out, Duration::from_millis(100)).unwrap();
    }
    assert_eq!(out.len(), want, "completions");
    out
}

fn block_size(dev: &FileDevice) -> u64 {
    u64::from(dev.info().logical_block_size)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn write_block(dev: &mut FileDevice, lba: u64, data: &[u8]) {
    let mut b = dev.alloc_buffer(data.len()).unwrap();
    b.copy_from_slice(data);
    write_sync(dev, lba, b).unwrap();
}

fn read_block(dev: &mut FileDevice, lba: u64, len: usize) -> Vec<u8> {
    let b = dev.alloc_buffer(len).unwrap();
    read_sync(dev, lba, b).unwrap().to_vec()
}

/// A scratch file of `size` bytes and an io_uring device on it, or `None` when io_uring is expected
/// to be missing (see [`io_uring_or_skip`]).
fn uring_device(test: &str, size: u64) -> Option<(tempfile::TempDir, PathBuf, FileDevice)> {
    if !io_uring_or_skip(test) {
        return None;
    }
    let dir = scratch();
    let p = plain_file(dir.path(), "dev", size);
    let dev = FileDevice::open(&p, opts(Engine::IoUring)).unwrap();
    Some((dir, p, dev))
}

#[test]
fn the_engine_is_chosen_and_reported() {
    if !io_uring_or_skip("the_engine_is_chosen_and_reported") {
        return;
    }
    let dir = scratch();
    let p = plain_file(dir.path(), "dev", 1 << 20);
    let cases = [
        (
            Engine::IoUring,
            4,
            "io_uring (ring of 256, 4 flush descriptions)",
        ),
        (
            Engine::Auto,
            4,
            "io_uring (ring of 256, 4 flush descriptions)",
        ),
        (
            Engine::Threads,
            4,
            "threads (4 I/O threads, 4 flush descriptions)",
        ),
        (
            Engine::IoUring,
            1,
            "io_uring (ring of 256, 1 flush description)",
        ),
        (
            Engine::Threads,
            64,
            "threads (4 I/O threads, 64 flush descriptions)",
        ),
    ];
    for (asked, descriptions, words) in cases {
        let runs = if asked == Engine::Threads {
            Engine::Threads
        } else {
            Engine::IoUring
        };
        let o = FileOptions {
            flush_descriptions: descriptions,
            ..opts(asked)
        };
        let dev = FileDevice::open(&p, o).unwrap();
        assert_eq!(dev.engine(), runs, "{asked}");
        assert_eq!(dev.info().engine, words, "{asked}");
        assert!(dev.info().linked_flush);
        assert!(format!("{dev:?}").contains(&format!("engine: {runs:?}")));
    }
    // A read-only open flushes nothing and opens no flush description.
    let ro = FileOptions {
        read_only: true,
        ..opts(Engine::IoUring)
    };
    let dev = FileDevice::open(&p, ro).unwrap();
    assert_eq!(dev.info().engine, "io_uring (ring of 256)");
    assert!(!dev.info().linked_flush);
    drop(dev);
    for bad in [0, 65] {
        let o = FileOptions {
            flush_descriptions: bad,
            ..opts(Engine::Threads)
        };
        let e = FileDevice::open(&p, o).unwrap_err().to_string();
        assert!(
            e.contains("flush_descriptions must be from 1 to 64") && e.contains(&bad.to_string()),
            "{e}"
        );
    }
    assert_eq!("uring".parse::<Engine>(), Ok(Engine::IoUring));
    assert_eq!("threads".parse::<Engine>(), Ok(Engine::Threads));
    assert_eq!("auto".parse::<Engine>(), Ok(Engine::Auto));
    let e = "fast".parse::<Engine>().unwrap_err().to_string();
    assert!(
        e.contains("\"fast\"") && e.contains("uring, threads, auto"),
        "{e}"
    );
}

#[test]
fn a_ring_that_cannot_be_set_up_is_named_and_auto_falls_back_to_threads() {
    let dir = scratch();
    let p = plain_file(dir.path(), "dev", 1 << 20);
    let cases = [
        (libc::EPERM, "not permitted"),
        (libc::ENOSYS, "has no io_uring"),
        (libc::ENOMEM, "RLIMIT_MEMLOCK"),
    ];
    for (errno, why) in cases {
        fail_next_io_uring_setup(errno);
        match FileDevice::open(&p, opts(Engine::IoUring)) {
            Err(DeviceError::Open { op, path, detail }) => {
                assert_eq!(op, Op::Open);
                assert!(path.ends_with("dev"), "{path}");
                assert!(
                    detail.contains("cannot set up io_uring") && detail.contains(why),
                    "{errno}: {detail}"
                );
            }
            Err(e) => panic!("{errno}: expected an Open error, got {e}"),
            Ok(_) => panic!("{errno}: opened although the ring could not be set up"),
        }
        // The failed open left no lock behind, and Auto runs on the threads instead.
        fail_next_io_uring_setup(errno);
        let mut dev = FileDevice::open(&p, opts(Engine::Auto)).unwrap();
        assert_eq!(dev.engine(), Engine::Threads);
        let words = &dev.info().engine;
        assert!(
            words.starts_with(
                "threads (4 I/O threads, 1 flush description; io_uring unavailable: cannot set \
                 up io_uring"
            ) && words.contains(why),
            "{words}"
        );
        write_block(&mut dev, 3, &pattern(errno as u8, 4096));
        assert_eq!(read_block(&mut dev, 3, 4096), pattern(errno as u8, 4096));
    }
}

/// A device dropped with writes, reads and flushes in the kernel neither hangs nor frees a buffer
/// the kernel still uses: the drop waits for every I/O, the writes land, and memory allocated right
/// after the drop is not written by reads that were still running.
#[test]
fn drop_with_io_in_flight_waits_for_the_kernel() {
    if !io_uring_or_skip("drop_with_io_in_flight_waits_for_the_kernel") {
        return;
    }
    const LEN: usize = 64 << 10;
    const MARK: u8 = 0xC3;
    // Writes go to the first 8 MiB, reads come from 16 MiB on (marked beforehand).
    const READS_AT: u64 = 16 << 20;
    let dir = scratch();
    let p = plain_file(dir.path(), "dev", 32 << 20);
    {
        let mut dev = FileDevice::open(&p, opts(Engine::Threads)).unwrap();
        let (reads, stride) = (READS_AT / block_size(&dev), LEN as u64 / block_size(&dev));
        let mut b = dev.alloc_buffer(LEN).unwrap();
        b.fill(MARK);
        for k in 0..64 {
            b = write_sync(&mut dev, reads + k * stride, b).unwrap();
        }
        flush_sync(&mut dev).unwrap();
    }
    for round in 0..5u8 {
        let mut dev = FileDevice::open(&p, opts(Engine::IoUring)).unwrap();
        let depth = dev.queue_depth() as u64;
        let (reads, stride) = (READS_AT / block_size(&dev), LEN as u64 / block_size(&dev));
        assert_eq!(depth, 256);
        let mut k = 0u64;
        while k + 2 < depth {
            let mut w = dev.alloc_buffer(LEN).unwrap();
            w.copy_from_slice(&pattern(round.wrapping_add(k as u8), LEN));
            dev.submit_write(k, (k / 2) * stride, w).unwrap();
            let r = dev.alloc_buffer(LEN).unwrap();
            dev.submit_read(k + 1, reads + (k / 2 % 64) * stride, r)
                .unwrap();
            k += 2;
        }
        dev.submit_flush(k).unwrap();
        // All of it reaches the kernel now (one io_uring_enter); the device drops while it runs.
        let mut out = Vec::new();
        dev.poll(&mut out).unwrap();
        let delivered = out.len();
        drop(out);
        assert!(dev.in_flight() > 0, "everything finished before the drop");

        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            drop(dev);
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                panic!("round {round}: dropping the device hung ({delivered} delivered)")
            });

        // Memory of the size the reads used, taken right after the drop, keeps what we put there.
        let mut fresh: Vec<Vec<u8>> = (0..256).map(|_| vec![0x5A; LEN]).collect();
        std::thread::sleep(Duration::from_millis(20));
        for (i, v) in fresh.iter_mut().enumerate() {
            assert!(
                v.iter().all(|&x| x == 0x5A),
                "round {round}: memory {i} allocated after the drop was written"
            );
        }

        // Every write landed (the drop waited for them).
        let mut check = FileDevice::open(&p, opts(Engine::Threads)).unwrap();
        for slot in 0..(depth / 2 - 1) {
            let lba = slot * stride;
            let want = pattern(round.wrapping_add((slot * 2) as u8), LEN);
            assert!(
                read_block(&mut check, lba, LEN) == want,
                "round {round}: the write at block {lba} did not land"
            );
        }
    }
}

/// A flush submitted after writes were delivered covers them; the data is there for another
/// engine after the device is closed.
#[test]
fn a_flush_after_delivered_writes_covers_them() {
    let Some((_dir, p, mut dev)) =
        uring_device("a_flush_after_delivered_writes_covers_them", 4 << 20)
    else {
        return;
    };
    let per = 8192 / block_size(&dev);
    for k in 0..8u64 {
        let mut b = dev.alloc_buffer(8192).unwrap();
        b.copy_from_slice(&pattern(k as u8, 8192));
        dev.submit_write(k, k * per, b).unwrap();
    }
    let mut done = collect(&mut dev, 8);
    done.sort_by_key(|c| c.tag);
    for (k, c) in done.iter().enumerate() {
        assert_eq!((c.tag, c.op, c.lba), (k as u64, Op::Write, k as u64 * per));
        c.result.as_ref().unwrap();
        assert_eq!(c.buffer.as_deref(), Some(&pattern(k as u8, 8192)[..]));
    }
    dev.submit_flush(99).unwrap();
    let f = collect(&mut dev, 1).pop().unwrap();
    assert_eq!((f.tag, f.op, f.lba), (99, Op::Flush, 0));
    f.result.unwrap();
    assert!(f.buffer.is_none());
    assert_eq!(dev.in_flight(), 0);
    // Nothing in flight: wait returns at once.
    let t = std::time::Instant::now();
    assert_eq!(
        dev.wait(&mut Vec::new(), Duration::from_secs(5)).unwrap(),
        0
    );
    assert!(t.elapsed() < Duration::from_secs(1));
    drop(dev);
    let mut other = FileDevice::open(&p, opts(Engine::Threads)).unwrap();
    for k in 0..8u64 {
        let got = read_block(&mut other, k * per, 8192);
        assert!(
            got == pattern(k as u8, 8192),
            "block {}: {:?}...",
            k * per,
            &got[..8]
        );
    }
}

/// What each engine does after a flush fails, and on a file that shrank under it; both must give
/// the same errors.
fn failures(engine: Engine, p: &Path) -> (DeviceError, Vec<DeviceError>, DeviceError) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(p)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let mut dev = FileDevice::open(p, opts(engine)).unwrap();
    assert_eq!(dev.engine(), engine);
    // The file shrinks behind the device's back: a read across the new end is short, then ends.
    std::fs::OpenOptions::new()
        .write(true)
        .open(p)
        .unwrap()
        .set_len(8192)
        .unwrap();
    let b = dev.alloc_buffer(16384).unwrap();
    let short = read_sync(&mut dev, 0, b).unwrap_err();

    write_block(&mut dev, 0, &pattern(1, 4096));
    dev.inject_flush_failure(libc::EIO);
    let failed = flush_sync(&mut dev).unwrap_err();
    let (w, r) = (
        dev.alloc_buffer(4096).unwrap(),
        dev.alloc_buffer(4096).unwrap(),
    );
    let after = vec![
        dev.submit_write(1, 0, w).unwrap_err(),
        dev.submit_read(2, 0, r).unwrap_err(),
        dev.submit_flush(3).unwrap_err(),
    ];
    assert_eq!(dev.in_flight(), 0);
    (short, after, failed)
}

#[test]
fn both_engines_fail_the_same_way() {
    if !io_uring_or_skip("both_engines_fail_the_same_way") {
        return;
    }
    let dir = scratch();
    let p = plain_file(dir.path(), "dev", 1 << 20);
    let threads = failures(Engine::Threads, &p);
    let uring = failures(Engine::IoUring, &p);
    assert_eq!(uring, threads);
    let (short, after, failed) = uring;
    assert_eq!(
        short,
        DeviceError::Io {
            op: Op::Read,
            lba: 0,
            detail: "short read made no progress after 8192 of 16384 bytes (the file ended or \
                     shrank)"
                .into()
        }
    );
    assert!(
        matches!(&failed, DeviceError::Io { op: Op::Flush, lba: 0, detail } if detail.contains("Input/output error")),
        "{failed}"
    );
    assert_eq!(
        after,
        vec![
            DeviceError::Stopped {
                op: Op::Write,
                lba: 0
            },
            DeviceError::Stopped {
                op: Op::Read,
                lba: 0
            },
            DeviceError::Stopped {
                op: Op::Flush,
                lba: 0
            },
        ]
    );
}

/// Runs `f` on a new device of each engine (io_uring only where it can be set up, see
/// [`io_uring_or_skip`]) with one flush description.
fn on_each_engine(test: &str, f: impl Fn(Engine, &mut FileDevice)) {
    for engine in [Engine::Threads, Engine::IoUring] {
        if engine == Engine::IoUring && !io_uring_or_skip(test) {
            continue;
        }
        let dir = scratch();
        let p = plain_file(dir.path(), "dev", 1 << 20);
        let o = FileOptions {
            flush_descriptions: 1,
            ..opts(engine)
        };
        let mut dev = FileDevice::open(&p, o).unwrap();
        f(engine, &mut dev);
        assert_eq!(dev.in_flight(), 0, "{engine}");
    }
}

/// With one flush description, flushes run one at a time: several submitted back to back are
/// answered in order, and when the first fails, every one behind it fails too. Run at once on one
/// description, a later `fdatasync` could take no error for write-back that failed (the kernel
/// reports it once per description) and complete first. (`file_flushes.rs`: several descriptions.)
#[test]
fn flushes_behind_a_failed_flush_all_fail_in_order() {
    on_each_engine(
        "flushes_behind_a_failed_flush_all_fail_in_order",
        |engine, dev| {
            write_block(dev, 0, &pattern(7, 4096));
            dev.inject_flush_failure(libc::EIO);
            for tag in 0..4 {
                dev.submit_flush(tag).unwrap();
            }
            let done = collect(dev, 4);
            let order: Vec<u64> = done.iter().map(|c| c.tag).collect();
            assert_eq!(order, vec![0, 1, 2, 3], "{engine}: {done:?}");
            assert!(
                matches!(&done[0].result, Err(DeviceError::Io { op: Op::Flush, .. })),
                "{engine}: {done:?}"
            );
            for c in &done[1..] {
                assert_eq!(
                    c.result,
                    Err(DeviceError::Stopped {
                        op: Op::Flush,
                        lba: 0
                    }),
                    "{engine}"
                );
            }
        },
    );
}

/// With one flush description, flushes submitted while one runs share the next `fdatasync` and all
/// succeed on a healthy file, in order.
#[test]
fn flushes_submitted_while_one_runs_all_complete() {
    on_each_engine(
        "flushes_submitted_while_one_runs_all_complete",
        |engine, dev| {
            for round in 0..20u64 {
                write_block(dev, round % 8, &pattern(round as u8, 4096));
                for k in 0..5 {
                    dev.submit_flush(round * 5 + k).unwrap();
                }
                let done = collect(dev, 5);
                let order: Vec<u64> = done.iter().map(|c| c.tag).collect();
                assert_eq!(
                    order,
                    (round * 5..round * 5 + 5).collect::<Vec<_>>(),
                    "{engine}"
                );
                assert!(done.iter().all(|c| c.result.is_ok()), "{engine}: {done:?}");
            }
        },
    );
}
