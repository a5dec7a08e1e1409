//! Hardware test rigs for nvmq. `qemu` boots a throw-away guest whose emulated NVMe controller is
//! bound to vfio-pci, runs host-built binaries in it and reports each one's output and exit code.
//! `nbd` is the power-cut NBD server; `powercut` the power-cut validation controller (`nvmq-rig`)
//! and its in-process sim broker.
#![forbid(unsafe_code)]
pub mod nbd;
pub mod powercut;
pub mod qemu;
