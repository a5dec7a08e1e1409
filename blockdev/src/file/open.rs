//! Opening a file device: checking what the path is, opening it for direct I/O, and probing its
//! geometry and identity.
//!
//! Geometry of a regular file: the logical block size is the file's direct I/O offset alignment as
//! the kernel reports it (`statx` `STATX_DIOALIGN`), or 4096 when the kernel does not say (4096 is
//! safe on every file system we meet: it is a multiple of every sector size and the page size).
//! The physical block size is taken to be the same; the file system block (`st_blksize`) goes into
//! `fs_block_size`, which the write unit includes. Geometry of a block device comes from its ioctls.

use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use crate::{DeviceError, DeviceInfo, Op};

/// Largest single transfer the file backend accepts; larger I/Os are split by the caller.
pub(super) const MAX_TRANSFER: u32 = 1 << 20;

/// Logical block size used when the kernel does not report a direct I/O alignment.
const FALLBACK_BLOCK: u32 = 4096;

/// An opened device file with its geometry.
pub(super) struct Opened {
    pub file: File,
    pub info: DeviceInfo,
    /// The memory alignment direct I/O needs of a buffer; 1 when not opened for direct I/O.
    pub mem_align: usize,
}

/// Geometry probed from an open file.
struct Geometry {
    logical: u32,
    physical: u32,
    capacity: u64,
    fs_block: u32,
    mem_align: usize,
    model: String,
    identity_extra: String,
}

fn open_error(path: &Path, detail: String) -> DeviceError {
    DeviceError::Open {
        op: Op::Open,
        path: path.display().to_string(),
        detail,
    }
}

/// Opens an existing regular file or block device, for reading and writing unless `read_only`,
/// holding an exclusive lock on a regular file when `lock` is set; never creates.
pub(super) fn open_device(
    path: &Path,
    direct: bool,
    read_only: bool,
    lock: bool,
) -> Result<Opened, DeviceError> {
    let err = |detail: String| open_error(path, detail);
    let meta = std::fs::metadata(path).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            err("it does not exist (opening never creates a device; create it with format)".into())
        } else {
            err(e.to_string())
        }
    })?;
    let block_device = meta.file_type().is_block_device();
    if !meta.is_file() && !block_device {
        return Err(err(format!(
            "it is {}, not a regular file or a block device",
            describe(&meta)
        )));
    }
    let file = open_file(path, direct, block_device, read_only)?;
    if lock && !block_device {
        lock_exclusive(path, &file)?;
    }
    // Check again on the descriptor: the path may have been replaced between the two looks.
    let meta = file
        .metadata()
        .map_err(|e| err(format!("fstat failed: {e}")))?;
    if meta.file_type().is_block_device() != block_device || !(meta.is_file() || block_device) {
        return Err(err("it changed type while being opened".into()));
    }
    let geo = if block_device {
        block_geometry(path, &file, &meta)?
    } else {
        file_geometry(path, &file, &meta, direct)?
    };
    if geo.capacity == 0 {
        return Err(err("it is empty (a device needs at least one block)".into()));
    }
    if !geo.capacity.is_multiple_of(u64::from(geo.logical)) {
        return Err(err(format!(
            "its size ({} bytes) is not a multiple of its logical block size ({} bytes)",
            geo.capacity, geo.logical
        )));
    }
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let identity = format!(
        "file:{} dev={} ino={}{}",
        canonical.display(),
        meta.dev(),
        meta.ino(),
        geo.identity_extra
    );
    Ok(Opened {
        file,
        info: DeviceInfo {
            logical_block_size: geo.logical,
            physical_block_size: geo.physical,
            capacity: geo.capacity,
            max_transfer: MAX_TRANSFER,
            atomic_write_unit: 0,
            preferred_write: 0,
            // Always: even with a power-loss-protected drive, the file system's metadata needs
            // the flush.
            volatile_write_cache: true,
            fs_block_size: geo.fs_block,
            identity,
            model: geo.model,
            health: String::new(),
            // Filled in by the engine once it runs.
            engine: String::new(),
            // Set by the device once it knows it may write.
            linked_flush: false,
        },
        mem_align: if direct { geo.mem_align.max(1) } else { 1 },
    })
}

/// Opens `n` more descriptions of the device at `path` for flushes (see `flushes`), read-write,
/// and checks that each is the same file as `main` (`st_dev` and `st_ino`): a path replaced since
/// `main` was opened would have the flushes sync another file. Without `O_DIRECT` (an `fdatasync`
/// transfers nothing) and without `O_EXCL` (the main description holds a block device's exclusive
/// claim; a second exclusive open would be refused).
pub(super) fn open_flush_descriptions(
    path: &Path,
    main: &File,
    n: usize,
) -> Result<Vec<File>, DeviceError> {
    let err = |detail: String| open_error(path, detail);
    if n == 0 {
        return Ok(Vec::new());
    }
    let want = main
        .metadata()
        .map_err(|e| err(format!("fstat failed: {e}")))?;
    (1..=n)
        .map(|i| {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(|e| err(format!("cannot open flush description {i} of {n}: {e}")))?;
            let got = f
                .metadata()
                .map_err(|e| err(format!("fstat of flush description {i} failed: {e}")))?;
            if (got.dev(), got.ino()) != (want.dev(), want.ino()) {
                return Err(err(format!(
                    "flush description {i} is another file (dev={} ino={}) than the device \
                     opened (dev={} ino={}): the path was replaced while it was being opened",
                    got.dev(),
                    got.ino(),
                    want.dev(),
                    want.ino()
                )));
            }
            Ok(f)
        })
        .collect()
}

fn describe(meta: &Metadata) -> &'static str {
    let ft = meta.file_type();
    if ft.is_dir() {
        "a directory"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "something else"
    }
}

/// How long an open waits for the lock before refusing. A process killed with I/O in an
/// io_uring keeps its file (and lock) until the kernel has finished that I/O, a moment after
/// the process is gone; a restart right after a kill must not be refused for that.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Holds an exclusive `flock` on a regular file opened for writing, released when the file closes
/// (also when the process dies): two writers on one log would each believe their tail is the end.
fn lock_exclusive(path: &Path, file: &File) -> Result<(), DeviceError> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(open_error(
                    path,
                    format!(
                        "another process has it open for writing (a running nvmq serve?), still \
                         after {} s; stop it first, or look with inspect or verify, which open \
                         it read-only",
                        LOCK_WAIT.as_secs()
                    ),
                ))
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(open_error(path, format!("cannot lock it: {e}")))
            }
        }
    }
}

/// Opens read-write (read-only when asked), with `O_DIRECT` when asked and, read-write, `O_EXCL`
/// for a block device (Linux refuses an exclusive open of a block device that is mounted or
/// claimed, which protects a disk in use; a read-only look is allowed beside its owner).
#[cfg(target_os = "linux")]
fn open_file(
    path: &Path,
    direct: bool,
    block_device: bool,
    read_only: bool,
) -> Result<File, DeviceError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut flags = 0;
    if direct {
        flags |= libc::O_DIRECT;
    }
    if block_device && !read_only {
        flags |= libc::O_EXCL;
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(!read_only)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| {
            let detail = match e.raw_os_error() {
                Some(libc::EINVAL) if direct => format!(
                    "the file system refused O_DIRECT ({e}); if it cannot do direct I/O \
                     (tmpfs, some FUSE file systems), open with FileOptions {{ direct: false, .. }}"
                ),
                Some(libc::EBUSY) if block_device => {
                    format!(
                        "the block device is in use (mounted or claimed by another program): {e}"
                    )
                }
                _ => e.to_string(),
            };
            open_error(path, detail)
        })
}

/// macOS has no `O_DIRECT`; `F_NOCACHE` on the descriptor is its equivalent.
#[cfg(target_os = "macos")]
fn open_file(
    path: &Path,
    direct: bool,
    _block_device: bool,
    read_only: bool,
) -> Result<File, DeviceError> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(path)
        .map_err(|e| open_error(path, e.to_string()))?;
    if direct {
        // SAFETY: F_NOCACHE takes an integer argument and touches no memory of ours; the
        // descriptor is owned by `file`, which outlives the call.
        let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_NOCACHE, 1) };
        if rc == -1 {
            let e = io::Error::last_os_error();
            return Err(open_error(
                path,
                format!("F_NOCACHE refused ({e}); open with FileOptions {{ direct: false, .. }}"),
            ));
        }
    }
    Ok(file)
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn open_file(
    path: &Path,
    direct: bool,
    _block_device: bool,
    read_only: bool,
) -> Result<File, DeviceError> {
    if direct {
        return Err(open_error(
            path,
            "direct I/O is not supported on this platform; open with FileOptions { direct: false, .. }"
                .into(),
        ));
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(path)
        .map_err(|e| open_error(path, e.to_string()))
}

fn file_geometry(
    path: &Path,
    file: &File,
    meta: &Metadata,
    direct: bool,
) -> Result<Geometry, DeviceError> {
    let (logical, mem_align) =
        match dio_alignment(file) {
            // The kernel says this file cannot do direct I/O at all.
            Some((_, 0)) if direct => return Err(open_error(
                path,
                "the file system does not support O_DIRECT on this file (statx reports no direct \
                 I/O alignment); open with FileOptions { direct: false, .. }"
                    .into(),
            )),
            Some((mem, offset)) if sane_block(offset) => (offset, mem as usize),
            _ => (FALLBACK_BLOCK, FALLBACK_BLOCK as usize),
        };
    Ok(Geometry {
        logical,
        physical: logical,
        capacity: meta.len(),
        fs_block: u32::try_from(meta.blksize()).unwrap_or(0),
        mem_align,
        model: String::new(),
        identity_extra: String::new(),
    })
}

/// A block size we believe: a power of two from 512 bytes to the maximum transfer.
fn sane_block(size: u32) -> bool {
    size.is_power_of_two() && (512..=MAX_TRANSFER).contains(&size)
}

/// The direct I/O alignments `(memory, file offset)` the kernel reports for this file, if it
/// reports them (`STATX_DIOALIGN`, Linux 6.1 and later). An offset alignment of 0 means the file
/// cannot do direct I/O.
#[cfg(target_os = "linux")]
fn dio_alignment(file: &File) -> Option<(u32, u32)> {
    use std::mem::MaybeUninit;
    use std::os::fd::AsRawFd;
    let mut stx = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: with AT_EMPTY_PATH and an empty path, statx describes the descriptor itself, which
    // `file` keeps open during the call; the path is a valid NUL-terminated string; `stx` points
    // to writable memory of the size of `struct statx`, which is all the kernel writes.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            stx.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return None;
    }
    // SAFETY: the struct was zero-initialised (valid: it holds only integers) and then filled by
    // the kernel.
    let stx = unsafe { stx.assume_init() };
    if stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    Some((stx.stx_dio_mem_align, stx.stx_dio_offset_align))
}

#[cfg(not(target_os = "linux"))]
fn dio_alignment(_file: &File) -> Option<(u32, u32)> {
    None
}

/// `BLKGETSIZE64` is `_IOR(0x12, 114, size_t)`; the libc crate does not define it. The encoding
/// of the read direction differs on a few architectures.
#[cfg(target_os = "linux")]
const BLKGETSIZE64: libc::Ioctl = {
    #[cfg(any(
        target_arch = "mips",
        target_arch = "mips64",
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "sparc",
        target_arch = "sparc64"
    ))]
    const IOC_READ: u32 = 2 << 29;
    #[cfg(not(any(
        target_arch = "mips",
        target_arch = "mips64",
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "sparc",
        target_arch = "sparc64"
    )))]
    const IOC_READ: u32 = 2 << 30;
    (IOC_READ | ((std::mem::size_of::<libc::size_t>() as u32) << 16) | (0x12 << 8) | 114)
        as libc::Ioctl
};

#[cfg(target_os = "linux")]
fn block_geometry(path: &Path, file: &File, meta: &Metadata) -> Result<Geometry, DeviceError> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let ioctl_err = |name: &str| {
        let e = io::Error::last_os_error();
        open_error(path, format!("ioctl {name} failed: {e}"))
    };
    let mut logical: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which points to a live local int; the
    // descriptor is open for the duration.
    if unsafe { libc::ioctl(fd, libc::BLKSSZGET, &mut logical as *mut libc::c_int) } != 0 {
        return Err(ioctl_err("BLKSSZGET"));
    }
    let mut physical: libc::c_uint = 0;
    // SAFETY: BLKPBSZGET writes one unsigned int through the pointer, which points to a live local
    // unsigned int; the descriptor is open for the duration.
    if unsafe { libc::ioctl(fd, libc::BLKPBSZGET, &mut physical as *mut libc::c_uint) } != 0 {
        return Err(ioctl_err("BLKPBSZGET"));
    }
    let mut capacity: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one 64-bit size through the pointer, which points to a live
    // local u64; the descriptor is open for the duration.
    if unsafe { libc::ioctl(fd, BLKGETSIZE64, &mut capacity as *mut u64) } != 0 {
        return Err(ioctl_err("BLKGETSIZE64"));
    }
    let logical = u32::try_from(logical)
        .ok()
        .filter(|&l| sane_block(l))
        .ok_or_else(|| {
            open_error(
                path,
                format!("the device reports a logical block size of {logical}"),
            )
        })?;
    let physical = if sane_block(physical) && physical >= logical {
        physical
    } else {
        logical
    };
    let mem_align = match dio_alignment(file) {
        Some((mem, _)) if mem > 0 => mem as usize,
        _ => logical as usize,
    };
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    Ok(Geometry {
        logical,
        physical,
        capacity,
        fs_block: 0,
        mem_align,
        model: block_model(major, minor),
        identity_extra: format!(" rdev={major}:{minor}"),
    })
}

#[cfg(not(target_os = "linux"))]
fn block_geometry(path: &Path, _file: &File, _meta: &Metadata) -> Result<Geometry, DeviceError> {
    Err(open_error(
        path,
        "block devices are supported on Linux only; use a regular file".into(),
    ))
}

/// The model string sysfs shows for a block device, or its parent disk for a partition; empty if
/// neither is readable.
#[cfg(target_os = "linux")]
fn block_model(major: u32, minor: u32) -> String {
    let base = format!("/sys/dev/block/{major}:{minor}");
    [
        format!("{base}/device/model"),
        format!("{base}/../device/model"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .map(|s| s.trim().to_string())
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    #[test]
    fn blkgetsize64_matches_the_kernel_header() {
        assert_eq!(format!("{BLKGETSIZE64:#x}"), "0x80081272");
    }

    #[test]
    fn a_flush_description_of_another_file_is_refused_naming_both() {
        let dir = std::env::temp_dir().join(format!("nvmq-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a"), dir.join("b"));
        for p in [&a, &b] {
            std::fs::write(p, [0u8; 4096]).unwrap();
        }
        let main = File::open(&a).unwrap();
        let (ma, mb) = (
            std::fs::metadata(&a).unwrap(),
            std::fs::metadata(&b).unwrap(),
        );
        assert_eq!(open_flush_descriptions(&a, &main, 3).unwrap().len(), 3);
        assert!(open_flush_descriptions(&a, &main, 0).unwrap().is_empty());
        // As if `a` had been replaced by `b` after the main description was opened.
        let e = open_flush_descriptions(&b, &main, 2)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("dev={} ino={}", mb.dev(), mb.ino()))
                && e.contains(&format!("dev={} ino={}", ma.dev(), ma.ino()))
                && e.contains("flush description 1"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_powers_of_two_in_range_are_block_sizes() {
        assert!(sane_block(512));
        assert!(sane_block(4096));
        assert!(!sane_block(0));
        assert!(!sane_block(256));
        assert!(!sane_block(1536));
        assert!(!sane_block(2 << 20));
    }
}
