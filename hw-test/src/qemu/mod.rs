//! A QEMU/TCG guest with an emulated NVMe controller behind an emulated Intel IOMMU, handed to
//! vfio-pci by a busybox init, running host-built binaries and reporting their output and exit
//! codes. One boot runs any number of commands.
//!
//! ```no_run
//! use hw_test::qemu::{GuestCmd, Rig, RigOptions};
//! let rig = Rig::new(RigOptions { logical_block_size: 4096, physical_block_size: 4096, ..Default::default() })?;
//! let run = rig.run(&[GuestCmd::host("target/debug/nvme-check", ["--pci", "{pci}"])])?;
//! assert_eq!(run.commands[0].exit_code, 0, "{}", run.commands[0].output);
//! # Ok::<(), hw_test::qemu::RigError>(())
//! ```
mod boot;
mod console;
mod error;
mod host;
mod init;
mod initramfs;
mod modules;
mod nbd;
mod provision;

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use boot::KillSwitch;
pub use console::{KernelNvme, VfioBinding};
pub use error::{Result, RigError};
pub use init::{Stage, GUEST_IP, PLACEHOLDERS};
pub use nbd::NbdServer;
pub use provision::{default_cache_dir, ensure_packages, Kernel, PACKAGES};

use error::IoContext;
use initramfs::Cpio;

/// What backs the emulated namespace.
#[derive(Debug, Clone)]
pub enum Disk {
    /// A raw image file. `path: None` creates a sparse one in the run's work directory; a given
    /// path is created with `size` bytes if missing and used as it is otherwise.
    Image { path: Option<PathBuf>, size: u64 },
    /// An NBD export on a unix socket (e.g. [`NbdServer`]).
    Nbd { socket: PathBuf },
}

/// `127.0.0.1:<host>` on the host forwards to `<guest>` on the guest's [`GUEST_IP`].
#[derive(Debug, Clone, Copy)]
pub struct PortForward {
    pub host: u16,
    pub guest: u16,
}

#[derive(Debug, Clone)]
pub struct RigOptions {
    /// Kernel download, unpacked kernel and per-run work directories.
    pub cache_dir: PathBuf,
    pub disk: Disk,
    pub logical_block_size: u32,
    pub physical_block_size: u32,
    pub memory_mib: u32,
    pub cpus: u32,
    /// Hard limit for one boot, QEMU start to exit; QEMU is killed when it passes.
    pub timeout: Duration,
    /// Let the kernel's nvme driver probe the controller first (reports its geometry as
    /// [`RigRun::kernel_nvme`] and runs [`Stage::KernelNvme`] commands), then hand it to vfio-pci.
    pub kernel_nvme_stage: bool,
    /// The emulated IOMMU's guest address width (`aw-bits`: 39 or 48); `None` keeps QEMU's
    /// default (39), so IOVAs must stay below 2^39.
    pub iommu_address_bits: Option<u8>,
    /// Non-empty: an e1000 NIC on QEMU's user network with these forwards, configured in the guest.
    pub forwards: Vec<PortForward>,
    /// Keep the run's work directory (initramfs, image, console log) after a successful run.
    pub keep_workdir: bool,
    /// Copy the guest console to stderr as it arrives.
    pub echo_console: bool,
}

impl Default for RigOptions {
    fn default() -> Self {
        Self {
            cache_dir: default_cache_dir(),
            disk: Disk::Image {
                path: None,
                size: 64 << 20,
            },
            logical_block_size: 512,
            physical_block_size: 512,
            memory_mib: 1024,
            cpus: 2,
            timeout: Duration::from_secs(120),
            kernel_nvme_stage: true,
            iommu_address_bits: None,
            forwards: Vec::new(),
            keep_workdir: false,
            echo_console: std::env::var_os("NVMQ_RIG_ECHO").is_some(),
        }
    }
}

#[derive(Debug, Clone)]
enum Program {
    Host(PathBuf),
    Shell(String),
}

/// One command for the guest. Arguments may hold the placeholders `{pci}` (the NVMe function's
/// address), `{group}` (its IOMMU group) and `{block}` (its kernel block device, kernel stage
/// only); the same values are exported as `NVMQ_NVME_PCI`, `NVMQ_VFIO_GROUP`, `NVMQ_NVME_BLOCK`.
/// `{bin:<file name>}` is replaced by the guest path of a binary added with
/// [`GuestCmd::with_binary`] (or of the command's own program).
#[derive(Debug, Clone)]
pub struct GuestCmd {
    program: Program,
    args: Vec<String>,
    stage: Stage,
    binaries: Vec<PathBuf>,
}

impl GuestCmd {
    /// A host-built binary, copied into the guest with its shared libraries.
    pub fn host<I, S>(binary: impl Into<PathBuf>, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            program: Program::Host(binary.into()),
            args: args.into_iter().map(Into::into).collect(),
            stage: Stage::Vfio,
            binaries: Vec::new(),
        }
    }

    /// A busybox shell script run with `sh -c`.
    pub fn shell(script: impl Into<String>) -> Self {
        Self {
            program: Program::Shell(script.into()),
            args: Vec::new(),
            stage: Stage::Vfio,
            binaries: Vec::new(),
        }
    }

    /// Also copies host binary `path` (with its libraries) into the guest, for a command that
    /// runs it, e.g. `GuestCmd::host("/usr/bin/strace", ["-c", "{bin:nvme-check}"])`.
    pub fn with_binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binaries.push(path.into());
        self
    }

    /// Runs the command while the kernel's nvme driver still owns the controller.
    pub fn in_stage(mut self, stage: Stage) -> Self {
        self.stage = stage;
        self
    }

    pub fn label(&self) -> String {
        let head = match &self.program {
            Program::Host(p) => file_name(p),
            Program::Shell(s) => format!("sh -c {s:?}"),
        };
        std::iter::once(head)
            .chain(self.args.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[derive(Debug, Clone)]
pub struct CmdResult {
    pub label: String,
    /// stdout and stderr interleaved, one `\n` per line.
    pub output: String,
    pub exit_code: i32,
}

#[derive(Debug, Clone)]
pub struct RigRun {
    /// In the order given to [`Rig::run`].
    pub commands: Vec<CmdResult>,
    /// QEMU start to the guest init's first line.
    pub boot_time: Duration,
    /// QEMU start to QEMU exit.
    pub total_time: Duration,
    pub nvme_pci: String,
    pub vfio: VfioBinding,
    pub kernel_nvme: Option<KernelNvme>,
    /// `<interface> <address>` when the guest has a network.
    pub net: Option<String>,
    pub console: String,
    /// Set when the work directory was kept.
    pub workdir: Option<PathBuf>,
}

pub struct Rig {
    opts: RigOptions,
    kernel: Kernel,
    busybox: PathBuf,
    vfio_modules: Vec<PathBuf>,
    nvme_modules: Vec<PathBuf>,
    net_modules: Vec<PathBuf>,
}

fn validate(opts: &RigOptions) -> Result<()> {
    let lbs = opts.logical_block_size;
    let pbs = opts.physical_block_size;
    let bad = |option, reason: String| Err(RigError::Option { option, reason });
    if !lbs.is_power_of_two() || !(512..=2 << 20).contains(&lbs) {
        return bad(
            "logical_block_size",
            format!("{lbs} is not a power of two in 512..=2 MiB"),
        );
    }
    if !pbs.is_power_of_two() || pbs < lbs || pbs > 2 << 20 {
        return bad(
            "physical_block_size",
            format!("{pbs} is not a power of two between logical_block_size {lbs} and 2 MiB"),
        );
    }
    if let Disk::Image { size, .. } = opts.disk {
        if size == 0 || !size.is_multiple_of(u64::from(lbs)) {
            return bad(
                "disk size",
                format!("{size} bytes is not a positive multiple of the {lbs}-byte block"),
            );
        }
    }
    if let Some(bits) = opts.iommu_address_bits {
        if bits != 39 && bits != 48 {
            return bad(
                "iommu_address_bits",
                format!("{bits}: QEMU's intel-iommu takes 39 or 48"),
            );
        }
    }
    if opts.cpus == 0 || opts.memory_mib < 128 {
        return bad(
            "cpus/memory_mib",
            format!("{} cpus, {} MiB", opts.cpus, opts.memory_mib),
        );
    }
    Ok(())
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "cmd".into())
}

fn find_busybox() -> Result<PathBuf> {
    ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or_else(|| RigError::Provision("busybox not found in /bin or /usr/bin".into()))
}

static RUN_COUNTER: AtomicU32 = AtomicU32::new(0);

fn new_workdir(cache: &Path) -> Result<PathBuf> {
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let dir = cache.join("runs").join(format!(
        "run-{}-{stamp}-{}",
        std::process::id(),
        RUN_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&dir).ctx("creating work directory", &dir)?;
    Ok(dir)
}

fn guest_module_paths(cpio: &mut Cpio, modules: &[PathBuf]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for m in modules {
        let name = m
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let guest = format!("/rig/modules/{name}");
        cpio.file(&guest, 0o644, &fs::read(m).ctx("reading kernel module", m)?)?;
        out.push(guest);
    }
    Ok(out)
}

impl Rig {
    /// Checks the options, installs missing packages and makes sure a kernel is cached.
    pub fn new(opts: RigOptions) -> Result<Self> {
        validate(&opts)?;
        fs::create_dir_all(&opts.cache_dir).ctx("creating cache directory", &opts.cache_dir)?;
        let lock_path = opts.cache_dir.join("lock");
        let lock = File::create(&lock_path).ctx("creating", &lock_path)?;
        lock.lock().ctx("locking", &lock_path)?;
        ensure_packages()?;
        let kernel = provision::ensure_kernel(&opts.cache_dir)?;
        drop(lock);
        let tree = modules::ModuleTree::open(&kernel.modules)?;
        let vfio_modules = tree.load_order(modules::VFIO)?;
        let nvme_modules = if opts.kernel_nvme_stage {
            tree.load_order(modules::KERNEL_NVME)?
        } else {
            Vec::new()
        };
        let net_modules = if opts.forwards.is_empty() {
            Vec::new()
        } else {
            tree.load_order(modules::E1000)?
        };
        Ok(Self {
            busybox: find_busybox()?,
            opts,
            kernel,
            vfio_modules,
            nvme_modules,
            net_modules,
        })
    }

    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    pub fn options(&self) -> &RigOptions {
        &self.opts
    }

    fn initramfs(&self, cmds: &[GuestCmd], out: &Path) -> Result<()> {
        let mut cpio = Cpio::new();
        for d in [
            "/dev",
            "/proc",
            "/sys",
            "/tmp",
            "/run",
            "/bin",
            "/sbin",
            "/usr/bin",
            "/usr/sbin",
        ] {
            cpio.dir(d)?;
        }
        cpio.char_dev("/dev/console", 0o600, 5, 1)?;
        initramfs::add_binary(&mut cpio, &self.busybox, "/bin/busybox")?;
        let mut plan = init::InitPlan {
            vfio_modules: guest_module_paths(&mut cpio, &self.vfio_modules)?,
            nvme_modules: guest_module_paths(&mut cpio, &self.nvme_modules)?,
            net_modules: guest_module_paths(&mut cpio, &self.net_modules)?,
            commands: Vec::new(),
        };
        let mut placed: Vec<(PathBuf, String)> = Vec::new();
        let mut place = |cpio: &mut Cpio, path: &PathBuf| -> Result<String> {
            if let Some((_, g)) = placed.iter().find(|(p, _)| p == path) {
                return Ok(g.clone());
            }
            let g = format!("/rig/bin/{}-{}", placed.len(), file_name(path));
            initramfs::add_binary(cpio, path, &g)?;
            placed.push((path.clone(), g.clone()));
            Ok(g)
        };
        for (n, cmd) in cmds.iter().enumerate() {
            if cmd.stage == Stage::KernelNvme && !self.opts.kernel_nvme_stage {
                return Err(RigError::Option {
                    option: "kernel_nvme_stage",
                    reason: format!(
                        "command {n} ({}) needs the kernel NVMe stage, which is off",
                        cmd.label()
                    ),
                });
            }
            let mut bins: Vec<(String, String)> = Vec::new();
            for b in &cmd.binaries {
                bins.push((format!("{{bin:{}}}", file_name(b)), place(&mut cpio, b)?));
            }
            if let Program::Host(path) = &cmd.program {
                bins.push((
                    format!("{{bin:{}}}", file_name(path)),
                    place(&mut cpio, path)?,
                ));
            }
            let subst = |a: &String| {
                bins.iter()
                    .fold(a.clone(), |a, (ph, guest)| a.replace(ph.as_str(), guest))
            };
            let mut argv = match &cmd.program {
                Program::Shell(script) => vec!["sh".into(), "-c".into(), subst(script)],
                Program::Host(_) => vec![bins[bins.len() - 1].1.clone()],
            };
            argv.extend(cmd.args.iter().map(subst));
            plan.commands.push(init::PlannedCmd {
                argv,
                stage: cmd.stage,
            });
        }
        cpio.file("/init", 0o755, init::script(&plan).as_bytes())?;
        fs::write(out, cpio.finish()).ctx("writing initramfs", out)
    }

    fn qemu_command(&self, workdir: &Path, initrd: &Path) -> Result<Command> {
        let o = &self.opts;
        let drive = match &o.disk {
            Disk::Image { path, size } => {
                let image = path.clone().unwrap_or_else(|| workdir.join("nvme.img"));
                if !image.exists() {
                    let f = File::create(&image).ctx("creating disk image", &image)?;
                    f.set_len(*size).ctx("sizing disk image", &image)?;
                }
                format!(
                    "file={},if=none,id=nv0,format=raw,cache=none",
                    image.display()
                )
            }
            Disk::Nbd { socket } => {
                format!(
                    "file=nbd+unix:///?socket={},if=none,id=nv0,format=raw",
                    socket.display()
                )
            }
        };
        let mut iommu = String::from("intel-iommu,intremap=on,caching-mode=on");
        if let Some(bits) = o.iommu_address_bits {
            iommu.push_str(&format!(",aw-bits={bits}"));
        }
        let mut cmd = Command::new("qemu-system-x86_64");
        cmd.args(["-accel", "tcg", "-machine", "q35,kernel-irqchip=split"])
            .args(["-m", &o.memory_mib.to_string(), "-smp", &o.cpus.to_string()])
            .args([
                "-nographic",
                "-nodefaults",
                "-serial",
                "stdio",
                "-no-reboot",
            ])
            // Before any other PCI device, so every later device sits behind the IOMMU.
            .arg("-device")
            .arg(iommu)
            .arg("-kernel")
            .arg(&self.kernel.vmlinuz)
            .arg("-initrd")
            .arg(initrd)
            .args([
                "-append",
                "console=ttyS0 intel_iommu=on iommu=pt quiet panic=-1",
            ])
            .args(["-drive", &drive])
            .arg("-device")
            .arg(format!(
                "nvme,serial=nvmq0,drive=nv0,logical_block_size={},physical_block_size={}",
                o.logical_block_size, o.physical_block_size
            ));
        if !o.forwards.is_empty() {
            let fwd: String = o
                .forwards
                .iter()
                .map(|f| format!(",hostfwd=tcp:127.0.0.1:{}-:{}", f.host, f.guest))
                .collect();
            cmd.args(["-netdev", &format!("user,id=net0{fwd}")])
                .args(["-device", "e1000,netdev=net0"]);
        }
        Ok(cmd)
    }

    /// One boot in a new work directory: returns the directory, the console log's path and the
    /// outcome.
    fn boot(
        &self,
        cmds: &[GuestCmd],
        kill_at: Option<&str>,
        switch: Option<&KillSwitch>,
    ) -> Result<(PathBuf, PathBuf, boot::BootOutcome)> {
        let workdir = new_workdir(&self.opts.cache_dir)?;
        let initrd = workdir.join("initramfs.cpio");
        self.initramfs(cmds, &initrd)?;
        let qemu = self.qemu_command(&workdir, &initrd)?;
        let log = workdir.join("console.log");
        let o = &self.opts;
        let outcome = boot::boot(qemu, o.timeout, &log, o.echo_console, kill_at, switch)?;
        Ok((workdir, log, outcome))
    }

    /// The work directory after a successful run: kept (and returned) if asked, else removed.
    fn keep_or_remove(&self, workdir: PathBuf) -> Result<Option<PathBuf>> {
        if self.opts.keep_workdir {
            return Ok(Some(workdir));
        }
        fs::remove_dir_all(&workdir).ctx("removing work directory", &workdir)?;
        Ok(None)
    }

    /// Boots the guest once and runs `cmds` in it (kernel-stage commands first, then the rest,
    /// each group in the given order). A command's non-zero exit is reported in its
    /// [`CmdResult`], not as an error; errors are failures of the rig or the guest's init.
    pub fn run(&self, cmds: &[GuestCmd]) -> Result<RigRun> {
        let (workdir, log, outcome) = self.boot(cmds, None, None)?;
        let r = &outcome.report;
        let tail = || boot::tail(&outcome.console);
        if let Some(reason) = &r.failure {
            let dmesg = r.dmesg.join("\n");
            return Err(RigError::GuestInit {
                reason: format!("{reason}\nguest kernel log:\n{dmesg}"),
                log,
                tail: tail(),
            });
        }
        if !outcome.status.success() || !r.done {
            if !r.done && outcome.status.success() {
                return Err(RigError::GuestInit {
                    reason: "the guest powered off without printing RIG-DONE".into(),
                    log,
                    tail: tail(),
                });
            }
            return Err(RigError::QemuExit {
                status: outcome.status.to_string(),
                log,
                stderr: outcome.stderr.trim().to_string(),
                tail: tail(),
            });
        }
        if !r.malformed.is_empty() {
            return Err(RigError::Console {
                log,
                reason: format!("unparsable marker lines: {:?}", r.malformed),
            });
        }
        let console_err = |reason: String| RigError::Console {
            log: log.clone(),
            reason,
        };
        let mut commands = Vec::with_capacity(cmds.len());
        for (n, cmd) in cmds.iter().enumerate() {
            let out = r.commands.get(n).filter(|c| c.began).ok_or_else(|| {
                console_err(format!("command {n} ({}) never started", cmd.label()))
            })?;
            let exit_code = out.exit_code.ok_or_else(|| {
                console_err(format!("command {n} ({}) has no exit code", cmd.label()))
            })?;
            let mut output = out.lines.join("\n");
            if !output.is_empty() {
                output.push('\n');
            }
            commands.push(CmdResult {
                label: cmd.label(),
                output,
                exit_code,
            });
        }
        let vfio = r
            .vfio
            .clone()
            .ok_or_else(|| console_err("no RIG-VFIO line".into()))?;
        let nvme_pci = r
            .nvme_pci
            .clone()
            .ok_or_else(|| console_err("no RIG-NVME-PCI line".into()))?;
        let boot_time = outcome
            .boot_time
            .ok_or_else(|| console_err("no RIG-INIT-START line".into()))?;
        let kept = self.keep_or_remove(workdir)?;
        Ok(RigRun {
            commands,
            boot_time,
            total_time: outcome.total_time,
            nvme_pci,
            vfio,
            kernel_nvme: r.kernel_nvme.clone(),
            net: r.net.clone(),
            console: outcome.console,
            workdir: kept,
        })
    }
}

/// A boot that the host ended by killing QEMU at a console marker ([`Rig::run_until_marker`]).
#[derive(Debug, Clone)]
pub struct KilledRun {
    /// The commands that began before the kill, in the order given; the one cut short has no
    /// exit code.
    pub commands: Vec<PartialCmd>,
    /// QEMU start to the guest init's first line.
    pub boot_time: Option<Duration>,
    /// QEMU start to the kill.
    pub killed_after: Duration,
    pub kernel_nvme: Option<KernelNvme>,
    pub console: String,
    /// Set when the work directory was kept.
    pub workdir: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct PartialCmd {
    pub label: String,
    pub output: String,
    pub exit_code: Option<i32>,
}

impl Rig {
    /// Boots the guest and runs `cmds` as [`Rig::run`] does, but kills QEMU (SIGKILL) the moment
    /// a console line contains `marker` (e.g. a command's `echo` of it): the guest neither shuts
    /// down nor flushes its NVMe, so whatever the storage behind the namespace held only in a
    /// volatile cache is still unflushed. It is an error if the guest finishes, fails or times out
    /// before the marker appears.
    pub fn run_until_marker(&self, cmds: &[GuestCmd], marker: &str) -> Result<KilledRun> {
        self.run_until_killed(cmds, Some(marker), None)
    }

    /// [`Rig::run_until_marker`] where the kill also comes when `switch` is pulled (from another
    /// thread, at a moment the host picks), whichever is first. With no marker, only the switch
    /// ends the run.
    pub fn run_until_killed(
        &self,
        cmds: &[GuestCmd],
        marker: Option<&str>,
        switch: Option<&KillSwitch>,
    ) -> Result<KilledRun> {
        let (workdir, log, outcome) = self.boot(cmds, marker, switch)?;
        let marker = marker.unwrap_or("(kill switch)");
        let r = &outcome.report;
        if !outcome.killed_at_marker {
            let reason = match &r.failure {
                Some(f) => format!("{f}; the marker {marker:?} never appeared"),
                None => format!("the guest ended without printing the marker {marker:?}"),
            };
            return Err(RigError::GuestInit {
                reason,
                log,
                tail: boot::tail(&outcome.console),
            });
        }
        let commands = cmds
            .iter()
            .zip(&r.commands)
            .filter(|(_, out)| out.began)
            .map(|(cmd, out)| PartialCmd {
                label: cmd.label(),
                output: out.lines.iter().map(|l| format!("{l}\n")).collect(),
                exit_code: out.exit_code,
            })
            .collect();
        let kept = self.keep_or_remove(workdir)?;
        Ok(KilledRun {
            commands,
            boot_time: outcome.boot_time,
            killed_after: outcome.total_time,
            kernel_nvme: r.kernel_nvme.clone(),
            console: outcome.console,
            workdir: kept,
        })
    }
}

/// A port on 127.0.0.1 that was free a moment ago, for [`PortForward::host`].
pub fn free_local_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").ctx("binding", "127.0.0.1:0")?;
    Ok(l.local_addr()
        .ctx("reading address of", "127.0.0.1:0")?
        .port())
}
