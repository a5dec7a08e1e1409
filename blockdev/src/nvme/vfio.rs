//! The real [`Host`]: a PCI function claimed through the VFIO container/group API (type1 IOMMU),
//! BAR0 mapped into the process, config space through the device file, DMA mappings through the
//! container. The ioctl numbers and structures are those of linux/include/uapi/linux/vfio.h
//! (`_IO(';', 100 + n)`; every structure starts with `argsz`).

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::sys::{Host, HostError, IovaRange, Memlock};
use super::sysfs;

const VFIO_BASE: u64 = 0x3B00 | 100;
const VFIO_GET_API_VERSION: u64 = VFIO_BASE;
const VFIO_CHECK_EXTENSION: u64 = VFIO_BASE + 1;
const VFIO_SET_IOMMU: u64 = VFIO_BASE + 2;
const VFIO_GROUP_GET_STATUS: u64 = VFIO_BASE + 3;
const VFIO_GROUP_SET_CONTAINER: u64 = VFIO_BASE + 4;
const VFIO_GROUP_GET_DEVICE_FD: u64 = VFIO_BASE + 6;
const VFIO_DEVICE_GET_INFO: u64 = VFIO_BASE + 7;
const VFIO_DEVICE_GET_REGION_INFO: u64 = VFIO_BASE + 8;
const VFIO_IOMMU_GET_INFO: u64 = VFIO_BASE + 12;
const VFIO_IOMMU_MAP_DMA: u64 = VFIO_BASE + 13;
const VFIO_IOMMU_UNMAP_DMA: u64 = VFIO_BASE + 14;

const VFIO_API_VERSION: i32 = 0;
const VFIO_TYPE1_IOMMU: libc::c_ulong = 1;
const VFIO_TYPE1V2_IOMMU: libc::c_ulong = 3;
const VFIO_GROUP_FLAGS_VIABLE: u32 = 1;
const VFIO_DEVICE_FLAGS_PCI: u32 = 1 << 1;
const VFIO_REGION_INFO_FLAG_MMAP: u32 = 1 << 2;
const VFIO_REGION_INFO_FLAG_CAPS: u32 = 1 << 3;
const VFIO_REGION_INFO_CAP_SPARSE_MMAP: u16 = 1;
const VFIO_IOMMU_INFO_CAPS: u32 = 1 << 1;
const VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE: u16 = 1;
const VFIO_DMA_MAP_FLAG_READ: u32 = 1;
const VFIO_DMA_MAP_FLAG_WRITE: u32 = 1 << 1;
const BAR0_REGION: u32 = 0;
const CONFIG_REGION: u32 = 7;

#[repr(C)]
#[derive(Default)]
struct GroupStatus {
    argsz: u32,
    flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct DeviceInfo {
    argsz: u32,
    flags: u32,
    num_regions: u32,
    num_irqs: u32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct RegionInfo {
    argsz: u32,
    flags: u32,
    index: u32,
    cap_offset: u32,
    size: u64,
    offset: u64,
}

#[repr(C)]
#[derive(Default)]
struct IommuInfo {
    argsz: u32,
    flags: u32,
    iova_pgsizes: u64,
    cap_offset: u32,
    pad: u32,
}

#[repr(C)]
struct DmaMap {
    argsz: u32,
    flags: u32,
    vaddr: u64,
    iova: u64,
    size: u64,
}

#[repr(C)]
struct DmaUnmap {
    argsz: u32,
    flags: u32,
    iova: u64,
    size: u64,
}

const _: () = assert!(std::mem::size_of::<RegionInfo>() == 32);
const _: () = assert!(std::mem::size_of::<IommuInfo>() == 24);
const _: () = assert!(std::mem::size_of::<DmaMap>() == 32);
const _: () = assert!(std::mem::size_of::<DmaUnmap>() == 24);

/// `ioctl(fd, request, arg)`, with EINTR retried.
fn ioctl(fd: RawFd, request: u64, arg: libc::c_ulong) -> io::Result<libc::c_int> {
    loop {
        // SAFETY: every caller passes a request whose argument is either an integer or a pointer
        // to a live, correctly sized repr(C) structure with argsz set, as vfio.h defines it.
        let rc = unsafe { libc::ioctl(fd, request as _, arg) };
        if rc >= 0 {
            return Ok(rc);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn ioctl_ptr<T>(fd: RawFd, request: u64, arg: &mut T) -> io::Result<libc::c_int> {
    ioctl(fd, request, arg as *mut T as libc::c_ulong)
}

/// The IOVA ranges from a VFIO_IOMMU_GET_INFO answer's capability chain (`buf` holds the whole
/// answer, `first` is cap_offset).
pub fn parse_iova_ranges(buf: &[u8], first: u32) -> Result<Vec<IovaRange>, HostError> {
    let mut out = Vec::new();
    for (id, at) in caps(buf, first)? {
        if id != VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE {
            continue;
        }
        let n = rd32(buf, at + 8).ok_or(HostError::BadCapabilities("IOVA range count"))? as usize;
        for i in 0..n {
            let e = at + 16 + i * 16;
            let (Some(start), Some(end)) = (rd64(buf, e), rd64(buf, e + 8)) else {
                return Err(HostError::BadCapabilities("IOVA range past the end"));
            };
            out.push(IovaRange { start, end });
        }
    }
    Ok(out)
}

/// The sparse mmap areas (offset, size) of a region from its capability chain.
pub fn parse_sparse_areas(buf: &[u8], first: u32) -> Result<Option<Vec<(u64, u64)>>, HostError> {
    for (id, at) in caps(buf, first)? {
        if id != VFIO_REGION_INFO_CAP_SPARSE_MMAP {
            continue;
        }
        let n = rd32(buf, at + 8).ok_or(HostError::BadCapabilities("sparse area count"))? as usize;
        let mut areas = Vec::with_capacity(n.min(64));
        for i in 0..n {
            let e = at + 16 + i * 16;
            let (Some(o), Some(s)) = (rd64(buf, e), rd64(buf, e + 8)) else {
                return Err(HostError::BadCapabilities("sparse area past the end"));
            };
            areas.push((o, s));
        }
        return Ok(Some(areas));
    }
    Ok(None)
}

/// (id, offset) of each capability header `{u16 id, u16 version, u32 next}`.
fn caps(buf: &[u8], first: u32) -> Result<Vec<(u16, usize)>, HostError> {
    let mut out = Vec::new();
    let mut at = first as usize;
    while at != 0 {
        if out.len() > 64 {
            return Err(HostError::BadCapabilities("the chain loops"));
        }
        let id = rd16(buf, at).ok_or(HostError::BadCapabilities("header past the end"))?;
        let next = rd32(buf, at + 4).ok_or(HostError::BadCapabilities("header past the end"))?;
        out.push((id, at));
        if next as usize != 0 && next as usize <= at {
            return Err(HostError::BadCapabilities("the chain goes backwards"));
        }
        at = next as usize;
    }
    Ok(out)
}

fn rd16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn rd32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn rd64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// A PCI function claimed through VFIO.
pub struct VfioHost {
    pci: String,
    // Field order is drop order: the device before its group before the container.
    device: File,
    _group: File,
    container: File,
    bar: *mut u8,
    bar_len: usize,
    config_offset: u64,
    ranges: Vec<IovaRange>,
    memlock: Memlock,
}

// SAFETY: the BAR mapping is owned by this value and only accessed through it.
unsafe impl Send for VfioHost {}
// SAFETY: shared use touches the BAR only through `read32`/`write32`, single aligned volatile
// 32-bit accesses, which the device serialises itself (each I/O queue pair's thread writes only
// its own doorbells); the files are used through ioctls, which the kernel serialises.
unsafe impl Sync for VfioHost {}

fn open_rw(path: &str) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).open(path)
}

impl VfioHost {
    /// Claims PCI function `pci` (e.g. `0000:00:04.0`), which must be bound to vfio-pci.
    pub fn open(pci: &str) -> Result<VfioHost, HostError> {
        let func = sysfs::check(Path::new("/sys"), pci)?;
        let container = open_rw("/dev/vfio/vfio").map_err(HostError::OpenContainer)?;
        let cfd = container.as_raw_fd();
        let got = ioctl(cfd, VFIO_GET_API_VERSION, 0).map_err(HostError::OpenContainer)?;
        if got != VFIO_API_VERSION {
            return Err(HostError::ApiVersion { got });
        }
        let iommu_type = if ioctl(cfd, VFIO_CHECK_EXTENSION, VFIO_TYPE1V2_IOMMU).unwrap_or(0) == 1 {
            VFIO_TYPE1V2_IOMMU
        } else if ioctl(cfd, VFIO_CHECK_EXTENSION, VFIO_TYPE1_IOMMU).unwrap_or(0) == 1 {
            VFIO_TYPE1_IOMMU
        } else {
            return Err(HostError::NoType1);
        };
        let gpath = format!("/dev/vfio/{}", func.group);
        let group = open_rw(&gpath).map_err(|source| HostError::OpenGroup {
            path: gpath,
            source,
        })?;
        let gfd = group.as_raw_fd();
        let mut status = GroupStatus {
            argsz: std::mem::size_of::<GroupStatus>() as u32,
            flags: 0,
        };
        ioctl_ptr(gfd, VFIO_GROUP_GET_STATUS, &mut status).map_err(HostError::GroupStatus)?;
        if status.flags & VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(not_viable(func.group, &func.group_peers));
        }
        let mut cfd_arg: libc::c_int = cfd;
        ioctl_ptr(gfd, VFIO_GROUP_SET_CONTAINER, &mut cfd_arg).map_err(HostError::SetContainer)?;
        ioctl(cfd, VFIO_SET_IOMMU, iommu_type).map_err(HostError::SetIommu)?;
        let ranges = iova_ranges(cfd)?;
        let name = CString::new(pci).map_err(|_| HostError::NoDevice {
            pci: pci.into(),
            detail: "the address contains a NUL byte".into(),
        })?;
        let dfd = ioctl(
            gfd,
            VFIO_GROUP_GET_DEVICE_FD,
            name.as_ptr() as libc::c_ulong,
        )
        .map_err(|source| HostError::DeviceFd {
            pci: pci.into(),
            source,
        })?;
        // SAFETY: the ioctl returned a new descriptor that nothing else owns.
        let device = unsafe { File::from_raw_fd(dfd) };
        let mut info = DeviceInfo {
            argsz: std::mem::size_of::<DeviceInfo>() as u32,
            ..DeviceInfo::default()
        };
        ioctl_ptr(dfd, VFIO_DEVICE_GET_INFO, &mut info).map_err(HostError::DeviceInfo)?;
        if info.flags & VFIO_DEVICE_FLAGS_PCI == 0 {
            return Err(HostError::NotPci);
        }
        let config = region_info(dfd, CONFIG_REGION)?;
        let (bar, bar_len) = map_bar0(dfd)?;
        Ok(VfioHost {
            pci: pci.into(),
            device,
            _group: group,
            container,
            bar,
            bar_len,
            config_offset: config.offset,
            ranges,
            memlock: memlock(),
        })
    }
}

/// The error for a group the kernel calls not viable, naming the other devices in it.
fn not_viable(group: u32, peers: &[(String, String)]) -> HostError {
    let others = peers
        .iter()
        .map(|(d, drv)| format!("{d} (driver {drv})"))
        .collect::<Vec<_>>()
        .join(", ");
    HostError::GroupNotViable {
        group,
        others: if others.is_empty() {
            "none found in sysfs".into()
        } else {
            others
        },
    }
}

fn region_info(dfd: RawFd, index: u32) -> Result<RegionInfo, HostError> {
    let mut r = RegionInfo {
        argsz: std::mem::size_of::<RegionInfo>() as u32,
        index,
        ..RegionInfo::default()
    };
    ioctl_ptr(dfd, VFIO_DEVICE_GET_REGION_INFO, &mut r)
        .map_err(|source| HostError::RegionInfo { index, source })?;
    Ok(r)
}

/// Maps BAR0, honouring a sparse-mmap capability (older kernels keep the MSI-X table out): the
/// registers and doorbells are in the area that starts at offset 0.
fn map_bar0(dfd: RawFd) -> Result<(*mut u8, usize), HostError> {
    let r = region_info(dfd, BAR0_REGION)?;
    if r.flags & VFIO_REGION_INFO_FLAG_MMAP == 0 || r.size == 0 {
        return Err(HostError::BarNotMappable {
            flags: r.flags,
            len: r.size,
        });
    }
    let mut len = r.size;
    if r.flags & VFIO_REGION_INFO_FLAG_CAPS != 0
        && r.argsz as usize > std::mem::size_of::<RegionInfo>()
    {
        let mut buf = vec![0u64; (r.argsz as usize).div_ceil(8)];
        let head = RegionInfo {
            argsz: r.argsz,
            index: BAR0_REGION,
            ..RegionInfo::default()
        };
        // SAFETY: buf is at least argsz bytes and 8-byte aligned; RegionInfo fits at its start.
        unsafe { std::ptr::write(buf.as_mut_ptr().cast::<RegionInfo>(), head) };
        ioctl(
            dfd,
            VFIO_DEVICE_GET_REGION_INFO,
            buf.as_mut_ptr() as libc::c_ulong,
        )
        .map_err(|source| HostError::RegionInfo {
            index: BAR0_REGION,
            source,
        })?;
        // SAFETY: the kernel filled the buffer, which holds plain bytes.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len() * 8) };
        // SAFETY: as above; RegionInfo is plain integers.
        let full: RegionInfo = unsafe { std::ptr::read(buf.as_ptr().cast()) };
        if let Some(areas) = parse_sparse_areas(bytes, full.cap_offset)? {
            len = areas.iter().find(|(o, _)| *o == 0).map(|(_, s)| *s).ok_or(
                HostError::BarNotMappable {
                    flags: r.flags,
                    len: 0,
                },
            )?;
        }
    }
    // SAFETY: mapping a region of the VFIO device file at the offset the kernel gave; the result
    // is checked for MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            dfd,
            r.offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(HostError::MmapBar {
            len,
            source: io::Error::last_os_error(),
        });
    }
    Ok((p.cast(), len as usize))
}

fn iova_ranges(cfd: RawFd) -> Result<Vec<IovaRange>, HostError> {
    let mut info = IommuInfo {
        argsz: std::mem::size_of::<IommuInfo>() as u32,
        ..IommuInfo::default()
    };
    ioctl_ptr(cfd, VFIO_IOMMU_GET_INFO, &mut info).map_err(HostError::IommuInfo)?;
    if info.flags & VFIO_IOMMU_INFO_CAPS == 0
        || info.argsz as usize <= std::mem::size_of::<IommuInfo>()
    {
        return Ok(Vec::new());
    }
    let mut buf = vec![0u64; (info.argsz as usize).div_ceil(8)];
    let head = IommuInfo {
        argsz: info.argsz,
        ..IommuInfo::default()
    };
    // SAFETY: buf is at least argsz bytes and 8-byte aligned; IommuInfo fits at its start.
    unsafe { std::ptr::write(buf.as_mut_ptr().cast::<IommuInfo>(), head) };
    ioctl(cfd, VFIO_IOMMU_GET_INFO, buf.as_mut_ptr() as libc::c_ulong)
        .map_err(HostError::IommuInfo)?;
    // SAFETY: the kernel filled the buffer, which holds plain bytes.
    let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len() * 8) };
    // SAFETY: as above; IommuInfo is plain integers.
    let full: IommuInfo = unsafe { std::ptr::read(buf.as_ptr().cast()) };
    parse_iova_ranges(bytes, full.cap_offset)
}

/// RLIMIT_MEMLOCK and whether CAP_IPC_LOCK (bit 14 of CapEff) lifts it.
fn memlock() -> Memlock {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the live local.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    let limit = if rc != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        None
    } else {
        Some(lim.rlim_cur)
    };
    let privileged = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps >> 14 & 1 == 1);
    Memlock { limit, privileged }
}

impl Host for VfioHost {
    fn name(&self) -> &str {
        &self.pci
    }

    fn bar_len(&self) -> usize {
        self.bar_len
    }

    fn read32(&self, offset: usize) -> u32 {
        if offset.checked_add(4).is_none_or(|e| e > self.bar_len) || !offset.is_multiple_of(4) {
            return u32::MAX;
        }
        // SAFETY: offset is dword aligned and inside the BAR0 mapping, which lives as long as self.
        unsafe { self.bar.add(offset).cast::<u32>().read_volatile() }
    }

    fn write32(&self, offset: usize, value: u32) {
        if offset.checked_add(4).is_none_or(|e| e > self.bar_len) || !offset.is_multiple_of(4) {
            return;
        }
        // SAFETY: as in read32.
        unsafe { self.bar.add(offset).cast::<u32>().write_volatile(value) }
    }

    fn config_read16(&self, offset: u64) -> Result<u16, HostError> {
        let mut b = [0u8; 2];
        self.device
            .read_exact_at(&mut b, self.config_offset + offset)
            .map_err(|source| HostError::ConfigRead { offset, source })?;
        Ok(u16::from_le_bytes(b))
    }

    fn config_write16(&self, offset: u64, value: u16) -> Result<(), HostError> {
        self.device
            .write_all_at(&value.to_le_bytes(), self.config_offset + offset)
            .map_err(|source| HostError::ConfigWrite { offset, source })
    }

    fn iova_ranges(&self) -> &[IovaRange] {
        &self.ranges
    }

    fn memlock(&self) -> Memlock {
        self.memlock
    }

    unsafe fn dma_map(&self, vaddr: *mut u8, len: usize, iova: u64) -> Result<(), HostError> {
        let mut m = DmaMap {
            argsz: std::mem::size_of::<DmaMap>() as u32,
            flags: VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
            vaddr: vaddr as u64,
            iova,
            size: len as u64,
        };
        ioctl_ptr(self.container.as_raw_fd(), VFIO_IOMMU_MAP_DMA, &mut m)
            .map(|_| ())
            .map_err(|source| HostError::DmaMap { iova, len, source })
    }

    fn dma_unmap(&self, iova: u64, len: usize) -> Result<(), HostError> {
        let mut m = DmaUnmap {
            argsz: std::mem::size_of::<DmaUnmap>() as u32,
            flags: 0,
            iova,
            size: len as u64,
        };
        ioctl_ptr(self.container.as_raw_fd(), VFIO_IOMMU_UNMAP_DMA, &mut m)
            .map(|_| ())
            .map_err(|source| HostError::DmaUnmap { iova, len, source })
    }
}

impl Drop for VfioHost {
    fn drop(&mut self) {
        // SAFETY: bar/bar_len are the mapping made in map_bar0, unmapped only here.
        unsafe { libc::munmap(self.bar.cast(), self.bar_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_vfio_h() {
        assert_eq!(VFIO_GET_API_VERSION, 15204);
        assert_eq!(VFIO_CHECK_EXTENSION, 15205);
        assert_eq!(VFIO_SET_IOMMU, 15206);
        assert_eq!(VFIO_GROUP_GET_STATUS, 15207);
        assert_eq!(VFIO_GROUP_SET_CONTAINER, 15208);
        assert_eq!(VFIO_GROUP_GET_DEVICE_FD, 15210);
        assert_eq!(VFIO_DEVICE_GET_INFO, 15211);
        assert_eq!(VFIO_DEVICE_GET_REGION_INFO, 15212);
        assert_eq!(VFIO_IOMMU_GET_INFO, 0x3B70);
        assert_eq!(VFIO_IOMMU_MAP_DMA, 0x3B71);
        assert_eq!(VFIO_IOMMU_UNMAP_DMA, 0x3B72);
    }

    /// Seen in the QEMU guest: a second process opening a group in use got EBUSY and was told to
    /// run as root.
    #[test]
    fn a_group_that_does_not_open_gets_advice_for_its_errno() {
        let open_err = |errno| {
            HostError::OpenGroup {
                path: "/dev/vfio/1".into(),
                source: io::Error::from_raw_os_error(errno),
            }
            .to_string()
        };
        let busy = open_err(libc::EBUSY);
        assert!(busy.contains("another process holds the group"), "{busy}");
        assert!(!busy.contains("root"), "{busy}");
        assert!(open_err(libc::EACCES).contains("run as root"));
        assert!(open_err(libc::EPERM).contains("run as root"));
        assert!(open_err(libc::ENOENT).contains("bind the device to vfio-pci"));
    }

    #[test]
    fn a_group_that_is_not_viable_names_its_other_devices() {
        let peers = vec![
            ("0000:00:05.0".to_string(), "e1000".to_string()),
            ("0000:00:05.1".to_string(), "none".to_string()),
        ];
        let e = not_viable(7, &peers).to_string();
        assert!(e.contains("IOMMU group 7 is not viable"), "{e}");
        assert!(
            e.contains("0000:00:05.0 (driver e1000), 0000:00:05.1 (driver none)"),
            "{e}"
        );
        assert!(not_viable(7, &[]).to_string().contains("none found"));
    }

    /// An IOMMU info answer: the 24-byte header, a DMA-avail cap (id 3), then an IOVA range cap.
    fn info_with_ranges(ranges: &[(u64, u64)]) -> Vec<u8> {
        let mut b = vec![0u8; 24];
        b.extend_from_slice(&3u16.to_le_bytes());
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&40u32.to_le_bytes());
        b.extend_from_slice(&65000u32.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(b.len(), 40);
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        for (s, e) in ranges {
            b.extend_from_slice(&s.to_le_bytes());
            b.extend_from_slice(&e.to_le_bytes());
        }
        b
    }

    #[test]
    fn iova_ranges_are_read_from_the_capability_chain() {
        let b = info_with_ranges(&[(0, 0xFEDF_FFFF), (0xFEF0_0000, (1 << 39) - 1)]);
        let r = parse_iova_ranges(&b, 24).unwrap();
        assert_eq!(
            r,
            vec![
                IovaRange {
                    start: 0,
                    end: 0xFEDF_FFFF
                },
                IovaRange {
                    start: 0xFEF0_0000,
                    end: (1 << 39) - 1
                }
            ]
        );
        assert_eq!(parse_iova_ranges(&b, 0).unwrap(), vec![]);
    }

    #[test]
    fn malformed_chains_are_errors_not_panics() {
        let mut b = info_with_ranges(&[(0, 0xFFFF)]);
        // A range count larger than the buffer.
        b[48..52].copy_from_slice(&9u32.to_le_bytes());
        assert!(parse_iova_ranges(&b, 24).is_err());
        // A loop back to the first header.
        let mut b = info_with_ranges(&[(0, 0xFFFF)]);
        b[44..48].copy_from_slice(&24u32.to_le_bytes());
        assert!(parse_iova_ranges(&b, 24).is_err());
        assert!(parse_iova_ranges(&[0u8; 8], 1000).is_err());
    }
}
