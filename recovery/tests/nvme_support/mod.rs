//! A log device on the NVMe driver's software controller, formatted, for the tests that run the
//! log over NVMe.

use blockdev::nvme::fake::{self, FakeConfig, FakeHandle, FakeHost};
use blockdev::nvme::{NvmeDevice, NvmeOptions};
use nvmq_log::config::FormatOptions;

/// A fake controller of `cfg`, opened with `opts` and formatted with a 1 MiB window and
/// 256 KiB batches.
pub fn formatted(cfg: FakeConfig, opts: NvmeOptions) -> (NvmeDevice<FakeHost>, FakeHandle) {
    let (host, h) = fake::controller(cfg);
    let mut dev = NvmeDevice::with_host(host, 1, opts).expect("open the fake NVMe device");
    let fmt = FormatOptions {
        window: 1 << 20,
        max_batch: 256 << 10,
        ..FormatOptions::default()
    };
    nvmq_log::mkfs::format(&mut dev, &fmt).expect("format");
    (dev, h)
}
