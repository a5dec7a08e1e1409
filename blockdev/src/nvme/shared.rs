//! What the I/O queue pairs of one controller share: the controller itself (admin queue, DMA
//! mappings, shutdown), behind one lock taken only off the I/O path (opening a pair, mapping
//! another buffer arena, an Abort, a failure, closing), and the few facts every pair reads
//! without a lock (the geometry, the buffer pool, whether the controller was stopped).
//!
//! Each pair ([`super::NvmeDevice`]) is owned by one thread and submits and reaps through its
//! own queues and doorbells, so several threads share one namespace without taking turns.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::controller::Controller;
use super::device::NvmeDetails;
use super::dma::{self, ControlArena, DmaPool, IovaSpace, Span};
use super::queue::QueuePair;
use super::sys::{Host, HostError, Memory};
use crate::{DeviceError, DeviceInfo, Op};

/// The controller and what goes with it, behind [`Shared::admin`].
pub(super) struct Admin<H: Host> {
    pub ctrl: Controller<H>,
    pub iova: IovaSpace,
    pub pinned: u64,
    /// Buffer arenas mapped so far; pairs copy the list when `Shared::arenas` says it grew.
    pub buffer_spans: Vec<Span>,
    /// Control memory mapped for the admin queue (unmapped on shutdown).
    pub admin_span: Span,
    /// I/O queue ids granted and not in use.
    pub free_qids: Vec<u16>,
    pub closed: bool,
    pub _admin_mem: ControlArena,
}

pub(super) struct Shared<H: Host> {
    pub admin: Mutex<Admin<H>>,
    /// The same host as the controller's: pairs ring their doorbells through it without the lock.
    pub host: Arc<H>,
    pub pool: Arc<DmaPool>,
    /// How many buffer arenas are mapped (a pair's copy of the list is current while equal).
    pub arenas: AtomicUsize,
    /// The controller was disabled after a failure: every pair fails what it has in flight.
    pub stopped: AtomicBool,
    /// Why: the first failure, kept whatever a pair finds after it. Every pair reports it, in
    /// `poll` and in its refusals, whichever pair found it.
    pub failure: Mutex<Option<DeviceError>>,
    pub info: DeviceInfo,
    pub details: NvmeDetails,
    pub nsid: u32,
    pub lba_shift: u32,
    pub command_bytes: usize,
    pub queue_depth: usize,
    pub opts: super::NvmeOptions,
}

/// A new pair's queues and memory, before it becomes an `NvmeDevice`.
pub(super) struct PairParts {
    pub qid: u16,
    pub io: QueuePair,
    pub mem: ControlArena,
    pub prp_lists: std::ptr::NonNull<u8>,
    pub prp_lists_iova: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Maps `len` bytes of fresh memory for the device.
pub(super) fn map_memory<H: Host>(
    host: &H,
    iova: &mut IovaSpace,
    pinned: &mut u64,
    len: usize,
) -> Result<(Memory, u64), HostError> {
    let mem = Memory::anonymous(len)?;
    dma::check_memlock(host.memlock(), *pinned + mem.len() as u64)?;
    let at = iova.alloc(mem.len(), dma::ARENA_ALIGN)?;
    // SAFETY: the memory is owned by a pair (its control arena) or the pool (buffer arenas),
    // which outlive the mapping: a pair unmaps its span when it is dropped, before its arena
    // goes, and the shared part unmaps the buffer arenas before the pool can go.
    unsafe { host.dma_map(mem.as_ptr(), mem.len(), at)? };
    *pinned += mem.len() as u64;
    Ok((mem, at))
}

impl<H: Host> Shared<H> {
    pub fn lock(&self) -> MutexGuard<'_, Admin<H>> {
        lock(&self.admin)
    }

    pub fn label(&self) -> String {
        format!("nvme:{} ns {}", self.details.pci, self.nsid)
    }

    /// Queues and memory for one more I/O queue pair; `Ok(None)` when every pair the
    /// controller granted is in use.
    pub fn open_pair(&self) -> Result<Option<PairParts>, DeviceError> {
        let label = self.label();
        let err = |detail: String| DeviceError::Open {
            op: Op::Open,
            path: label.clone(),
            detail,
        };
        if self.stopped.load(Ordering::Acquire) {
            return Err(err("the controller was stopped after a failure".into()));
        }
        let mut a = self.lock();
        let Some(qid) = a.free_qids.pop() else {
            return Ok(None);
        };
        let page = self.details.page_size;
        let entries = self.details.queue_entries;
        let slot_count = usize::from(entries) - 1;
        let io_bytes = (usize::from(entries) * 64).next_multiple_of(page)
            + (usize::from(entries) * 16).next_multiple_of(page)
            + slot_count * page;
        let a = &mut *a;
        let made = map_memory(&*self.host, &mut a.iova, &mut a.pinned, io_bytes)
            .map_err(|e| err(format!("mapping memory for I/O queue pair {qid}: {e}")));
        let (mem, at) = match made {
            Ok(m) => m,
            Err(e) => {
                a.free_qids.push(qid);
                return Err(e);
            }
        };
        let mut mem = ControlArena::new(mem, at);
        let created = a.ctrl.create_io_queues(qid, entries, &mut mem);
        let lists = mem.carve(slot_count * page, page);
        match (created, lists) {
            (Ok(io), Some((prp_lists, prp_lists_iova))) => Ok(Some(PairParts {
                qid,
                io,
                mem,
                prp_lists,
                prp_lists_iova,
            })),
            (created, _) => {
                let detail = match created {
                    Err(e) => format!("creating I/O queue pair {qid}: {e}"),
                    Ok(_) => {
                        let _ = a.ctrl.delete_io_queues(qid);
                        format!("out of control memory for the PRP lists of queue pair {qid}")
                    }
                };
                let _ = self.host.dma_unmap(mem.span.iova, mem.span.len);
                a.pinned -= mem.span.len as u64;
                a.free_qids.push(qid);
                Err(err(detail))
            }
        }
    }

    /// Gives back a pair's queues (deleted first, so the controller no longer touches its
    /// memory) and unmaps its control memory. If they cannot be deleted, the controller is
    /// stopped: the memory is about to be freed.
    pub fn close_pair(&self, qid: u16, span: Span) -> Result<(), DeviceError> {
        let mut a = self.lock();
        let mut result = Ok(());
        if !self.stopped.load(Ordering::Acquire) {
            if let Err(e) = a.ctrl.delete_io_queues(qid) {
                result = Err(self.close_err(format!("deleting I/O queue pair {qid}: {e}")));
                self.stop_locked(&a, None);
            }
        }
        if let Err(e) = self.host.dma_unmap(span.iova, span.len) {
            result = result.and(Err(self.close_err(e.to_string())));
        }
        a.pinned = a.pinned.saturating_sub(span.len as u64);
        a.free_qids.push(qid);
        result
    }

    fn close_err(&self, detail: String) -> DeviceError {
        DeviceError::Open {
            op: Op::Open,
            path: self.label(),
            detail,
        }
    }

    /// Maps another buffer arena of `len` bytes into the pool.
    pub fn map_arena(&self, len: usize) -> Result<(), DeviceError> {
        let mut a = self.lock();
        let a = &mut *a;
        if a.buffer_spans.len() >= self.opts.max_arenas {
            return Err(DeviceError::BadRequest {
                op: Op::Allocate,
                lba: 0,
                len,
                why: "the DMA arenas are full; raise NvmeOptions::arena_bytes or max_arenas",
            });
        }
        let (mem, at) = map_memory(&*self.host, &mut a.iova, &mut a.pinned, len).map_err(|e| {
            DeviceError::Io {
                op: Op::Allocate,
                lba: 0,
                detail: e.to_string(),
            }
        })?;
        a.buffer_spans.push(Span {
            vaddr: mem.as_ptr() as usize,
            iova: at,
            len: mem.len(),
        });
        self.pool.add_arena(mem, at);
        self.arenas.store(a.buffer_spans.len(), Ordering::Release);
        Ok(())
    }

    /// Disables the controller (it can no longer complete anything, late or not), turns off
    /// its DMA and tells every pair, which fails what it has in flight with `why`.
    pub fn stop(&self, why: Option<DeviceError>) {
        let a = self.lock();
        self.stop_locked(&a, why);
    }

    fn stop_locked(&self, a: &Admin<H>, why: Option<DeviceError>) {
        let mut f = lock(&self.failure);
        if f.is_none() {
            *f = why;
        }
        drop(f);
        if !self.stopped.swap(true, Ordering::AcqRel) {
            let _ = a.ctrl.disable();
            a.ctrl.stop_dma();
        }
    }

    /// The first failure that stopped the controller, as it was found (the operation and LBA
    /// of the command that failed); None before a stop, or after a stop without one (shutdown).
    pub fn first_failure(&self) -> Option<DeviceError> {
        lock(&self.failure).clone()
    }

    /// Why the controller was stopped, as an error for one I/O of a pair that found it so.
    pub fn stopped_error(&self, op: Op, lba: u64) -> DeviceError {
        match &*lock(&self.failure) {
            Some(e) => DeviceError::Failed {
                op,
                lba,
                reason: Box::new(e.clone()),
            },
            None => DeviceError::Stopped { op, lba },
        }
    }

    /// The normal shutdown (CC.SHN, which writes back the cache) once no pair is left, then
    /// unmaps the admin queue and the buffer arenas.
    pub fn shutdown(&self) -> Result<(), DeviceError> {
        let mut a = self.lock();
        if a.closed {
            return Ok(());
        }
        a.closed = true;
        let mut result = Ok(());
        if !self.stopped.load(Ordering::Acquire) {
            if let Err(e) = a.ctrl.shutdown() {
                result = Err(self.close_err(format!("shutdown failed: {e}")));
                let _ = a.ctrl.disable();
                a.ctrl.stop_dma();
            }
        }
        self.stopped.store(true, Ordering::Release);
        let spans: Vec<Span> = std::iter::once(a.admin_span)
            .chain(a.buffer_spans.iter().copied())
            .collect();
        for s in spans {
            if let Err(e) = self.host.dma_unmap(s.iova, s.len) {
                result = result.and(Err(self.close_err(e.to_string())));
            }
        }
        result
    }
}

impl<H: Host> Drop for Shared<H> {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
