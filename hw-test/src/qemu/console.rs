//! Reads the guest's serial console: the `RIG-` marker lines written by `/init` (init.rs).

/// Geometry the kernel's nvme driver reported for the namespace before the vfio hand-over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelNvme {
    pub block_device: String,
    pub logical_block_size: u32,
    pub physical_block_size: u32,
    /// Capacity in 512-byte sectors, as `/sys/block/<dev>/size` says.
    pub sectors: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfioBinding {
    pub pci: String,
    pub group: u32,
    pub driver: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandOutput {
    pub lines: Vec<String>,
    pub exit_code: Option<i32>,
    pub began: bool,
}

#[derive(Debug, Clone, Default)]
pub struct ConsoleReport {
    pub init_started: bool,
    pub nvme_pci: Option<String>,
    pub kernel_nvme: Option<KernelNvme>,
    pub vfio: Option<VfioBinding>,
    pub net: Option<String>,
    pub commands: Vec<CommandOutput>,
    pub done: bool,
    pub failure: Option<String>,
    pub dmesg: Vec<String>,
    /// Marker lines that did not parse, kept for the error message.
    pub malformed: Vec<String>,
}

impl ConsoleReport {
    fn command(&mut self, n: usize) -> &mut CommandOutput {
        if self.commands.len() <= n {
            self.commands.resize_with(n + 1, CommandOutput::default);
        }
        &mut self.commands[n]
    }

    /// Feeds one console line (without its line ending).
    pub fn line(&mut self, raw: &str) {
        let line = raw.trim_end_matches('\r');
        let Some(rest) = line.strip_prefix("RIG-") else {
            return;
        };
        let (tag, body) = rest.split_once(' ').unwrap_or((rest, ""));
        let ok = match tag {
            "INIT-START" => {
                self.init_started = true;
                true
            }
            "DONE" => {
                self.done = true;
                true
            }
            "FAIL" => {
                self.failure = Some(body.to_string());
                true
            }
            "DMESG" => {
                self.dmesg.push(body.to_string());
                true
            }
            "NVME-PCI" => {
                self.nvme_pci = Some(body.to_string());
                !body.is_empty()
            }
            "NET" => {
                self.net = Some(body.to_string());
                true
            }
            "KERNEL-NVME" => self.kernel_nvme(body),
            "VFIO" => self.vfio(body),
            "CMD-BEGIN" => match body.parse::<usize>() {
                Ok(n) => {
                    self.command(n).began = true;
                    true
                }
                Err(_) => false,
            },
            "OUT" => {
                let (n, text) = body.split_once(' ').unwrap_or((body, ""));
                match n.parse::<usize>() {
                    Ok(n) => {
                        self.command(n).lines.push(text.to_string());
                        true
                    }
                    Err(_) => false,
                }
            }
            "CMD-EXIT" => {
                let mut f = body.split(' ');
                match (
                    f.next().and_then(|n| n.parse::<usize>().ok()),
                    f.next().and_then(|c| c.parse::<i32>().ok()),
                ) {
                    (Some(n), Some(code)) => {
                        self.command(n).exit_code = Some(code);
                        true
                    }
                    _ => false,
                }
            }
            _ => true,
        };
        if !ok {
            self.malformed.push(line.to_string());
        }
    }

    fn kernel_nvme(&mut self, body: &str) -> bool {
        let f: Vec<&str> = body.split(' ').collect();
        let parsed = match f.as_slice() {
            [dev, lbs, pbs, sectors] => (|| {
                Some(KernelNvme {
                    block_device: dev.to_string(),
                    logical_block_size: lbs.parse().ok()?,
                    physical_block_size: pbs.parse().ok()?,
                    sectors: sectors.parse().ok()?,
                })
            })(),
            _ => None,
        };
        let ok = parsed.is_some();
        self.kernel_nvme = parsed;
        ok
    }

    fn vfio(&mut self, body: &str) -> bool {
        let f: Vec<&str> = body.split(' ').collect();
        let parsed = match f.as_slice() {
            [pci, group, driver] => group.parse().ok().map(|group| VfioBinding {
                pci: pci.to_string(),
                group,
                driver: driver.to_string(),
            }),
            _ => None,
        };
        let ok = parsed.is_some();
        self.vfio = parsed;
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> ConsoleReport {
        let mut r = ConsoleReport::default();
        for l in text.lines() {
            r.line(l);
        }
        r
    }

    #[test]
    fn markers_become_a_report() {
        let r = parse(
            "SeaBIOS junk\r\nRIG-INIT-START\r\nRIG-NVME-PCI 0000:00:04.0\r\n\
             RIG-KERNEL-NVME nvme0n1 4096 4096 131072\r\nRIG-CMD-BEGIN 0\r\n\
             RIG-OUT 0 hello world\r\nRIG-OUT 0 \r\nRIG-CMD-EXIT 0 0\r\n\
             RIG-VFIO 0000:00:04.0 5 vfio-pci\r\nRIG-CMD-BEGIN 1\r\nRIG-OUT 1 RIG-DONE inside output\r\n\
             RIG-CMD-EXIT 1 2\r\nRIG-DONE\r\n",
        );
        assert!(r.init_started && r.done);
        assert_eq!(r.nvme_pci.as_deref(), Some("0000:00:04.0"));
        assert_eq!(
            r.kernel_nvme,
            Some(KernelNvme {
                block_device: "nvme0n1".into(),
                logical_block_size: 4096,
                physical_block_size: 4096,
                sectors: 131072
            })
        );
        assert_eq!(r.vfio.as_ref().map(|v| v.group), Some(5));
        assert_eq!(r.commands[0].lines, ["hello world", ""]);
        assert_eq!(r.commands[0].exit_code, Some(0));
        assert_eq!(r.commands[1].lines, ["RIG-DONE inside output"]);
        assert_eq!(r.commands[1].exit_code, Some(2));
        assert!(r.malformed.is_empty());
    }

    #[test]
    fn a_missing_exit_and_bad_markers_are_visible() {
        let r =
            parse("RIG-CMD-BEGIN 0\nRIG-OUT 0 x\nRIG-CMD-EXIT zero\nRIG-FAIL insmod /rig/x.ko\n");
        assert_eq!(r.commands[0].exit_code, None);
        assert_eq!(r.malformed, ["RIG-CMD-EXIT zero"]);
        assert_eq!(r.failure.as_deref(), Some("insmod /rig/x.ko"));
        assert!(!r.done);
    }
}
