#!/usr/bin/env bash
# Moves a PCI function from its kernel driver (normally nvme) to vfio-pci, so that nvmq's userspace
# NVMe driver can claim it, and back with --unbind. Prints the VFIO group file on success.
#
#   hw-test/scripts/vfio-bind.sh 0000:00:04.0            # nvme -> vfio-pci
#   hw-test/scripts/vfio-bind.sh 0000:00:04.0 --unbind   # vfio-pci -> kernel driver
#
# It refuses to take away a controller whose namespaces are mounted or in use as swap.
set -euo pipefail

die() { echo "vfio-bind: $*" >&2; exit 1; }
say() { echo "vfio-bind: $*"; }

[[ $# -ge 1 && $# -le 2 ]] || die "usage: $0 <pci address, e.g. 0000:00:04.0> [--unbind]"
pci=$1
mode=bind
if [[ $# -eq 2 ]]; then
    [[ $2 == --unbind ]] || die "unknown option $2 (only --unbind)"
    mode=unbind
fi
# Accept the short form 00:04.0.
if [[ $pci =~ ^[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$ ]]; then
    pci="0000:$pci"
fi
[[ $pci =~ ^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$ ]] ||
    die "$pci is not a PCI address like 0000:00:04.0"
pci=${pci,,}
dev=/sys/bus/pci/devices/$pci
[[ -e $dev ]] || die "there is no PCI device $pci (list them with: lspci -D)"
[[ $EUID -eq 0 ]] || die "must run as root (it writes to sysfs)"

driver_of() {
    if [[ -e $1/driver ]]; then basename "$(readlink "$1/driver")"; else echo none; fi
}

current=$(driver_of "$dev")
say "$pci ($(cat "$dev/vendor"):$(cat "$dev/device")) is bound to: $current"

if [[ $mode == unbind ]]; then
    echo > "$dev/driver_override"
    if [[ $current != none ]]; then
        echo "$pci" > "$dev/driver/unbind"
    fi
    echo "$pci" > /sys/bus/pci/drivers_probe
    now=$(driver_of "$dev")
    say "$pci is now bound to: $now"
    [[ $now != vfio-pci ]] || die "still on vfio-pci; is its driver_override set elsewhere?"
    exit 0
fi

groups=/sys/kernel/iommu_groups
if [[ ! -d $groups ]] || [[ -z $(ls -A "$groups") ]]; then
    die "no IOMMU is active ($groups is empty): enable VT-d/AMD-Vi in the firmware and boot with intel_iommu=on (or amd_iommu=on); in QEMU add -device intel-iommu before the NVMe device"
fi
[[ -e $dev/iommu_group ]] || die "$pci has no iommu_group: the IOMMU does not cover it"
group=$(basename "$(readlink "$dev/iommu_group")")

if [[ $current == nvme ]]; then
    # Namespaces of this controller must not be in use.
    for blk in "$dev"/nvme/nvme*/nvme*n*; do
        [[ -e $blk ]] || continue
        name=$(basename "$blk")
        if grep -q "^/dev/$name" /proc/mounts /proc/swaps 2>/dev/null; then
            die "/dev/$name (on $pci) is mounted or used as swap; unmount it first"
        fi
    done
fi

modprobe vfio-pci || die "modprobe vfio-pci failed"
if [[ $current != vfio-pci ]]; then
    echo vfio-pci > "$dev/driver_override"
    if [[ $current != none ]]; then
        echo "$pci" > "$dev/driver/unbind"
    fi
    echo "$pci" > /sys/bus/pci/drivers_probe
fi
now=$(driver_of "$dev")
[[ $now == vfio-pci ]] || die "$pci is bound to $now after the rebind, not vfio-pci (see dmesg)"

viable=yes
for other in "$groups/$group"/devices/*; do
    o=$(basename "$other")
    [[ $o == "$pci" ]] && continue
    d=$(driver_of "$other")
    say "IOMMU group $group also holds $o (driver $d)"
    case $d in vfio-pci|none|pci-stub|pcieport) ;; *) viable=no ;; esac
done
[[ $viable == yes ]] ||
    say "WARNING: the group is not viable until every device listed above is bound to vfio-pci or to no driver"

[[ -e /dev/vfio/$group ]] || die "/dev/vfio/$group did not appear"
say "$pci is bound to vfio-pci; its VFIO group is /dev/vfio/$group"
ls -l "/dev/vfio/$group"
say "open it with --device nvme:$pci (the broker needs RLIMIT_MEMLOCK above its DMA arenas, e.g. ulimit -l unlimited)"
