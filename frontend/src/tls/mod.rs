//! TLS on the Kafka listener: the certificate, key and (for mTLS) client CA read from PEM files,
//! held where the accept path reads them and replaced whole by a reload (SIGHUP), so that new
//! connections take the new files while those already open keep what they started with.

mod client;
mod load;
mod principal;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::ServerConfig;

pub use client::{client_config, ClientFiles};
pub use load::{read_certs, read_key};
pub use principal::subject_principal;

/// How long a client may take to finish its handshake: one that never does must not hold a
/// connection slot for long.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a TLS file could not give; each names the file and, never, its contents.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading the TLS {what} file {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the TLS {what} file {path} is not valid PEM: {reason}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("the TLS {what} file {path} holds no {expected}")]
    Empty {
        what: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("the TLS {what} file {path} was refused: {reason}")]
    Refused {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
}

/// The files a TLS listener is configured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate, then the intermediates clients need (PEM).
    pub cert: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1 PEM).
    pub key: PathBuf,
    /// CAs whose client certificates are accepted; with it every client must present one.
    pub client_ca: Option<PathBuf>,
}

/// A listener's TLS settings, shared by the accept path and whoever reloads them.
#[derive(Clone)]
pub struct Tls {
    inner: Arc<Inner>,
}

struct Inner {
    files: TlsFiles,
    current: ArcSwap<ServerConfig>,
    handshake_timeout: Duration,
}

impl Tls {
    /// Reads the files; an error names the file and what is wrong with it.
    pub fn load(files: TlsFiles) -> Result<Tls, TlsError> {
        Tls::load_with_timeout(files, HANDSHAKE_TIMEOUT)
    }

    /// As `load`, with another handshake timeout (tests).
    pub fn load_with_timeout(
        files: TlsFiles,
        handshake_timeout: Duration,
    ) -> Result<Tls, TlsError> {
        let config = load::server_config(&files)?;
        Ok(Tls {
            inner: Arc::new(Inner {
                files,
                current: ArcSwap::from(config),
                handshake_timeout,
            }),
        })
    }

    /// Reads the files again; new connections use what they hold from now on, open ones keep
    /// theirs. On error the settings in use stay.
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = load::server_config(&self.inner.files)?;
        self.inner.current.store(config);
        Ok(())
    }

    pub fn files(&self) -> &TlsFiles {
        &self.inner.files
    }

    /// Whether every client must present a certificate (mTLS).
    pub fn requires_client_cert(&self) -> bool {
        self.inner.files.client_ca.is_some()
    }

    pub fn handshake_timeout(&self) -> Duration {
        self.inner.handshake_timeout
    }

    /// The settings a connection accepted now uses.
    pub(crate) fn current(&self) -> Arc<ServerConfig> {
        self.inner.current.load_full()
    }
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("files", &self.inner.files)
            .field("handshake_timeout", &self.inner.handshake_timeout)
            .finish()
    }
}

/// The file's bytes, or an error naming it.
fn read_file(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}
