//! Readers on NVMe queue pairs of their own: the log's readers read the device on the
//! controller's extra I/O queue pairs while the writer appends on its pair; every record read
//! is the one appended, no read goes through the writer, and with no pair granted the reads go
//! through the writer as before.
#![cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use blockdev::nvme::fake::{FakeConfig, FakeHandle};
use blockdev::nvme::NvmeOptions;
use blockdev::BlockDevice;
use nvmq_log::config::LogConfig;
use nvmq_log::direct::DirectReads;
use nvmq_log::Log;

mod nvme_support;

const READERS: usize = 2;

fn payload(i: u64) -> Vec<u8> {
    format!("record {i:06} ")
        .repeat(1 + (i % 7) as usize)
        .into_bytes()
}

/// A log on the fake controller whose device asks for `1 + READERS` pairs; the controller
/// grants `granted`. Readers get the pairs beyond the writer's.
fn log_on_fake(granted: u16) -> (Log, FakeHandle, usize) {
    let cfg = FakeConfig {
        io_queues: granted,
        blocks: 16384,
        ..FakeConfig::default()
    };
    let opts = NvmeOptions {
        queue_pairs: 1 + READERS as u16,
        ..NvmeOptions::default()
    };
    let (dev, h) = nvme_support::formatted(cfg, opts);
    let mut pairs: Vec<Box<dyn BlockDevice>> = Vec::new();
    while let Some(p) = dev.queue_pair().expect("open a queue pair") {
        pairs.push(Box::new(p));
    }
    let n = pairs.len();
    let cfg = LogConfig {
        // Every read goes to the device, and only the readers read.
        tail_cache_bytes: 0,
        scrub_rate: 0,
        ..LogConfig::default()
    };
    let (mut w, _report) = recovery::open(dev, cfg.clone()).expect("open the log");
    w.set_direct_reads(DirectReads::new(pairs));
    (Log::start(w, cfg.queue_capacity), h, n)
}

/// Appends while `READERS` threads read the partition from the start over and over, checking
/// every record against what was appended.
fn readers_beside_a_producer(log: Arc<Log>) {
    let part = log.create_partition("t", 0).expect("create a partition");
    for i in 0..200 {
        log.append_wait(part, payload(i)).expect("append");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(READERS + 1));
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let (log, stop, start) = (log.clone(), stop.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let mut rounds = 0u64;
                while !stop.load(Ordering::Relaxed) || rounds < 3 {
                    let mut offset = 0u64;
                    while offset < 200 {
                        let got = log.read(part, offset, 4096).expect("read");
                        assert!(!got.is_empty(), "no record at offset {offset}");
                        for r in got {
                            assert_eq!(r.offset, offset);
                            assert_eq!(&r.payload[..], &payload(offset)[..], "offset {offset}");
                            offset += 1;
                        }
                    }
                    rounds += 1;
                }
                rounds
            })
        })
        .collect();
    start.wait();
    for i in 200..600 {
        log.append_wait(part, payload(i))
            .expect("append beside the readers");
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().expect("reader") >= 3);
    }
    // Everything appended meanwhile reads back too.
    let got = log.read(part, 590, 1 << 20).expect("read the end");
    assert_eq!(got.len(), 10);
    for r in got {
        assert_eq!(&r.payload[..], &payload(r.offset)[..]);
    }
}

#[test]
fn readers_read_on_their_own_pairs_while_the_writer_appends() {
    let (log, h, pairs) = log_on_fake(1 + READERS as u16);
    assert_eq!(pairs, READERS);
    let log = Arc::new(log);
    readers_beside_a_producer(log.clone());
    let st = log.stats();
    assert!(st.reads > 0);
    assert_eq!(
        st.direct_reads, st.reads,
        "as many pairs as readers: none through the writer"
    );
    let per_queue = h.stats().commands_per_queue;
    for q in 2..=1 + READERS {
        assert!(per_queue[q] > 0, "reader pair {q} read: {per_queue:?}");
    }
    drop(log);
    assert_eq!(
        h.stats().shutdowns,
        1,
        "the controller shut down with its last pair"
    );
}

#[test]
fn with_no_pair_granted_the_readers_go_through_the_writer() {
    let (log, h, pairs) = log_on_fake(1);
    assert_eq!(pairs, 0);
    let log = Arc::new(log);
    readers_beside_a_producer(log.clone());
    let st = log.stats();
    assert!(st.reads > 0);
    assert_eq!(st.direct_reads, 0);
    assert_eq!(h.stats().commands_per_queue.len(), 2);
}
