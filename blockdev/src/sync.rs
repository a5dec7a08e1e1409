//! Blocking helpers over the polled contract, for code that does one I/O at a time (format,
//! recovery, tools). They must run while no other I/O is outstanding on the device, because they
//! consume every completion that arrives.

use std::time::Duration;

use crate::{BlockDevice, Completion, DeviceError, IoBuffer, Op};

/// How long the blocking helpers wait for one completion before reporting a hung device.
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);

const SYNC_TAG: u64 = u64::MAX;

fn wait_one<D: BlockDevice + ?Sized>(dev: &mut D, op: Op) -> Result<Completion, DeviceError> {
    let mut out = Vec::with_capacity(1);
    let deadline = std::time::Instant::now() + SYNC_TIMEOUT;
    loop {
        let now = std::time::Instant::now();
        if now >= deadline {
            return Err(DeviceError::Timeout {
                op,
                millis: SYNC_TIMEOUT.as_millis() as u64,
            });
        }
        dev.wait(&mut out, deadline - now)?;
        if let Some(c) = out.pop() {
            return Ok(c);
        }
    }
}

/// Writes `buffer` at `lba` and waits; gives the buffer back.
pub fn write_sync<D: BlockDevice + ?Sized>(
    dev: &mut D,
    lba: u64,
    buffer: IoBuffer,
) -> Result<IoBuffer, DeviceError> {
    dev.submit_write(SYNC_TAG, lba, buffer)?;
    let c = wait_one(dev, Op::Write)?;
    c.result?;
    c.buffer.ok_or(DeviceError::Io {
        op: Op::Write,
        lba,
        detail: "the device returned no buffer".into(),
    })
}

/// Reads into `buffer` from `lba` and waits; gives the buffer back filled.
pub fn read_sync<D: BlockDevice + ?Sized>(
    dev: &mut D,
    lba: u64,
    buffer: IoBuffer,
) -> Result<IoBuffer, DeviceError> {
    dev.submit_read(SYNC_TAG, lba, buffer)?;
    let c = wait_one(dev, Op::Read)?;
    c.result?;
    c.buffer.ok_or(DeviceError::Io {
        op: Op::Read,
        lba,
        detail: "the device returned no buffer".into(),
    })
}

/// Flushes and waits.
pub fn flush_sync<D: BlockDevice + ?Sized>(dev: &mut D) -> Result<(), DeviceError> {
    dev.submit_flush(SYNC_TAG)?;
    wait_one(dev, Op::Flush)?.result
}

/// Byte-addressed blocking access for cold paths: reads and writes of any block-aligned range,
/// split at the device's maximum transfer.
pub trait SyncIo {
    fn read_at(&mut self, byte_offset: u64, len: usize) -> Result<Vec<u8>, DeviceError>;
    fn write_at(&mut self, byte_offset: u64, data: &[u8]) -> Result<(), DeviceError>;
    fn flush(&mut self) -> Result<(), DeviceError>;
}

impl<D: BlockDevice + ?Sized> SyncIo for D {
    fn read_at(&mut self, byte_offset: u64, len: usize) -> Result<Vec<u8>, DeviceError> {
        let bs = u64::from(self.info().logical_block_size);
        let chunk = chunk_size(self.info().max_transfer, bs);
        let mut out = Vec::with_capacity(len);
        let mut done = 0usize;
        let mut buf: Option<IoBuffer> = None;
        while done < len {
            let n = (len - done).min(chunk);
            let pos = byte_offset + done as u64;
            let lba = aligned_lba(pos, n, bs, Op::Read)?;
            let mut b = match buf.take() {
                Some(b) => b,
                None => self.alloc_buffer(chunk)?,
            };
            b.set_len(n);
            let b = read_sync(self, lba, b)?;
            out.extend_from_slice(&b);
            buf = Some(b);
            done += n;
        }
        Ok(out)
    }

    fn write_at(&mut self, byte_offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        let bs = u64::from(self.info().logical_block_size);
        let chunk = chunk_size(self.info().max_transfer, bs);
        let mut done = 0usize;
        let mut buf: Option<IoBuffer> = None;
        while done < data.len() {
            let n = (data.len() - done).min(chunk);
            let pos = byte_offset + done as u64;
            let lba = aligned_lba(pos, n, bs, Op::Write)?;
            let mut b = match buf.take() {
                Some(b) => b,
                None => self.alloc_buffer(chunk)?,
            };
            b.set_len(n);
            b.copy_from_slice(&data[done..done + n]);
            buf = Some(write_sync(self, lba, b)?);
            done += n;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), DeviceError> {
        flush_sync(self)
    }
}

fn chunk_size(max_transfer: u32, bs: u64) -> usize {
    let m = u64::from(max_transfer).min(1 << 20);
    (m - m % bs).max(bs) as usize
}

fn aligned_lba(pos: u64, len: usize, bs: u64, op: Op) -> Result<u64, DeviceError> {
    if !pos.is_multiple_of(bs) || !(len as u64).is_multiple_of(bs) {
        return Err(DeviceError::BadRequest {
            op,
            lba: pos / bs,
            len,
            why: "byte range is not aligned to the logical block size",
        });
    }
    Ok(pos / bs)
}
