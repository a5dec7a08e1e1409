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
//!   acknowledged, and the flush is never retried. What the same poll's successful flushes made
//!   durable is acknowledged first: those records are on disk, and an error would make their
//!   producers retry them into duplicates.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockdev::{BlockDevice, Completion, IoBuffer};
use bytes::Bytes;
use rustc_hash::FxHashMap;

use crate::backfill::{Backfill, Backfilled};
use crate::batch::BatchBuilder;
use crate::config::{FlushMode, LogConfig, OnFull};
use crate::format::{
    record_size, superblock_offset, BatchKind, RecordKind, Superblock, BATCH_HEADER_LEN,
    FORMAT_VERSION,
};
use crate::layout::{Geometry, Transfers};
use crate::shared::{IndexEntry, PartitionView, Shared};
use crate::state::{checkpoint_budget, encode_create, Registry, MAX_TOPIC_LEN};
use crate::LogError;

mod ack;
mod backfill;
mod build;
mod checkpoint;
mod reads;
mod settle;
mod space;

use ack::ack_once;
pub use ack::{Ack, AckFn, TokenAck};
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
    /// Deletes a partition (durably): its entry leaves the registry, so the checkpoint shrinks,
    /// and appends to it are refused from then on. Its records stay on the device until the
    /// ring frees them, but are never served again.
    DeletePartition { partition: u32, ack: AckFn },
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
        payload: Bytes,
        span: u32,
    },
    Create {
        topic: String,
        index: u32,
    },
    Delete {
        partition: u32,
    },
}

struct Pending {
    item: Item,
    ack: Ack,
    /// When the writer took it: ack latency is measured from here.
    since: Instant,
}

/// An acknowledgement waiting for its batch to become durable.
type AckEntry = (Ack, Appended, Instant);

/// A batch between its submission and its durability.
struct InFlight {
    position: u64,
    end: u64,
    ios_left: u32,
    written: bool,
    acked: bool,
    timestamp_ms: u64,
    acks: Vec<AckEntry>,
    /// Payload bytes of the data records in it (for write amplification).
    payload_bytes: u64,
    /// (partition, entry) for the index, published when durable.
    index: Vec<(u32, IndexEntry)>,
    /// Partitions this batch creates, published when durable.
    created: Vec<(u32, String, u32)>,
    /// Partitions this batch deletes, unpublished when durable.
    deleted: Vec<u32>,
    /// The last batch of a checkpoint: the (position, link) of its first batch, which the next
    /// superblock may name as the recovery point once this batch is durable.
    checkpoint_done: Option<(u64, u32)>,
    /// A batch of a checkpoint that others follow: nothing waits for it to be durable before
    /// the last one is (whose flush covers it), so it calls for no flush of its own.
    mid_checkpoint: bool,
}

struct FlushSlot {
    tag: u64,
    /// When it was submitted, for the flush latency figure.
    submitted_ns: u64,
    /// Everything below this was written (its completion delivered) when the flush was submitted.
    covers: u64,
    /// The batch [start, end) whose write this flush is linked to (`submit_write_flush`): the
    /// device starts the flush only after that write completed, so it covers it too.
    linked: Option<(u64, u64)>,
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
    /// What moving the head to `sb.head` frees that no retention setting expired.
    unexpired: Unexpired,
}

/// Log space freed for room alone (drop-oldest), before retention would have freed it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Unexpired {
    batches: u64,
    bytes: u64,
}

struct ReadJob {
    /// The bytes read so far, placed by piece index.
    landing: crate::read_pieces::Landing,
    left: u32,
    reply: Option<ReadFn>,
}

/// The group-commit writer's state machine. See the module docs.
pub struct Writer<D: BlockDevice> {
    dev: D,
    geo: Geometry,
    /// How batches and reads are cut to the device's maximum transfer.
    io: Transfers,
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
    /// Read-only queue pairs of the device for readers (`Log` takes them; `direct.rs`).
    direct: Option<crate::direct::DirectReads>,
    /// Until the rebuild is installed, retention frees nothing: the batches below the recovery
    /// point are not known yet.
    backfill_pending: bool,
    batches: VecDeque<InFlight>,
    writes_in_flight: usize,
    write_tags: HashMap<u64, u64>,
    /// `write_records`' partition -> index entry map, kept to reuse its allocation.
    entry_of: FxHashMap<u32, usize>,
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
    /// Newest durable checkpoint: (position, link) of its first batch, not yet named by a
    /// superblock.
    durable_checkpoint: Option<(u64, u32)>,
    /// A checkpoint is being written or is not durable yet.
    checkpoint_in_flight: bool,
    /// The checkpoint whose batches are being written (nothing else is written until its last).
    checkpoint_run: Option<checkpoint::Run>,
    /// Where the newest durable checkpoint ends (the recovery point after a resume): the lag is
    /// counted from here.
    checkpoint_end: u64,
    force_checkpoint: bool,
    /// Log bytes the registry's checkpoint may take (`state::checkpoint_budget`).
    checkpoint_budget: u64,
    /// Since when appends have waited while the writer could write nothing (see `check_stall`),
    /// and whether that was logged.
    stalled_since_ns: Option<u64>,
    stall_warned: bool,
    /// Since when appends have waited for space (on_full = refuse).
    full_since_ns: Option<u64>,
    /// The head the ring needs for the next batch to fit (0 when nothing waits for space).
    space_needed_head: u64,
    reads: HashMap<u64, ReadJob>,
    /// Readers' I/Os in the device queue, and how many may be: what the queue holds beyond
    /// the writer's own (`Transfers::writer_ios`), so that a read never takes the slot a batch
    /// write needs (a write the device refuses for a full queue is fatal).
    read_ios: usize,
    read_slots: usize,
    /// Reads waiting for slots, in arrival order.
    reads_waiting: VecDeque<(u64, u64, ReadFn)>,
    completions: Vec<Completion>,
    last_activity_ns: u64,
    fatal: Option<LogError>,
    /// A failure seen among this step's completions, acted on once the step has published what
    /// the same completions made durable (see [`Writer::fail_after_settling`]).
    failing: Option<LogError>,
    shared: Arc<Shared>,
    /// The device takes a write and a flush linked (`DeviceInfo::linked_flush`).
    linked_flush: bool,
    /// Token acks answered, waiting for the owner (`drain_acks`).
    token_acks: Vec<TokenAck>,
    /// Payload bytes in `pending`.
    pending_bytes: u64,
    /// What appends taken since the last step are stamped with: read at the first append after
    /// a step (or given by the owner, `Writer::set_clock`), so one clock read per turn, not one
    /// per record (100-150 ns each on a virtual machine's TSC), and never older than the step.
    taken_at: Option<Instant>,
}

/// Buffers the writer allocates at start and recycles, bounding its memory: (buffers of a
/// maximum batch, buffers of one I/O). A batch is built in a buffer of the first kind, which then
/// carries its first piece; each further piece goes out of any free buffer (`take_io_buffer`), so
/// the second kind holds one for every further piece of every batch in flight. The first kind
/// has two more than batches in flight, as before this split existed (a superblock write takes a
/// buffer too). On a device that takes a whole batch in one transfer both kinds are maximum
/// batches: 2 x writes in flight + 2 of them, as before.
fn buffer_counts(cfg: &LogConfig, io: &Transfers) -> (usize, usize) {
    let pieces = (io.per_batch as usize).saturating_sub(1);
    (
        cfg.max_writes_in_flight + 2,
        pieces.saturating_mul(cfg.max_writes_in_flight),
    )
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
        // Recovery made the same device checks before it wrote; this is for any other caller.
        let io = geo.check_for_writer(dev.info(), dev.queue_depth(), &cfg)?;
        let read_slots = dev.queue_depth().saturating_sub(io.writer_ios(&cfg));
        let (batch_bufs, io_bufs) = buffer_counts(&cfg, &io);
        let mut free_bufs = Vec::with_capacity(batch_bufs + io_bufs);
        for size in [(batch_bufs, geo.max_batch), (io_bufs, io.max_io)]
            .into_iter()
            .flat_map(|(n, size)| std::iter::repeat_n(size, n))
        {
            free_bufs.push(
                dev.alloc_buffer(size as usize)
                    .map_err(LogError::device("allocate batch buffers"))?,
            );
        }
        // The ring holds the lag twice over (the older superblock copy may pin one recovery point
        // back), the window, two batches, and the room kept for a checkpoint.
        let checkpoint_budget = checkpoint_budget(&geo);
        let ring_room = geo
            .log_size
            .saturating_sub(geo.window + 2 * geo.max_batch + checkpoint_budget)
            / 2;
        let lag = cfg.recovery_lag.min(ring_room).max(geo.max_batch);
        let volatile_cache = dev.info().volatile_write_cache;
        let dev_linked_flush = dev.info().linked_flush;
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
        let shared = Arc::new(Shared::with_cache(cfg.tail_cache_bytes));
        let mut w = Writer {
            dev,
            geo,
            io,
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
            direct: None,
            backfill_pending: resume.backfill.is_some(),
            batches: VecDeque::new(),
            writes_in_flight: 0,
            write_tags: HashMap::new(),
            entry_of: FxHashMap::default(),
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
            checkpoint_run: None,
            checkpoint_end: newest_sb.recovery_point,
            force_checkpoint: false,
            checkpoint_budget,
            stalled_since_ns: None,
            stall_warned: false,
            full_since_ns: None,
            space_needed_head: 0,
            reads: HashMap::new(),
            read_ios: 0,
            read_slots,
            reads_waiting: VecDeque::new(),
            completions: Vec::with_capacity(256),
            last_activity_ns: 0,
            fatal: None,
            failing: None,
            shared,
            token_acks: Vec::new(),
            pending_bytes: 0,
            linked_flush: dev_linked_flush,
            taken_at: None,
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
        s.stats.registry_partitions = self.registry.len() as u64;
        s.stats.registry_bytes = self.registry.entry_bytes();
        s.stats.checkpoint_budget = self.checkpoint_budget;
        for p in self.registry.iter() {
            s.insert_partition(
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
                Request::Append { ack, .. }
                | Request::CreatePartition { ack, .. }
                | Request::DeletePartition { ack, .. } => ack(Err(e)),
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
            } => self.append(partition, Bytes::from(payload), span, Ack::Call(ack)),
            Request::CreatePartition { topic, index, ack } => {
                if topic.is_empty() || topic.len() > MAX_TOPIC_LEN {
                    ack(Err(LogError::Config(format!(
                        "topic name must be 1 to {MAX_TOPIC_LEN} bytes, got {}",
                        topic.len()
                    ))));
                    return;
                }
                let since = self.stamp();
                self.pending.push_back(Pending {
                    item: Item::Create { topic, index },
                    ack: Ack::Call(ack),
                    since,
                });
            }
            Request::DeletePartition { partition, ack } => {
                let since = self.stamp();
                self.pending.push_back(Pending {
                    item: Item::Delete { partition },
                    ack: Ack::Call(ack),
                    since,
                })
            }
            Request::Read {
                position,
                len,
                reply,
            } => self.start_read(position, len, reply),
            Request::Backfilled(result) => self.install_backfill(result),
        }
    }

    /// Queues one append of a record taking `span` offsets, answered through `ack` (a refusal too,
    /// at once). The payload is copied once, into the device buffer of the batch that takes it.
    /// This is `submit(Request::Append)` for an owner that steps the writer itself.
    pub fn append(&mut self, partition: u32, payload: Bytes, span: u32, ack: Ack) {
        if let Some(e) = &self.fatal {
            let e = LogError::WriterStopped(e.to_string());
            self.answer(ack, Err(e));
            return;
        }
        if span == 0 {
            let e = LogError::Config("an append must take at least one offset".into());
            self.answer(ack, Err(e));
            return;
        }
        if payload.len() > self.max_payload() {
            let e = LogError::RecordTooLarge {
                len: payload.len(),
                max: self.max_payload(),
            };
            self.answer(ack, Err(e));
            return;
        }
        self.pending_bytes += payload.len() as u64;
        let since = self.stamp();
        self.pending.push_back(Pending {
            item: Item::Data {
                partition,
                payload,
                span,
            },
            ack,
            since,
        });
    }

    /// The owner looked at the clock: appends taken from now on count their ack latency from
    /// `at` (an append the owner hands over later in its pass counts from a little before it
    /// arrived, never from after).
    pub fn set_clock(&mut self, at: Instant) {
        self.taken_at = Some(at);
    }

    /// The instant an append taken now counts its ack latency from.
    fn stamp(&mut self) -> Instant {
        *self.taken_at.get_or_insert_with(Instant::now)
    }

    /// Payload bytes of the appends queued and not yet in a batch.
    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// Queued appends not yet in a batch.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// One round of work. Returns whether anything moved.
    pub fn step(&mut self, now: Now) -> bool {
        // Appends after this step read the clock afresh (once), however long the owner sleeps.
        self.taken_at = None;
        if self.fatal.is_some() {
            return false;
        }
        let mut comps = std::mem::take(&mut self.completions);
        if let Err(e) = self.dev.poll(&mut comps) {
            self.fail_after_settling(LogError::Device {
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
        self.settle();
        if let Some(e) = self.failing.take() {
            self.fail(e);
        }
        if self.fatal.is_some() {
            return true;
        }
        self.start_waiting_reads();
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
        self.check_stall(now);
        if moved {
            self.last_activity_ns = now.mono_ns;
            // Hand what this step submitted to the device now: a queue-based device (io_uring,
            // the NVMe queue pair) holds submissions until the next poll, and an owner that
            // sleeps on the device's completion fd must not sleep with them unsent. Whatever
            // completed meanwhile waits in `completions` for the next step.
            if self.fatal.is_none() {
                if let Err(e) = self.dev.poll(&mut self.completions) {
                    // Settled by the next step first, like any poll's failure.
                    self.fail_after_settling(LogError::Device {
                        op: "poll",
                        source: e,
                    });
                }
            }
        }
        moved
    }

    /// D: every byte of log below it is durable.
    pub fn durable(&self) -> u64 {
        self.durable
    }

    /// Completions collected but not yet handled: the owner should step again before sleeping.
    pub fn has_completions(&self) -> bool {
        !self.completions.is_empty() || self.failing.is_some()
    }

    /// The device, for its completion fd (an owner's event loop sleeps on it).
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// The owner is about to sleep on the device's completion fd
    /// (`BlockDevice::arm_completion_fd`).
    pub fn arm_completion_fd(&mut self) {
        self.dev.arm_completion_fd();
    }

    /// Waits up to `timeout` for a device completion (call when a step moved nothing and I/O is
    /// in flight). The completions are handled by the next step.
    pub fn wait_device(&mut self, timeout: Duration) {
        if self.fatal.is_some() || self.dev.in_flight() == 0 {
            return;
        }
        if let Err(e) = self.dev.wait(&mut self.completions, timeout) {
            // What the wait collected before failing is settled (and acknowledged) by the next
            // step, then the writer stops.
            self.fail_after_settling(LogError::Device {
                op: "wait",
                source: e,
            });
        }
    }

    pub fn has_io_in_flight(&self) -> bool {
        self.dev.in_flight() > 0
    }

    /// Notes a failure found while taking in completions; the step fails the writer after
    /// settling, so that a flush that succeeded in the same poll first publishes and acknowledges
    /// what it made durable (only completed writes count towards D, so a failed write is never
    /// covered). The first failure is the reason reported.
    pub(super) fn fail_after_settling(&mut self, err: LogError) {
        if self.failing.is_none() {
            self.failing = Some(err);
        }
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
        for b in std::mem::take(&mut self.batches) {
            for (ack, _, _) in b.acks {
                self.answer(ack, Err(stopped.clone()));
            }
        }
        self.pending_bytes = 0;
        for p in std::mem::take(&mut self.pending) {
            self.answer(p.ack, Err(stopped.clone()));
        }
        for (_, mut r) in self.reads.drain() {
            if let Some(reply) = r.reply.take() {
                reply(Err(stopped.clone()));
            }
        }
        for (_, _, reply) in std::mem::take(&mut self.reads_waiting) {
            reply(Err(stopped.clone()));
        }
        self.shared.cache().discard_staged();
        self.fatal = Some(err);
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
}

fn pending_len(p: &Pending) -> usize {
    match &p.item {
        Item::Data { payload, .. } => payload.len(),
        Item::Create { topic, .. } => 4 + topic.len(),
        Item::Delete { .. } => 0,
    }
}

pub fn max_payload(geo: &Geometry) -> usize {
    geo.max_batch as usize - BATCH_HEADER_LEN - crate::format::RECORD_HEADER_LEN - 7
}
