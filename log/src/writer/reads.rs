//! Raw log reads for readers, through the writer that owns the device.

use super::*;
use crate::read_pieces::{check_bounds, out_of_range, Landing};

/// Low bits of a read's tag that name its piece; the bits above name the read.
const READ_PIECE_BITS: u32 = 16;
const READ_PIECE_MASK: u64 = (1 << READ_PIECE_BITS) - 1;

/// The key of read `id` in `reads`, as its tags carry it (the bits that fit beside the piece
/// index below the tag kind; ids come from the tag counter, so a key repeats only after 2^40
/// I/Os, long after any read with it finished).
fn read_key(id: u64) -> u64 {
    ((id << READ_PIECE_BITS) & !TAG_KIND) >> READ_PIECE_BITS
}

/// Reads that may wait for queue slots at once; more are refused as unavailable (the readers
/// retry), so that waiting costs bounded memory.
const MAX_READS_WAITING: usize = 4096;

impl<D: BlockDevice> Writer<D> {
    /// Starts the reads that waited for queue slots, in order, while they fit.
    pub(super) fn start_waiting_reads(&mut self) {
        while let Some(&(position, len, _)) = self.reads_waiting.front() {
            let pieces = self.geo.pieces(position, len, self.io.max_io).len();
            if self.read_ios + pieces > self.read_slots {
                return;
            }
            if let Some((position, len, reply)) = self.reads_waiting.pop_front() {
                self.submit_read(position, len, reply);
            }
        }
    }

    pub(super) fn start_read(&mut self, position: u64, len: u64, reply: ReadFn) {
        let bounds = check_bounds(position, len, self.head(), self.durable, self.geo.max_batch);
        if let Err(e) = bounds {
            reply(Err(e));
            return;
        }
        // Cut like a batch write: at the ring's end and to the device's maximum transfer.
        let pieces = self.geo.pieces(position, len, self.io.max_io);
        if pieces.len() as u64 > READ_PIECE_MASK {
            reply(Err(LogError::Unavailable(format!(
                "a read of {len} B would take {} device reads of at most {} B",
                pieces.len(),
                self.io.max_io
            ))));
            return;
        }
        // Only in the slots the writer's own I/Os leave (open refuses a queue without room for
        // one read); reads wait their turn in order.
        if !self.reads_waiting.is_empty() || self.read_ios + pieces.len() > self.read_slots {
            if self.reads_waiting.len() >= MAX_READS_WAITING {
                reply(Err(LogError::Unavailable(format!(
                    "{MAX_READS_WAITING} reads already wait for the device"
                ))));
            } else {
                self.reads_waiting.push_back((position, len, reply));
            }
            return;
        }
        self.submit_read(position, len, reply);
    }

    /// Submits a checked read's pieces (unless retention freed its bytes while it waited).
    fn submit_read(&mut self, position: u64, len: u64, reply: ReadFn) {
        let head = self.head();
        if position < head {
            reply(Err(out_of_range(position, head, self.durable)));
            return;
        }
        let pieces = self.geo.pieces(position, len, self.io.max_io);
        let key = read_key(self.bump_tag());
        let mut job = ReadJob {
            landing: Landing::new(len, &pieces),
            left: 0,
            reply: Some(reply),
        };
        for (i, &(off, _, n)) in pieces.iter().enumerate() {
            let tag = TAG_READ | (key << READ_PIECE_BITS) | i as u64;
            let submitted = self
                .dev
                .alloc_buffer(n as usize)
                .map_err(LogError::device("allocate a read buffer"))
                .and_then(|buf| {
                    self.dev
                        .submit_read(tag, off / self.geo.logical_block, buf)
                        .map_err(LogError::device("submit a read"))
                });
            if let Err(e) = submitted {
                job.landing.fail(e);
                break;
            }
            job.left += 1;
            self.read_ios += 1;
        }
        if job.left == 0 {
            if let Some(r) = job.reply.take() {
                r(Err(job
                    .landing
                    .finish()
                    .err()
                    .unwrap_or(LogError::Shutdown)));
            }
            return;
        }
        self.reads.insert(key, job);
    }

    pub(super) fn read_done(&mut self, c: Completion) {
        let key = (c.tag & !TAG_KIND) >> READ_PIECE_BITS;
        let piece = (c.tag & READ_PIECE_MASK) as usize;
        self.read_ios = self.read_ios.saturating_sub(1);
        let Some(job) = self.reads.get_mut(&key) else {
            return;
        };
        job.left -= 1;
        job.landing.land(piece, c.result, c.buffer);
        if job.left > 0 {
            return;
        }
        if let Some(job) = self.reads.remove(&key) {
            self.shared.lock().stats.reads += 1;
            if let Some(r) = job.reply {
                r(job.landing.finish());
            }
        }
    }
}
