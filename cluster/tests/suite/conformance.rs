//! openraft's own storage conformance suite (`openraft::testing::log::Suite`, 44 test groups:
//! log state, append visibility, truncate_after, purge, vote, snapshots, apply) against the
//! group store on a sim device.

use crate::common;

use nvmq_cluster::{LogStore, StateMachine, TypeConfig};
use openraft::errors::ErrorSource;
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::StorageError;

fn fail(e: impl ToString) -> StorageError<TypeConfig> {
    StorageError::read(ErrorSource::from_string(e))
}

/// Each suite test gets a fresh sim device with its own log; the guard keeps the device's
/// power switch (the log itself lives as long as the stores).
struct SimStoreBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, common::Node> for SimStoreBuilder {
    async fn build(
        &self,
    ) -> Result<(common::Node, LogStore, StateMachine), StorageError<TypeConfig>> {
        let node = common::Node::new(7).map_err(fail)?;
        let (ls, sm) = node.open(1).map_err(fail)?;
        Ok((node, ls, sm))
    }
}

#[tokio::test(flavor = "current_thread")]
async fn openraft_storage_suite_passes_on_the_sim_device() -> Result<(), StorageError<TypeConfig>> {
    Suite::test_all(SimStoreBuilder).await
}
