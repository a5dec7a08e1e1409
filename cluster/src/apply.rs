//! What a group's committed entries do on a node beyond the group's own bookkeeping: the hook
//! through which the node's front end applies each committed entry to its own state (a Kafka
//! partition's records), in index order, on every replica alike.

use std::future::Future;
use std::pin::Pin;

/// The answer of one applied entry, or why it could not be applied.
pub type ApplyResult = Result<Vec<u8>, String>;

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
}
