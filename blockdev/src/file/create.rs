//! Creating a file device (storage.md §3, "Creating a file device").
//!
//! The file is built under a temporary name and renamed into place only once it is complete and
//! durable, so a crash at any point leaves either no device or a whole one, never a half-written
//! file at the device's path that a later start would take for a device.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{FileDevice, FileOptions};
use crate::{BlockDevice, DeviceError, IoBuffer, Op};

/// Size of each zero-filling write.
const ZERO_CHUNK: usize = 1 << 20;

/// How long to wait for I/Os that `init` left in flight.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

pub(super) fn create<F>(
    path: &Path,
    size: u64,
    opts: FileOptions,
    init: F,
) -> Result<FileDevice, DeviceError>
where
    F: FnOnce(&mut FileDevice) -> Result<(), DeviceError>,
{
    let err = |detail: String| DeviceError::Open {
        op: Op::Open,
        path: path.display().to_string(),
        detail,
    };
    if opts.read_only {
        return Err(err(
            "cannot create a device with FileOptions::read_only set".into(),
        ));
    }
    if size == 0 || !size.is_multiple_of(4096) {
        return Err(err(format!(
            "cannot create a device of {size} bytes: the size must be a positive multiple of 4096"
        )));
    }
    let name = path
        .file_name()
        .ok_or_else(|| err("cannot create a device here: the path has no file name".into()))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    match std::fs::symlink_metadata(path) {
        Ok(_) => {
            return Err(err(
                "it already exists; create never replaces a file (open it, or remove it first)"
                    .into(),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e.to_string())),
    }
    let tmp = dir.join(format!(".{}.creating", name.to_string_lossy()));
    let tmp_err = |what: &str, e: io::Error| err(format!("{what} {}: {e}", tmp.display()));

    // Held (with its lock) until the device is in place.
    let lock = lock_temp(&tmp, opts.direct).map_err(|e| match e {
        LockError::Busy => err(format!(
            "another create of this path is in progress (it holds {})",
            tmp.display()
        )),
        LockError::Io(what, e) => tmp_err(what, e),
    })?;

    let built = build(&lock, &tmp, size, opts, init).and_then(|()| {
        rename_noreplace(&tmp, path).map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                err("it appeared while the device was being created; left it alone".into())
            } else {
                tmp_err("cannot rename into place", e)
            }
        })
    });
    if let Err(e) = built {
        // Ours: we hold its lock, so no other create is using it.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if let Err(e) = File::open(&dir).and_then(|d| d.sync_all()) {
        // The rename may not survive a crash; take the device away again rather than hand out
        // one whose name is not durable.
        let _ = std::fs::remove_file(path);
        return Err(err(format!(
            "cannot fsync the directory {}: {e}",
            dir.display()
        )));
    }
    drop(lock);
    FileDevice::open(path, opts)
}

enum LockError {
    Busy,
    Io(&'static str, io::Error),
}

/// Opens (creating if needed) and exclusively locks the temporary file, empty. A temporary file
/// that exists without a lock was left by a create that crashed and is reused. After taking the
/// lock, checks that the path still names the locked file: a create that finished meanwhile has
/// renamed it away (and we must not truncate the device it became).
fn lock_temp(tmp: &Path, direct: bool) -> Result<File, LockError> {
    for _ in 0..8 {
        let file = open_temp(tmp, direct).map_err(|e| LockError::Io("cannot create", e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(LockError::Busy),
            Err(TryLockError::Error(e)) => return Err(LockError::Io("cannot lock", e)),
        }
        let mine = file
            .metadata()
            .map_err(|e| LockError::Io("cannot stat", e))?;
        match std::fs::symlink_metadata(tmp) {
            Ok(m) if m.dev() == mine.dev() && m.ino() == mine.ino() => {
                file.set_len(0)
                    .map_err(|e| LockError::Io("cannot truncate", e))?;
                return Ok(file);
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(LockError::Io("cannot stat", e)),
        }
    }
    Err(LockError::Busy)
}

#[cfg(target_os = "linux")]
fn open_temp(tmp: &Path, direct: bool) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(if direct { libc::O_DIRECT } else { 0 })
        .open(tmp)
        .map_err(|e| {
            if direct && e.raw_os_error() == Some(libc::EINVAL) {
                io::Error::new(
                    e.kind(),
                    format!(
                        "the file system refused O_DIRECT ({e}); if it cannot do direct I/O \
                         (tmpfs), use FileOptions {{ direct: false, .. }}"
                    ),
                )
            } else {
                e
            }
        })
}

#[cfg(not(target_os = "linux"))]
fn open_temp(tmp: &Path, _direct: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(tmp)
}

/// Fills the temporary file with zeros, lets `init` write to it as a device, and makes it durable.
fn build<F>(
    file: &File,
    tmp: &Path,
    size: u64,
    opts: FileOptions,
    init: F,
) -> Result<(), DeviceError>
where
    F: FnOnce(&mut FileDevice) -> Result<(), DeviceError>,
{
    let err = |what: &str, e: io::Error| DeviceError::Open {
        op: Op::Open,
        path: tmp.display().to_string(),
        detail: format!("{what}: {e}"),
    };
    preallocate(file, size).map_err(|e| err("cannot allocate the device's space", e))?;
    let zeros = IoBuffer::new_heap(ZERO_CHUNK, 4096)?;
    let mut at = 0u64;
    while at < size {
        let n = (size - at).min(ZERO_CHUNK as u64) as usize;
        file.write_all_at(&zeros[..n], at)
            .map_err(|e| err(&format!("cannot write zeros at byte {at}"), e))?;
        at += n as u64;
    }
    // The zeros' extents must be on disk before `init`'s flushes mean anything.
    file.sync_all()
        .map_err(|e| err("cannot fsync after zero-filling", e))?;

    // Unlocked: this create holds the temporary file's lock through `file`.
    let mut dev = FileDevice::open_locked(tmp, opts, false)?;
    init(&mut dev)?;
    drain(&mut dev)?;
    drop(dev);
    file.sync_all().map_err(|e| err("cannot fsync", e))
}

/// Reserves the space up front, so that a full file system is reported before a gigabyte of
/// zeros is written, and the file gets extents as contiguous as the file system can give.
/// The zeros are still written: a merely preallocated range is "unwritten" and converting it costs
/// a journal commit on the first flush after each write into it.
#[cfg(target_os = "linux")]
fn preallocate(file: &File, size: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let len = libc::off_t::try_from(size)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "size too large"))?;
    // SAFETY: fallocate takes a descriptor and integers and touches no memory of ours; `file`
    // keeps the descriptor open during the call.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // The file system cannot preallocate; the zero writes allocate instead.
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Ok(()),
        _ => Err(e),
    }
}

#[cfg(not(target_os = "linux"))]
fn preallocate(_file: &File, _size: u64) -> io::Result<()> {
    Ok(())
}

/// Waits for every I/O `init` left outstanding and fails on the first error among them, so that a
/// device is never put in place with a write that failed unseen.
fn drain(dev: &mut FileDevice) -> Result<(), DeviceError> {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    let mut out = Vec::new();
    while dev.in_flight() > 0 {
        let now = Instant::now();
        if now >= deadline {
            return Err(DeviceError::Timeout {
                op: Op::Write,
                millis: DRAIN_TIMEOUT.as_millis() as u64,
            });
        }
        dev.wait(&mut out, deadline - now)?;
    }
    dev.poll(&mut out)?;
    out.into_iter().try_for_each(|c| c.result)
}

/// Renames `from` to `to` unless `to` exists (then `AlreadyExists`), atomically where the file
/// system supports `RENAME_NOREPLACE`.
#[cfg(target_os = "linux")]
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
    };
    let (cfrom, cto) = (c(from)?, c(to)?);
    // SAFETY: both paths are valid NUL-terminated strings that outlive the call; AT_FDCWD makes
    // them relative to the working directory like any path of ours.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cfrom.as_ptr(),
            libc::AT_FDCWD,
            cto.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // The file system or kernel lacks RENAME_NOREPLACE: check, then rename.
        Some(libc::EINVAL) | Some(libc::ENOSYS) => rename_checked(from, to),
        _ => Err(e),
    }
}

#[cfg(not(target_os = "linux"))]
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    rename_checked(from, to)
}

fn rename_checked(from: &Path, to: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(to) {
        Ok(_) => Err(io::Error::from(io::ErrorKind::AlreadyExists)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => std::fs::rename(from, to),
        Err(e) => Err(e),
    }
}
