//! Geometry seam, for tests of the running binary only: with `NVMQ_FAULT_GEOMETRY` set (e.g.
//! `physical_block=8192,max_transfer=2048,queue_depth=4`), every file device this process opens
//! reports that geometry instead of its own, as the same log would find it on another drive. A
//! file on a file system cannot change its block size, so this is how a test shows what open,
//! `inspect` and `verify` do on a device that does not fit the log. Only a less capable device
//! can be asked for (larger blocks, a smaller transfer; the queue depth is the file device's own
//! setting), so that every I/O sent under it is one the file takes. Unset, it costs nothing;
//! never set it in production.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use blockdev::file::{FileDevice, FileOptions};

pub const FAULT_GEOMETRY: &str = "NVMQ_FAULT_GEOMETRY";

/// The deepest queue the seam sets (a ring of that many entries is still cheap).
const MAX_QUEUE_DEPTH: usize = 4096;

/// What [`FAULT_GEOMETRY`] asks for; None keeps the device's own.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reshape {
    /// As given, for errors.
    text: String,
    physical_block: Option<u32>,
    fs_block: Option<u32>,
    max_transfer: Option<u32>,
    queue_depth: Option<usize>,
}

impl Reshape {
    /// The geometry the environment asks for, if it asks.
    pub fn from_env() -> Result<Option<Reshape>> {
        let Some(v) = std::env::var_os(FAULT_GEOMETRY) else {
            return Ok(None);
        };
        let text = v
            .to_str()
            .ok_or_else(|| anyhow!("{FAULT_GEOMETRY}={v:?}: not UTF-8"))?;
        parse(text).map(Some).with_context(|| context(text))
    }

    /// `opts` with the queue depth asked for.
    pub fn file_options(&self, opts: FileOptions) -> FileOptions {
        FileOptions {
            queue_depth: self.queue_depth.unwrap_or(opts.queue_depth),
            ..opts
        }
    }

    /// Makes the device just opened at `path` report the blocks and transfer asked for.
    pub fn apply(&self, dev: &mut FileDevice, path: &Path) -> Result<()> {
        dev.report_geometry(self.physical_block, self.fs_block, self.max_transfer)
            .map_err(|e| anyhow!(e))
            .with_context(|| context(&self.text))?;
        let info = blockdev::BlockDevice::info(dev);
        tracing::warn!(
            device = %path.display(),
            physical_block = info.physical_block_size,
            fs_block = info.fs_block_size,
            max_transfer = info.max_transfer,
            queue_depth = blockdev::BlockDevice::queue_depth(dev),
            "FAULT INJECTION ({FAULT_GEOMETRY}): this device reports a geometry that is not its own"
        );
        Ok(())
    }
}

fn context(text: &str) -> String {
    format!("{FAULT_GEOMETRY}={text:?} (a fault-injection seam for tests; unset it otherwise)")
}

/// `key=value,...`.
fn parse(text: &str) -> Result<Reshape> {
    let mut r = Reshape {
        text: text.to_string(),
        ..Reshape::default()
    };
    for kv in text.split(',').filter(|x| !x.is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow!("expected key=value, got {kv:?}"))?;
        let n = crate::devspec::parse_size(v).with_context(|| format!("{k}={v:?}"))?;
        let size = || u32::try_from(n).with_context(|| format!("{k}={v:?}: too large"));
        match k {
            "physical_block" => r.physical_block = Some(size()?),
            "fs_block" => r.fs_block = Some(size()?),
            "max_transfer" => r.max_transfer = Some(size()?),
            "queue_depth" => {
                let q = usize::try_from(n)
                    .ok()
                    .filter(|q| (1..=MAX_QUEUE_DEPTH).contains(q))
                    .ok_or_else(|| anyhow!("queue_depth={v:?}: from 1 to {MAX_QUEUE_DEPTH}"))?;
                r.queue_depth = Some(q);
            }
            _ => bail!("unknown key {k:?} (physical_block, fs_block, max_transfer, queue_depth)"),
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_and_anything_else_is_refused() {
        assert_eq!(
            parse("physical_block=8K,max_transfer=2048,queue_depth=4").expect("valid"),
            Reshape {
                text: "physical_block=8K,max_transfer=2048,queue_depth=4".into(),
                physical_block: Some(8192),
                fs_block: None,
                max_transfer: Some(2048),
                queue_depth: Some(4),
            }
        );
        for bad in [
            "queue_depth=0",
            "queue_depth=100000",
            "physical_block=8G",
            "logical_block=4096",
            "physical_block",
            "max_transfer=lots",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
