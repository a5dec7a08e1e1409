//! The threaded `Log` over the NVMe driver (on its software controller) when the drive stops
//! answering: a flush that never completes must reach the producer as an error (the writer stops),
//! never as an ack and never as a hang.
#![cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]

use std::sync::mpsc;
use std::time::Duration;

use blockdev::nvme::command::io;
use blockdev::nvme::fake::FakeConfig;
use blockdev::nvme::NvmeOptions;
use nvmq_log::config::LogConfig;
use nvmq_log::{Log, LogError};

mod nvme_support;

#[test]
fn a_flush_that_never_completes_fails_the_append_and_stops_the_writer() {
    let opts = NvmeOptions {
        io_timeout: Duration::from_millis(30),
        ..NvmeOptions::default()
    };
    let (dev, h) = nvme_support::formatted(FakeConfig::default(), opts);
    let cfg = LogConfig {
        // No superblock update (and its flush) while the test counts flushes.
        idle_superblock: Duration::from_secs(3600),
        ..LogConfig::default()
    };
    let (w, _report) = recovery::open(dev, cfg.clone()).expect("open the log");
    let log = Log::start(w, cfg.queue_capacity);
    let part = log.create_partition("t", 0).expect("create a partition");
    log.append_wait(part, b"before the fault".to_vec())
        .expect("an append while the drive answers");

    h.stall_opcode(io::FLUSH);
    let flushes = h.stats().flushes;
    let (tx, rx) = mpsc::channel();
    log.append(
        part,
        b"never durable".to_vec(),
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    )
    .expect("queued");
    // Generous bound: it only turns a hang into a failure; the timeout is 30 ms.
    let r = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the append must complete (with an error), not hang");
    let msg = match r {
        Err(LogError::WriterStopped(msg)) => msg,
        r => panic!("an append whose flush never completed must fail, got {r:?}"),
    };
    // The reason is recorded before the append hears of it.
    assert!(log.fatal().is_some_and(|f| f.contains("timed out")));
    for want in [
        "flush at block 0 timed out",
        "NVMe command 0x00",
        "io_timeout 30 ms",
    ] {
        assert!(msg.contains(want), "{msg:?} lacks {want:?}");
    }
    assert!(matches!(
        log.append_wait(part, b"after".to_vec()),
        Err(LogError::WriterStopped(_))
    ));
    // The flush went to the drive once and was not retried.
    assert_eq!(h.stats().flushes, flushes + 1);
    assert_eq!(h.stats().aborts.len(), 1);
    log.shutdown();
}
