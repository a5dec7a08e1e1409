//! CI mode 1 of the power-cut rig: the controller (the same code `nvmq-rig` runs) against a broker
//! in this process on the sim device, whose power cut tears the volatile cache by the crash model.
//! The seed comes from NVMQ_RIG_SEED when set, and is printed; the same seed gives the same cut
//! moments and record bytes.

use std::path::PathBuf;
use std::time::Duration;

use hw_test::powercut::inproc::{SimBroker, SimBrokerConfig};
use hw_test::powercut::{self, ledger, RigOptions, RunReport};
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

fn run(flush: FlushMode, name: &str, seed: u64, cycles: u32) -> RunReport {
    let mut broker = SimBroker::start(SimBrokerConfig {
        seed,
        flush,
        ..SimBrokerConfig::default()
    })
    .expect("sim broker");
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
