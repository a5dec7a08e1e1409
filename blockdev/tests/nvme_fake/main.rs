//! The NVMe driver against the software controller: bring-up, I/O through the queues (wrap-around,
//! PRP lists, MDTS splitting, doorbell batching, out-of-order completions), status errors,
//! controller-fatal handling, the I/O timeout, and the refusals at open.
#![cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]

use std::collections::HashMap;
use std::time::Duration;

use blockdev::nvme::command::io;
use blockdev::nvme::fake::{self, FakeConfig, FakeHandle};
use blockdev::nvme::sys::{IovaRange, Memlock};
use blockdev::nvme::{NvmeDevice, NvmeOptions};
use blockdev::{BlockDevice, Completion, DeviceError, IoBuffer, Op, SyncIo};

type Dev = NvmeDevice<fake::FakeHost>;

mod bringup;
mod lifecycle;
mod model;
mod pairs;
mod queues;
mod timeout;

fn small_opts() -> NvmeOptions {
    NvmeOptions {
        queue_depth: 32,
        max_transfer: 256 << 10,
        arena_bytes: 8 << 20,
        max_arenas: 2,
        ..NvmeOptions::default()
    }
}

fn open_with(cfg: FakeConfig, opts: NvmeOptions) -> (Dev, FakeHandle) {
    let nsid = cfg.nsid;
    let (host, h) = fake::controller(cfg);
    (NvmeDevice::with_host(host, nsid, opts).unwrap(), h)
}

fn open_err(cfg: FakeConfig, nsid: u32, opts: NvmeOptions) -> String {
    let (host, _h) = fake::controller(cfg);
    match NvmeDevice::with_host(host, nsid, opts) {
        Ok(_) => panic!("open succeeded"),
        Err(e @ DeviceError::Open { .. }) => e.to_string(),
        Err(e) => panic!("not an open error: {e:?}"),
    }
}

fn drain(dev: &mut Dev, want: usize) -> Vec<Completion> {
    let mut out = Vec::with_capacity(want);
    let mut rounds = 0;
    while out.len() < want {
        dev.wait(&mut out, Duration::from_millis(100)).unwrap();
        rounds += 1;
        assert!(
            rounds < 1000,
            "only {} of {want} completions arrived",
            out.len()
        );
    }
    out
}

fn pattern(seed: u64, lba: u64, k: usize) -> u8 {
    (seed.wrapping_mul(31) as usize ^ (lba as usize * 7) ^ k.wrapping_mul(13)) as u8
}

fn filled(dev: &mut Dev, seed: u64, lba: u64, len: usize) -> IoBuffer {
    let mut b = dev.alloc_buffer(len).unwrap();
    for (k, x) in b.iter_mut().enumerate() {
        *x = pattern(seed, lba, k);
    }
    b
}
