//! Work too slow for an event loop's thread, handed to the threads beside the loops that check
//! compressed batches (`reactor::checker`): a PLAIN login derives its password (PBKDF2, 4,096
//! iterations or more), which on the loop would stall every other connection of the loop.

use std::sync::Arc;

use tokio::sync::oneshot;

/// A piece of work to run once.
pub type Task = Box<dyn FnOnce() + Send>;

/// Where a connection's slow work runs (a handle on the check pool).
#[derive(Clone)]
pub struct Offload(Arc<dyn Fn(Task) + Send + Sync>);

impl std::fmt::Debug for Offload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Offload")
    }
}

impl Offload {
    /// `submit` queues a task; a task it cannot run (the pool is stopping) it drops.
    pub fn new(submit: impl Fn(Task) + Send + Sync + 'static) -> Offload {
        Offload(Arc::new(submit))
    }
}

/// Runs `f` off the caller's thread where `offload` says (on it when there is none, as for a
/// broker driven without event loops) and gives back its result; None if it was dropped
/// without running (the pool stopped).
pub async fn run<R: Send + 'static>(
    offload: Option<&Offload>,
    f: impl FnOnce() -> R + Send + 'static,
) -> Option<R> {
    let Some(o) = offload else {
        return Some(f());
    };
    let (tx, rx) = oneshot::channel();
    (o.0)(Box::new(move || {
        // The receiver gone (its connection closed): nobody wants the result, so the work
        // (a password derivation) is not done either: a client that sends and hangs up in a
        // loop queues no work for the pool it shares with batch checks.
        if tx.is_closed() {
            return;
        }
        let _ = tx.send(f());
    }));
    rx.await.ok()
}
