//! Who is at the other end of a connection. TLS (a client certificate) and SASL name the
//! principal; the authorizer reads it for every request. One `Session` per connection, shared by
//! the requests it carries (their `Ctx`).

use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

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
}

impl Session {
    /// A connection that is anonymous until TLS or SASL names it.
    pub fn new(peer: Option<SocketAddr>) -> Arc<Session> {
        Arc::new(Session {
            peer,
            identity: Mutex::new(Identity {
                principal: Principal::anonymous(),
                authenticated: false,
            }),
            decisions: Mutex::default(),
        })
    }

    pub fn identity(&self) -> MutexGuard<'_, Identity> {
        crate::broker::lock(&self.identity)
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
}
