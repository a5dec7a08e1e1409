//! The conformance suite of the [`BlockDevice`] contract (storage.md §3): the checks every backend
//! must pass, run the same way on the file device, the sim, the NVMe driver against its software
//! controller, and the NVMe driver on real (or QEMU-emulated) hardware by `nvme-check`.
//!
//! A new backend (say an SPDK one) conforms when [`run_all`] over a [`DeviceFactory`] for it
//! returns only passed results. Each check is also a public function over a device, returning
//! `Err(ContractFailure)` naming the check, the operation, the block address and the tag, rather
//! than panicking, so a binary can run the suite on hardware and report every check.
//!
//! What the checks expect comes from the contract and from the device's
//! [`DeviceInfo`](crate::DeviceInfo), never from which backend it is. What the suite does *not*
//! cover is backend-specific and tested with each backend: open refusals, the crash model of the
//! sim, the NVMe admin sequence, PRP lists, command splitting, doorbells and status decoding.
//!
//! The suite writes over the whole device (the last block included): run it only on a device whose
//! data may be destroyed. It needs a device of at least [`MIN_BLOCKS`] logical blocks.

mod data;
mod event_loop;
mod factory;
mod failure;
mod io;
mod refusals;
mod shape;

use std::fmt;

use crate::{BlockDevice, DeviceError};

pub use data::{
    flush, max_transfer, reopen, reopen_in_flight, round_trip, write_isolation, Reopened,
};
pub use event_loop::{completion_fd, linked_flush};
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
pub use factory::{FakeNvmeFactory, NvmeFactory};
pub use factory::{FileFactory, SimFactory};
pub use failure::ContractFailure;
pub use refusals::{last_block, malformed_io, queue_depth};
pub use shape::{buffers, geometry, idle_wait};

/// The smallest device the suite runs on, in logical blocks.
pub const MIN_BLOCKS: u64 = 64;

/// Opens the device under test, and opens it again after the previous handle's life ended.
///
/// `reopen` ends `dev`'s life the way the backend's users can end it (drop it, close it, cut the
/// power of a simulated device, or let the process die) and opens the same device again. Whatever
/// was written and covered by a completed flush before must read back the same afterwards.
pub trait DeviceFactory {
    type Device: BlockDevice;
    fn open(&mut self) -> Result<Self::Device, DeviceError>;
    fn reopen(&mut self, dev: Self::Device) -> Result<Self::Device, DeviceError>;
}

/// One check of the suite: its name (as printed by `nvme-check`, `CHECK contract:<name>`) and the
/// promise it verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Check {
    pub name: &'static str,
    pub promise: &'static str,
}

/// One constant per check, so that the list and the runner cannot drift apart.
pub mod check {
    use super::Check;

    pub const GEOMETRY: Check = Check {
        name: "geometry",
        promise: "block sizes are powers of two >= 512, capacity and maximum transfer are whole \
              blocks, hints are whole blocks, identity is set, nothing is in flight at open",
    };
    pub const BUFFERS: Check = Check {
        name: "buffers",
        promise: "alloc_buffer hands out zeroed buffers of the asked length, aligned to the block \
              size and to 4096, up to the maximum transfer; zero bytes is refused",
    };
    pub const IDLE_WAIT: Check = Check {
        name: "idle-wait",
        promise: "poll and wait with nothing in flight return no completion at once",
    };
    pub const ROUND_TRIP: Check = Check {
        name: "round-trip",
        promise: "many writes and reads in flight at once complete once each with their tag, \
              operation, address and buffer, and read back what was written",
    };
    pub const LAST_BLOCK: Check = Check {
        name: "last-block",
        promise: "the last block is addressable; I/O at, across or overflowing the end is refused \
              at submit naming the address, and nothing goes in flight",
    };
    pub const MALFORMED_IO: Check = Check {
        name: "malformed-io",
        promise: "zero-length, partial-block and over-maximum transfers are refused at submit \
              exactly as check_io refuses them, and nothing goes in flight",
    };
    pub const QUEUE_DEPTH: Check = Check {
        name: "queue-depth",
        promise: "queue_depth I/Os are accepted; the next write, read or flush is refused with \
              QueueFull until their completions are collected",
    };
    pub const FLUSH: Check = Check {
        name: "flush",
        promise: "a flush submitted after writes completed completes with its tag and success; \
              flushes and writes in flight together all complete; the data reads back",
    };
    pub const MAX_TRANSFER: Check = Check {
        name: "max-transfer",
        promise: "transfers of exactly the maximum and one block under it round-trip",
    };
    pub const WRITE_ISOLATION: Check = Check {
        name: "write-isolation",
        promise: "a write changes only its own blocks, and the last completed write to a block \
              wins",
    };
    pub const COMPLETION_FD: Check = Check {
        name: "completion-fd",
        promise: "with a completion descriptor, every completion an event loop waits for makes it \
              readable within 5 s after a poll that returned nothing, the next poll returns it, \
              and with nothing in flight the descriptor is quiet (a polled device passes as is)",
    };
    pub const LINKED_FLUSH: Check = Check {
        name: "linked-flush",
        promise: "with linked_flush, write+flush pairs complete once each with their tags, the \
              write before its flush, the data reads back, and a pair that does not fit the \
              queue is refused; without, submit_write_flush is refused without side effects",
    };
    pub const REOPEN: Check = Check {
        name: "reopen",
        promise: "flushed data, the first and last blocks included, reads back after the device \
              is reopened, with the same identity and geometry",
    };
    pub const REOPEN_IN_FLIGHT: Check = Check {
        name: "reopen-in-flight",
        promise: "ending a device's life with writes and a flush in flight neither hangs nor \
              panics, and the device reopens and works",
    };
}

/// Every check [`run_all`] runs, in order.
pub const CHECKS: &[Check] = &[
    check::GEOMETRY,
    check::BUFFERS,
    check::IDLE_WAIT,
    check::ROUND_TRIP,
    check::LAST_BLOCK,
    check::MALFORMED_IO,
    check::QUEUE_DEPTH,
    check::FLUSH,
    check::MAX_TRANSFER,
    check::WRITE_ISOLATION,
    check::COMPLETION_FD,
    check::LINKED_FLUSH,
    check::REOPEN,
    check::REOPEN_IN_FLIGHT,
];

/// The outcome of one check.
#[derive(Debug)]
pub struct CheckResult {
    pub check: Check,
    pub outcome: Result<(), ContractFailure>,
}

impl CheckResult {
    pub fn passed(&self) -> bool {
        self.outcome.is_ok()
    }
}

impl fmt::Display for CheckResult {
    /// `<name> PASS: <promise>` or `<name> FAIL: <failure>`: one report line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.outcome {
            Ok(()) => write!(f, "{} PASS: {}", self.check.name, self.check.promise),
            Err(e) => write!(f, "{} FAIL: {e}", self.check.name),
        }
    }
}

/// Runs the checks that need only an open device, in [`CHECKS`] order (all but the reopen ones).
pub fn run_device_checks<D: BlockDevice + ?Sized>(dev: &mut D) -> Vec<CheckResult> {
    type DeviceCheck<D> = fn(&mut D) -> Result<(), ContractFailure>;
    let checks: [(Check, DeviceCheck<D>); 12] = [
        (check::GEOMETRY, geometry),
        (check::BUFFERS, buffers),
        (check::IDLE_WAIT, idle_wait),
        (check::ROUND_TRIP, round_trip),
        (check::LAST_BLOCK, last_block),
        (check::MALFORMED_IO, malformed_io),
        (check::QUEUE_DEPTH, queue_depth),
        (check::FLUSH, flush),
        (check::MAX_TRANSFER, max_transfer),
        (check::WRITE_ISOLATION, write_isolation),
        (check::COMPLETION_FD, completion_fd),
        (check::LINKED_FLUSH, linked_flush),
    ];
    let mut results = Vec::with_capacity(checks.len());
    for (check, run) in checks {
        let outcome = run(dev);
        if outcome.is_err() {
            // A failed check may leave I/O behind; the next check starts from an idle device.
            io::settle(dev);
        }
        results.push(CheckResult { check, outcome });
    }
    results
}

/// Opens a device through `factory` and runs every check of [`CHECKS`] on it, in order. If the
/// device cannot be opened, `geometry` fails with the open error and nothing else runs; if the
/// `reopen` check cannot reopen it, `reopen-in-flight` fails as not run.
pub fn run_all<F: DeviceFactory>(factory: &mut F) -> Vec<CheckResult> {
    let mut dev = match factory.open() {
        Ok(d) => d,
        Err(e) => {
            return vec![CheckResult {
                check: check::GEOMETRY,
                outcome: Err(ContractFailure::device(
                    check::GEOMETRY.name,
                    "opening the device",
                    &e,
                )),
            }]
        }
    };
    let mut results = run_device_checks(&mut dev);
    let (outcome, dev) = reopen(factory, dev);
    results.push(CheckResult {
        check: check::REOPEN,
        outcome,
    });
    let outcome = match dev {
        Some(dev) => reopen_in_flight(factory, dev).0,
        None => Err(ContractFailure::new(
            check::REOPEN_IN_FLIGHT.name,
            "not run: the reopen check could not reopen the device",
        )),
    };
    results.push(CheckResult {
        check: check::REOPEN_IN_FLIGHT,
        outcome,
    });
    results
}

/// The results that failed, one report line each; empty when every check passed.
pub fn failures(results: &[CheckResult]) -> Vec<String> {
    results
        .iter()
        .filter(|r| !r.passed())
        .map(|r| r.to_string())
        .collect()
}
