//! A stale batch behind a misdirected write (storage.md §4.2): a cut leaves a valid,
//! never-acknowledged batch at position P that does not link into the chain, so recovery cuts the
//! tail at P and fences it with a new epoch; the new era's batch for P is then misdirected, its
//! flush succeeds and it is acknowledged. P still holds the old era's batch, valid in every check
//! but its epoch and its link. A reader must refuse it (naming the position) instead of serving
//! its never-acknowledged records, and the scrub must report it.

use std::time::Duration;

use blockdev::sim::{Latency, SimConfig, SimDevice, SimHandle};
use nvmq_log::batch::BatchBuilder;
use nvmq_log::format::{BatchKind, RecordKind};
use nvmq_log::{FormatOptions, Log, LogConfig, LogError};

const MIB: u64 = 1 << 20;
const PAYLOAD: usize = 300;

fn config(scrub_rate: u64) -> LogConfig {
    LogConfig {
        // Reads go to the device, not to the copy of the batch the writer kept.
        tail_cache_bytes: 0,
        scrub_rate,
        // No superblock write between the reopen and the append: the misdirected write must be
        // the append's batch.
        idle_superblock: Duration::from_secs(3600),
        ..LogConfig::default()
    }
}

struct Stale {
    log: Log,
    handle: SimHandle,
    part: u32,
    /// Where the stale batch is, and the offset its record claims.
    position: u64,
    offset: u64,
}

/// Era 1 writes ten records and stops; a stale era-1 batch holding offset 10 is planted at the
/// tail (as a cut that kept it but tore its predecessor would leave it); the reopen cuts there;
/// the era-2 batch for that position (offset 10 again) is misdirected and acknowledged.
fn stale_batch_behind_a_misdirected_write(seed: u64, scrub_rate: u64) -> Stale {
    let mut c = SimConfig::new(seed, 64 * MIB);
    c.flush_latency = Latency::Fixed(Duration::from_micros(200));
    let (mut dev, handle) = SimDevice::new(c);
    nvmq_log::mkfs::format(&mut dev, &FormatOptions::default()).expect("format");
    let cfg = config(scrub_rate);
    let (w, _) = recovery::open(dev, cfg.clone()).expect("open");
    let log = Log::start(w, cfg.queue_capacity);
    let part = log.create_partition("t", 0).expect("create");
    for i in 0..10u8 {
        log.append_wait(part, vec![i; PAYLOAD]).expect("append");
    }
    let geo = log.geometry();
    let epoch = log.shared().lock().epoch;
    let tail = log.durable();
    log.shutdown();

    let mut buf = vec![0u8; geo.write_unit as usize];
    let mut b = BatchBuilder::new(&mut buf, geo.format_id, epoch, tail);
    b.push(RecordKind::Data, part, 10, &[0x5a; PAYLOAD]);
    let (len, _) = b.finish(
        geo.write_unit as usize,
        BatchKind::Records,
        tail,
        0xdead_beef,
        0,
    );
    let [(at, _), _] = geo.segments(tail, len as u64);
    handle.poke_durable(at, &buf[..len]);

    let dev = handle.power_on();
    let (w, report) = recovery::open(dev, cfg.clone()).expect("reopen");
    assert_eq!(report.cut_at, tail, "recovery cuts where the chain breaks");
    let log = Log::start(w, cfg.queue_capacity);
    let lbs = geo.logical_block;
    handle.misdirect_next_write((geo.log_start + tail + 16 * MIB) / lbs);
    let new = log
        .append_wait(part, vec![0x11; PAYLOAD])
        .expect("append (its flush succeeds)");
    assert_eq!((new.offset, new.position >= tail), (10, true));
    assert_eq!(
        handle.peek(at, len),
        buf[..len].to_vec(),
        "the stale batch is still at the position"
    );
    Stale {
        log,
        handle,
        part,
        position: tail,
        offset: 10,
    }
}

#[test]
fn a_read_refuses_a_stale_batch_of_another_epoch_and_names_its_position() {
    let s = stale_batch_behind_a_misdirected_write(1, 0);
    // Offsets before it are served as written.
    let before = s.log.read(s.part, 9, 1).expect("read offset 9");
    assert_eq!(before[0].payload, vec![9u8; PAYLOAD]);
    match s.log.read(s.part, s.offset, 1) {
        Err(LogError::Corrupt { position, what, .. }) => {
            assert_eq!(position, s.position);
            assert!(what.contains("epoch"), "{what}");
        }
        Ok(recs) => panic!(
            "served the stale batch's never-acknowledged record: {:?}",
            recs.first().map(|r| &r.payload[..4])
        ),
        Err(e) => panic!("refused, but not as a corrupt batch: {e}"),
    }
    drop(s.handle);
    s.log.shutdown();
}

#[test]
fn the_scrub_reports_a_stale_batch_that_does_not_link() {
    let s = stale_batch_behind_a_misdirected_write(2, 1 << 30);
    let shared = s.log.shared().clone();
    let st = shared.wait_until(Duration::from_secs(30), |st| {
        !st.scrub.damage.is_empty() || st.scrub.passes >= 3
    });
    let found: Vec<u64> = st.scrub.damage.iter().map(|d| d.0).collect();
    assert_eq!(found, vec![s.position], "{:?}", st.scrub.damage);
    drop(st);
    s.log.shutdown();
}
