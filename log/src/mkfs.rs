//! Formatting a device: the first checkpoint and both superblock copies, each a flush apart.

use blockdev::{BlockDevice, SyncIo};

use crate::batch::BatchBuilder;
use crate::config::FormatOptions;
use crate::format::{
    superblock_offset, BatchKind, RecordKind, Superblock, SuperblockFault, FORMAT_VERSION,
    LOG_START, MAX_WRITE_UNIT, SUPERBLOCK_LEN,
};
use crate::state::Registry;
use crate::LogError;

/// The smallest log a geometry allows: the writer needs room for the in-flight window, a batch,
/// a checkpoint and a recovery-point lag of at least one batch, or it could wait on itself.
pub fn min_log_size(window: u64, max_batch: u64) -> u64 {
    window + 4 * max_batch
}

/// A format id no other format is likely to share: std's per-process random hash keys, mixed
/// with the time and the process id.
pub fn random_format_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish() | 1
}

/// [`format`] as a device initializer (for `FileDevice::create`, which formats a new file before
/// it is renamed into place): a format failure becomes a device error naming it.
pub fn format_device<D: BlockDevice + ?Sized>(
    dev: &mut D,
    opts: &FormatOptions,
) -> Result<(), blockdev::DeviceError> {
    format(dev, opts)
        .map(|_| ())
        .map_err(|e| blockdev::DeviceError::Io {
            op: blockdev::Op::Write,
            lba: 0,
            detail: format!("formatting the new device: {e}"),
        })
}

/// Writes a new, empty log over the whole device (or `opts.log_size` of it). Whatever the device
/// held before can never validate in the new log: its format id differs.
pub fn format<D: BlockDevice + ?Sized>(
    dev: &mut D,
    opts: &FormatOptions,
) -> Result<Superblock, LogError> {
    let info = dev.info().clone();
    let u = info.write_unit();
    if u > MAX_WRITE_UNIT || !u.is_power_of_two() {
        return Err(LogError::Config(format!(
            "write unit {u} B is not a power of two of at most 1 MiB"
        )));
    }
    let u64u = u64::from(u);
    if info.capacity <= LOG_START {
        return Err(LogError::Config(format!(
            "device of {} B is too small: the log starts at 2 MiB",
            info.capacity
        )));
    }
    let room = (info.capacity - LOG_START) / u64u * u64u;
    let log_size = match opts.log_size {
        Some(s) if s > room => {
            return Err(LogError::Config(format!(
                "log size {s} B does not fit the device ({room} B available after the superblocks)"
            )))
        }
        Some(s) => s / u64u * u64u,
        None => room,
    };
    let max_batch = u64::from(opts.max_batch.min(info.max_transfer)) / u64u * u64u;
    if max_batch < u64u {
        return Err(LogError::Config(format!(
            "maximum batch {} B is smaller than the write unit {u} B",
            opts.max_batch
        )));
    }
    let window = opts.window.max(max_batch);
    let min = min_log_size(window, max_batch);
    if log_size < min {
        return Err(LogError::Config(format!(
            "log of {log_size} B is too small for a window of {window} B and batches of {max_batch} B (at least {min} B)"
        )));
    }
    let format_id = opts.format_id.unwrap_or_else(random_format_id);

    // The first checkpoint: an empty registry at position 0, so recovery always starts from one.
    let mut buf = vec![0u8; max_batch as usize];
    let mut b = BatchBuilder::new(&mut buf, format_id, 1, 0);
    b.push(RecordKind::Checkpoint, 0, 0, &Registry::default().encode());
    let (len, _) = b.finish(u as usize, BatchKind::Checkpoint, 0, 0, now_ms());
    let io = LogError::device("format");
    dev.write_at(LOG_START, &buf[..len]).map_err(io)?;
    dev.flush().map_err(LogError::device("format"))?;

    let a = Superblock {
        version: FORMAT_VERSION,
        format_id,
        copy: 0,
        sequence: 1,
        parent: 0,
        write_unit: u,
        log_start: LOG_START,
        log_size,
        max_batch: max_batch as u32,
        head: 0,
        recovery_point: 0,
        recovery_link: 0,
        checkpoint: 0,
        durable_through: len as u64,
        epoch: 1,
        epoch_start: 0,
        window,
    };
    write_superblock(dev, &a)?;
    let b = Superblock {
        copy: 1,
        sequence: 2,
        parent: a.checksum(),
        ..a
    };
    write_superblock(dev, &b)?;
    Ok(b)
}

/// Writes one superblock copy into its slot and flushes: a synchronous update for format and
/// recovery (the writer does its own, sharing its flushes).
pub fn write_superblock<D: BlockDevice + ?Sized>(
    dev: &mut D,
    sb: &Superblock,
) -> Result<(), LogError> {
    let mut block = vec![0u8; sb.write_unit as usize];
    block[..SUPERBLOCK_LEN].copy_from_slice(&sb.encode());
    dev.write_at(superblock_offset(sb.copy), &block)
        .map_err(LogError::device("write a superblock"))?;
    dev.flush().map_err(LogError::device("flush a superblock"))
}

/// Reads both superblock slots; each is the copy or why it is not valid.
pub fn read_superblocks<D: BlockDevice + ?Sized>(
    dev: &mut D,
) -> [Result<Superblock, SuperblockFault>; 2] {
    let bs = dev.info().logical_block_size as usize;
    let len = SUPERBLOCK_LEN.div_ceil(bs) * bs;
    let mut read = |slot: u8| match dev.read_at(superblock_offset(slot), len) {
        Ok(bytes) => Superblock::decode(&bytes, slot),
        Err(e) => Err(SuperblockFault::Unreadable(e.to_string())),
    };
    [read(0), read(1)]
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
