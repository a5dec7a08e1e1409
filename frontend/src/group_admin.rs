//! Groups as operators manage them: the groups known (live in the coordinator, or only holding
//! committed offsets), and their durable removal (DeleteGroups, OffsetDelete, the expiry of
//! empty groups). A removal is a record in `__consumer_offsets`, after the commits it cancels:
//! replay applies both in log order, and since the ring frees its oldest records first, the
//! commits a removal cancels are freed no later than the removal itself. `Broker::snapshot`
//! re-records only the offsets still held, so nothing removed comes back after a wrap.

use std::collections::BTreeMap;
use std::time::Instant;

use nvmq_log::LogError;

use crate::broker::Broker;
use crate::codes;
use crate::meta::MetaRecord;

/// A group as ListGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub protocol_type: String,
    pub state: &'static str,
}

impl Broker {
    /// Every group: those the coordinator holds, and those that only hold committed offsets
    /// (Empty, no protocol type, as Kafka lists a group of `assign()` consumers).
    pub fn list_groups(&self) -> Vec<Listed> {
        let mut all: BTreeMap<String, Listed> = self
            .offsets
            .groups()
            .into_iter()
            .map(|name| {
                let l = Listed {
                    name: name.clone(),
                    protocol_type: String::new(),
                    state: "Empty",
                };
                (name, l)
            })
            .collect();
        for (name, protocol_type, state) in self.groups.list() {
            let l = Listed {
                name: name.clone(),
                protocol_type,
                state,
            };
            all.insert(name, l);
        }
        all.into_values().collect()
    }

    /// Whether a group exists (in the coordinator or by its offsets).
    pub fn group_exists(&self, group: &str) -> bool {
        self.groups.describe(group).is_some() || self.offsets.has_group(group)
    }

    /// Appends a removal record and waits until it is durable; `applied` runs in log order
    /// once it is, before any later commit is applied.
    async fn remove_durably(
        &self,
        rec: MetaRecord,
        applied: impl FnOnce() + Send + 'static,
    ) -> Result<(), LogError> {
        let rx = self
            .append_with(self.offsets_partition, rec.encode(), 1, move |r| {
                if r.is_ok() {
                    applied();
                }
            })
            .await?;
        rx.await.map_err(|_| LogError::Shutdown)?.map(|_| ())
    }

    /// DeleteGroups for one group: NONE once its removal is durable, NON_EMPTY_GROUP while it
    /// has members, GROUP_ID_NOT_FOUND when there is no such group.
    pub async fn delete_group(&self, group: &str) -> Result<i16, LogError> {
        if self.groups.has_members(group) {
            return Ok(codes::NON_EMPTY_GROUP);
        }
        if !self.group_exists(group) {
            return Ok(codes::GROUP_ID_NOT_FOUND);
        }
        let offsets = self.offsets.clone();
        let name = group.to_string();
        self.remove_durably(
            MetaRecord::GroupDeleted {
                group: group.to_string(),
            },
            move || offsets.remove_group(&name),
        )
        .await?;
        if !self.groups.forget_if_empty(group) {
            tracing::info!(group, "a member joined the group while it was deleted; its offsets are gone, the group stays");
        }
        tracing::info!(group, "group deleted");
        Ok(codes::NONE)
    }

    /// Deletes committed offsets of a group, durably.
    pub async fn delete_offsets(
        &self,
        group: &str,
        partitions: Vec<(String, i32)>,
    ) -> Result<(), LogError> {
        if partitions.is_empty() {
            return Ok(());
        }
        let offsets = self.offsets.clone();
        let name = group.to_string();
        let gone = partitions.clone();
        self.remove_durably(
            MetaRecord::OffsetsDeleted {
                group: group.to_string(),
                partitions,
            },
            move || offsets.remove(&name, &gone),
        )
        .await
    }

    /// Deletes (as DeleteGroups does) every group that has had no members and no commits for
    /// `Config::offsets_retention` as of `now` (Kafka's offsets.retention.minutes). A commit
    /// replayed at start counts as made at start: the records carry no time, so a restart
    /// gives every group the full retention again rather than losing offsets early. Returns the
    /// groups deleted.
    pub async fn expire_groups(&self, now: Instant) -> Result<Vec<String>, LogError> {
        let retention = self.cfg.offsets_retention;
        let mut idle: BTreeMap<String, Option<Instant>> = self
            .offsets
            .groups()
            .into_iter()
            .filter(|g| !self.groups.has_members(g))
            .map(|g| {
                let t = self.offsets.last_commit(&g);
                (g, t)
            })
            .collect();
        for (g, since) in self.groups.empty_since() {
            let e = idle.entry(g).or_insert(since);
            *e = (*e).max(since);
        }
        let mut deleted = Vec::new();
        for (g, since) in idle {
            let Some(since) = since else { continue };
            if now.saturating_duration_since(since) < retention {
                continue;
            }
            if self.delete_group(&g).await? == codes::NONE {
                tracing::info!(group = %g, "empty group expired with its offsets");
                deleted.push(g);
            }
        }
        Ok(deleted)
    }
}
