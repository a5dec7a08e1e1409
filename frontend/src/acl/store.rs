//! The authorizer: whether ACLs are enforced, who the super users are, and the bindings, changed
//! only through durable records (a CreateAcls or DeleteAcls is answered once its records are
//! durable, and the bindings change then).

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard};

use nvmq_log::{Appended, LogError};
use tokio::sync::oneshot;

use super::{Acls, Binding, Filter, Operation, ResourceType};
use crate::broker::Broker;
use crate::meta::MetaRecord;
use crate::session::Principal;

type AppendWait = oneshot::Receiver<Result<Appended, LogError>>;

pub struct Authorizer {
    enabled: bool,
    super_users: Vec<Principal>,
    acls: RwLock<Acls>,
    /// Bumped after every change: connections' cached decisions older than it are dropped.
    generation: AtomicU64,
    /// Held while records about bindings are queued (and, for a change, until it is applied), so
    /// that the log holds changes and snapshots in the order they were made: a snapshot's
    /// re-recorded binding never lands after the record that deleted it.
    order: tokio::sync::Mutex<()>,
}

impl Authorizer {
    pub fn new(enabled: bool, super_users: Vec<Principal>, acls: Acls) -> Authorizer {
        Authorizer {
            enabled,
            super_users,
            acls: RwLock::new(acls),
            generation: AtomicU64::new(1),
            order: tokio::sync::Mutex::new(()),
        }
    }

    /// Whether requests are checked (`serve --authorizer`); when not, every check is this bool.
    #[inline]
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn is_super_user(&self, p: &Principal) -> bool {
        self.super_users.contains(p)
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub(super) fn read(&self) -> RwLockReadGuard<'_, Acls> {
        self.acls.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The decision without any cache: super users may do anything, others what the bindings
    /// allow.
    pub fn decide(
        &self,
        principal: &Principal,
        host: Option<IpAddr>,
        op: Operation,
        rt: ResourceType,
        name: &str,
    ) -> bool {
        self.is_super_user(principal) || self.read().allows(principal, host, op, rt, name)
    }

    /// Every binding, in order.
    pub fn bindings(&self) -> Vec<Binding> {
        self.read().iter().cloned().collect()
    }

    pub fn matching(&self, f: &Filter) -> Vec<Binding> {
        self.read().matching(f)
    }

    /// Creates bindings durably: each one's record, then (once durable) the binding. One result
    /// per binding given; one that exists already is Ok at once.
    pub async fn add(&self, b: &Broker, bindings: Vec<Binding>) -> Vec<Result<(), LogError>> {
        let _in_order = self.order.lock().await;
        let mut waits = Vec::with_capacity(bindings.len());
        for binding in &bindings {
            let present = self.read().iter().any(|x| x == binding);
            waits.push(if present {
                None
            } else {
                Some(queue(b, &MetaRecord::AclAdded(binding.clone())).await)
            });
        }
        let mut out = Vec::with_capacity(bindings.len());
        for (binding, w) in bindings.into_iter().zip(waits) {
            let r = match w {
                None => Ok(()),
                Some(w) => durable(w).await,
            };
            if r.is_ok() {
                self.write(|a| a.insert(binding));
            }
            out.push(r);
        }
        out
    }

    /// Deletes, durably, the bindings each filter matches; per filter, the bindings it matched
    /// with the outcome of their deletion (a binding matched by two filters is in both).
    pub async fn remove(
        &self,
        b: &Broker,
        filters: &[Filter],
    ) -> Vec<Vec<(Binding, Result<(), LogError>)>> {
        let _in_order = self.order.lock().await;
        let matched: Vec<Vec<Binding>> = filters.iter().map(|f| self.matching(f)).collect();
        let mut unique: Vec<&Binding> = matched.iter().flatten().collect();
        unique.sort();
        unique.dedup();
        let mut waits = Vec::with_capacity(unique.len());
        for binding in &unique {
            waits.push(queue(b, &MetaRecord::AclRemoved((*binding).clone())).await);
        }
        let mut outcome: Vec<(Binding, Result<(), LogError>)> = Vec::with_capacity(waits.len());
        for (binding, w) in unique.into_iter().zip(waits) {
            let r = durable(w).await;
            if r.is_ok() {
                self.write(|a| a.remove(binding));
            }
            outcome.push((binding.clone(), r));
        }
        matched
            .into_iter()
            .map(|bs| {
                bs.into_iter()
                    .map(|x| {
                        let r = outcome
                            .iter()
                            .find(|(y, _)| *y == x)
                            .map_or(Ok(()), |(_, r)| r.clone());
                        (x, r)
                    })
                    .collect()
            })
            .collect()
    }

    /// Queues a record of every binding (a snapshot: see `Broker::snapshot`).
    pub(crate) async fn queue_snapshot(
        &self,
        b: &Broker,
        waits: &mut Vec<AppendWait>,
    ) -> Result<(), LogError> {
        let _in_order = self.order.lock().await;
        for binding in self.bindings() {
            waits.push(queue(b, &MetaRecord::AclAdded(binding)).await?);
        }
        Ok(())
    }

    fn write(&self, f: impl FnOnce(&mut Acls) -> bool) {
        let changed = f(&mut self.acls.write().unwrap_or_else(|e| e.into_inner()));
        if changed {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }
}

async fn queue(b: &Broker, rec: &MetaRecord) -> Result<AppendWait, LogError> {
    b.append(b.meta_partition, rec.encode(), 1).await
}

async fn durable(w: Result<AppendWait, LogError>) -> Result<(), LogError> {
    match w?.await {
        Ok(r) => r.map(|_| ()),
        Err(_) => Err(LogError::Shutdown),
    }
}
