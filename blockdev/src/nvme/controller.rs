//! Bringing a controller up and down: disable, admin queues, enable, admin commands (Identify,
//! features, I/O queue creation), fatal status detection and clean shutdown.

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::command::{self, Cqe, Sqe};
use super::dma::ControlArena;
use super::identify::{ControllerId, NamespaceId};
use super::queue::QueuePair;
use super::regs::{self, cc, csts, Cap};
use super::status::Status;
use super::sys::{Host, HostError};

/// I/O queue pairs the driver asks for at most (the NVMe limit is 65535; a loop per core needs
/// far fewer, and each pair costs pinned memory).
pub const MAX_IO_QUEUES: u16 = 1024;
/// Admin queue entries (SPDK uses 32 as well).
pub const ADMIN_ENTRIES: u16 = 32;
/// How long one admin command may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a normal shutdown may take before we give up waiting.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// PCI command register and its bits.
const PCI_COMMAND: u64 = 0x04;
const PCI_COMMAND_MEMORY: u16 = 1 << 1;
const PCI_COMMAND_MASTER: u16 = 1 << 2;
const PCI_COMMAND_INTX_DISABLE: u16 = 1 << 10;

/// Why bringing the controller up (or an admin command) failed.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error(transparent)]
    Host(#[from] HostError),
    #[error("the controller does not respond: registers read as all ones (device removed or BAR0 not mapped)")]
    Gone,
    #[error("the controller did not {what} within {ms} ms (CAP.TO); CSTS = {csts:#x}")]
    Timeout {
        what: &'static str,
        ms: u64,
        csts: u32,
    },
    #[error("the controller reported a fatal status (CSTS.CFS) while {during}; CSTS = {csts:#x}")]
    Fatal { during: &'static str, csts: u32 },
    #[error(
        "admin command {what} failed with SCT {sct:#x} / SC {sc:#04x} ({meaning}), do-not-retry={dnr}",
        sct = .status.sct, sc = .status.sc, meaning = .status.meaning(), dnr = .status.dnr
    )]
    Admin { what: &'static str, status: Status },
    #[error("{0}")]
    Unsupported(String),
    #[error("out of control memory for {0}")]
    NoMemory(&'static str),
}

pub struct Controller<H: Host> {
    /// Shared with every I/O queue pair, which rings its own doorbells through it without
    /// taking the controller (see [`Host`]: `Sync`).
    pub host: Arc<H>,
    pub cap: Cap,
    pub page_size: usize,
    admin: QueuePair,
    next_cid: u16,
    /// One page for Identify data.
    data: NonNull<u8>,
    data_iova: u64,
}

// SAFETY: `data` points into the control arena owned by the same device; see QueuePair.
unsafe impl<H: Host> Send for Controller<H> {}

impl<H: Host> Controller<H> {
    /// Disables the controller, sets up the admin queues in `control` and enables it.
    pub fn start(host: H, control: &mut ControlArena) -> Result<Controller<H>, InitError> {
        let pci_cmd = host.config_read16(PCI_COMMAND)?;
        host.config_write16(
            PCI_COMMAND,
            pci_cmd | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER | PCI_COMMAND_INTX_DISABLE,
        )?;
        let cap = Cap(host.read64(regs::CAP));
        if cap.0 == u64::MAX {
            return Err(InitError::Gone);
        }
        if !cap.nvm_command_set() {
            return Err(InitError::Unsupported(
                "the controller does not support the NVM command set (CAP.CSS)".into(),
            ));
        }
        let need_bar = regs::cq_head_doorbell(1, cap.doorbell_stride()) + 4;
        if host.bar_len() < need_bar {
            return Err(InitError::Unsupported(format!(
                "BAR0 is {} bytes, the doorbells need {need_bar}",
                host.bar_len()
            )));
        }
        let page_size = 4096usize.clamp(cap.min_page_size(), cap.max_page_size());
        let admin_entries = ADMIN_ENTRIES.min(cap.max_queue_entries().min(4096) as u16);
        let (sq, sq_iova) = control
            .carve(usize::from(admin_entries) * 64, page_size)
            .ok_or(InitError::NoMemory("the admin submission queue"))?;
        let (cq, cq_iova) = control
            .carve(usize::from(admin_entries) * 16, page_size)
            .ok_or(InitError::NoMemory("the admin completion queue"))?;
        let (data, data_iova) = control
            .carve(4096, page_size)
            .ok_or(InitError::NoMemory("admin data"))?;
        // SAFETY: both queues were just carved, zeroed, from the control arena that outlives the
        // controller (the device drops it last) and is mapped for the device.
        let admin = unsafe {
            QueuePair::new(
                0,
                admin_entries,
                sq.cast(),
                cq.cast(),
                cap.doorbell_stride(),
            )
        };
        let c = Controller {
            host: Arc::new(host),
            cap,
            page_size,
            admin,
            next_cid: 0,
            data,
            data_iova,
        };
        c.disable()?;
        c.host
            .write32(regs::AQA, regs::aqa(admin_entries, admin_entries));
        c.host.write64(regs::ASQ, sq_iova);
        c.host.write64(regs::ACQ, cq_iova);
        c.host.write32(regs::CC, cc::enable(page_size));
        c.wait_ready(true, "become ready after enabling")?;
        Ok(c)
    }

    fn ready_timeout(&self) -> Duration {
        Duration::from_millis(self.cap.ready_timeout_ms().max(500))
    }

    fn csts(&self) -> Result<u32, InitError> {
        match self.host.read32(regs::CSTS) {
            u32::MAX => Err(InitError::Gone),
            v => Ok(v),
        }
    }

    /// CSTS when the controller reports a fatal status (or has vanished), else None.
    pub fn fatal_status(&self) -> Option<u32> {
        let v = self.host.read32(regs::CSTS);
        (v == u32::MAX || v & csts::CFS != 0).then_some(v)
    }

    /// Reads CSTS until `done` decides (Some) or `timeout` passes.
    fn wait_csts(
        &self,
        what: &'static str,
        timeout: Duration,
        done: impl Fn(u32) -> Option<Result<(), InitError>>,
    ) -> Result<(), InitError> {
        let start = Instant::now();
        loop {
            let s = self.csts()?;
            if let Some(r) = done(s) {
                return r;
            }
            if start.elapsed() > timeout {
                return Err(InitError::Timeout {
                    what,
                    ms: timeout.as_millis() as u64,
                    csts: s,
                });
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    fn wait_ready(&self, ready: bool, what: &'static str) -> Result<(), InitError> {
        self.wait_csts(what, self.ready_timeout(), |s| {
            if s & csts::CFS != 0 {
                Some(Err(InitError::Fatal {
                    during: what,
                    csts: s,
                }))
            } else {
                ((s & csts::RDY != 0) == ready).then_some(Ok(()))
            }
        })
    }

    /// CC.EN = 0 and wait for CSTS.RDY = 0; a controller still coming up is let finish first.
    pub fn disable(&self) -> Result<(), InitError> {
        let cfg = self.host.read32(regs::CC);
        if cfg == u32::MAX {
            return Err(InitError::Gone);
        }
        if cfg & cc::EN != 0 {
            let s = self.csts()?;
            if s & csts::RDY == 0 && s & csts::CFS == 0 {
                self.wait_ready(true, "finish a previous enable")?;
            }
            self.host.write32(regs::CC, cfg & !cc::EN);
        }
        let r = match self.wait_ready(false, "become idle after disabling") {
            // A controller in fatal state still resets when disabled; wait for RDY alone.
            Err(InitError::Fatal { .. }) => self.wait_rdy_clear(),
            r => r,
        };
        // Some controllers miss CC.EN set too soon after CSTS.RDY cleared (SPDK waits too).
        std::thread::sleep(Duration::from_micros(100));
        r
    }

    fn wait_rdy_clear(&self) -> Result<(), InitError> {
        self.wait_csts("become idle after disabling", self.ready_timeout(), |s| {
            (s & csts::RDY == 0).then_some(Ok(()))
        })
    }

    /// Turns off bus mastering so a broken controller cannot write into memory we hand back.
    pub fn stop_dma(&self) {
        if let Ok(v) = self.host.config_read16(PCI_COMMAND) {
            let _ = self
                .host
                .config_write16(PCI_COMMAND, v & !PCI_COMMAND_MASTER);
        }
    }

    /// Runs one admin command to completion.
    pub fn admin(&mut self, what: &'static str, sqe: Sqe) -> Result<Cqe, InitError> {
        self.admin_within(what, sqe, ADMIN_TIMEOUT)
    }

    /// Asks the controller to abort command `cid` of submission queue `sqid`, waiting up to
    /// `within` for the answer. True when the controller reports the command aborted (CQE DW0
    /// bit 0 clear); false when it did not abort it (bit 0 set).
    pub fn abort(&mut self, sqid: u16, cid: u16, within: Duration) -> Result<bool, InitError> {
        let c = self.admin_within("Abort", Sqe::abort(sqid, cid), within)?;
        Ok(c.dw0 & 1 == 0)
    }

    /// [`Controller::admin`] with its own time limit.
    fn admin_within(
        &mut self,
        what: &'static str,
        sqe: Sqe,
        timeout: Duration,
    ) -> Result<Cqe, InitError> {
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        self.admin.push(&sqe.with_cid(cid));
        self.admin.ring_submissions(&*self.host);
        let start = Instant::now();
        let mut spins = 0u32;
        let cqe = loop {
            if let Some(c) = self.admin.pop() {
                self.admin.ring_completions(&*self.host);
                if c.cid == cid {
                    break c;
                }
                continue;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                if let Some(s) = self.fatal_status() {
                    return Err(InitError::Fatal {
                        during: what,
                        csts: s,
                    });
                }
                if start.elapsed() > timeout {
                    return Err(InitError::Timeout {
                        what: "complete an admin command",
                        ms: timeout.as_millis() as u64,
                        csts: self.host.read32(regs::CSTS),
                    });
                }
            }
            std::hint::spin_loop();
        };
        let status = Status::from_field(cqe.status_field());
        if !status.is_success() {
            return Err(InitError::Admin { what, status });
        }
        Ok(cqe)
    }

    fn identify(
        &mut self,
        what: &'static str,
        cns: u32,
        nsid: u32,
    ) -> Result<[u8; 4096], InitError> {
        // SAFETY: data is a 4096-byte page of the control arena reserved for admin data; no
        // command that uses it is in flight.
        unsafe { std::ptr::write_bytes(self.data.as_ptr(), 0, 4096) };
        self.admin(what, Sqe::identify(cns, nsid, self.data_iova))?;
        let mut out = [0u8; 4096];
        // SAFETY: as above; the command completed, so the controller is done writing.
        unsafe { std::ptr::copy_nonoverlapping(self.data.as_ptr(), out.as_mut_ptr(), 4096) };
        Ok(out)
    }

    pub fn identify_controller(&mut self) -> Result<ControllerId, InitError> {
        let d = self.identify("Identify Controller", command::CNS_CONTROLLER, 0)?;
        Ok(ControllerId::parse(&d))
    }

    pub fn identify_namespace(&mut self, nsid: u32) -> Result<NamespaceId, InitError> {
        let d = self.identify("Identify Namespace", command::CNS_NAMESPACE, nsid)?;
        Ok(NamespaceId::parse(&d))
    }

    /// The SMART / Health Information log page.
    pub fn smart_log(&mut self) -> Result<crate::nvme::smart::SmartLog, InitError> {
        // SAFETY: data is the 4096-byte admin data page of the control arena; no command that
        // uses it is in flight.
        unsafe { std::ptr::write_bytes(self.data.as_ptr(), 0, 512) };
        self.admin(
            "Get Log Page (SMART / Health Information)",
            Sqe::get_log_page(command::LOG_SMART, 512, self.data_iova),
        )?;
        let mut page = [0u8; 512];
        // SAFETY: as above; the command completed, so the controller is done writing.
        unsafe { std::ptr::copy_nonoverlapping(self.data.as_ptr(), page.as_mut_ptr(), 512) };
        Ok(crate::nvme::smart::SmartLog::parse(&page))
    }

    /// Whether the volatile write cache is enabled (Get Features 06h, WCE).
    pub fn write_cache_enabled(&mut self) -> Result<bool, InitError> {
        let c = self.admin(
            "Get Features (Volatile Write Cache)",
            Sqe::get_features(command::FEAT_VOLATILE_WRITE_CACHE),
        )?;
        Ok(c.dw0 & 1 == 1)
    }

    /// Asks for `wanted` I/O submission and as many completion queues (Set Features Number of
    /// Queues, allowed once, before any I/O queue exists) and returns how many pairs the
    /// controller granted: the smaller of its two answers, and never more than asked (a
    /// controller may grant more than asked; the driver uses only what it asked for).
    pub fn request_queues(&mut self, wanted: u16) -> Result<u16, InitError> {
        let n = u32::from(wanted.clamp(1, MAX_IO_QUEUES) - 1);
        let c = self.admin(
            "Set Features (Number of Queues)",
            Sqe::set_features(command::FEAT_NUMBER_OF_QUEUES, n << 16 | n),
        )?;
        let (nsqa, ncqa) = (c.dw0 & 0xFFFF, c.dw0 >> 16);
        Ok((nsqa.min(ncqa) + 1).min(n + 1) as u16)
    }

    /// Creates I/O queue pair `qid` (CQ, then SQ, interrupts off: the owner polls) of `entries`
    /// entries in `control`. If the SQ cannot be created, the CQ is deleted again.
    pub fn create_io_queues(
        &mut self,
        qid: u16,
        entries: u16,
        control: &mut ControlArena,
    ) -> Result<QueuePair, InitError> {
        let (sq, sq_iova) = control
            .carve(usize::from(entries) * 64, self.page_size)
            .ok_or(InitError::NoMemory("the I/O submission queue"))?;
        let (cq, cq_iova) = control
            .carve(usize::from(entries) * 16, self.page_size)
            .ok_or(InitError::NoMemory("the I/O completion queue"))?;
        self.admin(
            "Create I/O Completion Queue",
            Sqe::create_io_cq(qid, entries, cq_iova),
        )?;
        if let Err(e) = self.admin(
            "Create I/O Submission Queue",
            Sqe::create_io_sq(qid, entries, qid, sq_iova),
        ) {
            let _ = self.admin("Delete I/O Completion Queue", Sqe::delete_io_cq(qid));
            return Err(e);
        }
        // SAFETY: freshly carved zeroed queue memory in the control arena, which outlives the pair.
        Ok(unsafe {
            QueuePair::new(
                qid,
                entries,
                sq.cast(),
                cq.cast(),
                self.cap.doorbell_stride(),
            )
        })
    }

    /// Deletes I/O queue pair `qid`, SQ first (the controller aborts what is still in it).
    pub fn delete_io_queues(&mut self, qid: u16) -> Result<(), InitError> {
        let sq = self.admin("Delete I/O Submission Queue", Sqe::delete_io_sq(qid));
        let cq = self.admin("Delete I/O Completion Queue", Sqe::delete_io_cq(qid));
        sq.and(cq).map(|_| ())
    }

    /// A normal shutdown: CC.SHN = 01b, wait for CSTS.SHST = 10b. The controller writes back its
    /// cache on the way. The I/O queues are deleted before, by their owners.
    pub fn shutdown(&mut self) -> Result<(), InitError> {
        let cfg = self.host.read32(regs::CC);
        if cfg == u32::MAX {
            return Err(InitError::Gone);
        }
        self.host
            .write32(regs::CC, (cfg & !cc::SHN_MASK) | cc::SHN_NORMAL);
        self.wait_csts("complete a normal shutdown", SHUTDOWN_TIMEOUT, |s| {
            (s & csts::SHST_MASK == csts::SHST_COMPLETE).then_some(Ok(()))
        })
    }
}
