//! Opening the broker over its logs: the internal partitions are replayed (topic tombstones,
//! producer ids, group generations, committed offsets), the topics found in every device's
//! registry, the idempotent producers' state rebuilt from each partition's newest snapshot
//! and the records after it, and each partition's newest recorded time index restored.
//!
//! Device 0 holds the broker's own state (`__nvmq_meta`, `__consumer_offsets`); every device
//! holds a `__nvmq_meta` partition of its own for the snapshots of its partitions' producers, so
//! that a snapshot and the records it summarises share one log, durable as one prefix (the
//! argument in `producer_snapshots` is per log).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nvmq_log::{Log, LogError, Record};
use tokio::sync::watch;

use crate::broker::{valid_topic_name, Startup};
use crate::credentials::Credentials;
use crate::meta::TimesHead;
use crate::meta::{MetaRecord, META_TOPIC, OFFSETS_TOPIC};
use crate::offsets::Offsets;
use crate::part::PartRef;
use crate::producer_snapshots::Assembler;
use crate::producers::{self as producers_mod, Producers};
use crate::snapshot_parts::Parts;
use crate::time_index::TimeIndex;
use crate::topic_config::TopicConfigs;
use crate::FrontendError;

/// What start-up found.
pub(crate) struct Replayed {
    pub incarnation: HashMap<String, u32>,
    pub next_producer_id: i64,
    pub generations: HashMap<String, i32>,
    pub offsets: Arc<Offsets>,
    pub topics: BTreeMap<String, Vec<PartRef>>,
    pub startup: Startup,
    pub time_index: TimeIndex,
    pub acls: crate::acl::Acls,
    pub credentials: Credentials,
    /// Configs set on the live topics.
    pub configs: HashMap<String, TopicConfigs>,
    /// Log start offsets raised past the log's own (DeleteRecords, retention).
    pub starts: HashMap<PartRef, u64>,
}

/// Time index snapshot parts of one device's partitions.
type TimeParts = Parts<TimesHead, (u64, i64)>;

/// The internal partitions, created on first use.
pub(crate) struct Internal {
    /// `__nvmq_meta` of each device.
    pub metas: Vec<u32>,
    /// `__consumer_offsets` (device 0).
    pub offsets: u32,
}

/// The log partition `(topic, 0)`, created durably if the log has none.
fn internal(log: &Log, topic: &str) -> Result<u32, FrontendError> {
    match log.partition_id(topic, 0) {
        Some(id) => Ok(id),
        None => log
            .create_partition(topic, 0)
            .map_err(|source| FrontendError::Log {
                op: "creating an internal partition",
                source,
            }),
    }
}

pub(crate) fn internal_partitions(logs: &[Arc<Log>]) -> Result<Internal, FrontendError> {
    let metas = logs
        .iter()
        .map(|l| internal(l, META_TOPIC))
        .collect::<Result<Vec<_>, _>>()?;
    let Some(first) = logs.first() else {
        return Err(FrontendError::Config(
            "a broker needs at least one log".into(),
        ));
    };
    let offsets = internal(first, OFFSETS_TOPIC)?;
    Ok(Internal { metas, offsets })
}

/// Replays everything start-up needs. Blocking.
pub(crate) fn replay(
    logs: &[Arc<Log>],
    internal: &Internal,
    producers: &Producers,
) -> Result<Replayed, FrontendError> {
    let mut incarnation: HashMap<String, u32> = HashMap::new();
    let mut next_pid = 0i64;
    let mut generations: HashMap<String, i32> = HashMap::new();
    // Added and removed in log order: a snapshot re-adds every live binding, so any retained
    // suffix of the records that holds one whole snapshot replays to the current set.
    let mut acls = crate::acl::Acls::default();
    let mut snapshots: Vec<Assembler> = logs.iter().map(|_| Assembler::default()).collect();
    let mut times: Vec<TimeParts> = logs.iter().map(|_| TimeParts::default()).collect();
    let credentials = Credentials::default();
    let mut configs: HashMap<String, (u32, Vec<(String, String)>)> = HashMap::new();
    let mut starts: HashMap<PartRef, u64> = HashMap::new();
    for (dev, (log, &meta)) in logs.iter().zip(&internal.metas).enumerate() {
        let asm = &mut snapshots[dev];
        let t = &mut times[dev];
        let dev16 = u16::try_from(dev).unwrap_or(u16::MAX);
        scan_meta(log, meta, META_TOPIC, |rec| match rec {
            MetaRecord::ProducerState(part) => asm.add(part),
            MetaRecord::TimeIndex(i) => t.add(i.partition, i.head, i.part, i.parts, i.samples),
            MetaRecord::LogStart { partition, start } => {
                let e = starts.entry(PartRef::new(dev16, partition)).or_default();
                *e = (*e).max(start);
            }
            // The newest record of the newest incarnation is the topic's whole set.
            MetaRecord::TopicConfig {
                name,
                incarnation: k,
                configs: set,
            } if dev == 0 => {
                if configs.get(&name).is_none_or(|(had, _)| *had <= k) {
                    configs.insert(name, (k, set));
                }
            }
            MetaRecord::DeleteTopic {
                name,
                incarnation: k,
            } if dev == 0 => {
                let e = incarnation.entry(name).or_default();
                *e = (*e).max(k);
            }
            MetaRecord::ProducerId { id } if dev == 0 => next_pid = next_pid.max(id + 1),
            MetaRecord::Generation { group, generation } if dev == 0 => {
                let e = generations.entry(group).or_insert(generation);
                *e = (*e).max(generation);
            }
            MetaRecord::AclAdded(b) if dev == 0 => {
                acls.insert(b);
            }
            MetaRecord::AclRemoved(b) if dev == 0 => {
                acls.remove(&b);
            }
            rec @ (MetaRecord::Credential(_) | MetaRecord::CredentialRemoved { .. })
                if dev == 0 =>
            {
                credentials.replay(&rec)
            }
            MetaRecord::Commits { .. }
            | MetaRecord::GroupDeleted { .. }
            | MetaRecord::OffsetsDeleted { .. } => {}
            other => tracing::warn!(device = dev, ?other, "unexpected record in {META_TOPIC}"),
        })?;
    }
    let offsets = Arc::new(Offsets::default());
    if let Some(log) = logs.first() {
        scan_meta(log, internal.offsets, OFFSETS_TOPIC, |rec| match rec {
            MetaRecord::Commits { group, commits } => offsets.apply(&group, &commits),
            MetaRecord::GroupDeleted { group } => offsets.remove_group(&group),
            MetaRecord::OffsetsDeleted { group, partitions } => offsets.remove(&group, &partitions),
            other => tracing::warn!(?other, "unexpected record in {OFFSETS_TOPIC}"),
        })?;
    }
    delete_orphans(logs, &incarnation);
    let topics = discover_topics(logs, &incarnation);
    let startup = rebuild_producers(logs, &topics, snapshots, producers)?;
    let time_index = restore_time_indexes(logs, &topics, times);
    let configs = live_configs(configs, &topics, &incarnation);
    let starts = live_starts(logs, starts, &topics);
    Ok(Replayed {
        configs,
        starts,
        incarnation,
        next_producer_id: next_pid,
        generations,
        offsets,
        topics,
        startup,
        time_index,
        acls,
        credentials,
    })
}

/// The configs recorded for the live incarnation of a live topic (those of a deleted one go with
/// it: a topic created again under its name starts from defaults).
fn live_configs(
    recorded: HashMap<String, (u32, Vec<(String, String)>)>,
    topics: &BTreeMap<String, Vec<PartRef>>,
    incarnation: &HashMap<String, u32>,
) -> HashMap<String, TopicConfigs> {
    recorded
        .into_iter()
        .filter(|(name, (k, _))| {
            topics.contains_key(name) && incarnation.get(name).copied().unwrap_or(0) == *k
        })
        .map(|(name, (_, set))| {
            let set = set.into_iter().collect();
            (name, TopicConfigs { set })
        })
        .collect()
}

/// The recorded start offsets of live partitions that are still past the log's own (the ring
/// overwriting a partition's oldest records moves the log's start on by itself).
fn live_starts(
    logs: &[Arc<Log>],
    recorded: HashMap<PartRef, u64>,
    topics: &BTreeMap<String, Vec<PartRef>>,
) -> HashMap<PartRef, u64> {
    let live: std::collections::HashSet<PartRef> = topics.values().flatten().copied().collect();
    recorded
        .into_iter()
        .filter(|(p, start)| {
            live.contains(p)
                && logs
                    .get(p.device())
                    .and_then(|l| log_bounds(l, p.id))
                    .is_some_and(|(s, _)| s < *start)
        })
        .collect()
}

/// Each data partition's newest recorded time index that fits what its log holds now (see
/// `TimeIndex::restore`); the others are indexed by their first lookup.
fn restore_time_indexes(
    logs: &[Arc<Log>],
    topics: &BTreeMap<String, Vec<PartRef>>,
    times: Vec<TimeParts>,
) -> TimeIndex {
    let mut times: Vec<_> = times.into_iter().map(TimeParts::finish).collect();
    let index = TimeIndex::default();
    for &p in topics.values().flatten() {
        let Some((head, samples)) = times.get_mut(p.device()).and_then(|t| t.remove(&p.id)) else {
            continue;
        };
        let Some((start, end)) = logs.get(p.device()).and_then(|l| log_bounds(l, p.id)) else {
            continue;
        };
        if !index.restore(p, head, samples, start, end) {
            tracing::warn!(
                partition = %p,
                from = head.from,
                to = head.to,
                start,
                end,
                "recorded time index does not fit the partition; its first lookup rebuilds it"
            );
        }
    }
    index
}

/// (topic name, incarnation) of a log partition's name (`name` or `name#incarnation`).
fn split_log_name(log_topic: &str) -> Option<(String, u32)> {
    match log_topic.rsplit_once('#') {
        Some((n, k)) => k.parse::<u32>().ok().map(|k| (n.to_string(), k)),
        None => Some((log_topic.to_string(), 0)),
    }
}

/// Deletes the log partitions of deleted topics (an earlier incarnation of a name): a crash
/// between a topic's tombstone and the deletes of its partitions leaves them behind, holding
/// registry entries (and checkpoint space) for nothing.
fn delete_orphans(logs: &[Arc<Log>], incarnation: &HashMap<String, u32>) {
    for (dev, log) in logs.iter().enumerate() {
        let ids: Vec<u32> = log
            .partitions()
            .into_iter()
            .filter_map(|(id, log_topic, ..)| {
                let (name, inc) = split_log_name(&log_topic)?;
                let current = incarnation.get(&name).copied().unwrap_or(0);
                (valid_topic_name(&name) && inc < current).then_some(id)
            })
            .collect();
        if ids.is_empty() {
            continue;
        }
        match log.delete_partitions(&ids) {
            Ok(()) => tracing::info!(
                device = dev,
                partitions = ids.len(),
                "deleted the log partitions of deleted topics"
            ),
            Err(e) => tracing::warn!(
                device = dev,
                error = %e,
                "could not delete the log partitions of deleted topics"
            ),
        }
    }
}

/// The topics every device's registry holds, current incarnations only. A create cut short by a
/// crash leaves a prefix of partitions: the topic has those.
fn discover_topics(
    logs: &[Arc<Log>],
    incarnation: &HashMap<String, u32>,
) -> BTreeMap<String, Vec<PartRef>> {
    let mut found: BTreeMap<String, BTreeMap<u32, PartRef>> = BTreeMap::new();
    for (dev, log) in logs.iter().enumerate() {
        let dev = u16::try_from(dev).unwrap_or(u16::MAX);
        for (id, log_topic, index, _, _) in log.partitions() {
            let Some((name, inc)) = split_log_name(&log_topic) else {
                continue;
            };
            if !valid_topic_name(&name) || incarnation.get(&name).copied().unwrap_or(0) != inc {
                continue;
            }
            let here = PartRef::new(dev, id);
            let slot = found.entry(name.clone()).or_default();
            match slot.get(&index) {
                // The same partition on two devices (the device set changed between a crash and
                // a retried create): the first device's is the topic's.
                Some(first) => tracing::warn!(
                    topic = %name,
                    index,
                    kept = %first,
                    ignored = %here,
                    "a partition exists on two devices; serving the first"
                ),
                None => {
                    slot.insert(index, here);
                }
            }
        }
    }
    let mut topics = BTreeMap::new();
    for (name, parts) in found {
        let refs: Vec<PartRef> = parts
            .iter()
            .enumerate()
            .take_while(|(i, (idx, _))| *i as u32 == **idx)
            .map(|(_, (_, p))| *p)
            .collect();
        if !refs.is_empty() {
            topics.insert(name, refs);
        }
    }
    topics
}

/// The idempotent producers' state of every data partition, from its newest usable snapshot
/// (on its own device) and the records after it (see `producer_snapshots` for why that is sound).
fn rebuild_producers(
    logs: &[Arc<Log>],
    topics: &BTreeMap<String, Vec<PartRef>>,
    snapshots: Vec<Assembler>,
    producers: &Producers,
) -> Result<Startup, FrontendError> {
    let mut snapshots: Vec<_> = snapshots.into_iter().map(Assembler::finish).collect();
    let now = producers_mod::now_ms();
    let mut st = Startup::default();
    for (dev, log) in logs.iter().enumerate() {
        let dev = u16::try_from(dev).unwrap_or(u16::MAX);
        for (id, _, _, _, end) in log.partitions() {
            producers.set_end(PartRef::new(dev, id), end);
        }
    }
    for &p in topics.values().flatten() {
        let Some(log) = logs.get(p.device()) else {
            continue;
        };
        let Some((start, end)) = log_bounds(log, p.id) else {
            continue;
        };
        let snap = snapshots.get_mut(p.device()).and_then(|s| s.remove(&p.id));
        let from = match snap {
            Some(s) if start <= s.through && s.through <= end => {
                st.producers_expired += producers.restore(p, s.producers, now);
                st.partitions_from_snapshot += 1;
                s.through
            }
            Some(s) => {
                if s.through > end {
                    tracing::warn!(
                        partition = %p,
                        through = s.through,
                        end,
                        "producer snapshot lies past the partition's end; replaying it in full"
                    );
                }
                st.partitions_replayed_in_full += 1;
                start
            }
            None => {
                st.partitions_replayed_in_full += 1;
                start
            }
        };
        scan_from(log, p.id, from, |r| {
            st.records_replayed += 1;
            if let Ok(info) = crate::batch::header(&r.payload) {
                producers.replay(p, &info, r.offset, now);
            }
            Ok(())
        })?;
    }
    Ok(st)
}

/// (first retained offset, durable end) of a log partition.
pub(crate) fn log_bounds(log: &Log, partition: u32) -> Option<(u64, u64)> {
    log.shared()
        .lock()
        .partitions
        .get(&partition)
        .map(|v| (v.start_offset, v.durable_end))
}

/// Reads every durable record of a partition, in order.
fn scan(
    log: &Log,
    partition: u32,
    f: impl FnMut(&Record) -> Result<(), FrontendError>,
) -> Result<(), FrontendError> {
    match log_bounds(log, partition) {
        Some((start, _)) => scan_from(log, partition, start, f),
        None => Ok(()),
    }
}

/// Reads the durable records of a partition from `from` on, in order.
fn scan_from(
    log: &Log,
    partition: u32,
    from: u64,
    mut f: impl FnMut(&Record) -> Result<(), FrontendError>,
) -> Result<(), FrontendError> {
    let Some((_, end)) = log_bounds(log, partition) else {
        return Ok(());
    };
    let mut next = from;
    while next < end {
        let recs = match log.read(partition, next, 4 << 20) {
            Ok(r) => r,
            // Retention freed the head meanwhile: go on from what is retained now.
            Err(LogError::OffsetOutOfRange { start, .. }) if start > next => {
                next = start;
                continue;
            }
            Err(source) => {
                return Err(FrontendError::Log {
                    op: "replaying a partition",
                    source,
                })
            }
        };
        if recs.is_empty() {
            break;
        }
        for r in &recs {
            f(r)?;
            next = r.offset + u64::from(r.span);
        }
    }
    Ok(())
}

/// Replays one internal partition's records.
fn scan_meta(
    log: &Log,
    partition: u32,
    topic: &'static str,
    mut f: impl FnMut(MetaRecord),
) -> Result<(), FrontendError> {
    scan(log, partition, |r| {
        let rec = MetaRecord::decode(&r.payload).map_err(|what| FrontendError::Meta {
            topic,
            offset: r.offset,
            what,
        })?;
        f(rec);
        Ok(())
    })
}

/// Bridges a thread-run log's condition variable to a tokio watch: long-polling fetches wait on
/// it. (A log hosted by an event loop is bridged by the loop itself.)
pub(crate) fn durable_watch(shared: &nvmq_log::Shared, tx: &watch::Sender<u64>, stop: &AtomicBool) {
    let mut seen = {
        let s = shared.lock();
        (s.durable, s.partitions.len())
    };
    let mut tick = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let s = shared.wait_until(Duration::from_millis(100), |s| {
            (s.durable, s.partitions.len()) != seen
        });
        let now = (s.durable, s.partitions.len());
        let done = s.stopped || s.fatal.is_some();
        drop(s);
        if now != seen {
            seen = now;
            tick += 1;
            tx.send_replace(tick);
        }
        if done {
            // Wake every waiter one last time; they will find the log stopped.
            tx.send_replace(tick + 1);
            return;
        }
    }
}
