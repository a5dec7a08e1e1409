//! A software model of an NVMe controller behind the [`Host`] seam, for tests without hardware.
//!
//! It keeps BAR0 registers, reacts to CC writes (enable, disable, shutdown) and doorbells, reads
//! submission entries out of the driver's DMA memory by IOVA (through the mappings the driver made
//! with `dma_map`), executes admin commands and Write/Read/Flush against an in-memory namespace,
//! walks PRP1/PRP2/PRP lists on its own, and posts completion entries with phase tags. Commands run
//! synchronously when their doorbell is written, as far as the completion queue has room.
//! Faults are injected through a [`FakeHandle`]. Steady-state I/O allocates nothing.
//!
//! Ordering, the device side of [`super::barrier`]: submission entries are read inside
//! [`Host::write32`] of the doorbell, on the thread that wrote them, so it sees them in program
//! order. Completions may be posted from another thread (a [`FakeHandle`] releasing held or
//! stalled commands while the driver polls), so an entry is posted as a controller posts it: the
//! body first, then the status word with the phase tag in one Release store, which pairs with the
//! driver's `after_phase_tag` (at least an Acquire fence on every target the driver builds for).

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::command::{admin, io, Cqe, Sqe};
use super::regs::{self, cc, csts};
use super::status::Status;
use super::sys::{Host, HostError, IovaRange, Memlock};

mod handle;
mod host;

/// What the software controller looks like.
#[derive(Debug, Clone)]
pub struct FakeConfig {
    /// Maximum queue entries, 0's based (CAP.MQES).
    pub mqes: u16,
    /// CAP.TO in 500 ms units.
    pub timeout_units: u8,
    pub dstrd: u8,
    /// MDTS as a power of two of 4 KiB pages; 0 = no limit.
    pub mdts: u8,
    pub nn: u32,
    pub nsid: u32,
    pub blocks: u64,
    /// Block size as a power of two.
    pub lbads: u8,
    /// Metadata bytes per block of the active format.
    pub ms: u16,
    pub vwc_present: bool,
    pub write_cache_enabled: bool,
    /// Byte 0 of the SMART log page the fake reports.
    pub critical_warning: u8,
    pub awupf: u16,
    pub serial: String,
    pub model: String,
    pub firmware: String,
    pub iova_ranges: Vec<IovaRange>,
    pub memlock: Memlock,
    pub bar_len: usize,
    /// CSTS.RDY never comes up after enabling.
    pub never_ready: bool,
    /// The controller starts enabled and ready, as another driver left it.
    pub start_enabled: bool,
    /// I/O queue pairs the controller grants at most (Set Features Number of Queues answers
    /// with the smaller of this and what was asked).
    pub io_queues: u16,
    /// Time the controller's work on every register write (`FakeStats::controller_ns`), so that
    /// a benchmark can tell the driver's cost from the software controller's.
    pub timed: bool,
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            mqes: 0x7FF,
            timeout_units: 1,
            dstrd: 0,
            mdts: 5,
            nn: 1,
            nsid: 1,
            blocks: 16384,
            lbads: 12,
            ms: 0,
            vwc_present: true,
            write_cache_enabled: true,
            critical_warning: 0,
            awupf: 0,
            serial: "FAKE-0001".into(),
            model: "nvmq fake controller".into(),
            firmware: "1.0".into(),
            iova_ranges: vec![IovaRange {
                start: 0,
                end: (1 << 39) - 1,
            }],
            memlock: Memlock {
                limit: None,
                privileged: false,
            },
            bar_len: 0x4000,
            never_ready: false,
            start_enabled: false,
            io_queues: 4,
            timed: false,
        }
    }
}

/// What the controller saw, for assertions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FakeStats {
    pub sq_doorbells: u64,
    pub cq_doorbells: u64,
    pub writes: u64,
    pub reads: u64,
    pub flushes: u64,
    pub admin_commands: u64,
    /// Commands whose PRP2 pointed at a PRP list.
    pub prp_list_commands: u64,
    /// Largest transfer of one command, in bytes.
    pub max_command_bytes: u64,
    pub enables: u64,
    pub disables: u64,
    pub shutdowns: u64,
    /// AQA/ASQ/ACQ were written while the controller was enabled (the spec forbids it).
    pub admin_regs_written_while_enabled: bool,
    /// Admin opcodes in the order they ran (with the CNS for Identify in the high byte).
    pub admin_log: Vec<u16>,
    pub bus_master: bool,
    pub dma_maps: u64,
    pub mapped_bytes: u64,
    /// Set Features Number of Queues was seen before any I/O queue was created.
    pub queues_requested: bool,
    /// I/O queue pairs the last Set Features Number of Queues granted.
    pub queues_granted: u16,
    /// I/O commands taken off each submission queue, by queue id (index 0, the admin queue,
    /// stays 0).
    pub commands_per_queue: Vec<u64>,
    /// Calls of [`Host::now`]: each one is a system call on a guest whose clocksource is HPET.
    pub clock_reads: u64,
    /// (SQID, CID) of every Abort command, in order.
    pub aborts: Vec<(u16, u16)>,
    /// With `FakeConfig::timed`: nanoseconds spent in register writes (taking the lock, and
    /// for a doorbell running the commands and posting their completions), clock reads included.
    pub controller_ns: u64,
}

#[derive(Clone, Copy, Default)]
struct Sq {
    base: u64,
    entries: u16,
    head: u16,
    tail: u16,
    cqid: u16,
}

#[derive(Clone, Copy, Default)]
struct Cq {
    base: u64,
    entries: u16,
    tail: u16,
    head: u16,
    phase: bool,
    /// Entries executed but held back by `hold_completions` or stalled.
    held: u16,
}

#[derive(Clone, Copy)]
struct Map {
    iova: u64,
    vaddr: usize,
    len: usize,
}

struct State {
    cfg: FakeConfig,
    cc: u32,
    csts: u32,
    aqa: u32,
    asq: u64,
    acq: u64,
    pci_command: u16,
    maps: Vec<Map>,
    /// Indexed by queue id: the admin queue, then `FakeConfig::io_queues` I/O queues.
    sqs: Vec<Option<Sq>>,
    cqs: Vec<Option<Cq>>,
    /// I/O queue pairs the host may create: what Set Features Number of Queues granted, or all
    /// of them if it was never sent.
    allocated: u16,
    /// The next Create I/O Completion Queue fails (see `FakeHandle::fail_next_queue_creation`).
    fail_create: bool,
    media: Vec<u8>,
    hold: bool,
    held: Vec<(u16, Cqe)>,
    /// I/O commands with this opcode are stalled.
    stall_opcode: Option<u8>,
    /// The I/O command after this many more is stalled.
    stall_countdown: Option<u64>,
    /// Completions of stalled commands: never posted unless aborted or released.
    stalled: Vec<(u16, Cqe)>,
    ignore_aborts: bool,
    fail_next: Option<(u8, u16)>,
    fail_dma_map: bool,
    stats: FakeStats,
    log: Option<Vec<(u8, u64, u32)>>,
}

/// The [`Host`] side of the software controller; give it to `NvmeDevice::with_host`.
pub struct FakeHost {
    name: String,
    timed: bool,
    ranges: Vec<IovaRange>,
    memlock: Memlock,
    bar_len: usize,
    state: Arc<Mutex<State>>,
}

/// The test's side: fault injection and inspection.
#[derive(Clone)]
pub struct FakeHandle {
    state: Arc<Mutex<State>>,
}

/// A software controller: its host side and a handle for the test.
pub fn controller(cfg: FakeConfig) -> (FakeHost, FakeHandle) {
    let media = vec![0u8; (cfg.blocks as usize) << cfg.lbads];
    let (cc, csts) = if cfg.start_enabled {
        (cc::EN, csts::RDY)
    } else {
        (0, 0)
    };
    let state = Arc::new(Mutex::new(State {
        cc,
        csts,
        aqa: 0,
        asq: 0,
        acq: 0,
        pci_command: 0,
        maps: Vec::with_capacity(16),
        sqs: vec![None; usize::from(cfg.io_queues) + 1],
        cqs: vec![None; usize::from(cfg.io_queues) + 1],
        allocated: cfg.io_queues,
        fail_create: false,
        media,
        hold: false,
        held: Vec::with_capacity(usize::from(cfg.mqes) + 1),
        stall_opcode: None,
        stall_countdown: None,
        stalled: Vec::with_capacity(16),
        ignore_aborts: false,
        fail_next: None,
        fail_dma_map: false,
        stats: FakeStats {
            commands_per_queue: vec![0; usize::from(cfg.io_queues) + 1],
            ..FakeStats::default()
        },
        log: None,
        cfg: cfg.clone(),
    }));
    (
        FakeHost {
            name: "fake:0000:00:04.0".into(),
            timed: cfg.timed,
            ranges: cfg.iova_ranges.clone(),
            memlock: cfg.memlock,
            bar_len: cfg.bar_len,
            state: Arc::clone(&state),
        },
        FakeHandle { state },
    )
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    fn unhold(&mut self, cqid: u16) {
        if let Some(cq) = self.cqs[usize::from(cqid)].as_mut() {
            cq.held -= 1;
        }
    }

    /// Whether the I/O command `sqe` is to be stalled.
    fn stalls(&mut self, sqe: &Sqe) -> bool {
        let nth = match self.stall_countdown {
            Some(0) => {
                self.stall_countdown = None;
                true
            }
            Some(n) => {
                self.stall_countdown = Some(n - 1);
                false
            }
            None => false,
        };
        nth || self.stall_opcode == Some(sqe.opcode())
    }

    /// Abort (admin 08h): a stalled command it names completes with "abort requested".
    fn abort(&mut self, sqe: &Sqe) -> (u16, u32) {
        let (sqid, cid) = (sqe.cdw10 as u16, (sqe.cdw10 >> 16) as u16);
        self.stats.aborts.push((sqid, cid));
        let found = self
            .stalled
            .iter()
            .position(|(_, c)| c.sq_id == sqid && c.cid == cid);
        match found {
            Some(i) if !self.ignore_aborts => {
                let (cqid, mut cqe) = self.stalled.swap_remove(i);
                cqe.status = Status::field(0, 0x07, false) << 1;
                self.unhold(cqid);
                self.post(cqid, cqe);
                (0, 0)
            }
            _ => (0, 1),
        }
    }

    /// An I/O queue id the host may use: 1 up to what was allocated.
    fn io_qid(&self, qid: u16) -> bool {
        qid != 0 && qid <= self.allocated && usize::from(qid) < self.sqs.len()
    }

    fn page_size(&self) -> usize {
        1 << (12 + (self.cc >> 7 & 0xF))
    }

    fn lbs(&self) -> usize {
        1 << self.cfg.lbads
    }

    fn write_reg(&mut self, offset: usize, value: u32) {
        if (regs::AQA..regs::ACQ + 8).contains(&offset) && self.cc & cc::EN != 0 {
            self.stats.admin_regs_written_while_enabled = true;
        }
        match offset {
            regs::CC => self.write_cc(value),
            regs::AQA => self.aqa = value,
            o if o == regs::ASQ => self.asq = (self.asq & !0xFFFF_FFFF) | u64::from(value),
            o if o == regs::ASQ + 4 => self.asq = (self.asq & 0xFFFF_FFFF) | u64::from(value) << 32,
            o if o == regs::ACQ => self.acq = (self.acq & !0xFFFF_FFFF) | u64::from(value),
            o if o == regs::ACQ + 4 => self.acq = (self.acq & 0xFFFF_FFFF) | u64::from(value) << 32,
            o if o >= regs::DOORBELLS => self.doorbell(o, value),
            _ => {}
        }
    }

    fn write_cc(&mut self, value: u32) {
        let was = self.cc;
        self.cc = value;
        if was & cc::EN == 0 && value & cc::EN != 0 {
            self.stats.enables += 1;
            let sq_entries = (self.aqa & 0xFFF) as u16 + 1;
            let cq_entries = (self.aqa >> 16 & 0xFFF) as u16 + 1;
            self.sqs.fill(None);
            self.cqs.fill(None);
            self.sqs[0] = Some(Sq {
                base: self.asq,
                entries: sq_entries,
                ..Sq::default()
            });
            self.cqs[0] = Some(Cq {
                base: self.acq,
                entries: cq_entries,
                phase: true,
                ..Cq::default()
            });
            self.allocated = self.cfg.io_queues;
            self.held.clear();
            self.stalled.clear();
            if !self.cfg.never_ready {
                self.csts |= csts::RDY;
            }
        }
        if was & cc::EN != 0 && value & cc::EN == 0 {
            self.stats.disables += 1;
            self.sqs.fill(None);
            self.cqs.fill(None);
            self.held.clear();
            self.stalled.clear();
            self.csts &= !(csts::RDY | csts::SHST_MASK);
        }
        if value & cc::SHN_MASK != 0 && was & cc::SHN_MASK == 0 {
            self.stats.shutdowns += 1;
            self.csts = (self.csts & !csts::SHST_MASK) | csts::SHST_COMPLETE;
        }
    }

    fn doorbell(&mut self, offset: usize, value: u32) {
        let stride = 4usize << self.cfg.dstrd;
        let index = (offset - regs::DOORBELLS) / stride;
        let qid = index / 2;
        if qid >= self.sqs.len() {
            return;
        }
        if index.is_multiple_of(2) {
            self.stats.sq_doorbells += 1;
            if let Some(sq) = self.sqs[qid].as_mut() {
                sq.tail = value as u16 % sq.entries;
            }
        } else {
            self.stats.cq_doorbells += 1;
            if let Some(cq) = self.cqs[qid].as_mut() {
                cq.head = value as u16 % cq.entries;
            }
        }
        // Like a controller with its own agent, it serves every queue whichever doorbell rang:
        // completions land in another thread's completion queue (see the module doc).
        for q in 0..self.sqs.len() {
            self.run(q);
        }
    }

    /// Executes what is in submission queue `qid` while its completion queue has room.
    fn run(&mut self, qid: usize) {
        if self.csts & csts::CFS != 0 || self.cc & cc::EN == 0 {
            return;
        }
        loop {
            let Some(sq) = self.sqs[qid] else { return };
            let Some(cq) = self.cqs[usize::from(sq.cqid)] else {
                return;
            };
            let used = (cq.tail + cq.entries - cq.head) % cq.entries + cq.held;
            if sq.head == sq.tail || used + 1 >= cq.entries {
                return;
            }
            let mut raw = [0u8; 64];
            // No barrier: we run inside the doorbell's write32, after the driver's stores to the
            // entry in program order and under the state lock (see the module doc).
            if !self.read_dma(sq.base + u64::from(sq.head) * 64, &mut raw) {
                // The driver gave a queue address it never mapped: a real device would fault.
                self.csts |= csts::CFS;
                return;
            }
            // SAFETY: Sqe is repr(C) of plain integers, 64 bytes; any bit pattern is valid.
            let sqe: Sqe = unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) };
            let head = (sq.head + 1) % sq.entries;
            if let Some(s) = self.sqs[qid].as_mut() {
                s.head = head;
            }
            let (status, dw0) = if qid == 0 {
                self.stats.admin_commands += 1;
                let cns = if sqe.opcode() == admin::IDENTIFY {
                    sqe.cdw10 & 0xFF
                } else {
                    0
                };
                self.stats
                    .admin_log
                    .push(u16::from(sqe.opcode()) | (cns as u16) << 8);
                self.admin(&sqe)
            } else {
                self.stats.commands_per_queue[qid] += 1;
                self.io(&sqe)
            };
            let cqe = Cqe {
                dw0,
                dw1: 0,
                sq_head: head,
                sq_id: qid as u16,
                cid: sqe.cid(),
                status: status << 1,
            };
            let cqid = sq.cqid;
            let stall = qid != 0 && self.stalls(&sqe);
            if stall || (self.hold && qid != 0) {
                if let Some(c) = self.cqs[usize::from(cqid)].as_mut() {
                    c.held += 1;
                }
                if stall {
                    self.stalled.push((cqid, cqe));
                } else {
                    self.held.push((cqid, cqe));
                }
            } else {
                self.post(cqid, cqe);
            }
        }
    }

    fn post(&mut self, cqid: u16, mut cqe: Cqe) {
        let Some(cq) = self.cqs[usize::from(cqid)] else {
            return;
        };
        cqe.status = (cqe.status & !1) | u16::from(cq.phase);
        if !self.publish_cqe(cq.base + u64::from(cq.tail) * 16, &cqe) {
            self.csts |= csts::CFS;
            return;
        }
        if let Some(c) = self.cqs[usize::from(cqid)].as_mut() {
            c.tail = (c.tail + 1) % c.entries;
            if c.tail == 0 {
                c.phase = !c.phase;
            }
        }
    }

    /// Writes a completion entry the way a controller must: its phase tag (in the status word)
    /// becomes visible only after the rest of the entry and everything the command wrote. False
    /// when the driver never mapped the slot (or misaligned it): a real device would fault.
    fn publish_cqe(&self, iova: u64, cqe: &Cqe) -> bool {
        let Some(p) = self.translate(iova, 16) else {
            return false;
        };
        if !(p as usize).is_multiple_of(2) {
            return false;
        }
        let bytes = as_bytes(cqe);
        // SAFETY: as in read_dma; translate checked the 16 bytes lie inside one mapping.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, 14) };
        // SAFETY: bytes 14..16 of the entry lie inside the mapping (above) and are 2-byte aligned
        // (checked); the mapping outlives this call (dma_map's contract), and the driver only
        // ever reads this word.
        let status = unsafe { AtomicU16::from_ptr(p.add(14).cast::<u16>()) };
        status.store(cqe.status, Ordering::Release);
        true
    }

    fn admin(&mut self, sqe: &Sqe) -> (u16, u32) {
        let ok = (0, 0);
        let invalid_field = (Status::field(0, 0x02, true), 0);
        match sqe.opcode() {
            admin::IDENTIFY => {
                let mut d = [0u8; 4096];
                match sqe.cdw10 & 0xFF {
                    0x01 => self.controller_data(&mut d),
                    0x00 => {
                        if sqe.nsid == 0 || sqe.nsid > self.cfg.nn {
                            return (Status::field(0, 0x0B, true), 0);
                        }
                        if sqe.nsid == self.cfg.nsid {
                            self.namespace_data(&mut d);
                        }
                    }
                    _ => return invalid_field,
                }
                if !self.write_dma(sqe.prp1, &d) {
                    return (Status::field(0, 0x04, true), 0);
                }
                ok
            }
            admin::GET_LOG_PAGE if sqe.cdw10 & 0xFF == 0x02 => {
                let mut page = [0u8; 512];
                page[0] = self.cfg.critical_warning;
                page[1..3].copy_from_slice(&300u16.to_le_bytes());
                page[3] = 100;
                if !self.write_dma(sqe.prp1, &page) {
                    return (Status::field(0, 0x04, true), 0);
                }
                ok
            }
            admin::GET_FEATURES => match sqe.cdw10 & 0xFF {
                0x06 if self.cfg.vwc_present => (0, u32::from(self.cfg.write_cache_enabled)),
                _ => invalid_field,
            },
            admin::SET_FEATURES => match sqe.cdw10 & 0xFF {
                0x07 => {
                    let exists = self.sqs[1..].iter().any(Option::is_some)
                        || self.cqs[1..].iter().any(Option::is_some);
                    if exists {
                        return (Status::field(0, 0x0C, true), 0);
                    }
                    // NSQR and NCQR, 0's based; 0xFFFF is invalid.
                    let (nsqr, ncqr) = (sqe.cdw11 as u16, (sqe.cdw11 >> 16) as u16);
                    if nsqr == u16::MAX || ncqr == u16::MAX {
                        return invalid_field;
                    }
                    let granted = (nsqr.min(ncqr) + 1).min(self.cfg.io_queues);
                    self.allocated = granted;
                    self.stats.queues_requested = true;
                    self.stats.queues_granted = granted;
                    let g = u32::from(granted - 1);
                    (0, g << 16 | g)
                }
                0x06 if self.cfg.vwc_present => {
                    self.cfg.write_cache_enabled = sqe.cdw11 & 1 == 1;
                    ok
                }
                _ => invalid_field,
            },
            admin::CREATE_IO_CQ => {
                let (qid, entries) = (sqe.cdw10 as u16, (sqe.cdw10 >> 16) as u16 + 1);
                if std::mem::take(&mut self.fail_create) {
                    return (Status::field(0, 0x06, false), 0);
                }
                if !self.io_qid(qid) || self.cqs[usize::from(qid)].is_some() {
                    return (Status::field(1, 0x01, true), 0);
                }
                if entries < 2 || entries > self.cfg.mqes + 1 || sqe.cdw11 & 1 == 0 {
                    return (Status::field(1, 0x02, true), 0);
                }
                self.cqs[usize::from(qid)] = Some(Cq {
                    base: sqe.prp1,
                    entries,
                    phase: true,
                    ..Cq::default()
                });
                ok
            }
            admin::CREATE_IO_SQ => {
                let (qid, entries) = (sqe.cdw10 as u16, (sqe.cdw10 >> 16) as u16 + 1);
                let cqid = (sqe.cdw11 >> 16) as u16;
                if !self.io_qid(qid) || self.sqs[usize::from(qid)].is_some() {
                    return (Status::field(1, 0x01, true), 0);
                }
                if !self.io_qid(cqid) || self.cqs[usize::from(cqid)].is_none() {
                    return (Status::field(1, 0x00, true), 0);
                }
                if entries < 2 || entries > self.cfg.mqes + 1 {
                    return (Status::field(1, 0x02, true), 0);
                }
                self.sqs[usize::from(qid)] = Some(Sq {
                    base: sqe.prp1,
                    entries,
                    cqid,
                    ..Sq::default()
                });
                ok
            }
            admin::ABORT => self.abort(sqe),
            admin::DELETE_IO_SQ => {
                let qid = usize::from(sqe.cdw10 as u16);
                match self.sqs.get_mut(qid).filter(|q| qid != 0 && q.is_some()) {
                    Some(q) => {
                        *q = None;
                        ok
                    }
                    None => (Status::field(1, 0x01, true), 0),
                }
            }
            admin::DELETE_IO_CQ => {
                let qid = usize::from(sqe.cdw10 as u16);
                match self.cqs.get_mut(qid).filter(|q| qid != 0 && q.is_some()) {
                    Some(q) => {
                        *q = None;
                        ok
                    }
                    None => (Status::field(1, 0x01, true), 0),
                }
            }
            _ => (Status::field(0, 0x01, true), 0),
        }
    }

    fn controller_data(&self, d: &mut [u8; 4096]) {
        d[0..2].copy_from_slice(&0x1b36u16.to_le_bytes());
        pad(&mut d[4..24], &self.cfg.serial);
        pad(&mut d[24..64], &self.cfg.model);
        pad(&mut d[64..72], &self.cfg.firmware);
        d[77] = self.cfg.mdts;
        d[512] = 0x66;
        d[513] = 0x44;
        d[516..520].copy_from_slice(&self.cfg.nn.to_le_bytes());
        d[525] = if self.cfg.vwc_present { 0x07 } else { 0x00 };
        d[528..530].copy_from_slice(&self.cfg.awupf.to_le_bytes());
    }

    fn namespace_data(&self, d: &mut [u8; 4096]) {
        for at in [0, 8, 16] {
            d[at..at + 8].copy_from_slice(&self.cfg.blocks.to_le_bytes());
        }
        // Two formats: 512 B without metadata, and the configured one, which is active.
        d[25] = 1;
        d[26] = 1;
        d[128..132].copy_from_slice(&(9u32 << 16).to_le_bytes());
        let f = u32::from(self.cfg.lbads) << 16 | u32::from(self.cfg.ms);
        d[132..136].copy_from_slice(&f.to_le_bytes());
    }

    fn io(&mut self, sqe: &Sqe) -> (u16, u32) {
        if let Some((op, status)) = self.fail_next {
            if op == sqe.opcode() {
                self.fail_next = None;
                return (status, 0);
            }
        }
        if sqe.nsid != self.cfg.nsid {
            return (Status::field(0, 0x0B, true), 0);
        }
        match sqe.opcode() {
            io::FLUSH => {
                self.stats.flushes += 1;
                (0, 0)
            }
            op @ (io::WRITE | io::READ) => {
                let (slba, blocks) = (sqe.slba(), sqe.blocks());
                if let Some(log) = self.log.as_mut() {
                    log.push((op, slba, blocks));
                }
                let len = blocks as usize * self.lbs();
                let mdts = (self.cfg.mdts != 0).then(|| 4096usize << self.cfg.mdts);
                if mdts.is_some_and(|m| len > m) {
                    return (Status::field(0, 0x02, true), 0);
                }
                if slba
                    .checked_add(u64::from(blocks))
                    .is_none_or(|end| end > self.cfg.blocks)
                {
                    return (Status::field(0, 0x80, true), 0);
                }
                self.stats.max_command_bytes = self.stats.max_command_bytes.max(len as u64);
                if op == io::WRITE {
                    self.stats.writes += 1;
                } else {
                    self.stats.reads += 1;
                }
                match self.transfer(sqe, slba as usize * self.lbs(), len, op == io::WRITE) {
                    Ok(()) => (0, 0),
                    Err(status) => (status, 0),
                }
            }
            _ => (Status::field(0, 0x01, true), 0),
        }
    }

    /// Moves `len` bytes between the namespace at `at` and the memory the PRPs describe.
    fn transfer(&mut self, sqe: &Sqe, at: usize, len: usize, write: bool) -> Result<(), u16> {
        let page = self.page_size();
        let bad_offset = Status::field(0, 0x13, true);
        let transfer_error = Status::field(0, 0x04, true);
        let mut done = 0usize;
        let mut segment = |state: &mut State, iova: u64, n: usize| -> Result<(), u16> {
            let Some(p) = state.translate(iova, n) else {
                return Err(transfer_error);
            };
            let media = &mut state.media[at + done..at + done + n];
            // SAFETY: as in read_dma: a mapped range of n bytes that the driver keeps allocated.
            unsafe {
                if write {
                    std::ptr::copy_nonoverlapping(p, media.as_mut_ptr(), n);
                } else {
                    std::ptr::copy_nonoverlapping(media.as_ptr(), p, n);
                }
            }
            done += n;
            Ok(())
        };
        if !sqe.prp1.is_multiple_of(4) {
            return Err(bad_offset);
        }
        let first = len.min(page - (sqe.prp1 as usize % page));
        segment(self, sqe.prp1, first)?;
        let mut rest = len - first;
        if rest == 0 {
            return Ok(());
        }
        if rest <= page {
            if !(sqe.prp2 as usize).is_multiple_of(page) {
                return Err(bad_offset);
            }
            return segment(self, sqe.prp2, rest);
        }
        self.stats.prp_list_commands += 1;
        if !sqe.prp2.is_multiple_of(8) {
            return Err(bad_offset);
        }
        let per_page = page / 8;
        let mut list = sqe.prp2;
        while rest > 0 {
            let mut e = [0u8; 8];
            if !self.read_dma(list, &mut e) {
                return Err(transfer_error);
            }
            let entry = u64::from_le_bytes(e);
            let last_in_page = (list as usize % page) / 8 == per_page - 1;
            if last_in_page && rest > page {
                // The last entry of a full list page chains to the next list page.
                list = entry;
                continue;
            }
            if !(entry as usize).is_multiple_of(page) {
                return Err(bad_offset);
            }
            let n = rest.min(page);
            segment(self, entry, n)?;
            rest -= n;
            list += 8;
        }
        Ok(())
    }
}

fn pad(dst: &mut [u8], s: &str) {
    dst.fill(b' ');
    let n = s.len().min(dst.len());
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

fn as_bytes(c: &Cqe) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&c.dw0.to_le_bytes());
    b[4..8].copy_from_slice(&c.dw1.to_le_bytes());
    b[8..10].copy_from_slice(&c.sq_head.to_le_bytes());
    b[10..12].copy_from_slice(&c.sq_id.to_le_bytes());
    b[12..14].copy_from_slice(&c.cid.to_le_bytes());
    b[14..16].copy_from_slice(&c.status.to_le_bytes());
    b
}
