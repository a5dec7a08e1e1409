//! The file device's flush descriptions, linked write+flush pairs and completion descriptor, on
//! both engines: flushes on different descriptions really run at once (one is held in the engine
//! while another completes), one description still runs one at a time, a failure still fails every
//! flush behind it, a linked flush never runs or succeeds without its whole write, and an event
//! loop that sleeps only on the completion descriptor never loses a wake-up.
//!
//! Without io_uring the io_uring half of each test fails naming the reason, unless
//! `NVMQ_NO_IO_URING=1` says that is expected (see `file_support`).

mod file_support;

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use blockdev::file::{fd_readable, Engine, FileDevice, FileOptions};
use blockdev::{read_sync, BlockDevice, Completion, DeviceError, Op, Tag};
use file_support::{io_uring_or_skip, plain_file, scratch};

fn opts(engine: Engine, descriptions: usize) -> FileOptions {
    FileOptions {
        engine,
        flush_descriptions: descriptions,
        // Room for held flushes beside the ones that run.
        io_threads: 6,
        ..FileOptions::default()
    }
}

/// Runs `f` on a new device of each engine with `descriptions` flush descriptions (io_uring only
/// where it can be set up), then checks that nothing is left in flight.
fn on_each_engine(test: &str, descriptions: usize, f: impl Fn(Engine, &mut FileDevice, &PathBuf)) {
    for engine in [Engine::Threads, Engine::IoUring] {
        if engine == Engine::IoUring && !io_uring_or_skip(test) {
            continue;
        }
        let dir = scratch();
        let p = plain_file(dir.path(), "dev", 4 << 20);
        let mut dev = FileDevice::open(&p, opts(engine, descriptions)).unwrap();
        f(engine, &mut dev, &p);
        assert_eq!(dev.in_flight(), 0, "{engine}");
    }
}

/// Waits until `want` completions have arrived (at most ten seconds).
fn collect(dev: &mut FileDevice, want: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < want && Instant::now() < deadline {
        dev.wait(&mut out, Duration::from_millis(100)).unwrap();
    }
    assert_eq!(out.len(), want, "completions: {out:?}");
    out
}

/// Nothing completes for a while.
fn nothing_for(dev: &mut FileDevice, ms: u64) {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < deadline {
        dev.wait(&mut out, Duration::from_millis(20)).unwrap();
    }
    assert!(out.is_empty(), "{out:?}");
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn bs(dev: &FileDevice) -> u64 {
    u64::from(dev.info().logical_block_size)
}

fn write(dev: &mut FileDevice, tag: Tag, lba: u64, data: &[u8]) {
    let mut b = dev.alloc_buffer(data.len()).unwrap();
    b.copy_from_slice(data);
    dev.submit_write(tag, lba, b).unwrap();
}

fn read_back(dev: &mut FileDevice, lba: u64, len: usize) -> Vec<u8> {
    let b = dev.alloc_buffer(len).unwrap();
    read_sync(dev, lba, b).unwrap().to_vec()
}

fn stopped() -> Result<(), DeviceError> {
    Err(DeviceError::Stopped {
        op: Op::Flush,
        lba: 0,
    })
}

/// With four descriptions, a flush submitted while another is held in the engine runs beside it
/// and completes first. (With one description it would wait for the held one: the next test.)
#[test]
fn flushes_on_different_descriptions_run_at_once() {
    on_each_engine(
        "flushes_on_different_descriptions_run_at_once",
        4,
        |engine, dev, _| {
            let hold = dev.hold_next_flush().unwrap();
            dev.submit_flush(1).unwrap();
            write(dev, 2, 0, &pattern(1, 4096));
            let w = collect(dev, 1);
            assert_eq!((w[0].tag, w[0].op), (2, Op::Write), "{engine}");
            dev.submit_flush(3).unwrap();
            let f = collect(dev, 1);
            assert_eq!((f[0].tag, &f[0].result), (3, &Ok(())), "{engine}");
            assert_eq!(dev.in_flight(), 1, "{engine}: the held flush still runs");
            hold.release();
            let f = collect(dev, 1);
            assert_eq!((f[0].tag, &f[0].result), (1, &Ok(())), "{engine}");
        },
    );
}

/// With one description a flush waits for the held one and rides on the next `fdatasync`.
#[test]
fn one_description_runs_one_flush_at_a_time() {
    on_each_engine(
        "one_description_runs_one_flush_at_a_time",
        1,
        |engine, dev, _| {
            let hold = dev.hold_next_flush().unwrap();
            dev.submit_flush(1).unwrap();
            nothing_for(dev, 50);
            dev.submit_flush(2).unwrap();
            dev.submit_flush(3).unwrap();
            nothing_for(dev, 300);
            hold.release();
            let done = collect(dev, 3);
            let got: Vec<(Tag, bool)> = done.iter().map(|c| (c.tag, c.result.is_ok())).collect();
            assert_eq!(got, vec![(1, true), (2, true), (3, true)], "{engine}");
        },
    );
}

/// With two descriptions, one flush held and one failing: the failure fails the two flushes that
/// waited behind it, refuses what is submitted after it, and the held flush, whose `fdatasync`
/// succeeds after the failure, is not believed either.
#[test]
fn with_several_descriptions_a_failure_still_fails_every_flush_behind_it() {
    on_each_engine(
        "with_several_descriptions_a_failure_still_fails_every_flush_behind_it",
        2,
        |engine, dev, _| {
            let hold = dev.hold_next_flush().unwrap();
            dev.submit_flush(1).unwrap();
            dev.submit_flush(2).unwrap();
            // Both descriptions are busy: these wait, to ride on the next fdatasync.
            dev.submit_flush(3).unwrap();
            dev.submit_flush(4).unwrap();
            dev.inject_flush_failure(libc::EIO);
            let done = collect(dev, 3);
            let tags: Vec<Tag> = done.iter().map(|c| c.tag).collect();
            assert_eq!(tags, vec![2, 3, 4], "{engine}");
            assert!(
                matches!(&done[0].result, Err(DeviceError::Io { op: Op::Flush, detail, .. }) if detail.contains("Input/output error")),
                "{engine}: {done:?}"
            );
            assert_eq!(done[1].result, stopped(), "{engine}");
            assert_eq!(done[2].result, stopped(), "{engine}");
            assert_eq!(
                dev.submit_flush(5),
                Err(DeviceError::Stopped {
                    op: Op::Flush,
                    lba: 0
                })
            );
            hold.release();
            let held = collect(dev, 1);
            assert_eq!((held[0].tag, &held[0].result), (1, &stopped()), "{engine}");
        },
    );
}

/// Many flushes on four descriptions, submitted back to back behind writes, all succeed once each.
#[test]
fn flushes_on_four_descriptions_all_complete() {
    on_each_engine(
        "flushes_on_four_descriptions_all_complete",
        4,
        |engine, dev, _| {
            for round in 0..20u64 {
                write(dev, 1000 + round, round % 8, &pattern(round as u8, 4096));
                collect(dev, 1);
                for k in 0..8 {
                    dev.submit_flush(round * 8 + k).unwrap();
                }
                let mut done = collect(dev, 8);
                assert!(done.iter().all(|c| c.result.is_ok()), "{engine}: {done:?}");
                done.sort_by_key(|c| c.tag);
                let tags: Vec<Tag> = done.iter().map(|c| c.tag).collect();
                assert_eq!(
                    tags,
                    (round * 8..round * 8 + 8).collect::<Vec<_>>(),
                    "{engine}"
                );
            }
        },
    );
}

/// Linked pairs: the write's completion before its flush's, both successful, the data read back
/// by another device after the first is dropped.
#[test]
fn linked_pairs_complete_write_first_and_the_data_is_there() {
    on_each_engine("linked_pairs_complete_write_first", 4, |engine, dev, p| {
        let per = 8192 / bs(dev);
        for k in 0..12u64 {
            let mut b = dev.alloc_buffer(8192).unwrap();
            b.copy_from_slice(&pattern(k as u8, 8192));
            dev.submit_write_flush(k, k * per, b, 100 + k).unwrap();
        }
        assert_eq!(dev.in_flight(), 24);
        let done = collect(dev, 24);
        for k in 0..12u64 {
            let w = done.iter().position(|c| c.tag == k).unwrap();
            let f = done.iter().position(|c| c.tag == 100 + k).unwrap();
            assert!(w < f, "{engine}: pair {k}: flush before write");
            assert_eq!(
                (done[w].op, &done[w].result),
                (Op::Write, &Ok(())),
                "{engine}"
            );
            assert_eq!(
                (done[f].op, &done[f].result),
                (Op::Flush, &Ok(())),
                "{engine}"
            );
        }
        let mut other = FileDevice::open(
            p,
            FileOptions {
                read_only: true,
                ..FileOptions::default()
            },
        )
        .unwrap();
        for k in 0..12u64 {
            assert!(
                read_back(&mut other, k * per, 8192) == pattern(k as u8, 8192),
                "{engine}: {k}"
            );
        }
    });
}

/// A linked pair whose write fails: the flush fails too, naming the write, and never succeeds;
/// the device goes on (a failed write stops no flush), so a later flush works.
#[test]
fn a_linked_pair_whose_write_fails_fails_its_flush() {
    on_each_engine(
        "a_linked_pair_whose_write_fails_fails_its_flush",
        4,
        |engine, dev, _| {
            for descriptions_free in [true, false] {
                // Without a free description the flush waits for its write outside the engine.
                let hold = (!descriptions_free).then(|| {
                    let holds: Vec<_> = (0..4)
                        .map(|t| {
                            let h = dev.hold_next_flush().unwrap();
                            dev.submit_flush(50 + t).unwrap();
                            h
                        })
                        .collect();
                    holds
                });
                dev.fail_next_write();
                let b = dev.alloc_buffer(4096).unwrap();
                dev.submit_write_flush(1, 8, b, 2).unwrap();
                let done = collect(dev, 2);
                assert_eq!((done[0].tag, done[0].op), (1, Op::Write), "{engine}");
                assert!(
                    matches!(&done[0].result, Err(DeviceError::Io { detail, .. }) if detail.contains("Bad file descriptor")),
                    "{engine}: {done:?}"
                );
                assert_eq!((done[1].tag, done[1].op), (2, Op::Flush), "{engine}");
                match &done[1].result {
                    Err(DeviceError::Io {
                        op: Op::Flush,
                        detail,
                        ..
                    }) => assert!(
                        detail.contains("not run: its linked write at block 8 failed"),
                        "{engine}: {detail}"
                    ),
                    other => panic!("{engine}: the flush of a failed write reported {other:?}"),
                }
                drop(hold);
                if !descriptions_free {
                    let held = collect(dev, 4);
                    assert!(held.iter().all(|c| c.result.is_ok()), "{engine}: {held:?}");
                }
                dev.submit_flush(3).unwrap();
                assert_eq!(collect(dev, 1)[0].result, Ok(()), "{engine}");
            }
        },
    );
}

/// A linked flush that finds every description busy waits like any flush: after its write
/// completed, behind the held flush, and it completes once that one has.
#[test]
fn a_linked_flush_without_a_free_description_waits_like_any_flush() {
    on_each_engine(
        "a_linked_flush_without_a_free_description",
        1,
        |engine, dev, _| {
            let hold = dev.hold_next_flush().unwrap();
            dev.submit_flush(1).unwrap();
            let mut b = dev.alloc_buffer(4096).unwrap();
            b.copy_from_slice(&pattern(9, 4096));
            dev.submit_write_flush(2, 3, b, 3).unwrap();
            let w = collect(dev, 1);
            assert_eq!((w[0].tag, &w[0].result), (2, &Ok(())), "{engine}");
            nothing_for(dev, 300);
            assert_eq!(dev.in_flight(), 2, "{engine}");
            hold.release();
            let done = collect(dev, 2);
            let got: Vec<(Tag, bool)> = done.iter().map(|c| (c.tag, c.result.is_ok())).collect();
            assert_eq!(got, vec![(1, true), (3, true)], "{engine}");
        },
    );
}

/// io_uring: a linked write whose first attempt is short has its link severed by the kernel (the
/// fsync comes back `-ECANCELED`); the write is continued, and the flush is issued after it and
/// succeeds. The cancelled fsync is never reported.
#[test]
fn a_short_linked_write_is_continued_and_flushed_after_it() {
    on_each_engine("a_short_linked_write_is_continued", 4, |engine, dev, p| {
        if !dev.short_next_linked_write() {
            assert_eq!(engine, Engine::Threads);
            return;
        }
        let len = 64 << 10;
        let mut b = dev.alloc_buffer(len).unwrap();
        b.copy_from_slice(&pattern(77, len));
        dev.submit_write_flush(1, 16, b, 2).unwrap();
        let done = collect(dev, 2);
        assert_eq!((done[0].tag, &done[0].result), (1, &Ok(())), "{done:?}");
        assert_eq!((done[1].tag, &done[1].result), (2, &Ok(())), "{done:?}");
        assert_eq!(dev.linked_flushes_reissued(), 1, "the link was not severed");
        let mut other = FileDevice::open(
            p,
            FileOptions {
                read_only: true,
                ..FileOptions::default()
            },
        )
        .unwrap();
        assert!(read_back(&mut other, 16, len) == pattern(77, len));
    });
}

/// An event loop's wait: polls until at most `target` completions are owed, sleeping on the
/// completion descriptor (5 s at most) only after a poll that returned nothing with I/O in flight.
/// Returns how many times it slept.
fn drain_to(dev: &mut FileDevice, owed: &mut usize, target: usize, what: &str) -> u32 {
    let fd = dev.completion_fd().unwrap().as_raw_fd();
    let (mut out, mut sleeps) = (Vec::new(), 0);
    while *owed > target {
        out.clear();
        let n = dev.poll(&mut out).unwrap();
        assert!(out.iter().all(|c| c.result.is_ok()), "{what}: {out:?}");
        *owed -= n;
        if n == 0 {
            assert!(
                dev.in_flight() > 0,
                "{what}: {owed} owed, nothing in flight"
            );
            sleeps += 1;
            assert!(
                fd_readable(fd, Some(Duration::from_secs(5))).unwrap(),
                "{what}: no wake-up within 5 s, {owed} owed"
            );
        }
    }
    sleeps
}

/// An event loop that sleeps only on the completion descriptor (poll after submitting; sleep only
/// when that poll returned nothing with I/O in flight) gets every completion of a busy mix of
/// writes, flushes, linked pairs and reads, does sleep on it, and finds it quiet when done.
#[test]
fn an_event_loop_on_the_completion_descriptor_never_loses_a_wake_up() {
    on_each_engine(
        "an_event_loop_on_the_completion_descriptor",
        2,
        |engine, dev, _| {
            let (mut owed, mut sleeps) = (0usize, 0u32);
            for round in 0..300u64 {
                let (lba, tag) = (round % 64, round * 2);
                let mut b = dev.alloc_buffer(4096).unwrap();
                b.copy_from_slice(&pattern(round as u8, 4096));
                owed += match round % 4 {
                    0 => dev.submit_write(tag, lba, b).map(|()| 1),
                    1 => dev.submit_write_flush(tag, lba, b, tag + 1).map(|()| 2),
                    2 => dev.submit_flush(tag).map(|()| 1),
                    _ => dev.submit_read(tag, lba, b).map(|()| 1),
                }
                .unwrap();
                // Keep a few in flight, and drain to empty now and then.
                let target = if round % 16 == 15 { 0 } else { 6 };
                sleeps += drain_to(dev, &mut owed, target, &format!("{engine}, round {round}"));
            }
            sleeps += drain_to(dev, &mut owed, 0, &format!("{engine}, at the end"));
            assert_eq!(dev.in_flight(), 0);
            assert!(
                sleeps > 0,
                "{engine}: the loop never slept on the descriptor"
            );
            let fd = dev.completion_fd().unwrap().as_raw_fd();
            if fd_readable(fd, Some(Duration::from_millis(20))).unwrap() {
                // A signal the kernel sent just after the last reap: one poll resets it.
                assert_eq!(dev.poll(&mut Vec::new()).unwrap(), 0);
                assert!(!fd_readable(fd, Some(Duration::ZERO)).unwrap(), "{engine}");
            }
        },
    );
}

/// A device dropped with linked pairs in the engine (some of their flushes waiting for a
/// description) neither hangs nor drops a write: every write lands.
#[test]
fn dropping_a_device_with_linked_pairs_in_flight_waits_for_them() {
    on_each_engine(
        "dropping_a_device_with_linked_pairs",
        2,
        |engine, dev, p| {
            let per = 16384 / bs(dev);
            for k in 0..24u64 {
                let mut b = dev.alloc_buffer(16384).unwrap();
                b.copy_from_slice(&pattern(k as u8 ^ 0x5A, 16384));
                dev.submit_write_flush(k, k * per, b, 100 + k).unwrap();
            }
            // Everything reaches the engine; then the device goes while it runs (a read-only open of
            // the same file, which takes no lock, stands in for it in the caller's place).
            dev.poll(&mut Vec::new()).unwrap();
            let ro = FileOptions {
                read_only: true,
                ..FileOptions::default()
            };
            let (tx, rx) = std::sync::mpsc::channel();
            let taken = std::mem::replace(dev, FileDevice::open(p, ro).unwrap());
            std::thread::spawn(move || {
                drop(taken);
                let _ = tx.send(());
            });
            rx.recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("{engine}: dropping the device hung"));
            for k in 0..24u64 {
                assert!(
                    read_back(dev, k * per, 16384) == pattern(k as u8 ^ 0x5A, 16384),
                    "{engine}: the write at block {} did not land",
                    k * per
                );
            }
        },
    );
}
