//! PEM files to rustls settings. Every error names the file and what is wrong, never what it
//! holds (a key file's bytes must not reach a log).

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::{ring, CryptoProvider};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::{read_file, TlsError, TlsFiles};

/// The one crypto provider: ring (pure Rust and assembly in the crate; aws-lc-rs needs cmake).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

/// The server settings the files describe.
pub(super) fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = read_certs("certificate", &files.cert)?;
    let key = read_key(&files.key)?;
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| refused("certificate", &files.cert, e))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in read_certs("client CA", ca)? {
                roots.add(c).map_err(|e| refused("client CA", ca, e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| refused("client CA", ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    // rustls checks that the key is the certificate's.
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Refused {
            what: "key",
            path: files.key.clone(),
            reason: format!("{e} (with the certificate in {})", files.cert.display()),
        })?;
    Ok(Arc::new(config))
}

fn refused(what: &'static str, path: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::Refused {
        what,
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// Every certificate of a PEM file, in order (at least one).
pub fn read_certs(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read_file(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_pem(what, path, &e))?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_path_buf(),
            expected: "certificate (a -----BEGIN CERTIFICATE----- block)",
        });
    }
    Ok(certs)
}

/// The first private key of a PEM file.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let what = "key";
    let bytes = read_file(what, path)?;
    match PrivateKeyDer::from_pem_slice(&bytes) {
        Ok(k) => Ok(k),
        Err(pem::Error::NoItemsFound) => Err(TlsError::Empty {
            what,
            path: path.to_path_buf(),
            expected: "private key (a PKCS#8, RSA or EC PRIVATE KEY block)",
        }),
        Err(e) => Err(bad_pem(what, path, &e)),
    }
}

/// What is wrong with the PEM, without any of its contents (the lines a parser quotes could be
/// a key's).
fn bad_pem(what: &'static str, path: &Path, e: &pem::Error) -> TlsError {
    let reason = match e {
        pem::Error::MissingSectionEnd { .. } => "a block has no END line",
        pem::Error::IllegalSectionStart { .. } => "a BEGIN line is malformed",
        pem::Error::Base64Decode(_) => "a block's base64 does not decode",
        pem::Error::Io(_) => "the file could not be read",
        pem::Error::SectionTooLarge => "a block is larger than 256 MB",
        _ => "unreadable",
    };
    TlsError::Pem {
        what,
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}
