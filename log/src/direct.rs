//! Log reads on queue pairs of their own: a reader thread takes a free pair of the device (an
//! NVMe controller's extra I/O queue pair, `NvmeDevice::queue_pair`), submits the pieces of its
//! read there and reaps them itself, instead of handing the read to the thread that hosts the
//! writer and waiting for the answer (two thread hops, and a read in the slots the writer's own
//! I/O leaves).
//!
//! The single writer keeps the tail: a pair here only reads, and only what the writer would
//! have served (at or above the head, below D, at most a batch). D moved past those bytes after
//! their writes completed, so a read submitted now sees them on any queue. If retention frees
//! them while the read runs, the writer may overwrite them; the reader's checks then fail and
//! it answers "out of range" after looking at the head again (`reader::read_from`), exactly as
//! for a read through the writer.
//!
//! The pool's lock is taken once per read to take a pair and once to give it back, never per
//! I/O: while a thread holds a pair, it alone submits and reaps on it. With no pair free (more
//! readers at once than pairs, or a controller that granted none), the read goes through the
//! writer as before.

use std::sync::Mutex;

use blockdev::{BlockDevice, Completion};

use crate::layout::Geometry;
use crate::read_pieces::{self, Landing};
use crate::shared::Shared;
use crate::LogError;

/// The read-only queue pairs of a log's device.
pub struct DirectReads {
    pairs: Mutex<Vec<Box<dyn BlockDevice>>>,
    count: usize,
}

impl DirectReads {
    pub fn new(pairs: Vec<Box<dyn BlockDevice>>) -> DirectReads {
        DirectReads {
            count: pairs.len(),
            pairs: Mutex::new(pairs),
        }
    }

    /// How many pairs the pool holds.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn take(&self) -> Option<Box<dyn BlockDevice>> {
        self.pairs.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    fn give_back(&self, dev: Box<dyn BlockDevice>) {
        self.pairs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(dev);
    }

    /// `len` raw log bytes at `position`, read on a free pair; `None` when none is free (the
    /// caller reads through the writer).
    pub(crate) fn read(
        &self,
        shared: &Shared,
        geo: &Geometry,
        position: u64,
        len: u64,
    ) -> Option<Result<Vec<u8>, LogError>> {
        {
            // The same bounds the writer checks for a read it serves.
            let s = shared.lock();
            if let Err(e) =
                read_pieces::check_bounds(position, len, s.head, s.durable, geo.max_batch)
            {
                return Some(Err(e));
            }
        }
        let mut dev = self.take()?;
        let result = read_on(&mut *dev, geo, position, len);
        self.give_back(dev);
        let mut s = shared.lock();
        s.stats.reads += 1;
        s.stats.direct_reads += 1;
        Some(result)
    }
}

/// Reads the pieces of `len` bytes at `position` (cut at the ring's end and to the device's
/// maximum transfer, as the writer cuts them), as many in flight as the pair takes.
fn read_on(
    dev: &mut dyn BlockDevice,
    geo: &Geometry,
    position: u64,
    len: u64,
) -> Result<Vec<u8>, LogError> {
    let pieces = geo.pieces(position, len, u64::from(dev.info().max_transfer));
    let mut landing = Landing::new(len, &pieces);
    let mut out: Vec<Completion> = Vec::with_capacity(pieces.len().min(dev.queue_depth()));
    let (mut next, mut done) = (0usize, 0usize);
    while done < next || (next < pieces.len() && !landing.has_failed()) {
        while !landing.has_failed() && next < pieces.len() && dev.in_flight() < dev.queue_depth() {
            let (off, _, n) = pieces[next];
            let submitted = dev
                .alloc_buffer(n as usize)
                .map_err(LogError::device("allocate a read buffer"))
                .and_then(|b| {
                    dev.submit_read(next as u64, off / geo.logical_block, b)
                        .map_err(LogError::device("submit a read"))
                });
            match submitted {
                Ok(()) => next += 1,
                Err(e) => landing.fail(e),
            }
        }
        if done == next {
            break;
        }
        out.clear();
        // Polled, with interrupts off; between empty polls the thread yields its core, so
        // that readers waiting on a drive do not starve the loops and the writer of a shared
        // machine (the driver's own I/O timeout still bounds a command that never completes).
        if dev
            .poll(&mut out)
            .map_err(LogError::device("read the log"))?
            == 0
        {
            std::thread::yield_now();
        }
        for c in out.drain(..) {
            done += 1;
            landing.land(c.tag as usize, c.result, c.buffer);
        }
    }
    landing.finish()
}
