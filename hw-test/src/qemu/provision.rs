//! Makes a fresh Debian 12 machine able to run the rig: the packages it needs (installed only when
//! missing) and a Debian kernel unpacked once into the cache directory and reused afterwards.
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::error::{IoContext, Result, RigError};
use super::host;

/// Debian packages the rig uses: QEMU itself, qemu-nbd for NBD-backed namespaces, a static
/// busybox for the guest's userland, and cpio (for anyone inspecting the initramfs by hand).
pub const PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "qemu-utils",
    "busybox-static",
    "cpio",
    // Copied into the guest to count the driver's system calls.
    "strace",
];

const KERNEL_META: &str = "linux-image-amd64";
const COMPLETE_MARK: &str = ".complete";

/// A kernel unpacked from its Debian package.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub package: String,
    pub vmlinuz: PathBuf,
    /// `lib/modules/<version>` inside the unpacked package.
    pub modules: PathBuf,
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|o| {
            o.status.success()
                && String::from_utf8_lossy(&o.stdout).contains("install ok installed")
        })
        .unwrap_or(false)
}

fn apt_get(args: &[&str]) -> Result<()> {
    host::run(
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .map(|_| ())
}

fn is_root() -> bool {
    host::stdout_of(Command::new("id").arg("-u"))
        .map(|s| s.trim() == "0")
        .unwrap_or(false)
}

/// Installs whichever of [`PACKAGES`] are missing (refreshing the package lists once if the
/// first attempt fails, as on a machine that never ran `apt-get update`).
pub fn ensure_packages() -> Result<()> {
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        return Err(RigError::Provision(format!(
            "packages {} are missing and installing them needs root: run `apt-get install -y {}`",
            missing.join(" "),
            missing.join(" ")
        )));
    }
    eprintln!("qemu-rig: installing {}", missing.join(" "));
    let mut args = vec!["install", "-y", "--no-install-recommends"];
    args.extend(&missing);
    if apt_get(&args).is_err() {
        apt_get(&["update"])?;
        apt_get(&args)?;
    }
    // Debian 12's qemu-system-x86 conflicts with a newer (backported) qemu-utils, so installing
    // it can remove qemu-utils; put back Debian 12's own.
    let removed: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if !removed.is_empty() {
        eprintln!(
            "qemu-rig: installing {} (removed by the previous install)",
            removed.join(" ")
        );
        let mut args = vec!["install", "-y", "--no-install-recommends"];
        args.extend(&removed);
        apt_get(&args)?;
    }
    Ok(())
}

/// The current `linux-image-<abi>-amd64` package that `linux-image-amd64` depends on.
fn resolve_kernel_package() -> Result<String> {
    let query = || -> Result<Option<String>> {
        let out = host::stdout_of(Command::new("apt-cache").args(["depends", KERNEL_META]))?;
        Ok(out
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Depends:"))
            .map(str::trim)
            .find(|p| p.starts_with("linux-image-") && p.ends_with("-amd64"))
            .map(str::to_string))
    };
    if let Ok(Some(p)) = query() {
        return Ok(p);
    }
    apt_get(&["update"])?;
    query()?.ok_or_else(|| {
        RigError::Provision(format!(
            "`apt-cache depends {KERNEL_META}` names no linux-image-*-amd64"
        ))
    })
}

fn cached_kernel(dir: &Path, package: &str) -> Result<Option<Kernel>> {
    if !dir.join(COMPLETE_MARK).exists() {
        return Ok(None);
    }
    let boot = dir.join("root/boot");
    let vmlinuz = fs::read_dir(&boot)
        .ctx("listing", &boot)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        });
    let mods = dir.join("root/lib/modules");
    let modules = fs::read_dir(&mods)
        .ctx("listing", &mods)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.join("kernel").is_dir());
    match (vmlinuz, modules) {
        (Some(vmlinuz), Some(modules)) => Ok(Some(Kernel {
            package: package.to_string(),
            vmlinuz,
            modules,
        })),
        _ => Err(RigError::Provision(format!(
            "cached kernel {} lacks boot/vmlinuz-* or lib/modules/*/kernel; delete it to fetch again",
            dir.display()
        ))),
    }
}

/// Any complete kernel already in the cache, for machines that cannot reach the archive.
fn any_cached_kernel(kernels: &Path) -> Option<Kernel> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(kernels)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    dirs.sort();
    dirs.iter().rev().find_map(|d| {
        let name = d.file_name()?.to_string_lossy().into_owned();
        cached_kernel(d, &name).ok().flatten()
    })
}

/// Returns the cached kernel, downloading and unpacking the current one first if needed.
/// The caller holds the cache lock.
pub fn ensure_kernel(cache: &Path) -> Result<Kernel> {
    let kernels = cache.join("kernel");
    let package = match resolve_kernel_package() {
        Ok(p) => p,
        Err(e) => return any_cached_kernel(&kernels).ok_or(e),
    };
    match fetch_kernel(&kernels, &package) {
        Ok(k) => Ok(k),
        Err(first) => {
            // Stale package lists can name a kernel the archive no longer has.
            apt_get(&["update"]).map_err(|_| first)?;
            fetch_kernel(&kernels, &resolve_kernel_package()?)
        }
    }
}

fn fetch_kernel(kernels: &Path, package: &str) -> Result<Kernel> {
    let dir = kernels.join(package);
    if let Some(k) = cached_kernel(&dir, package)? {
        return Ok(k);
    }
    eprintln!("qemu-rig: fetching {package} into {}", dir.display());
    if dir.exists() {
        fs::remove_dir_all(&dir).ctx("removing incomplete", &dir)?;
    }
    fs::create_dir_all(&dir).ctx("creating", &dir)?;
    host::run(
        Command::new("apt-get")
            .args(["download", package])
            .current_dir(&dir),
    )?;
    let deb = fs::read_dir(&dir)
        .ctx("listing", &dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| {
            RigError::Provision(format!(
                "`apt-get download {package}` left no .deb in {}",
                dir.display()
            ))
        })?;
    host::run(
        Command::new("dpkg")
            .arg("-x")
            .arg(&deb)
            .arg(dir.join("root")),
    )?;
    fs::remove_file(&deb).ctx("removing", &deb)?;
    fs::write(dir.join(COMPLETE_MARK), package).ctx("writing", dir.join(COMPLETE_MARK))?;
    cached_kernel(&dir, package)?.ok_or_else(|| {
        RigError::Provision(format!(
            "unpacked kernel in {} is incomplete",
            dir.display()
        ))
    })
}

/// The default cache directory: `$NVMQ_RIG_CACHE`, else `<target dir>/qemu-rig`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("NVMQ_RIG_CACHE") {
        return PathBuf::from(d);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let target = fs::canonicalize(&target).unwrap_or(target);
    target.join("qemu-rig")
}
