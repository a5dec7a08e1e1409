//! A device wrapper for commands that must never change what they look at (`inspect`, `verify`):
//! writes and flushes are refused before they reach the device, and reads are counted for the
//! progress bar.

use std::time::Duration;

use blockdev::{BlockDevice, Completion, DeviceError, DeviceInfo, IoBuffer, Op, Tag};

/// Refuses every write and flush; passes reads through and reports the bytes read.
pub struct ReadOnly<D: BlockDevice> {
    inner: D,
    on_read: Box<dyn FnMut(u64) + Send>,
}

impl<D: BlockDevice> ReadOnly<D> {
    /// `on_read` is called with the length of every read submitted.
    pub fn new(inner: D, on_read: impl FnMut(u64) + Send + 'static) -> Self {
        ReadOnly {
            inner,
            on_read: Box::new(on_read),
        }
    }
}

fn refused(op: Op, lba: u64) -> DeviceError {
    DeviceError::BadRequest {
        op,
        lba,
        len: 0,
        why: "this command is read-only and never writes or flushes",
    }
}

impl<D: BlockDevice> BlockDevice for ReadOnly<D> {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }
    fn alloc_buffer(&mut self, len: usize) -> Result<IoBuffer, DeviceError> {
        self.inner.alloc_buffer(len)
    }
    fn queue_depth(&self) -> usize {
        self.inner.queue_depth()
    }
    fn submit_write(&mut self, _tag: Tag, lba: u64, _buffer: IoBuffer) -> Result<(), DeviceError> {
        Err(refused(Op::Write, lba))
    }
    fn submit_read(&mut self, tag: Tag, lba: u64, buffer: IoBuffer) -> Result<(), DeviceError> {
        let len = buffer.len() as u64;
        self.inner.submit_read(tag, lba, buffer)?;
        (self.on_read)(len);
        Ok(())
    }
    fn submit_flush(&mut self, _tag: Tag) -> Result<(), DeviceError> {
        Err(refused(Op::Flush, 0))
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, DeviceError> {
        self.inner.poll(out)
    }
    fn wait(&mut self, out: &mut Vec<Completion>, timeout: Duration) -> Result<usize, DeviceError> {
        self.inner.wait(out, timeout)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockdev::sim::{SimConfig, SimDevice};
    use blockdev::SyncIo;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    #[test]
    fn writes_and_flushes_are_refused_and_reads_counted() {
        let (dev, handle) = SimDevice::new(SimConfig::new(7, 4 << 20));
        handle.poke_durable(0, &[9u8; 512]);
        let read = Arc::new(AtomicU64::new(0));
        let r = read.clone();
        let mut ro = ReadOnly::new(dev, move |n| {
            r.fetch_add(n, Ordering::Relaxed);
        });
        let e = ro.write_at(0, &[1u8; 4096]).unwrap_err();
        assert!(e.to_string().contains("read-only"), "{e}");
        assert!(ro.flush().is_err());
        let bytes = ro.read_at(0, 4096).unwrap();
        assert_eq!(bytes[..512], [9u8; 512]);
        assert_eq!(read.load(Ordering::Relaxed), 4096);
        assert_eq!(handle.peek(0, 4096)[..512], [9u8; 512]);
    }
}
