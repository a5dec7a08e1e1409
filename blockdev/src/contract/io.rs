//! What the checks share: recognisable data, collecting completions with a deadline, and turning
//! device errors into failures that name the check.

use std::time::{Duration, Instant};

use super::ContractFailure;
use crate::{BlockDevice, Completion, IoBuffer, Op, Tag};

/// How long a check waits for the completions it is owed before it reports a hung device.
pub(super) const DEADLINE: Duration = Duration::from_secs(30);

/// Tags with high bits set, so that a backend that truncates tags is caught.
pub(super) const TAG_BASE: Tag = 0xC0DE_0000_0000_0000;

pub(super) fn block_size<D: BlockDevice + ?Sized>(dev: &D) -> u64 {
    u64::from(dev.info().logical_block_size)
}

pub(super) fn capacity_blocks<D: BlockDevice + ?Sized>(dev: &D) -> u64 {
    dev.info().capacity / block_size(dev).max(1)
}

/// The byte at offset `k` of block `block` when written with `seed`: it differs between blocks and
/// between seeds, so a read of the wrong block or of stale data shows.
fn pattern_word(seed: u64, block: u64) -> u64 {
    let mut z = seed ^ block.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn pattern_byte(word: u64, k: usize) -> u8 {
    (word >> (k % 8 * 8)) as u8 ^ (k / 8) as u8
}

/// Fills `buf` as the blocks from `lba` on, written with `seed`.
pub(super) fn fill(buf: &mut [u8], bs: u64, seed: u64, lba: u64) {
    for (i, block) in buf.chunks_mut(bs as usize).enumerate() {
        let w = pattern_word(seed, lba + i as u64);
        for (k, x) in block.iter_mut().enumerate() {
            *x = pattern_byte(w, k);
        }
    }
}

/// Where `buf` (the blocks from `lba` on) first differs from what `seeds` wrote: `seeds(block)`
/// names the seed each block was last written with.
pub(super) fn mismatch(
    buf: &[u8],
    bs: u64,
    lba: u64,
    seeds: impl Fn(u64) -> u64,
) -> Option<String> {
    for (i, block) in buf.chunks(bs as usize).enumerate() {
        let at = lba + i as u64;
        let w = pattern_word(seeds(at), at);
        if let Some((k, &got)) = block
            .iter()
            .enumerate()
            .find(|&(k, &x)| x != pattern_byte(w, k))
        {
            return Some(format!(
                "block {at} byte {k} reads {got:#04x}, expected {:#04x} (the data written there)",
                pattern_byte(w, k)
            ));
        }
    }
    None
}

pub(super) fn alloc<D: BlockDevice + ?Sized>(
    dev: &mut D,
    check: &'static str,
    len: usize,
) -> Result<IoBuffer, ContractFailure> {
    dev.alloc_buffer(len)
        .map_err(|e| ContractFailure::device(check, format!("allocating {len} bytes"), &e))
}

/// A buffer of `blocks` blocks holding what `seed` writes at `lba`.
pub(super) fn filled<D: BlockDevice + ?Sized>(
    dev: &mut D,
    check: &'static str,
    seed: u64,
    lba: u64,
    blocks: u64,
) -> Result<IoBuffer, ContractFailure> {
    let bs = block_size(dev);
    let mut b = alloc(dev, check, (blocks * bs) as usize)?;
    fill(&mut b, bs, seed, lba);
    Ok(b)
}

/// Submits a write or read; a refusal is a failure naming the I/O.
pub(super) fn submit<D: BlockDevice + ?Sized>(
    dev: &mut D,
    check: &'static str,
    op: Op,
    tag: Tag,
    lba: u64,
    buffer: IoBuffer,
) -> Result<(), ContractFailure> {
    let r = match op {
        Op::Write => dev.submit_write(tag, lba, buffer),
        _ => dev.submit_read(tag, lba, buffer),
    };
    r.map_err(|e| {
        ContractFailure::device(check, "submitting an I/O the contract accepts", &e).tag(tag)
    })
}

/// Waits until `want` more completions arrived; fails naming how many came.
pub(super) fn collect<D: BlockDevice + ?Sized>(
    dev: &mut D,
    check: &'static str,
    want: usize,
) -> Result<Vec<Completion>, ContractFailure> {
    let mut out = Vec::with_capacity(want);
    let deadline = Instant::now() + DEADLINE;
    while out.len() < want {
        let now = Instant::now();
        if now >= deadline {
            return Err(
                ContractFailure::new(check, "collecting completions").because(format!(
                    "only {} of {want} completions arrived within {} s ({} still in flight)",
                    out.len(),
                    DEADLINE.as_secs(),
                    dev.in_flight()
                )),
            );
        }
        dev.wait(&mut out, (deadline - now).min(Duration::from_secs(1)))
            .map_err(|e| ContractFailure::device(check, "waiting for completions", &e))?;
    }
    if out.len() > want {
        let extra: Vec<Tag> = out[want..].iter().map(|c| c.tag).collect();
        return Err(
            ContractFailure::new(check, "collecting completions").because(format!(
                "{want} I/Os were in flight, but completions for tags {extra:?} came too"
            )),
        );
    }
    Ok(out)
}

/// The completion's buffer after checking that it belongs to I/O `tag` (`op` at `lba`), succeeded
/// and brought back `len` bytes.
pub(super) fn completed(
    check: &'static str,
    c: Completion,
    op: Op,
    lba: u64,
    len: usize,
) -> Result<IoBuffer, ContractFailure> {
    let fail = |why: String| {
        Err(ContractFailure::new(check, "checking a completion")
            .op(op)
            .lba(lba)
            .tag(c.tag)
            .because(why))
    };
    if c.op != op || c.lba != lba {
        return fail(format!("the completion says {} at block {}", c.op, c.lba));
    }
    if let Err(e) = &c.result {
        return fail(format!("the I/O failed: {e}"));
    }
    match c.buffer {
        Some(b) if b.len() == len => Ok(b),
        Some(b) => fail(format!(
            "the buffer came back with {} bytes, submitted with {len}",
            b.len()
        )),
        None => fail("the buffer did not come back".into()),
    }
}

/// Checks a flush completion: its tag, success, block 0 and no buffer.
pub(super) fn flushed(
    check: &'static str,
    c: &Completion,
    tag: Tag,
) -> Result<(), ContractFailure> {
    let fail = |why: String| {
        Err(ContractFailure::new(check, "checking a flush completion")
            .op(Op::Flush)
            .tag(tag)
            .because(why))
    };
    if c.tag != tag || c.op != Op::Flush {
        return fail(format!("got {} with tag {} instead", c.op, c.tag));
    }
    if let Err(e) = &c.result {
        return fail(format!("the flush failed: {e}"));
    }
    if c.lba != 0 || c.buffer.is_some() {
        return fail(format!(
            "a flush completion carries block 0 and no buffer; this one block {} and {}",
            c.lba,
            if c.buffer.is_some() {
                "a buffer"
            } else {
                "no buffer"
            }
        ));
    }
    Ok(())
}

/// Submits a flush and waits for it.
pub(super) fn flush_now<D: BlockDevice + ?Sized>(
    dev: &mut D,
    check: &'static str,
    tag: Tag,
) -> Result<(), ContractFailure> {
    dev.submit_flush(tag)
        .map_err(|e| ContractFailure::device(check, "submitting a flush", &e).tag(tag))?;
    let c = collect(dev, check, 1)?;
    flushed(check, &c[0], tag)
}

/// Submits one write or read and waits for it; returns its buffer.
fn one_io<D: BlockDevice + ?Sized>(
    dev: &mut D,
    check: &'static str,
    op: Op,
    tag: Tag,
    lba: u64,
    buffer: IoBuffer,
) -> Result<IoBuffer, ContractFailure> {
    let len = buffer.len();
    submit(dev, check, op, tag, lba, buffer)?;
    let c = collect(dev, check, 1)?.remove(0);
    if c.tag != tag {
        return Err(ContractFailure::new(check, "waiting for one I/O")
            .op(op)
            .lba(lba)
            .tag(tag)
            .because(format!("the completion carries tag {:#x}", c.tag)));
    }
    completed(check, c, op, lba, len)
}

/// Writes `blocks` blocks of `seed` at `lba` and waits.
pub(super) fn write_now<D: BlockDevice + ?Sized>(
    dev: &mut D,
    check: &'static str,
    tag: Tag,
    seed: u64,
    lba: u64,
    blocks: u64,
) -> Result<(), ContractFailure> {
    let b = filled(dev, check, seed, lba, blocks)?;
    one_io(dev, check, Op::Write, tag, lba, b).map(drop)
}

/// Reads `blocks` blocks at `lba`, waits, and returns the bytes.
pub(super) fn read_now<D: BlockDevice + ?Sized>(
    dev: &mut D,
    check: &'static str,
    tag: Tag,
    lba: u64,
    blocks: u64,
) -> Result<IoBuffer, ContractFailure> {
    let b = alloc(dev, check, (blocks * block_size(dev)) as usize)?;
    one_io(dev, check, Op::Read, tag, lba, b)
}

/// Reads the blocks at `lba` and compares them with what `seeds(block)` wrote.
pub(super) fn expect_data<D: BlockDevice + ?Sized>(
    dev: &mut D,
    check: &'static str,
    step: &str,
    tag: Tag,
    lba: u64,
    blocks: u64,
    seeds: impl Fn(u64) -> u64,
) -> Result<(), ContractFailure> {
    let bs = block_size(dev);
    let b = read_now(dev, check, tag, lba, blocks)?;
    match mismatch(&b, bs, lba, seeds) {
        None => Ok(()),
        Some(why) => Err(ContractFailure::new(check, step)
            .op(Op::Read)
            .lba(lba)
            .tag(tag)
            .because(why)),
    }
}

/// Best effort after a failed check: collects what is still in flight, for a few seconds at most.
pub(super) fn settle<D: BlockDevice + ?Sized>(dev: &mut D) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut out = Vec::new();
    while dev.in_flight() > 0 && Instant::now() < deadline {
        out.clear();
        if dev.wait(&mut out, Duration::from_millis(100)).is_err() {
            return;
        }
    }
}

/// An error if anything is in flight or a completion is waiting, after the check refused I/O.
pub(super) fn expect_idle<D: BlockDevice + ?Sized>(
    dev: &mut D,
    check: &'static str,
    step: &str,
) -> Result<(), ContractFailure> {
    if dev.in_flight() != 0 {
        return Err(ContractFailure::new(check, step).because(format!(
            "{} I/Os are in flight, expected none",
            dev.in_flight()
        )));
    }
    let mut out = Vec::new();
    let n = dev
        .poll(&mut out)
        .map_err(|e| ContractFailure::device(check, step, &e))?;
    if n != 0 || !out.is_empty() {
        let tags: Vec<Tag> = out.iter().map(|c| c.tag).collect();
        return Err(ContractFailure::new(check, step).because(format!(
            "poll returned completions for tags {tags:?} with nothing in flight"
        )));
    }
    Ok(())
}
