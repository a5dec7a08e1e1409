//! A log opened on a device whose geometry changed since format (issue 11, items 2 and 3): the
//! same bytes, formatted on one device, opened on a device with larger blocks or a smaller
//! maximum transfer.
//!
//! - Larger physical or file system blocks than the log's write unit U: every batch write would
//!   be a read-modify-write of a block shared with the previous acknowledged batch, so open
//!   refuses, before writing anything, naming both sizes. A larger *atomic* write unit is no
//!   hazard and opens.
//! - A smaller maximum transfer than the log's maximum batch: the writer splits each batch into
//!   several writes (the batch counts as written only when all completed), and reads likewise;
//!   nothing goes fatal on a healthy device. A maximum transfer below U, or a queue too shallow
//!   for the writes of one batch, is refused at open.

use std::time::Duration;

use blockdev::sim::{SimConfig, SimDevice, SimHandle};
use blockdev::BlockDevice;
use nvmq_log::config::{FormatOptions, LogConfig};
use nvmq_log::format::LOG_START;
use nvmq_log::{Log, LogError};
use recovery::RecoveryError;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const CAPACITY: u64 = LOG_START + 6 * MIB;

fn sim_config(seed: u64, logical: u32, physical: u32, max_transfer: u32) -> SimConfig {
    let mut c = SimConfig::new(seed, CAPACITY);
    c.logical_block_size = logical;
    c.physical_block_size = physical;
    c.max_transfer = max_transfer;
    c
}

/// A window of 1 MiB and batches of 256 KiB: a 6 MiB log laps a few times in these tests.
fn format_options() -> FormatOptions {
    FormatOptions {
        window: MIB,
        max_batch: (256 * KIB) as u32,
        log_size: None,
        format_id: None,
    }
}

/// Readers always go to the device (no tail cache), and the scrub re-reads the log in batches
/// of up to a maximum batch, fast.
fn log_config() -> LogConfig {
    LogConfig {
        tail_cache_bytes: 0,
        scrub_rate: 256 << 20,
        ..LogConfig::default()
    }
}

fn payload(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (j as u64 * 131 + i as u64 * 7919 + (j >> 9) as u64) as u8)
        .collect()
}

/// Formats a device of `cfg` and writes `records` records of `len` bytes to partition t/0;
/// returns its handle after a clean shutdown.
fn formatted_with_records(cfg: SimConfig, records: usize, len: usize) -> SimHandle {
    let (mut dev, handle) = SimDevice::new(cfg);
    nvmq_log::mkfs::format(&mut dev, &format_options()).expect("format");
    let (w, _) = recovery::open(dev, log_config()).expect("open after format");
    let log = Log::start(w, 64);
    let part = log.create_partition("t", 0).expect("create");
    for i in 0..records {
        log.append_wait(part, payload(i, len)).expect("append");
    }
    log.shutdown();
    handle
}

/// The same bytes on a new device of `cfg`: the log moved to another drive.
fn moved(from: &SimHandle, cfg: SimConfig) -> (SimDevice, SimHandle) {
    let bytes = from.peek(0, CAPACITY as usize);
    let (dev, handle) = SimDevice::new(cfg);
    handle.poke_durable(0, &bytes);
    (dev, handle)
}

fn open_err<D: BlockDevice>(dev: D) -> RecoveryError {
    match recovery::open(dev, log_config()) {
        Ok(_) => panic!("the log opened on a device it does not fit"),
        Err(e) => e,
    }
}

/// Reads partition t/0 from its start offset to its end and checks every record against
/// `payload(i, len)` (record i at offset i); returns how many were read. Retention may free the
/// oldest records meanwhile (the head moves a little after the last append, when the superblock
/// that frees the space it wanted becomes durable): reading goes on from the new start.
fn read_all(log: &Log, len: usize) -> usize {
    let part = log.partition_id("t", 0).expect("partition t/0");
    let span = || {
        log.partitions()
            .into_iter()
            .find(|p| p.0 == part)
            .map(|p| (p.3, p.4))
            .expect("partition listed")
    };
    let (mut next, end) = span();
    let mut read = 0;
    while next < end {
        let recs = match log.read(part, next, 1 << 20) {
            Ok(recs) => recs,
            Err(LogError::OffsetOutOfRange { start, .. }) if start > next => {
                read = 0;
                next = start;
                continue;
            }
            Err(e) => panic!("read at offset {next}: {e}"),
        };
        assert!(!recs.is_empty(), "read stalled at offset {next}");
        for r in recs {
            assert_eq!(r.offset, next);
            assert!(
                r.payload[..] == payload(next as usize, len)[..],
                "payload of offset {next} differs"
            );
            next += 1;
            read += 1;
        }
    }
    read
}

/// Waits for a full scrub pass and asserts it found nothing (its reads go to the device in
/// pieces of up to a maximum batch).
fn scrub_clean(log: &Log) {
    let s = log
        .shared()
        .wait_until(Duration::from_secs(20), |s| s.scrub.passes >= 1);
    assert!(s.scrub.passes >= 1, "no scrub pass within 20 s");
    assert!(s.scrub.damage.is_empty(), "scrub: {:?}", s.scrub.damage);
}

// ---------------------------------------------------------------------------------------------
// Item 2: blocks larger than the write unit.

#[test]
fn a_log_moved_to_a_device_with_larger_physical_blocks_is_refused_untouched() {
    // Formatted on 512-byte sectors: U = 512.
    let old = formatted_with_records(sim_config(1, 512, 512, MIB as u32), 20, 700);
    // The same bytes on a 512e drive (512-byte logical, 4 KiB physical blocks).
    let (dev, handle) = moved(&old, sim_config(2, 512, 4096, MIB as u32));
    let e = open_err(dev);
    assert!(
        matches!(
            e,
            RecoveryError::Log(LogError::BlockExceedsWriteUnit {
                block: "physical block",
                size: 4096,
                write_unit: 512
            })
        ),
        "{e:?}"
    );
    let e = e.to_string();
    for want in [
        "physical block",
        "4096 B",
        "write unit of 512 B",
        "nothing was written",
    ] {
        assert!(e.contains(want), "error {e:?} lacks {want:?}");
    }
    assert_eq!(
        handle.stats().writes,
        0,
        "the refusal wrote to the device: {e}"
    );

    // Moved back to 512-byte physical blocks, it opens with every record.
    let (dev, _) = moved(&handle, sim_config(3, 512, 512, MIB as u32));
    let (w, _) = recovery::open(dev, log_config()).expect("open on the original geometry");
    let log = Log::start(w, 64);
    assert_eq!(read_all(&log, 700), 20);
    log.shutdown();
}

#[test]
fn a_log_moved_to_a_file_system_with_larger_blocks_is_refused_untouched() {
    let old = formatted_with_records(sim_config(4, 512, 512, MIB as u32), 5, 100);
    let (dev, handle) = moved(&old, sim_config(5, 512, 512, MIB as u32));
    // A file on a file system of 4 KiB blocks (the file backend reports it in fs_block_size).
    let dev = blockdev::reported::Reported::new(dev, |i| i.fs_block_size = 4096);
    let e = open_err(dev);
    assert!(
        matches!(
            e,
            RecoveryError::Log(LogError::BlockExceedsWriteUnit {
                block: "file system block",
                size: 4096,
                write_unit: 512
            })
        ),
        "{e:?}"
    );
    let e = e.to_string();
    for want in ["file system block", "4096 B", "write unit of 512 B"] {
        assert!(e.contains(want), "error {e:?} lacks {want:?}");
    }
    assert_eq!(handle.stats().writes, 0, "the refusal wrote: {e}");
}

#[test]
fn a_larger_atomic_write_unit_is_no_hazard_and_opens() {
    let old = formatted_with_records(sim_config(6, 4096, 4096, MIB as u32), 5, 100);
    let (dev, _) = moved(&old, sim_config(7, 4096, 4096, MIB as u32));
    // A drive that applies writes of up to 64 KiB whole across a power loss (NVMe AWUPF): a
    // 4 KiB write is applied whole too, and never touches blocks outside it.
    let dev = blockdev::reported::Reported::new(dev, |i| i.atomic_write_unit = 64 << 10);
    let (w, _) = recovery::open(dev, log_config()).expect("open");
    let log = Log::start(w, 64);
    let part = log.partition_id("t", 0).expect("t/0");
    log.append_wait(part, payload(5, 100)).expect("append");
    assert_eq!(read_all(&log, 100), 6);
    log.shutdown();
}

// ---------------------------------------------------------------------------------------------
// Item 3: a maximum transfer smaller than the maximum batch.

/// The acks of appends queued by `queue_all`: (record index, result).
type Acks = std::sync::mpsc::Receiver<(usize, Result<nvmq_log::Appended, LogError>)>;

/// Queues `n` records of `len` bytes (record i is `payload(i, len)`) without waiting for their
/// acks; `wait_all` then checks them.
fn queue_all(log: &Log, first: usize, n: usize, len: usize) -> Acks {
    let part = log.partition_id("t", 0).expect("t/0");
    let (tx, rx) = std::sync::mpsc::channel();
    for i in first..first + n {
        let tx = tx.clone();
        log.append(
            part,
            payload(i, len),
            Box::new(move |r| {
                let _ = tx.send((i, r));
            }),
        )
        .expect("queue an append");
    }
    rx
}

/// Every one of `n` queued appends must be acknowledged, record i at offset i.
fn wait_all(acks: Acks, n: usize) {
    let mut acked = 0;
    for (i, r) in acks {
        match r {
            Ok(a) => assert_eq!(a.offset, i as u64, "record {i} at the wrong offset"),
            Err(e) => panic!("append {i} failed: {e}"),
        }
        acked += 1;
    }
    assert_eq!(acked, n);
}

/// Queues `n` records and waits for all their acks: batches fill as far as the writer's pace
/// lets them.
fn append_all(log: &Log, first: usize, n: usize, len: usize) {
    wait_all(queue_all(log, first, n, len), n);
}

struct NoBell;
impl nvmq_log::Doorbell for NoBell {
    fn ring(&self) {}
}

#[test]
fn a_batch_larger_than_the_max_transfer_is_written_in_pieces_not_fatal() {
    // Formatted with 256 KiB batches on a device that takes 1 MiB transfers ...
    let old = formatted_with_records(sim_config(8, 4096, 4096, MIB as u32), 0, 0);
    // ... opened where a transfer is at most 128 KiB.
    let (dev, handle) = moved(&old, sim_config(9, 4096, 4096, (128 * KIB) as u32));
    let (w, _) = recovery::open(dev, log_config()).expect("open");
    let log = std::sync::Arc::new(Log::start(w, 4096));
    // One record of 200 KiB: its batch needs two writes.
    let part = log.partition_id("t", 0).expect("t/0");
    let big = 200 * KIB as usize;
    log.append_wait(part, payload(0, big)).unwrap_or_else(|e| {
        panic!(
            "a 200 KiB record on a healthy device: {e} (writer: {:?})",
            log.fatal()
        )
    });
    // Full batches of small records (3 MiB: the ring keeps them all).
    append_all(&log, 1, 1500, 2048);
    assert_eq!(log.fatal(), None);
    scrub_clean(&log);
    let log = std::sync::Arc::try_unwrap(log).unwrap_or_else(|_| panic!("log still shared"));
    log.shutdown();

    // Everything reads back after a reopen on the same device.
    let (w, _) = recovery::open(handle.power_on(), log_config()).expect("reopen");
    let log = Log::start(w, 64);
    let part = log.partition_id("t", 0).expect("t/0");
    let r = log.read(part, 0, 1).expect("read the big record");
    assert!(r[0].payload[..] == payload(0, big)[..]);
    for i in [1usize, 700, 1500] {
        let r = log.read(part, i as u64, 1).expect("read a small record");
        assert!(r[0].payload[..] == payload(i, 2048)[..], "record {i}");
    }
    log.shutdown();
}

#[test]
fn batches_split_into_many_pieces_lap_the_ring_and_survive_reopen() {
    let old = formatted_with_records(sim_config(10, 4096, 4096, MIB as u32), 0, 0);
    // 16 KiB transfers: a 256 KiB batch takes 16 writes, 17 where it crosses the ring's end.
    let (dev, handle) = moved(&old, sim_config(11, 4096, 4096, (16 * KIB) as u32));
    let (w, _) = recovery::open(dev, log_config()).expect("open");
    // 3000 records of 5000 B: about 15 MiB, well over two laps of the 6 MiB ring. All are
    // queued before the writer takes any (its owner starts after), so every batch fills to the
    // maximum whatever the machine's pace: no batch fits in one 16 KiB transfer.
    let (log, mut host) = Log::hosted(w, 4096, std::sync::Arc::new(NoBell));
    let acks = queue_all(&log, 0, 3000, 5000);
    let owner = std::thread::spawn(move || loop {
        match host.turn() {
            nvmq_log::Turn::Moved => {}
            nvmq_log::Turn::Idle { after, .. } => {
                std::thread::sleep(after.min(Duration::from_micros(200)))
            }
            nvmq_log::Turn::Stopped => return,
        }
    });
    wait_all(acks, 3000);
    assert_eq!(log.fatal(), None);
    // Batches of many pieces, over more than two laps of the ring.
    let st = log.stats();
    assert!(
        st.device_bytes_written / st.batches_written > 128 * KIB,
        "batches of {} B on average: not filled to the maximum of 256 KiB",
        st.device_bytes_written / st.batches_written
    );
    assert!(log.durable() > 2 * log.geometry().log_size);
    let retained = read_all(&log, 5000);
    assert!(retained > 500, "only {retained} records retained");
    scrub_clean(&log);
    log.shutdown();
    owner.join().expect("the writer's owner thread");

    let (w, report) = recovery::open(handle.power_on(), log_config()).expect("reopen");
    let log = Log::start(w, 64);
    let part = log.partition_id("t", 0).expect("t/0");
    assert_eq!(log.partition(part).map(|p| p.durable_end), Some(3000));
    let after = read_all(&log, 5000);
    assert!(after > 500, "only {after} records after reopen ({report})");
    log.shutdown();
}

#[test]
fn a_max_transfer_below_the_write_unit_is_refused() {
    // U = 4096 (4 KiB physical blocks under 512-byte sectors) ...
    let old = formatted_with_records(sim_config(12, 512, 4096, MIB as u32), 1, 100);
    // ... on a device that moves at most 2 KiB at once.
    let (dev, handle) = moved(&old, sim_config(13, 512, 4096, 2048));
    let e = open_err(dev);
    assert!(
        matches!(
            e,
            RecoveryError::Log(LogError::TransferBelowWriteUnit {
                max_transfer: 2048,
                write_unit: 4096
            })
        ),
        "{e:?}"
    );
    let e = e.to_string();
    for want in ["maximum transfer", "2048 B", "write unit of 4096 B"] {
        assert!(e.contains(want), "error {e:?} lacks {want:?}");
    }
    assert_eq!(handle.stats().writes, 0, "the refusal wrote: {e}");
}

#[test]
fn a_queue_too_shallow_for_one_split_batch_is_refused() {
    let old = formatted_with_records(sim_config(14, 4096, 4096, MIB as u32), 1, 100);
    let mut cfg = sim_config(15, 4096, 4096, (16 * KIB) as u32);
    cfg.queue_depth = 8;
    let (dev, handle) = moved(&old, cfg);
    let e = open_err(dev);
    assert!(
        matches!(
            e,
            RecoveryError::Log(LogError::QueueTooShallow {
                queue_depth: 8,
                ios_per_batch: 17,
                ..
            })
        ),
        "{e:?}"
    );
    let e = e.to_string();
    for want in ["queue depth 8", "16384 B", "262144 B"] {
        assert!(e.contains(want), "error {e:?} lacks {want:?}");
    }
    assert_eq!(handle.stats().writes, 0, "the refusal wrote: {e}");
}

#[test]
fn a_power_cut_while_split_batches_are_in_flight_loses_nothing_acknowledged() {
    for seed in 20..26u64 {
        let old = formatted_with_records(sim_config(seed, 4096, 4096, MIB as u32), 0, 0);
        let mut cfg = sim_config(seed + 100, 4096, 4096, (16 * KIB) as u32);
        cfg.write_latency = blockdev::sim::Latency::Uniform {
            min: Duration::from_micros(20),
            max: Duration::from_micros(400),
        };
        cfg.flush_latency = blockdev::sim::Latency::Fixed(Duration::from_micros(500));
        cfg.garbage_sectors = true;
        cfg.rmw_damage = true;
        let (dev, handle) = moved(&old, cfg);
        let (w, _) = recovery::open(dev, log_config()).expect("open");
        let log = Log::start(w, 4096);
        let part = log.partition_id("t", 0).expect("t/0");
        let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        // About 3 MiB queued (the 6 MiB ring keeps all of it); the cut comes while it is
        // written, once some of it was acknowledged.
        for i in 0..600usize {
            let acked = acked.clone();
            log.append(
                part,
                payload(i, 5000),
                Box::new(move |r| {
                    if let Ok(a) = r {
                        acked.lock().unwrap_or_else(|e| e.into_inner()).push((i, a));
                    }
                }),
            )
            .expect("queue an append");
        }
        let cut_after = 40 * (seed as usize - 19);
        let t0 = std::time::Instant::now();
        while acked.lock().unwrap_or_else(|e| e.into_inner()).len() < cut_after
            && t0.elapsed() < Duration::from_secs(20)
        {
            std::thread::sleep(Duration::from_micros(200));
        }
        handle.power_cut();
        log.shutdown();
        let acked = std::mem::take(&mut *acked.lock().unwrap_or_else(|e| e.into_inner()));

        let (w, report) = recovery::open(handle.power_on(), log_config()).expect("recover");
        let log = Log::start(w, 64);
        for (i, a) in &acked {
            assert_eq!(a.offset, *i as u64);
            let r = log
                .read(part, a.offset, 1)
                .unwrap_or_else(|e| panic!("seed {seed}: acked record {i} lost: {e} ({report})"));
            assert!(
                r.first()
                    .is_some_and(|r| r.payload[..] == payload(*i, 5000)[..]),
                "seed {seed}: acked record {i} differs after recovery ({report})"
            );
        }
        log.shutdown();
    }
}
