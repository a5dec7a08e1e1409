//! Checks of what a device says about itself and of the memory it hands out.

use std::time::{Duration, Instant};

use super::io::{block_size, capacity_blocks, expect_idle};
use super::{check, ContractFailure, MIN_BLOCKS};
use crate::{BlockDevice, DeviceError, Op};

/// The device's report is self-consistent (see [`super::CHECKS`]).
pub fn geometry<D: BlockDevice + ?Sized>(dev: &mut D) -> Result<(), ContractFailure> {
    const CHECK: &str = check::GEOMETRY.name;
    let i = dev.info().clone();
    let fail =
        |why: String| Err(ContractFailure::new(CHECK, "reading the device info").because(why));
    let lbs = i.logical_block_size;
    if !(lbs.is_power_of_two() && lbs >= 512) {
        return fail(format!(
            "logical block size {lbs} is not a power of two >= 512"
        ));
    }
    let pbs = i.physical_block_size;
    if !(pbs.is_power_of_two() && pbs >= lbs) {
        return fail(format!(
            "physical block size {pbs} is not a power of two >= the logical block size {lbs}"
        ));
    }
    if i.fs_block_size != 0 && !i.fs_block_size.is_power_of_two() {
        return fail(format!(
            "file system block size {} is neither 0 nor a power of two",
            i.fs_block_size
        ));
    }
    if !i.write_unit().is_power_of_two() || i.write_unit() < lbs {
        return fail(format!(
            "write unit {} is not a power of two >= {lbs}",
            i.write_unit()
        ));
    }
    if i.capacity == 0 || !i.capacity.is_multiple_of(u64::from(lbs)) {
        return fail(format!(
            "capacity {} bytes is not a positive whole number of {lbs}-byte blocks",
            i.capacity
        ));
    }
    if capacity_blocks(dev) < MIN_BLOCKS {
        return fail(format!(
            "the device has {} blocks; the contract suite needs at least {MIN_BLOCKS}",
            capacity_blocks(dev)
        ));
    }
    if i.max_transfer < lbs || !i.max_transfer.is_multiple_of(lbs) {
        return fail(format!(
            "maximum transfer {} bytes is not a positive whole number of blocks",
            i.max_transfer
        ));
    }
    for (what, v) in [
        ("atomic write unit", i.atomic_write_unit),
        ("preferred write size", i.preferred_write),
    ] {
        if !v.is_multiple_of(lbs) {
            return fail(format!(
                "{what} {v} is neither 0 nor a whole number of blocks"
            ));
        }
    }
    if i.identity.trim().is_empty() {
        return fail("the identity is empty; logs could not tell devices apart".into());
    }
    if dev.queue_depth() == 0 {
        return fail("queue depth 0: no I/O could ever be submitted".into());
    }
    expect_idle(dev, CHECK, "looking at a device just opened")
}

/// Buffers are zeroed, sized and aligned as the contract says.
pub fn buffers<D: BlockDevice + ?Sized>(dev: &mut D) -> Result<(), ContractFailure> {
    const CHECK: &str = check::BUFFERS.name;
    let bs = block_size(dev) as usize;
    let align = bs.max(4096);
    let max = dev.info().max_transfer as usize;
    let mut keep = Vec::new();
    for len in [bs, 3 * 4096, 2 * bs + 4096, max] {
        let b = dev
            .alloc_buffer(len)
            .map_err(|e| ContractFailure::device(CHECK, format!("allocating {len} bytes"), &e))?;
        let fail = |why: String| {
            Err(ContractFailure::new(CHECK, format!("allocating {len} bytes")).because(why))
        };
        if b.len() != len || b.capacity() < len {
            return fail(format!(
                "got length {} and capacity {}",
                b.len(),
                b.capacity()
            ));
        }
        if !(b.as_ptr() as usize).is_multiple_of(align) {
            return fail(format!(
                "address {:p} is not aligned to {align} bytes",
                b.as_ptr()
            ));
        }
        if let Some(k) = b.iter().position(|&x| x != 0) {
            return fail(format!("byte {k} is {:#04x}, not zero", b[k]));
        }
        // Held, so that the next allocation cannot simply reuse this memory.
        keep.push(b);
    }
    // A recycled buffer comes back zeroed too, not with the previous holder's bytes.
    for mut b in keep.drain(..) {
        b.fill(0xA5);
    }
    let b = dev
        .alloc_buffer(bs)
        .map_err(|e| ContractFailure::device(CHECK, "allocating after a release", &e))?;
    if let Some(k) = b.iter().position(|&x| x != 0) {
        return Err(
            ContractFailure::new(CHECK, "allocating after a release").because(format!(
                "byte {k} is {:#04x}: a released buffer's bytes came back",
                b[k]
            )),
        );
    }
    match dev.alloc_buffer(0) {
        Err(DeviceError::BadRequest {
            op: Op::Allocate, ..
        }) => Ok(()),
        Err(e) => Err(ContractFailure::device(CHECK, "allocating 0 bytes", &e)
            .because(format!("refused, but not as a bad request: {e}"))),
        Ok(_) => Err(ContractFailure::new(CHECK, "allocating 0 bytes")
            .op(Op::Allocate)
            .because("a buffer of zero bytes was handed out".to_string())),
    }
}

/// With nothing in flight, `poll` and `wait` return nothing, and `wait` does not sleep.
pub fn idle_wait<D: BlockDevice + ?Sized>(dev: &mut D) -> Result<(), ContractFailure> {
    const CHECK: &str = check::IDLE_WAIT.name;
    expect_idle(dev, CHECK, "polling with nothing in flight")?;
    let timeout = Duration::from_secs(5);
    let mut out = Vec::new();
    let t = Instant::now();
    let n = dev
        .wait(&mut out, timeout)
        .map_err(|e| ContractFailure::device(CHECK, "waiting with nothing in flight", &e))?;
    let took = t.elapsed();
    let fail = |why: String| {
        Err(ContractFailure::new(CHECK, "waiting 5 s with nothing in flight").because(why))
    };
    if n != 0 || !out.is_empty() {
        return fail(format!("returned {n} completions"));
    }
    // No completion can come, so sleeping would only stall the caller. A second is slack for a
    // loaded machine, far below the timeout.
    if took >= Duration::from_secs(1) {
        return fail(format!("took {took:?} instead of returning at once"));
    }
    Ok(())
}
