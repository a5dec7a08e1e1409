//! What a connection's task needs of its stream, and the TLS handshake that makes one. Plain TCP
//! and TLS streams run the same serving code, each compiled for its own type, so a plain
//! connection pays nothing for TLS being possible.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::session::{Identity, Session};
use crate::tls::{subject_principal, Tls};

/// A stream a connection is served over.
pub(crate) trait Transport: AsyncRead + AsyncWrite + Unpin {
    /// Whether what was written may wait in a buffer of the stream's own (TLS records not yet on
    /// the socket) until flushed.
    const BUFFERS: bool;
}

impl Transport for TcpStream {
    const BUFFERS: bool = false;
}

impl Transport for TlsStream<TcpStream> {
    const BUFFERS: bool = true;
}

/// Runs the TLS handshake, bounded by the settings' timeout; the stream and the connection's
/// session (named by its client certificate under mTLS), or None when the handshake failed
/// (logged, with the peer and the reason: rustls's errors hold no key material).
pub(crate) async fn handshake(
    tls: &Tls,
    stream: TcpStream,
    peer: Option<SocketAddr>,
    offload: crate::offload::Offload,
) -> Option<(TlsStream<TcpStream>, Arc<Session>)> {
    let acceptor = TlsAcceptor::from(tls.current());
    let done = tokio::time::timeout(tls.handshake_timeout(), acceptor.accept(stream)).await;
    let stream = match done {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::info!(?peer, error = %e, "TLS handshake failed");
            return None;
        }
        Err(_) => {
            tracing::info!(
                ?peer,
                timeout = ?tls.handshake_timeout(),
                "TLS handshake not finished in time; closing"
            );
            return None;
        }
    };
    let session = Session::offloading(peer, Some(offload));
    if tls.requires_client_cert() {
        // The verifier has checked the chain: the first certificate is the client's.
        let named = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(subject_principal);
        match named {
            Some(Ok(principal)) => {
                *session.identity() = Identity {
                    principal,
                    authenticated: true,
                };
            }
            Some(Err(why)) => {
                tracing::info!(?peer, %why, "closing a TLS connection");
                return None;
            }
            None => {
                tracing::info!(
                    ?peer,
                    "closing a TLS connection without a client certificate"
                );
                return None;
            }
        }
    }
    Some((stream, session))
}

/// The integration tests' certificate maker (path relative to this file's directory).
#[cfg(test)]
#[path = "../../tests/common/certs.rs"]
mod certs;

#[cfg(test)]
mod tests {
    use super::certs;
    use super::*;
    use crate::tls::{client_config, TlsFiles};
    use rcgen::DnType;
    use rustls::RootCertStore;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio_rustls::TlsConnector;

    /// The session of a connection whose client presented `client`'s certificate.
    async fn session_of(client: &[(DnType, &str)]) -> Arc<Session> {
        let dir = certs::dir(&std::env::temp_dir(), "principal");
        let ca = certs::Ca::new("nvmq test CA");
        let clients = certs::Ca::new("client CA");
        let server = ca.server(false);
        let tls = Tls::load(TlsFiles {
            cert: certs::write(&dir, "s.pem", &server.cert_pem),
            key: certs::write(&dir, "s.key", &server.key_pem),
            client_ca: Some(certs::write(&dir, "ca.pem", &clients.pem())),
        })
        .expect("load");
        let leaf = clients.client(client);
        let mut roots = RootCertStore::empty();
        roots.add(CertificateDer::from(ca.der())).expect("root");
        let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).expect("key");
        let config = client_config(roots, Some((vec![CertificateDer::from(leaf.der)], key)))
            .expect("client config");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let connecting = tokio::spawn(async move {
            let s = TcpStream::connect(addr).await.expect("tcp");
            let name = ServerName::try_from("localhost").expect("name");
            TlsConnector::from(config).connect(name, s).await
        });
        let (s, peer) = listener.accept().await.expect("accept");
        let (_, session) = handshake(
            &tls,
            s,
            Some(peer),
            crate::offload::Offload::new(|task| task()),
        )
        .await
        .expect("handshake");
        connecting.await.expect("client task").expect("client side");
        session
    }

    #[tokio::test]
    async fn an_mtls_client_is_named_by_its_subject_as_kafka_writes_it() {
        let session = session_of(&[
            (DnType::CountryName, "US"),
            (DnType::OrganizationName, "Acme, Inc."),
            (DnType::OrganizationalUnitName, "eng"),
            (DnType::CommonName, "alice"),
        ])
        .await;
        let id = session.identity().clone();
        assert_eq!(
            id.principal.to_string(),
            "User:CN=alice,OU=eng,O=Acme\\, Inc.,C=US"
        );
        assert!(id.authenticated);
    }
}
