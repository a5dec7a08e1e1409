//! Device specifications on the command line: `sim[:key=value,...]`,
//! `file:<path>[,engine=uring|threads|auto][,flush_fds=N]`, a path, or
//! `nvme:<PCI address>[,ns=<id>][,io_timeout_ms=<ms>]` (the userspace driver; the function must be
//! bound to vfio-pci).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use blockdev::file::{Engine, FileDevice, FileOptions, MAX_FLUSH_DESCRIPTIONS};
use blockdev::sim::{Latency, SimClock, SimConfig, SimDevice};
use blockdev::BlockDevice;

/// A parsed `--device` value.
#[derive(Debug, Clone)]
pub enum DeviceSpec {
    Sim(SimSpec),
    File {
        path: PathBuf,
        /// `engine=`: overrides [`FileOptions::engine`]; `None` keeps the caller's choice.
        engine: Option<Engine>,
        /// `flush_fds=`: overrides [`FileOptions::flush_descriptions`]; `None` keeps the caller's.
        flush_fds: Option<usize>,
    },
    Nvme {
        pci: String,
        nsid: u32,
        /// `NvmeOptions::io_timeout`; `None` keeps the driver's default (30 s).
        io_timeout: Option<Duration>,
    },
}

#[derive(Debug, Clone)]
pub struct SimSpec {
    pub capacity: u64,
    pub write: Duration,
    pub flush: Duration,
    pub volatile_cache: bool,
    pub serialize_flushes: bool,
    /// Takes linked write+flush pairs (`linked=true`).
    pub linked_flush: bool,
    pub seed: u64,
}

impl std::str::FromStr for DeviceSpec {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<DeviceSpec> {
        if s == "sim" || s.starts_with("sim:") {
            let mut spec = SimSpec {
                capacity: 256 << 20,
                write: Duration::from_micros(20),
                flush: Duration::from_micros(4400),
                volatile_cache: true,
                serialize_flushes: false,
                linked_flush: false,
                seed: 1,
            };
            for kv in s
                .strip_prefix("sim:")
                .unwrap_or("")
                .split(',')
                .filter(|x| !x.is_empty())
            {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| anyhow!("device {s:?}: expected key=value, got {kv:?}"))?;
                match k {
                    "capacity" => spec.capacity = parse_size(v).with_context(|| format!("device {s:?}"))?,
                    "write" => spec.write = parse_duration(v).with_context(|| format!("device {s:?}"))?,
                    "flush" => spec.flush = parse_duration(v).with_context(|| format!("device {s:?}"))?,
                    "plp" => spec.volatile_cache = !parse_bool(v).with_context(|| format!("device {s:?}"))?,
                    "serialize" => spec.serialize_flushes = parse_bool(v).with_context(|| format!("device {s:?}"))?,
                    "linked" => spec.linked_flush = parse_bool(v).with_context(|| format!("device {s:?}"))?,
                    "seed" => spec.seed = v.parse().with_context(|| format!("device {s:?}: seed {v:?}"))?,
                    _ => bail!("device {s:?}: unknown sim option {k:?} (capacity, write, flush, plp, serialize, linked, seed)"),
                }
            }
            return Ok(DeviceSpec::Sim(spec));
        }
        if let Some(rest) = s.strip_prefix("nvme:") {
            return parse_nvme(s, rest);
        }
        parse_file(s, s.strip_prefix("file:").unwrap_or(s))
    }
}

/// A device and the read-only queue pairs opened beside it (see
/// [`DeviceSpec::open_with_readers`]).
pub type WithReaders = (Box<dyn BlockDevice>, Vec<Box<dyn BlockDevice>>);

impl DeviceSpec {
    /// The backend's name, for reports.
    pub fn backend(&self) -> &'static str {
        match self {
            DeviceSpec::Sim(_) => "sim",
            DeviceSpec::File { .. } => "file",
            DeviceSpec::Nvme { .. } => "nvme",
        }
    }

    /// Opens the device; a file is created (zero-filled, `size` bytes) when `create` is set and it
    /// does not exist, with `init` run on it before it is renamed into place.
    pub fn open(
        &self,
        create: Option<u64>,
        init: impl FnOnce(&mut dyn BlockDevice) -> Result<(), blockdev::DeviceError>,
    ) -> Result<Box<dyn BlockDevice>> {
        self.open_with(create, FileOptions::default(), init)
    }

    /// [`DeviceSpec::open`], plus up to `readers` more I/O queue pairs of the same NVMe
    /// controller for the log's readers (`nvmq_log::direct`), each to be owned by one reader
    /// thread at a time. Other backends have none: their reads go through the writer.
    pub fn open_with_readers(
        &self,
        create: Option<u64>,
        readers: u16,
        init: impl FnOnce(&mut dyn BlockDevice) -> Result<(), blockdev::DeviceError>,
    ) -> Result<WithReaders> {
        match self {
            DeviceSpec::Nvme {
                pci,
                nsid,
                io_timeout,
            } => open_nvme(pci, *nsid, *io_timeout, readers, init),
            _ => Ok((self.open(create, init)?, Vec::new())),
        }
    }

    /// [`DeviceSpec::open`] with the file backend's options (ignored by other backends).
    pub fn open_with(
        &self,
        create: Option<u64>,
        file_opts: FileOptions,
        init: impl FnOnce(&mut dyn BlockDevice) -> Result<(), blockdev::DeviceError>,
    ) -> Result<Box<dyn BlockDevice>> {
        match self {
            DeviceSpec::Sim(s) => {
                let mut cfg = SimConfig::new(s.seed, s.capacity);
                cfg.write_latency = fixed(s.write);
                cfg.flush_latency = fixed(s.flush);
                cfg.volatile_cache = s.volatile_cache;
                cfg.serialize_flushes = s.serialize_flushes;
                cfg.linked_flush = s.linked_flush;
                cfg.clock = SimClock::real();
                let (mut dev, _handle) = SimDevice::new(cfg);
                init(&mut dev)?;
                Ok(Box::new(dev))
            }
            DeviceSpec::Nvme {
                pci,
                nsid,
                io_timeout,
            } => open_nvme(pci, *nsid, *io_timeout, 0, init).map(|(dev, _)| dev),
            DeviceSpec::File {
                path: p,
                engine,
                flush_fds,
            } => {
                let reshape = crate::geometry_seam::Reshape::from_env()?;
                let mut file_opts = FileOptions {
                    engine: engine.unwrap_or(file_opts.engine),
                    flush_descriptions: flush_fds.unwrap_or(file_opts.flush_descriptions),
                    ..file_opts
                };
                if let Some(r) = &reshape {
                    file_opts = r.file_options(file_opts);
                }
                if file_opts.flush_descriptions > 1 {
                    tracing::warn!(
                        flush_fds = file_opts.flush_descriptions,
                        "flushes run {} at a time: a drive or block layer that reports a failed cache write-back to only one of the flushes running could let an earlier flush succeed over lost data; use only on storage known to fail every flush after such an error",
                        file_opts.flush_descriptions
                    );
                }
                if let (Some(size), false) = (create, p.exists()) {
                    if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                        std::fs::create_dir_all(dir)
                            .with_context(|| format!("creating {}", dir.display()))?;
                    }
                    let mut dev = FileDevice::create(p, size, file_opts, |d| init(d))
                        .with_context(|| format!("creating device file {}", p.display()))?;
                    arm_seams(&mut dev, p, reshape.as_ref())?;
                    return Ok(Box::new(dev));
                }
                let mut dev = FileDevice::open(p, file_opts)
                    .with_context(|| format!("opening device {}", p.display()))?;
                init(&mut dev)?;
                arm_seams(&mut dev, p, reshape.as_ref())?;
                Ok(Box::new(dev))
            }
        }
    }
}

/// Fault-injection seam, for tests of the running binary only: with
/// `NVMQ_FAULT_FLUSH_FAIL_AFTER=N` in the environment, every file device this process opens lets
/// N flushes succeed and fails the next one with EIO, as a failed `fdatasync` would (the device
/// stops, and so does its log's writer). It exists so that a test can make `nvmq serve` meet a
/// flush failure from outside the process; nothing else reads it, and it costs nothing unset.
pub const FAULT_FLUSH_FAIL_AFTER: &str = "NVMQ_FAULT_FLUSH_FAIL_AFTER";

/// EIO, what the injected flush failure reports (the same number on Linux and macOS).
const EIO: i32 = 5;

/// Arms the test seams on a file device just opened: the geometry of
/// [`crate::geometry_seam::FAULT_GEOMETRY`] (`reshape`) and [`FAULT_FLUSH_FAIL_AFTER`], when set.
fn arm_seams(
    dev: &mut FileDevice,
    path: &std::path::Path,
    reshape: Option<&crate::geometry_seam::Reshape>,
) -> Result<()> {
    if let Some(r) = reshape {
        r.apply(dev, path)?;
    }
    let Some(v) = std::env::var_os(FAULT_FLUSH_FAIL_AFTER) else {
        return Ok(());
    };
    let after: u64 = v
        .to_str()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| {
            anyhow!(
                "{FAULT_FLUSH_FAIL_AFTER}={v:?}: expected a whole number of flushes to let \
                 succeed before one fails (a fault-injection seam for tests; unset it otherwise)"
            )
        })?;
    tracing::warn!(
        device = %path.display(),
        after,
        "FAULT INJECTION ({FAULT_FLUSH_FAIL_AFTER}): flush {} of this device will fail with EIO",
        after.saturating_add(1)
    );
    dev.inject_flush_failure_after(after, EIO);
    Ok(())
}

/// `file:<path>` with trailing `,engine=...` and `,flush_fds=N` options in either order. Only a
/// trailing comma that starts one of them is an option, so any other comma stays part of the path.
fn parse_file(s: &str, rest: &str) -> Result<DeviceSpec> {
    let (mut path, mut engine, mut flush_fds) = (rest, None, None);
    while let Some((head, opt)) = path.rsplit_once(',') {
        if let Some(v) = opt.strip_prefix("engine=") {
            if engine.is_some() {
                bail!("device {s:?}: engine= is given twice");
            }
            let e = v
                .parse::<Engine>()
                .with_context(|| format!("device {s:?}: engine={v:?}"))?;
            engine = Some(e);
        } else if let Some(v) = opt.strip_prefix("flush_fds=") {
            if flush_fds.is_some() {
                bail!("device {s:?}: flush_fds= is given twice");
            }
            let n = v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_FLUSH_DESCRIPTIONS).contains(n))
                .ok_or_else(|| {
                    anyhow!(
                        "device {s:?}: flush_fds={v:?} is not a whole number from 1 to \
                         {MAX_FLUSH_DESCRIPTIONS} (how many fdatasyncs may run at once, each on \
                         its own open file description; 1 runs one at a time)"
                    )
                })?;
            flush_fds = Some(n);
        } else {
            break;
        }
        path = head;
    }
    if path.is_empty() {
        bail!("device {s:?}: empty path");
    }
    Ok(DeviceSpec::File {
        path: PathBuf::from(path),
        engine,
        flush_fds,
    })
}

/// Largest `io_timeout_ms` (one hour, as the driver accepts).
const MAX_IO_TIMEOUT_MS: u64 = 3_600_000;

/// `nvme:0000:00:04.0`, `nvme:00:04.0,ns=2`, `nvme:00:04.0,io_timeout_ms=5000`.
fn parse_nvme(s: &str, rest: &str) -> Result<DeviceSpec> {
    let mut parts = rest.split(',');
    let addr = parts.next().unwrap_or("");
    let mut nsid = 1u32;
    let mut io_timeout = None;
    for kv in parts {
        match kv.split_once('=') {
            Some(("ns", v)) => {
                nsid = v.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                    anyhow!("device {s:?}: ns={v:?} is not a namespace id (1, 2, ...)")
                })?
            }
            Some(("io_timeout_ms", v)) => {
                let ms: u64 = v
                    .parse()
                    .ok()
                    .filter(|ms| (1..=MAX_IO_TIMEOUT_MS).contains(ms))
                    .ok_or_else(|| {
                        anyhow!(
                            "device {s:?}: io_timeout_ms={v:?} is not a whole number of \
                             milliseconds from 1 to {MAX_IO_TIMEOUT_MS}"
                        )
                    })?;
                io_timeout = Some(Duration::from_millis(ms));
            }
            _ => bail!(
                "device {s:?}: unknown nvme option {kv:?} (ns=<id>, io_timeout_ms=<milliseconds>)"
            ),
        }
    }
    let full = if addr.matches(':').count() == 1 {
        format!("0000:{addr}")
    } else {
        addr.to_string()
    };
    let hex = |x: &str, n: usize| x.len() == n && x.chars().all(|c| c.is_ascii_hexdigit());
    let ok = match full.split(':').collect::<Vec<_>>()[..] {
        [dom, bus, devfn] => match devfn.split_once('.') {
            Some((dev, f)) => {
                hex(dom, 4) && hex(bus, 2) && hex(dev, 2) && f.len() == 1 && ("0".."8").contains(&f)
            }
            None => false,
        },
        _ => false,
    };
    if !ok {
        bail!("device {s:?}: {addr:?} is not a PCI address like 0000:00:04.0");
    }
    Ok(DeviceSpec::Nvme {
        pci: full.to_ascii_lowercase(),
        nsid,
        io_timeout,
    })
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
fn open_nvme(
    pci: &str,
    nsid: u32,
    io_timeout: Option<Duration>,
    readers: u16,
    init: impl FnOnce(&mut dyn BlockDevice) -> Result<(), blockdev::DeviceError>,
) -> Result<WithReaders> {
    use blockdev::nvme::{NvmeDevice, NvmeOptions};
    let defaults = NvmeOptions::default();
    let opts = NvmeOptions {
        io_timeout: io_timeout.unwrap_or(defaults.io_timeout),
        queue_pairs: readers.saturating_add(1),
        ..defaults
    };
    let mut dev = NvmeDevice::open(pci, nsid, opts)
        .with_context(|| format!("opening NVMe device {pci} namespace {nsid}"))?;
    init(&mut dev)?;
    let pairs = reader_pairs(&dev, readers, |d| d.queue_pair())
        .with_context(|| format!("NVMe device {pci}: opening the readers' queue pairs"))?;
    Ok((Box::new(dev), pairs))
}

/// Up to `wanted` more queue pairs from `open` (None: the controller granted no more), with a
/// line saying what the readers share when it granted fewer.
pub fn reader_pairs<D: BlockDevice + 'static>(
    dev: &D,
    wanted: u16,
    open: impl Fn(&D) -> Result<Option<D>, blockdev::DeviceError>,
) -> Result<Vec<Box<dyn BlockDevice>>, blockdev::DeviceError> {
    let mut pairs: Vec<Box<dyn BlockDevice>> = Vec::new();
    while pairs.len() < usize::from(wanted) {
        match open(dev)? {
            Some(p) => pairs.push(Box::new(p)),
            None => break,
        }
    }
    if pairs.len() < usize::from(wanted) {
        tracing::warn!(
            device = %dev.info().identity,
            asked = wanted + 1,
            granted = pairs.len() + 1,
            "the NVMe controller granted fewer I/O queue pairs than asked (one for the writer, one per event loop for reads): {} of the loops' device reads have a pair of their own, the others share the writer's, through the loop that hosts it",
            pairs.len()
        );
    }
    Ok(pairs)
}

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
fn open_nvme(
    pci: &str,
    _nsid: u32,
    _io_timeout: Option<Duration>,
    _readers: u16,
    _init: impl FnOnce(&mut dyn BlockDevice) -> Result<(), blockdev::DeviceError>,
) -> Result<WithReaders> {
    // The spec parses everywhere, so the refusal names the device; the backend is left out of
    // builds it has no DMA barriers for (docs/nvme-ordering.md).
    bail!(
        "device nvme:{pci}: this build has no NVMe backend: it needs Linux (VFIO) on x86_64 or \
         aarch64 (built for {} {}); use a file: or sim device here",
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

fn fixed(d: Duration) -> Latency {
    if d.is_zero() {
        Latency::Zero
    } else {
        Latency::Fixed(d)
    }
}

fn parse_bool(v: &str) -> Result<bool> {
    match v {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => bail!("{v:?} is not a boolean (true/false)"),
    }
}

/// `4096`, `64k`, `1MiB`, `4G`, ...
pub fn parse_size(v: &str) -> Result<u64> {
    let t = v.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| anyhow!("size {v:?}: expected a number with an optional unit"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => bail!("size {v:?}: unknown unit {u:?} (k, M, G, T)"),
    };
    n.checked_mul(mult)
        .ok_or_else(|| anyhow!("size {v:?} overflows"))
}

/// A size flag that bounds something (a frame, a budget, a batch): zero would refuse everything,
/// and the value must fit this machine's memory addresses.
pub fn parse_positive_size(v: &str) -> Result<usize> {
    let n = parse_size(v)?;
    if n == 0 {
        bail!("size {v:?} must be positive");
    }
    usize::try_from(n).map_err(|_| anyhow!("size {v:?} is too large for this machine"))
}

/// `250us`, `4.4ms`, `2s`, `10min`, `6h`, `1d`, `100` (milliseconds).
pub fn parse_duration(v: &str) -> Result<Duration> {
    let t = v.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| {
        anyhow!("duration {v:?}: expected a number with a unit (us, ms, s, min, h, d)")
    })?;
    if !n.is_finite() || n < 0.0 {
        bail!("duration {v:?} must be a non-negative number");
    }
    let secs = match unit {
        "ns" => n / 1e9,
        "us" | "µs" => n / 1e6,
        "" | "ms" => n / 1e3,
        "s" => n,
        "min" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        u => bail!("duration {v:?}: unknown unit {u:?} (ns, us, ms, s, min, h, d)"),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| anyhow!("duration {v:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_sizes_and_durations_parse_or_say_why() {
        assert!(matches!(
            "sim".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Sim(_)
        ));
        let DeviceSpec::Sim(s) = "sim:flush=4.4ms,write=0,capacity=1G,plp=true"
            .parse()
            .unwrap()
        else {
            panic!("not sim")
        };
        assert_eq!(s.flush, Duration::from_micros(4400));
        assert_eq!(s.capacity, 1 << 30);
        assert!(!s.volatile_cache);
        assert!("sim:bogus=1"
            .parse::<DeviceSpec>()
            .unwrap_err()
            .to_string()
            .contains("unknown sim option"));
        assert!(
            matches!("file:/x/y".parse::<DeviceSpec>().unwrap(), DeviceSpec::File { path, engine: None, flush_fds: None } if path == std::path::Path::new("/x/y"))
        );
        assert!("file:".parse::<DeviceSpec>().is_err());
        for (spec, want) in [
            ("file:/x/y,engine=uring", Engine::IoUring),
            ("file:/x/y,engine=threads", Engine::Threads),
            ("/x/y,engine=auto", Engine::Auto),
        ] {
            assert!(
                matches!(spec.parse::<DeviceSpec>().unwrap(), DeviceSpec::File { path, engine: Some(e), .. } if path == std::path::Path::new("/x/y") && e == want),
                "{spec}"
            );
        }
        // A comma that starts no option is part of the path.
        assert!(
            matches!("file:/x/a,b".parse::<DeviceSpec>().unwrap(), DeviceSpec::File { path, engine: None, flush_fds: None } if path == std::path::Path::new("/x/a,b"))
        );
        for (spec, want_engine, want_fds) in [
            ("file:/x/y,flush_fds=1", None, Some(1)),
            ("file:/x/y,flush_fds=64", None, Some(64)),
            (
                "file:/x/y,engine=threads,flush_fds=4",
                Some(Engine::Threads),
                Some(4),
            ),
            (
                "/x/y,flush_fds=8,engine=uring",
                Some(Engine::IoUring),
                Some(8),
            ),
        ] {
            assert!(
                matches!(spec.parse::<DeviceSpec>().unwrap(), DeviceSpec::File { path, engine, flush_fds } if path == std::path::Path::new("/x/y") && engine == want_engine && flush_fds == want_fds),
                "{spec}"
            );
        }
        assert!(
            matches!("file:/x/a,b,flush_fds=2".parse::<DeviceSpec>().unwrap(), DeviceSpec::File { path, flush_fds: Some(2), .. } if path == std::path::Path::new("/x/a,b"))
        );
        for bad in ["0", "65", "-1", "four", "", "1.5"] {
            let e = format!(
                "{:#}",
                format!("file:/x/y,flush_fds={bad}")
                    .parse::<DeviceSpec>()
                    .unwrap_err()
            );
            assert!(
                e.contains(&format!("flush_fds={bad:?}")) && e.contains("from 1 to 64"),
                "{bad}: {e}"
            );
        }
        for twice in [
            "file:/x/y,flush_fds=2,flush_fds=3",
            "file:/x/y,engine=uring,engine=auto",
        ] {
            assert!(
                format!("{:#}", twice.parse::<DeviceSpec>().unwrap_err()).contains("given twice"),
                "{twice}"
            );
        }
        assert!("file:,flush_fds=2".parse::<DeviceSpec>().is_err());
        let e = format!(
            "{:#}",
            "file:/x/y,engine=fast".parse::<DeviceSpec>().unwrap_err()
        );
        assert!(
            e.contains("engine=\"fast\"") && e.contains("uring, threads, auto"),
            "{e}"
        );
        assert!("file:,engine=uring".parse::<DeviceSpec>().is_err());
        assert!(matches!(
            "nvme:0000:00:03.0".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Nvme { pci, nsid: 1, io_timeout: None } if pci == "0000:00:03.0"
        ));
        assert!(matches!(
            "nvme:00:1F.7,ns=2".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Nvme { pci, nsid: 2, io_timeout: None } if pci == "0000:00:1f.7"
        ));
        assert!(matches!(
            "nvme:00:04.0,io_timeout_ms=5000,ns=3".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Nvme { nsid: 3, io_timeout: Some(t), .. } if t == Duration::from_secs(5)
        ));
        for bad in ["0", "-5", "1.5", "abc", "", "3600001"] {
            let e = format!("nvme:00:04.0,io_timeout_ms={bad}")
                .parse::<DeviceSpec>()
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("io_timeout_ms={bad:?}")) && e.contains("milliseconds"),
                "{bad}: {e}"
            );
        }
        for bad in [
            "nvme:",
            "nvme:0000:00:03",
            "nvme:00:03.9",
            "nvme:zz:00:03.0",
            "nvme:00:03.0,ns=0",
            "nvme:00:03.0,q=1",
        ] {
            assert!(bad.parse::<DeviceSpec>().is_err(), "{bad}");
        }
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert!(parse_size("12 parsecs").is_err());
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert!(parse_duration("-1ms").is_err());
        assert_eq!(parse_duration("1d").unwrap(), Duration::from_secs(86400));
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("2min").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("99999999999999999999999d").is_err());
        assert!(parse_duration("3 weeks").is_err());
    }

    #[cfg(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    ))]
    #[test]
    fn readers_get_the_pairs_the_controller_grants_and_share_the_rest() {
        use blockdev::nvme::fake::{self, FakeConfig};
        use blockdev::nvme::{NvmeDevice, NvmeOptions};
        for (granted, wanted, got) in [(4u16, 3u16, 3usize), (2, 3, 1), (1, 3, 0), (4, 0, 0)] {
            let (host, _h) = fake::controller(FakeConfig {
                io_queues: granted,
                ..FakeConfig::default()
            });
            let opts = NvmeOptions {
                queue_pairs: wanted + 1,
                ..NvmeOptions::default()
            };
            let dev = NvmeDevice::with_host(host, 1, opts).unwrap();
            let pairs = reader_pairs(&dev, wanted, |d| d.queue_pair()).unwrap();
            assert_eq!(pairs.len(), got, "{granted} granted, {wanted} wanted");
        }
    }
}
