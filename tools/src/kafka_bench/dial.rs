//! How the bench reaches the broker: plain TCP, or TLS (`--tls-ca`, with `--tls-cert` and
//! `--tls-key` for mTLS) so that what TLS costs (a handshake per connection, the per-byte work)
//! can be measured against the same broker without it.

use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use frontend::client::Client;
use frontend::tls::ClientFiles;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tokio_util::either::Either;

/// A connection to the broker, either way.
pub type Stream = Either<TcpStream, TlsStream<TcpStream>>;

/// The broker's address and, for TLS, the client's settings and the name its certificate must
/// carry.
#[derive(Clone)]
pub struct Dial {
    pub addr: String,
    tls: Option<(Arc<ClientConfig>, ServerName<'static>)>,
}

impl Dial {
    /// Plain TCP without `files`; with them, TLS checking the broker's certificate for the host
    /// part of `addr`.
    pub fn new(addr: &str, files: Option<ClientFiles>) -> Result<Dial> {
        let tls = match files {
            None => None,
            Some(f) => {
                let host = addr
                    .rsplit_once(':')
                    .map_or(addr, |(h, _)| h)
                    .trim_start_matches('[')
                    .trim_end_matches(']');
                let name = ServerName::try_from(host.to_string())
                    .map_err(|e| anyhow!("--broker {addr}: {host:?} is no TLS server name: {e}"))?;
                Some((f.load()?, name))
            }
        };
        Ok(Dial {
            addr: addr.to_string(),
            tls,
        })
    }

    pub async fn connect(&self) -> Result<Stream> {
        let addr = &self.addr;
        let s = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to the broker at {addr}"))?;
        s.set_nodelay(true).context("setting TCP_NODELAY")?;
        match &self.tls {
            None => Ok(Either::Left(s)),
            Some((config, name)) => {
                let tls = TlsConnector::from(config.clone())
                    .connect(name.clone(), s)
                    .await
                    .with_context(|| format!("TLS handshake with the broker at {addr}"))?;
                Ok(Either::Right(tls))
            }
        }
    }

    /// A request/answer client (topic set-up, offsets).
    pub async fn client(&self) -> Result<Client> {
        let addr = &self.addr;
        let c = match &self.tls {
            None => Client::connect(addr, "kafka-bench").await,
            Some((config, name)) => {
                Client::connect_tls(addr, "kafka-bench", config.clone(), name.clone()).await
            }
        };
        c.with_context(|| format!("connecting to the broker at {addr}"))
    }
}
