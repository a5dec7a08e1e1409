//! Checks of what an event loop that owns a device relies on: the completion descriptor wakes it
//! for every completion (and stays quiet when nothing is in flight), and a linked write+flush
//! completes as promised, or is refused without side effects where the device does not offer it.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::io::{
    alloc, block_size, capacity_blocks, collect, completed, expect_data, expect_idle, filled,
    flushed, write_now, TAG_BASE,
};
use super::{check, ContractFailure};
use crate::file::fd_readable;
use crate::{BlockDevice, DeviceError, Op, Tag, LINKED_FLUSH_UNSUPPORTED};

/// How long the descriptor may take to become readable with a completion owed.
const WAKE: Duration = Duration::from_secs(5);

/// With a completion descriptor: a write, a flush and a read, each waited for the way an event
/// loop waits (poll after submitting; sleep on the descriptor only when that poll returned
/// nothing), each wake-up within 5 s, each completion then returned by `poll`; with nothing in
/// flight afterwards the descriptor is not readable. A polled device (`None`) passes as it is.
pub fn completion_fd<D: BlockDevice + ?Sized>(dev: &mut D) -> Result<(), ContractFailure> {
    const CHECK: &str = check::COMPLETION_FD.name;
    // A raw descriptor: the device is used mutably while it is waited on (it stays open as long
    // as the device).
    let Some(fd) = dev.completion_fd().map(|f| f.as_raw_fd()) else {
        return Ok(());
    };
    expect_idle(dev, CHECK, "before the check")?;
    let bs = block_size(dev) as usize;
    let lba = capacity_blocks(dev) / 3;
    let seed = 0xFD;
    for (i, op) in [Op::Write, Op::Flush, Op::Read, Op::Write]
        .into_iter()
        .enumerate()
    {
        let tag = TAG_BASE | 0xFD00 | i as u64;
        let submitted = match op {
            Op::Write => {
                let b = filled(dev, CHECK, seed + i as u64, lba, 1)?;
                dev.submit_write(tag, lba, b)
            }
            Op::Read => {
                let b = alloc(dev, CHECK, bs)?;
                dev.submit_read(tag, lba, b)
            }
            _ => dev.submit_flush(tag),
        };
        submitted.map_err(|e| ContractFailure::device(CHECK, "submitting", &e).tag(tag))?;
        let mut got = Vec::new();
        let step = format!("waiting for a {op} on the completion descriptor, as an event loop");
        let deadline = Instant::now() + WAKE;
        loop {
            dev.poll(&mut got)
                .map_err(|e| ContractFailure::device(CHECK, step.clone(), &e))?;
            if !got.is_empty() {
                break;
            }
            let fail = |why: String| {
                Err(ContractFailure::new(CHECK, step.clone())
                    .op(op)
                    .tag(tag)
                    .because(why))
            };
            if dev.in_flight() == 0 {
                return fail("poll returned nothing, yet nothing is in flight any more".into());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            dev.arm_completion_fd();
            match fd_readable(fd, Some(left)) {
                Ok(true) => {}
                Ok(false) => {
                    return fail(format!(
                        "the descriptor did not become readable within {} s with {} I/O in \
                         flight and none returned by poll (a lost wake-up)",
                        WAKE.as_secs(),
                        dev.in_flight()
                    ))
                }
                Err(e) => return fail(format!("poll(2) on the descriptor failed: {e}")),
            }
        }
        if got.len() != 1 {
            let tags: Vec<Tag> = got.iter().map(|c| c.tag).collect();
            return Err(ContractFailure::new(CHECK, step).tag(tag).because(format!(
                "one I/O was in flight, completions came for {tags:?}"
            )));
        }
        let c = got.remove(0);
        if op == Op::Flush {
            flushed(CHECK, &c, tag)?;
        } else {
            if c.tag != tag {
                return Err(ContractFailure::new(CHECK, step)
                    .tag(tag)
                    .because(format!("the completion carries tag {:#x}", c.tag)));
            }
            completed(CHECK, c, op, lba, bs)?;
        }
        expect_quiet(dev, fd, CHECK)?;
    }
    Ok(())
}

/// Nothing in flight: the descriptor is not readable. One more `poll` and a moment are allowed
/// for a signal the kernel sent just after the reap that took the last completion.
fn expect_quiet<D: BlockDevice + ?Sized>(
    dev: &mut D,
    fd: std::os::fd::RawFd,
    check: &'static str,
) -> Result<(), ContractFailure> {
    let step = "looking at the descriptor with nothing in flight";
    let readable = |fd| {
        fd_readable(fd, Some(Duration::ZERO))
            .map_err(|e| ContractFailure::new(check, step).because(format!("poll(2): {e}")))
    };
    if !readable(fd)? {
        return Ok(());
    }
    std::thread::sleep(Duration::from_millis(10));
    expect_idle(dev, check, step)?;
    if readable(fd)? {
        return Err(ContractFailure::new(check, step).because(
            "it stays readable after a poll with nothing in flight: an event loop would spin",
        ));
    }
    Ok(())
}

/// With `linked_flush`: write+flush pairs in flight together complete once each with their tags,
/// each write's completion before its flush's, and the data reads back; a pair is refused with
/// `QueueFull` when only one I/O fits. Without: `submit_write_flush` is refused as
/// [`LINKED_FLUSH_UNSUPPORTED`], nothing goes in flight and the blocks keep their data.
pub fn linked_flush<D: BlockDevice + ?Sized>(dev: &mut D) -> Result<(), ContractFailure> {
    const CHECK: &str = check::LINKED_FLUSH.name;
    let n = capacity_blocks(dev);
    let base = n / 8 * 5;
    let seed = 0x11AF;
    if !dev.info().linked_flush {
        write_now(dev, CHECK, TAG_BASE | 1, seed, base, 1)?;
        let b = filled(dev, CHECK, seed + 1, base, 1)?;
        let (wt, ft) = (TAG_BASE | 2, TAG_BASE | 3);
        let step = "submitting a linked write+flush, which a device without linked_flush refuses";
        match dev.submit_write_flush(wt, base, b, ft) {
            Err(DeviceError::BadRequest { why, .. }) if why == LINKED_FLUSH_UNSUPPORTED => {}
            Err(e) => {
                return Err(ContractFailure::device(CHECK, step, &e).because(format!(
                    "refused with \"{e}\"; expected BadRequest \"{LINKED_FLUSH_UNSUPPORTED}\""
                )))
            }
            Ok(()) => {
                return Err(ContractFailure::new(CHECK, step)
                    .op(Op::Write)
                    .lba(base)
                    .tag(wt)
                    .because("accepted although DeviceInfo::linked_flush is false"))
            }
        }
        expect_idle(dev, CHECK, step)?;
        return expect_data(
            dev,
            CHECK,
            "reading the block back",
            TAG_BASE | 4,
            base,
            1,
            |_| seed,
        );
    }
    let depth = dev.queue_depth();
    if depth < 2 {
        return Ok(());
    }
    let pairs = (depth / 2).min(8) as u64;
    let wtag = |i: u64| TAG_BASE | 0x2000 | i;
    let ftag = |i: u64| TAG_BASE | 0x3000 | i;
    // Two blocks apart, with one between, so that a write landing a block off shows.
    for round in 0..2u64 {
        let seed = seed + round;
        for i in 0..pairs {
            let lba = base + 2 * i;
            let b = filled(dev, CHECK, seed, lba, 1)?;
            let (w, f) = (wtag(i), ftag(i));
            dev.submit_write_flush(w, lba, b, f).map_err(|e| {
                ContractFailure::device(CHECK, "submitting a linked write+flush", &e).tag(w)
            })?;
        }
        if dev.in_flight() != 2 * pairs as usize {
            return Err(
                ContractFailure::new(CHECK, "counting linked pairs in flight").because(format!(
                    "in_flight() is {}, expected {} (two per pair)",
                    dev.in_flight(),
                    2 * pairs
                )),
            );
        }
        let done = collect(dev, CHECK, 2 * pairs as usize)?;
        let mut write_at = vec![None; pairs as usize];
        let mut flush_at = vec![None; pairs as usize];
        let bs = block_size(dev) as usize;
        for (k, c) in done.into_iter().enumerate() {
            let i = (c.tag & 0xFFF) as usize;
            let tag = c.tag;
            if i < pairs as usize && tag == wtag(i as u64) && write_at[i].is_none() {
                completed(CHECK, c, Op::Write, base + 2 * i as u64, bs)?;
                write_at[i] = Some(k);
            } else if i < pairs as usize && tag == ftag(i as u64) && flush_at[i].is_none() {
                flushed(CHECK, &c, tag)?;
                flush_at[i] = Some(k);
            } else {
                return Err(ContractFailure::new(CHECK, "collecting linked pairs")
                    .tag(tag)
                    .because("this tag was not in flight, or completed twice"));
            }
        }
        for i in 0..pairs as usize {
            if write_at[i] > flush_at[i] {
                return Err(ContractFailure::new(CHECK, "collecting linked pairs")
                    .tag(ftag(i as u64))
                    .because("the flush's completion came before its write's"));
            }
        }
        expect_idle(dev, CHECK, "after collecting the linked pairs")?;
        for i in 0..pairs {
            let lba = base + 2 * i;
            expect_data(
                dev,
                CHECK,
                "reading a linked write back",
                TAG_BASE | 0x4000 | i,
                lba,
                1,
                |_| seed,
            )?;
        }
    }
    queue_full(dev, base)
}

/// With room for one I/O only, a pair is refused with `QueueFull` and nothing goes in flight.
fn queue_full<D: BlockDevice + ?Sized>(dev: &mut D, lba: u64) -> Result<(), ContractFailure> {
    const CHECK: &str = check::LINKED_FLUSH.name;
    let depth = dev.queue_depth();
    let bs = block_size(dev) as usize;
    let n = capacity_blocks(dev);
    for i in 0..depth as u64 - 1 {
        let b = alloc(dev, CHECK, bs)?;
        dev.submit_read(TAG_BASE | 0x5000 | i, i % n, b)
            .map_err(|e| ContractFailure::device(CHECK, "filling the queue but one", &e))?;
    }
    let b = filled(dev, CHECK, 0x5EED, lba, 1)?;
    let step = "submitting a linked pair with room for one I/O";
    match dev.submit_write_flush(TAG_BASE | 0x6000, lba, b, TAG_BASE | 0x6001) {
        Err(DeviceError::QueueFull { .. }) => {}
        other => {
            return Err(ContractFailure::new(CHECK, step)
                .op(Op::Write)
                .lba(lba)
                .because(format!("expected QueueFull, got {other:?}")))
        }
    }
    if dev.in_flight() != depth - 1 {
        return Err(ContractFailure::new(CHECK, step).because(format!(
            "in_flight() is {}, expected {}",
            dev.in_flight(),
            depth - 1
        )));
    }
    collect(dev, CHECK, depth - 1)?;
    expect_idle(dev, CHECK, "after the refused pair")
}
