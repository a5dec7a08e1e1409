//! The broker's side of SCRAM credentials: changes recorded durably, then applied.

use super::Broker;
use crate::credentials::{CredentialError, Credentials, MAX_USER_NAME};
use crate::meta::{CredentialRecord, MetaRecord};
use crate::sasl::{ScramCredential, ScramMechanism};

impl Broker {
    /// Records `user`'s credential for `m` durably, then uses it.
    pub async fn set_credential(
        &self,
        user: &str,
        m: ScramMechanism,
        credential: ScramCredential,
    ) -> Result<(), CredentialError> {
        if user.is_empty() || user.len() > MAX_USER_NAME {
            return Err(CredentialError::BadName);
        }
        let iterations = credential.iterations;
        if !(crate::sasl::scram::MIN_ITERATIONS..=crate::sasl::scram::MAX_ITERATIONS)
            .contains(&iterations)
        {
            return Err(CredentialError::Iterations { iterations });
        }
        let rec = MetaRecord::Credential(CredentialRecord {
            user: user.to_string(),
            mechanism: m,
            credential,
        });
        self.record_credential(rec).await
    }

    /// Removes `user`'s credential for `m` durably.
    pub async fn remove_credential(
        &self,
        user: &str,
        m: ScramMechanism,
    ) -> Result<(), CredentialError> {
        if self.credentials.get(user, m).is_none() {
            return Err(CredentialError::NotFound {
                user: user.to_string(),
                mechanism: m,
            });
        }
        let rec = MetaRecord::CredentialRemoved {
            user: user.to_string(),
            mechanism: m,
        };
        self.record_credential(rec).await
    }

    async fn record_credential(&self, rec: MetaRecord) -> Result<(), CredentialError> {
        let _one = self.credentials.write.lock().await;
        self.append_meta(self.meta_partition, &rec).await?;
        self.credentials.replay(&rec);
        Ok(())
    }

    /// The users' credentials.
    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }
}
