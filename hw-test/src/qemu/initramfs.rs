//! The guest's initramfs: a `newc` cpio archive written directly (so device nodes and root
//! ownership need no privileges on the host), holding busybox, `/init`, kernel modules and
//! host-built binaries with the shared libraries `ldd` names for them.
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::error::{IoContext, Result, RigError};

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFCHR: u32 = 0o020000;

#[derive(Default)]
pub struct Cpio {
    buf: Vec<u8>,
    next_ino: u32,
    /// Every path already in the archive (without leading `/`).
    paths: BTreeSet<String>,
}

fn pad4(buf: &mut Vec<u8>) {
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

fn archive_name(path: &str) -> String {
    path.trim_start_matches('/').to_string()
}

impl Cpio {
    pub fn new() -> Self {
        Self::default()
    }

    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) -> Result<()> {
        let size = u32::try_from(data.len()).map_err(|_| RigError::Option {
            option: "initramfs",
            reason: format!("{name} is {} bytes, more than newc cpio holds", data.len()),
        })?;
        self.next_ino += 1;
        let nlink = if mode & S_IFDIR != 0 { 2 } else { 1 };
        let fields = [
            self.next_ino,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime
            size,
            0, // devmajor
            0, // devminor
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0, // check
        ];
        self.buf.extend_from_slice(b"070701");
        for f in fields {
            self.buf.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        pad4(&mut self.buf);
        self.buf.extend_from_slice(data);
        pad4(&mut self.buf);
        Ok(())
    }

    /// Adds `path` and any missing parent directories.
    pub fn dir(&mut self, path: &str) -> Result<()> {
        let name = archive_name(path);
        if name.is_empty() || self.paths.contains(&name) {
            return Ok(());
        }
        if let Some((parent, _)) = name.rsplit_once('/') {
            self.dir(parent)?;
        }
        self.paths.insert(name.clone());
        self.entry(&name, S_IFDIR | 0o755, (0, 0), &[])
    }

    fn leaf(&mut self, path: &str, mode: u32, rdev: (u32, u32), data: &[u8]) -> Result<()> {
        let name = archive_name(path);
        if !self.paths.insert(name.clone()) {
            return Ok(());
        }
        if let Some((parent, _)) = name.rsplit_once('/') {
            self.dir(parent)?;
        }
        self.entry(&name, mode, rdev, data)
    }

    pub fn file(&mut self, path: &str, perm: u32, data: &[u8]) -> Result<()> {
        self.leaf(path, S_IFREG | perm, (0, 0), data)
    }

    pub fn char_dev(&mut self, path: &str, perm: u32, major: u32, minor: u32) -> Result<()> {
        self.leaf(path, S_IFCHR | perm, (major, minor), &[])
    }

    pub fn contains(&self, path: &str) -> bool {
        self.paths.contains(&archive_name(path))
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.next_ino += 1;
        let _ = self.entry("TRAILER!!!", 0, (0, 0), &[]);
        // The kernel reads the archive in 512-byte blocks, like cpio writes it.
        while !self.buf.len().is_multiple_of(512) {
            self.buf.push(0);
        }
        self.buf
    }
}

/// Shared objects (and the dynamic loader) `ldd` lists for `binary`; empty for static binaries.
pub fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|source| RigError::Spawn {
            command: format!("ldd {}", binary.display()),
            source,
        })?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    if text.contains("statically linked")
        || err.contains("not a dynamic executable")
        || text.contains("not a dynamic executable")
    {
        return Ok(Vec::new());
    }
    if !out.status.success() {
        return Err(RigError::GuestBinary {
            path: binary.to_path_buf(),
            reason: format!("ldd failed: {}", err.trim()),
        });
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let target = match line.split_once("=>") {
            Some((name, rest)) => {
                let rest = rest.trim();
                if rest.starts_with("not found") {
                    return Err(RigError::GuestBinary {
                        path: binary.to_path_buf(),
                        reason: format!("shared library {} not found on the host", name.trim()),
                    });
                }
                rest
            }
            None => line,
        };
        let path = target.split(" (").next().unwrap_or("").trim();
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

/// Copies `binary` to `guest_path` plus its shared libraries at their host paths.
pub fn add_binary(cpio: &mut Cpio, binary: &Path, guest_path: &str) -> Result<()> {
    let data = fs::read(binary).ctx("reading guest binary", binary)?;
    if !data.starts_with(b"\x7fELF") {
        return Err(RigError::GuestBinary {
            path: binary.to_path_buf(),
            reason: "not an ELF executable".into(),
        });
    }
    cpio.file(guest_path, 0o755, &data)?;
    for lib in shared_libraries(binary)? {
        let name = lib.to_string_lossy().into_owned();
        if cpio.contains(&name) {
            continue;
        }
        let bytes = fs::read(&lib).ctx("reading shared library", &lib)?;
        cpio.file(&name, 0o755, &bytes)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newc_entries_are_aligned_and_parents_come_first() {
        let mut c = Cpio::new();
        c.file("/a/b/f", 0o644, b"hello").unwrap();
        c.char_dev("/dev/console", 0o600, 5, 1).unwrap();
        c.file("/a/b/f", 0o644, b"dup ignored").unwrap();
        let buf = c.finish();
        assert_eq!(buf.len() % 512, 0);
        let text = String::from_utf8_lossy(&buf);
        let pos = |s: &str| text.find(s).unwrap_or_else(|| panic!("{s} missing"));
        assert!(pos("a\0") < pos("a/b\0") && pos("a/b\0") < pos("a/b/f\0"));
        assert!(pos("TRAILER!!!") > pos("dev/console"));
        assert!(!text.contains("dup ignored"));
        // First header: magic, then ino 1, mode of directory `a`.
        assert_eq!(&buf[..6], b"070701");
        assert_eq!(&buf[14..22], b"000041ed");
        // The device node's header (110 bytes before its name) carries rdev major 5, minor 1.
        let hdr = pos("dev/console\0") - 110;
        assert_eq!(&buf[hdr + 14..hdr + 22], b"00002180");
        assert_eq!(&buf[hdr + 78..hdr + 94], b"0000000500000001");
    }

    #[test]
    fn ldd_lists_the_loader_for_a_dynamic_binary() {
        let libs = shared_libraries(Path::new("/bin/sh")).unwrap();
        assert!(
            libs.iter()
                .any(|l| l.to_string_lossy().contains("ld-linux")),
            "{libs:?}"
        );
        assert!(libs.iter().any(|l| l.to_string_lossy().contains("libc.so")));
    }
}
