//! The group's state machine: the applied requests by index, or, with an [`Applier`], the
//! node's own state that the applier keeps (a Kafka partition's records). Its snapshots are
//! records of the group's partition, durable before use; with an applier a snapshot carries the
//! applier's bookkeeping only (the data stays on the node's devices) and is written once the
//! entries it covers are durable there. Like the log store, it refuses every call once the log
//! failed under the group.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::{Stream, StreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, RaftSnapshotBuilder};

use crate::apply::{Applier, Settled};
use crate::error::ClusterError;
use crate::record::RaftRecord;
use crate::store::{lock, GroupLog};
use crate::types::{LogId, Response, SnapshotMeta, StoredMembership, TypeConfig};

type Snapshot = openraft::alias::SnapshotOf<TypeConfig, Vec<u8>>;

/// What has been applied: the last applied log id, the membership, and every normal entry's
/// bytes by index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    pub last: Option<LogId>,
    pub membership: StoredMembership,
    pub data: BTreeMap<u64, Vec<u8>>,
}

#[derive(Clone)]
pub struct StateMachine {
    group: GroupLog,
    applied: Arc<Mutex<Applied>>,
    /// Where normal entries go instead of `Applied::data`.
    applier: Option<Arc<dyn Applier>>,
}

fn decode_data(group: u32, bytes: &[u8]) -> Result<BTreeMap<u64, Vec<u8>>, ClusterError> {
    let pairs: Vec<(u64, Vec<u8>)> =
        serde_json::from_slice(bytes).map_err(|e| ClusterError::Encode {
            group,
            op: "decode snapshot data",
            why: e.to_string(),
        })?;
    Ok(pairs.into_iter().collect())
}

impl StateMachine {
    /// Starts from the newest durable snapshot (or empty); openraft re-applies the committed
    /// entries after it.
    pub(crate) fn open(
        group: GroupLog,
        applier: Option<Arc<dyn Applier>>,
    ) -> Result<StateMachine, ClusterError> {
        let snapshot = group.state("open the state machine")?.snapshot.clone();
        let applied = match snapshot {
            None => Applied::default(),
            Some((meta, data)) => {
                let (data, take) =
                    restore(group.group(), applier.as_deref(), meta.last_log_id, &data)?;
                if let Some(take) = take {
                    take();
                }
                Applied {
                    last: meta.last_log_id,
                    membership: meta.last_membership,
                    data,
                }
            }
        };
        Ok(StateMachine {
            group,
            applied: Arc::new(Mutex::new(applied)),
            applier,
        })
    }

    /// The applied state for `op`, unless the log failed under the group.
    fn lock(&self, op: &'static str) -> Result<MutexGuard<'_, Applied>, ClusterError> {
        self.group.healthy(op)?;
        Ok(lock(&self.applied))
    }

    /// What the snapshot at the last applied entry holds: taken now, between two applies, so
    /// that it describes exactly the entries up to it; the builder writes it once they are
    /// durable.
    fn capture(&self) -> Result<Builder, ClusterError> {
        let op = "capture a snapshot";
        let a = self.lock(op)?;
        let meta = SnapshotMeta {
            last_log_id: a.last,
            last_membership: a.membership.clone(),
        };
        let (data, durable) = match &self.applier {
            Some(applier) => {
                let c = applier.capture().map_err(|why| ClusterError::Snapshot {
                    group: self.group.group(),
                    op,
                    index: a.last.map(|l| l.index),
                    why,
                })?;
                (c.data, Some(Mutex::new(c.durable)))
            }
            None => {
                let pairs: Vec<(&u64, &Vec<u8>)> = a.data.iter().collect();
                let data = serde_json::to_vec(&pairs).map_err(|e| ClusterError::Encode {
                    group: self.group.group(),
                    op,
                    why: e.to_string(),
                })?;
                (data, None)
            }
        };
        Ok(Builder {
            group: self.group.clone(),
            captured: Ok((meta, data, durable)),
        })
    }

    /// What has been applied so far (a copy).
    pub fn applied(&self) -> Result<Applied, ClusterError> {
        Ok(self.lock("read the applied state")?.clone())
    }
}

/// A snapshot's data, checked: the applied requests of a group without an applier, and what
/// hands the applier its bookkeeping (run once the snapshot may be used).
type Restored = (BTreeMap<u64, Vec<u8>>, Option<crate::apply::Restore>);

/// Checks a snapshot's data against this node; nothing changes until the caller runs the
/// applier's part.
fn restore(
    group: u32,
    applier: Option<&dyn Applier>,
    last: Option<LogId>,
    data: &[u8],
) -> Result<Restored, ClusterError> {
    match applier {
        Some(applier) => {
            let take = applier
                .restore(data)
                .map_err(|why| ClusterError::Snapshot {
                    group,
                    op: "restore the snapshot",
                    index: last.map(|l| l.index),
                    why,
                })?;
            Ok((BTreeMap::new(), Some(take)))
        }
        None => Ok((decode_data(group, data)?, None)),
    }
}

/// A snapshot taken and not yet written: its metadata, its data, and what resolves once the
/// entries it covers are durable on the node (with an applier).
pub struct Builder {
    group: GroupLog,
    /// The wait sits in a mutex only to make the builder `Sync`, as openraft asks; it is
    /// taken out whole before it is awaited.
    captured: Result<Captured, ClusterError>,
}

/// A snapshot's metadata, its data, and the wait for its entries to be durable (with an
/// applier).
type Captured = (SnapshotMeta, Vec<u8>, Option<Mutex<Settled>>);

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    type SnapshotData = Vec<u8>;

    /// Writes the snapshot to the log and returns it once durable: openraft may purge the
    /// entries it covers as soon as it has it. With an applier, the snapshot is written only
    /// after every batch it counts is durable on the node's devices.
    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let op = "build snapshot";
        let placeholder = Err(ClusterError::NoAnswer {
            group: self.group.group(),
            op,
        });
        let (meta, data, durable) = std::mem::replace(&mut self.captured, placeholder)?;
        if let Some(durable) = durable {
            let durable = durable.into_inner().unwrap_or_else(|p| p.into_inner());
            durable.await.map_err(|why| ClusterError::Snapshot {
                group: self.group.group(),
                op: "wait for the snapshot's entries to be durable",
                index: meta.last_log_id.map(|l| l.index),
                why,
            })?;
        }
        self.group
            .write_durable(RaftRecord::Snapshot(meta.clone(), data.clone()), op)
            .await?;
        Ok(Snapshot {
            meta,
            snapshot: data,
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = Builder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let a = self.lock("read the applied state")?;
        Ok((a.last, a.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + Send,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let index = entry.log_id.index;
            let mut answer = Vec::new();
            match entry.payload {
                EntryPayload::Normal(req) => match &self.applier {
                    Some(applier) => {
                        self.group.healthy("apply")?;
                        answer = applier.apply(index, &req.0).await.map_err(|why| {
                            let e = ClusterError::Apply {
                                group: self.group.group(),
                                index,
                                why,
                            };
                            self.group.stop("apply", e.to_string());
                            e
                        })?;
                    }
                    None => {
                        self.lock("apply")?.data.insert(index, req.0.to_vec());
                    }
                },
                EntryPayload::Blank => {}
                EntryPayload::Membership(m) => {
                    self.lock("apply")?.membership = StoredMembership::new(Some(entry.log_id), m);
                }
            }
            self.lock("apply")?.last = Some(entry.log_id);
            if let Some(r) = responder {
                r.send(Response { index, answer });
            }
        }
        Ok(())
    }

    /// Taken in openraft's state machine worker, between two applies (the build itself runs in
    /// a task of its own): the capture describes exactly the entries applied so far.
    async fn get_snapshot_builder(&mut self) -> Builder {
        match self.capture() {
            Ok(b) => b,
            Err(e) => Builder {
                group: self.group.clone(),
                captured: Err(e),
            },
        }
    }

    /// Durable before the state is replaced: a crash in between leaves the old state and the
    /// old snapshot, or the new snapshot to start from.
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        data: Vec<u8>,
    ) -> Result<(), io::Error> {
        let op = "install snapshot";
        self.group.healthy(op)?;
        // Checked first: a node that lacks what the snapshot counts refuses it, by name, before
        // anything is written; the applier takes it only once it is durable.
        let (decoded, take) = restore(
            self.group.group(),
            self.applier.as_deref(),
            meta.last_log_id,
            &data,
        )?;
        self.group
            .write_durable(RaftRecord::Snapshot(meta.clone(), data), op)
            .await?;
        if let Some(take) = take {
            take();
        }
        *self.lock(op)? = Applied {
            last: meta.last_log_id,
            membership: meta.last_membership.clone(),
            data: decoded,
        };
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let snap = self.group.state("get current snapshot")?.snapshot.clone();
        Ok(snap.map(|(meta, data)| Snapshot {
            meta,
            snapshot: data,
        }))
    }
}
