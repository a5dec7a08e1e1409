//! One seed's run: cycles of open (recovery), the checks of storage.md §7, load, and a power cut;
//! with the knobs' faults, damage and formats woven in.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use blockdev::sim::SimDevice;
use blockdev::BlockDevice;
use nvmq_log::format::{superblock_offset, Superblock, LOG_START, SUPERBLOCK_LEN};
use nvmq_log::mkfs::format;
use nvmq_log::{Ack, Appended, LogError, Request, TokenAck, Writer};
use recovery::RecoveryError;

use super::damage::Damage;
use super::device::{debug, drive, stepped_read, Plan, SimDev};
use super::world::{fail, position_in, CutState, World};

type Dev = Box<dyn BlockDevice>;

const PARTITIONS: u32 = 3;

/// What a campaign adds to the power cuts. All false: cuts alone, with the retention by size and
/// the on-full policy each seed draws.
#[derive(Clone, Copy, Debug, Default)]
pub struct Knobs {
    /// Write and flush errors, including flushes failing out of order.
    pub faults: bool,
    /// At the end of the run, a bit flipped in acknowledged data: the open must refuse it.
    pub bitrot: bool,
    /// Retention by time on some seeds.
    pub retain_time: bool,
    /// Misdirected batch writes while the writer runs, and latent read errors, both while it
    /// runs and in acknowledged data across a cut.
    pub damage: bool,
    /// `flush = interval:<ms>` or `never` instead of `always`.
    pub relaxed: bool,
    /// Format over the old log once it has wrapped twice (up to three times a seed), on half of
    /// them with another geometry.
    pub reformat: bool,
}

/// Outcome of one seed's run (or, added up, of a campaign).
#[derive(Debug, Default, Clone)]
pub struct Summary {
    pub cuts: u64,
    pub acked: u64,
    /// Bit rot refused by the open or reported by the index rebuild.
    pub refused_damage: u64,
    /// Batches written with a linked flush.
    pub linked: u64,
    /// Batch writes that landed elsewhere.
    pub misdirects: u64,
    /// Opens refused naming planted damage (misdirects, latent read errors).
    pub damage_refusals: u64,
    /// Reads (or index rebuilds) that refused planted damage, naming it.
    pub damage_reported: u64,
    pub latent_planted: u64,
    /// Reads that met a read error planted while the writer ran, and failed.
    pub read_errors_seen: u64,
    /// Acknowledged records a misdirect destroyed (excused by the checks).
    pub exempt_lost: u64,
    /// Formats over an old log.
    pub formats: u64,
    /// Acknowledged records a relaxed flush mode lost at a cut, within its stated window.
    pub relaxed_lost: u64,
    pub max_lost_bytes: u64,
    /// How far past `interval:<ms>` the oldest lost ack was (the flush's own latency).
    pub loss_past_interval_ns: u64,
    /// Moves of a partition's start checked against the retention rules.
    pub freed_checked: u64,
}

impl Summary {
    pub fn add(&mut self, o: &Summary) {
        self.cuts += o.cuts;
        self.acked += o.acked;
        self.refused_damage += o.refused_damage;
        self.linked += o.linked;
        self.misdirects += o.misdirects;
        self.damage_refusals += o.damage_refusals;
        self.damage_reported += o.damage_reported;
        self.latent_planted += o.latent_planted;
        self.read_errors_seen += o.read_errors_seen;
        self.exempt_lost += o.exempt_lost;
        self.formats += o.formats;
        self.relaxed_lost += o.relaxed_lost;
        self.max_lost_bytes = self.max_lost_bytes.max(o.max_lost_bytes);
        self.loss_past_interval_ns = self.loss_past_interval_ns.max(o.loss_past_interval_ns);
        self.freed_checked += o.freed_checked;
    }
}

fn open_dev(w: &mut World, dev: SimDevice) -> Dev {
    // Cut at a random submission: during recovery, or early in the load after it.
    let cut_after = w.rng.chance(0.08).then(|| w.rng.range(1, 12));
    Box::new(SimDev {
        inner: dev,
        handle: w.handle.clone(),
        cut_after,
        plan: w.plan.clone(),
        log_size: w.log_size(),
        unit: w.unit,
    })
}

/// Moves the writer's token acks (the producer's index is the token) to where the callbacks put
/// theirs.
fn collect_tokens<D: BlockDevice>(
    w: &mut Writer<D>,
    acks: &Mutex<Vec<(usize, Result<Appended, LogError>)>>,
    buf: &mut Vec<TokenAck>,
) {
    w.drain_acks(buf);
    acks.lock()
        .unwrap()
        .extend(buf.drain(..).map(|(t, r)| (t as usize, r)));
}

/// Runs `cuts` power-cut cycles for one seed.
pub fn run(seed: u64, cuts: u64, knobs: Knobs) -> Result<Summary, String> {
    // Appends answered with tokens in half the seeds, with callbacks in the others: taken from
    // the seed, not drawn, so that the regression seeds keep their meaning.
    let tokens = (seed >> 1).is_multiple_of(2);
    let mut token_acks = Vec::new();
    let (mut world, mut dev) = World::new(seed, knobs);
    format(&mut dev, &world.fmt).map_err(|e| fail(seed, format!("format: {e}")))?;
    let mut created = false;
    while world.cuts < cuts {
        if debug() {
            for slot in 0..2u8 {
                let b = world.handle.peek(superblock_offset(slot), SUPERBLOCK_LEN);
                match Superblock::decode(&b, slot) {
                    Ok(sb) => eprintln!(
                        "  sb {slot}: seq {} epoch {} start {} dt {} rp {} head {}",
                        sb.sequence,
                        sb.epoch,
                        sb.epoch_start,
                        sb.durable_through,
                        sb.recovery_point,
                        sb.head
                    ),
                    Err(e) => eprintln!("  sb {slot}: {e}"),
                }
            }
        }
        if knobs.reformat && world.formats < 3 && world.max_durable >= 2 * world.log_size() {
            // The old log has wrapped twice: format over it, and go on with the new one.
            dev = world.reformat(true).map_err(|e| fail(seed, e))?;
            created = false;
            continue;
        }
        let boxed = open_dev(&mut world, dev);
        let (mut w, report) = match recovery::open(boxed, world.log_cfg.clone()) {
            Ok((mut w, report)) => {
                let clock = world.clock.clone();
                w.backfill_with(|w, p, l| stepped_read(&clock, w, p, l));
                if debug() {
                    let parts: Vec<_> = w
                        .shared()
                        .lock()
                        .partitions
                        .iter()
                        .map(|(k, v)| (*k, v.start_offset, v.durable_end))
                        .collect();
                    let known: Vec<_> = world.truth.iter().map(|(k, t)| (*k, t.len())).collect();
                    eprintln!(
                        "cut {}: {report}\n  partitions {parts:?} known {known:?}",
                        world.cuts
                    );
                }
                (w, report)
            }
            Err(_) if world.handle.is_off() => {
                // The power went during recovery; nothing was accepted, so nothing to check yet.
                world.cuts += 1;
                dev = world.handle.power_on();
                continue;
            }
            Err(RecoveryError::Device { .. } | RecoveryError::Log(LogError::Device { .. }))
                if world.fault_injected =>
            {
                // A fault armed before the cut struck recovery's own I/O: refusing to start is
                // right (a failed flush is never retried). The operator power-cycles.
                world.fault_injected = false;
                world.handle.power_cut();
                world.cuts += 1;
                dev = world.handle.power_on();
                continue;
            }
            Err(RecoveryError::Damage { position, what }) if world.damage.planted() => {
                // Refused, naming the planted damage: right (nothing acknowledged is cut).
                if !world.damage.names(&world.ring(), position) {
                    return Err(fail(
                        seed,
                        format!(
                            "cut {}: open refused naming log position {position}, where no damage was planted: {what}",
                            world.cuts
                        ),
                    ));
                }
                world.summary.damage_refusals += 1;
                let (d, formatted) = world.after_damage(position).map_err(|e| fail(seed, e))?;
                dev = d;
                created &= !formatted;
                continue;
            }
            Err(e) => return Err(fail(seed, format!("cut {}: open failed: {e}", world.cuts))),
        };
        // The power went (or an armed fault struck) during the index rebuild: cut again.
        let mut cut_while_checking =
            world.handle.is_off() || (world.fault_injected && w.fatal().is_some());
        if !cut_while_checking {
            world
                .opened(&report)
                .map_err(|e| fail(seed, format!("cut {}: {e}", world.cuts)))?;
            let backfill_error = w.shared().lock().backfill_error.clone();
            let ring = world.ring();
            let named =
                backfill_error.and_then(|what| position_in(&what).map(|p| (p, what.clone())));
            if let Some((position, _)) = named.filter(|(p, _)| world.damage.names(&ring, *p)) {
                // The rebuild of the index below the recovery point found the planted damage and
                // refuses all of that region to readers: as good as a refused open.
                world.summary.damage_reported += 1;
                world.cutting(&w, false);
                world.handle.power_cut();
                drop(w);
                let (d, formatted) = world.after_damage(position).map_err(|e| fail(seed, e))?;
                dev = d;
                created &= !formatted;
                continue;
            }
            if let Some(l) = world.damage.latent {
                return Err(fail(
                    seed,
                    format!(
                        "cut {}: a read error in acknowledged data at log position {} was neither refused by the open nor reported",
                        world.cuts, l.position
                    ),
                ));
            }
            let topic = world.topic();
            for (id, v) in &w.shared().lock().partitions {
                if v.topic != topic {
                    return Err(fail(
                        seed,
                        format!(
                            "cut {}: partition {id} of topic {:?} is not of this format (topic {topic:?}): taken from the old log",
                            world.cuts, v.topic
                        ),
                    ));
                }
            }
        }
        // §7: everything known is there, byte for byte; survivors are records sent this era.
        let mut ids: Vec<u32> = w.shared().lock().partitions.keys().copied().collect();
        ids.sort_unstable();
        for id in &ids {
            if cut_while_checking {
                break;
            }
            if let Err(e) = world.verify_partition(&mut w, *id, 0, Some(report.cut_at)) {
                if world.handle.is_off() || (world.fault_injected && w.fatal().is_some()) {
                    cut_while_checking = true;
                    break;
                }
                return Err(fail(seed, format!("after cut {}: {e}", world.cuts)));
            }
        }
        if cut_while_checking {
            world.cutting(&w, false);
            world.handle.power_cut();
            drop(w);
            world.cuts += 1;
            world.fault_injected = false;
            dev = world.handle.power_on();
            continue;
        }
        let mut vanished: Vec<u32> = world
            .truth
            .keys()
            .filter(|id| !ids.contains(id))
            .copied()
            .collect();
        vanished.sort_unstable();
        for id in vanished {
            world
                .partition_lost(id, report.cut_at)
                .map_err(|e| fail(seed, format!("after cut {}: {e}", world.cuts)))?;
            created = false;
        }
        world.era += 1;
        world.sent.clear();
        world.pending_payload.clear();
        world.busy.iter_mut().for_each(|b| *b = None);
        world.superblock_lost = false;

        if !created {
            // The partitions of this format that the log does not hold yet (a relaxed flush mode
            // may lose an acknowledged creation at a cut).
            let topic = world.topic();
            let wanted: Vec<u32> = {
                let shared = w.shared();
                let s = shared.lock();
                (0..PARTITIONS)
                    .filter(|i| {
                        !s.partitions
                            .values()
                            .any(|v| v.topic == topic && v.index == *i)
                    })
                    .collect()
            };
            let done: Arc<Mutex<Vec<Result<Appended, LogError>>>> = Arc::default();
            for &i in &wanted {
                let d = done.clone();
                w.submit(Request::CreatePartition {
                    topic: world.topic(),
                    index: i,
                    ack: Box::new(move |r| d.lock().unwrap().push(r)),
                });
            }
            drive(&world.clock, &mut w, |_| {
                done.lock().unwrap().len() == wanted.len()
            });
            if w.fatal().is_none() {
                for r in done.lock().unwrap().iter() {
                    match r {
                        Ok(a) => {
                            world.truth.entry(a.partition).or_default();
                            world.created_at.insert(a.partition, a.position);
                        }
                        Err(e) => return Err(fail(seed, format!("create partition: {e}"))),
                    }
                }
                created = world.truth.len() == PARTITIONS as usize;
            }
        }

        // Load, for a random while (zero steps: a cut right after recovery).
        let steps = match world.rng.below(8) {
            0 => 0,
            1 => world.rng.range(1, 20),
            _ => world.rng.range(20, 600),
        };
        // When this load misdirects a batch write, and when it plants a read error.
        let (misdirect_at, read_error_at) = if knobs.damage && steps > 0 {
            let m = world.rng.chance(0.3).then(|| world.rng.below(steps));
            let r = world.rng.chance(0.3).then(|| world.rng.below(steps));
            (m, r)
        } else {
            (None, None)
        };
        let mut ids: Vec<u32> = world.truth.keys().copied().collect();
        ids.sort_unstable();
        for step in 0..steps {
            if w.fatal().is_some() {
                break;
            }
            for producer in 0..world.busy.len() {
                if world.busy[producer].is_none() && !ids.is_empty() && world.rng.chance(0.5) {
                    let partition = ids[world.rng.below(ids.len() as u64) as usize];
                    let payload = world.payload(producer);
                    world.sent.insert(payload.clone(), world.now().wall_ms);
                    world.pending_payload.insert(producer, payload.clone());
                    world.busy[producer] = Some(partition);
                    if tokens {
                        // As an event loop hosting the writer appends: a token, collected
                        // after the step.
                        w.append(partition, payload.into(), 1, Ack::Token(producer as u64));
                    } else {
                        let acks = world.acks.clone();
                        w.submit(Request::Append {
                            partition,
                            payload,
                            span: 1,
                            ack: Box::new(move |r| acks.lock().unwrap().push((producer, r))),
                        });
                    }
                }
            }
            if knobs.faults && !world.fault_injected && world.rng.chance(0.02) {
                world.fault_injected = true;
                if debug() {
                    eprintln!(
                        "cut {}: fault armed at D={}",
                        world.cuts,
                        w.shared().lock().durable
                    );
                }
                match world.rng.below(3) {
                    0 => world.handle.fail_next_flush(),
                    1 => world.handle.fail_next_write(),
                    _ => world.handle.fail_flush_out_of_order(),
                }
            }
            if misdirect_at == Some(step) {
                world.arm_misdirect(&w);
            }
            if read_error_at == Some(step) {
                if let Err(e) = world.read_error_while_running(&mut w) {
                    if w.fatal().is_none() && !world.handle.is_off() {
                        return Err(fail(seed, format!("read error during load: {e}")));
                    }
                }
            }
            if !ids.is_empty() && world.rng.chance(0.03) {
                let id = ids[world.rng.below(ids.len() as u64) as usize];
                let known = world.truth.get(&id).map_or(0, |t| t.len() as u64);
                let from = world.rng.below(known + 1);
                if let Err(e) = world.verify_partition(&mut w, id, from, None) {
                    if w.fatal().is_none() && !world.handle.is_off() {
                        return Err(fail(seed, format!("read during load: {e}")));
                    }
                }
            }
            let now = world.now();
            if !w.step(now) {
                if w.has_io_in_flight() {
                    w.wait_device(Duration::from_millis(world.rng.range(0, 3)));
                } else {
                    world
                        .clock
                        .advance(Duration::from_micros(world.rng.range(1, 3000)));
                }
            }
            collect_tokens(&mut w, &world.acks, &mut token_acks);
            world.take_acks(&w).map_err(|e| fail(seed, e))?;
            world.landed().map_err(|e| fail(seed, e))?;
            if world.handle.is_off() {
                break;
            }
        }
        collect_tokens(&mut w, &world.acks, &mut token_acks);
        world.take_acks(&w).map_err(|e| fail(seed, e))?;
        world.landed().map_err(|e| fail(seed, e))?;
        if debug() {
            eprintln!(
                "cut {}: cutting with D={} fatal={:?}",
                world.cuts,
                w.shared().lock().durable,
                w.fatal()
            );
        }
        if let Some(e) = w.fatal() {
            let expected = world.fault_injected || world.handle.is_off();
            if !expected {
                return Err(fail(seed, format!("writer stopped without a fault: {e}")));
            }
            world.fault_injected = false;
        }

        // The cut.
        world.cutting(&w, true);
        world.handle.power_cut();
        drop(w);
        world.cuts += 1;
        if world.rng.chance(0.1) {
            // Loss of one superblock copy (either one, newest or not) while the other is intact:
            // with both gone nothing can be recovered, by design.
            let slot = world.rng.below(2) as u8;
            let other = world
                .handle
                .peek(superblock_offset(1 - slot), SUPERBLOCK_LEN);
            if Superblock::decode(&other, 1 - slot).is_ok() {
                world
                    .handle
                    .poke_durable(superblock_offset(slot), &[0u8; 4096]);
                world.superblock_lost = true;
            }
        }
        if knobs.damage && world.rng.chance(0.2) {
            world.plant_latent();
        }
        dev = world.handle.power_on();
    }
    world.summary.cuts = world.cuts;
    world.summary.linked = world.handle.stats().linked_flushes;
    world.summary.acked = world
        .truth
        .values()
        .map(|t| t.iter().filter(|k| k.acked_ns.is_some()).count() as u64)
        .sum();

    if knobs.bitrot {
        bit_rot(&mut world, dev)?;
    }
    Ok(world.summary)
}

/// Settles (an idle writer records D in its superblock), then rots one acknowledged record: the
/// open must refuse it, or the index rebuild below the recovery point report it.
fn bit_rot(world: &mut World, dev: SimDevice) -> Result<(), String> {
    let seed = world.seed;
    let mut dev = Some(dev);
    let mut opened = None;
    for _ in 0..4 {
        let d = dev.take().unwrap_or_else(|| world.handle.power_on());
        match recovery::open(Box::new(d) as Dev, world.log_cfg.clone()) {
            Ok((mut w, _)) => {
                let clock = world.clock.clone();
                w.backfill_with(|w, p, l| stepped_read(&clock, w, p, l));
                opened = Some(w);
                break;
            }
            // An armed fault may strike recovery itself; power-cycle as an operator would.
            Err(_) if world.fault_injected => {
                world.handle.power_cut();
            }
            Err(e) => return Err(fail(seed, format!("open before bit rot: {e}"))),
        };
    }
    let Some(mut w) = opened else {
        return Err(fail(seed, "could not open before bit rot".into()));
    };
    let idle = world.log_cfg.idle_superblock;
    // Drain, let the idle superblock update run, drain again.
    drive(&world.clock, &mut w, |w| w.is_idle());
    world.clock.advance(idle * 2);
    let _ = w.step(world.now());
    drive(&world.clock, &mut w, |w| w.is_idle());
    let w_idle = w.is_idle();
    let shared = w.shared();
    let mut candidates: Vec<(u32, u64, u64)> = {
        let s = shared.lock();
        world
            .truth
            .iter()
            .flat_map(|(id, t)| {
                t.iter().enumerate().filter_map(move |(off, k)| {
                    k.acked_ns?;
                    Some((*id, off as u64, k.position?))
                })
            })
            .filter(|(id, off, _)| s.partitions.get(id).is_some_and(|v| *off >= v.start_offset))
            .collect()
    };
    candidates.sort();
    world.handle.power_cut();
    drop(w);
    if w_idle && !candidates.is_empty() {
        let (id, off, pos) = candidates[world.rng.below(candidates.len() as u64) as usize];
        let len = world.truth[&id][off as usize]
            .payload
            .as_ref()
            .map_or(0, |p| p.len() as u64)
            + 40;
        let byte = LOG_START + (pos + world.rng.below(len)) % world.log_size();
        world.handle.flip_bit(byte, world.rng.below(8) as u8);
        let dev = world.handle.power_on();
        match recovery::open(Box::new(dev) as Dev, world.log_cfg.clone()) {
            Err(RecoveryError::Damage { .. }) => world.summary.refused_damage += 1,
            Err(e) => {
                return Err(fail(
                    seed,
                    format!("bit rot at {byte} (partition {id} offset {off}): wrong error {e}"),
                ))
            }
            // Below the recovery point, the background index rebuild finds it instead.
            Ok((mut w, _)) => {
                let clock = world.clock.clone();
                w.backfill_with(|w, p, l| stepped_read(&clock, w, p, l));
                if w.shared().lock().backfill_error.is_some() {
                    world.summary.refused_damage += 1;
                } else {
                    return Err(fail(
                        seed,
                        format!(
                            "bit rot at {byte} (partition {id} offset {off}) was neither refused nor reported"
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

impl World {
    /// What every open must have done: the cut keeps everything its superblock names durable,
    /// and lies no further than this format ever wrote (D + W): nothing of an old log or a
    /// cut-away tail beyond it was taken into the chain.
    fn opened(&mut self, report: &recovery::RecoveryReport) -> Result<(), String> {
        let sb = &report.chosen;
        if report.cut_at < sb.durable_through {
            return Err(format!(
                "recovery cut at {} below the durable through {} its superblock names",
                report.cut_at, sb.durable_through
            ));
        }
        let bound = self.max_durable + sb.window;
        if report.cut_at > bound {
            return Err(format!(
                "recovery kept the log up to {}, past anything this format wrote (D reached {}, window {}): {report}",
                report.cut_at, self.max_durable, sb.window
            ));
        }
        Ok(())
    }

    /// Formats over the log on the device (`new_geometry`: on half the calls with another write
    /// window, batch size and log size), and starts knowing nothing again.
    pub(super) fn reformat(&mut self, new_geometry: bool) -> Result<SimDevice, String> {
        self.handle.power_cut();
        self.handle.clear_read_errors();
        let mut dev = self.handle.power_on();
        if new_geometry && self.extra.chance(0.5) {
            let u = self.unit;
            let room = (self.capacity - LOG_START) / u * u;
            let mb = u * self.extra.range(2, 8);
            let window = mb * self.extra.range(1, 6);
            let min = window + 4 * mb;
            if min <= room {
                let log_size = (min + u * self.extra.range(0, 64)).min(room);
                let lag_batches = self.log_cfg.recovery_lag / u64::from(self.fmt.max_batch);
                self.log_cfg.recovery_lag = mb * lag_batches.max(1);
                self.log_cfg.retain_bytes = self.log_cfg.retain_bytes.map(|_| log_size / 2);
                self.fmt.window = window;
                self.fmt.max_batch = mb as u32;
                self.fmt.log_size = Some(log_size);
            }
        }
        self.fmt.format_id = Some(self.extra.next_u64() | 1);
        format(&mut dev, &self.fmt).map_err(|e| format!("format over the old log: {e}"))?;
        if debug() {
            eprintln!(
                "cut {}: formatted over the old log: {:?}",
                self.cuts, self.fmt
            );
        }
        self.cuts += 1;
        self.formats += 1;
        self.summary.formats += 1;
        // The next era's payloads are the first of the new format (the era moves on once the
        // open after this is checked).
        self.format_era = self.era + 1;
        self.truth.clear();
        self.starts.clear();
        self.created_at.clear();
        self.sent.clear();
        self.damage = Damage::default();
        *self.plan.lock().unwrap() = Plan::default();
        self.max_durable = 0;
        self.last_cut = CutState::default();
        self.superblock_lost = false;
        Ok(dev)
    }
}
