//! The seam between the driver and the machine: every VFIO ioctl, BAR0 register access, config
//! space access and DMA (un)mapping goes through [`Host`], so the whole driver runs against a
//! software controller ([`super::fake`]) in tests. [`super::vfio::VfioHost`] is the real one.

use std::io;
use std::ptr::NonNull;

/// An inclusive range of I/O virtual addresses the IOMMU accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IovaRange {
    pub start: u64,
    pub end: u64,
}

/// How much memory the process may pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memlock {
    /// `RLIMIT_MEMLOCK` in bytes; `None` when unlimited.
    pub limit: Option<u64>,
    /// The process has `CAP_IPC_LOCK`, which VFIO lets pin beyond the limit.
    pub privileged: bool,
}

/// Every way setting up or using the host side fails, one variant per step (after rust-vmm's
/// vfio-ioctls), each saying what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(
        "no IOMMU is active ({detail}); VFIO needs one: enable VT-d/AMD-Vi in the firmware and boot \
         with intel_iommu=on (or amd_iommu=on); in QEMU add -device intel-iommu before the NVMe device"
    )]
    NoIommu { detail: String },
    #[error("there is no PCI device {pci} ({detail}); list devices with `lspci -D`")]
    NoDevice { pci: String, detail: String },
    #[error(
        "{pci} is bound to {driver}, not vfio-pci; rebind it with \
         `hw-test/scripts/vfio-bind.sh {pci}` (or: echo vfio-pci > /sys/bus/pci/devices/{pci}/driver_override; \
         {unbind}echo {pci} > /sys/bus/pci/drivers_probe)"
    )]
    NotVfioBound {
        pci: String,
        driver: String,
        /// The unbind step of the fix, empty when no driver holds the device.
        unbind: String,
    },
    #[error("{pci} is not an NVMe controller: its PCI class is {class:#08x} (NVMe is 0x010802)")]
    NotNvme { pci: String, class: u32 },
    #[error("cannot open the VFIO container /dev/vfio/vfio: {0} (is the vfio-pci module loaded?)")]
    OpenContainer(io::Error),
    #[error("VFIO API version {got} is not the supported version 0")]
    ApiVersion { got: i32 },
    #[error("the VFIO container supports neither the type1 nor the type1v2 IOMMU")]
    NoType1,
    #[error("cannot open the VFIO group {path}: {source} ({})", group_open_hint(.source))]
    OpenGroup { path: String, source: io::Error },
    #[error("the IOMMU group {group} is not viable: every device in it must be bound to vfio-pci or to no driver; other devices: {others}")]
    GroupNotViable { group: u32, others: String },
    #[error("VFIO_GROUP_GET_STATUS failed: {0}")]
    GroupStatus(io::Error),
    #[error("VFIO_GROUP_SET_CONTAINER failed: {0}")]
    SetContainer(io::Error),
    #[error("VFIO_SET_IOMMU failed: {0}")]
    SetIommu(io::Error),
    #[error("VFIO_IOMMU_GET_INFO failed: {0}")]
    IommuInfo(io::Error),
    #[error("malformed VFIO capability chain: {0}")]
    BadCapabilities(&'static str),
    #[error("VFIO_GROUP_GET_DEVICE_FD for {pci} failed: {source}")]
    DeviceFd { pci: String, source: io::Error },
    #[error("VFIO_DEVICE_GET_INFO failed: {0}")]
    DeviceInfo(io::Error),
    #[error("the VFIO device is not a PCI device")]
    NotPci,
    #[error("VFIO_DEVICE_GET_REGION_INFO for region {index} failed: {source}")]
    RegionInfo { index: u32, source: io::Error },
    #[error("BAR0 cannot be memory-mapped (flags {flags:#x}, {len} bytes)")]
    BarNotMappable { flags: u32, len: u64 },
    #[error("mmap of BAR0 ({len} bytes) failed: {source}")]
    MmapBar { len: u64, source: io::Error },
    #[error("reading PCI config space at {offset:#x} failed: {source}")]
    ConfigRead { offset: u64, source: io::Error },
    #[error("writing PCI config space at {offset:#x} failed: {source}")]
    ConfigWrite { offset: u64, source: io::Error },
    #[error("allocating {len} bytes of DMA memory failed: {source}")]
    Memory { len: usize, source: io::Error },
    #[error(
        "RLIMIT_MEMLOCK is {limit} bytes but the NVMe driver pins {need} bytes of DMA memory; raise it \
         (`ulimit -l {need_kib}`, LimitMEMLOCK= in a systemd unit, or /etc/security/limits.conf) or give \
         the process CAP_IPC_LOCK"
    )]
    Memlock {
        limit: u64,
        need: u64,
        need_kib: u64,
    },
    #[error("no free IOVA space for {len} bytes inside the ranges the IOMMU accepts ({ranges})")]
    IovaExhausted { len: usize, ranges: String },
    #[error("VFIO_IOMMU_MAP_DMA of {len} bytes at IOVA {iova:#x} failed: {source} (pinned memory limit or IOVA range?)")]
    DmaMap {
        iova: u64,
        len: usize,
        source: io::Error,
    },
    #[error("VFIO_IOMMU_UNMAP_DMA of {len} bytes at IOVA {iova:#x} failed: {source}")]
    DmaUnmap {
        iova: u64,
        len: usize,
        source: io::Error,
    },
}

/// What to do about a VFIO group that does not open, by the reason the kernel gave.
pub fn group_open_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EBUSY) => {
            "another process holds the group: only one process can own a VFIO group; stop the \
             other broker or tool using this device (fuser -v /dev/vfio/*)"
        }
        Some(libc::ENOENT) => {
            "the group file does not exist: bind the device to vfio-pci, which creates it"
        }
        Some(libc::EACCES) | Some(libc::EPERM) => {
            "run as root or chown the group file to the broker's user"
        }
        _ => "check that vfio-pci owns every device of the group",
    }
}

/// What the driver needs from the machine.
///
/// Register access takes `&self` and never fails: an MMIO access cannot report an error (a
/// surprise-removed device reads as all ones, which the controller code treats as fatal).
///
/// `Sync` because every I/O queue pair of a controller is driven by its own thread, each
/// writing its own doorbells through the one host without a lock (a doorbell is a single
/// 32-bit MMIO store, and distinct queues have distinct doorbell registers); the rare calls
/// that change the host's state (DMA mappings) are made under the controller's admin lock.
pub trait Host: Send + Sync {
    /// The PCI address, for messages.
    fn name(&self) -> &str;

    /// Bytes of BAR0 that are accessible.
    fn bar_len(&self) -> usize;
    fn read32(&self, offset: usize) -> u32;
    fn write32(&self, offset: usize, value: u32);
    /// 64-bit registers are accessed as two dwords, low first, which every controller accepts.
    fn read64(&self, offset: usize) -> u64 {
        u64::from(self.read32(offset)) | u64::from(self.read32(offset + 4)) << 32
    }
    fn write64(&self, offset: usize, value: u64) {
        self.write32(offset, value as u32);
        self.write32(offset + 4, (value >> 32) as u32);
    }

    fn config_read16(&self, offset: u64) -> Result<u16, HostError>;
    fn config_write16(&self, offset: u64, value: u16) -> Result<(), HostError>;

    /// The IOVA ranges the IOMMU accepts; empty when the kernel does not report them.
    fn iova_ranges(&self) -> &[IovaRange];
    fn memlock(&self) -> Memlock;

    /// Makes `len` bytes at `vaddr` reachable by the device at `iova` (and pins them).
    ///
    /// # Safety
    /// The memory must stay allocated until [`Host::dma_unmap`] of the same range has returned,
    /// or until the host is dropped.
    unsafe fn dma_map(&self, vaddr: *mut u8, len: usize, iova: u64) -> Result<(), HostError>;
    fn dma_unmap(&self, iova: u64, len: usize) -> Result<(), HostError>;

    /// The time, for the I/O path's timeouts. Where the clocksource has no vDSO path (HPET, as
    /// in a QEMU/TCG guest and some VMs) every read is a `clock_gettime` system call, so the I/O
    /// path reads it only once it has been waiting for a while.
    fn now(&self) -> std::time::Instant {
        std::time::Instant::now()
    }
}

/// Anonymous memory for DMA: 2 MiB huge pages when the system has them (fewer IOTLB entries),
/// ordinary pages otherwise. The VFIO mapping pins it. Unmapped on drop.
pub struct Memory {
    ptr: NonNull<u8>,
    len: usize,
    huge: bool,
}

// SAFETY: Memory is an owned mapping like a Box<[u8]>; moving it between threads is fine.
unsafe impl Send for Memory {}
// SAFETY: Memory hands out only raw pointers; synchronising accesses is the user's job.
unsafe impl Sync for Memory {}

const HUGE_PAGE: usize = 2 << 20;

impl Memory {
    /// `len` zeroed bytes, rounded up to the page size used.
    pub fn anonymous(len: usize) -> Result<Memory, HostError> {
        let err = |source| HostError::Memory { len, source };
        if len == 0 {
            return Err(err(io::Error::from(io::ErrorKind::InvalidInput)));
        }
        let huge_len = len.div_ceil(HUGE_PAGE) * HUGE_PAGE;
        if let Some(ptr) = map(huge_len, libc::MAP_HUGETLB) {
            return Ok(Memory {
                ptr,
                len: huge_len,
                huge: true,
            });
        }
        let small_len = len.div_ceil(4096) * 4096;
        match map(small_len, 0) {
            Some(ptr) => Ok(Memory {
                ptr,
                len: small_len,
                huge: false,
            }),
            None => Err(err(io::Error::last_os_error())),
        }
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn is_huge(&self) -> bool {
        self.huge
    }
}

fn map(len: usize, extra: libc::c_int) -> Option<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at an address the kernel picks touches no existing
    // memory; the result is checked for MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    NonNull::new(p.cast::<u8>())
}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly the mapping made in `anonymous`, unmapped only here.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memory")
            .field("len", &self.len)
            .field("huge", &self.huge)
            .finish()
    }
}
