//! Checks that data goes where it is sent and comes back: many I/Os in flight, flushes, the largest
//! transfers, overlapping writes, and reopening the device.

use std::collections::HashMap;

use super::io::{
    alloc, block_size, capacity_blocks, collect, completed, expect_data, expect_idle, filled,
    flush_now, flushed, mismatch, submit, write_now, TAG_BASE,
};
use super::{check, ContractFailure, DeviceFactory};
use crate::{BlockDevice, Op, Tag};

/// A reopen check's outcome, and the device it leaves open (none when reopening failed).
pub type Reopened<D> = (Result<(), ContractFailure>, Option<D>);

/// Non-overlapping I/Os of 1 to 16 blocks (at most the maximum transfer) at scattered addresses:
/// as many as the queue admits, up to 64, spread over the whole device.
fn plan<D: BlockDevice + ?Sized>(dev: &D) -> Vec<(u64, u64)> {
    let n = capacity_blocks(dev);
    let max_blocks = (u64::from(dev.info().max_transfer) / block_size(dev)).clamp(1, 16);
    let want = dev.queue_depth().min(64) as u64;
    let mut sizes: Vec<u64> = (0..want).map(|i| 1 + (i * 7) % max_blocks).collect();
    while sizes.iter().sum::<u64>() > n {
        sizes.pop();
    }
    let gap = (n - sizes.iter().sum::<u64>()) / (sizes.len() as u64 + 1);
    let mut lba = 0;
    sizes
        .into_iter()
        .enumerate()
        .map(|(i, blocks)| {
            lba += (i as u64 * 13) % (gap + 1);
            let at = lba;
            lba += blocks;
            (at, blocks)
        })
        .collect()
}

/// Submits one I/O per planned range at once (tags `base + i`) and checks every completion: each
/// tag once, with its operation, address and buffer. Returns the buffers by index.
fn all_at_once<D: BlockDevice + ?Sized>(
    dev: &mut D,
    check: &'static str,
    op: Op,
    base: Tag,
    plan: &[(u64, u64)],
    seed: u64,
) -> Result<Vec<Option<crate::IoBuffer>>, ContractFailure> {
    let bs = block_size(dev);
    for (i, &(lba, blocks)) in plan.iter().enumerate() {
        let b = match op {
            Op::Write => filled(dev, check, seed, lba, blocks)?,
            _ => alloc(dev, check, (blocks * bs) as usize)?,
        };
        submit(dev, check, op, base + i as u64, lba, b)?;
    }
    if dev.in_flight() != plan.len() {
        return Err(
            ContractFailure::new(check, format!("submitting {} {op}s", plan.len())).because(
                format!(
                    "in_flight() is {}, expected {}",
                    dev.in_flight(),
                    plan.len()
                ),
            ),
        );
    }
    let by_tag: HashMap<Tag, usize> = (0..plan.len()).map(|i| (base + i as u64, i)).collect();
    let mut got: Vec<Option<crate::IoBuffer>> = (0..plan.len()).map(|_| None).collect();
    for c in collect(dev, check, plan.len())? {
        let tag = c.tag;
        let Some(&i) = by_tag.get(&tag).filter(|&&i| got[i].is_none()) else {
            return Err(ContractFailure::new(check, format!("collecting {op}s"))
                .tag(tag)
                .because("this tag was not in flight, or completed twice".to_string()));
        };
        let (lba, blocks) = plan[i];
        got[i] = Some(completed(check, c, op, lba, (blocks * bs) as usize)?);
    }
    expect_idle(dev, check, &format!("after collecting every {op}"))?;
    Ok(got)
}

/// Many writes in flight, a flush, many reads in flight; everything reads back.
pub fn round_trip<D: BlockDevice + ?Sized>(dev: &mut D) -> Result<(), ContractFailure> {
    const CHECK: &str = check::ROUND_TRIP.name;
    let seed = 0x707;
    let plan = plan(dev);
    let bs = block_size(dev);
    all_at_once(dev, CHECK, Op::Write, TAG_BASE, &plan, seed)?;
    flush_now(dev, CHECK, TAG_BASE | 0xF1)?;
    let reads = all_at_once(dev, CHECK, Op::Read, TAG_BASE | 0x1000, &plan, seed)?;
    for (i, b) in reads.into_iter().enumerate() {
        let (lba, _) = plan[i];
        if let Some(why) = b.and_then(|b| mismatch(&b, bs, lba, |_| seed)) {
            return Err(ContractFailure::new(CHECK, "reading back what was written")
                .op(Op::Read)
                .lba(lba)
                .tag(TAG_BASE | 0x1000 | i as u64)
                .because(why));
        }
    }
    Ok(())
}

/// Flushes complete with their tag and success after the writes they cover, alone and mixed with
/// writes in flight, and the data reads back afterwards.
pub fn flush<D: BlockDevice + ?Sized>(dev: &mut D) -> Result<(), ContractFailure> {
    const CHECK: &str = check::FLUSH.name;
    let seed = 0xF105;
    let n = capacity_blocks(dev);
    let base = n / 4;
    // With nothing written.
    flush_now(dev, CHECK, TAG_BASE | 0xF0)?;
    // Write, collect, flush, collect: the ordinary commit.
    for round in 0..8u64 {
        write_now(dev, CHECK, TAG_BASE | round, seed, base + round, 1)?;
        flush_now(dev, CHECK, TAG_BASE | 0x100 | round)?;
    }
    // Writes and a flush in flight together: all complete, in any order.
    let k = dev.queue_depth().saturating_sub(1).min(8) as u64;
    for i in 0..k {
        let lba = base + 8 + i;
        let b = filled(dev, CHECK, seed, lba, 1)?;
        submit(dev, CHECK, Op::Write, TAG_BASE | 0x200 | i, lba, b)?;
    }
    let mixed = TAG_BASE | 0x2FF;
    dev.submit_flush(mixed).map_err(|e| {
        ContractFailure::device(CHECK, "submitting a flush with writes in flight", &e).tag(mixed)
    })?;
    let mut flushes = 0;
    for c in collect(dev, CHECK, k as usize + 1)? {
        if c.op == Op::Flush {
            flushed(CHECK, &c, mixed)?;
            flushes += 1;
        } else {
            let i = c.tag.wrapping_sub(TAG_BASE | 0x200);
            if i >= k {
                return Err(ContractFailure::new(CHECK, "collecting writes and a flush")
                    .tag(c.tag)
                    .because("a completion with a tag that was not in flight".to_string()));
            }
            completed(CHECK, c, Op::Write, base + 8 + i, block_size(dev) as usize)?;
        }
    }
    if flushes != 1 {
        return Err(ContractFailure::new(CHECK, "collecting writes and a flush")
            .op(Op::Flush)
            .tag(mixed)
            .because(format!("{flushes} flush completions for one flush")));
    }
    // This one covers all of them.
    flush_now(dev, CHECK, TAG_BASE | 0x300)?;
    expect_data(
        dev,
        CHECK,
        "reading back flushed writes",
        TAG_BASE | 0x400,
        base,
        8 + k,
        |_| seed,
    )
}

/// Transfers of exactly the maximum, and one block less, round-trip.
pub fn max_transfer<D: BlockDevice + ?Sized>(dev: &mut D) -> Result<(), ContractFailure> {
    const CHECK: &str = check::MAX_TRANSFER.name;
    let n = capacity_blocks(dev);
    let max_blocks = (u64::from(dev.info().max_transfer) / block_size(dev)).min(n);
    let mut sizes = vec![max_blocks];
    if max_blocks > 1 {
        sizes.push(max_blocks - 1);
    }
    for (i, blocks) in sizes.into_iter().enumerate() {
        let seed = 0x3A7 + i as u64;
        // At the end of the device, so that the largest transfer also reaches the last block.
        let lba = n - blocks;
        write_now(dev, CHECK, TAG_BASE | i as u64, seed, lba, blocks)?;
        expect_data(
            dev,
            CHECK,
            &format!("reading back {blocks} blocks in one I/O"),
            TAG_BASE | 0x10 | i as u64,
            lba,
            blocks,
            |_| seed,
        )?;
    }
    Ok(())
}

/// A write changes its own blocks and no others; the last completed write to a block wins.
pub fn write_isolation<D: BlockDevice + ?Sized>(dev: &mut D) -> Result<(), ContractFailure> {
    const CHECK: &str = check::WRITE_ISOLATION.name;
    let lba = capacity_blocks(dev) / 2 - 2;
    let (a, b, c) = (0xA, 0xB, 0xC);
    write_now(dev, CHECK, TAG_BASE | 1, a, lba, 4)?;
    write_now(dev, CHECK, TAG_BASE | 2, b, lba + 1, 1)?;
    write_now(dev, CHECK, TAG_BASE | 3, c, lba + 2, 1)?;
    write_now(dev, CHECK, TAG_BASE | 4, b, lba + 2, 1)?;
    let expect = |block: u64| {
        if block == lba + 1 || block == lba + 2 {
            b
        } else {
            a
        }
    };
    expect_data(
        dev,
        CHECK,
        "reading around single-block overwrites",
        TAG_BASE | 5,
        lba,
        4,
        expect,
    )?;
    flush_now(dev, CHECK, TAG_BASE | 6)?;
    expect_data(
        dev,
        CHECK,
        "reading around single-block overwrites after a flush",
        TAG_BASE | 7,
        lba,
        4,
        expect,
    )
}

/// Flushed data survives a reopen. Returns the reopened device when there is one.
pub fn reopen<F: DeviceFactory>(factory: &mut F, mut dev: F::Device) -> Reopened<F::Device> {
    const CHECK: &str = check::REOPEN.name;
    let n = capacity_blocks(&dev);
    let (under, first, last) = (0x0E, 0x0F, 0x1A);
    // Blocks 0 and 1 over an older write to 0..3: block 2 keeps the older data.
    let seeds = move |block: u64| if block < 2 { first } else { under };
    let before = (|| {
        write_now(&mut dev, CHECK, TAG_BASE | 1, under, 0, 3)?;
        write_now(&mut dev, CHECK, TAG_BASE | 2, first, 0, 2)?;
        write_now(&mut dev, CHECK, TAG_BASE | 3, last, n - 1, 1)?;
        flush_now(&mut dev, CHECK, TAG_BASE | 4)
    })();
    if let Err(e) = before {
        return (Err(e), Some(dev));
    }
    let info = dev.info().clone();
    let mut dev = match factory.reopen(dev) {
        Ok(d) => d,
        Err(e) => return (Err(ContractFailure::device(CHECK, "reopening", &e)), None),
    };
    let after = dev.info().clone();
    let same = |what: &str, a: String, b: String| {
        if a == b {
            Ok(())
        } else {
            Err(
                ContractFailure::new(CHECK, "comparing the device info after reopening")
                    .because(format!("{what} was {a}, is now {b}")),
            )
        }
    };
    let outcome = (|| {
        same("identity", info.identity.clone(), after.identity.clone())?;
        same(
            "geometry (logical, physical, capacity, max transfer)",
            format!(
                "{}, {}, {}, {}",
                info.logical_block_size, info.physical_block_size, info.capacity, info.max_transfer
            ),
            format!(
                "{}, {}, {}, {}",
                after.logical_block_size,
                after.physical_block_size,
                after.capacity,
                after.max_transfer
            ),
        )?;
        same(
            "volatile write cache",
            info.volatile_write_cache.to_string(),
            after.volatile_write_cache.to_string(),
        )?;
        expect_idle(&mut dev, CHECK, "looking at the reopened device")?;
        expect_data(
            &mut dev,
            CHECK,
            "reading flushed blocks after reopening",
            TAG_BASE | 5,
            0,
            3,
            seeds,
        )?;
        expect_data(
            &mut dev,
            CHECK,
            "reading the flushed last block after reopening",
            TAG_BASE | 6,
            n - 1,
            1,
            |_| last,
        )
    })();
    (outcome, Some(dev))
}

/// Reopening with writes and a flush in flight neither hangs nor panics; the device works after.
pub fn reopen_in_flight<F: DeviceFactory>(
    factory: &mut F,
    mut dev: F::Device,
) -> Reopened<F::Device> {
    const CHECK: &str = check::REOPEN_IN_FLIGHT.name;
    let n = capacity_blocks(&dev);
    let blocks = (u64::from(dev.info().max_transfer) / block_size(&dev)).clamp(1, 16);
    let k = dev.queue_depth().saturating_sub(1).min(32) as u64;
    let submitted = (|| {
        for i in 0..k {
            let lba = (i * blocks) % (n - blocks);
            let b = filled(&mut dev, CHECK, 0x1F + i, lba, blocks)?;
            submit(&mut dev, CHECK, Op::Write, TAG_BASE | i, lba, b)?;
        }
        dev.submit_flush(TAG_BASE | 0xFF)
            .map_err(|e| ContractFailure::device(CHECK, "submitting a flush", &e))
    })();
    if let Err(e) = submitted {
        return (Err(e), Some(dev));
    }
    let mut dev = match factory.reopen(dev) {
        Ok(d) => d,
        Err(e) => {
            return (
                Err(ContractFailure::device(
                    CHECK,
                    "reopening with I/O in flight",
                    &e,
                )),
                None,
            )
        }
    };
    let seed = 0x2F;
    let outcome = (|| {
        expect_idle(&mut dev, CHECK, "looking at the reopened device")?;
        write_now(&mut dev, CHECK, TAG_BASE | 0x100, seed, n / 3, 2)?;
        flush_now(&mut dev, CHECK, TAG_BASE | 0x101)?;
        expect_data(
            &mut dev,
            CHECK,
            "reading back a write made after reopening",
            TAG_BASE | 0x102,
            n / 3,
            2,
            |_| seed,
        )
    })();
    (outcome, Some(dev))
}
