//! One `fdatasync` at a time.
//!
//! Linux reports a writeback error to one of several `fdatasync` calls running at once on a file
//! (the error sequence is advanced by whichever call looks first), so a flush that runs beside a
//! failing one can return success for data that never reached the medium; if it completed first,
//! the log would acknowledge that data before the failure arrived. So a flush submitted while one
//! runs waits, and every flush that waited is answered by the next `fdatasync`, started once the
//! running one has completed without error: it starts after all their covered writes completed,
//! so it covers them (storage.md §1). A failed flush fails every flush that waited behind it.

use crate::{Completion, DeviceError, Op, Tag};

pub(super) struct Flushes {
    /// An `fdatasync` is in the engine.
    running: bool,
    /// Flushes submitted while one ran; the next `fdatasync` answers all of them.
    waiting: Vec<Tag>,
    /// Flushes the running `fdatasync` answers besides its own.
    riders: Vec<Tag>,
}

/// What the device does after a flush completion was delivered.
pub(super) enum Next {
    Nothing,
    /// Start an `fdatasync` for this tag (the others that waited ride on it).
    Start(Tag),
}

impl Flushes {
    /// Room for `depth` flushes, so that no submission allocates.
    pub fn new(depth: usize) -> Flushes {
        Flushes {
            running: false,
            waiting: Vec::with_capacity(depth),
            riders: Vec::with_capacity(depth),
        }
    }

    /// An `fdatasync` is in the engine: a flush submitted now waits its turn.
    pub fn running(&self) -> bool {
        self.running
    }

    /// A flush submitted while one runs.
    pub fn wait(&mut self, tag: Tag) {
        self.waiting.push(tag);
    }

    /// A flush went to the engine.
    pub fn started(&mut self) {
        self.running = true;
    }

    /// The running flush completed with `result`: its riders complete alike (pushed to `out`),
    /// and what waited either starts (on success) or fails (the device has stopped). Returns
    /// how many completions were pushed and what to start.
    pub fn completed(
        &mut self,
        result: &Result<(), DeviceError>,
        out: &mut Vec<Completion>,
    ) -> (usize, Next) {
        self.running = false;
        let mut pushed = self.riders.len();
        for tag in self.riders.drain(..) {
            out.push(flush_completion(tag, result.clone()));
        }
        if result.is_err() {
            pushed += self.fail_waiting(out);
            return (pushed, Next::Nothing);
        }
        if self.waiting.is_empty() {
            return (pushed, Next::Nothing);
        }
        let first = self.waiting[0];
        self.riders.extend(self.waiting.drain(1..));
        self.waiting.clear();
        self.running = true;
        (pushed, Next::Start(first))
    }

    /// The flush meant to answer the riders could not be started: they fail with `err`.
    pub fn not_started(&mut self, tag: Tag, err: DeviceError, out: &mut Vec<Completion>) -> usize {
        self.running = false;
        out.push(flush_completion(tag, Err(err.clone())));
        let mut pushed = 1;
        for t in self.riders.drain(..) {
            out.push(flush_completion(t, Err(err.clone())));
            pushed += 1;
        }
        pushed + self.fail_waiting(out)
    }

    fn fail_waiting(&mut self, out: &mut Vec<Completion>) -> usize {
        let n = self.waiting.len();
        for tag in self.waiting.drain(..) {
            out.push(flush_completion(
                tag,
                Err(DeviceError::Stopped {
                    op: Op::Flush,
                    lba: 0,
                }),
            ));
        }
        n
    }
}

fn flush_completion(tag: Tag, result: Result<(), DeviceError>) -> Completion {
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

    /// Submits as the device does; `starts`: whether it must go to the engine at once.
    fn submit(f: &mut Flushes, tag: Tag, starts: bool) {
        assert_eq!(!f.running(), starts, "flush {tag}");
        if f.running() {
            f.wait(tag);
        } else {
            f.started();
        }
    }

    fn tags(out: &[Completion]) -> Vec<(Tag, bool)> {
        out.iter().map(|c| (c.tag, c.result.is_ok())).collect()
    }

    #[test]
    fn flushes_submitted_while_one_runs_ride_on_the_next() {
        let (mut f, mut out) = two_running();
        submit(&mut f, 4, false);
        let (n, next) = f.completed(&Ok(()), &mut out);
        assert_eq!((n, tags(&out)), (1, vec![(3, true)]));
        assert!(matches!(next, Next::Start(4)));
        out.clear();
        let (n, next) = f.completed(&Ok(()), &mut out);
        assert_eq!(n, 0);
        assert!(matches!(next, Next::Nothing));
        submit(&mut f, 5, true);
    }

    /// Flush 1 ran and completed; 2 started with 3 riding on it.
    fn two_running() -> (Flushes, Vec<Completion>) {
        let mut f = Flushes::new(8);
        submit(&mut f, 1, true);
        submit(&mut f, 2, false);
        submit(&mut f, 3, false);
        let mut out = Vec::new();
        let (n, next) = f.completed(&Ok(()), &mut out);
        assert_eq!(n, 0);
        assert!(matches!(next, Next::Start(2)));
        (f, out)
    }

    #[test]
    fn a_failed_flush_fails_its_riders_and_everything_waiting() {
        let (mut f, mut out) = two_running();
        submit(&mut f, 4, false);
        let err = DeviceError::Io {
            op: Op::Flush,
            lba: 0,
            detail: "EIO".into(),
        };
        let (n, next) = f.completed(&Err(err), &mut out);
        assert!(matches!(next, Next::Nothing));
        assert_eq!((n, tags(&out)), (2, vec![(3, false), (4, false)]));
    }

    #[test]
    fn a_flush_that_cannot_start_fails_with_its_riders() {
        let (mut f, mut out) = two_running();
        let n = f.not_started(
            2,
            DeviceError::Stopped {
                op: Op::Flush,
                lba: 0,
            },
            &mut out,
        );
        assert_eq!((n, tags(&out)), (2, vec![(2, false), (3, false)]));
        submit(&mut f, 4, true);
    }
}
