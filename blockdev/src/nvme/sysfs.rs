//! Checks in sysfs before touching VFIO, so that the common set-up mistakes get an error that says
//! what is wrong: no IOMMU, no such device, a device still bound to the kernel's nvme driver, and
//! which other devices share the IOMMU group.

use std::path::{Path, PathBuf};

use super::sys::HostError;

/// The sysfs facts about one PCI function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciFunction {
    pub group: u32,
    /// Other devices of the IOMMU group with their drivers ("none" when unbound).
    pub group_peers: Vec<(String, String)>,
}

fn link_name(p: &Path) -> Option<String> {
    std::fs::read_link(p)
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// Looks `pci` up under `root` (normally `/sys`) and checks it can be claimed with VFIO.
pub fn check(root: &Path, pci: &str) -> Result<PciFunction, HostError> {
    let dev: PathBuf = root.join("bus/pci/devices").join(pci);
    if !dev.exists() {
        return Err(HostError::NoDevice {
            pci: pci.into(),
            detail: format!(
                "{} does not exist; addresses look like 0000:00:04.0",
                dev.display()
            ),
        });
    }
    // Class 01h/08h is non-volatile memory; anything else must not be handed to the driver (or
    // rebound to vfio-pci on our advice).
    let class = std::fs::read_to_string(dev.join("class"))
        .ok()
        .and_then(|c| u32::from_str_radix(c.trim().trim_start_matches("0x"), 16).ok());
    if let Some(class) = class.filter(|c| c >> 8 != 0x0108) {
        return Err(HostError::NotNvme {
            pci: pci.into(),
            class,
        });
    }
    let groups = root.join("kernel/iommu_groups");
    let any_group = std::fs::read_dir(&groups)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    if !any_group {
        return Err(HostError::NoIommu {
            detail: format!("{} is empty or missing", groups.display()),
        });
    }
    let group = link_name(&dev.join("iommu_group"))
        .and_then(|n| n.parse::<u32>().ok())
        .ok_or_else(|| HostError::NoIommu {
            detail: format!("{pci} has no iommu_group link; the IOMMU does not cover it"),
        })?;
    let driver = link_name(&dev.join("driver"));
    if driver.as_deref() != Some("vfio-pci") {
        return Err(HostError::NotVfioBound {
            pci: pci.into(),
            unbind: match driver {
                Some(_) => format!("echo {pci} > /sys/bus/pci/devices/{pci}/driver/unbind; "),
                None => String::new(),
            },
            driver: driver.map_or_else(|| "no driver".into(), |d| format!("the {d} driver")),
        });
    }
    let mut group_peers = Vec::new();
    if let Ok(entries) = std::fs::read_dir(groups.join(group.to_string()).join("devices")) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name != pci {
                let drv = link_name(&e.path().join("driver")).unwrap_or_else(|| "none".into());
                group_peers.push((name, drv));
            }
        }
    }
    group_peers.sort();
    Ok(PciFunction { group, group_peers })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    const BDF: &str = "0000:00:04.0";

    /// A sysfs tree with one device, optionally in group 7 bound to `driver`, plus a peer.
    fn tree(iommu: bool, driver: Option<&str>, peer_driver: Option<&str>) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        let dev = r.join("sys_devices").join(BDF);
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("class"), "0x010802\n").unwrap();
        std::fs::create_dir_all(r.join("bus/pci/devices")).unwrap();
        symlink(&dev, r.join("bus/pci/devices").join(BDF)).unwrap();
        std::fs::create_dir_all(r.join("kernel/iommu_groups")).unwrap();
        for d in ["nvme", "vfio-pci", "e1000"] {
            std::fs::create_dir_all(r.join("drivers").join(d)).unwrap();
        }
        if let Some(d) = driver {
            symlink(r.join("drivers").join(d), dev.join("driver")).unwrap();
        }
        if iommu {
            let g = r.join("kernel/iommu_groups/7/devices");
            std::fs::create_dir_all(&g).unwrap();
            symlink(r.join("kernel/iommu_groups/7"), dev.join("iommu_group")).unwrap();
            symlink(&dev, g.join(BDF)).unwrap();
            let peer = r.join("sys_devices/0000:00:05.0");
            std::fs::create_dir_all(&peer).unwrap();
            if let Some(d) = peer_driver {
                symlink(r.join("drivers").join(d), peer.join("driver")).unwrap();
            }
            symlink(&peer, g.join("0000:00:05.0")).unwrap();
        }
        t
    }

    #[test]
    fn a_missing_device_is_named() {
        let t = tree(true, Some("vfio-pci"), None);
        let e = check(t.path(), "0000:00:09.0").unwrap_err().to_string();
        assert!(e.contains("no PCI device 0000:00:09.0"), "{e}");
    }

    #[test]
    fn no_iommu_is_reported_with_what_to_do() {
        let t = tree(false, Some("vfio-pci"), None);
        let e = check(t.path(), BDF).unwrap_err().to_string();
        assert!(e.contains("no IOMMU is active"), "{e}");
        assert!(e.contains("intel_iommu=on"), "{e}");
    }

    #[test]
    fn a_device_on_the_kernel_driver_names_it_and_the_rebind_command() {
        let t = tree(true, Some("nvme"), None);
        let e = check(t.path(), BDF).unwrap_err().to_string();
        assert!(e.contains("bound to the nvme driver"), "{e}");
        assert!(e.contains("vfio-bind.sh 0000:00:04.0"), "{e}");
        assert!(e.contains("driver/unbind"), "{e}");
        // Seen in the QEMU guest: with no driver there is no driver/unbind to write to.
        let t = tree(true, None, None);
        let e = check(t.path(), BDF).unwrap_err().to_string();
        assert!(e.contains("bound to no driver"), "{e}");
        assert!(!e.contains("unbind"), "{e}");
        assert!(e.contains("drivers_probe"), "{e}");
    }

    /// Seen in the QEMU guest: q35's LPC bridge (class 0x060100, no driver) was answered with
    /// advice to bind it to vfio-pci.
    #[test]
    fn a_device_that_is_not_nvme_is_named_with_its_class() {
        let t = tree(true, None, None);
        let dev = t.path().join("sys_devices").join(BDF);
        std::fs::write(dev.join("class"), "0x060100\n").unwrap();
        let e = check(t.path(), BDF).unwrap_err().to_string();
        assert!(
            e.contains("0000:00:04.0 is not an NVMe controller") && e.contains("0x060100"),
            "{e}"
        );
        assert!(!e.contains("vfio-bind"), "{e}");
    }

    #[test]
    fn group_and_peers_are_found() {
        let t = tree(true, Some("vfio-pci"), Some("e1000"));
        let f = check(t.path(), BDF).unwrap();
        assert_eq!(f.group, 7);
        assert_eq!(
            f.group_peers,
            vec![("0000:00:05.0".to_string(), "e1000".to_string())]
        );
    }
}
