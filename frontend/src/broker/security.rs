//! The broker's security state: the authorizer and the SCRAM credentials, and their part of a
//! snapshot.

use nvmq_log::LogError;

use super::{AppendWait, Broker};

impl Broker {
    /// The authorizer and its ACLs.
    pub fn acl(&self) -> &crate::acl::Authorizer {
        &self.acl
    }

    /// Queues the records that re-create every credential and every ACL binding (the security
    /// part of `Broker::snapshot`).
    pub(super) async fn queue_security_snapshot(
        &self,
        waits: &mut Vec<AppendWait>,
    ) -> Result<(), LogError> {
        // Held until the records are queued: a credential change recorded meanwhile must land
        // after them, or a replay would undo it.
        let credentials_in_order = self.credentials.write.lock().await;
        for r in self.credentials.records() {
            waits.push(self.append(self.meta_partition, r.encode(), 1).await?);
        }
        drop(credentials_in_order);
        self.acl.queue_snapshot(self, waits).await
    }
}
