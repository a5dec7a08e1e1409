//! Checks of what a device must refuse at submit: I/O outside the device, I/O of a bad shape, and
//! I/O beyond the queue depth.

use std::time::Duration;

use super::io::{
    alloc, block_size, capacity_blocks, collect, completed, expect_data, expect_idle, flush_now,
    write_now, TAG_BASE,
};
use super::{check, ContractFailure};
use crate::{check_io, BlockDevice, DeviceError, Op, Tag};

/// Submits `op` of `len` bytes at `lba`, which the contract refuses, and checks that the device
/// refused it at submit exactly as [`check_io`] does, naming the address.
fn expect_refused<D: BlockDevice + ?Sized>(
    dev: &mut D,
    check: &'static str,
    op: Op,
    lba: u64,
    len: usize,
    tag: Tag,
) -> Result<(), ContractFailure> {
    let step = format!("submitting {len} bytes, which must be refused");
    let fail = |why: String| {
        Err(ContractFailure::new(check, step.clone())
            .op(op)
            .lba(lba)
            .tag(tag)
            .because(why))
    };
    let Err(expected) = check_io(dev.info(), op, lba, len) else {
        return fail("check_io accepts this I/O; the check is wrong for this geometry".into());
    };
    // Allocated at least one block long, then trimmed: a zero-byte buffer cannot be allocated.
    let mut b = alloc(dev, check, len.max(block_size(dev) as usize))?;
    b.set_len(len);
    let got = match op {
        Op::Write => dev.submit_write(tag, lba, b),
        _ => dev.submit_read(tag, lba, b),
    };
    match got {
        Ok(()) => fail(format!("accepted; expected \"{expected}\"")),
        Err(e) if e != expected => fail(format!("refused with \"{e}\"; expected \"{expected}\"")),
        Err(e) if !e.to_string().contains(&format!("block {lba}")) => {
            fail(format!("the refusal \"{e}\" does not name block {lba}"))
        }
        Err(_) => expect_idle(dev, check, &step),
    }
}

/// The last block is addressable; nothing past the end is.
pub fn last_block<D: BlockDevice + ?Sized>(dev: &mut D) -> Result<(), ContractFailure> {
    const CHECK: &str = check::LAST_BLOCK.name;
    let bs = block_size(dev) as usize;
    let n = capacity_blocks(dev);
    let last = n - 1;
    let seed = 0x1A57;
    write_now(dev, CHECK, TAG_BASE | 1, seed, last, 1)?;
    expect_data(
        dev,
        CHECK,
        "reading the last block back",
        TAG_BASE | 2,
        last,
        1,
        |_| seed,
    )?;
    let max_blocks = (dev.info().max_transfer as usize / bs) as u64;
    let mut cases = vec![
        (n, bs),        // the first block past the end
        (last, 2 * bs), // across the end
        (n + 1000, bs), // far past it
        (u64::MAX, bs), // the address overflows
    ];
    if max_blocks >= 2 {
        // Every block but the last fits: the whole device shifted by one.
        let span = max_blocks.min(n) as usize * bs;
        cases.push((n - (span / bs) as u64 + 1, span));
    }
    for (i, (lba, len)) in cases.into_iter().enumerate() {
        for op in [Op::Write, Op::Read] {
            expect_refused(dev, CHECK, op, lba, len, TAG_BASE | 16 | i as u64)?;
        }
    }
    Ok(())
}

/// I/O of a shape the contract forbids is refused at submit.
pub fn malformed_io<D: BlockDevice + ?Sized>(dev: &mut D) -> Result<(), ContractFailure> {
    const CHECK: &str = check::MALFORMED_IO.name;
    let bs = block_size(dev) as usize;
    let max = dev.info().max_transfer as usize;
    let cases = [
        (0u64, 0usize),   // nothing to transfer
        (0, bs - 1),      // part of a block
        (1, bs + bs / 2), // a block and a half
        (2, 511),         // less than a sector
        (0, max + bs),    // over the maximum transfer
    ];
    for (i, (lba, len)) in cases.into_iter().enumerate() {
        for op in [Op::Write, Op::Read] {
            expect_refused(dev, CHECK, op, lba, len, TAG_BASE | 32 | i as u64)?;
        }
    }
    Ok(())
}

/// `queue_depth` I/Os go in; the next is refused with `QueueFull` until completions are
/// collected, and completions that arrived but were not collected still count.
pub fn queue_depth<D: BlockDevice + ?Sized>(dev: &mut D) -> Result<(), ContractFailure> {
    const CHECK: &str = check::QUEUE_DEPTH.name;
    let depth = dev.queue_depth();
    let bs = block_size(dev) as usize;
    let n = capacity_blocks(dev);
    // Reads, so that filling a deep queue writes nothing; one block each, so that every I/O is
    // one command on a device that splits large ones.
    for i in 0..depth as u64 {
        let b = alloc(dev, CHECK, bs)?;
        dev.submit_read(TAG_BASE | i, i % n, b).map_err(|e| {
            ContractFailure::device(
                CHECK,
                format!("filling the queue: I/O {} of the {depth} it admits", i + 1),
                &e,
            )
            .tag(TAG_BASE | i)
        })?;
    }
    let over = TAG_BASE | depth as u64;
    let lba = depth as u64 % n;
    let refused = |dev: &mut D, op: Op| -> Result<(), DeviceError> {
        match op {
            Op::Write => {
                let b = dev.alloc_buffer(bs)?;
                dev.submit_write(over, lba, b)
            }
            Op::Read => {
                let b = dev.alloc_buffer(bs)?;
                dev.submit_read(over, lba, b)
            }
            _ => dev.submit_flush(over),
        }
    };
    // Time for the device to finish them; finished but not collected still counts.
    std::thread::sleep(Duration::from_millis(20));
    for op in [Op::Write, Op::Read, Op::Flush] {
        let at = if op == Op::Flush { 0 } else { lba };
        let step = format!("submitting one I/O more than the queue depth {depth}");
        match refused(dev, op) {
            Err(DeviceError::QueueFull {
                op: o,
                lba: l,
                depth: d,
            }) if o == op && l == at && d == depth => {}
            other => {
                return Err(ContractFailure::new(CHECK, step)
                    .op(op)
                    .lba(at)
                    .tag(over)
                    .because(format!(
                    "expected QueueFull naming {op} at block {at} and depth {depth}, got {other:?}"
                )))
            }
        }
        if dev.in_flight() != depth {
            return Err(
                ContractFailure::new(CHECK, "counting I/Os in flight at the limit")
                    .op(op)
                    .because(format!(
                        "in_flight() is {}, expected {depth} until completions are collected",
                        dev.in_flight()
                    )),
            );
        }
    }
    let done = collect(dev, CHECK, depth)?;
    let mut seen = vec![false; depth];
    for c in done {
        let i = c.tag.wrapping_sub(TAG_BASE);
        if i >= depth as u64 || seen[i as usize] {
            return Err(ContractFailure::new(CHECK, "collecting the full queue")
                .tag(c.tag)
                .because("a completion with a tag that was not in flight, or twice".to_string()));
        }
        seen[i as usize] = true;
        completed(CHECK, c, Op::Read, i % n, bs)?;
    }
    expect_idle(dev, CHECK, "after collecting the full queue")?;
    // Room again.
    flush_now(dev, CHECK, over)
}
