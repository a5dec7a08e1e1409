//! The userspace NVMe backend: a polled driver over VFIO (storage.md §3, reference/nvme-vfio.md).
//!
//! The caller's thread drives an I/O queue pair directly, SPDK style (one pair per thread: a
//! controller carries several, see [`NvmeDevice::queue_pair`]): a submit writes queue
//! entries into DMA memory, `poll` rings the doorbell once per batch and reaps completions by phase
//! tag. No thread, no copy, no system call and no heap allocation per I/O.
//!
//! Layout: [`sys`] is the seam to the machine ([`Host`]), [`vfio`] the real host, [`fake`] a
//! software controller for tests; [`regs`], [`command`], [`queue`], [`prp`], [`status`] and
//! [`identify`] hold the NVMe formats; [`dma`] the arenas and buffer pool; [`controller`] the
//! bring-up; [`device`] the [`BlockDevice`](crate::BlockDevice), one per queue pair, whose I/O path
//! is in `pair` and what its pairs share in `shared`; [`barrier`] the memory barriers
//! between DMA memory and doorbells, which exist for x86_64 and aarch64 only (hence the gate on
//! this module in `lib.rs`).

pub mod barrier;
pub mod command;
pub mod controller;
pub mod device;
pub mod dma;
pub mod fake;
pub mod identify;
mod pair;
pub mod prp;
pub mod queue;
pub mod regs;
mod shared;
pub mod smart;
pub mod status;
pub mod sys;
pub mod sysfs;
pub mod timeout;
pub mod vfio;

pub use device::{NvmeDetails, NvmeDevice, NvmeOptions};
pub use sys::{Host, HostError};
pub use vfio::VfioHost;

use crate::{DeviceError, Op};

impl NvmeDevice<VfioHost> {
    /// Claims the PCI function `pci_addr` (e.g. `0000:00:04.0`, bound to vfio-pci) and opens
    /// namespace `nsid`. Errors are [`DeviceError::Open`] with the step that failed and what to do.
    pub fn open(pci_addr: &str, nsid: u32, opts: NvmeOptions) -> Result<NvmeDevice, DeviceError> {
        let host = VfioHost::open(pci_addr).map_err(|e| DeviceError::Open {
            op: Op::Open,
            path: format!("nvme:{pci_addr} ns {nsid}"),
            detail: e.to_string(),
        })?;
        NvmeDevice::with_host(host, nsid, opts)
    }
}
