//! SASL authentication (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) as Kafka does it: a SaslHandshake
//! picks the mechanism, SaslAuthenticate requests carry its tokens, and until they succeed a
//! connection may send nothing but ApiVersions and those two (`admits`). Sessions may expire
//! (KIP-368): the client re-authenticates on the same connection before they do.

pub mod api;
mod exchange;
pub mod raw;
pub mod scram;
pub mod scram_client;

use std::sync::OnceLock;
use std::time::Duration;

use kafka_protocol::messages::ApiKey;

pub use exchange::{authenticate, handshake, Done, HandshakeRefusal, Pending, Step};
pub use scram::{ScramCredential, ScramMechanism};

/// A SASL mechanism nvmq serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    /// The password in the clear (checked against the user's SCRAM credential).
    Plain,
    Scram(ScramMechanism),
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::Scram(s) => s.name(),
        }
    }

    pub fn parse(s: &str) -> Option<Mechanism> {
        match s {
            "PLAIN" => Some(Mechanism::Plain),
            other => ScramMechanism::from_name(other).map(Mechanism::Scram),
        }
    }
}

/// The broker's SASL settings.
#[derive(Debug, Clone, Default)]
pub struct SaslConfig {
    /// Mechanisms offered; empty: no authentication, every connection is served as
    /// `User:ANONYMOUS`.
    pub mechanisms: Vec<Mechanism>,
    /// How long an authentication holds before the client must authenticate again (Kafka's
    /// connections.max.reauth.ms); None: for the connection's life.
    pub session_lifetime: Option<Duration>,
}

impl SaslConfig {
    /// Whether connections must authenticate before anything else.
    pub fn required(&self) -> bool {
        !self.mechanisms.is_empty()
    }
}

/// The APIs a connection may send before it authenticated (Kafka's rule).
pub fn admits_unauthenticated(api: ApiKey) -> bool {
    matches!(
        api,
        ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
    )
}

/// Why an authentication failed. The text goes to the client and the log: it never holds a
/// token, a password or a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("malformed SASL message: {0}")]
    Malformed(String),
    /// Wrong password or unknown user (not told apart, so that names cannot be probed).
    #[error("invalid credentials")]
    BadCredentials,
    #[error("no random bytes from the operating system: {0}")]
    Random(String),
    /// The password check was dropped unfinished (the broker is stopping).
    #[error("the password check was interrupted")]
    Interrupted,
}

/// `n` bytes from the operating system's generator (salts, nonces).
pub fn random_bytes(n: usize) -> Result<Vec<u8>, AuthError> {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).map_err(|e| AuthError::Random(e.to_string()))?;
    Ok(b)
}

/// A secret of this process's own: it makes the decoy credential of an unknown user (stable
/// for the process, so that two tries see the same salt).
fn process_secret() -> Result<&'static [u8], AuthError> {
    static SECRET: OnceLock<Vec<u8>> = OnceLock::new();
    if let Some(s) = SECRET.get() {
        return Ok(s);
    }
    let fresh = random_bytes(32)?;
    Ok(SECRET.get_or_init(|| fresh))
}

/// Per-connection SASL state: where the exchange stands.
#[derive(Debug, Default)]
pub struct SaslState {
    pub(crate) step: exchange::Stage,
    /// The handshake was v0: tokens come bare (`raw`).
    pub(crate) raw: bool,
}
