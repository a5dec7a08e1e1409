//! What the simulator knows about the log (every record acknowledged or served, where it was and
//! when), and the checks of storage.md §7 that hold the recovered log against it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blockdev::sim::{Latency, Rng, SimClock, SimConfig, SimDevice, SimHandle};
use blockdev::BlockDevice;
use nvmq_log::format::{LOG_START, RECORD_HEADER_LEN};
use nvmq_log::{
    read_with, Appended, FlushMode, FormatOptions, LogConfig, LogError, Now, OnFull, Writer,
};

use super::damage::{Damage, Ring};
use super::device::{now, stepped_read, Plan, Shared};
use super::run::{Knobs, Summary};

/// One record at one offset of a partition, as far as the test knows it.
#[derive(Clone, Debug, Default)]
pub struct Known {
    /// None: a record retention freed before the test ever saw it (an unacknowledged survivor).
    pub payload: Option<Vec<u8>>,
    /// Its log position (from its ack or from a read).
    pub position: Option<u64>,
    /// Log positions [start, end) of its batch, when the index showed it.
    pub batch: Option<(u64, u64)>,
    /// Virtual wall-clock ms when the producer sent it.
    pub sent_ms: Option<u64>,
    /// Virtual monotonic ns when its ack came.
    pub acked_ns: Option<u64>,
    /// Served to a reader: it was below D then, so no cut may take it back.
    pub served: bool,
}

/// The last power cut under a running writer.
#[derive(Clone, Copy, Debug, Default)]
pub struct CutState {
    /// D as the writer had published it.
    pub durable: u64,
    /// Virtual time of the last cut that ended a load (acks come only then).
    pub load_cut_ns: u64,
}

pub struct World {
    pub seed: u64,
    pub rng: Rng,
    /// Draws for what came after the regression seeds were recorded (retention by time, relaxed
    /// flush modes, formats over an old log): a stream of their own, so that the main stream, and
    /// with it what every recorded seed does, stays as it was.
    pub extra: Rng,
    pub handle: SimHandle,
    pub clock: SimClock,
    pub log_cfg: LogConfig,
    pub fmt: FormatOptions,
    /// The write unit, and the device's logical block size.
    pub unit: u64,
    pub logical: u64,
    pub capacity: u64,
    pub era: u64,
    /// First era of the current format.
    pub format_era: u64,
    /// Formats done over an old log (topics are named after it).
    pub formats: u64,
    /// Partition ids and, per partition, every record known to be in the log: acknowledged, or
    /// served, or verified by an earlier recovery. Index = offset.
    pub truth: HashMap<u32, Vec<Known>>,
    /// First offset each partition still retains (retention may move it).
    pub starts: HashMap<u32, u64>,
    /// Log position of each partition's creation record, from its ack.
    pub created_at: HashMap<u32, u64>,
    /// Payloads sent since the last recovery, with the virtual wall ms they were sent at
    /// (unacknowledged ones may or may not survive).
    pub sent: HashMap<Vec<u8>, u64>,
    pub acks: Shared<(usize, Result<Appended, LogError>)>,
    pub busy: Vec<Option<u32>>,
    pub pending_payload: HashMap<usize, Vec<u8>>,
    pub seq: u64,
    pub cuts: u64,
    pub fault_injected: bool,
    /// A superblock copy was destroyed at the last cut.
    pub superblock_lost: bool,
    /// The largest D seen in this format: bounds where the log may end (D + W) and what
    /// retention by size may free.
    pub max_durable: u64,
    pub last_cut: CutState,
    pub damage: Damage,
    pub plan: Arc<Mutex<Plan>>,
    pub summary: Summary,
}

pub fn fail(seed: u64, what: String) -> String {
    format!("seed {seed}: {what}")
}

impl World {
    pub fn new(seed: u64, knobs: Knobs) -> (World, SimDevice) {
        let mut rng = Rng::new(seed);
        let mut extra = Rng::new(seed ^ 0x6372_6173_685f_7369);
        let clock = SimClock::virtual_at_zero();
        let logical = if rng.chance(0.3) { 512 } else { 4096 };
        let physical = if logical == 512 && rng.chance(0.5) {
            512
        } else {
            4096
        };
        let u = logical.max(physical) as u64;
        let max_batch = u * rng.range(2, 8);
        let window = max_batch * rng.range(1, 6);
        let log_size = window + 4 * max_batch + u * rng.range(0, 64);
        let mut sim = SimConfig::new(seed, LOG_START + log_size);
        sim.logical_block_size = logical;
        sim.physical_block_size = physical;
        sim.volatile_cache = !rng.chance(0.2);
        sim.garbage_sectors = rng.chance(0.5);
        sim.rmw_damage = rng.chance(0.3);
        sim.serialize_flushes = rng.chance(0.5);
        sim.write_latency = Latency::Uniform {
            min: Duration::from_micros(5),
            max: Duration::from_micros(200),
        };
        sim.flush_latency = Latency::Uniform {
            min: Duration::from_micros(100),
            max: Duration::from_millis(5),
        };
        sim.clock = clock.clone();
        // Half the seeds take linked write+flush pairs (the writer links a batch's flush when
        // it can), the others separate flushes: from the seed, not drawn, so that the
        // regression seeds keep their meaning.
        sim.linked_flush = (seed >> 2).is_multiple_of(2);
        let (dev, handle) = SimDevice::new(sim);
        let on_full = if rng.chance(0.2) {
            OnFull::Refuse
        } else {
            OnFull::DropOldest
        };
        let log_cfg = LogConfig {
            flush: FlushMode::Always,
            on_full,
            retain_bytes: rng.chance(0.3).then_some(log_size / 2),
            retain_time: None,
            recovery_lag: max_batch * rng.range(1, 8),
            queue_capacity: 64,
            max_flushes_in_flight: rng.range(1, 5) as usize,
            max_writes_in_flight: rng.range(1, 4) as usize,
            idle_superblock: Duration::from_millis(rng.range(1, 50)),
            // Not drawn (the regression seeds keep their meaning): `never` runs flush a burst's
            // end once writes pause, as served.
            quiet_flush: LogConfig::default().quiet_flush,
            full_wait: Duration::from_millis(20),
            stall_wait: LogConfig::default().stall_wait,
            // The stepped writer has no thread to spin.
            spin: Duration::ZERO,
            // The stepped writer has no Log threads; scrubbing is tested on the threaded Log.
            scrub_rate: 0,
            // Reads from the tail cache in two runs of three, from the device in the third. Taken
            // from the seed, not drawn, so that the regression seeds keep their meaning.
            tail_cache_bytes: if seed.is_multiple_of(3) {
                0
            } else {
                (max_batch * 4) as usize
            },
        };
        let fmt = FormatOptions {
            window,
            max_batch: max_batch as u32,
            log_size: Some(log_size),
            format_id: Some(rng.next_u64() | 1),
        };
        let producers = rng.range(1, 12) as usize;
        let mut w = World {
            seed,
            rng,
            extra: Rng::new(0),
            handle,
            clock,
            log_cfg,
            fmt,
            unit: u,
            logical: u64::from(logical),
            capacity: LOG_START + log_size,
            era: 0,
            format_era: 0,
            formats: 0,
            truth: HashMap::new(),
            starts: HashMap::new(),
            created_at: HashMap::new(),
            sent: HashMap::new(),
            acks: Arc::new(Mutex::new(Vec::new())),
            busy: vec![None; producers],
            pending_payload: HashMap::new(),
            seq: 0,
            cuts: 0,
            fault_injected: false,
            superblock_lost: false,
            max_durable: 0,
            last_cut: CutState::default(),
            damage: Damage::default(),
            plan: Arc::default(),
            summary: Summary::default(),
        };
        if knobs.retain_time && extra.chance(0.3) {
            // From a few batches' worth of load to most of a run.
            w.log_cfg.retain_time = Some(Duration::from_millis(extra.range(5, 400)));
        }
        if knobs.relaxed {
            w.log_cfg.flush = if extra.chance(0.5) {
                FlushMode::Interval(Duration::from_millis(extra.range(1, 20)))
            } else {
                FlushMode::Never
            };
        }
        w.extra = extra;
        (w, dev)
    }

    pub fn now(&self) -> Now {
        now(&self.clock)
    }

    pub fn log_size(&self) -> u64 {
        self.fmt.log_size.unwrap_or(1)
    }

    pub fn ring(&self) -> Ring {
        Ring {
            log_size: self.log_size(),
            window: self.fmt.window,
            max_batch: u64::from(self.fmt.max_batch),
        }
    }

    /// Topic of the partitions of the current format: a partition of another one was taken from
    /// an old log.
    pub fn topic(&self) -> String {
        if self.formats == 0 {
            "t".into()
        } else {
            format!("t{}", self.formats)
        }
    }

    pub fn relaxed(&self) -> bool {
        self.log_cfg.flush != FlushMode::Always
    }

    pub fn payload(&mut self, producer: usize) -> Vec<u8> {
        self.seq += 1;
        let mut p = format!("s{}e{}p{}q{}:", self.seed, self.era, producer, self.seq).into_bytes();
        let extra = match self.rng.below(10) {
            0 => self.rng.below(3 * u64::from(self.fmt.max_batch) / 4),
            1..=3 => 0,
            _ => self.rng.below(300),
        } as usize;
        let start = p.len();
        p.resize(start + extra, 0);
        self.rng.fill(&mut p[start..]);
        p
    }

    /// Notes the writer's D: the log never ends more than W above the largest D, and retention
    /// by size frees only what lies more than retain_bytes below it.
    pub fn observe<D: BlockDevice>(&mut self, w: &Writer<D>) {
        let d = w.shared().lock().durable;
        self.max_durable = self.max_durable.max(d);
    }

    /// The power is about to be cut under this writer.
    pub fn cutting<D: BlockDevice>(&mut self, w: &Writer<D>, after_load: bool) {
        self.observe(w);
        self.last_cut.durable = w.shared().lock().durable;
        if after_load {
            self.last_cut.load_cut_ns = self.clock.now_nanos();
        }
        // A misdirect armed but not used dies with this writer.
        self.plan.lock().unwrap().misdirect = None;
        self.damage.armed_at = None;
    }

    /// Reads a partition from `from` to its durable end through the writer, checking every record
    /// against what is known; records not yet known must be ones sent this era, and become known.
    /// `recovered`: the cut the recovery just made, when this is the check after it (records
    /// may then be missing at the end, where the rules say they may).
    pub fn verify_partition<D: BlockDevice>(
        &mut self,
        w: &mut Writer<D>,
        id: u32,
        from: u64,
        recovered: Option<u64>,
    ) -> Result<(), String> {
        self.observe(w);
        let shared = w.shared();
        let geo = w.geometry();
        let (start, end) = {
            let s = shared.lock();
            let v = s.partitions.get(&id);
            match v {
                Some(v) => (v.start_offset, v.durable_end),
                // A relaxed mode acknowledges a creation before it is durable (readable).
                None if recovered.is_none() && self.relaxed() => return Ok(()),
                None => return Err(format!("partition {id} is gone")),
            }
        };
        let known = self.truth.get(&id).map_or(0, |t| t.len() as u64);
        if end < known {
            match recovered {
                Some(cut) => self.lost_at_cut(id, end, cut)?,
                // Acknowledged above D: a relaxed mode acks before the flush.
                None if self.relaxed() => {}
                None => {
                    return Err(format!(
                        "partition {id}: durable end {end} is below the {known} records known (acknowledged or served) — lost"
                    ))
                }
            }
        }
        let prev_start = self.starts.get(&id).copied().unwrap_or(0);
        // Losing the newest superblock copy may bring back an older head: the records it
        // retains again are still intact (the ring never overwrites what either copy retains).
        if start < prev_start && !self.superblock_lost {
            return Err(format!(
                "partition {id}: start offset went back from {prev_start} to {start}"
            ));
        }
        if start > prev_start {
            self.check_freed(id, prev_start, start)?;
        }
        self.starts.insert(id, start);
        self.pad_freed(id, start);
        let mut at = from.max(start);
        // After a read error: read one batch at a time, to name the batch that fails.
        let mut narrow = false;
        while at < end {
            let max_bytes = if narrow { 1 } else { 64 << 10 };
            let recs = {
                let clock = &self.clock;
                let mut reads = |pos: u64, len: u64| stepped_read(clock, w, pos, len);
                read_with(&shared, &geo, id, at, max_bytes, &mut reads)
            };
            let recs = match recs {
                Ok(r) => {
                    narrow = false;
                    r
                }
                Err(LogError::OffsetOutOfRange { .. }) => {
                    // Retention moved the head while we read: continue from the new start.
                    let s = shared
                        .lock()
                        .partitions
                        .get(&id)
                        .map_or(end, |v| v.start_offset);
                    if s > at {
                        self.observe(w);
                        let prev = self.starts.get(&id).copied().unwrap_or(0);
                        self.check_freed(id, prev, s)?;
                        self.starts.insert(id, s);
                        self.pad_freed(id, s);
                        at = s;
                        continue;
                    }
                    return Err(format!(
                        "partition {id}: offset {at} out of range below its end {end}"
                    ));
                }
                Err(e) => {
                    // A write the read stepped the writer through may just have been misdirected.
                    self.landed()?;
                    if !self.damage.planted() {
                        return Err(format!("partition {id}: read at {at} failed: {e}"));
                    }
                    if !narrow {
                        narrow = true;
                        continue;
                    }
                    narrow = false;
                    at = self.refused_read(w, id, at, &e)?;
                    // What was skipped is not known (yet): its acks may still come.
                    let t = self.truth.entry(id).or_default();
                    while (t.len() as u64) < at {
                        t.push(Known::default());
                    }
                    continue;
                }
            };
            if recs.is_empty() {
                return Err(format!(
                    "partition {id}: empty read at {at} below durable end {end}"
                ));
            }
            let batches: Vec<Option<(u64, u64)>> = {
                let s = shared.lock();
                let v = s.partitions.get(&id);
                recs.iter()
                    .map(|r| {
                        v.and_then(|v| v.locate(r.offset)).map(|e| {
                            (
                                e.batch_position,
                                e.batch_position + u64::from(e.batch_length),
                            )
                        })
                    })
                    .collect()
            };
            for (r, batch) in recs.into_iter().zip(batches) {
                if r.offset != at {
                    return Err(format!(
                        "partition {id}: expected offset {at}, served {}",
                        r.offset
                    ));
                }
                let sent_ms = self.sent.get(&r.payload[..]).copied();
                let this_format = self.of_this_format(&r.payload);
                let t = self.truth.entry(id).or_default();
                if (r.offset as usize) < t.len() {
                    let k = &mut t[r.offset as usize];
                    match &k.payload {
                        Some(p) if *p != r.payload => {
                            return Err(format!(
                                "partition {id} offset {}: served bytes differ from the acknowledged record",
                                r.offset
                            ))
                        }
                        Some(_) => {}
                        // Freed before it was seen, retained again after the newest superblock
                        // copy was lost: a record of this format all the same.
                        None => {
                            if !this_format {
                                return Err(format!(
                                    "partition {id} offset {}: served a record of another format or run",
                                    r.offset
                                ));
                            }
                            k.payload = Some(r.payload.to_vec());
                        }
                    }
                    k.served = true;
                    k.position = Some(r.position);
                    k.batch = batch.or(k.batch);
                } else if r.offset as usize == t.len() {
                    let Some(sent_ms) = sent_ms else {
                        return Err(format!(
                            "partition {id} offset {}: served a record that was never sent in this era (a cut-away record came back?)",
                            r.offset
                        ));
                    };
                    t.push(Known {
                        payload: Some(r.payload.to_vec()),
                        position: Some(r.position),
                        batch,
                        sent_ms: Some(sent_ms),
                        acked_ns: None,
                        served: true,
                    });
                } else {
                    return Err(format!("partition {id}: gap before offset {}", r.offset));
                }
                at += 1;
            }
        }
        Ok(())
    }

    /// Payloads name the seed and the era they were sent in; eras before the last format belong
    /// to an old log.
    fn of_this_format(&self, payload: &[u8]) -> bool {
        let prefix = format!("s{}e", self.seed);
        let Some(rest) = payload.strip_prefix(prefix.as_bytes()) else {
            return false;
        };
        let digits: String = rest
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .map(|&b| b as char)
            .collect();
        digits
            .parse::<u64>()
            .is_ok_and(|e| e >= self.format_era && e <= self.era)
    }

    /// Records below the start that the test never saw: freed by retention before it could.
    fn pad_freed(&mut self, id: u32, start: u64) {
        let t = self.truth.entry(id).or_default();
        while (t.len() as u64) < start {
            t.push(Known::default());
        }
    }

    /// Records [end, ..) of a partition are gone after a recovery that cut at `cut`: each must be
    /// one the rules let go. Then they are forgotten (their offsets are taken again).
    fn lost_at_cut(&mut self, id: u32, end: u64, cut: u64) -> Result<(), String> {
        let ring = self.ring();
        let t = self.truth.get(&id).cloned().unwrap_or_default();
        for (off, k) in t.iter().enumerate().skip(end as usize) {
            let why = |what: &str| {
                format!(
                    "partition {id}: offset {off} (log position {:?}) lost at the cut (durable end now {end}, recovery cut at {cut}): {what}",
                    k.position
                )
            };
            let Some(pos) = k.position else {
                continue;
            };
            let guess = (pos.saturating_sub(ring.max_batch - 1), pos + ring.max_batch);
            let (b0, b1) = k.batch.unwrap_or(guess);
            if self.damage.batch_lost(&ring, b0, b1)
                || (pos >= cut && self.damage.cut_at_misdirect(&ring, cut))
            {
                self.summary.exempt_lost += 1;
                continue;
            }
            if k.served {
                return Err(why("it was served before the cut"));
            }
            let Some(acked_ns) = k.acked_ns else {
                continue;
            };
            let d = self.last_cut.durable;
            match self.log_cfg.flush {
                FlushMode::Always => return Err(why("it was acknowledged")),
                _ if pos < d => {
                    return Err(why(&format!(
                        "it was acknowledged and below D = {d} when the power went"
                    )))
                }
                mode => {
                    // What the mode states at start: at most W bytes, at most the interval.
                    let len =
                        RECORD_HEADER_LEN as u64 + k.payload.as_ref().map_or(0, |p| p.len() as u64);
                    let over = pos + len - d;
                    if over > self.fmt.window {
                        return Err(why(&format!(
                            "it ended {over} B above D = {d}, more than the window of {} B that `{}` states",
                            self.fmt.window,
                            mode.loss_window(self.fmt.window).unwrap_or_default()
                        )));
                    }
                    let age = self.last_cut.load_cut_ns.saturating_sub(acked_ns);
                    if let FlushMode::Interval(i) = mode {
                        if age > interval_bound(i, &self.log_cfg).as_nanos() as u64 {
                            return Err(why(&format!(
                                "it was acknowledged {:.3} ms before the cut, more than `{}` allows ({:.3} ms with the flush itself)",
                                age as f64 / 1e6,
                                mode.loss_window(self.fmt.window).unwrap_or_default(),
                                interval_bound(i, &self.log_cfg).as_secs_f64() * 1e3,
                            )));
                        }
                        let past = age.saturating_sub(i.as_nanos() as u64);
                        self.summary.loss_past_interval_ns =
                            self.summary.loss_past_interval_ns.max(past);
                    }
                    self.summary.relaxed_lost += 1;
                    self.summary.max_lost_bytes = self.summary.max_lost_bytes.max(over);
                }
            }
        }
        if let Some(t) = self.truth.get_mut(&id) {
            t.truncate(end as usize);
        }
        Ok(())
    }

    /// A partition the recovered log does not hold: only a relaxed mode may lose one, when its
    /// creation was acknowledged but not durable, and then with every record of it.
    pub fn partition_lost(&mut self, id: u32, cut: u64) -> Result<(), String> {
        let d = self.last_cut.durable;
        match self.created_at.get(&id) {
            Some(&at) if self.relaxed() && at >= d => {}
            at => {
                return Err(format!(
                    "partition {id} (created at log position {at:?}, D was {d} at the cut) vanished"
                ))
            }
        }
        self.lost_at_cut(id, 0, cut)?;
        self.truth.remove(&id);
        self.starts.remove(&id);
        self.created_at.remove(&id);
        Ok(())
    }

    pub fn take_acks<D: BlockDevice>(&mut self, w: &Writer<D>) -> Result<(), String> {
        let acks: Vec<_> = std::mem::take(&mut *self.acks.lock().unwrap());
        let shared = w.shared();
        let now_ns = self.clock.now_nanos();
        for (producer, r) in acks {
            let Some(partition) = self.busy[producer].take() else {
                return Err(format!("producer {producer} acknowledged twice"));
            };
            match r {
                Ok(a) => {
                    if a.partition != partition {
                        return Err(format!(
                            "ack for partition {} instead of {partition}",
                            a.partition
                        ));
                    }
                    // The index has the batch once it is durable (at the ack, in the default
                    // mode), unless retention dropped it at once.
                    let batch = shared
                        .lock()
                        .partitions
                        .get(&partition)
                        .and_then(|v| v.locate(a.offset))
                        .map(|e| {
                            (
                                e.batch_position,
                                e.batch_position + u64::from(e.batch_length),
                            )
                        });
                    let t = self.truth.entry(partition).or_default();
                    if (a.offset as usize) > t.len() {
                        return Err(format!(
                            "partition {partition}: ack of offset {} skips past {} (acks out of order)",
                            a.offset,
                            t.len()
                        ));
                    }
                    // The payload is recorded by `send`, matched here by the pending map.
                    let Some(p) = self.pending_payload.remove(&producer) else {
                        return Err("ack without a pending payload".into());
                    };
                    let sent_ms = self.sent.get(&p).copied();
                    if (a.offset as usize) < t.len() {
                        let k = &mut t[a.offset as usize];
                        if k.payload.as_ref().is_some_and(|q| *q != p) {
                            return Err(format!(
                                "partition {partition}: offset {} acknowledged for two payloads",
                                a.offset
                            ));
                        }
                        k.acked_ns = Some(now_ns);
                        k.position = Some(a.position);
                        k.batch = batch.or(k.batch);
                        // Skipped by a refused read before its ack came.
                        if k.payload.is_none() {
                            k.payload = Some(p);
                            k.sent_ms = sent_ms;
                        }
                    } else {
                        t.push(Known {
                            payload: Some(p),
                            position: Some(a.position),
                            batch,
                            sent_ms,
                            acked_ns: Some(now_ns),
                            served: false,
                        });
                    }
                }
                // The writer stops when a fault strikes, or when the power goes under it (a cut at
                // the n-th submission after recovery lands during the load): nothing more is
                // acknowledged, and what was is checked after the recovery.
                Err(LogError::WriterStopped(_)) if self.fault_injected || self.handle.is_off() => {
                    self.pending_payload.remove(&producer);
                }
                Err(LogError::LogFull { .. }) if self.log_cfg.on_full == OnFull::Refuse => {
                    self.pending_payload.remove(&producer);
                }
                Err(e) => return Err(format!("append failed unexpectedly: {e}")),
            }
        }
        Ok(())
    }

    /// Known records that are acknowledged or served, with their batch, as (partition, offset,
    /// record position, batch start, batch end), sorted.
    pub fn located(&self) -> Vec<(u32, u64, u64, u64, u64)> {
        let mut v: Vec<_> = self
            .truth
            .iter()
            .flat_map(|(id, t)| {
                t.iter().enumerate().filter_map(move |(off, k)| {
                    let (p, (b0, b1)) = (k.position?, k.batch?);
                    k.payload.as_ref()?;
                    (k.served || k.acked_ns.is_some()).then_some((*id, off as u64, p, b0, b1))
                })
            })
            .collect();
        v.sort_unstable();
        v
    }
}

/// How long before a cut `flush = interval:<i>` may have acknowledged what the cut takes: the
/// flush that covers a write is submitted at most `i` after the previous one, but when every flush
/// slot is taken it first waits for the oldest (at most the sim's 5 ms), and then takes its own
/// latency, behind the others when the device serializes flushes (5 ms each); plus the test's own
/// steps of up to 3 ms, once before the flush is submitted and once before its completion is
/// taken in.
pub fn interval_bound(i: Duration, cfg: &LogConfig) -> Duration {
    let flush = Duration::from_millis(5);
    i + flush * (cfg.max_flushes_in_flight as u32 + 1) + Duration::from_millis(6)
}

/// The log position named in an error text ("... at log position N: ...").
pub fn position_in(what: &str) -> Option<u64> {
    let rest = &what[what.find("at log position ")? + "at log position ".len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}
