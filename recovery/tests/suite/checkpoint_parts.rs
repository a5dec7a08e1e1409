//! Power cuts while checkpoints of several batches are written (storage.md §4.5, §6–7): a
//! registry of hundreds of partitions whose checkpoint takes five batches or more, with
//! appends, deletes and creates going on, and a cut at a random moment, often between two
//! batches of one checkpoint. After each cut the log must open (the superblock never names a
//! checkpoint whose batches are not all durable), every acknowledged record must be there byte
//! for byte, every acknowledged delete must hold and every acknowledged create must be there.
//!
//! Deterministic: the writer is stepped on this thread over the sim device's virtual clock. A
//! failure names the seed; `NVMQ_SEED=<seed>` replays it, `NVMQ_CUTS=<n>` sets the cuts per seed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blockdev::sim::{Latency, Rng, SimClock, SimConfig, SimDevice, SimHandle};
use blockdev::BlockDevice;
use nvmq_log::{read_with, Appended, FormatOptions, LogConfig, LogError, Request, Writer};

use crate::stepped;
use stepped::{drive, now, stepped_read};

const KIB: u64 = 1 << 10;

type Answers = Arc<Mutex<Vec<(Op, Result<Appended, LogError>)>>>;

/// What an answer was for.
#[derive(Clone, Debug)]
enum Op {
    Append { partition: u32, payload: Vec<u8> },
    Create { name: String },
    Delete { partition: u32 },
}

/// What is known about the log.
#[derive(Default)]
struct Truth {
    /// Live partitions (create acknowledged, no delete acknowledged): their records by offset,
    /// None where a record is there but was never acknowledged to us (a survivor read later).
    live: HashMap<u32, Vec<Option<Vec<u8>>>>,
    /// Deletes acknowledged: gone for good.
    deleted: HashSet<u32>,
    /// Deletes sent and not answered before the cut: either way is right.
    deleting: HashSet<u32>,
    /// Creates sent and not answered before the cut, by name.
    creating: HashSet<String>,
    /// Payloads sent and not answered, per partition: the only records that may show up
    /// unacknowledged.
    sent: HashMap<u32, HashSet<Vec<u8>>>,
}

fn name(i: u64) -> String {
    // 60 bytes: about 90 partitions per 8 KiB batch.
    let n = format!("partition-{i:06}-");
    format!("{n}{}", "y".repeat(60 - n.len()))
}

struct Run {
    seed: u64,
    rng: Rng,
    clock: SimClock,
    handle: SimHandle,
    cfg: LogConfig,
    truth: Truth,
    answers: Answers,
    names: u64,
    /// Cuts that fell between two batches of one checkpoint.
    cuts_inside: u64,
}

impl Run {
    fn fail(&self, cut: u64, what: String) -> String {
        format!(
            "seed {} (NVMQ_SEED={}), cut {cut}: {what}",
            self.seed, self.seed
        )
    }

    fn submit(&mut self, w: &mut Writer<Box<dyn BlockDevice>>, op: Op) {
        let a = self.answers.clone();
        let o = op.clone();
        let ack: nvmq_log::AckFn = Box::new(move |r| a.lock().unwrap().push((o, r)));
        let req = match op {
            Op::Append { partition, payload } => {
                self.truth
                    .sent
                    .entry(partition)
                    .or_default()
                    .insert(payload.clone());
                Request::Append {
                    partition,
                    payload,
                    span: 1,
                    ack,
                }
            }
            Op::Create { name } => {
                self.truth.creating.insert(name.clone());
                Request::CreatePartition {
                    topic: name,
                    index: 0,
                    ack,
                }
            }
            Op::Delete { partition } => {
                self.truth.deleting.insert(partition);
                Request::DeletePartition { partition, ack }
            }
        };
        w.submit(req);
    }

    fn take_answers(&mut self) -> Result<(), String> {
        let answers = std::mem::take(&mut *self.answers.lock().unwrap());
        for (op, r) in answers {
            match (op, r) {
                (Op::Append { partition, payload }, Ok(a)) => {
                    self.truth
                        .sent
                        .get_mut(&partition)
                        .map(|s| s.remove(&payload));
                    let Some(recs) = self.truth.live.get_mut(&partition) else {
                        return Err(format!(
                            "an append to {partition} acknowledged after its delete"
                        ));
                    };
                    let at = a.offset as usize;
                    if at > recs.len() {
                        return Err(format!(
                            "partition {partition}: ack of {at} past {}",
                            recs.len()
                        ));
                    }
                    if at == recs.len() {
                        recs.push(Some(payload));
                    } else if recs[at].as_ref().is_some_and(|p| *p != payload) {
                        return Err(format!(
                            "partition {partition} offset {at} acknowledged twice"
                        ));
                    } else {
                        recs[at] = Some(payload);
                    }
                }
                // Appends racing a delete of their partition are refused.
                (Op::Append { partition, payload }, Err(LogError::UnknownPartition(_))) => {
                    self.truth
                        .sent
                        .get_mut(&partition)
                        .map(|s| s.remove(&payload));
                }
                (Op::Create { name }, Ok(a)) => {
                    self.truth.creating.remove(&name);
                    self.truth.live.insert(a.partition, Vec::new());
                }
                (Op::Delete { partition }, Ok(_)) => {
                    self.truth.deleting.remove(&partition);
                    self.truth.live.remove(&partition);
                    self.truth.deleted.insert(partition);
                }
                (op, Err(e)) => return Err(format!("{op:?} failed: {e}")),
            }
        }
        Ok(())
    }

    /// After a recovery: the log holds what the truth says, and the truth learns the survivors.
    fn verify(&mut self, w: &mut Writer<Box<dyn BlockDevice>>, cut: u64) -> Result<(), String> {
        let shared = w.shared();
        let geo = w.geometry();
        let present: HashMap<u32, (String, u64, u64)> = shared
            .lock()
            .partitions
            .iter()
            .map(|(id, v)| (*id, (v.topic.clone(), v.start_offset, v.durable_end)))
            .collect();
        for id in &self.truth.deleted {
            if present.contains_key(id) {
                return Err(self.fail(cut, format!("deleted partition {id} came back")));
            }
        }
        // A delete cut short either held or did not.
        for id in std::mem::take(&mut self.truth.deleting) {
            if !present.contains_key(&id) {
                self.truth.live.remove(&id);
                self.truth.deleted.insert(id);
            }
        }
        let live: Vec<u32> = self.truth.live.keys().copied().collect();
        for id in live {
            let Some((_, start, end)) = present.get(&id).cloned() else {
                return Err(self.fail(cut, format!("live partition {id} is gone")));
            };
            let known = self.truth.live[&id].len() as u64;
            if end < known {
                return Err(self.fail(
                    cut,
                    format!("partition {id}: end {end} below {known} acknowledged"),
                ));
            }
            let mut at = start;
            while at < end {
                let clock = self.clock.clone();
                let recs = match read_with(&shared, &geo, id, at, 64 << 10, |p, l| {
                    stepped_read(w, &clock, p, l)
                }) {
                    Ok(recs) => recs,
                    // The writer, stepped to serve the reads, wrote a checkpoint and freed the
                    // oldest data for its room meanwhile: go on from the new start.
                    Err(LogError::OffsetOutOfRange { start, .. }) if start > at => {
                        at = start;
                        continue;
                    }
                    Err(e) => {
                        return Err(self.fail(cut, format!("partition {id} read at {at}: {e}")))
                    }
                };
                if recs.is_empty() {
                    return Err(self.fail(cut, format!("partition {id}: empty read at {at}")));
                }
                for r in recs {
                    let t = self.truth.live.get_mut(&id).expect("live");
                    let i = r.offset as usize;
                    if i < t.len() {
                        if t[i].as_ref().is_some_and(|p| *p != r.payload) {
                            return Err(
                                self.fail(cut, format!("partition {id} offset {i}: other bytes"))
                            );
                        }
                    } else if self
                        .truth
                        .sent
                        .get(&id)
                        .is_some_and(|s| s.contains(&r.payload[..]))
                    {
                        while t.len() < i {
                            t.push(None);
                        }
                        t.push(Some(r.payload.to_vec()));
                    } else {
                        return Err(
                            self.fail(cut, format!("partition {id} offset {i}: never sent"))
                        );
                    }
                    at = r.offset + 1;
                }
            }
        }
        // Creates cut short that made it are live now.
        for (id, (topic, _, _)) in &present {
            if !self.truth.live.contains_key(id) && self.truth.creating.remove(topic) {
                self.truth.live.insert(*id, Vec::new());
            }
        }
        self.truth.creating.clear();
        self.truth.sent.clear();
        let extra: Vec<u32> = present
            .keys()
            .filter(|id| !self.truth.live.contains_key(id))
            .copied()
            .collect();
        if !extra.is_empty() {
            return Err(self.fail(cut, format!("partitions {extra:?} nobody created")));
        }
        Ok(())
    }
}

fn run(seed: u64, cuts: u64) -> Result<(u64, u64), String> {
    let mut c = SimConfig::new(seed, 3 << 20);
    c.clock = SimClock::virtual_at_zero();
    c.flush_latency = Latency::Uniform {
        min: Duration::from_micros(50),
        max: Duration::from_micros(400),
    };
    c.write_latency = Latency::Uniform {
        min: Duration::from_micros(5),
        max: Duration::from_micros(60),
    };
    let clock = c.clock.clone();
    let (mut dev, handle) = SimDevice::new(c);
    let mut rng = Rng::new(seed);
    let fmt = FormatOptions {
        window: 64 * KIB,
        max_batch: 8 * KIB as u32,
        log_size: Some(1 << 20),
        format_id: Some(rng.next_u64() | 1),
    };
    nvmq_log::mkfs::format(&mut dev, &fmt).map_err(|e| format!("format: {e}"))?;
    let cfg = LogConfig {
        recovery_lag: 16 * KIB * rng.range(1, 4),
        max_writes_in_flight: rng.range(1, 4) as usize,
        max_flushes_in_flight: rng.range(1, 4) as usize,
        idle_superblock: Duration::from_millis(rng.range(1, 30)),
        scrub_rate: 0,
        tail_cache_bytes: 0,
        ..LogConfig::default()
    };
    let mut r = Run {
        seed,
        rng,
        clock: clock.clone(),
        handle,
        cfg,
        truth: Truth::default(),
        answers: Arc::default(),
        names: 0,
        cuts_inside: 0,
    };
    let mut dev: Box<dyn BlockDevice> = Box::new(dev);
    let mut multi = 0u64;
    for cut in 0..cuts {
        let (mut w, _) =
            recovery::open(dev, r.cfg.clone()).map_err(|e| r.fail(cut, format!("open: {e}")))?;
        w.backfill_with(|w, p, l| stepped_read(w, &clock, p, l));
        r.verify(&mut w, cut)?;
        if cut == 0 {
            // 400 partitions: a checkpoint of five batches and more.
            for _ in 0..400 {
                r.names += 1;
                let n = name(r.names);
                r.submit(&mut w, Op::Create { name: n });
            }
            let answers = r.answers.clone();
            drive(&mut w, &clock, 200_000, |_| {
                answers.lock().unwrap().len() == 400
            });
            r.take_answers().map_err(|e| r.fail(cut, e))?;
        }
        // Load until the cut: right after a random batch of a checkpoint (while its last is
        // still to come), or at a random step.
        let inside = r.rng.chance(0.6);
        let after_parts = r.rng.range(1, 5);
        let steps = if inside { 20_000 } else { r.rng.range(1, 3000) };
        let (mut in_run, mut parts_seen) = (false, 0u64);
        let st0 = w.shared().lock().stats;
        let (mut batches, mut done) = (st0.checkpoint_batches, st0.checkpoints);
        for _ in 0..steps {
            let ids: Vec<u32> = r.truth.live.keys().copied().collect();
            for _ in 0..r.rng.range(0, 4) {
                if ids.is_empty() {
                    break;
                }
                let partition = ids[r.rng.below(ids.len() as u64) as usize];
                if r.truth.deleting.contains(&partition) {
                    continue;
                }
                let mut payload =
                    format!("s{seed} c{cut} p{partition} {}", r.rng.next_u64()).into_bytes();
                payload.resize(payload.len() + r.rng.below(1500) as usize, b'z');
                r.submit(&mut w, Op::Append { partition, payload });
            }
            if r.rng.chance(0.01) && !ids.is_empty() {
                let partition = ids[r.rng.below(ids.len() as u64) as usize];
                if !r.truth.deleting.contains(&partition) {
                    r.submit(&mut w, Op::Delete { partition });
                }
            }
            if r.rng.chance(0.01) {
                r.names += 1;
                let n = name(r.names);
                r.submit(&mut w, Op::Create { name: n });
            }
            if !w.step(now(&clock)) {
                if w.has_io_in_flight() {
                    w.wait_device(Duration::from_micros(r.rng.range(0, 500)));
                } else {
                    clock.advance(Duration::from_micros(r.rng.range(1, 2000)));
                }
            }
            r.take_answers().map_err(|e| r.fail(cut, e))?;
            if w.fatal().is_some() {
                return Err(r.fail(cut, format!("writer stopped: {:?}", w.fatal())));
            }
            // A checkpoint is between its batches when some were written since the last one
            // completed (`checkpoints` counts those whose last batch went out).
            let st = w.shared().lock().stats;
            if st.checkpoint_batches > batches {
                parts_seen += st.checkpoint_batches - batches;
                in_run = st.checkpoints == done;
                if !in_run {
                    multi += u64::from(parts_seen > 1);
                    parts_seen = 0;
                }
            }
            (batches, done) = (st.checkpoint_batches, st.checkpoints);
            if inside && in_run && parts_seen >= after_parts {
                r.cuts_inside += 1;
                break;
            }
        }
        r.handle.power_cut();
        drop(w);
        dev = Box::new(r.handle.power_on());
    }
    // The last cut is checked like the others.
    let (mut w, _) =
        recovery::open(dev, r.cfg.clone()).map_err(|e| r.fail(cuts, format!("open: {e}")))?;
    w.backfill_with(|w, p, l| stepped_read(w, &clock, p, l));
    r.verify(&mut w, cuts)?;
    Ok((r.cuts_inside, multi))
}

fn env_u64(key: &str) -> Option<u64> {
    std::env::var(key).ok().and_then(|v| v.parse().ok())
}

#[test]
fn power_cuts_between_the_batches_of_a_checkpoint() {
    let cuts = env_u64("NVMQ_CUTS").unwrap_or(60);
    let seeds: Vec<u64> = match env_u64("NVMQ_SEED") {
        Some(s) => vec![s],
        None => {
            let fresh = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64);
            vec![1, 2, 3, fresh]
        }
    };
    let (mut inside, mut multi) = (0, 0);
    for seed in seeds {
        let (i, m) = run(seed, cuts).unwrap_or_else(|e| panic!("{e}"));
        inside += i;
        multi += m;
    }
    println!(
        "{inside} cuts between two batches of a checkpoint; {multi} checkpoints of several batches"
    );
    assert!(
        inside >= cuts,
        "only {inside} cuts fell inside a checkpoint"
    );
    assert!(multi >= cuts, "only {multi} checkpoints of several batches");
}
