//! Factories for the backends in this crate, so that their tests and `nvme-check` run the suite
//! the same way. Each shows what "reopen" means for its backend.

use std::path::PathBuf;

use super::DeviceFactory;
use crate::file::{FileDevice, FileOptions};
use crate::sim::{SimConfig, SimDevice, SimHandle};
use crate::DeviceError;

/// An existing file or block device, reopened by dropping the device (which joins its I/O
/// threads) and opening the path again.
#[derive(Debug, Clone)]
pub struct FileFactory {
    pub path: PathBuf,
    pub options: FileOptions,
}

impl DeviceFactory for FileFactory {
    type Device = FileDevice;
    fn open(&mut self) -> Result<FileDevice, DeviceError> {
        FileDevice::open(&self.path, self.options)
    }
    fn reopen(&mut self, dev: FileDevice) -> Result<FileDevice, DeviceError> {
        drop(dev);
        self.open()
    }
}

/// A simulated device, reopened by cutting its power and powering it on: only what the crash model
/// keeps survives, which includes everything a completed flush covered.
#[derive(Debug)]
pub struct SimFactory {
    pub config: SimConfig,
    handle: Option<SimHandle>,
}

impl SimFactory {
    pub fn new(config: SimConfig) -> SimFactory {
        SimFactory {
            config,
            handle: None,
        }
    }

    /// The handle of the device last opened, for counters and faults.
    pub fn handle(&self) -> Option<&SimHandle> {
        self.handle.as_ref()
    }
}

impl DeviceFactory for SimFactory {
    type Device = SimDevice;
    fn open(&mut self) -> Result<SimDevice, DeviceError> {
        let (dev, handle) = SimDevice::new(self.config.clone());
        self.handle = Some(handle);
        Ok(dev)
    }
    fn reopen(&mut self, dev: SimDevice) -> Result<SimDevice, DeviceError> {
        drop(dev);
        match &self.handle {
            Some(h) => Ok(h.power_on()),
            None => self.open(),
        }
    }
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
pub use nvme::{FakeNvmeFactory, NvmeFactory};

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod nvme {
    use super::DeviceFactory;
    use crate::nvme::fake::{self, FakeConfig, FakeHandle, FakeHost};
    use crate::nvme::{NvmeDevice, NvmeOptions};
    use crate::DeviceError;

    /// The NVMe driver over the software controller. A reopen leaves the old device as a process
    /// that died would (controller enabled, queues live, nothing shut down) and opens the
    /// namespace from a new host connection, so each reopen also proves the driver resets a
    /// controller it finds running.
    pub struct FakeNvmeFactory {
        pub config: FakeConfig,
        pub options: NvmeOptions,
        handle: Option<FakeHandle>,
        reopens: u64,
    }

    impl FakeNvmeFactory {
        pub fn new(config: FakeConfig, options: NvmeOptions) -> FakeNvmeFactory {
            FakeNvmeFactory {
                config,
                options,
                handle: None,
                reopens: 0,
            }
        }

        /// The controller's handle, once opened.
        pub fn handle(&self) -> Option<&FakeHandle> {
            self.handle.as_ref()
        }

        /// How many times `reopen` abandoned a running controller.
        pub fn reopens(&self) -> u64 {
            self.reopens
        }

        fn open_on(&self, host: FakeHost) -> Result<NvmeDevice<FakeHost>, DeviceError> {
            NvmeDevice::with_host(host, self.config.nsid, self.options)
        }
    }

    impl DeviceFactory for FakeNvmeFactory {
        type Device = NvmeDevice<FakeHost>;
        fn open(&mut self) -> Result<Self::Device, DeviceError> {
            let (host, handle) = fake::controller(self.config.clone());
            self.handle = Some(handle);
            self.open_on(host)
        }
        fn reopen(&mut self, dev: Self::Device) -> Result<Self::Device, DeviceError> {
            let Some(h) = self.handle.clone() else {
                return self.open();
            };
            // A crashed process runs no destructor: its memory stays mapped for the controller
            // until the next open resets it, so it must not be freed here.
            std::mem::forget(dev);
            self.reopens += 1;
            self.open_on(h.reconnect())
        }
    }

    /// A real NVMe namespace through VFIO, reopened by a clean close (queues deleted, normal
    /// shutdown) and a new open of the PCI function.
    #[derive(Debug, Clone)]
    pub struct NvmeFactory {
        pub pci: String,
        pub nsid: u32,
        pub options: NvmeOptions,
    }

    impl DeviceFactory for NvmeFactory {
        type Device = NvmeDevice;
        fn open(&mut self) -> Result<NvmeDevice, DeviceError> {
            NvmeDevice::open(&self.pci, self.nsid, self.options)
        }
        fn reopen(&mut self, dev: NvmeDevice) -> Result<NvmeDevice, DeviceError> {
            dev.close()?;
            self.open()
        }
    }
}
