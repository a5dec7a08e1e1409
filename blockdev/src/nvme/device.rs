//! [`NvmeDevice`]: one namespace of one controller as a [`BlockDevice`](crate::BlockDevice),
//! through one polled I/O queue pair driven directly by the thread that owns it.
//!
//! A controller may carry several pairs ([`NvmeOptions::queue_pairs`],
//! [`NvmeDevice::queue_pair`]): each is an `NvmeDevice` of its own, owned by one thread, with its
//! own queues, doorbells, command slots and PRP lists, so several threads (event loops) share a
//! namespace without a lock on the submit/reap path; what they share is in [`super::shared`].
//!
//! Steady state does no system call and no heap allocation per I/O: requests, command slots and
//! PRP list pages are preallocated, buffers come from the DMA arenas, a submit only writes queue
//! entries, and `poll` rings the submission doorbell once for everything submitted since the last
//! poll, reaps the completion queue and rings its head doorbell once.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::controller::{Controller, InitError, MAX_IO_QUEUES};
use super::dma::{ControlArena, DmaPool, IovaSpace, Span};
use super::identify::{ControllerId, NamespaceId};
use super::prp;
use super::queue::QueuePair;
use super::regs;
use super::shared::{map_memory, Admin, PairParts, Shared};
use super::sys::Host;
use super::timeout::Epochs;
use crate::{DeviceError, DeviceInfo, IoBuffer, Op, Tag};

/// How an [`NvmeDevice`] is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmeOptions {
    /// Caller I/Os that may be in flight at once. Lowered (and reported by `queue_depth`) when the
    /// controller's queues are too small for it.
    pub queue_depth: usize,
    /// Largest caller I/O in bytes (a multiple of 4096). Transfers above the controller's MDTS
    /// are split into several commands and completed once.
    pub max_transfer: u32,
    /// Size of each DMA buffer arena. One is mapped at open; more (up to `max_arenas`) when
    /// `alloc_buffer` runs out.
    pub arena_bytes: usize,
    pub max_arenas: usize,
    /// How long a command may stay in flight before the driver gives up on it (as Linux's
    /// nvme io_timeout, 30 s by default): it sends an Abort, stops the device and reports
    /// [`DeviceError::CommandTimeout`]. Checked while the driver waits on the device; precise to
    /// about an eighth of itself.
    pub io_timeout: Duration,
    /// I/O queue pairs to ask the controller for (Set Features Number of Queues, once at
    /// open): one for the device opened, the rest for [`NvmeDevice::queue_pair`]. The
    /// controller may grant fewer ([`NvmeDetails::queue_pairs`]).
    pub queue_pairs: u16,
}

impl Default for NvmeOptions {
    fn default() -> Self {
        NvmeOptions {
            queue_depth: 128,
            max_transfer: 1 << 20,
            arena_bytes: 32 << 20,
            max_arenas: 4,
            io_timeout: DEFAULT_IO_TIMEOUT,
            queue_pairs: 1,
        }
    }
}

/// What the controller and namespace said about themselves, for operators and checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeDetails {
    pub pci: String,
    pub version: u32,
    pub controller: ControllerId,
    pub namespace: NamespaceId,
    pub nsid: u32,
    pub lba_size: u32,
    /// MDTS in bytes; None for no limit.
    pub mdts_bytes: Option<usize>,
    /// Largest transfer of one command the driver issues (MDTS and one PRP list page).
    pub command_bytes: usize,
    /// Volatile write cache enabled (Get Features 06h); meaningful only when present.
    pub write_cache_enabled: bool,
    /// SMART / Health Information at open (or why it could not be read).
    pub smart: Result<crate::nvme::smart::SmartLog, String>,
    pub page_size: usize,
    /// Entries of each I/O queue.
    pub queue_entries: u16,
    /// I/O queue pairs the controller granted (at most [`NvmeOptions::queue_pairs`]).
    pub queue_pairs: u16,
}

/// [`NvmeOptions::io_timeout`] by default, as Linux's nvme driver.
pub const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(30);
/// The accepted range of [`NvmeOptions::io_timeout`].
pub const IO_TIMEOUT_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(1)..=Duration::from_secs(3600);
/// Control memory of the admin queues and the Identify page.
const ADMIN_CONTROL_BYTES: usize = 64 << 10;

/// One I/O queue pair of an NVMe namespace over VFIO (or over any [`Host`], such as the
/// software controller), owned by one thread.
pub struct NvmeDevice<H: Host = super::vfio::VfioHost> {
    pub(super) shared: Arc<Shared<H>>,
    /// The controller's host, for this pair's doorbells and CSTS, without the admin lock.
    pub(super) host: Arc<H>,
    pub(super) qid: u16,
    pub(super) io: QueuePair,
    /// This pair's copy of the buffer arenas' spans, current while `arenas` equals
    /// `Shared::arenas` (so checking a buffer takes no lock).
    pub(super) buffer_spans: Vec<Span>,
    pub(super) arenas: usize,
    pub(super) requests: Vec<Request>,
    pub(super) free_requests: Vec<u16>,
    pub(super) slots: Vec<Slot>,
    pub(super) free_slots: Vec<u16>,
    pub(super) prp_lists: NonNull<u64>,
    pub(super) prp_lists_iova: u64,
    pub(super) in_flight: usize,
    /// Polls since the last look at the controller with commands in flight all along.
    pub(super) busy_polls: u32,
    pub(super) epochs: Epochs,
    /// The clock reading the last `poll` made, for `wait`'s own timeout.
    pub(super) sample: Option<Instant>,
    /// This pair has failed what it had in flight after the controller stopped. Why it stopped
    /// is `Shared::failure` alone: every pair reports that same first failure.
    pub(super) stopped: bool,
    closed: bool,
    /// The queues' and PRP lists' memory: unmapped and freed after the queues are deleted.
    io_mem: ControlArena,
}

// SAFETY: prp_lists points into `io_mem`, owned by the pair; everything else is Send.
unsafe impl<H: Host> Send for NvmeDevice<H> {}

fn open_err(label: &str, detail: String) -> DeviceError {
    DeviceError::Open {
        op: Op::Open,
        path: label.to_string(),
        detail,
    }
}

impl<H: Host> NvmeDevice<H> {
    /// Brings up the controller behind `host` and opens namespace `nsid`.
    pub fn with_host(host: H, nsid: u32, opts: NvmeOptions) -> Result<NvmeDevice<H>, DeviceError> {
        let label = format!("nvme:{} ns {nsid}", host.name());
        let err = |detail: String| open_err(&label, detail);
        if opts.queue_depth == 0 || opts.queue_depth > 4096 {
            return Err(err("NvmeOptions::queue_depth must be 1..=4096".into()));
        }
        if opts.max_transfer < 4096 || !opts.max_transfer.is_multiple_of(4096) {
            return Err(err(
                "NvmeOptions::max_transfer must be a positive multiple of 4096".into(),
            ));
        }
        if opts.max_arenas == 0 || opts.arena_bytes < opts.max_transfer as usize {
            return Err(err(
                "NvmeOptions::arena_bytes must hold one max_transfer buffer and max_arenas be at least 1".into(),
            ));
        }
        if opts.queue_pairs == 0 || opts.queue_pairs > MAX_IO_QUEUES {
            return Err(err(format!(
                "NvmeOptions::queue_pairs must be 1..={MAX_IO_QUEUES}, not {}",
                opts.queue_pairs
            )));
        }
        if !IO_TIMEOUT_RANGE.contains(&opts.io_timeout) {
            return Err(err(format!(
                "NvmeOptions::io_timeout must be 1 ms to 1 hour, not {:?}",
                opts.io_timeout
            )));
        }
        let mut iova = IovaSpace::new(host.iova_ranges());
        let mut pinned = 0u64;
        let (mem, at) = map_memory(&host, &mut iova, &mut pinned, ADMIN_CONTROL_BYTES)
            .map_err(|e| err(e.to_string()))?;
        let mut admin_mem = ControlArena::new(mem, at);
        let ctrl = Controller::start(host, &mut admin_mem).map_err(|e| err(e.to_string()))?;
        let mut guard = InitGuard(Some(ctrl));
        let ctrl = guard
            .0
            .as_mut()
            .ok_or_else(|| err("lost the controller".into()))?;
        let version = ctrl.host.read32(regs::VS);
        let id = ctrl.identify_controller().map_err(|e| err(e.to_string()))?;
        if nsid == 0 || nsid > id.nn {
            return Err(err(format!(
                "namespace {nsid} does not exist: the controller has namespaces 1..={}",
                id.nn
            )));
        }
        let ns = match ctrl.identify_namespace(nsid) {
            Err(InitError::Admin { status, .. }) if (status.sct, status.sc) == (0, 0x0B) => {
                return Err(err(format!(
                    "namespace {nsid} does not exist (invalid namespace)"
                )))
            }
            r => r.map_err(|e| err(e.to_string()))?,
        };
        if ns.nsze == 0 {
            return Err(err(format!(
                "namespace {nsid} is not active (Identify Namespace reports size 0); attach or create it"
            )));
        }
        let fmt = ns.active_format();
        if fmt.ms != 0 {
            return Err(err(format!(
                "namespace {nsid} uses LBA format {} with {} metadata bytes per block; the driver \
                 supports formats without metadata only: reformat it (nvme format --lbaf=<a format with ms=0>)",
                ns.flbas & 0xF,
                fmt.ms
            )));
        }
        if !(9..=16).contains(&fmt.lbads) {
            return Err(err(format!(
                "namespace {nsid} reports an unsupported block size 2^{}",
                fmt.lbads
            )));
        }
        let lbs = 1usize << fmt.lbads;
        let write_cache_enabled = if id.cache_present() {
            ctrl.write_cache_enabled().map_err(|e| err(e.to_string()))?
        } else {
            false
        };
        // Health is reported, never a reason to refuse the drive here: tools judge it.
        let smart = ctrl.smart_log().map_err(|e| e.to_string());
        let granted = ctrl
            .request_queues(opts.queue_pairs)
            .map_err(|e| err(e.to_string()))?;
        let bar_needs = regs::cq_head_doorbell(granted, ctrl.cap.doorbell_stride()) + 4;
        if ctrl.host.bar_len() < bar_needs {
            return Err(err(format!(
                "BAR0 is {} bytes, the doorbells of {granted} I/O queue pairs need {bar_needs}",
                ctrl.host.bar_len()
            )));
        }

        // Geometry of the I/O path.
        let page = ctrl.page_size;
        let mdts_bytes = id.max_transfer(ctrl.cap.min_page_size());
        let mut command_bytes = prp::max_transfer(page)
            .min(mdts_bytes.unwrap_or(usize::MAX))
            .min(lbs << 16);
        command_bytes -= command_bytes % page.max(lbs);
        if command_bytes < lbs {
            return Err(err(format!(
                "MDTS allows {command_bytes} bytes per command, less than one {lbs}-byte block"
            )));
        }
        let max_transfer = (opts.max_transfer as usize).max(lbs) / lbs * lbs;
        let parts = max_transfer.div_ceil(command_bytes);
        let max_entries = (ctrl.cap.max_queue_entries() as usize).min(4096);
        let mut queue_depth = opts.queue_depth;
        if queue_depth * parts + 1 > max_entries {
            queue_depth = (max_entries - 1) / parts;
        }
        if queue_depth == 0 {
            return Err(err(format!(
                "the controller's queues ({max_entries} entries) cannot hold one {max_transfer}-byte \
                 transfer split into {parts} commands; lower NvmeOptions::max_transfer"
            )));
        }
        let slot_count = queue_depth * parts;
        let entries = (slot_count + 1) as u16;

        let pool = Arc::new(DmaPool::default());
        let (mem, at) = map_memory(&*ctrl.host, &mut iova, &mut pinned, opts.arena_bytes)
            .map_err(|e| err(e.to_string()))?;
        let arena_span = Span {
            vaddr: mem.as_ptr() as usize,
            iova: at,
            len: mem.len(),
        };
        pool.add_arena(mem, at);

        let blocks = ns.nsze;
        let atomic_blocks = if ns.has_atomic_params() && ns.nawupf != 0 {
            u32::from(ns.nawupf) + 1
        } else {
            u32::from(id.awupf) + 1
        };
        let info = DeviceInfo {
            logical_block_size: lbs as u32,
            physical_block_size: lbs as u32,
            capacity: blocks.saturating_mul(lbs as u64),
            max_transfer: max_transfer as u32,
            atomic_write_unit: atomic_blocks.saturating_mul(lbs as u32),
            preferred_write: if ns.has_perf_params() {
                (u32::from(ns.npwg) + 1).saturating_mul(lbs as u32)
            } else {
                0
            },
            // storage.md §1: only a drive that reports no volatile cache may skip flushes; a
            // cache disabled with Set Features can be re-enabled behind our back.
            volatile_write_cache: id.cache_present(),
            fs_block_size: 0,
            identity: format!("nvme:{} ns={nsid}", id.serial),
            model: format!("{} fw {}", id.model, id.firmware),
            health: match &smart {
                Ok(s) => s.summary(),
                Err(e) => format!("SMART log not read: {e}"),
            },
            engine: String::new(),
            linked_flush: false,
        };
        let pci = ctrl.host.name().to_string();
        let ctrl = guard
            .0
            .take()
            .ok_or_else(|| err("lost the controller".into()))?;
        let details = NvmeDetails {
            pci,
            version,
            controller: id,
            namespace: ns,
            nsid,
            lba_size: lbs as u32,
            mdts_bytes,
            command_bytes,
            write_cache_enabled,
            smart,
            page_size: page,
            queue_entries: entries,
            queue_pairs: granted,
        };
        let host = Arc::clone(&ctrl.host);
        let shared = Arc::new(Shared {
            admin: Mutex::new(Admin {
                ctrl,
                iova,
                pinned,
                buffer_spans: vec![arena_span],
                admin_span: admin_mem.span,
                free_qids: (1..=granted).rev().collect(),
                closed: false,
                _admin_mem: admin_mem,
            }),
            host,
            pool,
            arenas: AtomicUsize::new(1),
            stopped: AtomicBool::new(false),
            failure: Mutex::new(None),
            info,
            details,
            nsid,
            lba_shift: fmt.lbads.into(),
            command_bytes,
            queue_depth,
            opts,
        });
        match NvmeDevice::pair(&shared) {
            Ok(Some(dev)) => Ok(dev),
            Ok(None) => Err(err("the controller granted no I/O queue pair".into())),
            Err(e) => {
                // Not shut down normally: nothing was written, and the admin queue may be stuck.
                shared.stop(None);
                Err(e)
            }
        }
    }

    /// Another I/O queue pair on the same controller and namespace, for another thread: it
    /// shares the controller, the DMA buffer pool and the geometry, and nothing on the I/O path
    /// (its own queues, doorbells, command slots and PRP lists, no lock). `Ok(None)` when every
    /// pair the controller granted ([`NvmeDetails::queue_pairs`]) is in use: the caller then
    /// shares a pair it has, through its owner. An error (a failed Create I/O Queue, no memory)
    /// names the pair and the step.
    ///
    /// The controller shuts down (CC.SHN) when its last pair is dropped or closed.
    pub fn queue_pair(&self) -> Result<Option<NvmeDevice<H>>, DeviceError> {
        NvmeDevice::pair(&self.shared)
    }

    fn pair(shared: &Arc<Shared<H>>) -> Result<Option<NvmeDevice<H>>, DeviceError> {
        let Some(p) = shared.open_pair()? else {
            return Ok(None);
        };
        let PairParts {
            qid,
            io,
            mem,
            prp_lists,
            prp_lists_iova,
        } = p;
        let queue_depth = shared.queue_depth;
        let slot_count = usize::from(shared.details.queue_entries) - 1;
        let requests = (0..queue_depth)
            .map(|_| Request {
                tag: 0,
                op: Op::Write,
                lba: 0,
                buffer: None,
                parts: 0,
                active: false,
                error: None,
            })
            .collect();
        let buffer_spans = shared.lock().buffer_spans.clone();
        Ok(Some(NvmeDevice {
            host: Arc::clone(&shared.host),
            arenas: buffer_spans.len(),
            buffer_spans,
            shared: Arc::clone(shared),
            qid,
            io,
            requests,
            free_requests: (0..queue_depth as u16).rev().collect(),
            slots: vec![
                Slot {
                    request: 0,
                    lba: 0,
                    opcode: 0,
                    busy: false,
                    epoch: 0,
                };
                slot_count
            ],
            free_slots: (0..slot_count as u16).rev().collect(),
            prp_lists: prp_lists.cast(),
            prp_lists_iova,
            in_flight: 0,
            busy_polls: 0,
            epochs: Epochs::new(shared.opts.io_timeout),
            sample: None,
            stopped: false,
            closed: false,
            io_mem: mem,
        }))
    }

    /// What the controller reported at open.
    pub fn details(&self) -> &NvmeDetails {
        &self.shared.details
    }

    /// This pair's I/O queue id (1 for the pair opened first).
    pub fn queue_id(&self) -> u16 {
        self.qid
    }

    /// Whether the device stopped after a controller failure (found by this pair or another).
    pub fn is_stopped(&self) -> bool {
        self.stopped || self.shared.stopped.load(Ordering::Acquire)
    }

    /// Deletes this pair's queues and, if it is the controller's last pair, shuts the
    /// controller down cleanly (CC.SHN normal shutdown, which also writes back its cache) and
    /// unmaps the DMA memory. Dropping does the same but cannot report a failure.
    pub fn close(mut self) -> Result<(), DeviceError> {
        let pair = self.release();
        // The pair's memory goes now; the controller goes with its last pair.
        let shared = Arc::clone(&self.shared);
        drop(self);
        let last = Arc::into_inner(shared).map_or(Ok(()), |s| s.shutdown());
        pair.and(last)
    }

    fn release(&mut self) -> Result<(), DeviceError> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        let r = self.shared.close_pair(self.qid, self.io_mem.span);
        // The controller no longer touches this pair's memory; buffers of unfinished I/Os may go
        // back.
        for r in &mut self.requests {
            r.buffer = None;
        }
        self.stopped = true;
        r
    }

    pub(super) fn map_arena(&mut self, len: usize) -> Result<(), DeviceError> {
        self.shared.map_arena(len)?;
        self.refresh_spans();
        Ok(())
    }

    /// Takes a fresh copy of the buffer arenas' spans when another pair mapped one.
    pub(super) fn refresh_spans(&mut self) {
        let now = self.shared.arenas.load(Ordering::Acquire);
        if now != self.arenas {
            self.buffer_spans = self.shared.lock().buffer_spans.clone();
            self.arenas = self.buffer_spans.len();
        }
    }

    /// The device address of a buffer, if it lies in one of our buffer arenas.
    pub(super) fn buffer_iova(&mut self, b: &IoBuffer) -> Option<u64> {
        let find = |spans: &[Span]| {
            let ptr = b.as_ptr() as usize;
            spans
                .iter()
                .find_map(|s| s.iova_of(ptr, b.capacity()))
                .filter(|&iova| iova == b.iova())
        };
        find(&self.buffer_spans).or_else(|| {
            // An arena another pair mapped since our last look.
            self.refresh_spans();
            find(&self.buffer_spans)
        })
    }
}

/// Disables a controller whose initialisation failed half way.
struct InitGuard<H: Host>(Option<Controller<H>>);

impl<H: Host> Drop for InitGuard<H> {
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            let _ = c.disable();
        }
    }
}

impl<H: Host> Drop for NvmeDevice<H> {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

impl<H: Host> std::fmt::Debug for NvmeDevice<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmeDevice")
            .field("info", &self.shared.info)
            .field("qid", &self.qid)
            .field("queue_depth", &self.shared.queue_depth)
            .field("in_flight", &self.in_flight)
            .field("stopped", &self.stopped)
            .finish()
    }
}

pub(super) struct Request {
    pub(super) tag: Tag,
    pub(super) op: Op,
    pub(super) lba: u64,
    pub(super) buffer: Option<IoBuffer>,
    pub(super) parts: u32,
    pub(super) active: bool,
    pub(super) error: Option<DeviceError>,
}

#[derive(Clone, Copy)]
pub(super) struct Slot {
    pub(super) request: u16,
    pub(super) lba: u64,
    pub(super) opcode: u8,
    pub(super) busy: bool,
    /// The epoch at submission (see [`Epochs`]), for the I/O timeout.
    pub(super) epoch: u64,
}
