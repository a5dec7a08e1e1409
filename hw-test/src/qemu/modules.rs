//! Picks the kernel modules a guest needs, in load order: each requested module after the
//! modules its `depends=` names, skipping modules the kernel has built in.
use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use super::error::{IoContext, Result, RigError};

/// VFIO stack, in the order the design recipe loads it.
pub const VFIO: &[&str] = &[
    "irqbypass",
    "vfio",
    "vfio_iommu_type1",
    "vfio_virqfd",
    "vfio-pci-core",
    "vfio-pci",
];
/// The kernel's own NVMe driver (its CRC/T10-PI dependencies come from `depends=`).
pub const KERNEL_NVME: &[&str] = &["nvme"];
/// The NIC QEMU emulates for port forwarding.
pub const E1000: &[&str] = &["e1000"];

/// Module names compare with `-` and `_` as one character, as modprobe does.
fn canonical(name: &str) -> String {
    name.replace('-', "_")
}

pub struct ModuleTree {
    /// canonical name -> path of the `.ko`
    files: HashMap<String, PathBuf>,
    builtin: HashSet<String>,
}

fn walk(dir: &Path, files: &mut HashMap<String, PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).ctx("listing", dir)? {
        let path = entry.ctx("listing", dir)?.path();
        if path.is_dir() {
            walk(&path, files)?;
        } else if let Some(stem) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".ko"))
        {
            files.insert(canonical(stem), path);
        }
    }
    Ok(())
}

/// The `depends=` entry of a module's `.modinfo` strings.
fn depends(ko: &[u8]) -> Option<Vec<String>> {
    const KEY: &[u8] = b"\0depends=";
    let at = ko.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let end = ko[at..].iter().position(|&b| b == 0)? + at;
    let list = String::from_utf8_lossy(&ko[at..end]).into_owned();
    Some(
        list.split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
    )
}

impl ModuleTree {
    /// `modules_dir` is `lib/modules/<version>`.
    pub fn open(modules_dir: &Path) -> Result<Self> {
        let mut files = HashMap::new();
        walk(&modules_dir.join("kernel"), &mut files)?;
        let builtin_list = modules_dir.join("modules.builtin");
        let builtin = fs::read_to_string(&builtin_list)
            .ctx("reading", &builtin_list)?
            .lines()
            .filter_map(|l| l.rsplit('/').next())
            .filter_map(|f| f.strip_suffix(".ko"))
            .map(canonical)
            .collect();
        Ok(Self { files, builtin })
    }

    /// Load order for `wanted`: dependencies first, each module once, built-ins left out.
    pub fn load_order(&self, wanted: &[&str]) -> Result<Vec<PathBuf>> {
        let mut order = Vec::new();
        let mut seen = HashSet::new();
        for name in wanted {
            self.visit(name, &mut seen, &mut Vec::new(), &mut order)?;
        }
        Ok(order)
    }

    fn visit(
        &self,
        name: &str,
        seen: &mut HashSet<String>,
        stack: &mut Vec<String>,
        order: &mut Vec<PathBuf>,
    ) -> Result<()> {
        let key = canonical(name);
        if seen.contains(&key) {
            return Ok(());
        }
        if stack.contains(&key) {
            return Err(RigError::Module {
                name: name.to_string(),
                reason: format!("dependency cycle through {}", stack.join(" -> ")),
            });
        }
        let Some(path) = self.files.get(&key) else {
            if self.builtin.contains(&key) {
                seen.insert(key);
                return Ok(());
            }
            return Err(RigError::Module {
                name: name.to_string(),
                reason: "neither a .ko in the kernel package nor listed in modules.builtin".into(),
            });
        };
        let bytes = fs::read(path).ctx("reading", path)?;
        let deps = depends(&bytes).ok_or_else(|| RigError::Module {
            name: name.to_string(),
            reason: format!("{} has no depends= in its modinfo", path.display()),
        })?;
        stack.push(key.clone());
        for dep in &deps {
            self.visit(dep, seen, stack, order)?;
        }
        stack.pop();
        seen.insert(key);
        order.push(path.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depends_reads_the_modinfo_string() {
        let ko = b"\x7fELF junk\0license=GPL\0depends=vfio,vfio_virqfd,irqbypass\0retpoline=Y\0";
        assert_eq!(
            depends(ko),
            Some(vec![
                "vfio".into(),
                "vfio_virqfd".into(),
                "irqbypass".into()
            ])
        );
        assert_eq!(depends(b"\0depends=\0"), Some(vec![]));
        assert_eq!(depends(b"no modinfo here"), None);
    }

    #[test]
    fn load_order_puts_dependencies_first_and_skips_builtins() {
        let dir = std::env::temp_dir().join(format!("rig-mods-{}", std::process::id()));
        let k = dir.join("kernel/drivers");
        fs::create_dir_all(&k).unwrap();
        fs::write(k.join("a-b.ko"), b"\0depends=c_d,builtin_one\0").unwrap();
        fs::write(k.join("c_d.ko"), b"\0depends=\0").unwrap();
        fs::write(k.join("e.ko"), b"\0depends=a_b\0").unwrap();
        fs::write(dir.join("modules.builtin"), "kernel/lib/builtin-one.ko\n").unwrap();
        let tree = ModuleTree::open(&dir).unwrap();
        let order = tree.load_order(&["e", "c-d"]).unwrap();
        let names: Vec<_> = order
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["c_d.ko", "a-b.ko", "e.ko"]);
        let err = tree.load_order(&["missing"]).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
