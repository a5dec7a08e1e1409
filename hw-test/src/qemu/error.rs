use std::path::PathBuf;
use std::time::Duration;

/// Everything that can stop a rig run, each naming the step and the file or command involved.
#[derive(Debug, thiserror::Error)]
pub enum RigError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("running `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    CommandFailed {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("provisioning: {0}")]
    Provision(String),
    #[error("kernel module {name}: {reason}")]
    Module { name: String, reason: String },
    #[error("guest binary {path}: {reason}")]
    GuestBinary { path: PathBuf, reason: String },
    #[error("invalid rig option {option}: {reason}")]
    Option {
        option: &'static str,
        reason: String,
    },
    #[error("guest did not finish within {limit:?} (QEMU killed); console log {log}; last lines:\n{tail}")]
    Timeout {
        limit: Duration,
        log: PathBuf,
        tail: String,
    },
    #[error("guest init failed: {reason}; console log {log}; last lines:\n{tail}")]
    GuestInit {
        reason: String,
        log: PathBuf,
        tail: String,
    },
    #[error("QEMU exited with {status} before the guest finished; console log {log}; stderr: {stderr}\nlast console lines:\n{tail}")]
    QemuExit {
        status: String,
        log: PathBuf,
        stderr: String,
        tail: String,
    },
    #[error("console of the run in {log} is malformed: {reason}")]
    Console { log: PathBuf, reason: String },
    #[error("power-cut NBD server: {0}")]
    Nbd(#[from] crate::nbd::NbdError),
}

pub type Result<T> = std::result::Result<T, RigError>;

/// Attaches the operation and path to an `io::Error`.
pub(crate) trait IoContext<T> {
    fn ctx(self, op: &'static str, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, op: &'static str, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|source| RigError::Io {
            op,
            path: path.into(),
            source,
        })
    }
}
