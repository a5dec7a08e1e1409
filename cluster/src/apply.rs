//! What a group's committed entries do on a node beyond the group's own bookkeeping: the hook
//! through which the node's front end applies each committed entry to its own state (a Kafka
//! partition's records), in index order, on every replica alike, and the bookkeeping of that
//! state a snapshot carries so that the entries before it can be purged.

use std::future::Future;
use std::pin::Pin;

/// The answer of one applied entry, or why it could not be applied.
pub type ApplyResult = Result<Vec<u8>, String>;

/// Hands the applier a snapshot's bookkeeping, already checked by [`Applier::restore`].
pub type Restore = Box<dyn FnOnce() + Send>;

/// A future that resolves once the node's devices hold what a capture describes.
pub type Settled = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'static>>;

/// The applier's bookkeeping after every entry applied so far, and what waits until the effects
/// of those entries are durable on the node's devices.
pub struct Capture {
    /// What [`Applier::restore`] takes back: not the node's data, only where it stands (each
    /// partition's next offset, for a broker), since the data stays on the node's devices.
    pub data: Vec<u8>,
    /// Resolves once every effect of the entries captured is durable: a snapshot that covers
    /// them is written only then, so that a node starting from it holds everything it counts.
    pub durable: Settled,
}

/// Applies committed normal entries to the node's state.
///
/// Called in index order, once per entry per start of the group: after a restart openraft
/// applies again every entry after the last snapshot, so an applier must recognise an entry
/// whose effect survived on the device (for example by the position it would land at) and
/// answer as if it applied it. The answer travels back to `client_write` on the node that
/// wrote the entry. An `Err` is a fault of the node (its state no longer follows the group):
/// the group stops, as on a failed log write.
pub trait Applier: Send + Sync + 'static {
    fn apply<'a>(
        &'a self,
        index: u64,
        data: &'a [u8],
    ) -> Pin<Box<dyn Future<Output = ApplyResult> + Send + 'a>>;

    /// The bookkeeping after the last entry applied. Called between two applies (openraft's
    /// state machine worker takes it before it spawns the snapshot's build), so it describes
    /// exactly the entries up to the last applied one.
    fn capture(&self) -> Result<Capture, String>;

    /// Checks a snapshot's bookkeeping against the node and returns what starts from it: at
    /// open, from the newest durable snapshot (run at once), and when the leader installs one
    /// (run once the snapshot is durable here). Refuses, changing nothing, when this node does
    /// not hold what the snapshot counts (a device that lost batches, or a node that never
    /// received them: the snapshot carries no data).
    fn restore(&self, data: &[u8]) -> Result<Restore, String>;
}
