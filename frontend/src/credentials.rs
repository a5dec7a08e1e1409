//! SCRAM credentials, kept durably in `__nvmq_meta` (a record per change: set or removed; never
//! a password), replayed on start and re-recorded by every snapshot. PLAIN checks its password
//! against them too.

use std::collections::BTreeMap;
use std::sync::Mutex;

use nvmq_log::LogError;

use crate::broker::lock;
use crate::meta::{CredentialRecord, MetaRecord};
use crate::sasl::{ScramCredential, ScramMechanism};

/// Longest user name stored (the meta records' strings hold up to 64 KiB; this is far below).
pub const MAX_USER_NAME: usize = 1024;

/// Every user's credentials, by user and mechanism.
#[derive(Debug, Default)]
pub struct Credentials {
    users: Mutex<BTreeMap<String, BTreeMap<ScramMechanism, ScramCredential>>>,
    /// One change recorded at a time, so that the order the log holds them in is the order they
    /// were applied in.
    pub(crate) write: tokio::sync::Mutex<()>,
}

/// One user's credential as `nvmq user list` and DescribeUserScramCredentials show it: no
/// secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialInfo {
    pub user: String,
    pub mechanism: ScramMechanism,
    pub iterations: u32,
}

impl Credentials {
    /// Applies a replayed record (later records win).
    pub(crate) fn replay(&self, rec: &MetaRecord) {
        let mut users = lock(&self.users);
        match rec {
            MetaRecord::Credential(c) => {
                users
                    .entry(c.user.clone())
                    .or_default()
                    .insert(c.mechanism, c.credential.clone());
            }
            MetaRecord::CredentialRemoved { user, mechanism } => {
                if let Some(m) = users.get_mut(user) {
                    m.remove(mechanism);
                    if m.is_empty() {
                        users.remove(user);
                    }
                }
            }
            _ => {}
        }
    }

    pub fn get(&self, user: &str, m: ScramMechanism) -> Option<ScramCredential> {
        lock(&self.users).get(user)?.get(&m).cloned()
    }

    /// The credential PLAIN checks a password against: SCRAM-SHA-512's, else SCRAM-SHA-256's.
    pub fn for_plain(&self, user: &str) -> Option<(ScramMechanism, ScramCredential)> {
        let users = lock(&self.users);
        let u = users.get(user)?;
        [ScramMechanism::Sha512, ScramMechanism::Sha256]
            .into_iter()
            .find_map(|m| u.get(&m).map(|c| (m, c.clone())))
    }

    pub fn list(&self) -> Vec<CredentialInfo> {
        lock(&self.users)
            .iter()
            .flat_map(|(user, ms)| {
                ms.iter().map(|(&mechanism, c)| CredentialInfo {
                    user: user.clone(),
                    mechanism,
                    iterations: c.iterations,
                })
            })
            .collect()
    }

    /// The records that re-create every credential (for a snapshot).
    pub(crate) fn records(&self) -> Vec<MetaRecord> {
        lock(&self.users)
            .iter()
            .flat_map(|(user, ms)| {
                ms.iter().map(|(&mechanism, c)| {
                    MetaRecord::Credential(CredentialRecord {
                        user: user.clone(),
                        mechanism,
                        credential: c.clone(),
                    })
                })
            })
            .collect()
    }
}

/// Why a credential change is refused before it is recorded.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("user name is empty or longer than {MAX_USER_NAME} bytes")]
    BadName,
    #[error("{iterations} iterations: SCRAM credentials take {min} to {max}", min = crate::sasl::scram::MIN_ITERATIONS, max = crate::sasl::scram::MAX_ITERATIONS)]
    Iterations { iterations: u32 },
    #[error("user {user:?} has no {} credential", mechanism.name())]
    NotFound {
        user: String,
        mechanism: ScramMechanism,
    },
    #[error("log error while recording a credential change: {0}")]
    Log(#[from] LogError),
}
