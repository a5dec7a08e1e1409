//! Raw log reads for readers, through the writer that owns the device.

use super::*;

impl<D: BlockDevice> Writer<D> {
    pub(super) fn start_read(&mut self, position: u64, len: u64, reply: ReadFn) {
        let head = self.head();
        if position < head || position + len > self.durable || len > self.geo.max_batch {
            reply(Err(LogError::OffsetOutOfRange {
                partition: u32::MAX,
                offset: position,
                start: head,
                end: self.durable,
            }));
            return;
        }
        let segs = self.geo.segments(position, len);
        let id = self.bump_tag();
        let mut job = ReadJob {
            parts: [None, None],
            left: 0,
            reply: Some(reply),
            failed: None,
        };
        for (i, (off, n)) in segs.iter().enumerate() {
            if *n == 0 {
                continue;
            }
            let buf = match self.dev.alloc_buffer(*n as usize) {
                Ok(b) => b,
                Err(e) => {
                    job.failed = Some(LogError::Device {
                        op: "allocate a read buffer",
                        source: e,
                    });
                    break;
                }
            };
            let tag = TAG_READ | (id << 1) | i as u64;
            match self.dev.submit_read(tag, off / self.geo.logical_block, buf) {
                Ok(()) => job.left += 1,
                Err(e) => {
                    job.failed = Some(LogError::Device {
                        op: "submit a read",
                        source: e,
                    });
                    break;
                }
            }
        }
        if job.left == 0 {
            if let Some(r) = job.reply.take() {
                r(Err(job.failed.unwrap_or(LogError::Shutdown)));
            }
            return;
        }
        self.reads.insert(id, job);
    }

    pub(super) fn read_done(&mut self, c: Completion) {
        let id = (c.tag & !TAG_KIND) >> 1;
        let part = (c.tag & 1) as usize;
        let Some(job) = self.reads.get_mut(&id) else {
            return;
        };
        job.left -= 1;
        match (c.result, c.buffer) {
            (Ok(()), Some(b)) => job.parts[part] = Some(b.to_vec()),
            (Err(e), _) => {
                job.failed = Some(LogError::Device {
                    op: "read the log",
                    source: e,
                })
            }
            (Ok(()), None) => job.failed = Some(LogError::Shutdown),
        }
        if job.left > 0 {
            return;
        }
        if let Some(mut job) = self.reads.remove(&id) {
            let result = match job.failed.take() {
                Some(e) => Err(e),
                None => {
                    let mut out = job.parts[0].take().unwrap_or_default();
                    if let Some(second) = job.parts[1].take() {
                        out.extend_from_slice(&second);
                    }
                    Ok(out)
                }
            };
            self.shared.lock().stats.reads += 1;
            if let Some(r) = job.reply.take() {
                r(result);
            }
        }
    }
}
