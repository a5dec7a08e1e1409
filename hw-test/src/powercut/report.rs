//! The figures of a cycle and of a run, for people and for `--json`.

use std::time::Duration;

use serde::Serialize;

use crate::powercut::verify::{Fault, Lost};

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

/// What a cycle of the report was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CycleKind {
    /// A load, a cut, and the verification after it.
    Cut,
    /// The verification a resumed run starts with: no load and no cut, every acknowledgement
    /// already on the ledger checked against the broker as the controller finds it.
    Resume,
}

/// One cut and what the verification after it found.
#[derive(Debug, Clone, Serialize)]
pub struct CycleReport {
    /// For a cut, its number in the run; for a resume, the last cycle the ledger had begun.
    pub cycle: u32,
    pub kind: CycleKind,
    /// When the cut came, after the load started (drawn from the seed).
    pub cut_after_ms: f64,
    /// Records sent this cycle, including resends of the last cycle's unacknowledged ones.
    pub sent: u64,
    /// Records acknowledged this cycle (each on the ledger before it was counted).
    pub acked: u64,
    /// Records sent this cycle that were refused or had no answer when the power went.
    pub unacked: u64,
    /// Ledger entries checked after this cut (every acknowledgement of the run so far).
    pub checked: u64,
    /// Acknowledged records not served back bit-exact at their offset: must be 0.
    pub lost_acked: u64,
    /// Served records failing their own checksum or differing from what their id was sent as.
    pub checksum_failures: u64,
    /// Records present without an acknowledgement, first seen after this cut.
    pub survivors: u64,
    /// Extra copies of a record (same id at another offset), first seen after this cut.
    pub duplicates: u64,
    /// Time the cut command took.
    pub cut_ms: f64,
    /// From the start of the cut (of a resume: of the controller) to the first TCP connection
    /// accepted.
    pub port_up_ms: f64,
    /// From the same start to the first Metadata answer with every partition led.
    pub metadata_ok_ms: f64,
    /// The broker's own recovery report, when the switch provides one.
    pub broker_report: Option<String>,
    /// The first few lost records and faults, for the human report.
    pub lost_examples: Vec<Lost>,
    pub fault_examples: Vec<Fault>,
    /// A torn last ledger line was found and ignored (the controller itself crashed before); a
    /// resume also cuts it off before appending.
    pub ledger_torn_tail: bool,
}

/// What the ledger of a resumed run held when this session began.
#[derive(Debug, Clone, Serialize)]
pub struct Resumed {
    /// Cuts the ledger records (a ledger from before cycle marks: the highest cycle of its acks).
    pub cycles_before: u32,
    /// Records sent before, as the ledger records them; a cycle the controller stopped in before
    /// its cut counts its acknowledged records only.
    pub sent_before: u64,
    /// Acknowledgements on the ledger (a torn last line not counted).
    pub acked_before: u64,
    /// The first cycle of this session: past every cycle the ledger or the broker knew of.
    pub first_cycle: u32,
    /// The seeds of the sessions before, in order (each session's cut moments).
    pub seeds_before: Vec<u64>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub seed: u64,
    pub topic: String,
    pub ledger: String,
    /// Set when this session resumed an existing ledger.
    pub resumed: Option<Resumed>,
    pub cycles: Vec<CycleReport>,
    pub totals: Totals,
}

/// The whole run: a resumed run's totals include what the ledger held before.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    /// Cuts over the whole run.
    pub cycles: u32,
    pub sent: u64,
    pub acked: u64,
    /// Distinct acknowledged records found lost at any verification.
    pub lost_acked: u64,
    /// Distinct served positions failing their checksum at any verification.
    pub checksum_failures: u64,
    pub survivors: u64,
    pub duplicates: u64,
    pub recovery_ms_min: f64,
    pub recovery_ms_median: f64,
    pub recovery_ms_max: f64,
    /// This session's cut moments, in order, for replaying with the same seed.
    pub cut_after_ms: Vec<f64>,
    pub passed: bool,
}

impl RunReport {
    pub fn passed(&self) -> bool {
        self.totals.passed
    }
}

pub(crate) fn round_ms(d: Duration) -> f64 {
    ms(d)
}

pub(crate) fn recovery_spread(cycles: &[CycleReport]) -> (f64, f64, f64) {
    let mut r: Vec<f64> = cycles
        .iter()
        .filter(|c| c.kind == CycleKind::Cut)
        .map(|c| c.metadata_ok_ms)
        .collect();
    if r.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    r.sort_by(f64::total_cmp);
    (r[0], r[r.len() / 2], r[r.len() - 1])
}

impl std::fmt::Display for CycleReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (head, tail) = match self.kind {
            CycleKind::Resume => (
                format!(
                    "resume after cycle {}: checked {} acks already on the ledger",
                    self.cycle, self.checked
                ),
                format!(
                    "broker: port up {:.1} ms, metadata {:.1} ms after the controller started",
                    self.port_up_ms, self.metadata_ok_ms
                ),
            ),
            CycleKind::Cut => (
                format!(
                    "cycle {}: cut {:.0} ms into the load; sent {}, acked {}, unacked {}; checked {} acks",
                    self.cycle, self.cut_after_ms, self.sent, self.acked, self.unacked, self.checked
                ),
                format!(
                    "recovery: port up {:.1} ms, metadata {:.1} ms after the cut (cut command {:.1} ms)",
                    self.port_up_ms, self.metadata_ok_ms, self.cut_ms
                ),
            ),
        };
        write!(
            f,
            "{head}: lost-acked {}, checksum failures {}, survivors {}, duplicates {}; {tail}",
            self.lost_acked, self.checksum_failures, self.survivors, self.duplicates
        )?;
        if let Some(r) = &self.broker_report {
            write!(f, "\n  broker: {}", r.replace('\n', "\n  broker: "))?;
        }
        for l in &self.lost_examples {
            write!(
                f,
                "\n  LOST {} at {}/{}: {}",
                l.id, l.partition, l.offset, l.what
            )?;
        }
        for x in &self.fault_examples {
            write!(f, "\n  CHECKSUM {}/{}: {}", x.partition, x.offset, x.what)?;
        }
        if self.ledger_torn_tail && self.kind == CycleKind::Resume {
            write!(f, "\n  ledger: a torn last line was ignored and cut off")?;
        } else if self.ledger_torn_tail {
            write!(f, "\n  ledger: a torn last line was ignored")?;
        }
        Ok(())
    }
}

impl std::fmt::Display for RunReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = &self.totals;
        writeln!(
            f,
            "{} after {} cycles (seed {}, topic {}, ledger {})",
            if t.passed { "PASS" } else { "FAIL" },
            t.cycles,
            self.seed,
            self.topic,
            self.ledger
        )?;
        if let Some(r) = &self.resumed {
            let seeds: Vec<String> = r.seeds_before.iter().map(u64::to_string).collect();
            writeln!(
                f,
                "  resumed: the ledger held {} acks from {} cycles ({} sent; seeds {}); this session ran from cycle {}",
                r.acked_before,
                r.cycles_before,
                r.sent_before,
                seeds.join(" "),
                r.first_cycle
            )?;
        }
        writeln!(
            f,
            "  sent {}, acked {}, lost-acked {}, checksum failures {}, survivors {}, duplicates {}",
            t.sent, t.acked, t.lost_acked, t.checksum_failures, t.survivors, t.duplicates
        )?;
        writeln!(
            f,
            "  recovery (cut to first good metadata): min {:.1} ms, median {:.1} ms, max {:.1} ms",
            t.recovery_ms_min, t.recovery_ms_median, t.recovery_ms_max
        )?;
        let moments: Vec<String> = t.cut_after_ms.iter().map(|m| format!("{m:.0}")).collect();
        write!(
            f,
            "  cut moments (ms into each cycle's load, this session): {}",
            moments.join(" ")
        )
    }
}
