//! Boots the QEMU rig once and runs the given commands in the guest, e.g.
//! `nvmq-qemu-rig --lba 4096 --host target/debug/guest-probe --host-arg=--require-vfio`.
#![forbid(unsafe_code)]
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;
use hw_test::qemu::{free_local_port, Disk, GuestCmd, PortForward, Rig, RigOptions, Stage};

#[derive(Parser)]
#[command(about = "Boot a QEMU guest whose NVMe is bound to vfio-pci and run commands in it")]
struct Args {
    /// Only install packages and fetch the kernel, then exit.
    #[arg(long)]
    provision_only: bool,
    /// Logical block size of the namespace.
    #[arg(long, default_value_t = 512)]
    lba: u32,
    /// Physical block size (default: the logical block size).
    #[arg(long)]
    pba: Option<u32>,
    /// Size of a fresh image, in MiB.
    #[arg(long, default_value_t = 64)]
    size_mib: u64,
    /// Use (or create) this image file instead of a throw-away one.
    #[arg(long)]
    image: Option<PathBuf>,
    /// Back the namespace with the NBD export on this unix socket.
    #[arg(long, conflicts_with = "image")]
    nbd: Option<PathBuf>,
    /// Forward 127.0.0.1:<host> to the guest's <guest> port (HOST:GUEST, HOST 0 = any free port).
    #[arg(long, value_name = "HOST:GUEST")]
    forward: Vec<String>,
    /// Host binary to run in the guest; its arguments follow as --arg after it.
    #[arg(long = "host", value_name = "BINARY")]
    hosts: Vec<PathBuf>,
    /// Extra host binary copied into the guest for every command; `{bin:<file name>}` in an
    /// argument or script is its guest path (e.g. `--host /usr/bin/strace --host-arg={bin:nvme-check}`).
    #[arg(long = "with-binary", value_name = "BINARY")]
    with_binaries: Vec<PathBuf>,
    /// Shell command to run in the guest (after the host binaries).
    #[arg(long = "shell", value_name = "SCRIPT")]
    shells: Vec<String>,
    /// Shell command to run while the kernel's nvme driver still owns the controller.
    #[arg(long = "kernel-shell", value_name = "SCRIPT")]
    kernel_shells: Vec<String>,
    /// Argument for every --host binary ({pci}, {group} are substituted in the guest).
    #[arg(long = "host-arg", allow_hyphen_values = true)]
    host_args: Vec<String>,
    /// Hard limit for the boot, in seconds.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// Guest address width of the emulated IOMMU (39 or 48; QEMU's default is 39).
    #[arg(long)]
    aw_bits: Option<u8>,
    /// Do not let the kernel's nvme driver probe the controller before the vfio hand-over.
    #[arg(long)]
    no_kernel_stage: bool,
    /// Keep the work directory (initramfs, image, console log).
    #[arg(long)]
    keep: bool,
    /// Copy the guest console to stderr as it arrives.
    #[arg(long)]
    echo: bool,
}

fn forward(spec: &str) -> Result<PortForward> {
    let Some((h, g)) = spec.split_once(':') else {
        bail!("--forward {spec:?}: expected HOST:GUEST");
    };
    let host: u16 = h
        .parse()
        .map_err(|e| anyhow::anyhow!("--forward {spec:?}: host port: {e}"))?;
    let guest: u16 = g
        .parse()
        .map_err(|e| anyhow::anyhow!("--forward {spec:?}: guest port: {e}"))?;
    let host = if host == 0 { free_local_port()? } else { host };
    Ok(PortForward { host, guest })
}

fn main() -> Result<ExitCode> {
    let a = Args::parse();
    let disk = match (a.nbd, a.image) {
        (Some(socket), _) => Disk::Nbd { socket },
        (None, path) => Disk::Image {
            path,
            size: a.size_mib << 20,
        },
    };
    let forwards = a
        .forward
        .iter()
        .map(|s| forward(s))
        .collect::<Result<Vec<_>>>()?;
    for f in &forwards {
        eprintln!("forward 127.0.0.1:{} -> guest:{}", f.host, f.guest);
    }
    let rig = Rig::new(RigOptions {
        disk,
        logical_block_size: a.lba,
        physical_block_size: a.pba.unwrap_or(a.lba),
        timeout: Duration::from_secs(a.timeout),
        kernel_nvme_stage: !a.no_kernel_stage,
        iommu_address_bits: a.aw_bits,
        forwards,
        keep_workdir: a.keep,
        echo_console: a.echo,
        ..RigOptions::default()
    })?;
    eprintln!(
        "kernel {} ({})",
        rig.kernel().package,
        rig.kernel().vmlinuz.display()
    );
    if a.provision_only {
        return Ok(ExitCode::SUCCESS);
    }
    let mut cmds: Vec<GuestCmd> = a
        .kernel_shells
        .iter()
        .map(|s| GuestCmd::shell(s.clone()).in_stage(Stage::KernelNvme))
        .collect();
    cmds.extend(
        a.hosts
            .iter()
            .map(|h| GuestCmd::host(h.clone(), a.host_args.clone())),
    );
    cmds.extend(a.shells.iter().map(|s| GuestCmd::shell(s.clone())));
    let cmds: Vec<GuestCmd> = cmds
        .into_iter()
        .map(|c| {
            a.with_binaries
                .iter()
                .fold(c, |c, b| c.with_binary(b.clone()))
        })
        .collect();
    let run = rig.run(&cmds)?;
    println!(
        "boot {:.2?} (to guest init), total {:.2?}; nvme {} -> {} group {}",
        run.boot_time, run.total_time, run.nvme_pci, run.vfio.driver, run.vfio.group
    );
    if let Some(k) = &run.kernel_nvme {
        println!(
            "kernel nvme: {} logical {} physical {} sectors {}",
            k.block_device, k.logical_block_size, k.physical_block_size, k.sectors
        );
    }
    if let Some(dir) = &run.workdir {
        println!("work directory kept: {}", dir.display());
    }
    let mut failed = false;
    for (n, c) in run.commands.iter().enumerate() {
        println!("--- [{n}] {} -> exit {}", c.label, c.exit_code);
        print!("{}", c.output);
        failed |= c.exit_code != 0;
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
