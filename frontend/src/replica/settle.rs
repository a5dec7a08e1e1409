//! Which of the batches the applier queued are durable yet, per device: what a snapshot of the
//! applier's bookkeeping waits for before it is written (a node that starts from the snapshot
//! must hold every batch it counts).
//!
//! Counted rather than waited on one by one: each device acknowledges its appends in the order
//! they were queued, so "the first n queued to device d are durable" is one number per device.

use std::collections::HashMap;
use std::sync::Arc;

use nvmq_cluster::Settled;
use tokio::sync::watch;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Counts {
    /// Per device: (batches queued, batches acknowledged durable), both in queue order.
    per_dev: HashMap<u16, (u64, u64)>,
    /// The first failure of a queued batch (or one dropped unanswered): nothing queued after it
    /// can be counted on.
    failed: Option<String>,
}

/// Where each device stands: queued against durable.
#[derive(Clone)]
pub(crate) struct Settle {
    counts: Arc<watch::Sender<Counts>>,
}

/// How many batches were queued to each device at a moment: what [`Settle::until`] waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mark(Vec<(u16, u64)>);

impl Default for Settle {
    fn default() -> Settle {
        Settle {
            counts: Arc::new(watch::Sender::new(Counts::default())),
        }
    }
}

impl Settle {
    /// Counts a batch queued to `dev`; the returned guard is finished by its ack.
    pub(crate) fn queued(&self, dev: u16) -> Pending {
        // No waiter's condition depends on what is queued: counted without waking them (this
        // runs for every replicated batch).
        self.counts.send_if_modified(|c| {
            c.per_dev.entry(dev).or_default().0 += 1;
            false
        });
        Pending {
            settle: Some(self.clone()),
            dev,
        }
    }

    fn finish(&self, dev: u16, failure: Option<String>) {
        // Waking costs a lock per notify shard, and this runs for every replicated batch: only
        // a snapshot waiting (`until`, which holds a receiver) needs it. One that subscribes
        // after this check reads the count changed here before it waits (`wait_for` looks at
        // the current value first, under the lock this holds).
        let counts = &self.counts;
        counts.send_if_modified(|c| {
            match failure {
                None => c.per_dev.entry(dev).or_default().1 += 1,
                Some(why) => {
                    c.failed.get_or_insert(why);
                }
            }
            counts.receiver_count() > 0
        });
    }

    /// The first batch that failed (or was dropped unanswered), if one did.
    pub(crate) fn failed(&self) -> Option<String> {
        self.counts.borrow().failed.clone()
    }

    /// What has been queued so far, to every device.
    pub(crate) fn mark(&self) -> Mark {
        let c = self.counts.borrow();
        let mut m: Vec<(u16, u64)> = c.per_dev.iter().map(|(&d, &(q, _))| (d, q)).collect();
        m.sort_unstable();
        Mark(m)
    }

    /// Resolves once every batch counted in `mark` is durable, or with the first failure.
    pub(crate) fn until(&self, mark: Mark) -> Settled {
        let mut rx = self.counts.subscribe();
        Box::pin(async move {
            let done = |c: &Counts| {
                c.failed.is_some()
                    || mark
                        .0
                        .iter()
                        .all(|(d, q)| c.per_dev.get(d).is_some_and(|&(_, n)| n >= *q))
            };
            let c = rx
                .wait_for(done)
                .await
                .map_err(|_| "the applier stopped".to_string())?;
            match &c.failed {
                Some(why) => Err(format!("a replicated batch was not stored: {why}")),
                None => Ok(()),
            }
        })
    }
}

/// One queued batch: finished by its ack; dropped unanswered, it counts as a failure (nothing
/// then says whether it is durable).
pub(crate) struct Pending {
    settle: Option<Settle>,
    dev: u16,
}

impl Pending {
    pub(crate) fn finish(mut self, failure: Option<String>) {
        if let Some(s) = self.settle.take() {
            s.finish(self.dev, failure);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(s) = self.settle.take() {
            s.finish(
                self.dev,
                Some("the log dropped a replicated batch without answering".into()),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::{Context, Poll};

    fn ready(f: &mut Settled) -> Option<Result<(), String>> {
        match f
            .as_mut()
            .poll(&mut Context::from_waker(std::task::Waker::noop()))
        {
            Poll::Ready(r) => Some(r),
            Poll::Pending => None,
        }
    }

    #[test]
    fn a_mark_settles_once_every_device_acknowledged_what_was_queued_before_it() {
        let s = Settle::default();
        let a1 = s.queued(0);
        let b1 = s.queued(1);
        let mut wait = s.until(s.mark());
        let a2 = s.queued(0);
        assert_eq!(ready(&mut wait), None);
        a1.finish(None);
        assert_eq!(ready(&mut wait), None, "device 1 still owes a batch");
        b1.finish(None);
        assert_eq!(ready(&mut wait), Some(Ok(())), "a2 came after the mark");
        let mut later = s.until(s.mark());
        assert_eq!(ready(&mut later), None);
        a2.finish(None);
        assert_eq!(ready(&mut later), Some(Ok(())));
    }

    #[test]
    fn a_failed_or_dropped_batch_fails_every_wait() {
        let s = Settle::default();
        let a = s.queued(0);
        let mut wait = s.until(s.mark());
        assert_eq!(s.failed(), None);
        drop(a);
        let r = ready(&mut wait).and_then(Result::err).unwrap_or_default();
        assert!(r.contains("without answering"), "{r}");
        assert!(s.failed().is_some_and(|f| f.contains("without answering")));
        let s = Settle::default();
        let b = s.queued(3);
        let mut wait = s.until(s.mark());
        b.finish(Some("write failed at 4096".into()));
        let r = ready(&mut wait).and_then(Result::err).unwrap_or_default();
        assert!(r.contains("write failed at 4096"), "{r}");
    }

    #[test]
    fn nothing_queued_settles_at_once() {
        let s = Settle::default();
        assert_eq!(ready(&mut s.until(s.mark())), Some(Ok(())));
    }
}
