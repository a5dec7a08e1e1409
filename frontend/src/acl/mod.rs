//! Access control lists as Kafka has them: a binding gives a principal (from a host) permission
//! to do an operation on resources named by a pattern; the authorizer (`store`) decides each
//! request from them (`matcher`), they are kept durably in `__nvmq_meta` (`record`), managed
//! through CreateAcls, DescribeAcls and DeleteAcls (`api`) and checked per request (`check`);
//! what a principal may do on a resource is reported as KIP-430's bit field (`operations`).
//!
//! The numbers are the protocol's (Kafka's `ResourceType`, `PatternType`, `AclOperation`,
//! `AclPermissionType` codes), so a binding goes on the wire and into the log as it is.

pub mod api;
pub mod check;
pub mod matcher;
pub mod operations;
pub mod record;
pub mod store;

use std::fmt;
use std::net::IpAddr;

use crate::session::Principal;

pub use matcher::{Acls, Filter, PatternFilter};
pub use store::Authorizer;

/// The one name a Cluster resource has.
pub const CLUSTER_NAME: &str = "kafka-cluster";

/// Why a binding or filter from a request (or a record) is not one nvmq can take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AclError {
    #[error("{what} code {code} is not valid here")]
    Code { what: &'static str, code: i8 },
    #[error("principal {0:?} is not of the form Type:name")]
    Principal(String),
    #[error("host {0:?} is neither * nor an IP address")]
    Host(String),
    #[error("a resource name may not be empty")]
    EmptyName,
    #[error("the cluster resource is named {CLUSTER_NAME:?}, not {0:?}")]
    ClusterName(String),
}

macro_rules! codes {
    ($(#[$m:meta])* $name:ident, $what:literal { $($v:ident = $c:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($v),* }
        impl $name {
            /// Every value, in code order (what a command line may name).
            pub const EVERY: &'static [$name] = &[$($name::$v),*];
            pub fn code(self) -> i8 {
                match self { $($name::$v => $c),* }
            }
            pub fn from_code(c: i8) -> Result<$name, AclError> {
                match c {
                    $($c => Ok($name::$v),)*
                    code => Err(AclError::Code { what: $what, code }),
                }
            }
        }
    };
}

codes!(
    /// What kind of thing a binding is about (Kafka's ResourceType; ANY=1 only in filters).
    ResourceType, "resource type" {
        Topic = 2, Group = 3, Cluster = 4, TransactionalId = 5,
    }
);

codes!(
    /// How a binding's resource name is matched (LITERAL=3, PREFIXED=4; ANY=1 and MATCH=2
    /// only in filters).
    PatternType, "pattern type" { Literal = 3, Prefixed = 4 }
);

codes!(
    /// What a request does (Kafka's AclOperation; ANY=1 only in filters).
    Operation, "operation" {
        All = 2, Read = 3, Write = 4, Create = 5, Delete = 6, Alter = 7, Describe = 8,
        ClusterAction = 9, DescribeConfigs = 10, AlterConfigs = 11, IdempotentWrite = 12,
    }
);

codes!(
    /// Whether a binding allows or denies (ANY=1 only in filters).
    Permission, "permission" { Deny = 2, Allow = 3 }
);

/// The code that means "any" in a filter.
pub const ANY: i8 = 1;
/// The filter pattern type that matches every binding whose pattern covers the name.
pub const MATCH: i8 = 2;

/// Where a binding's principal may connect from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    Any,
    Ip(IpAddr),
}

impl Host {
    pub fn parse(s: &str) -> Result<Host, AclError> {
        if s == "*" {
            return Ok(Host::Any);
        }
        s.parse::<IpAddr>()
            .map(|ip| Host::Ip(ip.to_canonical()))
            .map_err(|_| AclError::Host(s.to_string()))
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Any => f.write_str("*"),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// The resources a binding is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pattern {
    pub resource: ResourceType,
    /// A literal `*` names every resource of the type.
    pub name: String,
    pub kind: PatternType,
}

/// Who may (or may not) do what.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Entry {
    /// `User:*` is every principal.
    pub principal: Principal,
    pub host: Host,
    pub op: Operation,
    pub permission: Permission,
}

/// One ACL.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Binding {
    pub pattern: Pattern,
    pub entry: Entry,
}

impl Binding {
    /// A binding from the wire's fields, checked as Kafka checks a creation.
    pub fn from_wire(w: Wire<'_>) -> Result<Binding, AclError> {
        let resource = ResourceType::from_code(w.resource_type)?;
        let kind = PatternType::from_code(w.pattern_type)?;
        if w.name.is_empty() {
            return Err(AclError::EmptyName);
        }
        if resource == ResourceType::Cluster && w.name != CLUSTER_NAME {
            return Err(AclError::ClusterName(w.name.to_string()));
        }
        let principal =
            Principal::parse(w.principal).ok_or_else(|| AclError::Principal(w.principal.into()))?;
        Ok(Binding {
            pattern: Pattern {
                resource,
                name: w.name.to_string(),
                kind,
            },
            entry: Entry {
                principal,
                host: Host::parse(w.host)?,
                op: Operation::from_code(w.op)?,
                permission: Permission::from_code(w.permission)?,
            },
        })
    }
}

/// A binding's fields as the protocol carries them.
#[derive(Debug, Clone, Copy)]
pub struct Wire<'a> {
    pub resource_type: i8,
    pub name: &'a str,
    pub pattern_type: i8,
    pub principal: &'a str,
    pub host: &'a str,
    pub op: i8,
    pub permission: i8,
}

impl fmt::Display for Binding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} {} {:?}:{} {:?} {:?} from {}",
            self.entry.permission,
            self.entry.principal,
            self.pattern.resource,
            self.pattern.name,
            self.pattern.kind,
            self.entry.op,
            self.entry.host
        )
    }
}
