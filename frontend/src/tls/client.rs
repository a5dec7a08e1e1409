//! The client side, for `nvmq kafka-bench` and the tests: trust a CA, optionally present a
//! certificate (mTLS).

use std::path::PathBuf;
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::load::{provider, read_certs, read_key};
use super::TlsError;

/// A client's TLS files.
#[derive(Debug, Clone)]
pub struct ClientFiles {
    /// CAs the server's certificate must chain to (PEM).
    pub ca: PathBuf,
    /// A certificate and key to present (mTLS): both or neither.
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl ClientFiles {
    pub fn load(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let mut roots = RootCertStore::empty();
        for c in read_certs("CA", &self.ca)? {
            roots.add(c).map_err(|e| TlsError::Refused {
                what: "CA",
                path: self.ca.clone(),
                reason: e.to_string(),
            })?;
        }
        let identity = match &self.identity {
            None => None,
            Some((cert, key)) => Some((read_certs("client certificate", cert)?, read_key(key)?)),
        };
        client_config(roots, identity).map_err(|e| TlsError::Refused {
            what: "client certificate",
            path: self
                .identity
                .as_ref()
                .map_or(self.ca.clone(), |(c, _)| c.clone()),
            reason: e.to_string(),
        })
    }
}

/// A client that trusts `roots` and presents `identity` when given.
pub fn client_config(
    roots: RootCertStore,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<Arc<ClientConfig>, rustls::Error> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some((certs, key)) => builder.with_client_auth_cert(certs, key)?,
    };
    Ok(Arc::new(config))
}
