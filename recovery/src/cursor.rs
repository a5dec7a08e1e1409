//! Sequential reads of the log ring with a large read-ahead, for scans.

use blockdev::{BlockDevice, SyncIo};
use nvmq_log::backfill::RawRead;
use nvmq_log::layout::Geometry;

/// Where a scan reads log bytes from: the device itself (recovery, tools), or the running writer's
/// read path (the background index rebuild, which must not touch a device the writer owns).
pub trait LogSource {
    /// The log bytes `[position, position + len)`, or why they could not be read.
    fn read_log(&mut self, geo: &Geometry, position: u64, len: u64) -> Result<Vec<u8>, String>;
}

/// A device read directly, as recovery does before the writer starts.
pub struct DeviceSource<'d, D: BlockDevice + ?Sized>(pub &'d mut D);

impl<D: BlockDevice + ?Sized> LogSource for DeviceSource<'_, D> {
    fn read_log(&mut self, geo: &Geometry, position: u64, len: u64) -> Result<Vec<u8>, String> {
        let mut out = Vec::with_capacity(len as usize);
        for (off, n) in geo.segments(position, len) {
            if n > 0 {
                let part = self.0.read_at(off, n as usize).map_err(|e| e.to_string())?;
                out.extend_from_slice(&part);
            }
        }
        Ok(out)
    }
}

/// Reads through the writer (log positions, served only below its durable point).
pub struct WriterSource<'a, 'r>(pub &'a mut RawRead<'r>);

impl LogSource for WriterSource<'_, '_> {
    fn read_log(&mut self, geo: &Geometry, position: u64, len: u64) -> Result<Vec<u8>, String> {
        // The writer reads at most one maximum batch at a time.
        let mut out = Vec::with_capacity(len as usize);
        let mut at = position;
        while at < position + len {
            let n = (position + len - at).min(geo.max_batch);
            out.extend_from_slice(&(self.0)(at, n).map_err(|e| e.to_string())?);
            at += n;
        }
        Ok(out)
    }
}

/// Read-ahead for scans: large enough that the device streams, small enough to stay cheap.
const READ_AHEAD: u64 = 4 << 20;

pub struct Cursor<'d, S: LogSource + ?Sized> {
    src: &'d mut S,
    geo: Geometry,
    buf: Vec<u8>,
    /// Log position of buf[0].
    at: u64,
    pub bytes_read: u64,
}

impl<'d, S: LogSource + ?Sized> Cursor<'d, S> {
    pub fn new(src: &'d mut S, geo: Geometry) -> Self {
        Cursor {
            src,
            geo,
            buf: Vec::new(),
            at: 0,
            bytes_read: 0,
        }
    }

    /// The log bytes [position, position + len). Reads ahead; on a read error, retries just the
    /// asked range so that one bad block far ahead does not fail a good read.
    pub fn get(&mut self, position: u64, len: u64) -> Result<&[u8], String> {
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

    fn fill(&mut self, position: u64, len: u64) -> Result<(), String> {
        self.buf.clear();
        self.at = position;
        self.buf = self.src.read_log(&self.geo, position, len)?;
        self.bytes_read += len;
        Ok(())
    }
}
