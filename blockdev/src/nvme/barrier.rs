//! The memory barriers of the NVMe driver: every place where the order between our accesses to
//! host memory the controller reads or writes by DMA (queue entries, PRP lists, data buffers) and
//! our MMIO accesses to its doorbells matters calls one of these, and nothing else in the driver
//! orders memory for the device.
//!
//! `std::sync::atomic::fence` is not enough: it orders memory between CPUs (on aarch64 a
//! `dmb ish`, inner shareable), while a PCIe device sits in the outer shareable domain and is
//! ordered by the `osh` barriers Linux uses for DMA (`dma_wmb`, `dma_rmb`, `dma_mb`).
//! [`super::Host::write32`] is a relaxed MMIO write (Linux `writel_relaxed`: no barrier of its
//! own), so each doorbell write that publishes memory is preceded by one of these.
//!
//! | function | orders | Linux | aarch64 | x86_64 |
//! |---|---|---|---|---|
//! | [`before_submission_doorbell`] | all earlier stores before the SQ tail doorbell write | `writel` (= `dma_wmb` + write) | `dmb oshst` | compiler barrier |
//! | [`after_phase_tag`] | the load that saw a new CQ phase tag before all later loads and stores | `dma_rmb` | `dmb oshld` | compiler barrier |
//! | [`before_completion_doorbell`] | all earlier loads (of reaped CQ entries) before the CQ head doorbell write | (`writel`, see below) | `dmb oshld` | compiler barrier |
//!
//! The NVMe backend is built only for x86_64 and aarch64 (see `lib.rs`, docs/nvme-ordering.md);
//! another architecture needs its own three barriers here first.

// lib.rs builds the nvme module only on these targets; this guards against widening that gate
// without writing the barriers, which would build a driver that corrupts data on a weakly ordered
// machine rather than fail to build.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!(
    "nvmq's NVMe backend has DMA/MMIO barriers only for target_arch x86_64 and aarch64, not for \
     the target_arch being built: implement before_submission_doorbell, after_phase_tag and \
     before_completion_doorbell for it in blockdev/src/nvme/barrier.rs (after Linux's dma_wmb, \
     dma_rmb and writel for that architecture) and add it to the nvme gate in blockdev/src/lib.rs, \
     or build for a target without the NVMe backend (the file and sim backends build everywhere)"
);

/// Makes every store before it (submission entries, PRP lists, data to be written, and the
/// zeroing of buffers the controller will write into) visible to the controller before the
/// submission queue tail doorbell write that follows it, so the controller never fetches a stale
/// entry or DMAs stale data, and never has its own DMA into a buffer overwritten by a late zeroing
/// store.
#[inline(always)]
pub fn before_submission_doorbell() {
    #[cfg(test)]
    trace::record(trace::Event::BeforeSubmissionDoorbell);
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `dmb` only orders memory accesses; it reads and writes no memory or register. The
    // asm is not `nomem`, so the compiler also keeps memory accesses on their side of it.
    unsafe {
        // Linux's writel on arm64 is `dma_wmb(); str`: a DMB of stores in the outer shareable
        // domain is enough for a Normal-memory store to be observed by the device's DMA before a
        // later Device-memory (MMIO) store reaches it (Armv8 is other-multi-copy atomic; Linux
        // relaxed writel from `dsb st` to this in 2019, commit 22ec71615d82).
        std::arch::asm!("dmb oshst", options(nostack, preserves_flags));
    }
    #[cfg(target_arch = "x86_64")]
    // x86-64 keeps stores in program order (TSO), and a store to the uncached BAR (vfio-pci maps
    // BARs with pgprot_noncached) is not reordered with earlier write-back stores; DMA snoops the
    // caches. So only the compiler must not move stores past the doorbell write (Linux's
    // dma_wmb and writel are compiler barriers on x86-64). A write-combining BAR mapping would
    // need an `sfence` here; nothing maps it so. A Release fence emits no instruction on x86-64
    // and, unlike a compiler fence, also orders the stores in Rust's memory model (the software
    // controller reads the queues from another thread).
    std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
}

/// Called after a completion entry's phase tag was seen to be new: nothing after it (the rest of
/// the entry, data the controller wrote into a read buffer or Identify page, a store that reuses
/// a buffer) may be read or written before the phase tag that vouches for it was read.
#[inline(always)]
pub fn after_phase_tag() {
    #[cfg(test)]
    trace::record(trace::Event::AfterPhaseTag);
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as in before_submission_doorbell.
    unsafe {
        // Linux's dma_rmb: DMB LD orders earlier loads before later loads *and* stores, in the
        // outer shareable domain where the device's writes to the completion queue are observed.
        std::arch::asm!("dmb oshld", options(nostack, preserves_flags));
    }
    #[cfg(target_arch = "x86_64")]
    // x86-64 never reorders a load with a later load or store (TSO), and the controller's DMA
    // writes (the data, then the entry) are observed in the order it made them (PCIe posted
    // writes stay in order). Only the compiler must not hoist later accesses above the phase
    // load (Linux's dma_rmb is a compiler barrier on x86-64). An Acquire fence emits no
    // instruction here and pairs, in Rust's memory model, with the software controller's Release
    // store of the entry from another thread.
    std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
}

/// Before the completion queue head doorbell write that gives reaped slots back to the
/// controller: every earlier load (of those entries) must be done first, or a controller that
/// reuses a slot at once could overwrite an entry we have not finished reading.
#[inline(always)]
pub fn before_completion_doorbell() {
    #[cfg(test)]
    trace::record(trace::Event::BeforeCompletionDoorbell);
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as in before_submission_doorbell.
    unsafe {
        // Linux rings this doorbell with writel, whose `dmb oshst` orders only stores; what must
        // come first here are loads, which DMB LD orders before the later MMIO store. One barrier
        // per reaped batch, not per entry.
        std::arch::asm!("dmb oshld", options(nostack, preserves_flags));
    }
    #[cfg(target_arch = "x86_64")]
    // x86-64 never reorders a load with a later store (TSO); only the compiler must not sink the
    // loads below the doorbell write (a Release fence: no instruction on x86-64).
    std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
}

/// In unit tests, the barriers and the MMIO writes of a test host are recorded in the order they
/// happen on this thread, so a test can check that each doorbell follows its barrier.
#[cfg(test)]
pub(crate) mod trace {
    use std::cell::RefCell;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Event {
        BeforeSubmissionDoorbell,
        AfterPhaseTag,
        BeforeCompletionDoorbell,
        /// An MMIO write (offset, value), recorded by a test host.
        Mmio(usize, u32),
    }

    thread_local! {
        static EVENTS: RefCell<Vec<Event>> = const { RefCell::new(Vec::new()) };
    }

    pub fn record(e: Event) {
        EVENTS.with(|v| v.borrow_mut().push(e));
    }

    /// The events recorded on this thread since the last call.
    pub fn take() -> Vec<Event> {
        EVENTS.with(|v| std::mem::take(&mut *v.borrow_mut()))
    }
}
