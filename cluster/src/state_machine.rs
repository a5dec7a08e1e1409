//! The group's state machine: the applied requests by index, or, with an [`Applier`], the
//! node's own state that the applier keeps (a Kafka partition's records). Its snapshots are
//! records of the group's partition, durable before use. Like the log store, it refuses every
//! call once the log failed under the group.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::{Stream, StreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, RaftSnapshotBuilder};

use crate::apply::Applier;
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
            Some((meta, data)) => Applied {
                last: meta.last_log_id,
                membership: meta.last_membership,
                data: decode_data(group.group(), &data)?,
            },
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

    /// Snapshots carry `Applied::data`; an applier's state is the node's, not in them.
    fn refuse_snapshots(&self, op: &'static str) -> Result<(), ClusterError> {
        match self.applier {
            Some(_) => Err(ClusterError::NoSnapshots {
                group: self.group.group(),
                op,
            }),
            None => Ok(()),
        }
    }

    /// What has been applied so far (a copy).
    pub fn applied(&self) -> Result<Applied, ClusterError> {
        Ok(self.lock("read the applied state")?.clone())
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    type SnapshotData = Vec<u8>;

    /// Writes the snapshot to the log and returns it once durable: openraft may purge the
    /// entries it covers as soon as it has it.
    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        self.refuse_snapshots("build snapshot")?;
        let (meta, data) = {
            let a = self.lock("build snapshot")?;
            let pairs: Vec<(&u64, &Vec<u8>)> = a.data.iter().collect();
            let data = serde_json::to_vec(&pairs).map_err(io::Error::other)?;
            let meta = SnapshotMeta {
                last_log_id: a.last,
                last_membership: a.membership.clone(),
            };
            (meta, data)
        };
        self.group
            .write_durable(
                RaftRecord::Snapshot(meta.clone(), data.clone()),
                "build snapshot",
            )
            .await?;
        Ok(Snapshot {
            meta,
            snapshot: data,
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = StateMachine;

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
                        self.lock("apply")?.data.insert(index, req.0);
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

    async fn get_snapshot_builder(&mut self) -> StateMachine {
        self.clone()
    }

    /// Durable before the state is replaced: a crash in between leaves the old state and the
    /// old snapshot, or the new snapshot to start from.
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        data: Vec<u8>,
    ) -> Result<(), io::Error> {
        self.refuse_snapshots("install snapshot")?;
        let decoded = decode_data(self.group.group(), &data)?;
        self.group
            .write_durable(RaftRecord::Snapshot(meta.clone(), data), "install snapshot")
            .await?;
        *self.lock("install snapshot")? = Applied {
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
