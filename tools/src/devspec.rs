//! Device specifications on the command line: `sim[:key=value,...]`, `file:<path>` or a path.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use blockdev::file::{FileDevice, FileOptions};
use blockdev::sim::{Latency, SimClock, SimConfig, SimDevice};
use blockdev::BlockDevice;

/// A parsed `--device` value.
#[derive(Debug, Clone)]
pub enum DeviceSpec {
    Sim(SimSpec),
    File(PathBuf),
}

#[derive(Debug, Clone)]
pub struct SimSpec {
    pub capacity: u64,
    pub write: Duration,
    pub flush: Duration,
    pub volatile_cache: bool,
    pub serialize_flushes: bool,
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
                    "seed" => spec.seed = v.parse().with_context(|| format!("device {s:?}: seed {v:?}"))?,
                    _ => bail!("device {s:?}: unknown sim option {k:?} (capacity, write, flush, plp, serialize, seed)"),
                }
            }
            return Ok(DeviceSpec::Sim(spec));
        }
        if s.starts_with("nvme:") {
            bail!("device {s:?}: the NVMe backend is not built yet; use file:<path> or sim");
        }
        let path = s.strip_prefix("file:").unwrap_or(s);
        if path.is_empty() {
            bail!("device {s:?}: empty path");
        }
        Ok(DeviceSpec::File(PathBuf::from(path)))
    }
}

impl DeviceSpec {
    /// The backend's name, for reports.
    pub fn backend(&self) -> &'static str {
        match self {
            DeviceSpec::Sim(_) => "sim",
            DeviceSpec::File(_) => "file",
        }
    }

    /// Opens the device; a file is created (zero-filled, `size` bytes) when `create` is set and it
    /// does not exist, with `init` run on it before it is renamed into place.
    pub fn open(
        &self,
        create: Option<u64>,
        init: impl FnOnce(&mut dyn BlockDevice) -> Result<(), blockdev::DeviceError>,
    ) -> Result<Box<dyn BlockDevice>> {
        match self {
            DeviceSpec::Sim(s) => {
                let mut cfg = SimConfig::new(s.seed, s.capacity);
                cfg.write_latency = fixed(s.write);
                cfg.flush_latency = fixed(s.flush);
                cfg.volatile_cache = s.volatile_cache;
                cfg.serialize_flushes = s.serialize_flushes;
                cfg.clock = SimClock::real();
                let (mut dev, _handle) = SimDevice::new(cfg);
                init(&mut dev)?;
                Ok(Box::new(dev))
            }
            DeviceSpec::File(p) => {
                if let (Some(size), false) = (create, p.exists()) {
                    if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                        std::fs::create_dir_all(dir)
                            .with_context(|| format!("creating {}", dir.display()))?;
                    }
                    let dev = FileDevice::create(p, size, FileOptions::default(), |d| init(d))
                        .with_context(|| format!("creating device file {}", p.display()))?;
                    return Ok(Box::new(dev));
                }
                let mut dev = FileDevice::open(p, FileOptions::default())
                    .with_context(|| format!("opening device {}", p.display()))?;
                init(&mut dev)?;
                Ok(Box::new(dev))
            }
        }
    }
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

/// `250us`, `4.4ms`, `2s`, `100` (milliseconds).
pub fn parse_duration(v: &str) -> Result<Duration> {
    let t = v.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| anyhow!("duration {v:?}: expected a number with a unit (us, ms, s)"))?;
    if !n.is_finite() || n < 0.0 {
        bail!("duration {v:?} must be a non-negative number");
    }
    let secs = match unit {
        "ns" => n / 1e9,
        "us" | "µs" => n / 1e6,
        "" | "ms" => n / 1e3,
        "s" => n,
        u => bail!("duration {v:?}: unknown unit {u:?} (ns, us, ms, s)"),
    };
    Ok(Duration::from_secs_f64(secs))
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
            matches!("file:/x/y".parse::<DeviceSpec>().unwrap(), DeviceSpec::File(p) if p == std::path::Path::new("/x/y"))
        );
        assert!("file:".parse::<DeviceSpec>().is_err());
        assert!("nvme:0000:00:03.0"
            .parse::<DeviceSpec>()
            .unwrap_err()
            .to_string()
            .contains("not built"));
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert!(parse_size("12 parsecs").is_err());
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert!(parse_duration("-1ms").is_err());
    }
}
