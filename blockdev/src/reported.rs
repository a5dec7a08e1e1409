//! A device that reports other facts about itself than the device it wraps has: for tests of what
//! nvmq does with a device's claims (a capacity it does not have, a file system block larger
//! than the log's write unit). Every I/O goes to the wrapped device unchanged.

use std::time::Duration;

use crate::{BlockDevice, Completion, DeviceError, DeviceInfo, IoBuffer, Tag};

pub struct Reported<D> {
    inner: D,
    info: DeviceInfo,
}

impl<D: BlockDevice> Reported<D> {
    /// `inner`, reporting its own `DeviceInfo` as `change` leaves it.
    pub fn new(inner: D, change: impl FnOnce(&mut DeviceInfo)) -> Reported<D> {
        let mut info = inner.info().clone();
        change(&mut info);
        Reported { inner, info }
    }

    pub fn into_inner(self) -> D {
        self.inner
    }
}

impl<D: BlockDevice> BlockDevice for Reported<D> {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn alloc_buffer(&mut self, len: usize) -> Result<IoBuffer, DeviceError> {
        self.inner.alloc_buffer(len)
    }
    fn queue_depth(&self) -> usize {
        self.inner.queue_depth()
    }
    fn submit_write(&mut self, tag: Tag, lba: u64, buffer: IoBuffer) -> Result<(), DeviceError> {
        self.inner.submit_write(tag, lba, buffer)
    }
    fn submit_read(&mut self, tag: Tag, lba: u64, buffer: IoBuffer) -> Result<(), DeviceError> {
        self.inner.submit_read(tag, lba, buffer)
    }
    fn submit_flush(&mut self, tag: Tag) -> Result<(), DeviceError> {
        self.inner.submit_flush(tag)
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
    #[cfg(unix)]
    fn completion_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.completion_fd()
    }
    fn arm_completion_fd(&mut self) {
        self.inner.arm_completion_fd()
    }
    fn submit_write_flush(
        &mut self,
        write_tag: Tag,
        lba: u64,
        buffer: IoBuffer,
        flush_tag: Tag,
    ) -> Result<(), DeviceError> {
        self.inner
            .submit_write_flush(write_tag, lba, buffer, flush_tag)
    }
}
