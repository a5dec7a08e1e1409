//! The I/O timeout: waits, commands that never complete, flushes that time out.

use super::*;

/// In the QEMU guest (clocksource HPET) every clock read is a `clock_gettime` system call, and
/// `wait` read the clock once per call: about one system call per batch of I/Os. A wait that the
/// controller answers at once must not read the clock at all; one that times out still does.
#[test]
fn waits_answered_at_once_read_no_clock() {
    let (mut dev, h) = open_with(FakeConfig::default(), small_opts());
    let before = h.stats().clock_reads;
    let mut out = Vec::new();
    for i in 0..200u64 {
        let b = dev.alloc_buffer(4096).unwrap();
        dev.submit_write(i, i, b).unwrap();
        dev.submit_flush(1000 + i).unwrap();
        out.clear();
        while dev.in_flight() > 0 {
            dev.wait(&mut out, Duration::from_secs(5)).unwrap();
        }
        assert_eq!(out.len(), 2);
    }
    assert_eq!(h.stats().clock_reads, before, "clock reads in 200 waits");

    h.hold_completions();
    let b = dev.alloc_buffer(4096).unwrap();
    dev.submit_write(7, 7, b).unwrap();
    let t = std::time::Instant::now();
    out.clear();
    assert_eq!(dev.wait(&mut out, Duration::from_millis(50)).unwrap(), 0);
    assert!(
        t.elapsed() >= Duration::from_millis(50),
        "{:?}",
        t.elapsed()
    );
    assert!(h.stats().clock_reads > before);
}

fn timeout_opts(ms: u64) -> NvmeOptions {
    NvmeOptions {
        io_timeout: Duration::from_millis(ms),
        ..small_opts()
    }
}

/// Waits until the device fails. Bounded (600 waits of 100 ms) so a timeout that never fires
/// fails the test instead of hanging it; nothing is asserted about when it fires.
fn wait_for_failure(dev: &mut Dev, out: &mut Vec<Completion>) -> DeviceError {
    for _ in 0..600 {
        if let Err(e) = dev.wait(out, Duration::from_millis(100)) {
            return e;
        }
    }
    panic!(
        "no error after 600 waits with {} I/Os in flight",
        dev.in_flight()
    );
}

#[test]
fn a_command_that_never_completes_fails_the_device_naming_it() {
    let (mut dev, h) = open_with(FakeConfig::default(), timeout_opts(20));
    h.stall_nth(1);
    let a = filled(&mut dev, 1, 4, 4096);
    dev.submit_write(1, 4, a).unwrap();
    let b = filled(&mut dev, 2, 9, 8192);
    dev.submit_write(2, 9, b).unwrap();
    let mut out = Vec::new();
    dev.poll(&mut out).unwrap();
    let stalled = h.stalled();
    assert_eq!(stalled.len(), 1, "the second write is stalled");
    let e = wait_for_failure(&mut dev, &mut out);
    let DeviceError::CommandTimeout {
        op,
        lba,
        opcode,
        cid,
        qid,
        waited_ms,
        timeout_ms,
        ref abort,
    } = e
    else {
        panic!("not a timeout: {e:?}");
    };
    assert_eq!(
        (op, lba, opcode, qid, timeout_ms),
        (Op::Write, 9, io::WRITE, 1, 20)
    );
    assert_eq!(
        (qid, cid),
        stalled[0],
        "the error names the stalled command"
    );
    assert!(waited_ms >= 20, "waited {waited_ms} ms");
    assert!(abort.contains("aborted the command"), "{abort}");
    let msg = e.to_string();
    for want in [
        "write at block 9 timed out",
        "NVMe command 0x01",
        &format!("command id {cid} on submission queue 1"),
        "io_timeout 20 ms",
        "the device is stopped",
    ] {
        assert!(msg.contains(want), "{msg:?} lacks {want:?}");
    }
    // The Abort went out, naming the command.
    let s = h.stats();
    assert_eq!(s.aborts, vec![(1, cid)]);
    assert!(s.admin_log.contains(&0x08));
    // The write that completed in time is unaffected; the stalled one fails with the timeout and
    // its buffer comes back.
    let mut by_tag: HashMap<u64, &Completion> = out.iter().map(|c| (c.tag, c)).collect();
    assert_eq!(out.len(), 2, "each I/O completes once");
    assert_eq!(by_tag.remove(&1).unwrap().result, Ok(()));
    let two = by_tag.remove(&2).unwrap();
    assert_eq!(two.result, Err(e.clone()));
    assert!(two.buffer.is_some());
    assert!(dev.is_stopped());
    assert_eq!(dev.in_flight(), 0);
    // Every later call reports it; every submit is refused with it.
    assert_eq!(dev.poll(&mut out), Err(e.clone()));
    assert_eq!(dev.wait(&mut out, Duration::from_millis(1)), Err(e.clone()));
    let c = dev.alloc_buffer(4096).unwrap();
    for (r, want) in [
        (dev.submit_write(3, 0, c), Op::Write),
        (dev.submit_flush(4), Op::Flush),
    ] {
        match r {
            Err(DeviceError::Failed { op, reason, .. }) => {
                assert_eq!(op, want);
                assert_eq!(*reason, e);
            }
            r => panic!("submit after the timeout: {r:?}"),
        }
    }
    assert_eq!(h.stats().flushes, 0, "nothing reached the controller");
}

#[test]
fn a_flush_that_times_out_is_never_reported_durable_nor_retried() {
    let (mut dev, h) = open_with(FakeConfig::default(), timeout_opts(20));
    h.ignore_aborts();
    h.stall_opcode(io::FLUSH);
    let b = filled(&mut dev, 3, 0, 4096);
    dev.submit_write(1, 0, b).unwrap();
    dev.submit_flush(2).unwrap();
    let mut out = Vec::new();
    let e = wait_for_failure(&mut dev, &mut out);
    assert!(
        matches!(
            &e,
            DeviceError::CommandTimeout {
                op: Op::Flush,
                opcode: io::FLUSH,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("did not abort"), "{e}");
    assert_eq!(h.stats().aborts.len(), 1);
    let flushes = h.stats().flushes;
    assert_eq!(flushes, 1);
    // The controller now completes the flush, late: it must not come back as a success.
    h.release_stalled();
    for _ in 0..1000 {
        assert_eq!(dev.poll(&mut out), Err(e.clone()));
    }
    assert_eq!(dev.wait(&mut out, Duration::from_millis(5)), Err(e.clone()));
    let flush: Vec<&Completion> = out.iter().filter(|c| c.tag == 2).collect();
    assert_eq!(flush.len(), 1, "the flush completes once");
    assert_eq!(flush[0].result, Err(e.clone()));
    assert_eq!(
        out.iter().find(|c| c.tag == 1).map(|c| c.result.clone()),
        Some(Ok(()))
    );
    // No retry: nothing gets to the controller any more.
    assert!(dev.submit_flush(3).is_err());
    assert_eq!(dev.poll(&mut out), Err(e));
    assert_eq!(h.stats().flushes, flushes);
}

/// Many short waits on held commands, over a hundred timeouts of wall time: the epochs advance
/// and the hint of the oldest command goes stale again and again, yet a command that completes
/// within the timeout is never failed.
#[test]
fn commands_that_complete_in_time_never_time_out() {
    let (mut dev, h) = open_with(FakeConfig::default(), timeout_opts(2));
    let start = std::time::Instant::now();
    let mut out = Vec::new();
    let mut rounds = 0u64;
    while rounds < 100 || start.elapsed() < Duration::from_millis(200) {
        h.hold_completions();
        let b = dev.alloc_buffer(4096).unwrap();
        dev.submit_write(rounds, rounds % 64, b).unwrap();
        // Returns after the first clock reading, which ages the command.
        assert_eq!(dev.wait(&mut out, Duration::ZERO).unwrap(), 0);
        h.release();
        let c = drain(&mut dev, 1);
        assert_eq!(c[0].result, Ok(()), "round {rounds}");
        rounds += 1;
    }
    assert!(h.stats().clock_reads >= rounds);
    assert!(h.stats().aborts.is_empty());
}

#[test]
fn an_idle_device_does_not_time_out() {
    let (mut dev, h) = open_with(FakeConfig::default(), timeout_opts(2));
    let mut out = Vec::new();
    let mut held_write = |dev: &mut Dev, tag: u64| {
        h.hold_completions();
        let b = dev.alloc_buffer(4096).unwrap();
        dev.submit_write(tag, tag, b).unwrap();
        assert_eq!(dev.wait(&mut out, Duration::ZERO).unwrap(), 0);
        h.release();
        assert_eq!(drain(dev, 1)[0].result, Ok(()));
    };
    held_write(&mut dev, 1);
    // Idle for many timeouts: nothing in flight, nothing to age.
    std::thread::sleep(Duration::from_millis(50));
    let mut none = Vec::new();
    assert_eq!(dev.poll(&mut none).unwrap(), 0);
    assert_eq!(dev.wait(&mut none, Duration::from_millis(10)).unwrap(), 0);
    // A command submitted after the idle spell starts young, though its epoch began long ago.
    held_write(&mut dev, 2);
    dev.write_at(8 * 4096, &[7u8; 4096]).unwrap();
    assert!(!dev.is_stopped());
}

/// A pair that reaps a completion at every poll still ages the command stuck behind them: the
/// clock used to be read only after empty polls in a row, so a steady stream of completions
/// hid a hung command for ever.
#[test]
fn a_command_stuck_behind_a_stream_of_completions_times_out() {
    let (mut dev, h) = open_with(FakeConfig::default(), timeout_opts(20));
    h.stall_nth(0);
    let stuck = filled(&mut dev, 1, 3, 4096);
    dev.submit_write(1, 3, stuck).unwrap();
    let mut out = Vec::new();
    assert_eq!(dev.poll(&mut out).unwrap(), 0);
    assert_eq!(h.stalled().len(), 1, "the write is stalled");
    let start = std::time::Instant::now();
    let mut flowed = 0u64;
    let e = loop {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no timeout after {flowed} completions flowed past the stalled write"
        );
        // One read per poll, so that every poll reaps one: no poll is ever empty.
        let b = dev.alloc_buffer(4096).unwrap();
        dev.submit_read(100 + flowed, 8 + flowed % 32, b).unwrap();
        out.clear();
        match dev.poll(&mut out) {
            Ok(n) => {
                assert_eq!(n, 1, "after {flowed} reads, a poll reaped {n}");
                flowed += 1;
            }
            Err(e) => break e,
        }
    };
    match &e {
        DeviceError::CommandTimeout {
            op: Op::Write,
            lba: 3,
            waited_ms,
            ..
        } => assert!(*waited_ms >= 20, "waited {waited_ms} ms"),
        e => panic!("not the stalled write's timeout: {e:?}"),
    }
    let stalled: Vec<&Completion> = out.iter().filter(|c| c.tag == 1).collect();
    assert_eq!(stalled.len(), 1, "the stalled write is handed back once");
    assert_eq!(stalled[0].result, Err(e.clone()));
    assert!(flowed > 0);
    assert_eq!(dev.in_flight(), 0);
}

/// The first failure is what every pair reports, the pair that found it included: in `poll`,
/// in the I/Os it fails, and in its refusals, with the operation and block of the command that
/// failed.
#[test]
fn every_pair_reports_the_timeout_of_the_command_that_failed() {
    let opts = NvmeOptions {
        queue_pairs: 2,
        ..timeout_opts(20)
    };
    let (mut one, h) = open_with(FakeConfig::default(), opts);
    let mut two = one.queue_pair().unwrap().expect("a second pair");
    h.hold_completions();
    let b = filled(&mut two, 2, 40, 4096);
    two.submit_write(7, 40, b).unwrap();
    assert_eq!(two.poll(&mut Vec::new()).unwrap(), 0);
    h.stall_nth(0);
    let b = filled(&mut one, 1, 9, 4096);
    one.submit_write(1, 9, b).unwrap();
    let mut out = Vec::new();
    let e = wait_for_failure(&mut one, &mut out);
    assert!(
        matches!(
            e,
            DeviceError::CommandTimeout {
                op: Op::Write,
                lba: 9,
                ..
            }
        ),
        "{e:?}"
    );
    // The other pair fails what it had in flight with that reason, then reports it.
    let mut failed = Vec::new();
    assert_eq!(two.poll(&mut failed), Ok(1));
    match &failed[0].result {
        Err(DeviceError::Failed { op, lba, reason }) => {
            assert_eq!((*op, *lba), (Op::Write, 40));
            assert_eq!(**reason, e);
        }
        r => panic!("the other pair's write: {r:?}"),
    }
    for dev in [&mut one, &mut two] {
        assert_eq!(dev.poll(&mut Vec::new()), Err(e.clone()));
        let c = dev.alloc_buffer(4096).unwrap();
        match dev.submit_write(3, 12, c) {
            Err(DeviceError::Failed { op, lba, reason }) => {
                assert_eq!((op, lba), (Op::Write, 12));
                assert_eq!(*reason, e);
            }
            r => panic!("a submit after the timeout: {r:?}"),
        }
    }
}
