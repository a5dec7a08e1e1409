//! The guest's `/init`: mounts, module loading, finding the NVMe function, the optional kernel
//! driver stage, the hand-over to vfio-pci, networking, then the host's commands. Every step the
//! host needs to see prints a `RIG-` marker line on the serial console (parsed by `console.rs`).

/// Where in the guest's boot a command runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// While the kernel's nvme driver owns the controller (`$NVMQ_NVME_BLOCK` is its block device).
    KernelNvme,
    /// After the controller was handed to vfio-pci (the default).
    Vfio,
}

/// One command, already placed in the initramfs, as the init script runs it.
#[derive(Debug, Clone)]
pub struct PlannedCmd {
    pub argv: Vec<String>,
    pub stage: Stage,
}

#[derive(Debug, Clone, Default)]
pub struct InitPlan {
    pub vfio_modules: Vec<String>,
    /// Empty when the kernel NVMe stage is off.
    pub nvme_modules: Vec<String>,
    /// Empty when the guest has no network.
    pub net_modules: Vec<String>,
    pub commands: Vec<PlannedCmd>,
}

/// Guest address QEMU's user-mode network hands out; port forwards point at it.
pub const GUEST_IP: &str = "10.0.2.15";

/// Placeholders substituted in command arguments with what the guest found at boot.
pub const PLACEHOLDERS: &[(&str, &str)] = &[
    ("{pci}", "NVMQ_NVME_PCI"),
    ("{group}", "NVMQ_VFIO_GROUP"),
    ("{block}", "NVMQ_NVME_BLOCK"),
];

/// Shell-quotes `arg`, turning each placeholder into a reference to its variable.
pub fn quote_arg(arg: &str) -> String {
    let mut out = String::from("'");
    let mut rest = arg;
    'outer: while !rest.is_empty() {
        for (ph, var) in PLACEHOLDERS {
            if let Some(tail) = rest.strip_prefix(ph) {
                out.push_str(&format!("'\"${var}\"'"));
                rest = tail;
                continue 'outer;
            }
        }
        let mut chars = rest.chars();
        let c = chars.next().unwrap_or_default();
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
        rest = chars.as_str();
    }
    out.push('\'');
    out
}

const PROLOGUE: &str = r#"#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /tmp /run /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/ 
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
ulimit -l unlimited
dmesg -n 1
# The firmware leaves the console mid-line; markers must start a line.
echo
echo RIG-INIT-START
fail() {
    echo "RIG-FAIL $*"
    dmesg | tail -n 40 | sed 's/^/RIG-DMESG /'
    poweroff -f
    sleep 60
}
load() { insmod "$1" || fail "insmod $1"; }
wait_for() {
    i=0
    while [ ! -e "$1" ]; do
        i=$((i + 1))
        [ $i -gt 100 ] && return 1
        usleep 100000
    done
}
run_cmd() {
    n=$1; shift
    echo "RIG-CMD-BEGIN $n"
    { "$@" </dev/null 2>&1; echo $? >/tmp/rig-rc; } | while IFS= read -r l || [ -n "$l" ]; do
        printf 'RIG-OUT %s %s\n' "$n" "$l"
    done
    echo "RIG-CMD-EXIT $n $(cat /tmp/rig-rc)"
}
"#;

const FIND_NVME: &str = r#"NVMQ_NVME_PCI=
for d in /sys/bus/pci/devices/*; do
    if [ "$(cat $d/class)" = 0x010802 ] && [ "$(cat $d/vendor)" = 0x1b36 ] && [ "$(cat $d/device)" = 0x0010 ]; then
        NVMQ_NVME_PCI=${d##*/}
        break
    fi
done
[ -n "$NVMQ_NVME_PCI" ] || fail "no NVMe function (class 0x010802, id 1b36:0010) in /sys/bus/pci/devices"
export NVMQ_NVME_PCI
D=/sys/bus/pci/devices/$NVMQ_NVME_PCI
echo "RIG-NVME-PCI $NVMQ_NVME_PCI"
"#;

const KERNEL_NVME: &str = r#"i=0
BLK=
while [ -z "$BLK" ]; do
    for b in /sys/block/nvme*; do
        case ${b##*/} in *c*|'nvme*') ;; *) BLK=${b##*/} ;; esac
    done
    i=$((i + 1))
    [ $i -gt 100 ] && fail "the kernel nvme driver created no namespace block device for $NVMQ_NVME_PCI"
    [ -z "$BLK" ] && usleep 100000
done
wait_for /dev/$BLK || fail "/dev/$BLK did not appear"
export NVMQ_NVME_BLOCK=/dev/$BLK
echo "RIG-KERNEL-NVME $BLK $(cat /sys/block/$BLK/queue/logical_block_size) $(cat /sys/block/$BLK/queue/physical_block_size) $(cat /sys/block/$BLK/size)"
"#;

const BIND_VFIO: &str = r#"if [ -e $D/driver ]; then
    echo "$NVMQ_NVME_PCI" > $D/driver/unbind || fail "unbinding $NVMQ_NVME_PCI from $(readlink $D/driver)"
fi
unset NVMQ_NVME_BLOCK
echo vfio-pci > $D/driver_override || fail "driver_override on $NVMQ_NVME_PCI"
echo "$NVMQ_NVME_PCI" > /sys/bus/pci/drivers_probe
DRV=$(readlink $D/driver)
[ "${DRV##*/}" = vfio-pci ] || fail "$NVMQ_NVME_PCI is bound to '${DRV##*/}', not vfio-pci"
G=$(readlink $D/iommu_group)
NVMQ_VFIO_GROUP=${G##*/}
[ -n "$NVMQ_VFIO_GROUP" ] || fail "$NVMQ_NVME_PCI has no iommu_group"
export NVMQ_VFIO_GROUP
wait_for /dev/vfio/$NVMQ_VFIO_GROUP || fail "/dev/vfio/$NVMQ_VFIO_GROUP did not appear"
echo "RIG-VFIO $NVMQ_NVME_PCI $NVMQ_VFIO_GROUP ${DRV##*/}"
"#;

const NET: &str = r#"ip link set lo up
IF=
for n in /sys/class/net/*; do [ "${n##*/}" != lo ] && IF=${n##*/} && break; done
[ -n "$IF" ] || fail "no network interface after loading the NIC driver"
ip link set "$IF" up || fail "ip link set $IF up"
ip addr add GUEST_IP/24 dev "$IF" || fail "ip addr add on $IF"
ip route add default via 10.0.2.2 || fail "default route"
echo "RIG-NET $IF GUEST_IP"
"#;

fn commands(out: &mut String, plan: &InitPlan, stage: Stage) {
    for (n, cmd) in plan.commands.iter().enumerate() {
        if cmd.stage != stage {
            continue;
        }
        let argv: Vec<String> = cmd.argv.iter().map(|a| quote_arg(a)).collect();
        out.push_str(&format!("run_cmd {n} {}\n", argv.join(" ")));
    }
}

fn loads(out: &mut String, modules: &[String]) {
    for m in modules {
        out.push_str(&format!("load {}\n", quote_arg(m)));
    }
}

pub fn script(plan: &InitPlan) -> String {
    let mut s = String::from(PROLOGUE);
    loads(&mut s, &plan.vfio_modules);
    s.push_str(FIND_NVME);
    if !plan.nvme_modules.is_empty() {
        loads(&mut s, &plan.nvme_modules);
        s.push_str(KERNEL_NVME);
        commands(&mut s, plan, Stage::KernelNvme);
    }
    s.push_str(BIND_VFIO);
    if !plan.net_modules.is_empty() {
        loads(&mut s, &plan.net_modules);
        s.push_str(&NET.replace("GUEST_IP", GUEST_IP));
    }
    commands(&mut s, plan, Stage::Vfio);
    s.push_str("echo RIG-DONE\nsync\npoweroff -f\nsleep 60\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes_and_substitutes_placeholders() {
        assert_eq!(quote_arg("plain"), "'plain'");
        assert_eq!(quote_arg("it's"), "'it'\\''s'");
        assert_eq!(quote_arg("--pci={pci}"), "'--pci='\"$NVMQ_NVME_PCI\"''");
        assert_eq!(quote_arg("{group}"), "''\"$NVMQ_VFIO_GROUP\"''");
    }

    #[test]
    fn kernel_stage_commands_run_before_the_vfio_hand_over() {
        let plan = InitPlan {
            vfio_modules: vec!["/rig/modules/vfio.ko".into()],
            nvme_modules: vec!["/rig/modules/nvme.ko".into()],
            net_modules: vec![],
            commands: vec![
                PlannedCmd {
                    argv: vec!["/rig/bin/late".into()],
                    stage: Stage::Vfio,
                },
                PlannedCmd {
                    argv: vec!["/rig/bin/early".into()],
                    stage: Stage::KernelNvme,
                },
            ],
        };
        let s = script(&plan);
        let at = |p: &str| s.find(p).unwrap_or_else(|| panic!("{p} missing from\n{s}"));
        assert!(at("run_cmd 1 '/rig/bin/early'") < at("driver_override"));
        assert!(at("driver_override") < at("run_cmd 0 '/rig/bin/late'"));
        assert!(at("load '/rig/modules/vfio.ko'") < at("RIG-NVME-PCI"));
        assert!(!s.contains("RIG-NET"));
        assert!(s.trim_end().ends_with("sleep 60"));
    }
}
