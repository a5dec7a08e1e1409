//! The group-commit writer (storage.md §2): one per device, owning the tail.
//!
//! It is a state machine stepped by its owner: a thread in production ([`crate::Log`]), the test's
//! own loop in the deterministic simulator. Each step moves completions in, decides what to flush,
//! what superblock or checkpoint to write, and builds the next batch from the appends waiting,
//! up to the free in-flight window. There is no timer and no batch-size knob: a batch holds what
//! arrived while the device was busy, so it grows with load by itself.
//!
//! The rules it keeps, in the order they bite:
//! - D (`durable`) moves over a write only when a flush submitted after that write completed has
//!   completed, and every earlier flush completed without error (flushes are settled in
//!   submission order, whatever order their completions come in); on a device without a volatile
//!   write cache, when the write and every write below it completed.
//! - Acks go out in log order, only below D (in the default mode).
//! - Any failed write or flush is fatal: every waiting append gets an error, nothing more is
//!   acknowledged, and the flush is never retried.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockdev::{BlockDevice, Completion, IoBuffer};

use crate::backfill::{Backfill, Backfilled};
use crate::batch::BatchBuilder;
use crate::config::{FlushMode, LogConfig, OnFull};
use crate::format::{
    record_size, superblock_offset, BatchKind, RecordKind, Superblock, BATCH_HEADER_LEN,
};
use crate::layout::Geometry;
use crate::shared::{IndexEntry, PartitionView, Shared};
use crate::state::{encode_create, Registry, MAX_TOPIC_LEN};
use crate::LogError;

/// Called once with the outcome of an append.
pub type AckFn = Box<dyn FnOnce(Result<Appended, LogError>) + Send>;
/// Called once with the bytes of a log range, or why they could not be read.
pub type ReadFn = Box<dyn FnOnce(Result<Vec<u8>, LogError>) + Send>;

/// Where an acknowledged record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub partition: u32,
    pub offset: u64,
    pub position: u64,
}

/// What producers and readers hand the writer.
pub enum Request {
    Append {
        partition: u32,
        payload: Vec<u8>,
        /// Offsets the record takes (at least 1): a Kafka record batch of n messages takes n.
        span: u32,
        ack: AckFn,
    },
    CreatePartition {
        topic: String,
        index: u32,
        ack: AckFn,
    },
    /// The background index rebuild below the recovery point finished (see `backfill`).
    Backfilled(Result<Backfilled, String>),
    /// Raw log bytes [position, position + len), for readers (the writer owns the device).
    Read {
        position: u64,
        len: u64,
        reply: ReadFn,
    },
}

/// The monotonic and wall clocks the owner passes into each step.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    pub mono_ns: u64,
    pub wall_ms: u64,
}

/// A retained durable batch, for retention decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetainedBatch {
    pub position: u64,
    pub end: u64,
    pub timestamp_ms: u64,
}

/// Everything the writer needs to resume a log: produced by recovery (or by format).
#[derive(Debug, Clone)]
pub struct Resume {
    /// The two superblock copies as durably written (an invalid slot holds the other's contents
    /// with its own copy index, so that it is simply the next one rewritten).
    pub superblocks: [Superblock; 2],
    /// Which copy is the newest.
    pub newest: u8,
    /// Where the next batch goes; everything below is durable.
    pub tail: u64,
    /// Header checksum of the batch that ends at `tail` (the next batch's link).
    pub last_hash: u32,
    pub registry: Registry,
    /// Index entries of every retained durable batch, per partition, in offset order.
    pub index: HashMap<u32, VecDeque<IndexEntry>>,
    /// Retained durable batches from the head up to the tail (from the recovery point up when
    /// `backfill` is set).
    pub retained: VecDeque<RetainedBatch>,
    /// The part of the log below the recovery point still to be indexed, in the background.
    pub backfill: Option<Backfill>,
}

const TAG_WRITE: u64 = 1 << 56;
const TAG_FLUSH: u64 = 2 << 56;
const TAG_SUPERBLOCK: u64 = 3 << 56;
const TAG_READ: u64 = 4 << 56;
const TAG_KIND: u64 = 0xff << 56;

enum Item {
    Data {
        partition: u32,
        payload: Vec<u8>,
        span: u32,
    },
    Create {
        topic: String,
        index: u32,
    },
}

struct Pending {
    item: Item,
    ack: AckFn,
    /// When the writer took it: ack latency is measured from here.
    since: Instant,
}

/// An acknowledgement waiting for its batch to become durable.
type AckEntry = (AckFn, Appended, Instant);

/// A batch between its submission and its durability.
struct InFlight {
    position: u64,
    end: u64,
    ios_left: u32,
    written: bool,
    acked: bool,
    kind: BatchKind,
    /// Link of this batch (the previous batch's header checksum): the recovery link when it is a
    /// checkpoint.
    link: u32,
    timestamp_ms: u64,
    acks: Vec<AckEntry>,
    /// Payload bytes of the data records in it (for write amplification).
    payload_bytes: u64,
    /// (partition, entry) for the index, published when durable.
    index: Vec<(u32, IndexEntry)>,
    /// Partitions this batch creates, published when durable.
    created: Vec<(u32, String, u32)>,
}

struct FlushSlot {
    tag: u64,
    /// When it was submitted, for the flush latency figure.
    submitted_ns: u64,
    covers: u64,
    covers_superblock: bool,
    result: Option<Result<(), blockdev::DeviceError>>,
}

#[derive(PartialEq, Eq)]
enum SbState {
    Submitted,
    /// Write completed; durable after the next flush submitted from now on completes.
    Written,
    /// A flush covering it is in flight.
    Flushing,
}

struct SbWrite {
    sb: Superblock,
    state: SbState,
}

struct ReadJob {
    parts: [Option<Vec<u8>>; 2],
    left: u32,
    reply: Option<ReadFn>,
    failed: Option<LogError>,
}

/// The group-commit writer's state machine. See the module docs.
pub struct Writer<D: BlockDevice> {
    dev: D,
    geo: Geometry,
    cfg: LogConfig,
    /// Bytes between recovery points (the configured lag, bounded by what the ring allows).
    lag: u64,
    volatile_cache: bool,
    epoch: u64,
    tail: u64,
    last_hash: u32,
    written_through: u64,
    durable: u64,
    flush_requested: u64,
    last_flush_ns: u64,
    /// The owner is shutting down: flush whatever the relaxed modes left in the cache, so that a
    /// clean stop loses nothing.
    closing: bool,
    /// The background index rebuild, until its owner takes it to run.
    backfill: Option<Backfill>,
    /// Until the rebuild is installed, retention frees nothing: the batches below the recovery
    /// point are not known yet.
    backfill_pending: bool,
    batches: VecDeque<InFlight>,
    writes_in_flight: usize,
    write_tags: HashMap<u64, u64>,
    flushes: VecDeque<FlushSlot>,
    next_tag: u64,
    free_bufs: Vec<IoBuffer>,
    pending: VecDeque<Pending>,
    registry: Registry,
    retained: VecDeque<RetainedBatch>,
    superblocks: [Superblock; 2],
    newest: u8,
    sb_write: Option<SbWrite>,
    sb_last_ns: u64,
    /// Newest durable checkpoint: (position, link), not yet named by a superblock.
    durable_checkpoint: Option<(u64, u32)>,
    checkpoint_in_flight: bool,
    force_checkpoint: bool,
    /// Since when appends have waited for space (on_full = refuse).
    full_since_ns: Option<u64>,
    /// The head the ring needs for the next batch to fit (0 when nothing waits for space).
    space_needed_head: u64,
    reads: HashMap<u64, ReadJob>,
    completions: Vec<Completion>,
    last_activity_ns: u64,
    fatal: Option<LogError>,
    shared: Arc<Shared>,
}

/// Buffers the writer allocates at start and recycles; bounds memory to this many max batches.
fn buffer_count(cfg: &LogConfig) -> usize {
    2 * cfg.max_writes_in_flight + 2
}

impl<D: BlockDevice> Writer<D> {
    /// Resumes writing after `resume`. The superblocks in it must already carry the epoch the new
    /// batches get (recovery persisted it).
    pub fn new(mut dev: D, cfg: LogConfig, resume: Resume) -> Result<Writer<D>, LogError> {
        let newest_sb = resume.superblocks[usize::from(resume.newest)];
        let geo = Geometry::from_superblock(&newest_sb, dev.info().logical_block_size);
        if cfg.max_flushes_in_flight == 0
            || cfg.max_writes_in_flight == 0
            || cfg.queue_capacity == 0
        {
            return Err(LogError::Config(
                "flushes in flight, writes in flight and queue capacity must be at least 1".into(),
            ));
        }
        if geo.max_batch > u64::from(dev.info().max_transfer) * 2 {
            return Err(LogError::Config(format!(
                "maximum batch {} is larger than the device's maximum transfer {}",
                geo.max_batch,
                dev.info().max_transfer
            )));
        }
        let mut free_bufs = Vec::new();
        for _ in 0..buffer_count(&cfg) {
            free_bufs.push(
                dev.alloc_buffer(geo.max_batch as usize)
                    .map_err(LogError::device("allocate batch buffers"))?,
            );
        }
        let ring_room = geo.log_size.saturating_sub(geo.window + 3 * geo.max_batch) / 2;
        let lag = cfg.recovery_lag.min(ring_room).max(geo.max_batch);
        let volatile_cache = dev.info().volatile_write_cache;
        if let Some(loss) = cfg.flush.loss_window(geo.window) {
            tracing::warn!(
                loss_window_bytes = geo.window,
                "{loss}{}",
                if volatile_cache {
                    ""
                } else {
                    " (this device reports no volatile write cache: completed writes are durable, so nothing is lost)"
                }
            );
        }
        let shared = Arc::new(Shared::default());
        let mut w = Writer {
            dev,
            geo,
            cfg,
            lag,
            volatile_cache,
            epoch: newest_sb.epoch,
            tail: resume.tail,
            last_hash: resume.last_hash,
            written_through: resume.tail,
            durable: resume.tail,
            flush_requested: resume.tail,
            last_flush_ns: 0,
            closing: false,
            backfill: resume.backfill,
            backfill_pending: resume.backfill.is_some(),
            batches: VecDeque::new(),
            writes_in_flight: 0,
            write_tags: HashMap::new(),
            flushes: VecDeque::new(),
            next_tag: 0,
            free_bufs,
            pending: VecDeque::new(),
            registry: resume.registry,
            retained: resume.retained,
            superblocks: resume.superblocks,
            newest: resume.newest,
            sb_write: None,
            sb_last_ns: 0,
            durable_checkpoint: None,
            checkpoint_in_flight: false,
            force_checkpoint: false,
            full_since_ns: None,
            space_needed_head: 0,
            reads: HashMap::new(),
            completions: Vec::with_capacity(256),
            last_activity_ns: 0,
            fatal: None,
            shared,
        };
        w.publish_initial(resume.index);
        Ok(w)
    }

    fn publish_initial(&mut self, mut index: HashMap<u32, VecDeque<IndexEntry>>) {
        let mut s = self.shared.lock();
        s.durable = self.durable;
        s.head = self.head();
        s.epoch = self.epoch;
        s.backfill_pending = self.backfill_pending;
        for p in self.registry.iter() {
            s.partitions.insert(
                p.id,
                PartitionView {
                    topic: p.topic.clone(),
                    index: p.index,
                    start_offset: p.start_offset,
                    durable_end: p.next_offset,
                    entries: index.remove(&p.id).unwrap_or_default(),
                },
            );
        }
    }

    pub fn config(&self) -> &LogConfig {
        &self.cfg
    }

    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// Gives the device back (for a clean shutdown or a test's power cut).
    pub fn into_device(self) -> D {
        self.dev
    }

    /// The most payload one record may carry.
    pub fn max_payload(&self) -> usize {
        max_payload(&self.geo)
    }

    pub fn fatal(&self) -> Option<&LogError> {
        self.fatal.as_ref()
    }

    /// The background index rebuild to run (once): `Log::start` runs it on a thread of its own; a
    /// caller stepping the writer runs it with reads through the stepped writer. Its result comes
    /// back as `Request::Backfilled`.
    pub fn take_backfill(&mut self) -> Option<Backfill> {
        self.backfill.take()
    }

    /// Runs the background index rebuild right here, for owners that step the writer themselves
    /// (simulations, tools): `read` fetches raw log bytes by stepping this writer.
    pub fn backfill_with(
        &mut self,
        mut read: impl FnMut(&mut Self, u64, u64) -> Result<Vec<u8>, LogError>,
    ) {
        let Some(job) = self.take_backfill() else {
            return;
        };
        let result = job.run(&mut |position, len| read(self, position, len));
        self.install_backfill(result);
    }

    /// Installs the index below the recovery point in front of what the writer has indexed since.
    fn install_backfill(&mut self, result: Result<Backfilled, String>) {
        if !self.backfill_pending {
            return;
        }
        self.backfill_pending = false;
        let mut s = self.shared.lock();
        s.backfill_pending = false;
        match result {
            Ok(mut b) => {
                s.backfill_bytes = b.bytes_read;
                while let Some(r) = b.retained.pop_back() {
                    self.retained.push_front(r);
                }
                for (id, v) in s.partitions.iter_mut() {
                    if let Some(mut older) = b.index.remove(id) {
                        older.extend(v.entries.drain(..));
                        v.entries = older;
                    }
                    let start = v.entries.front().map_or(v.durable_end, |e| e.first_offset);
                    v.start_offset = start;
                    if let Some(p) = self.registry.get_mut(*id) {
                        p.start_offset = start;
                    }
                }
            }
            Err(what) => {
                tracing::error!(%what, "damage below the recovery point: older records of the log cannot be served");
                s.backfill_error = Some(what);
            }
        }
        drop(s);
        self.shared.notify();
    }

    /// Shutting down: from now on every write is flushed at once, whatever the flush mode.
    pub fn close(&mut self) {
        self.closing = true;
    }

    /// The writer has nothing queued and nothing on the device.
    pub fn is_idle(&self) -> bool {
        self.pending.is_empty()
            && self.batches.is_empty()
            && self.flushes.is_empty()
            && self.sb_write.is_none()
            && self.reads.is_empty()
    }

    fn head(&self) -> u64 {
        self.superblocks[usize::from(self.newest)].head
    }

    fn newest_sb(&self) -> &Superblock {
        &self.superblocks[usize::from(self.newest)]
    }

    /// Takes one request from a producer or reader.
    pub fn submit(&mut self, req: Request) {
        if let Some(e) = &self.fatal {
            let e = LogError::WriterStopped(e.to_string());
            match req {
                Request::Append { ack, .. } | Request::CreatePartition { ack, .. } => ack(Err(e)),
                Request::Read { reply, .. } => reply(Err(e)),
                Request::Backfilled(_) => {}
            }
            return;
        }
        match req {
            Request::Append {
                partition,
                payload,
                span,
                ack,
            } => {
                if span == 0 {
                    ack(Err(LogError::Config(
                        "an append must take at least one offset".into(),
                    )));
                    return;
                }
                if payload.len() > self.max_payload() {
                    ack(Err(LogError::RecordTooLarge {
                        len: payload.len(),
                        max: self.max_payload(),
                    }));
                    return;
                }
                self.pending.push_back(Pending {
                    item: Item::Data {
                        partition,
                        payload,
                        span,
                    },
                    ack,
                    since: Instant::now(),
                });
            }
            Request::CreatePartition { topic, index, ack } => {
                if topic.is_empty() || topic.len() > MAX_TOPIC_LEN {
                    ack(Err(LogError::Config(format!(
                        "topic name must be 1 to {MAX_TOPIC_LEN} bytes, got {}",
                        topic.len()
                    ))));
                    return;
                }
                self.pending.push_back(Pending {
                    item: Item::Create { topic, index },
                    ack,
                    since: Instant::now(),
                });
            }
            Request::Read {
                position,
                len,
                reply,
            } => self.start_read(position, len, reply),
            Request::Backfilled(result) => self.install_backfill(result),
        }
    }

    /// Queued appends not yet in a batch.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// One round of work. Returns whether anything moved.
    pub fn step(&mut self, now: Now) -> bool {
        if self.fatal.is_some() {
            return false;
        }
        let mut comps = std::mem::take(&mut self.completions);
        if let Err(e) = self.dev.poll(&mut comps) {
            self.fail(LogError::Device {
                op: "poll",
                source: e,
            });
        }
        let mut moved = !comps.is_empty();
        for c in comps.drain(..) {
            self.note_flush_latency(&c, now);
            self.complete(c);
        }
        self.completions = comps;
        if self.fatal.is_some() {
            return true;
        }
        self.settle();
        moved |= self.maybe_superblock(now);
        let waited_for_space = self.space_needed_head;
        moved |= self.maybe_write(now);
        if self.space_needed_head != waited_for_space {
            // The ring just ran out of room: free space (or checkpoint) in this same step.
            moved |= self.maybe_superblock(now);
            moved |= self.maybe_write(now);
        }
        moved |= self.maybe_flush(now);
        self.check_full(now);
        if moved {
            self.last_activity_ns = now.mono_ns;
        }
        moved
    }

    /// Waits up to `timeout` for a device completion (call when a step moved nothing and I/O is
    /// in flight). The completions are handled by the next step.
    pub fn wait_device(&mut self, timeout: Duration) {
        if self.fatal.is_some() || self.dev.in_flight() == 0 {
            return;
        }
        if let Err(e) = self.dev.wait(&mut self.completions, timeout) {
            self.fail(LogError::Device {
                op: "wait",
                source: e,
            });
        }
    }

    pub fn has_io_in_flight(&self) -> bool {
        self.dev.in_flight() > 0
    }

    /// Fails everything waiting and refuses all that follows: the writer is done.
    pub fn fail(&mut self, err: LogError) {
        if self.fatal.is_some() {
            return;
        }
        tracing::error!(error = %err, "writer stopped: nothing more will be acknowledged; check the device before restarting");
        // Recorded before anyone hears of it: a producer whose append just failed sees the
        // reason in `Log::fatal` at once.
        self.shared.lock().fatal = Some(err.to_string());
        self.shared.notify();
        let stopped = LogError::WriterStopped(err.to_string());
        for b in self.batches.drain(..) {
            for (ack, _, _) in b.acks {
                ack(Err(stopped.clone()));
            }
        }
        for p in self.pending.drain(..) {
            (p.ack)(Err(stopped.clone()));
        }
        for (_, mut r) in self.reads.drain() {
            if let Some(reply) = r.reply.take() {
                reply(Err(stopped.clone()));
            }
        }
        self.fatal = Some(err);
    }

    fn complete(&mut self, c: Completion) {
        match c.tag & TAG_KIND {
            TAG_WRITE => {
                if let Some(b) = c.buffer {
                    self.free_bufs.push(b);
                }
                let Some(pos) = self.write_tags.remove(&c.tag) else {
                    return;
                };
                if let Err(e) = c.result {
                    self.fail(LogError::Device {
                        op: "write a batch",
                        source: e,
                    });
                    return;
                }
                if let Some(b) = self.batches.iter_mut().find(|b| b.position == pos) {
                    b.ios_left -= 1;
                    if b.ios_left == 0 {
                        b.written = true;
                        self.writes_in_flight -= 1;
                    }
                }
            }
            TAG_FLUSH => {
                if let Some(f) = self.flushes.iter_mut().find(|f| f.tag == c.tag) {
                    f.result = Some(c.result);
                }
            }
            TAG_SUPERBLOCK => {
                if let Some(b) = c.buffer {
                    self.free_bufs.push(b);
                }
                if let Err(e) = c.result {
                    self.fail(LogError::Device {
                        op: "write a superblock",
                        source: e,
                    });
                    return;
                }
                if let Some(w) = &mut self.sb_write {
                    w.state = SbState::Written;
                }
                if !self.volatile_cache {
                    self.superblock_durable();
                }
            }
            TAG_READ => self.read_done(c),
            _ => {}
        }
    }

    /// Moves written-through, D and the acks forward after completions.
    fn settle(&mut self) {
        // The contiguous prefix of completed writes.
        for b in &self.batches {
            if b.written && b.position == self.written_through {
                self.written_through = b.end;
            } else if !b.written {
                break;
            }
        }
        if !self.volatile_cache {
            self.durable = self.written_through;
        }
        // Flushes settle in submission order: a success behind a pending or failed flush waits.
        while let Some(f) = self.flushes.front() {
            match &f.result {
                None => break,
                Some(Err(e)) => {
                    let e = LogError::Device {
                        op: "flush",
                        source: e.clone(),
                    };
                    self.fail(e);
                    return;
                }
                Some(Ok(())) => {
                    let covers = f.covers;
                    let sb = f.covers_superblock;
                    self.flushes.pop_front();
                    self.durable = self.durable.max(covers);
                    if sb {
                        self.superblock_durable();
                    }
                }
            }
        }
        // Relaxed modes acknowledge at write completion, still in log order.
        if self.cfg.flush != FlushMode::Always {
            for b in self.batches.iter_mut() {
                if b.end > self.written_through {
                    break;
                }
                if !b.acked {
                    b.acked = true;
                    ack_all(&self.shared, &mut b.acks, b.payload_bytes);
                }
            }
        }
        self.publish_durable();
    }

    /// Publishes every batch below D to readers and acknowledges it (default mode).
    fn publish_durable(&mut self) {
        let mut done: Vec<InFlight> = Vec::new();
        while self
            .batches
            .front()
            .is_some_and(|b| b.end <= self.durable && b.written)
        {
            if let Some(b) = self.batches.pop_front() {
                done.push(b);
            }
        }
        if done.is_empty() {
            return;
        }
        {
            let mut s = self.shared.lock();
            s.durable = self.durable;
            let acks: usize = done.iter().filter(|b| !b.acked).map(|b| b.acks.len()).sum();
            if acks > 0 {
                s.stats.records_per_flush.record(acks as u64);
            }
            for b in &mut done {
                for (id, topic, index) in b.created.drain(..) {
                    s.partitions.insert(
                        id,
                        PartitionView {
                            topic,
                            index,
                            ..PartitionView::default()
                        },
                    );
                }
                for (pid, e) in b.index.drain(..) {
                    if let Some(v) = s.partitions.get_mut(&pid) {
                        v.durable_end = e.end_offset;
                        v.entries.push_back(e);
                    }
                }
            }
        }
        self.shared.notify();
        for mut b in done {
            self.retained.push_back(RetainedBatch {
                position: b.position,
                end: b.end,
                timestamp_ms: b.timestamp_ms,
            });
            if b.kind == BatchKind::Checkpoint {
                self.checkpoint_in_flight = false;
                self.durable_checkpoint = Some((b.position, b.link));
            }
            if !b.acked {
                b.acked = true;
                ack_all(&self.shared, &mut b.acks, b.payload_bytes);
            }
        }
    }

    fn maybe_flush(&mut self, now: Now) -> bool {
        if !self.volatile_cache {
            return false;
        }
        let sb_waiting = self
            .sb_write
            .as_ref()
            .is_some_and(|w| w.state == SbState::Written);
        let data_waiting = self.written_through > self.flush_requested;
        if !(sb_waiting || data_waiting) || self.flushes.len() >= self.cfg.max_flushes_in_flight {
            return false;
        }
        let urgent = sb_waiting
            || self.closing
            || self.window_full()
            || self
                .batches
                .iter()
                .any(|b| b.kind == BatchKind::Checkpoint && b.written);
        let due = match self.cfg.flush {
            FlushMode::Always => true,
            FlushMode::Interval(i) => {
                now.mono_ns.saturating_sub(self.last_flush_ns) >= i.as_nanos() as u64
            }
            FlushMode::Never => false,
        };
        if !(due || urgent) {
            return false;
        }
        let tag = TAG_FLUSH | self.bump_tag();
        if let Err(e) = self.dev.submit_flush(tag) {
            self.fail(LogError::Device {
                op: "submit a flush",
                source: e,
            });
            return true;
        }
        if let Some(w) = &mut self.sb_write {
            if w.state == SbState::Written {
                w.state = SbState::Flushing;
            }
        }
        self.flushes.push_back(FlushSlot {
            tag,
            submitted_ns: now.mono_ns,
            covers: self.written_through,
            covers_superblock: sb_waiting,
            result: None,
        });
        self.flush_requested = self.written_through;
        self.last_flush_ns = now.mono_ns;
        self.shared.lock().stats.flushes += 1;
        true
    }

    /// Counts a flush completion in the latency figure (metrics only; decides nothing).
    fn note_flush_latency(&self, c: &Completion, now: Now) {
        if c.tag & TAG_KIND != TAG_FLUSH {
            return;
        }
        if let Some(f) = self.flushes.iter().find(|f| f.tag == c.tag) {
            let took = now.mono_ns.saturating_sub(f.submitted_ns);
            self.shared
                .lock()
                .stats
                .flush_latency_us
                .record(took / 1000);
        }
    }

    fn window_full(&self) -> bool {
        self.tail - self.durable + self.geo.write_unit > self.geo.window
    }

    fn bump_tag(&mut self) -> u64 {
        self.next_tag = (self.next_tag + 1) & !TAG_KIND;
        self.next_tag
    }

    /// The lowest position the ring may not overwrite: the head named in both copies.
    fn ring_floor(&self) -> u64 {
        self.superblocks[0].head.min(self.superblocks[1].head)
    }

    /// Builds and submits batches while appends wait and the window, the ring and the buffers
    /// allow.
    fn maybe_write(&mut self, now: Now) -> bool {
        let mut moved = false;
        loop {
            if self.writes_in_flight >= self.cfg.max_writes_in_flight || self.free_bufs.len() < 2 {
                return moved;
            }
            let want_checkpoint = !self.checkpoint_in_flight
                && self.durable_checkpoint.is_none()
                && (self.force_checkpoint
                    || self.tail - self.newest_sb().recovery_point >= self.lag);
            if self.pending.is_empty() && !want_checkpoint {
                self.space_needed_head = 0;
                return moved;
            }
            let in_flight = self.tail - self.durable;
            let window_room = self.geo.window.saturating_sub(in_flight);
            // Normal batches leave room for one checkpoint, so the ring can always move on.
            let reserve = if want_checkpoint {
                0
            } else {
                self.geo.max_batch
            };
            let ring_room =
                (self.ring_floor() + self.geo.log_size).saturating_sub(self.tail + reserve);
            let room = window_room.min(ring_room).min(self.geo.max_batch);
            let room = room - room % self.geo.write_unit;
            let first_need = if want_checkpoint {
                self.geo
                    .round_up((BATCH_HEADER_LEN + record_size(self.checkpoint_len())) as u64)
            } else {
                self.geo.round_up(
                    (BATCH_HEADER_LEN + record_size(self.pending.front().map_or(0, pending_len)))
                        as u64,
                )
            };
            if room < first_need {
                if ring_room < first_need.min(self.geo.max_batch) && window_room >= first_need {
                    self.space_needed_head =
                        (self.tail + first_need + reserve).saturating_sub(self.geo.log_size);
                } else {
                    self.space_needed_head = 0;
                }
                return moved;
            }
            self.space_needed_head = 0;
            self.full_since_ns = None;
            if want_checkpoint {
                self.write_checkpoint(now);
            } else {
                self.write_records(room as usize, now);
            }
            moved = true;
            if self.fatal.is_some() {
                return true;
            }
        }
    }

    fn checkpoint_len(&self) -> usize {
        // Upper bound of the encoded registry; exact length is computed when it is written.
        8 + self
            .registry
            .iter()
            .map(|p| 26 + p.topic.len())
            .sum::<usize>()
    }

    fn write_checkpoint(&mut self, now: Now) {
        let state = self.registry.encode();
        if BATCH_HEADER_LEN + record_size(state.len()) > self.geo.max_batch as usize {
            self.fail(LogError::Config(format!(
                "the checkpoint ({} bytes for {} partitions) no longer fits one batch of {} bytes",
                state.len(),
                self.registry.len(),
                self.geo.max_batch
            )));
            return;
        }
        let Some(mut buf) = self.free_bufs.pop() else {
            return;
        };
        buf.set_len(buf.capacity());
        let mut b = BatchBuilder::new(&mut buf, self.geo.format_id, self.epoch, self.tail);
        b.push(RecordKind::Checkpoint, 0, 0, &state);
        self.force_checkpoint = false;
        self.checkpoint_in_flight = true;
        let sealed = b_finish(b);
        self.seal_and_submit(
            buf,
            sealed,
            BatchKind::Checkpoint,
            (Vec::new(), 0),
            Vec::new(),
            Vec::new(),
            now,
        );
        self.shared.lock().stats.checkpoints += 1;
    }

    fn write_records(&mut self, room: usize, now: Now) {
        let Some(mut buf) = self.free_bufs.pop() else {
            return;
        };
        buf.set_len(buf.capacity());
        let mut acks = Vec::new();
        let mut payload_bytes = 0u64;
        let mut index: Vec<(u32, IndexEntry)> = Vec::new();
        let mut created = Vec::new();
        let mut b = BatchBuilder::new(&mut buf, self.geo.format_id, self.epoch, self.tail);
        let u = self.geo.write_unit as usize;
        while let Some(p) = self.pending.front() {
            let need = b.would_use(pending_len(p));
            if need.div_ceil(u) * u > room {
                break;
            }
            let Some(p) = self.pending.pop_front() else {
                break;
            };
            match p.item {
                Item::Data {
                    partition,
                    payload,
                    span,
                } => {
                    let Some(st) = self.registry.get_mut(partition) else {
                        (p.ack)(Err(LogError::UnknownPartition(partition)));
                        continue;
                    };
                    let offset = st.next_offset;
                    let end = offset + u64::from(span);
                    st.next_offset = end;
                    let position = b.push_span(RecordKind::Data, partition, offset, span, &payload);
                    payload_bytes += payload.len() as u64;
                    match index.iter_mut().rev().find(|(id, _)| *id == partition) {
                        Some((_, e)) => e.end_offset = end,
                        None => index.push((
                            partition,
                            IndexEntry {
                                first_offset: offset,
                                end_offset: end,
                                batch_position: self.tail,
                                batch_length: 0,
                            },
                        )),
                    }
                    acks.push((
                        p.ack,
                        Appended {
                            partition,
                            offset,
                            position,
                        },
                        p.since,
                    ));
                }
                Item::Create { topic, index: idx } => {
                    if self.registry.lookup(&topic, idx).is_some() {
                        (p.ack)(Err(LogError::PartitionExists { topic, index: idx }));
                        continue;
                    }
                    let id = self.registry.next_id();
                    let payload = encode_create(&topic, idx);
                    let position = b.push(RecordKind::CreatePartition, id, 0, &payload);
                    self.registry.insert(id, topic.clone(), idx);
                    created.push((id, topic, idx));
                    acks.push((
                        p.ack,
                        Appended {
                            partition: id,
                            offset: 0,
                            position,
                        },
                        p.since,
                    ));
                }
            }
        }
        let sealed = b_finish(b);
        if sealed.1 == 0 {
            self.free_bufs.push(buf);
            return;
        }
        self.seal_and_submit(
            buf,
            sealed,
            BatchKind::Records,
            (acks, payload_bytes),
            index,
            created,
            now,
        );
    }

    /// Pads and seals the batch in `buf`, then submits it (split at the ring's end).
    #[allow(clippy::too_many_arguments)]
    fn seal_and_submit(
        &mut self,
        mut buf: IoBuffer,
        (used, record_count): (usize, u32),
        kind: BatchKind,
        (acks, payload_bytes): (Vec<AckEntry>, u64),
        mut index: Vec<(u32, IndexEntry)>,
        created: Vec<(u32, String, u32)>,
        now: Now,
    ) {
        let u = self.geo.write_unit as usize;
        let len = used.div_ceil(u) * u;
        // Re-seal with the real header now that kind, D and the link are known.
        let header = crate::format::BatchHeader {
            format_id: self.geo.format_id,
            epoch: self.epoch,
            position: self.tail,
            length: len as u32,
            record_count,
            durable_through: self.durable,
            prev_hash: self.last_hash,
            kind,
            timestamp_ms: now.wall_ms,
        };
        buf[used..len].fill(0);
        let crc = header.encode(&mut buf[..BATCH_HEADER_LEN]);
        let position = self.tail;
        let link = self.last_hash;
        for (_, e) in &mut index {
            e.batch_length = len as u32;
        }
        let segs = self.geo.segments(position, len as u64);
        let mut ios = vec![];
        if segs[1].1 > 0 {
            // The batch crosses the ring's end: its second part goes out of its own buffer.
            let Some(mut second) = self.free_bufs.pop() else {
                self.fail(LogError::Config("no buffer for a wrapped batch".into()));
                return;
            };
            let first = segs[0].1 as usize;
            second.set_len(len - first);
            second.copy_from_slice(&buf[first..len]);
            buf.set_len(first);
            ios.push((segs[0].0, buf));
            ios.push((segs[1].0, second));
        } else {
            buf.set_len(len);
            ios.push((segs[0].0, buf));
        }
        let n = ios.len() as u32;
        for (byte_offset, b) in ios {
            let tag = TAG_WRITE | self.bump_tag();
            let lba = byte_offset / self.geo.logical_block;
            if let Err(e) = self.dev.submit_write(tag, lba, b) {
                self.fail(LogError::Device {
                    op: "submit a batch write",
                    source: e,
                });
                return;
            }
            self.write_tags.insert(tag, position);
        }
        self.writes_in_flight += 1;
        self.tail = position + len as u64;
        self.last_hash = crc;
        {
            let mut s = self.shared.lock();
            s.stats.batches_written += 1;
            s.stats.device_bytes_written += len as u64;
        }
        self.batches.push_back(InFlight {
            position,
            end: self.tail,
            ios_left: n,
            written: false,
            acked: false,
            kind,
            link,
            timestamp_ms: now.wall_ms,
            acks,
            payload_bytes,
            index,
            created,
        });
    }

    /// Decides whether a superblock update is due and submits it.
    fn maybe_superblock(&mut self, now: Now) -> bool {
        if self.sb_write.is_some() {
            return false;
        }
        let cur = *self.newest_sb();
        let (rp, link) = match self.durable_checkpoint {
            Some((pos, link)) => (pos, link),
            None => (cur.recovery_point, cur.recovery_link),
        };
        let head = self.wanted_head(rp, now);
        let other = &self.superblocks[usize::from(1 - self.newest)];
        let reasons = [
            rp != cur.recovery_point,
            head > cur.head,
            // The older copy still pins space the writer is waiting for.
            self.space_needed_head > 0 && other.head < cur.head,
            // An idle writer records its D within about a second, and at once when it is
            // shutting down, so that a clean stop leaves D in the superblock.
            self.pending.is_empty()
                && self.batches.is_empty()
                && self.durable > cur.durable_through
                && (self.closing
                    || now
                        .mono_ns
                        .saturating_sub(self.last_activity_ns.max(self.sb_last_ns))
                        >= self.cfg.idle_superblock.as_nanos() as u64),
        ];
        if !reasons.iter().any(|&r| r) {
            // Space is needed but the recovery point pins the head: checkpoint now.
            if self.space_needed_head > rp && !self.checkpoint_in_flight {
                self.force_checkpoint = true;
            }
            return false;
        }
        let copy = 1 - self.newest;
        let sb = Superblock {
            copy,
            sequence: cur.sequence + 1,
            parent: cur.checksum(),
            head,
            recovery_point: rp,
            recovery_link: link,
            checkpoint: rp,
            durable_through: self.durable,
            ..cur
        };
        let Some(mut buf) = self.free_bufs.pop() else {
            return false;
        };
        let u = self.geo.write_unit as usize;
        buf.set_len(u);
        buf.fill(0);
        buf[..crate::format::SUPERBLOCK_LEN].copy_from_slice(&sb.encode());
        let tag = TAG_SUPERBLOCK | self.bump_tag();
        if let Err(e) =
            self.dev
                .submit_write(tag, superblock_offset(copy) / self.geo.logical_block, buf)
        {
            self.fail(LogError::Device {
                op: "submit a superblock write",
                source: e,
            });
            return true;
        }
        if self.durable_checkpoint.is_some_and(|(p, _)| p == rp) {
            self.durable_checkpoint = None;
        }
        self.sb_write = Some(SbWrite {
            sb,
            state: SbState::Submitted,
        });
        self.sb_last_ns = now.mono_ns;
        self.shared.lock().stats.superblock_writes += 1;
        true
    }

    /// Where retention (and, in drop-oldest mode, the need for space) wants the head, never past
    /// the recovery point the next superblock names.
    fn wanted_head(&self, rp: u64, now: Now) -> u64 {
        let mut head = self.newest_sb().head;
        if self.backfill_pending {
            return head;
        }
        // Free an eighth of the ring at a time: freeing only what the next batch needs would
        // cost two superblock updates (and their flushes) per batch once the ring is full.
        let need = if self.cfg.on_full == OnFull::DropOldest && self.space_needed_head > 0 {
            self.space_needed_head + self.geo.log_size / 8
        } else {
            0
        };
        for b in &self.retained {
            if b.end > rp {
                break;
            }
            let by_size = self
                .cfg
                .retain_bytes
                .is_some_and(|keep| self.durable - b.position > keep);
            let by_time = self
                .cfg
                .retain_time
                .is_some_and(|t| b.timestamp_ms + (t.as_millis() as u64) < now.wall_ms);
            let by_space = b.position < need;
            if by_size || by_time || by_space {
                head = b.end;
            } else {
                break;
            }
        }
        head
    }

    /// A superblock write became durable: it is now one of the two copies.
    fn superblock_durable(&mut self) {
        let Some(w) = self.sb_write.take() else {
            return;
        };
        let old_head = self.head();
        self.superblocks[usize::from(w.sb.copy)] = w.sb;
        self.newest = w.sb.copy;
        if w.sb.head > old_head {
            self.drop_below(w.sb.head);
        }
    }

    /// Forgets batches below the new head and moves partition start offsets past them.
    fn drop_below(&mut self, head: u64) {
        while self.retained.front().is_some_and(|b| b.end <= head) {
            self.retained.pop_front();
        }
        let mut s = self.shared.lock();
        s.head = head;
        for (id, v) in s.partitions.iter_mut() {
            while v.entries.front().is_some_and(|e| e.batch_position < head) {
                v.entries.pop_front();
            }
            let start = v.entries.front().map_or(v.durable_end, |e| e.first_offset);
            v.start_offset = start;
            if let Some(p) = self.registry.get_mut(*id) {
                p.start_offset = start;
            }
        }
        drop(s);
        self.shared.notify();
    }

    /// With on_full = refuse, appends that waited too long for space fail with "log full".
    fn check_full(&mut self, now: Now) {
        if self.space_needed_head == 0 || self.pending.is_empty() {
            self.full_since_ns = None;
            return;
        }
        if self.cfg.on_full != OnFull::Refuse {
            return;
        }
        let since = *self.full_since_ns.get_or_insert(now.mono_ns);
        if now.mono_ns.saturating_sub(since) < self.cfg.full_wait.as_nanos() as u64 {
            return;
        }
        let needed = self.space_needed_head.saturating_sub(self.ring_floor());
        for p in self.pending.drain(..) {
            (p.ack)(Err(LogError::LogFull { needed }));
        }
        self.full_since_ns = None;
    }

    fn start_read(&mut self, position: u64, len: u64, reply: ReadFn) {
        let head = self.head();
        if position < head || position + len > self.durable || len > self.geo.max_batch {
            reply(Err(LogError::OffsetOutOfRange {
                partition: u32::MAX,
                offset: position,
                start: head,
                end: self.durable,
            }));
            return;
        }
        let segs = self.geo.segments(position, len);
        let id = self.bump_tag();
        let mut job = ReadJob {
            parts: [None, None],
            left: 0,
            reply: Some(reply),
            failed: None,
        };
        for (i, (off, n)) in segs.iter().enumerate() {
            if *n == 0 {
                continue;
            }
            let buf = match self.dev.alloc_buffer(*n as usize) {
                Ok(b) => b,
                Err(e) => {
                    job.failed = Some(LogError::Device {
                        op: "allocate a read buffer",
                        source: e,
                    });
                    break;
                }
            };
            let tag = TAG_READ | (id << 1) | i as u64;
            match self.dev.submit_read(tag, off / self.geo.logical_block, buf) {
                Ok(()) => job.left += 1,
                Err(e) => {
                    job.failed = Some(LogError::Device {
                        op: "submit a read",
                        source: e,
                    });
                    break;
                }
            }
        }
        if job.left == 0 {
            if let Some(r) = job.reply.take() {
                r(Err(job.failed.unwrap_or(LogError::Shutdown)));
            }
            return;
        }
        self.reads.insert(id, job);
    }

    fn read_done(&mut self, c: Completion) {
        let id = (c.tag & !TAG_KIND) >> 1;
        let part = (c.tag & 1) as usize;
        let Some(job) = self.reads.get_mut(&id) else {
            return;
        };
        job.left -= 1;
        match (c.result, c.buffer) {
            (Ok(()), Some(b)) => job.parts[part] = Some(b.to_vec()),
            (Err(e), _) => {
                job.failed = Some(LogError::Device {
                    op: "read the log",
                    source: e,
                })
            }
            (Ok(()), None) => job.failed = Some(LogError::Shutdown),
        }
        if job.left > 0 {
            return;
        }
        if let Some(mut job) = self.reads.remove(&id) {
            let result = match job.failed.take() {
                Some(e) => Err(e),
                None => {
                    let mut out = job.parts[0].take().unwrap_or_default();
                    if let Some(second) = job.parts[1].take() {
                        out.extend_from_slice(&second);
                    }
                    Ok(out)
                }
            };
            self.shared.lock().stats.reads += 1;
            if let Some(r) = job.reply.take() {
                r(result);
            }
        }
    }
}

fn pending_len(p: &Pending) -> usize {
    match &p.item {
        Item::Data { payload, .. } => payload.len(),
        Item::Create { topic, .. } => 4 + topic.len(),
    }
}

/// (bytes used, record count) of a batch being sealed.
fn b_finish(b: BatchBuilder<'_>) -> (usize, u32) {
    (b.used(), b.count())
}

/// Acknowledges a batch's appends, in order, and counts them.
fn ack_all(shared: &Shared, acks: &mut Vec<AckEntry>, payload_bytes: u64) {
    if acks.is_empty() {
        return;
    }
    {
        let mut s = shared.lock();
        s.stats.appends_acked += acks.len() as u64;
        s.stats.payload_bytes_acked += payload_bytes;
        for (_, _, since) in acks.iter() {
            s.stats
                .ack_latency_us
                .record(since.elapsed().as_micros() as u64);
        }
    }
    for (ack, a, _) in acks.drain(..) {
        ack(Ok(a));
    }
}

/// The most payload one record may carry in a log of this geometry.
pub fn max_payload(geo: &Geometry) -> usize {
    geo.max_batch as usize - BATCH_HEADER_LEN - crate::format::RECORD_HEADER_LEN - 7
}
