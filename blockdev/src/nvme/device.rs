//! [`NvmeDevice`]: one namespace of one controller as a [`BlockDevice`], with one polled I/O queue
//! pair driven directly by the calling thread.
//!
//! Steady state does no system call and no heap allocation per I/O: requests, command slots and
//! PRP list pages are preallocated, buffers come from the DMA arenas, a submit only writes queue
//! entries, and `poll` rings the submission doorbell once for everything submitted since the last
//! poll, reaps the completion queue and rings its head doorbell once.

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::command::{io, Sqe};
use super::controller::{Controller, InitError};
use super::dma::{self, ControlArena, DmaPool, IovaSpace, Span};
use super::identify::{ControllerId, NamespaceId};
use super::prp;
use super::queue::QueuePair;
use super::regs;
use super::status::Status;
use super::sys::{Host, HostError, Memory};
use super::timeout::Epochs;
use crate::{check_io, BlockDevice, Completion, DeviceError, DeviceInfo, IoBuffer, Op, Tag};

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
}

impl Default for NvmeOptions {
    fn default() -> Self {
        NvmeOptions {
            queue_depth: 128,
            max_transfer: 1 << 20,
            arena_bytes: 32 << 20,
            max_arenas: 4,
            io_timeout: DEFAULT_IO_TIMEOUT,
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
    pub queue_entries: u16,
}

/// [`NvmeOptions::io_timeout`] by default, as Linux's nvme driver.
pub const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(30);
/// The accepted range of [`NvmeOptions::io_timeout`].
pub const IO_TIMEOUT_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(1)..=Duration::from_secs(3600);
/// How long the driver waits for the controller to answer the Abort of a timed-out command.
const ABORT_WAIT: Duration = Duration::from_secs(1);
/// The I/O submission queue's id (the driver creates one).
const IO_QID: u16 = 1;

/// Empty polls in a row between two looks at the controller: CSTS (an MMIO read) and the clock
/// (a system call on an HPET guest), for `wait`'s timeout and the commands' ages.
const CLOCK_EVERY: u32 = 256;

/// Control memory of the admin queues and the Identify page.
const ADMIN_CONTROL_BYTES: usize = 64 << 10;

struct Request {
    tag: Tag,
    op: Op,
    lba: u64,
    buffer: Option<IoBuffer>,
    parts: u32,
    active: bool,
    error: Option<DeviceError>,
}

#[derive(Clone, Copy)]
struct Slot {
    request: u16,
    lba: u64,
    opcode: u8,
    busy: bool,
    /// The epoch at submission (see [`Epochs`]), for the I/O timeout.
    epoch: u64,
}

/// One NVMe namespace over VFIO (or over any [`Host`], such as the software controller).
pub struct NvmeDevice<H: Host = super::vfio::VfioHost> {
    info: DeviceInfo,
    details: NvmeDetails,
    nsid: u32,
    lba_shift: u32,
    ctrl: Controller<H>,
    io: QueuePair,
    iova: IovaSpace,
    /// Spans mapped for the device: control arenas first, then buffer arenas.
    spans: Vec<Span>,
    buffer_spans: usize,
    pinned: u64,
    pool: Arc<DmaPool>,
    requests: Vec<Request>,
    free_requests: Vec<u16>,
    slots: Vec<Slot>,
    free_slots: Vec<u16>,
    prp_lists: NonNull<u64>,
    prp_lists_iova: u64,
    command_bytes: usize,
    queue_depth: usize,
    in_flight: usize,
    empty_polls: u32,
    epochs: Epochs,
    /// The clock reading the last `poll` made, for `wait`'s own timeout.
    sample: Option<Instant>,
    /// Why the device stopped, when a command timed out: `poll` and `wait` report it, submits
    /// are refused with it.
    failure: Option<DeviceError>,
    stopped: bool,
    closed: bool,
    opts: NvmeOptions,
    // Dropped after the controller is shut down and the spans unmapped (see Drop).
    _admin_mem: ControlArena,
    _io_mem: ControlArena,
}

// SAFETY: prp_lists points into `_io_mem`, owned by the device; everything else is Send.
unsafe impl<H: Host> Send for NvmeDevice<H> {}

fn open_err(label: &str, detail: String) -> DeviceError {
    DeviceError::Open {
        op: Op::Open,
        path: label.to_string(),
        detail,
    }
}

/// Maps `len` bytes of fresh memory for the device.
fn map_memory<H: Host>(
    host: &mut H,
    iova: &mut IovaSpace,
    pinned: &mut u64,
    len: usize,
) -> Result<(Memory, u64), HostError> {
    let mem = Memory::anonymous(len)?;
    dma::check_memlock(host.memlock(), *pinned + mem.len() as u64)?;
    let at = iova.alloc(mem.len(), dma::ARENA_ALIGN)?;
    // SAFETY: the memory is owned by the device (control arenas) or its pool (buffer arenas),
    // both of which outlive the mapping: the device unmaps every span in Drop before they go.
    unsafe { host.dma_map(mem.as_ptr(), mem.len(), at)? };
    *pinned += mem.len() as u64;
    Ok((mem, at))
}

impl<H: Host> NvmeDevice<H> {
    /// Brings up the controller behind `host` and opens namespace `nsid`.
    pub fn with_host(
        mut host: H,
        nsid: u32,
        opts: NvmeOptions,
    ) -> Result<NvmeDevice<H>, DeviceError> {
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
        if !IO_TIMEOUT_RANGE.contains(&opts.io_timeout) {
            return Err(err(format!(
                "NvmeOptions::io_timeout must be 1 ms to 1 hour, not {:?}",
                opts.io_timeout
            )));
        }
        let mut iova = IovaSpace::new(host.iova_ranges());
        let mut pinned = 0u64;
        let (mem, at) = map_memory(&mut host, &mut iova, &mut pinned, ADMIN_CONTROL_BYTES)
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
        ctrl.request_one_queue_pair()
            .map_err(|e| err(e.to_string()))?;

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
        let io_bytes = (usize::from(entries) * 64).next_multiple_of(page)
            + (usize::from(entries) * 16).next_multiple_of(page)
            + slot_count * page;
        let (mem, at) = map_memory(&mut ctrl.host, &mut iova, &mut pinned, io_bytes)
            .map_err(|e| err(e.to_string()))?;
        let mut io_mem = ControlArena::new(mem, at);
        let io = ctrl
            .create_io_queues(entries, &mut io_mem)
            .map_err(|e| err(e.to_string()))?;
        let (lists, lists_iova) = io_mem
            .carve(slot_count * page, page)
            .ok_or_else(|| err("out of control memory for PRP lists".into()))?;

        let pool = Arc::new(DmaPool::default());
        let (mem, at) = map_memory(&mut ctrl.host, &mut iova, &mut pinned, opts.arena_bytes)
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
        };
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
        Ok(NvmeDevice {
            info,
            details,
            nsid,
            lba_shift: fmt.lbads.into(),
            ctrl,
            io,
            spans: vec![admin_mem.span, io_mem.span, arena_span],
            buffer_spans: 1,
            iova,
            pinned,
            pool,
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
            prp_lists: lists.cast(),
            prp_lists_iova: lists_iova,
            command_bytes,
            queue_depth,
            in_flight: 0,
            empty_polls: 0,
            epochs: Epochs::new(opts.io_timeout),
            sample: None,
            failure: None,
            stopped: false,
            closed: false,
            opts,
            _admin_mem: admin_mem,
            _io_mem: io_mem,
        })
    }

    /// What the controller reported at open.
    pub fn details(&self) -> &NvmeDetails {
        &self.details
    }

    /// Whether the device stopped after a controller failure.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Shuts the controller down cleanly (delete the I/O queues, CC.SHN normal shutdown, which
    /// also writes back its cache) and unmaps the DMA memory. Dropping does the same but cannot
    /// report a failure.
    pub fn close(mut self) -> Result<(), DeviceError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), DeviceError> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        let label = format!("nvme:{} ns {}", self.details.pci, self.nsid);
        let mut result = Ok(());
        if !self.stopped {
            if let Err(e) = self.ctrl.shutdown(true) {
                result = Err(open_err(&label, format!("shutdown failed: {e}")));
                let _ = self.ctrl.disable();
                self.ctrl.stop_dma();
            }
        }
        // The controller no longer touches memory; buffers of unfinished I/Os may go back.
        for r in &mut self.requests {
            r.buffer = None;
        }
        for s in &self.spans {
            if let Err(e) = self.ctrl.host.dma_unmap(s.iova, s.len) {
                if result.is_ok() {
                    result = Err(open_err(&label, e.to_string()));
                }
            }
        }
        self.stopped = true;
        result
    }

    fn map_arena(&mut self, len: usize) -> Result<(), DeviceError> {
        let (mem, at) = map_memory(&mut self.ctrl.host, &mut self.iova, &mut self.pinned, len)
            .map_err(|e| DeviceError::Io {
                op: Op::Allocate,
                lba: 0,
                detail: e.to_string(),
            })?;
        self.spans.push(Span {
            vaddr: mem.as_ptr() as usize,
            iova: at,
            len: mem.len(),
        });
        self.buffer_spans += 1;
        self.pool.add_arena(mem, at);
        Ok(())
    }

    /// The device address of a buffer, if it lies in one of our buffer arenas.
    fn buffer_iova(&self, b: &IoBuffer) -> Option<u64> {
        let ptr = b.as_ptr() as usize;
        let spans = &self.spans[self.spans.len() - self.buffer_spans..];
        spans
            .iter()
            .find_map(|s| s.iova_of(ptr, b.capacity()))
            .filter(|&iova| iova == b.iova())
    }

    /// Queues a read without the capacity check, so a driver check can see the controller's own
    /// answer to blocks past the end (LBA Out of Range) and that the queue goes on working after
    /// an error completion. Everything else is checked as for `submit_read`.
    pub fn submit_read_unchecked(
        &mut self,
        tag: Tag,
        lba: u64,
        buffer: IoBuffer,
    ) -> Result<(), DeviceError> {
        self.submit_io(Op::Read, tag, lba, buffer, false)
    }

    fn submit_io(
        &mut self,
        op: Op,
        tag: Tag,
        lba: u64,
        buffer: IoBuffer,
        range_check: bool,
    ) -> Result<(), DeviceError> {
        if self.stopped {
            return Err(self.refusal(op, lba));
        }
        let len = buffer.len();
        match check_io(&self.info, op, lba, len) {
            // Reported only once the length and alignment checks passed.
            Err(DeviceError::OutOfRange { .. }) if !range_check => {}
            r => r?,
        }
        let Some(iova) = self.buffer_iova(&buffer) else {
            return Err(DeviceError::BadRequest {
                op,
                lba,
                len,
                why: "the buffer is not DMA memory of this device; allocate it with alloc_buffer",
            });
        };
        let parts = len.div_ceil(self.command_bytes);
        let Some(&r) = self.free_requests.last() else {
            return Err(DeviceError::QueueFull {
                op,
                lba,
                depth: self.in_flight,
            });
        };
        if self.free_slots.len() < parts {
            return Err(DeviceError::QueueFull {
                op,
                lba,
                depth: self.in_flight,
            });
        }
        let opcode = if op == Op::Write { io::WRITE } else { io::READ };
        let page = self.details.page_size;
        let tail = self.io.tail();
        for k in 0..parts {
            let off = k * self.command_bytes;
            let n = self.command_bytes.min(len - off);
            let part_lba = lba + (off >> self.lba_shift) as u64;
            let s = self.free_slots[self.free_slots.len() - 1 - k];
            // SAFETY: slot s owns PRP list page s of the control arena; the slot is free, so the
            // controller is not reading that page.
            let list = unsafe {
                std::slice::from_raw_parts_mut(
                    self.prp_lists.as_ptr().add(usize::from(s) * page / 8),
                    page / 8,
                )
            };
            let list_iova = self.prp_lists_iova + (usize::from(s) * page) as u64;
            let prps = match prp::build(iova + off as u64, n, page, list, list_iova) {
                Ok(p) => p,
                Err(_) => {
                    self.io.rewind(tail);
                    return Err(DeviceError::BadRequest {
                        op,
                        lba,
                        len,
                        why: "the buffer cannot be described with PRPs",
                    });
                }
            };
            let blocks = (n >> self.lba_shift) as u32;
            let sqe = Sqe::read_write(opcode, self.nsid, part_lba, blocks, prps.prp1, prps.prp2);
            self.io.push(&sqe.with_cid(s));
            self.slots[usize::from(s)] = Slot {
                request: r,
                lba: part_lba,
                opcode,
                busy: true,
                epoch: self.epochs.stamp(),
            };
        }
        self.free_slots.truncate(self.free_slots.len() - parts);
        self.free_requests.pop();
        self.requests[usize::from(r)] = Request {
            tag,
            op,
            lba,
            buffer: Some(buffer),
            parts: parts as u32,
            active: true,
            error: None,
        };
        self.in_flight += 1;
        Ok(())
    }

    /// Why a submit is refused once the device has stopped.
    fn refusal(&self, op: Op, lba: u64) -> DeviceError {
        match &self.failure {
            Some(e) => DeviceError::Failed {
                op,
                lba,
                reason: Box::new(e.clone()),
            },
            None => DeviceError::Stopped { op, lba },
        }
    }

    /// Stops the device after the controller failed: disables it (so it can no longer complete
    /// anything, late or not), turns off its DMA and fails every I/O in flight with the error
    /// `error(request index, op, lba)` gives, handing the buffers back.
    fn fail_all(
        &mut self,
        out: &mut Vec<Completion>,
        error: impl Fn(usize, Op, u64) -> DeviceError,
    ) -> usize {
        self.stopped = true;
        let _ = self.ctrl.disable();
        self.ctrl.stop_dma();
        let mut n = 0;
        for (i, r) in self.requests.iter_mut().enumerate() {
            if !r.active {
                continue;
            }
            r.active = false;
            out.push(Completion {
                tag: r.tag,
                op: r.op,
                lba: r.lba,
                buffer: r.buffer.take(),
                result: Err(error(i, r.op, r.lba)),
            });
            self.free_requests.push(i as u16);
            n += 1;
        }
        for (i, s) in self.slots.iter_mut().enumerate() {
            if s.busy {
                s.busy = false;
                self.free_slots.push(i as u16);
            }
        }
        self.in_flight = 0;
        n
    }

    fn check_fatal(&mut self, out: &mut Vec<Completion>) -> usize {
        match self.ctrl.fatal_status() {
            None => 0,
            Some(csts) => {
                let detail = format!(
                    "the NVMe controller {} reported a fatal status (CSTS={csts:#x}, CFS set or \
                     device gone); the device is stopped: reset the controller (rebind or reboot) \
                     before recovery and check its health",
                    self.details.pci
                );
                self.fail_all(out, |_, op, lba| io_error(op, lba, &detail))
            }
        }
    }

    /// Takes a clock reading (made after `CLOCK_EVERY` empty polls) and fails the device when
    /// the oldest command in flight has exceeded the I/O timeout.
    fn check_timeout(&mut self, now: Instant, out: &mut Vec<Completion>) -> Option<DeviceError> {
        self.epochs.observe(now);
        if !self.epochs.may_have_expired(now) {
            return None;
        }
        // The hint may be stale (its command completed): find the true oldest.
        let oldest = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.busy)
            .min_by_key(|(_, s)| s.epoch)
            .map(|(cid, s)| (cid, *s));
        self.epochs.set_oldest(oldest.map(|(_, s)| s.epoch));
        let (cid, slot) = oldest?;
        let waited = self.epochs.age(slot.epoch, now);
        if waited < self.epochs.timeout() {
            return None;
        }
        let cid = cid as u16;
        let abort = match self
            .ctrl
            .abort(IO_QID, cid, self.epochs.timeout().min(ABORT_WAIT))
        {
            Ok(true) => "an Abort was sent and the controller aborted the command".to_string(),
            Ok(false) => "an Abort was sent but the controller did not abort the command".into(),
            Err(e) => format!("the Abort sent for it failed: {e}"),
        };
        let request = usize::from(slot.request);
        let error = DeviceError::CommandTimeout {
            op: self.requests[request].op,
            lba: slot.lba,
            opcode: slot.opcode,
            cid,
            qid: IO_QID,
            waited_ms: waited.as_millis() as u64,
            timeout_ms: self.epochs.timeout().as_millis() as u64,
            abort,
        };
        self.fail_all(out, |i, op, lba| {
            if i == request {
                error.clone()
            } else {
                DeviceError::Failed {
                    op,
                    lba,
                    reason: Box::new(error.clone()),
                }
            }
        });
        self.failure = Some(error.clone());
        Some(error)
    }
}

fn io_error(op: Op, lba: u64, detail: &str) -> DeviceError {
    DeviceError::Io {
        op,
        lba,
        detail: detail.to_string(),
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

impl<H: Host> BlockDevice for NvmeDevice<H> {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// A zeroed buffer from the DMA arenas, page aligned, of a power-of-two capacity; maps another
    /// arena (up to `NvmeOptions::max_arenas`) when they are full.
    fn alloc_buffer(&mut self, len: usize) -> Result<IoBuffer, DeviceError> {
        if len == 0 {
            return Err(DeviceError::BadRequest {
                op: Op::Allocate,
                lba: 0,
                len,
                why: "a buffer of zero bytes",
            });
        }
        loop {
            if let Some(b) = self.pool.alloc(len)? {
                return Ok(b);
            }
            if self.buffer_spans >= self.opts.max_arenas {
                return Err(DeviceError::BadRequest {
                    op: Op::Allocate,
                    lba: 0,
                    len,
                    why: "the DMA arenas are full; raise NvmeOptions::arena_bytes or max_arenas",
                });
            }
            let size = dma::class_size(len).map_or(len, |(_, s)| s);
            self.map_arena(self.opts.arena_bytes.max(size))?;
        }
    }

    fn queue_depth(&self) -> usize {
        self.queue_depth
    }

    fn submit_write(&mut self, tag: Tag, lba: u64, buffer: IoBuffer) -> Result<(), DeviceError> {
        self.submit_io(Op::Write, tag, lba, buffer, true)
    }

    fn submit_read(&mut self, tag: Tag, lba: u64, buffer: IoBuffer) -> Result<(), DeviceError> {
        self.submit_io(Op::Read, tag, lba, buffer, true)
    }

    /// Queues an NVMe Flush. The controller learns of it at the next `poll`, after every write
    /// whose completion was delivered before this call had completed, so the Flush covers them.
    fn submit_flush(&mut self, tag: Tag) -> Result<(), DeviceError> {
        if self.stopped {
            return Err(self.refusal(Op::Flush, 0));
        }
        let (Some(&r), Some(&s)) = (self.free_requests.last(), self.free_slots.last()) else {
            return Err(DeviceError::QueueFull {
                op: Op::Flush,
                lba: 0,
                depth: self.in_flight,
            });
        };
        self.free_requests.pop();
        self.free_slots.pop();
        self.io.push(&Sqe::flush(self.nsid).with_cid(s));
        self.slots[usize::from(s)] = Slot {
            request: r,
            lba: 0,
            opcode: io::FLUSH,
            busy: true,
            epoch: self.epochs.stamp(),
        };
        self.requests[usize::from(r)] = Request {
            tag,
            op: Op::Flush,
            lba: 0,
            buffer: None,
            parts: 1,
            active: true,
            error: None,
        };
        self.in_flight += 1;
        Ok(())
    }

    /// After a command timed out, every call returns that [`DeviceError::CommandTimeout`] (the
    /// call that found it also hands back every I/O in flight, failed); nothing more is reaped,
    /// so a late completion of the command is never reported.
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, DeviceError> {
        if let Some(e) = &self.failure {
            return Err(e.clone());
        }
        if self.stopped {
            return Ok(0);
        }
        self.io.ring_submissions(&self.ctrl.host);
        let mut delivered = 0;
        let mut reaped = 0;
        while let Some(cqe) = self.io.pop() {
            reaped += 1;
            let cid = usize::from(cqe.cid);
            let Some(slot) = self.slots.get(cid).copied().filter(|s| s.busy) else {
                self.io.ring_completions(&self.ctrl.host);
                let detail = format!(
                    "the NVMe controller {} completed command id {cid}, which is not in flight; \
                     the device is stopped",
                    self.details.pci
                );
                return Ok(delivered + self.fail_all(out, |_, op, lba| io_error(op, lba, &detail)));
            };
            self.slots[cid].busy = false;
            self.free_slots.push(cid as u16);
            let status = Status::from_field(cqe.status_field());
            let ri = usize::from(slot.request);
            let req = &mut self.requests[ri];
            if !status.is_success() && req.error.is_none() {
                req.error = Some(status.to_error(req.op, slot.lba, slot.opcode));
            }
            req.parts -= 1;
            if req.parts == 0 {
                req.active = false;
                out.push(Completion {
                    tag: req.tag,
                    op: req.op,
                    lba: req.lba,
                    buffer: req.buffer.take(),
                    result: req.error.take().map_or(Ok(()), Err),
                });
                self.free_requests.push(slot.request);
                self.in_flight -= 1;
                delivered += 1;
            }
        }
        self.io.ring_completions(&self.ctrl.host);
        if reaped == 0 && self.in_flight > 0 {
            self.empty_polls = self.empty_polls.wrapping_add(1);
            // CSTS is an MMIO read, slow on real hardware, and the clock may be a system call:
            // look only once the controller has kept us waiting a while, never per I/O.
            if self.empty_polls.is_multiple_of(CLOCK_EVERY) {
                delivered += self.check_fatal(out);
                if !self.stopped {
                    let now = self.ctrl.host.now();
                    self.sample = Some(now);
                    if let Some(e) = self.check_timeout(now, out) {
                        return Err(e);
                    }
                }
            }
        } else {
            self.empty_polls = 0;
        }
        Ok(delivered)
    }

    /// Spins on `poll` until something completes or `timeout` passes; returns at once when
    /// nothing is in flight. The clock is read by `poll` after `CLOCK_EVERY` empty polls in a row
    /// and then every `CLOCK_EVERY`, so a wait that the controller answers promptly reads it
    /// never (in a guest whose clocksource is HPET each read is a system call); the timeout counts
    /// from the first read. Those readings also age the commands in flight: a command older than
    /// `NvmeOptions::io_timeout` fails the wait with [`DeviceError::CommandTimeout`].
    fn wait(&mut self, out: &mut Vec<Completion>, timeout: Duration) -> Result<usize, DeviceError> {
        let mut start = None;
        self.sample = None;
        loop {
            let n = self.poll(out)?;
            if n > 0 || self.in_flight == 0 {
                return Ok(n);
            }
            if let Some(now) = self.sample.take() {
                if now.duration_since(*start.get_or_insert(now)) >= timeout {
                    return Ok(0);
                }
            }
            std::hint::spin_loop();
        }
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

impl<H: Host> Drop for NvmeDevice<H> {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

impl<H: Host> std::fmt::Debug for NvmeDevice<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmeDevice")
            .field("info", &self.info)
            .field("queue_depth", &self.queue_depth)
            .field("in_flight", &self.in_flight)
            .field("stopped", &self.stopped)
            .finish()
    }
}
