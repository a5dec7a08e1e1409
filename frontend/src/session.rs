//! Who is at the other end of a connection. TLS (a client certificate) and SASL name the
//! principal; the authorizer reads it for every request. One `Session` per connection, shared by
//! the requests it carries (their `Ctx`).

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::sasl::SaslState;

/// A principal as Kafka writes it: `User:alice`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Principal {
    /// The principal type; Kafka's clients and ACLs use `User`.
    pub kind: String,
    pub name: String,
}

impl Principal {
    pub fn user(name: impl Into<String>) -> Principal {
        Principal {
            kind: "User".into(),
            name: name.into(),
        }
    }

    /// Who a connection is before TLS or SASL says otherwise (Kafka's `User:ANONYMOUS`).
    pub fn anonymous() -> Principal {
        Principal::user("ANONYMOUS")
    }

    /// Reads `Type:name` (as ACL requests carry it); None when there is no colon or either side
    /// is empty.
    pub fn parse(s: &str) -> Option<Principal> {
        let (kind, name) = s.split_once(':')?;
        (!kind.is_empty() && !name.is_empty()).then(|| Principal {
            kind: kind.into(),
            name: name.into(),
        })
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.name)
    }
}

/// What a connection's security layers learned about its client.
#[derive(Debug, Clone)]
pub struct Identity {
    pub principal: Principal,
    /// The connection passed SASL authentication (or needs none).
    pub authenticated: bool,
}

/// One connection's security state.
#[derive(Debug)]
pub struct Session {
    pub peer: Option<SocketAddr>,
    identity: Mutex<Identity>,
    /// The authorizer's decisions for this connection (`acl::check`).
    pub(crate) decisions: Mutex<crate::acl::check::Cache>,
    /// When the connection was opened: `admitted_until` counts from here.
    opened: Instant,
    /// Until when (ms after `opened`) a connection that must authenticate may send requests
    /// beyond ApiVersions and SASL's own: 0 not (yet, or any more), `u64::MAX` for as long as it
    /// lives. An atomic, so that the check before every request is one load (and a clock read
    /// only when sessions expire).
    admitted_until: AtomicU64,
    /// The SASL exchange in progress (mechanism chosen, SCRAM's first messages).
    pub(crate) sasl: Mutex<SaslState>,
    /// Where its slow authentication work runs (None: on the caller's thread).
    offload: Option<crate::offload::Offload>,
}

impl Session {
    /// A connection that is anonymous until TLS or SASL names it.
    pub fn new(peer: Option<SocketAddr>) -> Arc<Session> {
        Session::offloading(peer, None)
    }

    /// A connection whose slow authentication work (PLAIN's password derivation) runs on
    /// `offload`, off the event loop serving it.
    pub fn offloading(
        peer: Option<SocketAddr>,
        offload: Option<crate::offload::Offload>,
    ) -> Arc<Session> {
        Arc::new(Session {
            peer,
            identity: Mutex::new(Identity {
                principal: Principal::anonymous(),
                authenticated: false,
            }),
            decisions: Mutex::default(),
            opened: Instant::now(),
            admitted_until: AtomicU64::new(0),
            sasl: Mutex::new(SaslState::default()),
            offload,
        })
    }

    /// Whether the connection passed authentication and its session has not expired.
    pub fn admitted(&self) -> bool {
        match self.admitted_until.load(Ordering::Acquire) {
            0 => false,
            u64::MAX => true,
            until => (self.opened.elapsed().as_millis() as u64) < until,
        }
    }

    /// Names the principal SASL authenticated, admitted until `expires` (None: for as long as
    /// the connection lives).
    pub fn authenticate(&self, principal: Principal, expires: Option<Instant>) {
        *self.identity() = Identity {
            principal,
            authenticated: true,
        };
        let until = match expires {
            None => u64::MAX,
            // At least 1: 0 means "not admitted".
            Some(t) => {
                (t.saturating_duration_since(self.opened).as_millis() as u64).clamp(1, u64::MAX - 1)
            }
        };
        self.admitted_until.store(until, Ordering::Release);
    }

    /// Admits nothing more but ApiVersions and SASL (a failed authentication).
    pub fn revoke(&self) {
        self.admitted_until.store(0, Ordering::Release);
        self.identity().authenticated = false;
    }

    pub fn identity(&self) -> MutexGuard<'_, Identity> {
        crate::broker::lock(&self.identity)
    }

    pub fn offload(&self) -> Option<&crate::offload::Offload> {
        self.offload.as_ref()
    }

    pub fn principal(&self) -> Principal {
        self.identity().principal.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principals_read_and_print_as_kafka_writes_them() {
        let p = Principal::parse("User:alice").expect("parses");
        assert_eq!(p, Principal::user("alice"));
        assert_eq!(p.to_string(), "User:alice");
        assert_eq!(
            Principal::parse("User:CN=a,O=b:c").map(|p| p.name),
            Some("CN=a,O=b:c".to_string())
        );
        assert_eq!(Principal::parse("alice"), None);
        assert_eq!(Principal::parse(":alice"), None);
        assert_eq!(Principal::parse("User:"), None);
        assert_eq!(Principal::anonymous().to_string(), "User:ANONYMOUS");
    }

    #[test]
    fn a_session_starts_anonymous_and_takes_a_name() {
        let s = Session::new(None);
        assert_eq!(s.principal(), Principal::anonymous());
        assert!(!s.identity().authenticated);
        *s.identity() = Identity {
            principal: Principal::user("bob"),
            authenticated: true,
        };
        assert_eq!(s.principal().to_string(), "User:bob");
    }

    #[test]
    fn admission_follows_authentication_and_its_expiry() {
        let s = Session::new(None);
        assert!(!s.admitted());
        s.authenticate(Principal::user("alice"), None);
        assert!(s.admitted());
        assert!(s.identity().authenticated);
        assert_eq!(s.principal(), Principal::user("alice"));
        s.authenticate(
            Principal::user("alice"),
            Some(Instant::now() + std::time::Duration::from_secs(3600)),
        );
        assert!(s.admitted());
        // A session that expired (here: at its start) admits nothing more.
        s.authenticate(Principal::user("alice"), Some(s.opened));
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(!s.admitted());
        s.authenticate(Principal::user("alice"), None);
        s.revoke();
        assert!(!s.admitted());
        assert!(!s.identity().authenticated);
    }
}
