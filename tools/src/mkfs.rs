//! `nvmq format`: writes a new, empty log (both superblock copies and the first checkpoint).

use anyhow::{anyhow, bail, Result};
use blockdev::{BlockDevice, DeviceError, Op};
use nvmq_log::format::{Superblock, SuperblockFault};
use nvmq_log::mkfs::read_superblocks;
use nvmq_log::FormatOptions;
use serde::Serialize;

use crate::describe::{bytes, DeviceReport, GeometryReport};
use crate::devspec::{parse_size, DeviceSpec};
use crate::Status;

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "Examples:\n  \
    nvmq format --device file:/var/lib/nvmq/log.img --size 4G   # create a 4 GiB device file\n  \
    nvmq format --device /dev/nvme0n1 --force                   # erase an existing log\n\n\
Exit status: 0 formatted; 1 refused or failed (the device is left as it was).")]
pub struct FormatArgs {
    /// The device to format: `file:<path>` (a regular file or a block device node) or
    /// `sim[:capacity=...]` (in memory: the format is gone when the command exits). Repeat it
    /// to format each device of a broker that has several.
    #[arg(long, required = true, action = clap::ArgAction::Append)]
    pub device: Vec<String>,
    /// Create the file first with this size (e.g. 512M, 4G; a multiple of 4 KiB), zero-filled.
    /// Only for `file:<path>` that does not exist yet.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Erase a device that already holds an nvmq log (or what looks like a damaged one).
    #[arg(long)]
    pub force: bool,
    /// Use only this many bytes for the log (default: all of the device after the 2 MiB of
    /// superblocks).
    #[arg(long, value_parser = parse_size)]
    pub log_size: Option<u64>,
    /// In-flight window W: bytes written but not yet durable that the writer allows.
    #[arg(long, value_parser = parse_size, default_value = "16M")]
    pub window: u64,
    /// Largest batch one group commit writes (clamped to the device's maximum transfer).
    #[arg(long, value_parser = parse_size, default_value = "1M")]
    pub max_batch: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize, Debug)]
struct FormatReport {
    device_spec: String,
    created: bool,
    device: DeviceReport,
    #[serde(flatten)]
    geometry: GeometryReport,
}

pub fn run(a: FormatArgs) -> Result<Status> {
    crate::each_device(&a.device, a.json, |d| run_one(&a, d))
}

fn run_one(a: &FormatArgs, device: &str) -> Result<Status> {
    let spec: DeviceSpec = device.parse()?;
    let max_batch = u32::try_from(a.max_batch)
        .map_err(|_| anyhow!("--max-batch {} is larger than 4 GiB", a.max_batch))?;
    let opts = FormatOptions {
        window: a.window,
        max_batch,
        log_size: a.log_size,
        format_id: None,
    };
    let mut formatted: Option<Result<Superblock, nvmq_log::LogError>> = None;
    let (dev, created) = match &spec {
        DeviceSpec::File { path: p, .. } if !p.exists() => {
            let size = a.size.ok_or_else(|| {
                anyhow!(
                    "{} does not exist; pass --size (e.g. --size 1G) to create it",
                    p.display()
                )
            })?;
            let pb = crate::progress::spinner(format!(
                "creating {} ({}, zero-filled)",
                p.display(),
                bytes(size)
            ));
            let dev = spec.open(Some(size), |d| format_into(d, &opts, &mut formatted));
            pb.finish_and_clear();
            (with_format_error(dev, &mut formatted)?, true)
        }
        _ => {
            let mut dev = spec.open(None, |_| Ok(()))?;
            if let (DeviceSpec::File { path: p, .. }, Some(size)) = (&spec, a.size) {
                if size != dev.info().capacity {
                    bail!(
                        "--size {size} given, but {} exists with {} B; format never resizes a device (drop --size, or remove the file first)",
                        p.display(),
                        dev.info().capacity
                    );
                }
            }
            if !a.force {
                refuse_existing_log(&mut *dev, device)?;
            }
            // A plain call; the Result is checked just below.
            let _ = format_into(&mut *dev, &opts, &mut formatted);
            (with_format_error(Ok(dev), &mut formatted)?, false)
        }
    };
    let sb = match formatted {
        Some(Ok(sb)) => sb,
        Some(Err(e)) => return Err(anyhow!(e).context(format!("formatting {}", device))),
        None => bail!(
            "formatting {}: the device was opened but not formatted",
            device
        ),
    };
    let report = FormatReport {
        device_spec: device.to_string(),
        created,
        device: DeviceReport::new(dev.info(), spec.backend()),
        geometry: GeometryReport::new(&sb),
    };
    tracing::info!(device = %device, format_id = %report.geometry.format_id, log_size = sb.log_size, created, "formatted");
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_human(&report, &spec);
    }
    Ok(Status::Ok)
}

fn print_human(r: &FormatReport, spec: &DeviceSpec) {
    println!(
        "formatted {}{}",
        r.device_spec,
        if r.created { " (created)" } else { "" }
    );
    println!("device");
    for l in r.device.lines() {
        println!("  {l}");
    }
    let r = &r.geometry;
    println!("log");
    println!("  format id            {}", r.format_id);
    println!("  write unit           {} B", r.write_unit);
    println!(
        "  log region           {} at byte {} (superblock copies at 0 and 1 MiB)",
        bytes(r.log_size),
        r.log_start
    );
    println!("  in-flight window     {}", bytes(r.window));
    println!("  max batch            {}", bytes(u64::from(r.max_batch)));
    if matches!(spec, DeviceSpec::Sim(_)) {
        println!("note: a sim device lives in memory; this format is gone when the command exits");
    }
}

/// Formats and keeps the result; a failure becomes a device error so that a create in progress
/// is abandoned (its temporary file removed).
fn format_into(
    dev: &mut dyn BlockDevice,
    opts: &FormatOptions,
    out: &mut Option<Result<Superblock, nvmq_log::LogError>>,
) -> Result<(), DeviceError> {
    let r = nvmq_log::mkfs::format(dev, opts);
    let failed = r.as_ref().err().map(|e| e.to_string());
    *out = Some(r);
    match failed {
        None => Ok(()),
        Some(detail) => Err(DeviceError::Io {
            op: Op::Write,
            lba: 0,
            detail: format!("format failed: {detail}"),
        }),
    }
}

/// A format error inside a create is more telling than the create error that wraps it.
fn with_format_error<T>(
    r: Result<T>,
    formatted: &mut Option<Result<Superblock, nvmq_log::LogError>>,
) -> Result<T> {
    match (r, formatted.as_ref()) {
        (Ok(v), _) => Ok(v),
        (Err(_), Some(Err(e))) => Err(anyhow!("{e}")),
        (Err(e), _) => Err(e),
    }
}

/// Refuses a device whose superblocks show an nvmq log, valid or damaged.
fn refuse_existing_log(dev: &mut dyn BlockDevice, name: &str) -> Result<()> {
    let copies = read_superblocks(dev);
    if let Some(sb) = copies.iter().flatten().max_by_key(|sb| sb.sequence) {
        bail!(
            "{name} already holds an nvmq log (format id {:#018x}, superblock sequence {}, durable through {} B); pass --force to erase it",
            sb.format_id,
            sb.sequence,
            sb.durable_through
        );
    }
    let looks_like_ours = |f: &SuperblockFault| {
        !matches!(
            f,
            SuperblockFault::Blank | SuperblockFault::BadMagic | SuperblockFault::Short
        )
    };
    let faults: Vec<&SuperblockFault> = copies.iter().filter_map(|c| c.as_ref().err()).collect();
    if faults.iter().any(|f| looks_like_ours(f)) {
        bail!(
            "{name} holds what looks like a damaged nvmq log (superblock A: {}; B: {}); pass --force to erase it, or run `nvmq inspect` first",
            faults.first().map_or(String::new(), |f| f.to_string()),
            faults.get(1).map_or(String::new(), |f| f.to_string())
        );
    }
    Ok(())
}
