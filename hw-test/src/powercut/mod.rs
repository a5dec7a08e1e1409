//! The power-cut rig: a controller that loads a broker over the Kafka protocol with acks=all,
//! writes every acknowledgement to a ledger on its own disk before counting it, cuts the broker's
//! power through a [`PowerSwitch`], waits for it to come back and checks every acknowledged
//! record, bit for bit, over the same protocol (diskchecker.pl's pattern: the truth about what was
//! acknowledged lives where the power is never cut).
//!
//! The same controller runs against a real rig (`nvmq-rig`, a [`CommandSwitch`]), against a
//! broker in this process on the sim device ([`inproc::SimBroker`]), and against the QEMU rig
//! (a `CommandSwitch` whose commands drive QEMU and the NBD crash-model server).

pub mod inproc;
pub mod ledger;
pub mod load;
pub mod payload;
pub mod report;
pub mod resume;
pub mod switch;
pub mod verify;
pub mod wire;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blockdev::sim::Rng;
use tokio::sync::watch;

pub use report::{CycleKind, CycleReport, Resumed, RunReport, Totals};
pub use switch::{CommandSwitch, PowerSwitch};

use ledger::{CycleCut, CycleStart, Header, Ledger};
use load::{Batch, LoadCtx};

#[derive(Debug, thiserror::Error)]
pub enum RigError {
    #[error("{op} {addr}: {source}")]
    Net {
        op: &'static str,
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{op}: {what}")]
    Protocol { op: &'static str, what: String },
    #[error("{what} `{cmd}`: {detail}")]
    Command {
        what: &'static str,
        cmd: String,
        detail: String,
    },
    #[error("ledger: {0}")]
    Ledger(String),
    #[error("the broker at {addr} did not come back within {after:?} of the cut (cycle {cycle}): {last}")]
    NotUp {
        addr: String,
        cycle: u32,
        after: Duration,
        last: String,
    },
    #[error("bad option {option}: {what}")]
    Option { option: &'static str, what: String },
    #[error("in-process broker: {0}")]
    InProcess(String),
}

impl From<ledger::LedgerError> for RigError {
    fn from(e: ledger::LedgerError) -> Self {
        RigError::Ledger(e.to_string())
    }
}

/// What the controller does; the switch is passed separately.
#[derive(Debug, Clone)]
pub struct RigOptions {
    /// host:port of the broker.
    pub broker: String,
    /// Topic the run writes (created with `partitions`; an existing one must have as many).
    pub topic: String,
    pub partitions: i32,
    pub producers: u32,
    /// Records per produce request.
    pub batch: u32,
    /// Produce requests each producer keeps unanswered at once.
    pub in_flight: usize,
    /// Bounds of the random body length of a record.
    pub body_len: (usize, usize),
    pub cycles: u32,
    pub seed: u64,
    /// The cut comes this long after the load started, uniformly between the two (from the seed).
    pub cut_after: (Duration, Duration),
    /// After the cut, how long answers still in flight are waited for.
    pub drain: Duration,
    pub up_timeout: Duration,
    pub poll_interval: Duration,
    pub request_timeout: Duration,
    /// The ledger file (on the controller's own disk); must not exist yet, unless `resume`.
    pub ledger: PathBuf,
    /// Go on with the run in the existing `ledger`: check every ack on it first, then run
    /// `cycles` more, numbered on, appending to it. Topic, partitions and body lengths must be
    /// the ledger's; the records keep the ledger's run key (the seed only draws the cut moments).
    pub resume: bool,
    /// Resend each cycle's unacknowledged records in the next one (as a Kafka producer retries),
    /// which is what makes duplicates possible.
    pub resend_unacked: bool,
}

impl RigOptions {
    /// Options with working defaults for everything but where to connect and write.
    pub fn new(broker: impl Into<String>, topic: impl Into<String>, ledger: PathBuf) -> RigOptions {
        RigOptions {
            broker: broker.into(),
            topic: topic.into(),
            partitions: 2,
            producers: 4,
            batch: 4,
            in_flight: 4,
            body_len: (16, 1024),
            cycles: 20,
            seed: 1,
            cut_after: (Duration::from_millis(200), Duration::from_millis(2000)),
            drain: Duration::from_secs(2),
            up_timeout: Duration::from_secs(300),
            poll_interval: Duration::from_millis(20),
            request_timeout: Duration::from_secs(10),
            ledger,
            resume: false,
            resend_unacked: true,
        }
    }

    fn check(&self) -> Result<(), RigError> {
        let bad = |option, what: &str| {
            Err(RigError::Option {
                option,
                what: what.to_string(),
            })
        };
        if self.partitions < 1 {
            return bad("--partitions", "must be at least 1");
        }
        if self.producers < 1 || self.batch < 1 || self.in_flight < 1 {
            return bad("--producers/--batch/--in-flight", "must be at least 1");
        }
        if self.cut_after.0 > self.cut_after.1 {
            return bad("--cut-after-min", "is above --cut-after-max");
        }
        if self.body_len.0 > self.body_len.1 || self.body_len.1 > 1 << 20 {
            return bad("--body-min/--body-max", "need min <= max <= 1 MiB");
        }
        Ok(())
    }
}

/// The cut moments of a run: a pure function of the seed and the bounds.
pub fn cut_moments(seed: u64, cycles: u32, bounds: (Duration, Duration)) -> Vec<Duration> {
    let mut rng = Rng::new(seed);
    let (lo, hi) = (bounds.0.as_micros() as u64, bounds.1.as_micros() as u64);
    (0..cycles)
        .map(|_| Duration::from_micros(rng.range(lo, hi.max(lo) + 1)))
        .collect()
}

/// The run's key in every record: from the seed, so a replay sends the same bytes.
fn run_key(seed: u64) -> u64 {
    let mut rng = Rng::new(seed ^ 0x6e76_6d71_5f72_6967);
    rng.next_u64()
}

struct Up {
    port_up: Duration,
    metadata_ok: Duration,
}

/// Polls until the broker accepts a connection and answers Metadata about the topic. With
/// `create`, the topic is created if missing and must end up ready; without, an unknown topic
/// counts as an answer too (everything in it was lost: the verification will say so).
async fn wait_up(o: &RigOptions, since: Instant, create: bool, cycle: u32) -> Result<Up, RigError> {
    let mut port_up = None;
    let mut last = String::from("nothing tried yet");
    let attempt = o.request_timeout.min(Duration::from_secs(2));
    while since.elapsed() < o.up_timeout {
        match wire::connect(&o.broker, "nvmq-rig-probe", attempt).await {
            Ok(mut c) => {
                let port_up = *port_up.get_or_insert_with(|| since.elapsed());
                let ask = async {
                    if create {
                        wire::create_topic(&mut c, &o.topic, o.partitions).await?;
                    }
                    wire::topic_state(&mut c, &o.topic).await
                };
                match tokio::time::timeout(attempt, ask).await {
                    Ok(Ok(wire::TopicState::Ready(n))) if n == o.partitions => {
                        return Ok(Up {
                            port_up,
                            metadata_ok: since.elapsed(),
                        })
                    }
                    // Only before the first cut: after one, a relaxed flush mode may have
                    // lost a partition's creation (the arm below).
                    Ok(Ok(wire::TopicState::Ready(n))) if create && cycle <= 1 => {
                        return Err(RigError::Option {
                            option: "--topic",
                            what: format!(
                                "{} exists with {n} partitions, not {}",
                                o.topic, o.partitions
                            ),
                        })
                    }
                    // Fewer partitions than created: a cut took some (their acks count as
                    // lost); the load goes on over what is left.
                    Ok(Ok(wire::TopicState::Ready(_))) => {
                        return Ok(Up {
                            port_up,
                            metadata_ok: since.elapsed(),
                        })
                    }
                    Ok(Ok(wire::TopicState::Unknown)) if !create => {
                        return Ok(Up {
                            port_up,
                            metadata_ok: since.elapsed(),
                        })
                    }
                    Ok(Ok(s)) => last = format!("topic {}: {s:?}", o.topic),
                    Ok(Err(e)) => last = e.to_string(),
                    Err(_) => last = "no Metadata answer".into(),
                }
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(o.poll_interval).await;
    }
    Err(RigError::NotUp {
        addr: o.broker.clone(),
        cycle,
        after: o.up_timeout,
        last,
    })
}

/// What persists from one verification to the next, to report each finding once.
#[derive(Default)]
struct Seen {
    lost: BTreeSet<(i32, i64, payload::RecordId)>,
    faults: BTreeSet<(i32, i64)>,
    survivors: BTreeSet<payload::RecordId>,
    copies: BTreeMap<payload::RecordId, usize>,
}

/// One verification: the ledger as it is on disk held against the whole topic as served.
struct Findings {
    checked: u64,
    lost: Vec<verify::Lost>,
    faults: Vec<verify::Fault>,
    new_survivors: u64,
    new_copies: u64,
    torn_tail: bool,
    highest_cycle: u32,
}

fn check(
    rt: &tokio::runtime::Runtime,
    o: &RigOptions,
    seen: &mut Seen,
) -> Result<Findings, RigError> {
    let contents = ledger::read(&o.ledger)?;
    let scan = rt.block_on(verify::scan(
        &o.broker,
        &o.topic,
        o.partitions,
        o.request_timeout,
    ))?;
    let v = verify::judge(&contents, &scan);
    let new_survivors = v
        .survivors
        .iter()
        .filter(|id| seen.survivors.insert(**id))
        .count() as u64;
    let mut new_copies = 0u64;
    for (id, at) in &v.duplicates {
        let extra = at.len() - 1;
        let before = seen.copies.insert(*id, extra).unwrap_or(0);
        new_copies += extra.saturating_sub(before) as u64;
    }
    for l in &v.lost {
        seen.lost.insert((l.partition, l.offset, l.id));
    }
    for f in &v.faults {
        seen.faults.insert((f.partition, f.offset));
    }
    Ok(Findings {
        checked: v.checked,
        lost: v.lost,
        faults: v.faults,
        new_survivors,
        new_copies,
        torn_tail: contents.torn_tail,
        highest_cycle: v.highest_cycle,
    })
}

/// A cycle's report without load figures (a resume has none; a cut fills them in).
fn checked_report(
    cycle: u32,
    kind: CycleKind,
    f: Findings,
    up: &Up,
    broker_report: Option<String>,
) -> CycleReport {
    CycleReport {
        cycle,
        kind,
        cut_after_ms: 0.0,
        sent: 0,
        acked: 0,
        unacked: 0,
        checked: f.checked,
        lost_acked: f.lost.len() as u64,
        checksum_failures: f.faults.len() as u64,
        survivors: f.new_survivors,
        duplicates: f.new_copies,
        cut_ms: 0.0,
        port_up_ms: report::round_ms(up.port_up),
        metadata_ok_ms: report::round_ms(up.metadata_ok),
        broker_report,
        lost_examples: f.lost.into_iter().take(5).collect(),
        fault_examples: f.faults.into_iter().take(5).collect(),
        ledger_torn_tail: f.torn_tail,
    }
}

pub(crate) fn lock(l: &Mutex<Ledger>) -> std::sync::MutexGuard<'_, Ledger> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs the cycles; `each` sees every cycle's report as it is made. Returns the run's report (its
/// `passed()` is false on any lost acknowledged record or checksum failure); an Err is a run that
/// could not go on (the broker did not come back, the ledger failed, a bad option). With
/// `o.resume`, the run in the existing ledger is checked first (a [`CycleKind::Resume`] report)
/// and then goes on.
pub fn run(
    o: &RigOptions,
    switch: &mut dyn PowerSwitch,
    mut each: impl FnMut(&CycleReport),
) -> Result<RunReport, RigError> {
    o.check()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("nvmq-rig")
        .enable_all()
        .build()
        .map_err(|e| RigError::InProcess(format!("starting the controller's runtime: {e}")))?;
    let (ledger, prior) = if o.resume {
        let (l, c) = resume::open(o)?;
        (l, Some(c))
    } else {
        let header = Header {
            run: run_key(o.seed),
            seed: o.seed,
            topic: o.topic.clone(),
            partitions: o.partitions,
            body_len: o.body_len,
        };
        (Ledger::create(&o.ledger, &header)?, None)
    };
    let run = prior
        .as_ref()
        .map_or_else(|| run_key(o.seed), |c| c.header.run);
    let ledger = Arc::new(Mutex::new(ledger));
    let mut seen = Seen::default();
    let mut cycles = Vec::new();
    let mut resumed = None;
    if let Some(prior) = &prior {
        // As after a cut: the broker may have lost the topic, which the check then reports.
        let last = prior.highest_cycle();
        let up = rt.block_on(wait_up(o, Instant::now(), false, last))?;
        let broker_report = switch.recovery_report();
        let f = check(&rt, o, &mut seen)?;
        // Past every cycle the ledger or the broker knows of: a record sent but never
        // acknowledged before the stop keeps its id on the broker, and no new one may take it.
        let first = last.max(f.highest_cycle) + 1;
        let mut report = checked_report(last, CycleKind::Resume, f, &up, broker_report);
        report.ledger_torn_tail = prior.torn_tail;
        each(&report);
        cycles.push(report);
        resumed = Some(resume::summary(prior, first));
    }
    let first_cycle = resumed.as_ref().map_or(1, |r| r.first_cycle);
    let moments = cut_moments(o.seed, o.cycles, o.cut_after);
    let mut queues: Vec<VecDeque<Batch>> = vec![VecDeque::new(); o.producers as usize];
    for (i, &moment) in moments.iter().enumerate() {
        let cycle = first_cycle + i as u32;
        // (Re)creates the topic when a cut took it away: the loss is counted, the load goes on.
        rt.block_on(wait_up(o, Instant::now(), true, cycle))?;
        lock(&ledger).start_cycle(&CycleStart {
            cycle,
            seed: o.seed,
        })?;
        let acked = Arc::new(AtomicU64::new(0));
        let ctx = Arc::new(LoadCtx {
            addr: o.broker.clone(),
            topic: o.topic.clone(),
            partitions: o.partitions,
            run,
            cycle,
            body_len: o.body_len,
            batch: o.batch,
            in_flight: o.in_flight,
            request_timeout: o.request_timeout,
            drain: o.drain,
            ledger: ledger.clone(),
            acked: acked.clone(),
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let tasks: Vec<_> = queues
            .iter_mut()
            .enumerate()
            .map(|(p, q)| {
                let q = std::mem::take(q);
                rt.spawn(load::producer(ctx.clone(), p as u32, q, stop_rx.clone()))
            })
            .collect();
        std::thread::sleep(moment);

        let cut_at = Instant::now();
        switch.cut()?;
        let cut_took = cut_at.elapsed();
        let _ = stop_tx.send(true);
        let mut sent = 0u64;
        let outcomes = rt.block_on(async {
            let mut out = Vec::new();
            for t in tasks {
                // The producers end by themselves within the drain time; past it plus a margin,
                // one is stuck in the network and is abandoned.
                let limit = o.drain + o.request_timeout;
                let abort = t.abort_handle();
                match tokio::time::timeout(limit, t).await {
                    Ok(Ok(r)) => out.push(r),
                    Ok(Err(e)) => out.push(Err(RigError::InProcess(format!("producer: {e}")))),
                    Err(_) => {
                        abort.abort();
                        tracing::warn!(
                            "a producer did not stop; its unacknowledged records are not resent"
                        );
                    }
                }
            }
            out
        });
        for (p, outcome) in outcomes.into_iter().enumerate() {
            let outcome = outcome?;
            sent += outcome.sent;
            tracing::debug!(producer = p, ended = %outcome.ended, "producer stopped");
            if o.resend_unacked {
                queues[p] = outcome.unacked.into();
            }
        }
        lock(&ledger).cut_cycle(&CycleCut { cycle, sent })?;

        switch.restore()?;
        let up = rt.block_on(wait_up(o, cut_at, false, cycle))?;
        let broker_report = switch.recovery_report();
        let f = check(&rt, o, &mut seen)?;
        let acked = acked.load(Ordering::Relaxed);
        let report = CycleReport {
            cut_after_ms: report::round_ms(moment),
            sent,
            acked,
            unacked: sent.saturating_sub(acked),
            cut_ms: report::round_ms(cut_took),
            ..checked_report(cycle, CycleKind::Cut, f, &up, broker_report)
        };
        each(&report);
        cycles.push(report);
    }

    let (rmin, rmed, rmax) = report::recovery_spread(&cycles);
    let cuts = || cycles.iter().filter(|c| c.kind == CycleKind::Cut);
    let before = resumed.as_ref();
    let totals = Totals {
        cycles: before.map_or(0, |r| r.cycles_before) + cuts().count() as u32,
        sent: before.map_or(0, |r| r.sent_before) + cuts().map(|c| c.sent).sum::<u64>(),
        acked: before.map_or(0, |r| r.acked_before) + cuts().map(|c| c.acked).sum::<u64>(),
        lost_acked: seen.lost.len() as u64,
        checksum_failures: seen.faults.len() as u64,
        survivors: cycles.iter().map(|c| c.survivors).sum(),
        duplicates: cycles.iter().map(|c| c.duplicates).sum(),
        recovery_ms_min: rmin,
        recovery_ms_median: rmed,
        recovery_ms_max: rmax,
        cut_after_ms: cuts().map(|c| c.cut_after_ms).collect(),
        passed: seen.lost.is_empty() && seen.faults.is_empty(),
    };
    Ok(RunReport {
        seed: o.seed,
        topic: o.topic.clone(),
        ledger: o.ledger.display().to_string(),
        resumed,
        cycles,
        totals,
    })
}

/// A ledger checked once against the broker as it is now (after a cut made by hand).
#[derive(Debug, Clone, serde::Serialize)]
pub struct LedgerCheck {
    pub checked: u64,
    pub lost: Vec<verify::Lost>,
    pub faults: Vec<verify::Fault>,
    pub survivors: u64,
    pub duplicates: u64,
    pub ledger_torn_tail: bool,
    pub passed: bool,
}

/// Checks an existing ledger against the broker at `broker`.
pub fn verify_ledger(
    broker: &str,
    ledger: &std::path::Path,
    timeout: Duration,
) -> Result<LedgerCheck, RigError> {
    let contents = ledger::read(ledger)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| RigError::InProcess(format!("starting a runtime: {e}")))?;
    let h = &contents.header;
    let scan = rt.block_on(verify::scan(broker, &h.topic, h.partitions, timeout))?;
    let v = verify::judge(&contents, &scan);
    Ok(LedgerCheck {
        checked: v.checked,
        passed: v.lost.is_empty() && v.faults.is_empty(),
        survivors: v.survivors.len() as u64,
        duplicates: v.duplicates.values().map(|a| a.len() as u64 - 1).sum(),
        lost: v.lost,
        faults: v.faults,
        ledger_torn_tail: contents.torn_tail,
    })
}
