//! Sequential reads of the log ring with a large read-ahead, for scans.

use blockdev::{BlockDevice, DeviceError, SyncIo};
use nvmq_log::layout::Geometry;

/// Read-ahead for scans: large enough that the device streams, small enough to stay cheap.
const READ_AHEAD: u64 = 4 << 20;

pub struct Cursor<'d, D: BlockDevice + ?Sized> {
    dev: &'d mut D,
    geo: Geometry,
    buf: Vec<u8>,
    /// Log position of buf[0].
    at: u64,
    pub bytes_read: u64,
}

impl<'d, D: BlockDevice + ?Sized> Cursor<'d, D> {
    pub fn new(dev: &'d mut D, geo: Geometry) -> Self {
        Cursor {
            dev,
            geo,
            buf: Vec::new(),
            at: 0,
            bytes_read: 0,
        }
    }

    /// The log bytes [position, position + len). Reads ahead; on a read error, retries just the
    /// asked range so that one bad block far ahead does not fail a good read.
    pub fn get(&mut self, position: u64, len: u64) -> Result<&[u8], DeviceError> {
        // Checked: a damaged superblock may name positions near u64::MAX.
        let have = position >= self.at
            && position
                .checked_add(len)
                .is_some_and(|end| end <= self.at.saturating_add(self.buf.len() as u64));
        if !have {
            let ahead = READ_AHEAD.max(len).min(self.geo.log_size);
            match self.fill(position, ahead) {
                Ok(()) => {}
                Err(_) if ahead > len => self.fill(position, len)?,
                Err(e) => return Err(e),
            }
        }
        let from = (position - self.at) as usize;
        Ok(&self.buf[from..from + len as usize])
    }

    fn fill(&mut self, position: u64, len: u64) -> Result<(), DeviceError> {
        self.buf.clear();
        self.at = position;
        for (off, n) in self.geo.segments(position, len) {
            if n > 0 {
                let part = self.dev.read_at(off, n as usize)?;
                self.bytes_read += n;
                self.buf.extend_from_slice(&part);
            }
        }
        Ok(())
    }
}
