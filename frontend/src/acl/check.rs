//! The per-request checks. With the authorizer off a check is one bool. With it on, a
//! connection remembers its decisions (per principal and bindings generation), so the fast paths
//! (Produce, Fetch) pay a hash lookup per topic, not a walk over the bindings.

use std::collections::HashMap;

use super::{Authorizer, Operation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;
use crate::conn::Ctx;
use crate::session::{Principal, Session};

/// Decisions cached at most per connection; past it the cache starts over.
const MAX_CACHED: usize = 4096;

/// One connection's decisions, valid for one principal and one generation of the bindings.
#[derive(Debug, Default)]
pub struct Cache {
    generation: u64,
    principal: Option<Principal>,
    decisions: HashMap<(ResourceType, Operation), HashMap<String, bool>>,
    size: usize,
}

impl Authorizer {
    /// Whether the session's principal may do `op` on the resource: the function every request
    /// check goes through (and the benchmark measures).
    pub fn authorize(
        &self,
        session: &Session,
        op: Operation,
        rt: ResourceType,
        name: &str,
    ) -> bool {
        if !self.enabled() {
            return true;
        }
        let identity = session.identity();
        let principal = &identity.principal;
        let mut cache = crate::broker::lock(&session.decisions);
        let generation = self.generation();
        if cache.generation != generation || cache.principal.as_ref() != Some(principal) {
            *cache = Cache {
                generation,
                principal: Some(principal.clone()),
                ..Cache::default()
            };
        }
        if let Some(&d) = cache.decisions.get(&(rt, op)).and_then(|m| m.get(name)) {
            return d;
        }
        let host = session.peer.map(|p| p.ip());
        let d = self.decide(principal, host, op, rt, name);
        if cache.size >= MAX_CACHED {
            cache.decisions.clear();
            cache.size = 0;
        }
        cache.size += 1;
        cache
            .decisions
            .entry((rt, op))
            .or_default()
            .insert(name.to_string(), d);
        d
    }
}

impl Authorizer {
    /// Whether the session's principal may do `op` on some resource of type `rt` (not cached:
    /// only InitProducerId asks).
    pub fn authorize_some(&self, session: &Session, op: Operation, rt: ResourceType) -> bool {
        if !self.enabled() {
            return true;
        }
        let principal = session.principal();
        self.is_super_user(&principal)
            || self
                .read()
                .allows_some(&principal, session.peer.map(|p| p.ip()), op, rt)
    }
}

/// May the request's principal do `op` on topic `name`?
pub fn topic(b: &Broker, ctx: &Ctx, op: Operation, name: &str) -> bool {
    b.acl()
        .authorize(&ctx.session, op, ResourceType::Topic, name)
}

/// May it do `op` on group `name`?
pub fn group(b: &Broker, ctx: &Ctx, op: Operation, name: &str) -> bool {
    b.acl()
        .authorize(&ctx.session, op, ResourceType::Group, name)
}

/// May it do `op` on the cluster?
pub fn cluster(b: &Broker, ctx: &Ctx, op: Operation) -> bool {
    b.acl()
        .authorize(&ctx.session, op, ResourceType::Cluster, CLUSTER_NAME)
}

/// May it create topic `name` (Create on the cluster, or on the topic)?
pub fn create_topic(b: &Broker, ctx: &Ctx, name: &str) -> bool {
    cluster(b, ctx, Operation::Create) || topic(b, ctx, Operation::Create, name)
}

/// May it start an idempotent producer (InitProducerId without a transactional id)? Kafka 3.0+
/// (KIP-679): IdempotentWrite on the cluster, or Write on any topic (its Produce needs Write on
/// the topic anyway).
pub fn idempotent_producer(b: &Broker, ctx: &Ctx) -> bool {
    cluster(b, ctx, Operation::IdempotentWrite)
        || b.acl()
            .authorize_some(&ctx.session, Operation::Write, ResourceType::Topic)
}
