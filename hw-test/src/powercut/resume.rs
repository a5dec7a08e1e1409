//! Picking a run up from its ledger after the controller itself stopped (its machine rebooted,
//! Ctrl-C, a hook that hung and was killed): the ledger must be the same run's, its torn last line
//! goes, and what it held is summed up for the report.

use std::collections::{BTreeMap, BTreeSet};

use crate::powercut::ledger::{Contents, Ledger};
use crate::powercut::report::Resumed;
use crate::powercut::{RigError, RigOptions};

/// Reads the ledger at `o.ledger`, refuses it if it is of another topic, partition count or
/// record size than `o` asks for, and opens it to append (its torn last line cut off).
pub fn open(o: &RigOptions) -> Result<(Ledger, Contents), RigError> {
    let c = crate::powercut::ledger::read(&o.ledger)?;
    let h = &c.header;
    let differs = |option, what: String| {
        Err(RigError::Option {
            option,
            what: format!(
                "the run in ledger {} has {what}; a resumed run keeps its own",
                o.ledger.display()
            ),
        })
    };
    if h.topic != o.topic {
        return differs("--topic", format!("topic {}, not {}", h.topic, o.topic));
    }
    if h.partitions != o.partitions {
        return differs(
            "--partitions",
            format!("{} partitions, not {}", h.partitions, o.partitions),
        );
    }
    if h.body_len != o.body_len {
        return differs(
            "--body-min/--body-max",
            format!(
                "bodies of {}..={} bytes, not {}..={}",
                h.body_len.0, h.body_len.1, o.body_len.0, o.body_len.1
            ),
        );
    }
    let l = Ledger::resume(&o.ledger, &c)?;
    Ok((l, c))
}

/// What the ledger says about the run before this session; `first_cycle` is where it goes on.
pub fn summary(c: &Contents, first_cycle: u32) -> Resumed {
    let cut: BTreeSet<u32> = c.cuts.iter().map(|m| m.cycle).collect();
    let mut acks_per_cycle: BTreeMap<u32, u64> = BTreeMap::new();
    for e in &c.entries {
        *acks_per_cycle.entry(e.id.cycle).or_default() += 1;
    }
    // A cycle without a cut mark (the one the controller stopped in, or any cycle of a ledger
    // from before the marks) counts what is known of it: its acks.
    let unmarked: u64 = acks_per_cycle
        .iter()
        .filter(|(cycle, _)| !cut.contains(cycle))
        .map(|(_, n)| n)
        .sum();
    let old_format = c.starts.is_empty() && c.cuts.is_empty();
    let mut seeds = vec![c.header.seed];
    for m in &c.starts {
        if seeds.last() != Some(&m.seed) {
            seeds.push(m.seed);
        }
    }
    Resumed {
        cycles_before: if old_format {
            c.highest_cycle()
        } else {
            cut.len() as u32
        },
        sent_before: c.cuts.iter().map(|m| m.sent).sum::<u64>() + unmarked,
        acked_before: c.entries.len() as u64,
        first_cycle,
        seeds_before: seeds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::powercut::ledger::{CycleCut, CycleStart, Entry, Header};
    use crate::powercut::payload::RecordId;

    fn entry(cycle: u32, seq: u64) -> Entry {
        Entry {
            partition: 0,
            offset: seq as i64,
            id: RecordId {
                cycle,
                producer: 0,
                seq,
            },
            len: 50,
            hash: 1,
        }
    }

    fn contents(entries: Vec<Entry>, starts: Vec<CycleStart>, cuts: Vec<CycleCut>) -> Contents {
        Contents {
            header: Header {
                run: 1,
                seed: 5,
                topic: "t".into(),
                partitions: 1,
                body_len: (1, 2),
            },
            entries,
            starts,
            cuts,
            torn_tail: false,
            good_len: 0,
        }
    }

    #[test]
    fn the_summary_counts_marked_cuts_and_the_acks_of_the_cycle_stopped_in() {
        let start = |cycle, seed| CycleStart { cycle, seed };
        let c = contents(
            vec![
                entry(1, 1),
                entry(1, 2),
                entry(2, 1),
                entry(3, 1),
                entry(3, 2),
            ],
            vec![start(1, 5), start(2, 5), start(3, 8)],
            vec![
                CycleCut { cycle: 1, sent: 10 },
                CycleCut { cycle: 2, sent: 7 },
            ],
        );
        let s = summary(&c, 4);
        assert_eq!(s.cycles_before, 2);
        assert_eq!(s.sent_before, 10 + 7 + 2);
        assert_eq!(s.acked_before, 5);
        assert_eq!(s.first_cycle, 4);
        assert_eq!(s.seeds_before, vec![5, 8]);
    }

    #[test]
    fn a_ledger_without_marks_counts_its_cycles_from_its_acks() {
        let c = contents(vec![entry(1, 1), entry(4, 1)], vec![], vec![]);
        let s = summary(&c, 5);
        assert_eq!(s.cycles_before, 4);
        assert_eq!(s.sent_before, 2);
        assert_eq!(s.seeds_before, vec![5]);
    }
}
