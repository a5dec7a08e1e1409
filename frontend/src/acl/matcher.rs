//! Kafka's authorization semantics over a set of bindings: a request is allowed when some Allow
//! binding matches it and no Deny binding does; with none, it is denied (Kafka's
//! allow.everyone.if.no.acl.found=false). Also the filters of DescribeAcls and DeleteAcls.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use super::{AclError, Binding, Entry, Host, Operation, PatternType, Permission, ResourceType};
use super::{ANY, MATCH};
use crate::session::Principal;

/// The bindings, indexed by what a decision looks up.
#[derive(Debug, Default, Clone)]
pub struct Acls {
    all: BTreeSet<Binding>,
    /// Literal patterns by (type, name), `*` included.
    literal: HashMap<(ResourceType, String), Vec<Entry>>,
    /// Prefixed patterns: (type, prefix, entry).
    prefixed: Vec<(ResourceType, String, Entry)>,
}

/// Whether `acl` (a binding's principal) covers `p`: the same, or the wildcard `User:*`.
fn principal_matches(acl: &Principal, p: &Principal) -> bool {
    acl == p || (acl.kind == "User" && acl.name == "*")
}

fn host_matches(acl: &Host, host: Option<IpAddr>) -> bool {
    match acl {
        Host::Any => true,
        Host::Ip(ip) => host.is_some_and(|h| h.to_canonical() == *ip),
    }
}

/// The operations whose Allow grants `op`: itself, All, and those that imply it (Read, Write,
/// Delete and Alter imply Describe; AlterConfigs implies DescribeConfigs).
fn granting(op: Operation) -> &'static [Operation] {
    use Operation::*;
    match op {
        Describe => &[Describe, All, Read, Write, Delete, Alter],
        DescribeConfigs => &[DescribeConfigs, All, AlterConfigs],
        Read => &[Read, All],
        Write => &[Write, All],
        Create => &[Create, All],
        Delete => &[Delete, All],
        Alter => &[Alter, All],
        ClusterAction => &[ClusterAction, All],
        AlterConfigs => &[AlterConfigs, All],
        IdempotentWrite => &[IdempotentWrite, All],
        All => &[All],
    }
}

impl Acls {
    pub fn from_bindings(bindings: impl IntoIterator<Item = Binding>) -> Acls {
        let mut a = Acls::default();
        for b in bindings {
            a.insert(b);
        }
        a
    }

    /// Adds a binding; false if it was there.
    pub fn insert(&mut self, b: Binding) -> bool {
        if self.all.contains(&b) {
            return false;
        }
        let p = &b.pattern;
        match p.kind {
            PatternType::Literal => self
                .literal
                .entry((p.resource, p.name.clone()))
                .or_default()
                .push(b.entry.clone()),
            PatternType::Prefixed => {
                self.prefixed
                    .push((p.resource, p.name.clone(), b.entry.clone()))
            }
        }
        self.all.insert(b);
        true
    }

    /// Takes a binding out; false if it was not there.
    pub fn remove(&mut self, b: &Binding) -> bool {
        if !self.all.remove(b) {
            return false;
        }
        let p = &b.pattern;
        match p.kind {
            PatternType::Literal => {
                let key = (p.resource, p.name.clone());
                if let Some(v) = self.literal.get_mut(&key) {
                    v.retain(|e| *e != b.entry);
                    if v.is_empty() {
                        self.literal.remove(&key);
                    }
                }
            }
            PatternType::Prefixed => self
                .prefixed
                .retain(|(r, n, e)| !(*r == p.resource && *n == p.name && *e == b.entry)),
        }
        true
    }

    pub fn len(&self) -> usize {
        self.all.len()
    }

    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// Every binding, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Binding> {
        self.all.iter()
    }

    /// The entries of every binding whose pattern covers the resource.
    fn entries<'a>(&'a self, rt: ResourceType, name: &'a str) -> impl Iterator<Item = &'a Entry> {
        let exact = self.literal.get(&(rt, name.to_string()));
        let wildcard = self.literal.get(&(rt, "*".to_string()));
        let prefixed = self
            .prefixed
            .iter()
            .filter(move |(r, p, _)| *r == rt && name.starts_with(p.as_str()))
            .map(|(_, _, e)| e);
        exact.into_iter().chain(wildcard).flatten().chain(prefixed)
    }

    /// Kafka's decision for `principal` connected from `host` doing `op` on a resource: a Deny
    /// for the operation (or All) wins; else some Allow that grants it; else denied.
    pub fn allows(
        &self,
        principal: &Principal,
        host: Option<IpAddr>,
        op: Operation,
        rt: ResourceType,
        name: &str,
    ) -> bool {
        let mut allowed = false;
        for e in self.entries(rt, name) {
            if !principal_matches(&e.principal, principal) || !host_matches(&e.host, host) {
                continue;
            }
            match e.permission {
                Permission::Deny if e.op == op || e.op == Operation::All => return false,
                Permission::Deny => {}
                Permission::Allow => allowed |= granting(op).contains(&e.op),
            }
        }
        allowed
    }

    /// Whether `principal` may do `op` on some resource of type `rt` (Kafka's
    /// `authorizeByResourceType`, behind KIP-679): some Allow for the operation (or All) names
    /// a resource no Deny covers; a Deny on the literal `*` denies them all. Only the operation
    /// and All count here, not the operations that imply it.
    pub fn allows_some(
        &self,
        principal: &Principal,
        host: Option<IpAddr>,
        op: Operation,
        rt: ResourceType,
    ) -> bool {
        let mut allowed: Vec<(PatternType, &str)> = Vec::new();
        let mut denied_literal: Vec<&str> = Vec::new();
        let mut denied_prefix: Vec<&str> = Vec::new();
        let mut wildcard = false;
        for b in self.all.iter().filter(|b| b.pattern.resource == rt) {
            let e = &b.entry;
            if !principal_matches(&e.principal, principal)
                || !host_matches(&e.host, host)
                || (e.op != op && e.op != Operation::All)
            {
                continue;
            }
            let (kind, name) = (b.pattern.kind, b.pattern.name.as_str());
            match (e.permission, kind) {
                (Permission::Deny, PatternType::Literal) if name == "*" => return false,
                (Permission::Deny, PatternType::Literal) => denied_literal.push(name),
                (Permission::Deny, PatternType::Prefixed) => denied_prefix.push(name),
                (Permission::Allow, PatternType::Literal) if name == "*" => wildcard = true,
                (Permission::Allow, _) => allowed.push((kind, name)),
            }
        }
        wildcard
            || allowed.into_iter().any(|(kind, name)| {
                let denied = (kind == PatternType::Literal && denied_literal.contains(&name))
                    || denied_prefix.iter().any(|p| name.starts_with(p));
                !denied
            })
    }

    /// The bindings a filter matches.
    pub fn matching(&self, f: &Filter) -> Vec<Binding> {
        self.all.iter().filter(|b| f.matches(b)).cloned().collect()
    }
}

/// Which resource patterns a filter selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternFilter {
    /// None: any type.
    pub resource: Option<ResourceType>,
    /// None: any name.
    pub name: Option<String>,
    pub kind: KindFilter,
}

/// A filter's pattern type: one of them, ANY, or MATCH (every pattern that covers the name:
/// the literal name, the literal `*`, and every prefix of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KindFilter {
    Is(PatternType),
    Any,
    Match,
}

/// A DescribeAcls or DeleteAcls filter (Kafka's AclBindingFilter): every field None (or ANY)
/// matches anything; principal and host match exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub pattern: PatternFilter,
    pub principal: Option<Principal>,
    pub host: Option<String>,
    pub op: Option<Operation>,
    pub permission: Option<Permission>,
}

/// A filter's fields as the protocol carries them.
#[derive(Debug, Clone, Copy)]
pub struct FilterWire<'a> {
    pub resource_type: i8,
    pub name: Option<&'a str>,
    pub pattern_type: i8,
    pub principal: Option<&'a str>,
    pub host: Option<&'a str>,
    pub op: i8,
    pub permission: i8,
}

fn any_or<T>(code: i8, f: impl FnOnce(i8) -> Result<T, AclError>) -> Result<Option<T>, AclError> {
    if code == ANY {
        Ok(None)
    } else {
        f(code).map(Some)
    }
}

impl Filter {
    pub fn from_wire(w: FilterWire<'_>) -> Result<Filter, AclError> {
        let kind = match w.pattern_type {
            ANY => KindFilter::Any,
            MATCH => KindFilter::Match,
            c => KindFilter::Is(PatternType::from_code(c)?),
        };
        let principal = match w.principal {
            None => None,
            Some(p) => Some(Principal::parse(p).ok_or_else(|| AclError::Principal(p.into()))?),
        };
        Ok(Filter {
            pattern: PatternFilter {
                resource: any_or(w.resource_type, ResourceType::from_code)?,
                name: w.name.map(str::to_string),
                kind,
            },
            principal,
            host: w.host.map(str::to_string),
            op: any_or(w.op, Operation::from_code)?,
            permission: any_or(w.permission, Permission::from_code)?,
        })
    }

    /// Kafka's `AclBindingFilter.matches`.
    pub fn matches(&self, b: &Binding) -> bool {
        let pf = &self.pattern;
        let p = &b.pattern;
        if pf.resource.is_some_and(|r| r != p.resource) {
            return false;
        }
        if matches!(pf.kind, KindFilter::Is(k) if k != p.kind) {
            return false;
        }
        let name_ok = match (&pf.name, pf.kind) {
            (None, _) => true,
            (Some(n), KindFilter::Match) => match p.kind {
                PatternType::Literal => *n == p.name || p.name == "*",
                PatternType::Prefixed => n.starts_with(p.name.as_str()),
            },
            (Some(n), _) => *n == p.name,
        };
        let e = &b.entry;
        name_ok
            && self.principal.as_ref().is_none_or(|x| *x == e.principal)
            && self.host.as_ref().is_none_or(|h| *h == e.host.to_string())
            && self.op.is_none_or(|o| o == e.op)
            && self.permission.is_none_or(|x| x == e.permission)
    }
}

#[cfg(test)]
#[path = "matcher_tests.rs"]
mod tests;
