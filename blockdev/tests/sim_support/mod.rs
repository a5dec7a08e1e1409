//! Helpers shared by the sim tests (a directory module, so cargo does not build it as a test).
#![allow(dead_code)]

use std::time::Duration;

use blockdev::sim::{SimConfig, SimDevice};
use blockdev::{BlockDevice, Completion, DeviceError, IoBuffer};

pub const MIB: u64 = 1 << 20;

/// Distinct, recognisable bytes for write number `n`: no two patterns share a 512-byte sector.
pub fn pattern(n: u64, len: usize) -> Vec<u8> {
    let mut r = blockdev::sim::Rng::new(n.wrapping_mul(0x9E37_79B9).wrapping_add(17));
    let mut v = vec![0u8; len];
    r.fill(&mut v);
    v
}

pub fn buf(dev: &mut SimDevice, data: &[u8]) -> IoBuffer {
    let mut b = dev.alloc_buffer(data.len()).expect("alloc");
    b.copy_from_slice(data);
    b
}

pub fn submit_write(dev: &mut SimDevice, tag: u64, lba: u64, data: &[u8]) {
    let b = buf(dev, data);
    dev.submit_write(tag, lba, b).expect("submit_write");
}

/// Waits for exactly one completion (the caller knows one is coming).
pub fn next(dev: &mut SimDevice) -> Completion {
    let mut out = Vec::new();
    for _ in 0..1000 {
        // wait may hand out several; keep the rest in order by taking the first only when single.
        dev.wait(&mut out, Duration::from_secs(1)).expect("wait");
        if !out.is_empty() {
            assert_eq!(out.len(), 1, "expected one completion at a time");
            return out.pop().unwrap();
        }
    }
    panic!("no completion");
}

/// Waits until nothing is in flight; returns every completion in delivery order.
pub fn drain(dev: &mut SimDevice) -> Vec<Completion> {
    let mut out = Vec::new();
    let mut spins = 0;
    while dev.in_flight() > 0 {
        dev.wait(&mut out, Duration::from_secs(1)).expect("wait");
        spins += 1;
        assert!(spins < 100_000, "device never drained");
    }
    out
}

/// Writes and waits; panics on error.
pub fn write(dev: &mut SimDevice, lba: u64, data: &[u8]) {
    let b = buf(dev, data);
    blockdev::write_sync(dev, lba, b).expect("write");
}

pub fn flush(dev: &mut SimDevice) -> Result<(), DeviceError> {
    blockdev::flush_sync(dev)
}

pub fn read(dev: &mut SimDevice, lba: u64, len: usize) -> Result<Vec<u8>, DeviceError> {
    let b = dev.alloc_buffer(len).expect("alloc");
    blockdev::read_sync(dev, lba, b).map(|b| b.to_vec())
}

/// A small device with a virtual clock (tests drive time themselves).
pub fn virtual_cfg(seed: u64) -> SimConfig {
    let mut cfg = SimConfig::new(seed, 4 * MIB);
    cfg.clock = blockdev::sim::SimClock::virtual_at_zero();
    cfg
}

/// Per 512-byte sector of `got`: 'n' if equal to `new`, 'o' if equal to `old`, 'g' otherwise.
pub fn sector_map(got: &[u8], old: &[u8], new: &[u8]) -> String {
    got.chunks(512)
        .zip(old.chunks(512))
        .zip(new.chunks(512))
        .map(|((g, o), n)| {
            if g == n {
                'n'
            } else if g == o {
                'o'
            } else {
                'g'
            }
        })
        .collect()
}
