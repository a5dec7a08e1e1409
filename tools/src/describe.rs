//! What a device reports about itself and the shared ways of printing sizes and superblocks, for
//! every command's human and JSON output.

use blockdev::DeviceInfo;
use nvmq_log::format::{Superblock, SuperblockFault};
use serde::Serialize;

/// A device's self-description, as every command prints it.
#[derive(Serialize, Debug, Clone)]
pub struct DeviceReport {
    pub identity: String,
    pub backend: &'static str,
    pub logical_block_size: u32,
    pub physical_block_size: u32,
    pub fs_block_size: u32,
    pub write_unit: u32,
    pub capacity: u64,
    pub max_transfer: u32,
    pub volatile_write_cache: bool,
    /// Zero when the device does not report one.
    pub atomic_write_unit: u32,
    /// NVMe model and firmware; None where the backend has none.
    pub model: Option<String>,
    /// The device's health report (NVMe SMART); None where the backend has none.
    pub health: Option<String>,
    /// How the backend carries out I/O (the file backend's engine); None where it has one way.
    pub engine: Option<String>,
}

impl DeviceReport {
    pub fn new(info: &DeviceInfo, backend: &'static str) -> DeviceReport {
        DeviceReport {
            identity: info.identity.clone(),
            backend,
            logical_block_size: info.logical_block_size,
            physical_block_size: info.physical_block_size,
            fs_block_size: info.fs_block_size,
            write_unit: info.write_unit(),
            capacity: info.capacity,
            max_transfer: info.max_transfer,
            volatile_write_cache: info.volatile_write_cache,
            atomic_write_unit: info.atomic_write_unit,
            model: (!info.model.is_empty()).then(|| info.model.clone()),
            health: (!info.health.is_empty()).then(|| info.health.clone()),
            engine: (!info.engine.is_empty()).then(|| info.engine.clone()),
        }
    }

    /// The human lines, indented under a heading the caller prints.
    pub fn lines(&self) -> Vec<String> {
        let mut v = vec![
            format!("identity             {}", self.identity),
            format!(
                "block size           {} B logical, {} B physical{}",
                self.logical_block_size,
                self.physical_block_size,
                if self.fs_block_size > 0 {
                    format!(", {} B file system", self.fs_block_size)
                } else {
                    String::new()
                }
            ),
            format!("write unit           {} B", self.write_unit),
            format!(
                "capacity             {} ({} B)",
                bytes(self.capacity),
                self.capacity
            ),
            format!(
                "max transfer         {}",
                bytes(u64::from(self.max_transfer))
            ),
            format!(
                "volatile write cache {}",
                if self.volatile_write_cache {
                    "yes (acks wait for a flush)"
                } else {
                    "no (power-loss protected: completed writes are durable)"
                }
            ),
            format!(
                "atomic write unit    {}",
                if self.atomic_write_unit == 0 {
                    "not reported".to_string()
                } else {
                    format!("{} B", self.atomic_write_unit)
                }
            ),
        ];
        v.push(format!(
            "model / firmware     {}",
            self.model
                .clone()
                .unwrap_or_else(|| format!("not available on the {} backend", self.backend))
        ));
        if let Some(e) = &self.engine {
            v.push(format!("I/O engine           {e}"));
        }
        if let Some(h) = &self.health {
            v.push(format!("health               {h}"));
        }
        v
    }
}

/// `1.5 GiB`, `512 B`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// The geometry a superblock records, as `format` and `inspect` report it.
#[derive(Serialize, Debug, Clone)]
pub struct GeometryReport {
    pub format_id: String,
    pub write_unit: u32,
    pub log_start: u64,
    pub log_size: u64,
    pub window: u64,
    pub max_batch: u32,
}

impl GeometryReport {
    pub fn new(sb: &Superblock) -> GeometryReport {
        GeometryReport {
            format_id: format!("{:#018x}", sb.format_id),
            write_unit: sb.write_unit,
            log_start: sb.log_start,
            log_size: sb.log_size,
            window: sb.window,
            max_batch: sb.max_batch,
        }
    }
}

/// One superblock slot as the tools report it.
#[derive(Serialize, Debug, Clone)]
pub struct CopyReport {
    pub slot: char,
    pub valid: bool,
    /// Why the copy is not valid.
    pub fault: Option<String>,
    pub version: Option<u32>,
    pub sequence: Option<u64>,
    pub format_id: Option<String>,
    pub epoch: Option<u64>,
    pub durable_through: Option<u64>,
}

impl CopyReport {
    pub fn new(slot: u8, copy: &Result<Superblock, SuperblockFault>) -> CopyReport {
        let slot = recovery::slot_name(slot);
        match copy {
            Ok(sb) => CopyReport {
                slot,
                valid: true,
                fault: None,
                version: Some(sb.version),
                sequence: Some(sb.sequence),
                format_id: Some(format!("{:#018x}", sb.format_id)),
                epoch: Some(sb.epoch),
                durable_through: Some(sb.durable_through),
            },
            Err(f) => CopyReport {
                slot,
                valid: false,
                fault: Some(f.to_string()),
                version: None,
                sequence: None,
                format_id: None,
                epoch: None,
                durable_through: None,
            },
        }
    }

    pub fn line(&self) -> String {
        match (&self.fault, self.sequence) {
            (None, Some(seq)) => format!(
                "superblock {}         valid: format version {}, sequence {seq}, format id {}, epoch {}, durable through {}",
                self.slot,
                self.version.unwrap_or(0),
                self.format_id.as_deref().unwrap_or("?"),
                self.epoch.unwrap_or(0),
                self.durable_through.unwrap_or(0)
            ),
            (Some(f), _) => format!("superblock {}         NOT VALID: {f}", self.slot),
            (None, None) => format!("superblock {}         NOT VALID", self.slot),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_a_person_writes_them() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(4096), "4.0 KiB");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
    }
}
