//! What the ring does with a CQE: deliver, continue a short transfer, and carry a linked flush
//! through its write (see the parent module: a cancelled fsync, or one that ran after a write that
//! was cut short, is never reported as a success).

use std::io;

use super::{Link, Ring, Then};
use crate::file::engine::{not_run_error, FlushEvent};
use crate::file::threads::{io_error, no_progress};
use crate::{Completion, DeviceError, Op};

impl Ring {
    /// A write's or read's CQE: continued when short (or `EINTR`), else delivered.
    pub(super) fn transfer_done(
        &mut self,
        idx: u32,
        res: i32,
        out: &mut Vec<Completion>,
        events: &mut Vec<FlushEvent>,
    ) {
        let Some(slot) = self.slots[idx as usize].as_mut() else {
            return;
        };
        let (op, lba) = (slot.op, slot.lba);
        let len = slot.buffer.as_ref().map_or(0, |b| b.len());
        let again = res == -libc::EINTR || (res > 0 && slot.done + (res as usize) < len);
        if res > 0 {
            slot.done += res as usize;
        }
        let done = slot.done;
        if again {
            if let Then::Flush(f) = slot.then {
                // The kernel severs a link whose write was short or interrupted.
                self.cut(f);
            }
            match self.queue(idx, None) {
                Ok(()) => return,
                Err(e) => return self.finish_transfer(idx, Err(e), out, events),
            }
        }
        let result = if res < 0 {
            Err(io_error(op, lba, &io::Error::from_raw_os_error(-res)))
        } else if res == 0 {
            Err(no_progress(op, lba, done, len))
        } else {
            Ok(())
        };
        self.finish_transfer(idx, result, out, events);
    }

    /// Frees a write's or read's slot, delivers its completion, then settles what followed it.
    fn finish_transfer(
        &mut self,
        idx: u32,
        result: Result<(), DeviceError>,
        out: &mut Vec<Completion>,
        events: &mut Vec<FlushEvent>,
    ) {
        let Some(s) = self.release(idx) else {
            return;
        };
        let (then, lba) = (s.then, s.lba);
        let written = match then {
            Then::Nothing => Ok(()),
            _ => result.clone().map_err(|e| not_run_error(lba, &e)),
        };
        out.push(Completion {
            tag: s.tag,
            op: s.op,
            lba: s.lba,
            buffer: s.buffer,
            result,
        });
        match then {
            Then::Nothing => {}
            Then::Due(tag) => events.push(match written {
                Ok(()) => FlushEvent::Due { tag },
                Err(err) => FlushEvent::Unrun {
                    desc: None,
                    tag,
                    err,
                },
            }),
            Then::Flush(f) => self.write_finished(f, written, events),
        }
    }

    /// The write of linked flush `f` was short: its link is broken.
    fn cut(&mut self, f: u32) {
        if let Some(fs) = self.slots[f as usize].as_mut() {
            if let Link::Linked { write } = fs.link {
                fs.link = Link::Cut { write };
            }
        }
    }

    /// The write of linked flush `f` completed with `written` (its error already worded for the
    /// flush).
    fn write_finished(
        &mut self,
        f: u32,
        written: Result<(), DeviceError>,
        events: &mut Vec<FlushEvent>,
    ) {
        let Some(fs) = self.slots[f as usize].as_mut() else {
            return;
        };
        match std::mem::replace(&mut fs.link, Link::Own) {
            // Its SQE is still in the kernel: its CQE decides.
            link @ (Link::Linked { .. } | Link::Cut { .. }) => {
                let cut = matches!(link, Link::Cut { .. });
                fs.link = match written {
                    Ok(()) => Link::WriteOk { cut },
                    Err(e) => Link::WriteFailed(e),
                };
            }
            Link::Parked => match written {
                Ok(()) => self.issue_after_write(f, events),
                Err(e) => self.unrun(f, e, events),
            },
            other => fs.link = other,
        }
    }

    /// A flush's CQE.
    pub(super) fn fsync_done(&mut self, f: u32, res: i32, events: &mut Vec<FlushEvent>) {
        let Some(fs) = self.slots[f as usize].as_mut() else {
            return;
        };
        let unrun = res == -libc::ECANCELED || res == -libc::EINTR;
        match std::mem::replace(&mut fs.link, Link::Own) {
            Link::Own => {}
            // An intact link: the fsync ran after the whole write, and its result stands.
            Link::Linked { write } if !unrun => self.unlink(write),
            Link::Linked { .. } => {
                fs.link = Link::Parked;
                return;
            }
            // A failure of the fsync itself stands (the device stops); anything else is parked
            // until the write has completed, even a success, which cannot cover the rest.
            Link::Cut { write } if res < 0 && !unrun => self.unlink(write),
            Link::Cut { .. } => {
                fs.link = Link::Parked;
                return;
            }
            Link::WriteOk { cut } if unrun || (cut && res >= 0) => {
                return self.issue_after_write(f, events)
            }
            Link::WriteOk { .. } => {}
            Link::WriteFailed(e) if res >= 0 || unrun => return self.unrun(f, e, events),
            Link::WriteFailed(_) => {}
            // No SQE of its own is in the kernel: nothing of ours.
            Link::Parked => {
                fs.link = Link::Parked;
                return;
            }
        }
        if res == -libc::EINTR {
            // Reports nothing about the data; the fsync is issued again (not a retry of a failure).
            return self.issue(f, events);
        }
        let result = if res < 0 {
            self.stopped = true;
            Err(io_error(Op::Flush, 0, &io::Error::from_raw_os_error(-res)))
        } else {
            Ok(())
        };
        if let Some(s) = self.release(f) {
            events.push(FlushEvent::Ran {
                desc: s.desc,
                tag: s.tag,
                result,
            });
        }
    }

    /// The write in slot `write` no longer has a flush waiting for it.
    fn unlink(&mut self, write: u32) {
        if let Some(ws) = self.slots[write as usize].as_mut() {
            if matches!(ws.then, Then::Flush(_)) {
                ws.then = Then::Nothing;
            }
        }
    }

    /// Issues linked flush `f`'s fsync as its own SQE, its link severed and its write completed.
    fn issue_after_write(&mut self, f: u32, events: &mut Vec<FlushEvent>) {
        self.reissued += 1;
        self.issue(f, events);
    }

    /// Issues flush `f`'s fsync as its own SQE.
    fn issue(&mut self, f: u32, events: &mut Vec<FlushEvent>) {
        if let Some(fs) = self.slots[f as usize].as_mut() {
            fs.link = Link::Own;
        }
        if let Err(e) = self.queue(f, None) {
            // It cannot be issued: it fails as a flush that failed (the device stops), never as
            // a success.
            self.stopped = true;
            if let Some(s) = self.release(f) {
                events.push(FlushEvent::Ran {
                    desc: s.desc,
                    tag: s.tag,
                    result: Err(e),
                });
            }
        }
    }

    /// Flush `f` did not run because its write failed.
    fn unrun(&mut self, f: u32, err: DeviceError, events: &mut Vec<FlushEvent>) {
        if let Some(s) = self.release(f) {
            events.push(FlushEvent::Unrun {
                desc: Some(s.desc),
                tag: s.tag,
                err,
            });
        }
    }
}
