//! One connection's SASL exchange: the mechanism a SaslHandshake chose, then the tokens of
//! SaslAuthenticate requests, to a principal (or a failure, after which the connection closes).
//! A PLAIN password is checked off the event loop (`offload`): deriving it takes milliseconds.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;

use super::scram::{self, ScramFirst};
use super::{process_secret, random_bytes, AuthError, Mechanism};
use crate::broker::Broker;
use crate::session::{Principal, Session};

/// Where a connection's exchange stands.
#[derive(Debug, Default)]
pub(crate) enum Stage {
    /// No handshake yet (or the last exchange finished).
    #[default]
    Idle,
    /// A handshake chose this mechanism; its first token comes next.
    Chosen(Mechanism),
    /// SCRAM's server-first went out; the client-final comes next.
    ScramSent(Box<ScramFirst>),
    /// A PLAIN password is being checked (off the loop); nothing else is taken meanwhile.
    Checking,
    /// An exchange failed: the connection is closing.
    Failed,
}

/// Why a SaslHandshake is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandshakeRefusal {
    /// The mechanism is not one this broker offers.
    Unsupported,
    /// A handshake in the middle of an exchange.
    IllegalState,
}

/// What an authentication achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    pub user: String,
    /// The token to send back (SCRAM's server-final; empty for PLAIN).
    pub reply: Vec<u8>,
    /// Kafka's session_lifetime_ms: 0 when sessions do not expire.
    pub lifetime_ms: i64,
}

/// The outcome of one SaslAuthenticate token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send this token back and wait for the client's next one.
    Continue(Vec<u8>),
    Done(Done),
    /// The exchange failed (the message is for the client; it holds nothing secret). The
    /// connection must close.
    Failed {
        illegal_state: bool,
        message: String,
    },
}

/// Starts an exchange with the mechanism named (also on an authenticated connection: that is
/// how clients re-authenticate).
pub fn handshake(
    b: &Broker,
    session: &Session,
    mechanism: &str,
    raw: bool,
) -> Result<(), HandshakeRefusal> {
    let mut st = crate::broker::lock(&session.sasl);
    st.raw = raw;
    let Some(m) = Mechanism::parse(mechanism).filter(|m| b.cfg.sasl.mechanisms.contains(m)) else {
        st.step = Stage::Failed;
        return Err(HandshakeRefusal::Unsupported);
    };
    match st.step {
        Stage::Idle => {
            st.step = Stage::Chosen(m);
            Ok(())
        }
        _ => {
            st.step = Stage::Failed;
            Err(HandshakeRefusal::IllegalState)
        }
    }
}

/// The outcome of a token, once known.
pub type Pending = Pin<Box<dyn Future<Output = Step> + Send>>;

/// What a token led to: the user, the token back and the mechanism; or why it failed (with the
/// user when known, for the log).
type Outcome = Result<(String, Vec<u8>, &'static str), (AuthError, Option<String>, &'static str)>;

/// Takes the client's next token. A PLAIN token's password is checked on the session's
/// offload; the rest is answered at once.
pub fn authenticate(b: &Arc<Broker>, session: &Arc<Session>, token: &[u8]) -> Pending {
    let mut st = crate::broker::lock(&session.sasl);
    let stage = std::mem::replace(&mut st.step, Stage::Failed);
    let result = match stage {
        Stage::Chosen(Mechanism::Plain) => match plain(b, token) {
            Ok(login) => {
                st.step = Stage::Checking;
                drop(st);
                return check_plain(b.clone(), session.clone(), login);
            }
            Err(e) => Err(e),
        },
        Stage::Chosen(Mechanism::Scram(m)) => match scram_first(b, m, token) {
            Ok((first, reply)) => {
                st.step = Stage::ScramSent(Box::new(first));
                return ready(Step::Continue(reply));
            }
            Err(e) => Err((e, None, m.name())),
        },
        Stage::ScramSent(first) => match scram::server_final(&first, token) {
            Ok(reply) => Ok((first.user.clone(), reply, first.mech_name())),
            Err(e) => Err((e, Some(first.user.clone()), first.mech_name())),
        },
        Stage::Checking => {
            return ready(Step::Failed {
                illegal_state: true,
                message: "SaslAuthenticate while the last one is still being checked".into(),
            })
        }
        Stage::Idle | Stage::Failed => {
            return ready(Step::Failed {
                illegal_state: true,
                message: "SaslAuthenticate before a SaslHandshake chose a mechanism".into(),
            })
        }
    };
    ready(conclude(b, session, result, &mut st.step))
}

fn ready(step: Step) -> Pending {
    Box::pin(async move { step })
}

/// Checks a PLAIN password on the session's offload, then admits the connection or fails it.
fn check_plain(b: Arc<Broker>, session: Arc<Session>, login: PlainLogin) -> Pending {
    Box::pin(async move {
        let PlainLogin {
            user,
            mechanism,
            credential,
            password,
        } = login;
        let matched = crate::offload::run(session.offload(), move || {
            credential.check_password(mechanism, &password)
        })
        .await;
        let result = match matched {
            Some(true) => Ok((user, Vec::new(), "PLAIN")),
            Some(false) => Err((AuthError::BadCredentials, Some(user), "PLAIN")),
            None => Err((AuthError::Interrupted, Some(user), "PLAIN")),
        };
        let mut st = crate::broker::lock(&session.sasl);
        st.step = Stage::Failed;
        conclude(&b, &session, result, &mut st.step)
    })
}

/// Admits the connection for a success; fails it (revoked, logged) otherwise.
fn conclude(b: &Broker, session: &Session, result: Outcome, step: &mut Stage) -> Step {
    match result {
        Ok((user, reply, mech)) => finish(b, session, user, reply, mech, step),
        Err((e, user, mech)) => {
            session.revoke();
            tracing::warn!(peer = ?session.peer, user = user.as_deref().unwrap_or("?"), mechanism = mech, error = %e, "SASL authentication failed");
            Step::Failed {
                illegal_state: false,
                message: failure_message(&e, mech),
            }
        }
    }
}

/// Kafka's message for a failed authentication (what clients show their users).
fn failure_message(e: &AuthError, mech: &str) -> String {
    match e {
        AuthError::BadCredentials => format!(
            "Authentication failed during authentication due to invalid credentials with SASL mechanism {mech}"
        ),
        other => format!("Authentication failed with SASL mechanism {mech}: {other}"),
    }
}

/// Admits the connection as `user`. A re-authentication must name the user the connection
/// already is (Kafka's rule: a connection's principal never changes).
fn finish(
    b: &Broker,
    session: &Session,
    user: String,
    reply: Vec<u8>,
    mech: &str,
    step: &mut Stage,
) -> Step {
    let principal = Principal::user(user.clone());
    {
        let id = session.identity();
        if id.authenticated && id.principal != principal {
            tracing::warn!(peer = ?session.peer, was = %id.principal, now = %principal, "SASL re-authentication as another user refused");
            drop(id);
            session.revoke();
            return Step::Failed {
                illegal_state: false,
                message: "re-authentication must be as the same user".into(),
            };
        }
    }
    let lifetime = b.cfg.sasl.session_lifetime;
    session.authenticate(principal, lifetime.map(|d| Instant::now() + d));
    *step = Stage::Idle;
    tracing::info!(peer = ?session.peer, user, mechanism = mech, "SASL authentication succeeded");
    Step::Done(Done {
        user,
        reply,
        lifetime_ms: lifetime.map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
    })
}

/// A PLAIN login to check: the password against the user's credential.
struct PlainLogin {
    user: String,
    mechanism: scram::ScramMechanism,
    credential: scram::ScramCredential,
    password: Vec<u8>,
}

/// PLAIN's token: `[authzid] NUL authcid NUL password`, and the credential to check the password
/// against: the user's SCRAM credential (SHA-512's if there is one).
fn plain(
    b: &Broker,
    token: &[u8],
) -> Result<PlainLogin, (AuthError, Option<String>, &'static str)> {
    let fail = |e, user: Option<&str>| (e, user.map(str::to_string), "PLAIN");
    let mut parts = token.split(|&c| c == 0);
    let (Some(authzid), Some(user), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(fail(
            AuthError::Malformed("PLAIN token is not authzid NUL user NUL password".into()),
            None,
        ));
    };
    let user = std::str::from_utf8(user)
        .ok()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| fail(AuthError::Malformed("PLAIN user name".into()), None))?;
    if !authzid.is_empty() && authzid != user.as_bytes() {
        return Err(fail(
            AuthError::Malformed(
                "an authorization id other than the user name is not supported".into(),
            ),
            Some(user),
        ));
    }
    let (mechanism, credential) = match b.credentials.for_plain(user) {
        Some(found) => found,
        None => {
            // The same work as for a known user, so that time does not tell who exists.
            let m = scram::ScramMechanism::Sha512;
            let secret = process_secret().map_err(|e| fail(e, Some(user)))?;
            (m, scram::decoy(m, secret, user))
        }
    };
    Ok(PlainLogin {
        user: user.to_string(),
        mechanism,
        credential,
        password: password.to_vec(),
    })
}

fn scram_first(
    b: &Broker,
    m: scram::ScramMechanism,
    token: &[u8],
) -> Result<(ScramFirst, Vec<u8>), AuthError> {
    let nonce = B64.encode(random_bytes(24)?);
    let secret = process_secret()?;
    scram::server_first(
        m,
        token,
        &nonce,
        |user| b.credentials.get(user, m),
        |user| scram::decoy(m, secret, user),
    )
}
