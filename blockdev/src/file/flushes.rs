//! Flushes on a set of open file descriptions: up to N `fdatasync`s at once, one per description
//! (`FileOptions::flush_descriptions`, opened at open time on the device's path and checked to be
//! the same inode).
//!
//! Why per description. Linux records a write-back error in the file's error sequence (`errseq`,
//! in the inode's mapping) and reports it once *per open file description*: each `struct file`
//! remembers the last error it reported, and an `fdatasync` reports every error recorded since.
//! Two `fdatasync`s running at once on the *same* description race for one report: whichever looks
//! first takes the error and the other returns success for data that never reached the disk, and
//! may complete first. That race forced one `fdatasync` at a time. On *different* descriptions each
//! call sees every error recorded before its own check (an `fdatasync` waits for the write-back it
//! covers, which records its error before it ends), so they may run at once. One description has
//! one `fdatasync` at a time, as before.
//!
//! A flush submitted while every description is busy waits, and every flush that waited is
//! answered by the next `fdatasync` to start, on the first description to become free (after an
//! `fdatasync` that succeeded): it starts after all their covered writes completed, so it covers
//! them (storage.md §1). With one description this is exactly the one-at-a-time rule.
//!
//! A failed `fdatasync` stops the device: its riders and every flush still waiting fail, and so
//! does every flush that completes after it, whatever its own `fdatasync` said (a flush running
//! beside the failed one may report success although the device has lost data; storage.md §2: no
//! flush after a failure is trusted, none is retried).

use crate::{Completion, DeviceError, Op, Tag};

pub(super) struct Flushes {
    descs: Vec<Desc>,
    /// Flushes submitted while every description was busy; the next `fdatasync` answers them all.
    waiting: Vec<Tag>,
    /// A flush has failed: every later one fails too.
    failed: bool,
    /// Test seam: the errno the next `fdatasync` to complete reports instead of its result.
    inject: Option<i32>,
    /// Test seam: after this many more `fdatasync`s complete, the next one reports the errno.
    inject_after: Option<(u64, i32)>,
}

/// One flush description.
struct Desc {
    /// An `fdatasync` runs on it (or a linked flush holds it, waiting for its write).
    busy: bool,
    /// Flushes that its running `fdatasync` answers besides its own.
    riders: Vec<Tag>,
}

/// What the device does after a flush event.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    Nothing,
    /// Start an `fdatasync` for `tag` on description `desc` (the flushes that waited ride on it).
    Start {
        desc: usize,
        tag: Tag,
    },
}

impl Flushes {
    /// `descriptions` descriptions, with room for `depth` flushes so that no submission allocates.
    pub fn new(descriptions: usize, depth: usize) -> Flushes {
        Flushes {
            descs: (0..descriptions)
                .map(|_| Desc {
                    busy: false,
                    riders: Vec::with_capacity(depth),
                })
                .collect(),
            waiting: Vec::with_capacity(depth),
            failed: false,
            inject: None,
            inject_after: None,
        }
    }

    /// True once a flush has failed.
    pub fn failed(&self) -> bool {
        self.failed
    }

    pub fn inject(&mut self, errno: i32) {
        self.inject = Some(errno);
    }

    /// The `fdatasync` that completes after `after` more have completed reports `errno`.
    pub fn inject_after(&mut self, after: u64, errno: i32) {
        self.inject_after = Some((after, errno));
    }

    /// The errno an injected failure puts in place of this `fdatasync`'s result, if any.
    fn injected_now(&mut self) -> Option<i32> {
        if let Some(errno) = self.inject.take() {
            return Some(errno);
        }
        match &mut self.inject_after {
            Some((0, errno)) => {
                let errno = *errno;
                self.inject_after = None;
                Some(errno)
            }
            Some((n, _)) => {
                *n -= 1;
                None
            }
            None => None,
        }
    }

    /// Takes a description with no `fdatasync` running, for a flush about to start; `None` when
    /// every one is busy (the flush must [`wait`](Flushes::wait)).
    pub fn take_free(&mut self) -> Option<usize> {
        let d = self.descs.iter().position(|d| !d.busy)?;
        self.descs[d].busy = true;
        Some(d)
    }

    /// Gives back a description taken for a flush that could not be handed to the engine.
    pub fn untake(&mut self, desc: usize) {
        if let Some(d) = self.descs.get_mut(desc) {
            d.busy = false;
        }
    }

    /// A flush submitted while every description is busy.
    pub fn wait(&mut self, tag: Tag) {
        self.waiting.push(tag);
    }

    /// The `fdatasync` of flush `tag` on `desc` finished with `result`: it and its riders complete
    /// (pushed to `out`), and what waited either starts on `desc` or fails (after a failure).
    pub fn ran(
        &mut self,
        desc: usize,
        tag: Tag,
        result: Result<(), DeviceError>,
        out: &mut Vec<Completion>,
    ) -> Next {
        let result = match (self.injected_now(), result) {
            (Some(errno), _) => Err(injected(errno)),
            (None, r) => r,
        };
        let result = match result {
            Err(e) => {
                self.failed = true;
                Err(e)
            }
            Ok(()) if self.failed => Err(stopped()),
            Ok(()) => Ok(()),
        };
        out.push(flush_completion(tag, result.clone()));
        if let Some(d) = self.descs.get_mut(desc) {
            d.busy = false;
            for t in d.riders.drain(..) {
                out.push(flush_completion(t, result.clone()));
            }
        }
        self.next(desc, out)
    }

    /// The linked flush `tag`, which held `desc`, never ran because its write failed: it fails
    /// alone with `err` (the device goes on: a failed write stops no flush), and `desc` serves
    /// what waited.
    pub fn not_run(
        &mut self,
        desc: usize,
        tag: Tag,
        err: DeviceError,
        out: &mut Vec<Completion>,
    ) -> Next {
        out.push(flush_completion(tag, Err(err)));
        if let Some(d) = self.descs.get_mut(desc) {
            d.busy = false;
            // A linked flush takes no riders; should one have any, it fails them rather than
            // leaving them unanswered.
            for t in d.riders.drain(..) {
                out.push(flush_completion(t, Err(stopped())));
            }
        }
        self.next(desc, out)
    }

    /// The `fdatasync` meant for `tag` (and its riders) on `desc` could not be handed to the
    /// engine, which has stopped: they fail with `err`, and so does everything waiting.
    pub fn not_started(
        &mut self,
        desc: usize,
        tag: Tag,
        err: DeviceError,
        out: &mut Vec<Completion>,
    ) {
        out.push(flush_completion(tag, Err(err.clone())));
        if let Some(d) = self.descs.get_mut(desc) {
            d.busy = false;
            for t in d.riders.drain(..) {
                out.push(flush_completion(t, Err(err.clone())));
            }
        }
        self.fail_waiting(out);
    }

    /// `desc` has become free: after a failure what waited fails, otherwise it starts there.
    fn next(&mut self, desc: usize, out: &mut Vec<Completion>) -> Next {
        if self.failed {
            self.fail_waiting(out);
            return Next::Nothing;
        }
        if self.waiting.is_empty() || desc >= self.descs.len() {
            return Next::Nothing;
        }
        let first = self.waiting[0];
        let d = &mut self.descs[desc];
        d.busy = true;
        d.riders.extend(self.waiting.drain(1..));
        self.waiting.clear();
        Next::Start { desc, tag: first }
    }

    fn fail_waiting(&mut self, out: &mut Vec<Completion>) {
        for tag in self.waiting.drain(..) {
            out.push(flush_completion(tag, Err(stopped())));
        }
    }
}

fn stopped() -> DeviceError {
    DeviceError::Stopped {
        op: Op::Flush,
        lba: 0,
    }
}

fn injected(errno: i32) -> DeviceError {
    super::threads::io_error(Op::Flush, 0, &std::io::Error::from_raw_os_error(errno))
}

pub(super) fn flush_completion(tag: Tag, result: Result<(), DeviceError>) -> Completion {
    Completion {
        tag,
        op: Op::Flush,
        lba: 0,
        buffer: None,
        result,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Submits as the device does; returns the description it started on, if any.
    fn submit(f: &mut Flushes, tag: Tag) -> Option<usize> {
        let d = f.take_free();
        if d.is_none() {
            f.wait(tag);
        }
        d
    }

    fn tags(out: &[Completion]) -> Vec<(Tag, bool)> {
        out.iter().map(|c| (c.tag, c.result.is_ok())).collect()
    }

    fn eio() -> DeviceError {
        DeviceError::Io {
            op: Op::Flush,
            lba: 0,
            detail: "EIO".into(),
        }
    }

    #[test]
    fn with_one_description_flushes_submitted_while_one_runs_ride_on_the_next() {
        let mut f = Flushes::new(1, 8);
        let mut out = Vec::new();
        assert_eq!(submit(&mut f, 1), Some(0));
        assert_eq!(submit(&mut f, 2), None);
        assert_eq!(submit(&mut f, 3), None);
        assert_eq!(
            f.ran(0, 1, Ok(()), &mut out),
            Next::Start { desc: 0, tag: 2 }
        );
        assert_eq!(tags(&out), vec![(1, true)]);
        assert_eq!(submit(&mut f, 4), None);
        out.clear();
        assert_eq!(
            f.ran(0, 2, Ok(()), &mut out),
            Next::Start { desc: 0, tag: 4 }
        );
        assert_eq!(tags(&out), vec![(2, true), (3, true)]);
        out.clear();
        assert_eq!(f.ran(0, 4, Ok(()), &mut out), Next::Nothing);
        assert_eq!(submit(&mut f, 5), Some(0));
    }

    #[test]
    fn each_description_runs_one_and_the_first_to_free_up_takes_what_waited() {
        let mut f = Flushes::new(2, 8);
        let mut out = Vec::new();
        assert_eq!(submit(&mut f, 1), Some(0));
        assert_eq!(submit(&mut f, 2), Some(1));
        assert_eq!(submit(&mut f, 3), None);
        assert_eq!(submit(&mut f, 4), None);
        // The second completes first: what waited starts on its description.
        assert_eq!(
            f.ran(1, 2, Ok(()), &mut out),
            Next::Start { desc: 1, tag: 3 }
        );
        assert_eq!(f.ran(0, 1, Ok(()), &mut out), Next::Nothing);
        assert_eq!(submit(&mut f, 5), Some(0));
        assert_eq!(f.ran(1, 3, Ok(()), &mut out), Next::Nothing);
        assert_eq!(tags(&out), vec![(2, true), (1, true), (3, true), (4, true)]);
    }

    #[test]
    fn a_failed_flush_fails_its_riders_everything_waiting_and_every_later_completion() {
        let mut f = Flushes::new(2, 8);
        let mut out = Vec::new();
        submit(&mut f, 1);
        submit(&mut f, 2);
        submit(&mut f, 3);
        f.inject(libc::EIO);
        assert_eq!(f.ran(1, 2, Ok(()), &mut out), Next::Nothing);
        assert!(f.failed());
        // The one beside it reports success from the kernel, and is not believed.
        assert_eq!(f.ran(0, 1, Ok(()), &mut out), Next::Nothing);
        assert_eq!(tags(&out), vec![(2, false), (3, false), (1, false)]);
        assert!(matches!(&out[0].result, Err(DeviceError::Io { .. })));
        assert_eq!(out[1].result, Err(stopped()));
        assert_eq!(out[2].result, Err(stopped()));
    }

    #[test]
    fn a_failure_injected_after_n_flushes_hits_the_next_one_only() {
        let mut f = Flushes::new(1, 8);
        let mut out = Vec::new();
        f.inject_after(2, libc::EIO);
        for tag in 1..=2 {
            assert_eq!(submit(&mut f, tag), Some(0));
            assert_eq!(f.ran(0, tag, Ok(()), &mut out), Next::Nothing);
            assert!(!f.failed());
        }
        assert_eq!(submit(&mut f, 3), Some(0));
        assert_eq!(f.ran(0, 3, Ok(()), &mut out), Next::Nothing);
        assert!(f.failed());
        assert_eq!(tags(&out), vec![(1, true), (2, true), (3, false)]);
        assert!(matches!(&out[2].result, Err(DeviceError::Io { .. })));
    }

    #[test]
    fn a_failure_fails_the_riders_of_its_description() {
        let mut f = Flushes::new(1, 8);
        let mut out = Vec::new();
        submit(&mut f, 1);
        submit(&mut f, 2);
        submit(&mut f, 3);
        assert_eq!(
            f.ran(0, 1, Ok(()), &mut out),
            Next::Start { desc: 0, tag: 2 }
        );
        submit(&mut f, 4);
        out.clear();
        assert_eq!(f.ran(0, 2, Err(eio()), &mut out), Next::Nothing);
        assert_eq!(tags(&out), vec![(2, false), (3, false), (4, false)]);
    }

    #[test]
    fn a_linked_flush_that_never_ran_fails_alone_and_frees_its_description() {
        let mut f = Flushes::new(1, 8);
        let mut out = Vec::new();
        assert_eq!(f.take_free(), Some(0));
        submit(&mut f, 2);
        assert_eq!(
            f.not_run(0, 1, eio(), &mut out),
            Next::Start { desc: 0, tag: 2 }
        );
        assert!(!f.failed());
        assert_eq!(tags(&out), vec![(1, false)]);
    }

    #[test]
    fn a_flush_that_cannot_start_fails_with_its_riders_and_what_waits() {
        let mut f = Flushes::new(1, 8);
        let mut out = Vec::new();
        submit(&mut f, 1);
        submit(&mut f, 2);
        submit(&mut f, 3);
        assert_eq!(
            f.ran(0, 1, Ok(()), &mut out),
            Next::Start { desc: 0, tag: 2 }
        );
        submit(&mut f, 4);
        out.clear();
        f.not_started(0, 2, stopped(), &mut out);
        assert_eq!(tags(&out), vec![(2, false), (3, false), (4, false)]);
        assert_eq!(submit(&mut f, 5), Some(0));
    }
}
