//! What a topic carries besides its partitions: its configs (recorded in `__nvmq_meta`), the
//! largest batch its Produce takes (`max.message.bytes`), and each partition's log start
//! offset as DeleteRecords and retention raise it.
//!
//! The log is one ring per device shared by every partition, so a partition's old records
//! cannot be freed on their own: raising its start offset makes them unreadable (Fetch below
//! gets OFFSET_OUT_OF_RANGE, ListOffsets earliest answers the new start) and the ring frees
//! their space when it wraps past them. The raised start is a `LogStart` record on the
//! partition's own device, replayed at start and re-recorded by its snapshots.

use std::collections::HashMap;
use std::sync::{RwLockReadGuard, RwLockWriteGuard};

use nvmq_log::LogError;

use super::Broker;
use crate::meta::MetaRecord;
use crate::part::PartRef;
use crate::topic_config::TopicConfigs;

/// A topic's set configs and its partitions' raised start offsets.
#[derive(Debug, Default)]
pub(crate) struct TopicState {
    pub configs: HashMap<String, TopicConfigs>,
    pub starts: HashMap<PartRef, u64>,
    /// max.message.bytes of the partitions of topics that set it.
    pub limits: HashMap<PartRef, usize>,
}

/// How a request to raise a partition's start went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Raised {
    /// The partition's start offset now (unchanged if it was at or past the offset asked).
    Start(u64),
    NoPartition,
    /// Past the high watermark.
    OutOfRange {
        end: u64,
    },
}

impl Broker {
    /// The largest record batch every device's log takes: the ceiling of max.message.bytes.
    pub fn max_batch(&self) -> usize {
        self.logs.iter().map(|l| l.max_payload()).min().unwrap_or(0)
    }

    /// The state for reading: the produce and fetch paths of every loop read it at once (a
    /// partition's batch limit, its raised start), so they share the lock; writers (a config
    /// recorded, a start raised, a topic gone) are rare.
    fn topic_state(&self) -> RwLockReadGuard<'_, TopicState> {
        self.topic_state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn topic_state_mut(&self) -> RwLockWriteGuard<'_, TopicState> {
        self.topic_state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The largest batch a Produce to `p` may carry: its topic's max.message.bytes, at most what
    /// its log takes.
    pub fn batch_limit(&self, p: PartRef) -> usize {
        let max = self.log_of(p).max_payload();
        match self.topic_state().limits.get(&p) {
            Some(&l) => l.min(max),
            None => max,
        }
    }

    /// A topic's set configs (empty when all are at their defaults or there is no such topic).
    pub fn topic_configs(&self, name: &str) -> TopicConfigs {
        self.topic_state()
            .configs
            .get(name)
            .cloned()
            .unwrap_or_default()
    }

    /// Replaces a topic's set configs durably (validated by the caller); false when there is no
    /// such topic.
    pub async fn set_topic_configs(
        &self,
        name: &str,
        configs: TopicConfigs,
    ) -> Result<bool, LogError> {
        let _one_at_a_time = self.create_lock.lock().await;
        if !self.topics().map.contains_key(name) {
            return Ok(false);
        }
        self.record_configs(name, configs).await?;
        Ok(true)
    }

    /// Records a live topic's configs and applies them (the caller holds `create_lock`).
    pub(super) async fn record_configs(
        &self,
        name: &str,
        configs: TopicConfigs,
    ) -> Result<(), LogError> {
        let rec = self.config_record(name, &configs);
        self.append_meta(self.meta_partition, &rec).await?;
        self.topic_state_mut()
            .configs
            .insert(name.to_string(), configs);
        self.refresh_limits();
        Ok(())
    }

    fn config_record(&self, name: &str, configs: &TopicConfigs) -> MetaRecord {
        MetaRecord::TopicConfig {
            name: name.to_string(),
            incarnation: self.topics().incarnation.get(name).copied().unwrap_or(0),
            configs: configs
                .set
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    /// The records that re-create every topic's configs (for `snapshot`).
    pub(super) fn config_records(&self) -> Vec<MetaRecord> {
        let all: Vec<(String, TopicConfigs)> = self
            .topic_state()
            .configs
            .iter()
            .map(|(n, c)| (n.clone(), c.clone()))
            .collect();
        all.iter().map(|(n, c)| self.config_record(n, c)).collect()
    }

    /// A deleted topic's configs and start offsets go with it.
    pub(super) fn forget_topic(&self, name: &str, parts: &[PartRef]) {
        {
            let mut st = self.topic_state_mut();
            st.configs.remove(name);
            for p in parts {
                st.starts.remove(p);
            }
        }
        self.refresh_limits();
    }

    /// Recomputes the partitions' batch limits from their topics' configs (after a config, a
    /// topic's partitions or the topics changed).
    pub(super) fn refresh_limits(&self) {
        let topics = self.topics();
        let mut st = self.topic_state_mut();
        let limits = st
            .configs
            .iter()
            .filter_map(|(n, c)| Some((topics.map.get(n)?, c.max_message_bytes()?)))
            .flat_map(|(parts, l)| parts.iter().map(move |&p| (p, l)))
            .collect();
        st.limits = limits;
    }

    /// `p`'s start offset as raised past the log's own, if it was.
    pub(super) fn raised_start(&self, p: PartRef) -> Option<u64> {
        self.topic_state().starts.get(&p).copied()
    }

    /// The record of `p`'s raised start, if it is still past the log's own (for snapshots; once
    /// the ring has overwritten the records below it, the log's start says as much).
    pub(super) fn start_record(&self, p: PartRef) -> Option<MetaRecord> {
        let raised = self.raised_start(p)?;
        let (own, _) = crate::startup::log_bounds(self.log_of(p), p.id)?;
        (raised > own).then_some(MetaRecord::LogStart {
            partition: p.id,
            start: raised,
        })
    }

    /// Raises `p`'s log start offset to `to` durably (DeleteRecords, retention): records below
    /// it are never served again. `to` up to the high watermark.
    pub async fn raise_start(&self, p: PartRef, to: u64) -> Result<Raised, LogError> {
        let Some((start, end)) = self.bounds(p) else {
            return Ok(Raised::NoPartition);
        };
        if to > end {
            return Ok(Raised::OutOfRange { end });
        }
        if to <= start {
            return Ok(Raised::Start(start));
        }
        // On the partition's own device: the record and the data it hides share one log.
        let meta = PartRef::new(p.dev, self.metas.get(p.device()).copied().unwrap_or(0));
        let rec = MetaRecord::LogStart {
            partition: p.id,
            start: to,
        };
        self.append_meta(meta, &rec).await?;
        let now = {
            let mut st = self.topic_state_mut();
            let e = st.starts.entry(p).or_default();
            *e = (*e).max(to);
            *e
        };
        tracing::debug!(partition = %p, start = now, "log start offset raised");
        Ok(Raised::Start(now))
    }

    /// Applies retention.ms and retention.bytes (as of `now_ms`) to every topic that sets them:
    /// each partition's start moves past what they expire. Returns the partitions moved.
    pub async fn enforce_retention(&self, now_ms: i64) -> Result<usize, LogError> {
        let due: Vec<(PartRef, Option<i64>, Option<u64>)> = {
            let topics = self.topics();
            let st = self.topic_state();
            st.configs
                .iter()
                .filter(|(_, c)| c.retention_ms().is_some() || c.retention_bytes().is_some())
                .filter_map(|(n, c)| Some((topics.map.get(n)?, c)))
                .flat_map(|(parts, c)| {
                    let cutoff = c.retention_ms().map(|ms| now_ms.saturating_sub(ms));
                    parts.iter().map(move |&p| (p, cutoff, c.retention_bytes()))
                })
                .collect()
        };
        let mut moved = 0;
        for (p, cutoff, keep) in due {
            let Some((start, end)) = self.bounds(p) else {
                continue;
            };
            let mut to = start;
            if let Some(keep) = keep {
                let log = self.log_of(p);
                to = to.max(log.start_keeping(p.id, start, keep).unwrap_or(start));
            }
            if let Some(cutoff) = cutoff.filter(|&c| c > 0) {
                let idx = self.time_index().clone();
                let first_kept = self
                    .blocking(p.dev, move |log| idx.lookup(log, p, start, end, cutoff))
                    .await??;
                // No record reaches the cutoff: every one of them expired.
                let kept_from = first_kept.map_or(end, |(offset, _)| offset.max(0) as u64);
                to = to.max(kept_from);
            }
            if to > start && matches!(self.raise_start(p, to).await?, Raised::Start(s) if s > start)
            {
                moved += 1;
            }
        }
        Ok(moved)
    }
}
