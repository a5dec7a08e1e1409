//! The broker's shared state: its logs (one per device), the topic registry, and the bridges
//! from the logs' blocking calls and ack callbacks into tokio.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::Duration;

use nvmq_log::{Appended, Log, LogError};
use tokio::sync::{oneshot, watch, Semaphore};

use crate::groups::Groups;
use crate::meta::MetaRecord;
use crate::offsets::Offsets;
use crate::part::{self, PartRef};
use crate::producer_snapshots;
use crate::producers::{self as producers_mod, Producers};
use crate::startup;
use crate::topic_config::TopicConfigs;
use crate::FrontendError;

mod config;
mod credentials;
mod security;
mod topic_state;
mod topics;
pub use config::Config;
pub use topic_state::Raised;
use topic_state::TopicState;
pub use topics::{valid_topic_name, Topics, MAX_TOPIC_NAME};

/// How the idempotent producers' state was rebuilt at start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Startup {
    /// Data partitions restored from a snapshot (then replayed from its `through`).
    pub partitions_from_snapshot: usize,
    /// Data partitions replayed from their first retained record (no usable snapshot).
    pub partitions_replayed_in_full: usize,
    /// Log records of data partitions read to rebuild the state.
    pub records_replayed: u64,
    /// Producers left out because they expired.
    pub producers_expired: usize,
}

pub struct Broker {
    pub(crate) cfg: Config,
    topics: Mutex<Topics>,
    create_lock: tokio::sync::Mutex<()>,
    /// One producer snapshot queued at a time, so that the log holds them in the order they
    /// were taken and the parts of two never interleave.
    snapshot_lock: tokio::sync::Mutex<()>,
    /// Bumped whenever a durable position or the partition table moved: long-polling fetches
    /// wait on it.
    durable: watch::Sender<u64>,
    /// Every device's log (device 0 holds the internal partitions).
    logs: Vec<Arc<Log>>,
    /// Appends queued or in flight in the log: kept below the log's queue capacity, so that a
    /// queueing append never blocks a runtime thread.
    append_permits: Arc<Semaphore>,
    /// Blocking reads running at once (they also take a slot in the log's queue).
    read_permits: Arc<Semaphore>,
    /// ListOffsets by timestamp: samples per partition (`time_index.rs`).
    time_index: Arc<crate::time_index::TimeIndex>,
    /// `__nvmq_meta` and `__consumer_offsets` (device 0).
    pub(crate) meta_partition: PartRef,
    pub(crate) offsets_partition: PartRef,
    /// Each device's `__nvmq_meta`: the snapshots of its partitions' producers.
    metas: Vec<u32>,
    pub(crate) groups: Groups,
    pub(crate) offsets: Arc<Offsets>,
    pub(crate) producers: Arc<Producers>,
    startup: Startup,
    /// Appends the frontend may have in flight (`append_permits` when none is).
    append_capacity: u32,
    next_producer_id: Mutex<i64>,
    /// The ACLs and whether they are enforced.
    acl: crate::acl::Authorizer,
    /// SCRAM credentials (`credentials.rs`).
    pub(crate) credentials: crate::credentials::Credentials,
    /// Topic configs, raised log start offsets, batch limits (`topic_state`).
    topic_state: RwLock<TopicState>,
    stop: Arc<AtomicBool>,
    /// This broker's part in a cluster, when it is one node of one (`replica`).
    replica: OnceLock<Arc<crate::replica::Replica>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Broker {
    /// Opens the broker over a started log: creates the internal partitions on first use, replays
    /// them (topic tombstones, producer ids, group generations, committed offsets), and rebuilds
    /// the idempotent producers' sequence state from the data partitions. Blocking.
    pub fn open(
        log: Log,
        queue_capacity: usize,
        cfg: Config,
    ) -> Result<Arc<Broker>, FrontendError> {
        Broker::open_logs(vec![log], queue_capacity, cfg, true)
    }

    /// Like `open`, over logs whose writers an event loop hosts: the loop tells the broker when
    /// D moves (`durable_moved`).
    pub fn open_many(
        logs: Vec<Log>,
        queue_capacity: usize,
        cfg: Config,
    ) -> Result<Arc<Broker>, FrontendError> {
        Broker::open_logs(logs, queue_capacity, cfg, false)
    }

    fn open_logs(
        logs: Vec<Log>,
        queue_capacity: usize,
        cfg: Config,
        watch_thread: bool,
    ) -> Result<Arc<Broker>, FrontendError> {
        let logs: Vec<Arc<Log>> = logs.into_iter().map(Arc::new).collect();
        let Some(log) = logs.first().cloned() else {
            return Err(FrontendError::Config(
                "a broker needs at least one log".into(),
            ));
        };
        if logs.len() > usize::from(u16::MAX) {
            return Err(FrontendError::Config(format!(
                "{} devices: at most {} are supported",
                logs.len(),
                u16::MAX
            )));
        }
        let internal = startup::internal_partitions(&logs)?;
        let producers = Arc::new(Producers::new(cfg.producer_id_expiration));
        let initial_delay = cfg.group_initial_rebalance_delay;
        let replayed = startup::replay(&logs, &internal, &producers)?;
        let topics = Topics::new(replayed.topics, replayed.incarnation);
        let (tx, _) = watch::channel(0u64);
        let stop = Arc::new(AtomicBool::new(false));
        if watch_thread {
            let shared = log.shared().clone();
            let stop = stop.clone();
            let tx = tx.clone();
            let spawned = std::thread::Builder::new()
                .name("nvmq-durable-watch".into())
                .spawn(move || startup::durable_watch(&shared, &tx, &stop));
            if let Err(e) = spawned {
                return Err(FrontendError::Thread(e.to_string()));
            }
        }
        let permits = queue_capacity.max(4);
        let append_capacity = u32::try_from(permits * 3 / 4).unwrap_or(u32::MAX);
        let acl =
            crate::acl::Authorizer::new(cfg.authorizer, cfg.super_users.clone(), replayed.acls);
        let topic_state = TopicState {
            configs: replayed.configs,
            starts: replayed.starts,
            limits: HashMap::new(),
        };
        let b = Arc::new(Broker {
            cfg,
            topics: Mutex::new(topics),
            create_lock: tokio::sync::Mutex::new(()),
            snapshot_lock: tokio::sync::Mutex::new(()),
            durable: tx,
            logs,
            append_permits: Arc::new(Semaphore::new(append_capacity as usize)),
            read_permits: Arc::new(Semaphore::new((permits / 8).max(1))),
            time_index: Arc::new(replayed.time_index),
            meta_partition: PartRef::new(0, internal.metas[0]),
            offsets_partition: PartRef::new(0, internal.offsets),
            metas: internal.metas,
            groups: Groups::with_initial_delay(replayed.generations, initial_delay),
            offsets: replayed.offsets,
            producers,
            startup: replayed.startup,
            append_capacity,
            next_producer_id: Mutex::new(replayed.next_producer_id),
            acl,
            credentials: replayed.credentials,
            topic_state: RwLock::new(topic_state),
            stop,
            replica: OnceLock::new(),
        });
        b.refresh_limits();
        Ok(b)
    }

    /// This broker's part in a cluster; None for a single broker.
    pub fn replica(&self) -> Option<&Arc<crate::replica::Replica>> {
        self.replica.get()
    }

    /// Makes this broker a node of a cluster (once, at start).
    pub(crate) fn set_replica(&self, r: Arc<crate::replica::Replica>) {
        if self.replica.set(r).is_err() {
            tracing::error!("the broker joined a cluster twice; the second is ignored");
        }
    }

    /// How the broker was configured.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn topics(&self) -> MutexGuard<'_, Topics> {
        lock(&self.topics)
    }

    /// Device 0's log: the one holding the broker's own state.
    pub fn log(&self) -> &Arc<Log> {
        &self.logs[0]
    }

    /// The log of the device holding `p` (device 0's for a device this broker does not have,
    /// which no partition it hands out names).
    pub fn log_of(&self, p: PartRef) -> &Arc<Log> {
        self.logs.get(p.device()).unwrap_or(&self.logs[0])
    }

    /// The log partition of `__nvmq_meta` on device 0.
    pub fn meta_partition(&self) -> u32 {
        self.meta_partition.id
    }

    /// How start-up rebuilt the idempotent producers' state.
    pub fn startup(&self) -> Startup {
        self.startup
    }

    /// The idempotent producers' state.
    pub fn producers(&self) -> &Arc<Producers> {
        &self.producers
    }

    /// Waits (up to `limit`) until no append the frontend queued is still unacknowledged;
    /// false if some still were at the limit.
    pub async fn quiesce(&self, limit: Duration) -> bool {
        let all = self.append_permits.acquire_many(self.append_capacity);
        matches!(tokio::time::timeout(limit, all).await, Ok(Ok(_)))
    }

    /// Committed offsets as the broker serves them.
    pub fn offsets(&self) -> &Offsets {
        &self.offsets
    }

    /// Queues an append in the caller's order; the returned receiver resolves once it is durable
    /// (or failed). Waits (asynchronously) only while too many appends are in flight.
    pub async fn append(
        &self,
        partition: PartRef,
        payload: Vec<u8>,
        span: u32,
    ) -> Result<oneshot::Receiver<Result<Appended, LogError>>, LogError> {
        self.append_with(partition, payload, span, |_| {}).await
    }

    /// Like `append`, and runs `on_durable` on the writer thread in log order, before the
    /// receiver resolves (for state that must change in the order the log holds it).
    pub async fn append_with(
        &self,
        partition: PartRef,
        payload: Vec<u8>,
        span: u32,
        on_durable: impl FnOnce(&Result<Appended, LogError>) + Send + 'static,
    ) -> Result<oneshot::Receiver<Result<Appended, LogError>>, LogError> {
        let permit = self
            .append_permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| LogError::Shutdown)?;
        let (tx, rx) = oneshot::channel();
        self.log_of(partition).append_span(
            partition.id,
            payload,
            span,
            Box::new(move |r| {
                on_durable(&r);
                drop(permit);
                let _ = tx.send(r);
            }),
        )?;
        Ok(rx)
    }

    /// Appends one internal record and waits until it is durable.
    pub async fn append_meta(
        &self,
        partition: PartRef,
        rec: &MetaRecord,
    ) -> Result<Appended, LogError> {
        let rx = self.append(partition, rec.encode(), 1).await?;
        rx.await.map_err(|_| LogError::Shutdown)?
    }

    /// The time index behind ListOffsets by timestamp.
    pub fn time_index(&self) -> &Arc<crate::time_index::TimeIndex> {
        &self.time_index
    }

    /// Runs a blocking call on device `dev`'s log off the runtime's threads.
    pub async fn blocking<R: Send + 'static>(
        &self,
        dev: u16,
        f: impl FnOnce(&Log) -> R + Send + 'static,
    ) -> Result<R, LogError> {
        let _permit = self
            .read_permits
            .acquire()
            .await
            .map_err(|_| LogError::Shutdown)?;
        let log = self.log_of(PartRef::new(dev, 0)).clone();
        tokio::task::spawn_blocking(move || f(&log))
            .await
            .map_err(|_| LogError::Shutdown)
    }

    /// A receiver that changes whenever the durable position or the partition table moved.
    pub fn durable_changes(&self) -> watch::Receiver<u64> {
        self.durable.subscribe()
    }

    /// A hosted writer's D moved: wakes the long-polling fetches.
    pub fn durable_moved(&self) {
        self.durable.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Every device's log.
    pub fn logs(&self) -> &[Arc<Log>] {
        &self.logs
    }

    /// Asks every log's writer to finish and stop (see `Log::close`).
    pub fn close_logs(&self) {
        for l in &self.logs {
            l.close();
        }
    }

    /// Creates `partitions` partitions of a new topic; Ok(false) if the topic exists already.
    pub async fn create_topic(&self, name: &str, partitions: u32) -> Result<bool, LogError> {
        self.create_topic_with(name, partitions, TopicConfigs::default())
            .await
    }

    /// `create_topic` with configs (validated by the caller): recorded before the topic is
    /// served, so that no produce goes to it under the defaults. On a node of a cluster the
    /// creation goes through the group (on its leader) and is applied by every node.
    pub async fn create_topic_with(
        &self,
        name: &str,
        partitions: u32,
        configs: TopicConfigs,
    ) -> Result<bool, LogError> {
        let Some(replica) = self.replica() else {
            return self.create_topic_here(name, partitions, configs).await;
        };
        let cmd = crate::replica::Command::CreateTopic {
            name: name.to_string(),
            partitions,
            configs: configs.set.into_iter().collect(),
        };
        match replica.write(&cmd).await {
            Ok(crate::replica::Answer::Created { created }) => Ok(created),
            Ok(other) => Err(LogError::Unavailable(format!(
                "creating topic {name} through the cluster answered {other:?}"
            ))),
            Err(e) => Err(LogError::Unavailable(format!("creating topic {name}: {e}"))),
        }
    }

    /// Creates the topic on this node's devices (a single broker's creation, and a cluster
    /// node's applying one).
    pub(crate) async fn create_topic_here(
        &self,
        name: &str,
        partitions: u32,
        configs: TopicConfigs,
    ) -> Result<bool, LogError> {
        let _one_at_a_time = self.create_lock.lock().await;
        let log_name = {
            let t = self.topics();
            if t.map.contains_key(name) {
                return Ok(false);
            }
            t.log_name(name)
        };
        let ids = self.create_partitions(&log_name, 0..partitions).await?;
        let recorded = if configs.set.is_empty() {
            Ok(())
        } else {
            self.record_configs(name, configs).await
        };
        // Served even if its configs failed to record: its partitions exist (the next start
        // finds them too), at the defaults; the caller reports the failure.
        self.topics().insert(name.to_string(), ids);
        self.refresh_limits();
        tracing::info!(topic = name, partitions, "topic created");
        recorded.map(|()| true)
    }

    /// Grows a topic to `count` partitions: Ok(Err(current count)) if it does not have fewer,
    /// Ok(Ok(())) when grown, None in the outer Option if there is no such topic.
    pub async fn grow_topic(
        &self,
        name: &str,
        count: u32,
    ) -> Result<Option<Result<(), u32>>, LogError> {
        let _one_at_a_time = self.create_lock.lock().await;
        let (log_name, have) = {
            let t = self.topics();
            match t.map.get(name) {
                None => return Ok(None),
                Some(p) => (t.log_name(name), p.len() as u32),
            }
        };
        if count <= have {
            return Ok(Some(Err(have)));
        }
        let ids = self.create_partitions(&log_name, have..count).await?;
        if let Some(p) = self.topics().map.get_mut(name) {
            p.extend(ids);
        }
        self.refresh_limits();
        tracing::info!(topic = name, partitions = count, "topic grown");
        Ok(Some(Ok(())))
    }

    /// Whether a new topic `name` of `partitions` fits every device's registry, as
    /// [`Broker::create_topic`] would place it (CreateTopics' validate_only).
    pub fn create_room(&self, name: &str, partitions: u32) -> Result<(), LogError> {
        let log_name = self.topics().log_name(name);
        let mut by_dev: BTreeMap<u16, Vec<u32>> = BTreeMap::new();
        for index in 0..partitions {
            by_dev
                .entry(part::place(&log_name, index, self.logs.len()))
                .or_default()
                .push(index);
        }
        self.room_on_devices(&log_name, &by_dev)
    }

    /// Whether each device's registry takes its share of the partitions of `log_name`.
    fn room_on_devices(
        &self,
        log_name: &str,
        by_dev: &BTreeMap<u16, Vec<u32>>,
    ) -> Result<(), LogError> {
        for (&dev, idx) in by_dev {
            let n = u32::try_from(idx.len()).unwrap_or(u32::MAX);
            if let Some(log) = self.logs.get(usize::from(dev)) {
                log.registry_room(log_name, n)?;
            }
        }
        Ok(())
    }

    /// The log partitions (log_name, index) for the indexes given, created durably where they
    /// do not exist yet (a create cut short by a crash may have left some, on any device);
    /// a new one goes to the device `part::place` picks. A device's creates go to its writer
    /// together (one batch and flush for many). If any is refused (the registry is full), those
    /// created here are deleted again: a topic is created whole or not at all.
    async fn create_partitions(
        &self,
        log_name: &str,
        indexes: std::ops::Range<u32>,
    ) -> Result<Vec<PartRef>, LogError> {
        let first = indexes.start;
        let mut refs: Vec<Option<PartRef>> = vec![None; indexes.len()];
        let mut to_create: BTreeMap<u16, Vec<u32>> = BTreeMap::new();
        for index in indexes {
            let existing = self.logs.iter().enumerate().find_map(|(d, l)| {
                let d = u16::try_from(d).ok()?;
                l.partition_id(log_name, index)
                    .map(|id| PartRef::new(d, id))
            });
            match existing {
                Some(p) => refs[(index - first) as usize] = Some(p),
                None => to_create
                    .entry(part::place(log_name, index, self.logs.len()))
                    .or_default()
                    .push(index),
            }
        }
        // Refused as a whole before anything is written, when it cannot fit.
        self.room_on_devices(log_name, &to_create)?;
        let mut created = Vec::new();
        let mut refused = None;
        for (dev, idx) in to_create {
            let n = log_name.to_string();
            let results = self
                .blocking(dev, move |log| {
                    log.create_partitions(&n, &idx).map(|r| (idx, r))
                })
                .await??;
            if results.0.len() != results.1.len() {
                return Err(LogError::Unavailable(format!(
                    "the log answered {} creates for {} partitions",
                    results.1.len(),
                    results.0.len()
                )));
            }
            for (index, r) in results.0.into_iter().zip(results.1) {
                match r {
                    Ok(id) => {
                        let p = PartRef::new(dev, id);
                        refs[(index - first) as usize] = Some(p);
                        created.push(p);
                    }
                    Err(e) => {
                        refused.get_or_insert(e);
                    }
                }
            }
        }
        if let Some(e) = refused {
            if let Err(undo) = self.delete_log_partitions(&created).await {
                tracing::warn!(topic = log_name, error = %undo, "could not delete the partitions of a refused create; the next start deletes them");
            }
            return Err(e);
        }
        // Every index has its partition now (existing, or created above).
        refs.into_iter()
            .enumerate()
            .map(|(i, r)| {
                r.ok_or_else(|| {
                    LogError::Unavailable(format!(
                        "partition {} of {log_name} was neither found nor created",
                        first as usize + i
                    ))
                })
            })
            .collect()
    }

    /// Deletes log partitions durably, each device's together: their registry entries go, so
    /// the checkpoint shrinks, and their records are never served again.
    async fn delete_log_partitions(&self, parts: &[PartRef]) -> Result<(), LogError> {
        let mut by_dev: BTreeMap<u16, Vec<u32>> = BTreeMap::new();
        for p in parts {
            by_dev.entry(p.dev).or_default().push(p.id);
        }
        let mut first_err = Ok(());
        for (dev, ids) in by_dev {
            let r = self
                .blocking(dev, move |log| log.delete_partitions(&ids))
                .await
                .and_then(|r| r);
            if let Err(e) = r {
                if first_err.is_ok() {
                    first_err = Err(e);
                }
            }
        }
        for p in parts {
            self.producers.forget(*p);
            self.time_index.forget(*p);
        }
        first_err
    }

    /// Deletes a topic: a durable tombstone in `__nvmq_meta`, then the topic is gone from the
    /// registry, and its log partitions are deleted (their registry entries freed; the data
    /// stays on the device until the ring overwrites it, never served again). A crash between
    /// the tombstone and the partitions' deletes leaves them for the next start to delete.
    pub async fn delete_topic(&self, name: &str) -> Result<bool, LogError> {
        let _one_at_a_time = self.create_lock.lock().await;
        let Some(parts) = self.topics().map.get(name).cloned() else {
            return Ok(false);
        };
        let incarnation = self.topics().incarnation.get(name).copied().unwrap_or(0) + 1;
        self.append_meta(
            self.meta_partition,
            &MetaRecord::DeleteTopic {
                name: name.to_string(),
                incarnation,
            },
        )
        .await?;
        {
            self.topics().remove(name, incarnation);
        }
        self.forget_topic(name, &parts);
        if let Err(e) = self.delete_log_partitions(&parts).await {
            tracing::warn!(topic = name, error = %e, "could not delete the topic's log partitions; the next start deletes them");
        }
        tracing::info!(topic = name, partitions = parts.len(), "topic deleted");
        Ok(true)
    }

    /// Hands out a new producer id, durably recorded so that no restart hands it out again.
    pub async fn new_producer_id(&self) -> Result<i64, LogError> {
        let id = {
            let mut n = lock(&self.next_producer_id);
            let id = *n;
            *n += 1;
            id
        };
        self.append_meta(self.meta_partition, &MetaRecord::ProducerId { id })
            .await?;
        Ok(id)
    }

    /// Records a snapshot of the idempotent producers of every data partition (`changed_only`:
    /// of those whose acknowledged end moved since their last one) and waits until it is
    /// durable. Returns how many partitions were snapshotted.
    pub async fn snapshot_producers(&self, changed_only: bool) -> Result<usize, LogError> {
        self.snapshot_producers_of(None, changed_only).await
    }

    /// `snapshot_producers` for the partitions of one device (None: of every device).
    pub async fn snapshot_producers_of(
        &self,
        dev: Option<u16>,
        changed_only: bool,
    ) -> Result<usize, LogError> {
        let waits = self.queue_producer_snapshots(dev, changed_only).await?;
        let n = waits.0;
        for w in waits.1 {
            w.await.map_err(|_| LogError::Shutdown)??;
        }
        Ok(n)
    }

    /// Queues the records of `snapshot_producers`, and of the partitions' time indexes (those
    /// that grew since they were last recorded, or all of them); (partitions whose producers were
    /// snapshotted, the appends).
    async fn queue_producer_snapshots(
        &self,
        dev: Option<u16>,
        changed_only: bool,
    ) -> Result<(usize, Vec<AppendWait>), LogError> {
        let _in_order = self.snapshot_lock.lock().await;
        let parts: Vec<PartRef> = self
            .topics()
            .map
            .values()
            .flatten()
            .copied()
            .filter(|p| dev.is_none_or(|d| p.dev == d))
            .collect();
        let now = producers_mod::now_ms();
        let mut waits = Vec::new();
        let mut n = 0;
        for p in parts {
            // On the partition's own device, beside the records it summarises.
            let meta = PartRef::new(p.dev, self.metas.get(p.device()).copied().unwrap_or(0));
            let max = self.log_of(p).max_payload();
            let mut recs = Vec::new();
            if let Some(snap) = self.producers.snapshot(p, now, changed_only) {
                n += 1;
                recs.extend(producer_snapshots::records(p.id, snap, max));
            }
            if let Some((head, samples)) = self.time_index.snapshot(p, changed_only) {
                recs.extend(crate::time_index::records(p.id, head, samples, max));
            }
            if !changed_only {
                recs.extend(self.start_record(p));
            }
            for r in recs {
                waits.push(self.append(meta, r.encode(), 1).await?);
            }
        }
        Ok((n, waits))
    }

    /// Re-records the state replayed from the internal partitions (tombstones, the producer-id
    /// high mark, group generations, ACL bindings, SCRAM credentials, every committed offset, every
    /// data partition's producer state) at the tail of the log. The log frees its oldest data when
    /// the ring is full;
    /// taking a snapshot every quarter ring keeps the newest one of each inside what is
    /// retained. Replaying it again changes nothing.
    pub async fn snapshot(&self) -> Result<(), LogError> {
        let mut meta: Vec<MetaRecord> = self
            .topics()
            .incarnation
            .iter()
            .map(|(name, &incarnation)| MetaRecord::DeleteTopic {
                name: name.clone(),
                incarnation,
            })
            .collect();
        let next = *lock(&self.next_producer_id);
        if next > 0 {
            meta.push(MetaRecord::ProducerId { id: next - 1 });
        }
        meta.extend(self.config_records());
        meta.extend(
            self.groups
                .generations()
                .into_iter()
                .map(|(group, generation)| MetaRecord::Generation { group, generation }),
        );
        let mut waits = Vec::new();
        for r in &meta {
            waits.push(self.append(self.meta_partition, r.encode(), 1).await?);
        }
        self.queue_security_snapshot(&mut waits).await?;
        // A group's commits go in records cut by size to fit the log's largest payload: their
        // metadata may take up to 4 KiB each.
        let max = self.log().max_payload();
        for group in self.offsets.groups() {
            let commits = self
                .offsets
                .all(&group)
                .into_iter()
                .map(|((topic, partition), c)| crate::meta::Commit {
                    topic,
                    partition,
                    offset: c.offset,
                    leader_epoch: c.leader_epoch,
                    metadata: c.metadata,
                })
                .collect();
            for rec in crate::meta::commits_records(&group, commits, max) {
                waits.push(self.append(self.offsets_partition, rec.encode(), 1).await?);
            }
        }
        waits.extend(self.queue_producer_snapshots(None, false).await?.1);
        for w in waits {
            w.await.map_err(|_| LogError::Shutdown)??;
        }
        Ok(())
    }

    /// The first `limit` Kafka partitions' (topic, index, start offset, durable end), by topic
    /// and index, and how many partitions follow them (not read).
    pub fn partition_offsets(&self, limit: usize) -> (Vec<(String, u32, u64, u64)>, usize) {
        let (parts, total) = {
            let t = self.topics();
            let total: usize = t.map.values().map(Vec::len).sum();
            let parts: Vec<(String, u32, PartRef)> = t
                .map
                .iter()
                .flat_map(|(t, ps)| {
                    ps.iter()
                        .enumerate()
                        .map(move |(i, p)| (t.clone(), i as u32, *p))
                })
                .take(limit)
                .collect();
            (parts, total)
        };
        let more = total - parts.len();
        let read = parts
            .into_iter()
            .filter_map(|(t, i, p)| self.bounds(p).map(|(s, e)| (t, i, s, e)))
            .collect();
        (read, more)
    }

    /// (start offset, durable end) of a partition.
    /// The start is the log's own or, if DeleteRecords or retention raised it, that.
    pub fn bounds(&self, p: PartRef) -> Option<(u64, u64)> {
        // Straight from the shared state: `Log::partition` copies the partition's whole index.
        let (start, end) = startup::log_bounds(self.log_of(p), p.id)?;
        let raised = self.raised_start(p).unwrap_or(0);
        Some((start.max(raised).min(end), end))
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

pub(crate) type AppendWait = oneshot::Receiver<Result<Appended, LogError>>;
