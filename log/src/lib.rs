//! nvmq's log: the on-disk format, the group-commit writer, readers and indexes.
//!
//! One log serves every partition of a device, so one flush covers them all. Opening a device
//! after a crash is the `recovery` crate's job; it hands the writer a [`Resume`].
#![forbid(unsafe_code)]

pub mod backfill;
pub mod batch;
#[cfg(unix)]
mod bell;
pub mod cache;
pub mod config;
pub mod direct;
mod error;
pub mod format;
mod host;
pub mod layout;
pub mod mkfs;
mod read_pieces;
mod reader;
pub mod scrub;
pub mod shared;
pub mod state;
pub mod writer;

pub use config::{FlushMode, FormatOptions, LogConfig, OnFull};
pub use error::LogError;
pub use host::{Doorbell, Hosted, Turn};
pub use reader::{read_cached, read_with, Record};
pub use shared::{PartitionView, Pow2Histogram, Shared, WriterStats};
pub use writer::{Ack, AckFn, Appended, Now, Request, Resume, RetainedBatch, TokenAck, Writer};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use blockdev::BlockDevice;
use crossbeam::channel::bounded;

use backfill::Backfill;
use host::Queue;
use layout::Geometry;

/// How long `Log::shutdown` waits for a hosted writer's owner to finish what the writer holds.
const HOSTED_STOP_WAIT: Duration = Duration::from_secs(30);

/// A running log: the handle producers and readers share. The writer runs on a thread of its own
/// ([`Log::start`]) or is stepped by an owner's event loop ([`Log::hosted`]).
pub struct Log {
    queue: Option<Queue>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    geo: Geometry,
    max_payload: usize,
    /// When acks go out: a Raft store must refuse a log that acks before the covering flush.
    flush: FlushMode,
    /// Tells the background index rebuild to give up (at shutdown).
    cancel: Arc<AtomicBool>,
    /// Queue pairs of the device on which readers read themselves (`direct.rs`).
    direct: Option<direct::DirectReads>,
}

impl Log {
    /// Starts the writer on its own thread. The thread owns the device (SPDK-style): producers
    /// hand it appends over a bounded channel, so a full queue makes them wait.
    pub fn start<D: BlockDevice + 'static>(writer: Writer<D>, queue_capacity: usize) -> Log {
        // The thread sleeps on its doorbell and the device's completion fd together, where it
        // has both; otherwise it looks at the queue and the device in turn.
        #[cfg(unix)]
        let bell = match bell::ThreadBell::new() {
            Ok(b) => Some(Arc::new(b)),
            Err(e) => {
                tracing::warn!(error = %e, "no doorbell for the writer thread; it waits in slices");
                None
            }
        };
        #[cfg(not(unix))]
        let bell: Option<Arc<host::WakeBell>> = None;
        let queue_bell = bell.clone().map(|b| b as Arc<dyn Doorbell>);
        let (mut log, hosted) = Log::with_queue(writer, queue_capacity, queue_bell);
        let shared = log.shared.clone();
        let thread = std::thread::Builder::new()
            .name("nvmq-writer".into())
            .spawn(move || host::run_thread(hosted, bell));
        log.thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                shared.lock().fatal = Some(format!("could not start the writer thread: {e}"));
                None
            }
        };
        log
    }

    /// Hands the writer to an owner that steps it on its own event loop ([`Hosted::turn`]);
    /// requests from other threads reach it over the queue, and `bell` wakes the owner for them.
    /// The owner keeps turning until [`Turn::Stopped`], which follows `shutdown` (or the drop of
    /// the returned `Log`) once the writer has finished what it holds.
    pub fn hosted<D: BlockDevice + 'static>(
        writer: Writer<D>,
        queue_capacity: usize,
        bell: Arc<dyn Doorbell>,
    ) -> (Log, Hosted<D>) {
        Log::with_queue(writer, queue_capacity, Some(bell))
    }

    fn with_queue<D: BlockDevice + 'static>(
        mut writer: Writer<D>,
        queue_capacity: usize,
        bell: Option<Arc<dyn Doorbell>>,
    ) -> (Log, Hosted<D>) {
        let (tx, rx) = bounded(queue_capacity.max(1));
        let queue = Queue {
            tx,
            bell,
            rx: rx.clone(),
            shared: writer.shared(),
        };
        let shared = writer.shared();
        let backfill = writer.take_backfill();
        let direct = writer.take_direct_reads();
        let scrub_rate = writer.config().scrub_rate;
        let geo = writer.geometry();
        let max_payload = writer.max_payload();
        let flush = writer.config().flush;
        let cancel = Arc::new(AtomicBool::new(false));
        if let Some(job) = backfill {
            spawn_backfill(job, queue.clone(), cancel.clone());
        }
        if scrub_rate > 0 {
            let (shared, cancel) = (shared.clone(), cancel.clone());
            let read = cancellable_reads(queue.clone(), cancel.clone());
            let spawned = std::thread::Builder::new()
                .name("nvmq-scrub".into())
                .spawn(move || scrub::run(geo, shared, scrub_rate, cancel, read));
            if let Err(e) = spawned {
                tracing::error!(error = %e, "could not start the scrub thread");
            }
        }
        let hosted = Hosted::new(writer, rx, queue_capacity.max(1));
        let log = Log {
            queue: Some(queue),
            shared,
            thread: None,
            geo,
            max_payload,
            flush,
            cancel,
            direct,
        };
        (log, hosted)
    }

    fn send(&self, req: Request) -> Result<(), LogError> {
        let stopped = || match &self.shared.lock().fatal {
            Some(f) => LogError::WriterStopped(f.clone()),
            None => LogError::Shutdown,
        };
        match &self.queue {
            Some(q) => q.send(req).map_err(|_| stopped()),
            None => Err(stopped()),
        }
    }

    /// Queues an append; `ack` is called once it is durable (or failed). Blocks while the queue
    /// is full.
    pub fn append(&self, partition: u32, payload: Vec<u8>, ack: AckFn) -> Result<(), LogError> {
        self.append_span(partition, payload, 1, ack)
    }

    /// Queues an append of one record that takes `span` consecutive offsets (a Kafka record
    /// batch of `span` messages, stored whole); the ack names the first.
    pub fn append_span(
        &self,
        partition: u32,
        payload: Vec<u8>,
        span: u32,
        ack: AckFn,
    ) -> Result<(), LogError> {
        if payload.len() > self.max_payload {
            return Err(LogError::RecordTooLarge {
                len: payload.len(),
                max: self.max_payload,
            });
        }
        self.send(Request::Append {
            partition,
            payload,
            span,
            ack,
        })
    }

    /// Appends and waits for the ack.
    pub fn append_wait(&self, partition: u32, payload: Vec<u8>) -> Result<Appended, LogError> {
        let (tx, rx) = bounded(1);
        self.append(
            partition,
            payload,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )?;
        rx.recv().map_err(|_| LogError::Shutdown)?
    }

    /// Creates a partition (durably) and returns its id.
    pub fn create_partition(&self, topic: &str, index: u32) -> Result<u32, LogError> {
        self.create_partitions(topic, &[index])?
            .pop()
            .unwrap_or(Err(LogError::Shutdown))
    }

    /// Creates the partitions `indexes` of `topic` (durably); each one's id, or why it was
    /// refused (it exists, the registry is full), in the same order. The requests go to the
    /// writer together, so they share batches and flushes: a topic of a thousand partitions
    /// costs a flush or two, not a thousand.
    pub fn create_partitions(
        &self,
        topic: &str,
        indexes: &[u32],
    ) -> Result<Vec<Result<u32, LogError>>, LogError> {
        let mut waits = Vec::with_capacity(indexes.len());
        for &index in indexes {
            let (tx, rx) = bounded(1);
            self.send(Request::CreatePartition {
                topic: topic.to_string(),
                index,
                ack: Box::new(move |r| {
                    let _ = tx.send(r);
                }),
            })?;
            waits.push(rx);
        }
        Ok(waits
            .into_iter()
            .map(|rx| match rx.recv() {
                Ok(r) => r.map(|a| a.partition),
                Err(_) => Err(LogError::Shutdown),
            })
            .collect())
    }

    /// Deletes partitions (durably): their registry entries go, appends to them are refused and
    /// readers no longer see them. The requests share batches and flushes. Returns the first
    /// error (an unknown id among them is one); the others are deleted regardless.
    pub fn delete_partitions(&self, ids: &[u32]) -> Result<(), LogError> {
        let mut waits = Vec::with_capacity(ids.len());
        for &partition in ids {
            let (tx, rx) = bounded(1);
            self.send(Request::DeletePartition {
                partition,
                ack: Box::new(move |r| {
                    let _ = tx.send(r);
                }),
            })?;
            waits.push(rx);
        }
        let mut first_err = None;
        for rx in waits {
            if let Err(e) = rx.recv().map_err(|_| LogError::Shutdown).and_then(|r| r) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Whether `count` more partitions named `topic` fit the registry's checkpoint budget now
    /// (the writer checks each create again; this lets a caller refuse a whole topic before
    /// creating any of it).
    pub fn registry_room(&self, topic: &str, count: u32) -> Result<(), LogError> {
        let st = self.stats();
        state::check_registry_room(
            &self.geo,
            st.registry_partitions as usize,
            st.registry_bytes,
            topic,
            count,
            st.checkpoint_budget,
        )
    }

    /// The id of a durable partition.
    pub fn partition_id(&self, topic: &str, index: u32) -> Option<u32> {
        let s = self.shared.lock();
        s.names.get(&(topic.to_string(), index)).copied()
    }

    /// A durable partition as readers see it (without its index).
    pub fn partition(&self, id: u32) -> Option<PartitionView> {
        self.shared
            .lock()
            .partitions
            .get(&id)
            .map(|v| PartitionView {
                entries: Default::default(),
                ..v.clone()
            })
    }

    /// Bytes of a durable partition's retained records at or past `from` (a batch holding `from`
    /// counts whole).
    pub fn partition_bytes(&self, id: u32, from: u64) -> Option<u64> {
        self.shared
            .lock()
            .partitions
            .get(&id)
            .map(|v| v.bytes_from(from))
    }

    /// Where a partition's records would start if its oldest batches went while at least `keep`
    /// bytes from `from` on remain (`PartitionView::start_keeping`); None when none may go.
    pub fn start_keeping(&self, id: u32, from: u64, keep: u64) -> Option<u64> {
        self.shared
            .lock()
            .partitions
            .get(&id)?
            .start_keeping(from, keep)
    }

    /// Every durable partition: (id, topic, index, start offset, durable end).
    pub fn partitions(&self) -> Vec<(u32, String, u32, u64, u64)> {
        let s = self.shared.lock();
        let mut v: Vec<_> = s
            .partitions
            .iter()
            .map(|(id, p)| (*id, p.topic.clone(), p.index, p.start_offset, p.durable_end))
            .collect();
        v.sort();
        v
    }

    /// Reads records of `partition` from `offset`, up to about `max_bytes` of payload (at least
    /// one record when one is there). Only durable records are served, each verified.
    pub fn read(
        &self,
        partition: u32,
        offset: u64,
        max_bytes: usize,
    ) -> Result<Vec<Record>, LogError> {
        reader::read(self, partition, offset, max_bytes)
    }

    /// Waits until `partition` has durable records at or past `offset`, up to `timeout`
    /// (long polling). Returns the durable end then.
    pub fn wait_for(&self, partition: u32, offset: u64, timeout: Duration) -> u64 {
        let s = self.shared.wait_until(timeout, |s| {
            s.partitions
                .get(&partition)
                .is_some_and(|p| p.durable_end > offset)
        });
        s.partitions.get(&partition).map_or(0, |p| p.durable_end)
    }

    fn read_raw(&self, position: u64, len: u64) -> Result<Vec<u8>, LogError> {
        let direct = self.direct.as_ref().filter(|_| self.queue.is_some());
        if let Some(r) = direct.and_then(|d| d.read(&self.shared, &self.geo, position, len)) {
            return r;
        }
        match &self.queue {
            Some(q) => read_raw_via(q, position, len),
            None => Err(LogError::Shutdown),
        }
    }

    pub fn stats(&self) -> WriterStats {
        self.shared.lock().stats
    }

    /// D: every byte of log below it is durable.
    pub fn durable(&self) -> u64 {
        self.shared.lock().durable
    }

    /// Why the writer stopped, if it did.
    pub fn fatal(&self) -> Option<String> {
        self.shared.lock().fatal.clone()
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// When this log acknowledges appends (only `Always` waits for the covering flush).
    pub fn flush_mode(&self) -> FlushMode {
        self.flush
    }

    /// Asks the writer to finish what it holds and stop, without waiting (a hosted writer's owner
    /// sees it on its next turn). Requests sent after it are refused once the writer stopped.
    pub fn close(&self) {
        self.shared.request_close();
        if let Some(b) = self.queue.as_ref().and_then(|q| q.bell.as_ref()) {
            b.ring();
        }
    }

    /// Stops taking requests, lets the writer finish what it holds, and waits for it.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        let Some(queue) = self.queue.take() else {
            return;
        };
        let bell = queue.bell.clone();
        drop(queue);
        if let Some(t) = self.thread.take() {
            // A thread asleep on its doorbell looks at its queue (closed now) when rung.
            if let Some(b) = &bell {
                b.ring();
            }
            let _ = t.join();
        } else if let Some(bell) = bell {
            // The owner sees the queue closed on its next turn, finishes, and marks the log
            // stopped; other handles of the queue (a reader thread) may keep it open a while.
            bell.ring();
            let s = self.shared.wait_until(HOSTED_STOP_WAIT, |s| s.stopped);
            if !s.stopped && s.fatal.is_none() {
                tracing::warn!("the hosted writer did not stop within {HOSTED_STOP_WAIT:?}");
            }
        }
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Raw log bytes through the writer's queue (the writer owns the device).
fn read_raw_via(queue: &Queue, position: u64, len: u64) -> Result<Vec<u8>, LogError> {
    let (reply_tx, reply_rx) = bounded(1);
    queue.send(Request::Read {
        position,
        len,
        reply: Box::new(move |r| {
            let _ = reply_tx.send(r);
        }),
    })?;
    reply_rx.recv().map_err(|_| LogError::Shutdown)?
}

/// Raw reads through the writer for a background thread, refused once the log shuts down.
fn cancellable_reads(
    queue: Queue,
    cancel: Arc<AtomicBool>,
) -> impl FnMut(u64, u64) -> Result<Vec<u8>, LogError> + Send {
    move |position, len| {
        if cancel.load(Ordering::Relaxed) {
            return Err(LogError::Shutdown);
        }
        read_raw_via(&queue, position, len)
    }
}

/// Rebuilds the index below the recovery point on a thread of its own, reading through the
/// writer like any reader, and hands the result to the writer.
fn spawn_backfill(job: Backfill, queue: Queue, cancel: Arc<AtomicBool>) {
    let started = Instant::now();
    let failed = queue.clone();
    let done = queue.clone();
    let mut read = cancellable_reads(queue, cancel);
    let run = move || {
        let result = job.run(&mut read);
        tracing::info!(
            from = job.from,
            to = job.to,
            ms = started.elapsed().as_millis() as u64,
            ok = result.is_ok(),
            "index below the recovery point rebuilt"
        );
        let _ = done.send(Request::Backfilled(result));
    };
    if let Err(e) = std::thread::Builder::new()
        .name("nvmq-backfill".into())
        .spawn(run)
    {
        tracing::error!(error = %e, "could not start the index rebuild thread");
        let _ = failed.send(Request::Backfilled(Err(format!(
            "could not start the index rebuild: {e}"
        ))));
    }
}
