//! Several I/O queue pairs on one controller, each driven by its own thread: concurrent readers
//! beside a writer, fewer pairs granted than asked, a pair that cannot be created, a failure
//! seen by one pair stopping the others, and who shuts the controller down.

use std::sync::{Arc, Barrier};

use super::*;

fn pairs_opts(n: u16) -> NvmeOptions {
    NvmeOptions {
        queue_pairs: n,
        ..small_opts()
    }
}

fn expect_block(dev: &mut Dev, seed: u64, lba: u64) {
    let b = dev.read_at(lba * 4096, 4096).unwrap();
    for (k, &x) in b.iter().enumerate() {
        assert_eq!(x, pattern(seed, lba, k), "block {lba} byte {k}");
    }
}

#[test]
fn readers_on_their_own_pairs_beside_a_writer() {
    const READERS: u16 = 3;
    const STABLE: u64 = 64;
    let cfg = FakeConfig {
        io_queues: 4,
        ..FakeConfig::default()
    };
    let (mut writer, h) = open_with(cfg, pairs_opts(READERS + 1));
    assert_eq!(writer.details().queue_pairs, READERS + 1);
    assert_eq!(h.stats().queues_granted, READERS + 1);
    // A region written before the readers start: they check it while the writer goes on.
    for lba in 0..STABLE {
        let b = filled(&mut writer, 1, lba, 4096);
        writer.write_at(lba * 4096, &b).unwrap();
    }
    let readers: Vec<Dev> = (0..READERS)
        .map(|_| writer.queue_pair().unwrap().expect("a granted pair"))
        .collect();
    let mut qids: Vec<u16> = readers.iter().map(|r| r.queue_id()).collect();
    qids.push(writer.queue_id());
    qids.sort();
    assert_eq!(qids, vec![1, 2, 3, 4], "one pair each");
    let start = Arc::new(Barrier::new(usize::from(READERS) + 1));
    let threads: Vec<_> = readers
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                for round in 0..20u64 {
                    // Several reads in flight on this pair at once, reaped here.
                    let lbas: Vec<u64> = (0..8)
                        .map(|k| (round * 8 + k + i as u64) % STABLE)
                        .collect();
                    for (tag, &lba) in lbas.iter().enumerate() {
                        let b = r.alloc_buffer(4096).unwrap();
                        r.submit_read(tag as u64, lba, b).unwrap();
                    }
                    let done = drain(&mut r, lbas.len());
                    for c in done {
                        c.result.unwrap();
                        let lba = lbas[c.tag as usize];
                        let b = c.buffer.unwrap();
                        assert!(
                            b.iter().enumerate().all(|(k, &x)| x == pattern(1, lba, k)),
                            "reader {i} block {lba}"
                        );
                    }
                }
                r
            })
        })
        .collect();
    start.wait();
    // The writer, meanwhile, on its own pair and another region.
    for lba in STABLE..STABLE + 200 {
        let b = filled(&mut writer, 2, lba, 4096);
        writer.write_at(lba * 4096, &b).unwrap();
    }
    writer.flush().unwrap();
    let mut readers: Vec<Dev> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // What the writer wrote is seen through another pair.
    for lba in [STABLE, STABLE + 99, STABLE + 199] {
        expect_block(&mut readers[0], 2, lba);
    }
    let per_queue = h.stats().commands_per_queue;
    assert_eq!(
        per_queue[1],
        STABLE + 200 + 1,
        "the writer's writes and flush"
    );
    for q in 2..=usize::from(READERS) + 1 {
        assert!(
            per_queue[q] >= 160,
            "queue {q} ran its reader's reads: {per_queue:?}"
        );
    }
}

#[test]
fn fewer_pairs_granted_than_asked_are_shared_by_the_rest() {
    let cfg = FakeConfig {
        io_queues: 2,
        ..FakeConfig::default()
    };
    let (dev, h) = open_with(cfg, pairs_opts(4));
    assert_eq!(dev.details().queue_pairs, 2);
    assert_eq!(h.stats().queues_granted, 2);
    let second = dev.queue_pair().unwrap().expect("the second granted pair");
    assert_eq!(second.queue_id(), 2);
    assert!(dev.queue_pair().unwrap().is_none(), "no third pair");
    // A pair given back can be opened again, with the same queue id.
    drop(second);
    let again = dev.queue_pair().unwrap().expect("the pair given back");
    assert_eq!(again.queue_id(), 2);
}

#[test]
fn asking_for_one_pair_asks_the_controller_for_one() {
    let (dev, h) = open_with(FakeConfig::default(), small_opts());
    assert_eq!(h.stats().queues_granted, 1);
    assert!(dev.queue_pair().unwrap().is_none());
}

#[test]
fn a_pair_that_cannot_be_created_is_a_clear_error_and_the_others_go_on() {
    let (mut dev, h) = open_with(FakeConfig::default(), pairs_opts(2));
    h.fail_next_queue_creation();
    let e = dev.queue_pair().unwrap_err().to_string();
    assert!(
        e.contains("creating I/O queue pair 2") && e.contains("Create I/O Completion Queue"),
        "{e}"
    );
    let b = filled(&mut dev, 3, 5, 4096);
    dev.write_at(5 * 4096, &b).unwrap();
    expect_block(&mut dev, 3, 5);
    // Its queue id was given back: the next attempt gets it.
    let mut second = dev.queue_pair().unwrap().expect("pair 2 on a second try");
    assert_eq!(second.queue_id(), 2);
    expect_block(&mut second, 3, 5);
}

#[test]
fn a_first_pair_that_cannot_be_created_fails_the_open_naming_it() {
    let (host, h) = fake::controller(FakeConfig::default());
    h.fail_next_queue_creation();
    let e = NvmeDevice::with_host(host, 1, small_opts())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("creating I/O queue pair 1") && e.contains("internal error"),
        "{e}"
    );
}

#[test]
fn queue_pairs_out_of_range_are_refused_at_open() {
    let e = open_err(FakeConfig::default(), 1, pairs_opts(0));
    assert!(e.contains("queue_pairs must be 1..="), "{e}");
}

#[test]
fn a_controller_failure_found_by_one_pair_fails_the_others() {
    let (mut one, h) = open_with(FakeConfig::default(), pairs_opts(2));
    let mut two = one.queue_pair().unwrap().unwrap();
    h.hold_completions();
    for dev in [&mut one, &mut two] {
        for tag in 0..2 {
            let b = dev.alloc_buffer(4096).unwrap();
            dev.submit_write(tag, tag, b).unwrap();
        }
        dev.poll(&mut Vec::new()).unwrap();
    }
    h.set_fatal();
    for c in drain(&mut one, 2) {
        assert!(c.result.unwrap_err().to_string().contains("fatal status"));
    }
    // The other pair learns it at its next poll, with the reason.
    let c = drain(&mut two, 2);
    for x in &c {
        let e = x.result.clone().unwrap_err().to_string();
        assert!(e.contains("fatal status"), "{e}");
        assert!(x.buffer.is_some());
    }
    assert!(two.is_stopped());
    let b = two.alloc_buffer(4096).unwrap();
    let e = two.submit_write(9, 0, b).unwrap_err().to_string();
    assert!(e.contains("fatal status"), "{e}");
}

#[test]
fn the_last_pair_closed_shuts_the_controller_down() {
    let (one, h) = open_with(FakeConfig::default(), pairs_opts(3));
    let two = one.queue_pair().unwrap().unwrap();
    let mut three = one.queue_pair().unwrap().unwrap();
    let mapped = h.live_mappings();
    two.close().unwrap();
    assert_eq!(
        h.live_mappings(),
        mapped - 1,
        "pair 2's queue memory unmapped"
    );
    one.close().unwrap();
    assert_eq!(h.stats().shutdowns, 0, "pair 3 still runs");
    three.write_at(0, &[4u8; 4096]).unwrap();
    let deletes = h
        .stats()
        .admin_log
        .iter()
        .filter(|&&op| op == 0x00 || op == 0x04)
        .count();
    assert_eq!(deletes, 4, "two pairs' SQ and CQ deleted");
    three.close().unwrap();
    assert_eq!(h.stats().shutdowns, 1);
    assert_eq!(h.live_mappings(), 0);
}

/// The pair that finds the controller's fatal status reports it as the others do: in its
/// refusals (it used to say only that the device was stopped) and in every later poll.
#[test]
fn the_pair_that_finds_a_fatal_status_reports_it_like_the_others() {
    let (mut one, h) = open_with(FakeConfig::default(), pairs_opts(2));
    let mut two = one.queue_pair().unwrap().unwrap();
    h.hold_completions();
    for dev in [&mut one, &mut two] {
        let b = dev.alloc_buffer(4096).unwrap();
        dev.submit_write(1, 5, b).unwrap();
        dev.poll(&mut Vec::new()).unwrap();
    }
    h.set_fatal();
    let found = drain(&mut one, 1);
    let first = found[0].result.clone().unwrap_err();
    assert!(first.to_string().contains("fatal status"), "{first}");
    assert_eq!(drain(&mut two, 1).len(), 1);
    for (name, dev) in [("the finder", &mut one), ("the other", &mut two)] {
        let b = dev.alloc_buffer(4096).unwrap();
        let e = dev.submit_write(9, 0, b).unwrap_err();
        match &e {
            DeviceError::Failed { op, lba, reason } => {
                assert_eq!((*op, *lba), (Op::Write, 0), "{name}");
                assert!(reason.to_string().contains("fatal status"), "{name}: {e}");
            }
            e => panic!("{name}'s refusal: {e:?}"),
        }
        let polled = dev.poll(&mut Vec::new()).unwrap_err();
        assert!(
            polled.to_string().contains("fatal status"),
            "{name}: {polled}"
        );
    }
    assert_eq!(
        one.poll(&mut Vec::new()),
        two.poll(&mut Vec::new()),
        "one failure for both"
    );
}
