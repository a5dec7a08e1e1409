//! A follower's store survives a power cut at every step of its life (the sim device's volatile
//! cache torn at the cut), including inside a checkpoint's run of records, and holds exactly
//! what the Raft rules say it must.
//!
//! The expected state comes from `Model`, a plain reference written here from the rules (a vote
//! replaces the vote, an entry at index i replaces the log from i on, a truncation drops the
//! suffix, a purge drops the prefix, a snapshot holds what was applied), not from the crate's
//! `GroupState`. The log keeps a prefix of what was written, so after a cut the store, read
//! through openraft's storage calls, must equal the model after some prefix of the steps that
//! covers every operation that completed; a checkpoint adds no step at all.
//!
//! Seeds: each seed runs every cut point; a failure names its seed, and
//! NVMQ_POWER_CUT_SEED=<n> runs that seed alone. The writer is a real thread, so a seed fixes
//! the device's choices (which cached writes survive, torn or whole), not the interleaving.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::task::Poll;

use common::Node;
use nvmq_cluster::{Entry, LogId, LogStore, Request, StateMachine, Vote, RAFT_TOPIC};
use nvmq_log::config::{FormatOptions, LogConfig};
use openraft::storage::{IOFlushed, RaftLogStorage, RaftStateMachine};
use openraft::type_config::TypeConfigExt;
use openraft::{EntryPayload, RaftLogReader, RaftSnapshotBuilder};

const GROUP: u32 = 3;
const SEED_VAR: &str = "NVMQ_POWER_CUT_SEED";
/// Run on every test run.
const SEEDS: &[u64] = &[1, 2];
/// Seeds that once failed, run on every test run too. None has yet.
const FAILED_ONCE: &[u64] = &[];

/// The seeds to run, and whether this is the default run (not a replay of one seed).
fn seeds() -> (Vec<u64>, bool) {
    match std::env::var(SEED_VAR).ok().and_then(|s| s.parse().ok()) {
        Some(s) => (vec![s], false),
        None => (SEEDS.iter().chain(FAILED_ONCE).copied().collect(), true),
    }
}

fn id(term: u64, index: u64) -> LogId {
    LogId::new_term_index(term, index)
}

/// Entries of term 1 are small (the snapshot holds them); later ones take a third of a batch,
/// so that a checkpoint restating them spans several batches and a cut can land inside it.
fn entry(term: u64, index: u64) -> Entry {
    let mut bytes = format!("term {term} index {index}").into_bytes();
    if term > 1 {
        bytes.resize(5000, (index % 251) as u8);
    }
    Entry {
        log_id: id(term, index),
        payload: EntryPayload::Normal(Request::from(bytes)),
    }
}

/// Batches of 16 KiB, and an in-flight window of one batch: a checkpoint of a few live entries
/// is several batches, each durable before the next is written, so a cut once some of its
/// records are durable lands inside it.
fn format() -> FormatOptions {
    FormatOptions {
        window: 16 << 10,
        max_batch: 16 << 10,
        log_size: None,
        format_id: None,
    }
}

#[derive(Debug, Clone)]
enum Op {
    Vote(Vote),
    Append(Vec<Entry>),
    Committed(Option<LogId>),
    Truncate(Option<LogId>),
    /// Apply the entries up to this index to the state machine and build a snapshot.
    Snapshot(u64),
    Purge(LogId),
    Checkpoint,
}

/// A follower's life: votes, appends, a committed mark, two truncations of uncommitted
/// suffixes under new leaders, a snapshot, a purge, and two checkpoints.
fn script() -> Vec<Op> {
    let run = |term, r: std::ops::RangeInclusive<u64>| r.map(|i| entry(term, i)).collect();
    vec![
        Op::Vote(Vote::new(1, 1)),
        Op::Append(run(1, 1..=5)),
        Op::Committed(Some(id(1, 3))),
        Op::Vote(Vote::new(2, 2)),
        Op::Truncate(Some(id(1, 3))),
        Op::Append(run(2, 4..=6)),
        Op::Checkpoint,
        Op::Snapshot(3),
        Op::Purge(id(1, 3)),
        Op::Append(run(2, 7..=10)),
        Op::Checkpoint,
        Op::Vote(Vote::new_committed(3, 3)),
        Op::Truncate(Some(id(2, 6))),
        Op::Append(run(3, 7..=7)),
    ]
}

/// One change the store makes durable whole or not at all (one record on the device).
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Vote(Vote),
    Entry(Entry),
    Committed(Option<LogId>),
    Truncate(Option<LogId>),
    Snapshot(u64),
    Purge(LogId),
}

fn steps(op: &Op) -> Vec<Step> {
    match op {
        Op::Vote(v) => vec![Step::Vote(*v)],
        Op::Append(es) => es.iter().cloned().map(Step::Entry).collect(),
        Op::Committed(c) => vec![Step::Committed(*c)],
        Op::Truncate(t) => vec![Step::Truncate(*t)],
        Op::Snapshot(upto) => vec![Step::Snapshot(*upto)],
        Op::Purge(p) => vec![Step::Purge(*p)],
        // A checkpoint restates what the store holds: it must change nothing, whole or cut.
        Op::Checkpoint => vec![],
    }
}

/// What a follower's store holds, as openraft reads it.
#[derive(Debug, Clone, Default, PartialEq)]
struct Held {
    vote: Option<Vote>,
    committed: Option<LogId>,
    purged: Option<LogId>,
    last_log_id: Option<LogId>,
    entries: BTreeMap<u64, Entry>,
    /// The newest snapshot's last log id, if there is a snapshot.
    snapshot: Option<Option<LogId>>,
    /// Where a reopened state machine starts (the snapshot's last log id), and what it holds.
    applied: Option<LogId>,
    data: BTreeMap<u64, Vec<u8>>,
}

/// The reference: what the store must hold after `steps`, by the Raft rules.
fn model(steps: &[Step]) -> Held {
    let mut h = Held::default();
    for s in steps {
        match s {
            Step::Vote(v) => h.vote = Some(*v),
            // The leader's log wins: an entry at index i replaces everything from i on.
            Step::Entry(e) => {
                h.entries.retain(|&i, _| i < e.log_id.index);
                h.entries.insert(e.log_id.index, e.clone());
            }
            Step::Committed(c) => h.committed = *c,
            Step::Truncate(after) => h
                .entries
                .retain(|&i, _| after.is_some_and(|a| i <= a.index)),
            // A snapshot holds what was applied: every normal entry up to `upto`.
            Step::Snapshot(upto) => {
                let covered = || h.entries.range(..=*upto).map(|(_, e)| e);
                let last = covered().next_back().map(|e| e.log_id);
                h.data = covered()
                    .filter_map(|e| match &e.payload {
                        EntryPayload::Normal(r) => Some((e.log_id.index, r.0.to_vec())),
                        _ => None,
                    })
                    .collect();
                h.snapshot = Some(last);
                h.applied = last;
            }
            Step::Purge(upto) => {
                h.entries.retain(|&i, _| i > upto.index);
                h.purged = h.purged.max(Some(*upto));
            }
        }
    }
    // The last log id is the last entry's, or the purge point's when none is left.
    h.last_log_id = h
        .entries
        .values()
        .next_back()
        .map(|e| e.log_id)
        .or(h.purged);
    h
}

/// Entries that a truncation among `promised` dropped and no later step wrote again: they must
/// never come back (implied by the prefix rule, said outright).
fn dead(steps: &[Step], promised: usize) -> BTreeSet<LogId> {
    let mut dead = BTreeSet::new();
    for (i, s) in steps[..promised].iter().enumerate() {
        if let Step::Truncate(after) = s {
            for e in model(&steps[..i]).entries.values() {
                let dropped = after.is_none_or(|a| e.log_id.index > a.index);
                let rewritten = steps[i..].contains(&Step::Entry(e.clone()));
                if dropped && !rewritten {
                    dead.insert(e.log_id);
                }
            }
        }
    }
    dead
}

fn fail(what: &str) -> impl Fn(io::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// What the store holds, read through openraft's storage calls.
async fn held(ls: &mut LogStore, sm: &mut StateMachine) -> Result<Held, String> {
    let state = ls.get_log_state().await.map_err(fail("get_log_state"))?;
    let entries = ls.try_get_log_entries(..).await.map_err(fail("entries"))?;
    let snapshot = sm.get_current_snapshot().await.map_err(fail("snapshot"))?;
    let (applied, _) = sm.applied_state().await.map_err(fail("applied_state"))?;
    Ok(Held {
        vote: ls.read_vote().await.map_err(fail("read_vote"))?,
        committed: ls.read_committed().await.map_err(fail("read_committed"))?,
        purged: state.last_purged_log_id,
        last_log_id: state.last_log_id,
        entries: entries.into_iter().map(|e| (e.log_id.index, e)).collect(),
        snapshot: snapshot.map(|s| s.meta.last_log_id),
        applied,
        data: sm.applied().map_err(|e| e.to_string())?.data,
    })
}

/// Runs `op` to completion: returns once it returned and, for an append, its flush callback
/// fired.
async fn run(op: &Op, ls: &mut LogStore, sm: &mut StateMachine) -> io::Result<()> {
    match op {
        Op::Vote(v) => ls.save_vote(v).await,
        Op::Append(es) => {
            let (tx, rx) = nvmq_cluster::TypeConfig::oneshot();
            ls.append(es.clone(), IOFlushed::signal(tx)).await?;
            rx.await
                .map_err(|_| io::Error::other("append callback dropped"))?
        }
        Op::Committed(c) => ls.save_committed(*c).await,
        Op::Truncate(t) => ls.truncate_after(*t).await,
        Op::Snapshot(upto) => {
            let entries = ls.try_get_log_entries(..=*upto).await?;
            let items: Vec<_> = entries.into_iter().map(|e| Ok((e, None))).collect();
            sm.apply(futures::stream::iter(items)).await?;
            sm.get_snapshot_builder()
                .await
                .build_snapshot()
                .await
                .map(|_| ())
        }
        Op::Purge(p) => ls.purge(*p).await,
        Op::Checkpoint => Ok(ls.group_log().checkpoint().await?),
    }
}

/// Where the power is cut during the operation at a step.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cut {
    /// Once it completed.
    Completed,
    /// Shortly after it submitted its writes (its first poll): 100 us of real time, long
    /// enough for the writer to have written some of them, usually not to have flushed them
    /// (the sim's flush takes 200 us), so that the cut decides their fate.
    Submitted,
    /// A checkpoint, once this many of its records are durable.
    Inside(usize),
}

/// The cuts tried at every step of the script.
fn cuts(script: &[Op]) -> Vec<(usize, Cut)> {
    let mut cuts = Vec::new();
    for (step, op) in script.iter().enumerate() {
        cuts.push((step, Cut::Completed));
        cuts.push((step, Cut::Submitted));
        if let Op::Checkpoint = op {
            cuts.extend((1..=5).map(|k| (step, Cut::Inside(k))));
        }
    }
    cuts
}

/// What a run promised before the cut, and what it wrote.
struct Run {
    steps: Vec<Step>,
    /// Steps covered by a completed operation: every one of them must survive.
    promised: usize,
    /// For a cut inside a checkpoint: the group's record count before it, and its length.
    checkpoint: Option<(u64, u64)>,
}

/// What a completed `op` promises: everything written so far is durable, except after a
/// commit mark, which is a hint that does not wait for its flush (the next durable write
/// covers it; see docs/cluster.md).
fn promised_after(op: &Op, r: &Run) -> usize {
    match op {
        Op::Committed(_) => r.promised,
        _ => r.steps.len(),
    }
}

/// The group's durable record count (its partition's durable end: one offset per record).
fn records(node: &Node) -> u64 {
    let p = node.log.partition_id(RAFT_TOPIC, GROUP);
    p.and_then(|p| node.log.partition(p))
        .map_or(0, |v| v.durable_end)
}

/// Runs `ops` on the group until the cut, then cuts the power.
async fn run_until_cut(node: &Node, ops: &[Op], at: (usize, Cut)) -> Result<Run, String> {
    let (mut ls, mut sm) = node.open(GROUP).map_err(|e| e.to_string())?;
    let mut r = Run {
        steps: vec![],
        promised: 0,
        checkpoint: None,
    };
    for (step, op) in ops.iter().enumerate() {
        if step == at.0 && at.1 != Cut::Completed {
            // A checkpoint writes the snapshot, the state and every live entry (its layout in
            // `GroupLog::checkpoint`): used only to pick the cut and to tell whether a cut
            // landed inside, never for what the store must hold.
            let before = records(node);
            let now = model(&r.steps);
            let len = u64::from(now.snapshot.is_some()) + 1 + now.entries.len() as u64;
            r.steps.extend(steps(op));
            let mut fut = Box::pin(run(op, &mut ls, &mut sm));
            if let Poll::Ready(res) = futures::poll!(&mut fut) {
                res.map_err(|e| format!("step {step}: {e}"))?;
                r.promised = promised_after(op, &r);
            }
            if at.1 == Cut::Submitted {
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            if let Cut::Inside(k) = at.1 {
                let pid = node.log.partition_id(RAFT_TOPIC, GROUP).ok_or("no group")?;
                let k = (k as u64).min(len - 1);
                let end =
                    node.log
                        .wait_for(pid, before + k - 1, std::time::Duration::from_secs(10));
                if end < before + k {
                    return Err(format!("step {step}: {k} checkpoint records never durable"));
                }
                r.checkpoint = Some((before, len));
            }
            break;
        }
        r.steps.extend(steps(op));
        run(op, &mut ls, &mut sm)
            .await
            .map_err(|e| format!("step {step} {op:?}: {e}"))?;
        r.promised = promised_after(op, &r);
        if step == at.0 {
            break;
        }
    }
    node.handle.power_cut();
    Ok(r)
}

/// Checks the recovered store against the model; returns the prefix of steps it matched.
async fn check(
    ls: &mut LogStore,
    sm: &mut StateMachine,
    r: &Run,
    what: &str,
) -> Result<usize, String> {
    let got = held(ls, sm).await.map_err(|e| format!("{what}: {e}"))?;
    let Some(m) = (r.promised..=r.steps.len()).find(|&m| model(&r.steps[..m]) == got) else {
        return Err(format!(
            "{what}: the store holds {got:?}, which no prefix of the steps covering the {} \
             promised ones builds (steps: {:?})",
            r.promised, r.steps
        ));
    };
    if let Some(back) = got
        .entries
        .values()
        .find(|e| dead(&r.steps, r.promised).contains(&e.log_id))
    {
        return Err(format!("{what}: truncated entry {} came back", back.log_id));
    }
    Ok(m)
}

/// How a first cut went: steps written, promised, kept; and whether it landed inside a
/// checkpoint (some of its records kept, not all).
struct Outcome {
    written: usize,
    promised: usize,
    kept: usize,
    inside: bool,
}

async fn cut_and_check(seed: u64, at: (usize, Cut)) -> Result<Outcome, String> {
    let what = format!("seed {seed}, cut at step {} ({:?})", at.0, at.1);
    let ops = script();
    let node = Node::with(seed, &format(), LogConfig::default())?;
    let mut r = run_until_cut(&node, &ops, at).await?;
    let node = node.power_cycle()?;
    let kept_records = records(&node);
    let (mut ls, mut sm) = node
        .open(GROUP)
        .map_err(|e| format!("{what}: reopen: {e}"))?;
    let m = check(&mut ls, &mut sm, &r, &what).await?;
    let outcome = Outcome {
        written: r.steps.len(),
        promised: r.promised,
        kept: m,
        inside: r
            .checkpoint
            .is_some_and(|(before, len)| kept_records > before && kept_records < before + len),
    };

    // The group takes writes again, and a second cut keeps what the first recovery kept plus
    // what was written after it.
    r.steps.truncate(m);
    let last = model(&r.steps).last_log_id;
    let op = Op::Append(vec![entry(9, last.map_or(1, |l| l.index + 1))]);
    run(&op, &mut ls, &mut sm)
        .await
        .map_err(|e| format!("{what}: append after recovery: {e}"))?;
    r.steps.extend(steps(&op));
    r.promised = r.steps.len();
    drop((ls, sm));
    let node = node.power_cycle()?;
    let (mut ls, mut sm) = node
        .open(GROUP)
        .map_err(|e| format!("{what}: second reopen: {e}"))?;
    check(&mut ls, &mut sm, &r, &format!("{what}, second cut")).await?;
    Ok(outcome)
}

#[tokio::test(flavor = "current_thread")]
async fn every_step_survives_a_cut_after_it_completed_soon_after_it_was_submitted_and_inside_a_checkpoint(
) {
    let script = script();
    let (mut lost, mut kept_unpromised, mut inside) = (0, 0, 0);
    let (seeds, default_run) = seeds();
    for seed in seeds {
        for (case, at) in cuts(&script).into_iter().enumerate() {
            let device_seed = seed.wrapping_mul(1000).wrapping_add(case as u64);
            match cut_and_check(device_seed, at).await {
                Ok(o) => {
                    lost += usize::from(o.kept < o.written);
                    kept_unpromised += usize::from(o.kept > o.promised);
                    inside += usize::from(o.inside);
                }
                Err(e) => panic!("{e} (replay: {SEED_VAR}={seed})"),
            }
        }
    }
    // The cuts must have bitten: some lost writes still in the cache, some kept writes that
    // had landed before their flush, some landed inside a checkpoint; otherwise this test
    // proves nothing about cuts. Where a cut lands depends on the writer thread's timing, so
    // this is asked of the default run's cuts together, not of one replayed seed's.
    if !default_run {
        return;
    }
    eprintln!("cuts: {lost} lost writes, {kept_unpromised} kept unflushed ones, {inside} landed inside a checkpoint");
    assert!(lost > 0, "no cut lost an unflushed write");
    assert!(kept_unpromised > 0, "no cut kept an unflushed write");
    assert!(inside > 0, "no cut landed inside a checkpoint");
}
