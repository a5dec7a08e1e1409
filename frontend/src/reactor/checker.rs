//! Where the expensive checks of produced batches run: a few threads beside the event loops.
//!
//! A compressed batch is decompressed to be checked, which for a 1 MiB gzip batch takes about
//! 10 ms; on the event loop that would stall every other connection of the loop as long. The
//! loop checks what is cheap itself (`records::check_inline`) and hands the rest here, with the
//! bytes it holds counted against the broker's limits until the check is done; the connection
//! resumes the request when the answer comes back (`reactor::checking`).
//!
//! The same threads run the other work too slow for a loop (`offload`: a PLAIN login's password
//! derivation), in the order it came.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};

use bytes::Bytes;
use crossbeam::channel::{Receiver, Sender};
use tokio::sync::oneshot;

use super::limits::Charge;
use crate::batch::{BatchFault, BatchInfo};
use crate::offload::{Offload, Task};
use crate::records::{self, Checks};
use crate::FrontendError;

/// Most checking threads (fewer on a machine with fewer cores).
const MAX_THREADS: usize = 4;

/// The batches of one partition to check, in order: the first refused stops the group.
pub(crate) type Group = Vec<(BatchInfo, Bytes)>;

/// A request's batches to check off the loop.
pub(crate) struct Job {
    pub groups: Vec<Group>,
    pub checks: Checks,
    /// The request's bytes, counted for as long as the job holds them (also when the connection
    /// closed meanwhile, until a thread drops the job).
    pub charge: Charge,
    pub reply: oneshot::Sender<Checked>,
}

/// The answer to a job: per group, the first batch refused.
pub(crate) struct Checked {
    pub faults: Vec<Option<BatchFault>>,
    /// Handed back so that the connection counts the bytes again before they stop being counted
    /// here.
    pub charge: Charge,
}

/// What the threads take: a request's batches, or other work handed off a loop.
enum Work {
    Check(Job),
    Run(Task),
}

/// The checking threads; they end when the pool is dropped.
pub(crate) struct CheckPool {
    /// The one strong handle: connections' `Offload`s hold weak ones, so that the threads end
    /// with the pool, not with the last connection.
    tx: Arc<Sender<Work>>,
}

impl CheckPool {
    pub fn start(gate: Option<CheckGate>) -> Result<CheckPool, FrontendError> {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, MAX_THREADS);
        // Unbounded: every batch check's bytes are counted against the broker's byte limits,
        // which stop connections from reading before this queue can grow past them; other tasks
        // (a login's derivation) are one per live connection at most, and skipped once it closed.
        let (tx, rx) = crossbeam::channel::unbounded::<Work>();
        for i in 0..threads {
            let rx = rx.clone();
            let gate = gate.clone();
            std::thread::Builder::new()
                .name(format!("nvmq-check-{i}"))
                .spawn(move || work(&rx, gate.as_ref()))
                .map_err(|e| FrontendError::Thread(e.to_string()))?;
        }
        Ok(CheckPool { tx: Arc::new(tx) })
    }

    /// Queues a job; its answer comes on the job's `reply`. A job the pool can no longer take
    /// (it is stopping) is dropped, which its receiver sees as a closed channel.
    pub fn submit(&self, job: Job) {
        let _ = self.tx.send(Work::Check(job));
    }

    /// A handle connections hand their slow work to; once the pool stopped, a task given to it
    /// is dropped (its waiter sees that).
    pub fn offload(&self) -> Offload {
        let tx: Weak<Sender<Work>> = Arc::downgrade(&self.tx);
        Offload::new(move |task| {
            if let Some(tx) = tx.upgrade() {
                let _ = tx.send(Work::Run(task));
            }
        })
    }
}

fn work(rx: &Receiver<Work>, gate: Option<&CheckGate>) {
    for w in rx.iter() {
        let job = match w {
            Work::Check(job) if job.reply.is_closed() => {
                // Its connection closed: nobody waits for the answer.
                continue;
            }
            Work::Check(job) => job,
            Work::Run(task) => {
                if let Some(g) = gate {
                    g.pass();
                }
                task();
                continue;
            }
        };
        if let Some(g) = gate {
            g.pass();
        }
        let faults = job
            .groups
            .iter()
            .map(|g| {
                g.iter()
                    .find_map(|(info, b)| records::check(b, info, &job.checks).err())
            })
            .collect();
        let _ = job.reply.send(Checked {
            faults,
            charge: job.charge,
        });
    }
}

/// A gate every check (and task) handed to the pool passes before it runs: open unless a test holds it. With
/// it held, a check cannot finish, so a test can look at what the broker does meanwhile without
/// timing anything.
#[derive(Clone, Default)]
pub struct CheckGate {
    inner: Arc<GateInner>,
}

#[derive(Default)]
struct GateInner {
    held: Mutex<bool>,
    opened: Condvar,
    waiting: AtomicUsize,
}

impl std::fmt::Debug for CheckGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckGate")
            .field("held", &self.is_held())
            .field("waiting", &self.waiting())
            .finish()
    }
}

impl CheckGate {
    /// Checks arriving from now on wait.
    pub fn hold(&self) {
        *self.lock() = true;
    }

    /// Lets every waiting check (and those to come) through.
    pub fn release(&self) {
        *self.lock() = false;
        self.inner.opened.notify_all();
    }

    pub fn is_held(&self) -> bool {
        *self.lock()
    }

    /// Checks waiting at the gate now.
    pub fn waiting(&self) -> usize {
        self.inner.waiting.load(Ordering::SeqCst)
    }

    /// Waits while the gate is held.
    pub(crate) fn pass(&self) {
        let mut held = self.lock();
        if !*held {
            return;
        }
        self.inner.waiting.fetch_add(1, Ordering::SeqCst);
        while *held {
            held = self
                .inner
                .opened
                .wait(held)
                .unwrap_or_else(PoisonError::into_inner);
        }
        self.inner.waiting.fetch_sub(1, Ordering::SeqCst);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, bool> {
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
