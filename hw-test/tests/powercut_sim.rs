//! CI mode 1 of the power-cut rig: the controller (the same code `nvmq-rig` runs) against a broker
//! in this process on the sim device, whose power cut tears the volatile cache by the crash model.
//! The seed comes from NVMQ_RIG_SEED when set, and is printed; the same seed gives the same cut
//! moments and record bytes.

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use hw_test::powercut::inproc::{SimBroker, SimBrokerConfig};
use hw_test::powercut::{self, ledger, CycleKind, RigError, RigOptions, RunReport};
use nvmq_log::FlushMode;

fn seed(default: u64) -> u64 {
    let s = std::env::var("NVMQ_RIG_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    eprintln!("power-cut rig seed {s} (replay: NVMQ_RIG_SEED={s})");
    s
}

fn ledger_path(name: &str, seed: u64) -> PathBuf {
    let p =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("powercut-{name}-{seed}.ledger"));
    let _ = std::fs::remove_file(&p);
    p
}

fn options(broker: &SimBroker, name: &str, seed: u64, cycles: u32) -> RigOptions {
    let mut o = RigOptions::new(
        broker.addr().to_string(),
        format!("rig-{name}"),
        ledger_path(name, seed),
    );
    o.seed = seed;
    o.cycles = cycles;
    o.cut_after = (Duration::from_millis(20), Duration::from_millis(250));
    o.body_len = (16, 512);
    o.poll_interval = Duration::from_millis(5);
    o.up_timeout = Duration::from_secs(60);
    o
}

fn sim(seed: u64, flush: FlushMode) -> SimBroker {
    SimBroker::start(SimBrokerConfig {
        seed,
        flush,
        ..SimBrokerConfig::default()
    })
    .expect("sim broker")
}

fn run(flush: FlushMode, name: &str, seed: u64, cycles: u32) -> RunReport {
    let mut broker = sim(seed, flush);
    let o = options(&broker, name, seed, cycles);
    let report = powercut::run(&o, &mut broker, |c| eprintln!("{c}"))
        .unwrap_or_else(|e| panic!("seed {seed}: the rig could not run: {e}"));
    eprintln!("{report}");
    report
}

#[test]
fn twenty_cuts_under_acks_all_lose_no_acknowledged_record() {
    let seed = seed(20261129);
    let r = run(FlushMode::Always, "always", seed, 20);
    let t = &r.totals;
    assert_eq!(t.cycles, 20, "seed {seed}");
    assert_eq!(t.lost_acked, 0, "seed {seed}: acknowledged records lost");
    assert_eq!(
        t.checksum_failures, 0,
        "seed {seed}: served records fail their checksum"
    );
    assert!(r.passed(), "seed {seed}");
    // The load ran in every cycle, and every ack so far was checked after every cut.
    let mut acked = 0;
    for c in &r.cycles {
        assert!(
            c.acked > 0,
            "seed {seed}: cycle {} acknowledged nothing",
            c.cycle
        );
        acked += c.acked;
        assert_eq!(
            c.checked, acked,
            "seed {seed}: cycle {} checked {} of {acked} acks",
            c.cycle, c.checked
        );
        assert!(c
            .broker_report
            .as_deref()
            .is_some_and(|s| s.starts_with("recovered from")));
    }
    assert_eq!(t.acked, acked);
    // The ledger on disk holds exactly what was counted.
    let l = ledger::read(std::path::Path::new(&r.ledger)).expect("ledger");
    assert_eq!(l.entries.len() as u64, t.acked, "seed {seed}");
    assert_eq!(l.header.seed, seed);
    // The cut moments are the seed's.
    let want: Vec<f64> = powercut::cut_moments(
        seed,
        20,
        (Duration::from_millis(20), Duration::from_millis(250)),
    )
    .iter()
    .map(|d| (d.as_secs_f64() * 1e4).round() / 10.0)
    .collect();
    assert_eq!(t.cut_after_ms, want, "seed {seed}");
}

#[test]
fn the_same_seed_gives_the_same_cut_moments() {
    let b = (Duration::from_millis(100), Duration::from_millis(5000));
    let a = powercut::cut_moments(77, 50, b);
    assert_eq!(a, powercut::cut_moments(77, 50, b));
    assert_ne!(a, powercut::cut_moments(78, 50, b));
    assert!(a.iter().all(|d| (b.0..=b.1).contains(d)));
    // Spread over the window, not bunched at one end.
    assert!(a.iter().any(|d| *d < Duration::from_millis(1500)));
    assert!(a.iter().any(|d| *d > Duration::from_millis(3500)));
}

#[test]
fn acks_before_the_flush_are_caught_as_lost() {
    // Flush mode never: the broker acknowledges at write completion, and the cut drops the
    // sim's volatile cache. The verifier must see acknowledged records missing.
    let seed = seed(7);
    let r = run(FlushMode::Never, "never", seed, 3);
    assert!(!r.passed(), "seed {seed}: losses went unnoticed");
    assert!(r.totals.lost_acked > 0, "seed {seed}");
    assert!(r.cycles.iter().any(|c| !c.lost_examples.is_empty()));
}

/// `nvmq-rig` itself: exit 0 and a JSON report on a sound broker, exit 3 when acks are lost.
#[test]
fn the_cli_reports_json_and_exits_3_on_loss() {
    let seed = seed(11);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let rig = |flush: &str| {
        let ledger = dir.join(format!("powercut-cli-{flush}-{seed}.ledger"));
        let _ = std::fs::remove_file(&ledger);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_nvmq-rig"))
            .args([
                "--in-process-sim",
                "--sim-flush",
                flush,
                "--json",
                "--cycles",
                "3",
            ])
            .args(["--cut-after-min", "20ms", "--cut-after-max", "120ms"])
            .arg("--seed")
            .arg(seed.to_string())
            .arg("--ledger")
            .arg(&ledger)
            .output()
            .expect("nvmq-rig runs");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "seed {seed}: no JSON report ({e}); stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code(), report)
    };
    let (code, r) = rig("always");
    assert_eq!(code, Some(0), "seed {seed}: {r}");
    assert_eq!(r["totals"]["cycles"], 3);
    assert_eq!(r["totals"]["lost_acked"], 0);
    assert_eq!(r["totals"]["passed"], true);
    assert!(r["totals"]["acked"].as_u64().is_some_and(|n| n > 0));
    assert_eq!(r["cycles"].as_array().map(Vec::len), Some(3));

    let (code, r) = rig("never");
    assert_eq!(code, Some(3), "seed {seed}: {r}");
    assert_eq!(r["totals"]["passed"], false);
    assert!(r["totals"]["lost_acked"].as_u64().is_some_and(|n| n > 0));
}

/// Flips one bit, on the sim medium, inside the last record the ledger says was acknowledged,
/// while the power is off. Recovery either takes the damaged batch for a torn tail and cuts it
/// (then the verifier must report those acks lost) or finds acknowledged data past it and refuses
/// to open (then the broker never comes back and the run fails).
struct Corrupting {
    inner: SimBroker,
    ledger: PathBuf,
    damaged: Option<u64>,
}

impl hw_test::powercut::PowerSwitch for Corrupting {
    fn cut(&mut self) -> Result<(), hw_test::powercut::RigError> {
        self.inner.cut()
    }

    fn restore(&mut self) -> Result<(), hw_test::powercut::RigError> {
        if self.damaged.is_none() {
            let l = ledger::read(&self.ledger).expect("ledger");
            let e = l.entries[l.entries.len() - 1];
            let want = hw_test::powercut::payload::encode(l.header.run, e.id, l.header.body_len);
            let h = self.inner.handle();
            let chunk = 4 << 20;
            let mut at = 0u64;
            while self.damaged.is_none() && at < 64 << 20 {
                let got = h.peek(at, chunk + want.len());
                if let Some(i) = got.windows(want.len()).position(|w| w == want) {
                    let byte = at + i as u64 + want.len() as u64 / 2;
                    h.flip_bit(byte, 3);
                    self.damaged = Some(byte);
                }
                at += chunk as u64;
            }
            assert!(
                self.damaged.is_some(),
                "acknowledged record {} not found on the medium",
                e.id
            );
        }
        self.inner.restore()
    }

    fn recovery_report(&mut self) -> Option<String> {
        self.inner.recovery_report()
    }
}

#[test]
fn an_acknowledged_record_damaged_on_the_medium_fails_the_run() {
    let seed = seed(3);
    let inner = SimBroker::start(SimBrokerConfig {
        seed,
        ..SimBrokerConfig::default()
    })
    .expect("sim broker");
    let mut o = options(&inner, "damaged", seed, 2);
    o.cut_after = (Duration::from_millis(150), Duration::from_millis(200));
    let mut switch = Corrupting {
        inner,
        ledger: o.ledger.clone(),
        damaged: None,
    };
    let outcome = powercut::run(&o, &mut switch, |c| eprintln!("{c}"));
    assert!(switch.damaged.is_some());
    match outcome {
        Ok(r) => {
            eprintln!("{r}");
            assert!(
                !r.passed(),
                "seed {seed}: a damaged acknowledged record went unnoticed"
            );
            assert!(r.totals.lost_acked + r.totals.checksum_failures > 0);
        }
        Err(e) => {
            eprintln!("seed {seed}: the run stopped: {e}");
            assert!(
                e.to_string().contains("damage inside acknowledged data"),
                "seed {seed}: {e}"
            );
        }
    }
}

/// A power switch whose cut hook fails after `cuts` good cuts: the controller stops mid-cycle,
/// its load running, as when a hook hangs and is killed (the broker itself keeps serving).
struct HookFailsAfter {
    inner: SimBroker,
    cuts: u32,
}

impl hw_test::powercut::PowerSwitch for HookFailsAfter {
    fn cut(&mut self) -> Result<(), RigError> {
        if self.cuts == 0 {
            return Err(RigError::Command {
                what: "--cut-cmd",
                cmd: "test hook".into(),
                detail: "killed after hanging".into(),
            });
        }
        self.cuts -= 1;
        self.inner.cut()
    }

    fn restore(&mut self) -> Result<(), RigError> {
        self.inner.restore()
    }

    fn recovery_report(&mut self) -> Option<String> {
        self.inner.recovery_report()
    }
}

fn resumed(o: &RigOptions, seed: u64, cycles: u32) -> RigOptions {
    let mut r = o.clone();
    r.seed = seed;
    r.cycles = cycles;
    r.resume = true;
    r
}

/// A sound sim broker, and a first run of `cycles` cuts on it that passed.
fn first_part(name: &str, seed: u64, cycles: u32) -> (SimBroker, RigOptions, RunReport) {
    let mut broker = sim(seed, FlushMode::Always);
    let o = options(&broker, name, seed, cycles);
    let r = powercut::run(&o, &mut broker, |c| eprintln!("{c}"))
        .unwrap_or_else(|e| panic!("seed {seed}: part 1 could not run: {e}"));
    eprintln!("{r}");
    assert!(r.passed(), "seed {seed}: {r}");
    assert!(r.resumed.is_none());
    (broker, o, r)
}

fn ids_are_unique(l: &ledger::Contents) -> bool {
    let ids: HashSet<_> = l.entries.iter().map(|e| e.id).collect();
    ids.len() == l.entries.len()
}

#[test]
fn a_stopped_run_resumes_from_its_ledger_and_every_ack_is_checked() {
    let seed = seed(404);
    // Part 1: three cuts, then the controller returns.
    let (broker, o, r1) = first_part("resume", seed, 3);
    let mut switch = HookFailsAfter {
        inner: broker,
        cuts: 1,
    };

    // Part 2, another seed: resumed, one cut, then the cut hook fails in the next cycle with the
    // load running (its acks so far are on the ledger, its cycle never cut).
    let mut part2 = Vec::new();
    let mut o2 = resumed(&o, seed + 1, 3);
    // Late enough in the load that the cycle the controller stops in has acks on the ledger.
    o2.cut_after = (Duration::from_millis(150), Duration::from_millis(250));
    let stopped = powercut::run(&o2, &mut switch, |c| {
        eprintln!("{c}");
        part2.push(c.clone());
    });
    let e = stopped.expect_err("the failing hook stops the run");
    assert!(e.to_string().contains("killed after hanging"), "{e}");
    let kinds: Vec<_> = part2.iter().map(|c| (c.kind, c.cycle)).collect();
    assert_eq!(
        kinds,
        vec![(CycleKind::Resume, 3), (CycleKind::Cut, 4)],
        "seed {seed}"
    );
    let check = &part2[0];
    assert_eq!(check.checked, r1.totals.acked, "seed {seed}");
    assert_eq!(check.lost_acked + check.checksum_failures, 0, "seed {seed}");
    assert_eq!(check.sent + check.acked, 0, "a resume has no load");
    assert!(!check.ledger_torn_tail);

    // The controller died writing an entry: a torn last line.
    let path = o.ledger.clone();
    let before = ledger::read(&path).expect("ledger after part 2");
    assert!(ids_are_unique(&before), "seed {seed}");
    let stopped_in = before.highest_cycle();
    assert_eq!(
        stopped_in, 5,
        "seed {seed}: part 2 stopped in its second cycle"
    );
    assert!(
        before.entries.iter().any(|e| e.id.cycle == 5),
        "seed {seed}: nothing acknowledged in the cycle the controller stopped in"
    );
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .expect("open ledger");
    f.write_all(b"ack 0 99999 5 0 4").expect("tear");
    drop(f);

    // Part 3, a third seed: resumed again, three cuts.
    switch.cuts = u32::MAX;
    let o3 = resumed(&o, seed + 2, 3);
    let r3 = powercut::run(&o3, &mut switch, |c| eprintln!("{c}"))
        .unwrap_or_else(|e| panic!("seed {seed}: part 3 could not run: {e}"));
    eprintln!("{r3}");
    let res = r3.resumed.as_ref().expect("a resumed report");
    let check = &r3.cycles[0];
    assert_eq!(check.kind, CycleKind::Resume);
    assert_eq!(check.cycle, 5);
    assert!(
        check.ledger_torn_tail,
        "seed {seed}: the torn line went unreported"
    );
    assert!(check.to_string().contains("torn last line was ignored"));
    assert_eq!(check.checked, before.entries.len() as u64, "seed {seed}");
    assert_eq!(res.acked_before, before.entries.len() as u64);
    assert_eq!(res.cycles_before, 4, "seed {seed}: 3 cuts, then 1 more");
    assert_eq!(res.first_cycle, 6, "seed {seed}");
    assert_eq!(res.seeds_before, vec![seed, seed + 1]);
    let cut_cycles: Vec<u32> = r3.cycles[1..].iter().map(|c| c.cycle).collect();
    let f = res.first_cycle;
    assert_eq!(cut_cycles, vec![f, f + 1, f + 2], "seed {seed}");

    // Every ack of all three parts checked after the last cut, none lost, ids all distinct.
    let after = ledger::read(&path).expect("ledger after part 3");
    assert!(
        !after.torn_tail,
        "seed {seed}: the torn line was left in place"
    );
    assert!(ids_are_unique(&after), "seed {seed}: record ids collide");
    assert!(after
        .entries
        .iter()
        .skip(before.entries.len())
        .all(|e| e.id.cycle >= f));
    let t = &r3.totals;
    assert!(r3.passed(), "seed {seed}: {r3}");
    assert_eq!(t.lost_acked + t.checksum_failures, 0, "seed {seed}");
    assert_eq!(t.acked, after.entries.len() as u64, "seed {seed}");
    let new_acks: u64 = r3.cycles.iter().map(|c| c.acked).sum();
    assert!(new_acks > 0, "seed {seed}: part 3 acknowledged nothing");
    assert_eq!(t.acked, res.acked_before + new_acks);
    assert!(res.acked_before > r1.totals.acked + part2[1].acked);
    assert_eq!(r3.cycles.last().map(|c| c.checked), Some(t.acked));
    assert_eq!(t.cycles, 4 + 3);
    assert!(
        t.sent >= t.acked,
        "seed {seed}: sent {} < acked {}",
        t.sent,
        t.acked
    );
    assert!(res.sent_before >= r1.totals.sent + part2[1].sent);
    assert_eq!(t.cut_after_ms.len(), 3, "this session's cut moments only");
    // The ledger's run key and shape stay the first part's.
    assert_eq!(after.header.seed, seed);
    assert_eq!(after.header.run, before.header.run);
}

/// A switch for runs that must stop before they touch the broker.
struct Untouched;

impl hw_test::powercut::PowerSwitch for Untouched {
    fn cut(&mut self) -> Result<(), RigError> {
        panic!("a refused run cut the power")
    }
    fn restore(&mut self) -> Result<(), RigError> {
        panic!("a refused run restored the power")
    }
    fn recovery_report(&mut self) -> Option<String> {
        None
    }
}

#[test]
fn a_resume_is_refused_for_a_damaged_missing_or_different_ledger() {
    let path = ledger_path("refused", 1);
    // No broker listens here: every refusal comes before the controller connects.
    let mut o = RigOptions::new("127.0.0.1:9", "rig-refused", path.clone());
    o.partitions = 2;
    o.body_len = (16, 512);
    let refused = |o: &RigOptions| match powercut::run(o, &mut Untouched, |_| {}) {
        Err(e) => e.to_string(),
        Ok(r) => panic!("ran: {r}"),
    };

    let e = refused(&resumed(&o, 2, 1));
    assert!(e.contains("does not exist"), "{e}");

    let header = ledger::Header {
        run: 77,
        seed: 1,
        topic: "rig-refused".into(),
        partitions: 2,
        body_len: (16, 512),
    };
    let mut l = ledger::Ledger::create(&path, &header).expect("ledger");
    let entry = |seq| ledger::Entry {
        partition: 0,
        offset: seq as i64,
        id: hw_test::powercut::payload::RecordId {
            cycle: 1,
            producer: 0,
            seq,
        },
        len: 60,
        hash: 7,
    };
    l.start_cycle(&ledger::CycleStart { cycle: 1, seed: 1 })
        .expect("mark");
    l.append(&[entry(1), entry(2), entry(3)]).expect("append");
    drop(l);
    let sound = std::fs::read(&path).expect("bytes");

    // Without --resume an existing ledger is refused and left as it was.
    let e = refused(&o);
    assert!(e.contains("exists already"), "{e}");
    assert_eq!(std::fs::read(&path).expect("bytes"), sound);

    // Another topic, partition count or body size than the ledger's run.
    let mut other = resumed(&o, 2, 1);
    other.topic = "rig-other".into();
    assert!(refused(&other).contains("topic rig-refused, not rig-other"));
    let mut other = resumed(&o, 2, 1);
    other.partitions = 3;
    assert!(refused(&other).contains("2 partitions, not 3"));
    let mut other = resumed(&o, 2, 1);
    other.body_len = (16, 1024);
    assert!(refused(&other).contains("--body-min/--body-max"));

    // A damaged line before the last (line 4: the second entry) refuses the resume by number.
    let text = String::from_utf8(sound.clone()).expect("text");
    let damaged = text.replacen("ack 0 2 ", "ack 0 8 ", 1);
    assert_ne!(damaged, text);
    std::fs::write(&path, damaged).expect("damage");
    let e = refused(&resumed(&o, 2, 1));
    assert!(
        e.contains("line 4") && e.contains("checksum does not match"),
        "{e}"
    );
}

#[test]
fn a_loss_after_the_resume_is_still_caught() {
    // The first part runs on a sound broker; from the resumed part's first cut on, the broker
    // acknowledges before flushing, and the cuts after must show acks of the new cycles lost.
    let seed = seed(31);
    let (mut broker, o, _) = first_part("resume-loss", seed, 2);

    broker.set_flush(FlushMode::Never);
    let r = powercut::run(&resumed(&o, seed + 1, 4), &mut broker, |c| eprintln!("{c}"))
        .unwrap_or_else(|e| panic!("seed {seed}: the resumed part could not run: {e}"));
    eprintln!("{r}");
    assert_eq!(r.cycles[0].kind, CycleKind::Resume);
    assert_eq!(r.cycles[0].lost_acked, 0, "seed {seed}: part 1 was sound");
    assert!(
        !r.passed(),
        "seed {seed}: losses after the resume went unnoticed"
    );
    assert!(r.totals.lost_acked > 0, "seed {seed}");
    let first = r.resumed.as_ref().map(|x| x.first_cycle).expect("resumed");
    assert!(
        r.cycles
            .iter()
            .flat_map(|c| &c.lost_examples)
            .any(|l| l.id.cycle >= first),
        "seed {seed}: no loss among the resumed part's records"
    );
}

/// `nvmq-rig --resume`: its JSON report opens with the resume check; against an in-process
/// broker (which died with the first process, and its data with it) every ack is lost: exit 3.
/// Without a ledger it refuses; a second run on an existing ledger without --resume refuses too.
#[test]
fn the_cli_resumes_and_reports_a_broker_that_lost_everything() {
    let seed = seed(12);
    let ledger = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("powercut-cli-resume-{seed}.ledger"));
    let _ = std::fs::remove_file(&ledger);
    let rig = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_nvmq-rig"))
            .args(["--in-process-sim", "--json"])
            .args(["--cut-after-min", "20ms", "--cut-after-max", "120ms"])
            .args(["--body-min", "16", "--body-max", "300"])
            .arg("--ledger")
            .arg(&ledger)
            .args(extra)
            .output()
            .expect("nvmq-rig runs");
        (
            out.status.code(),
            serde_json::from_slice::<serde_json::Value>(&out.stdout).ok(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let s = seed.to_string();
    let (code, _, err) = rig(&["--seed", &s, "--cycles", "2", "--resume"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("does not exist"), "{err}");

    let fresh = ["--seed", &s, "--cycles", "2", "--topic", "rig-cli-resume"];
    let (code, first, err) = rig(&fresh);
    assert_eq!(code, Some(0), "seed {seed}: {err}");
    let first = first.expect("a JSON report");
    let acked = first["totals"]["acked"].as_u64().expect("acked");
    assert!(acked > 0);
    let kept = std::fs::read(&ledger).expect("ledger");

    let (code, _, err) = rig(&fresh);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("exists already"), "{err}");
    assert_eq!(std::fs::read(&ledger).expect("ledger"), kept);

    // Topic and body sizes come from the ledger.
    let next = (seed + 1).to_string();
    let (code, r, err) = rig(&["--seed", &next, "--resume", "--cycles", "1"]);
    let r = r.unwrap_or_else(|| panic!("seed {seed}: no JSON report; stderr:\n{err}"));
    assert_eq!(code, Some(3), "seed {seed}: {r}");
    assert_eq!(r["topic"], "rig-cli-resume");
    assert_eq!(r["cycles"][0]["kind"], "resume");
    assert_eq!(r["cycles"][0]["checked"], acked);
    assert_eq!(r["cycles"][0]["lost_acked"], acked);
    assert_eq!(r["cycles"][1]["kind"], "cut");
    assert_eq!(r["cycles"][1]["cycle"], 3);
    assert_eq!(r["resumed"]["acked_before"], acked);
    assert_eq!(r["resumed"]["cycles_before"], 2);
    assert_eq!(r["totals"]["cycles"], 3);
    assert_eq!(r["totals"]["passed"], false);
    assert!(err.contains("resume after cycle 2"), "{err}");
}

#[test]
fn a_ledger_from_before_the_cycle_marks_resumes() {
    let seed = seed(58);
    let (mut broker, o, r1) = first_part("resume-old", seed, 2);
    // What an older controller wrote: the header and the acks, no cycle marks.
    let text = std::fs::read_to_string(&o.ledger).expect("ledger");
    let old: String = text
        .lines()
        .filter(|l| !l.starts_with("cycle ") && !l.starts_with("cut "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(old.len() < text.len());
    std::fs::write(&o.ledger, old).expect("rewrite");

    let r = powercut::run(&resumed(&o, seed + 1, 1), &mut broker, |c| eprintln!("{c}"))
        .unwrap_or_else(|e| panic!("seed {seed}: the resume could not run: {e}"));
    eprintln!("{r}");
    assert!(r.passed(), "seed {seed}: {r}");
    let res = r.resumed.as_ref().expect("resumed");
    assert_eq!(res.acked_before, r1.totals.acked);
    assert_eq!(
        res.cycles_before, 2,
        "seed {seed}: counted from the acks' cycles"
    );
    assert_eq!(res.first_cycle, 3, "seed {seed}");
    assert_eq!(r.cycles[0].checked, r1.totals.acked);
    let after = ledger::read(&o.ledger).expect("ledger");
    assert!(ids_are_unique(&after), "seed {seed}: record ids collide");
    assert_eq!(r.totals.acked, after.entries.len() as u64);
}
