//! `/metrics` of a node of a cluster: the Raft group that carries every partition (so its
//! figures are every partition's replication figures), and, on the leader, each voter's
//! position: matched index, bytes and time behind, time since its last answer, in sync or not.
//! Every series carries `group="<g>"`; the voters' carry `voter="<id>"` too.

use std::fmt::Write as _;

use frontend::replica::{QuorumStatus, GROUP};

/// An index as a gauge value: -1 for none yet.
fn index(i: Option<u64>) -> f64 {
    i.map_or(-1.0, |i| i as f64)
}

pub fn render(out: &mut String, st: &QuorumStatus) {
    let g = format!("group=\"{GROUP}\"");
    let group: [(&str, &str, f64); 9] = [
        (
            "nvmq_raft_term",
            "The group's Raft term: every partition's leader epoch.",
            st.term as f64,
        ),
        (
            "nvmq_raft_leader",
            "The node that leads the group as this node knows it (-1: none).",
            st.leader.map_or(-1.0, |l| l as f64),
        ),
        (
            "nvmq_raft_is_leader",
            "1 while this node leads the group.",
            u8::from(st.is_leader).into(),
        ),
        (
            "nvmq_raft_last_index",
            "The last index of this node's copy of the group's log (-1: empty).",
            index(st.last_index),
        ),
        (
            "nvmq_raft_committed_index",
            "The last index this node knows committed (on a majority's devices).",
            index(st.committed),
        ),
        (
            "nvmq_raft_applied_index",
            "The last index this node applied to its partitions.",
            index(st.applied),
        ),
        (
            "nvmq_raft_snapshot_index",
            "The last index this node's newest snapshot covers (-1: none).",
            index(st.snapshot),
        ),
        (
            "nvmq_raft_purged_index",
            "The last index this node purged from its log (-1: none).",
            index(st.purged),
        ),
        (
            "nvmq_raft_log_entries",
            "The entries this node's log holds, in memory too (-1: its store stopped).",
            st.entries_held.map_or(-1.0, |n| n as f64),
        ),
    ];
    for (name, help, v) in group {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{g}}} {v}"
        );
    }
    let proposed = [
        (
            "nvmq_raft_proposed_entries_total",
            "Entries this node submitted to the group as its leader, since it started.",
            st.proposed_entries,
        ),
        (
            "nvmq_raft_proposed_commands_total",
            "Commands (record batches, topics) those entries carried: several an entry when producers send faster than entries replicate.",
            st.proposed_commands,
        ),
    ];
    for (name, help, v) in proposed {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{g}}} {v}"
        );
    }
    if st.voters.is_empty() {
        return;
    }
    type VoterSeries = (
        &'static str,
        &'static str,
        fn(&frontend::replica::VoterStatus) -> f64,
    );
    let voters: [VoterSeries; 5] = [
        (
            "nvmq_raft_voter_matched_index",
            "On the leader: the last index each voter's log matches the leader's at (-1: none).",
            |v| index(v.matched),
        ),
        (
            "nvmq_raft_voter_bytes_behind",
            "On the leader: request bytes of the entries each voter does not hold yet (-1: the group stopped).",
            |v| v.bytes_behind.map_or(-1.0, |b| b as f64),
        ),
        (
            "nvmq_raft_voter_behind_seconds",
            "On the leader: how long each voter has lacked entries the leader had (0: holds all).",
            |v| v.behind_for.as_secs_f64(),
        ),
        (
            "nvmq_raft_voter_last_answer_seconds",
            "On the leader: time since each voter last answered (-1: never, this term).",
            |v| v.last_answer.map_or(-1.0, |d| d.as_secs_f64()),
        ),
        (
            "nvmq_raft_voter_in_sync",
            "On the leader: 1 for a voter whose log matches up to the committed index.",
            |v| u8::from(v.in_sync).into(),
        ),
    ];
    for (name, help, f) in voters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for v in &st.voters {
            let _ = writeln!(out, "{name}{{{g},voter=\"{}\"}} {}", v.id, f(v));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use frontend::replica::VoterStatus;

    use super::*;

    #[test]
    fn the_leader_shows_each_voters_position() {
        let voter = |id, matched, behind_ms, in_sync| VoterStatus {
            id,
            matched,
            bytes_behind: Some(100 * id),
            last_answer: (id != 3).then_some(Duration::from_millis(5)),
            behind_for: Duration::from_millis(behind_ms),
            in_sync,
        };
        let st = QuorumStatus {
            node_id: 1,
            leader: Some(1),
            term: 4,
            is_leader: true,
            last_index: Some(40),
            committed: Some(38),
            applied: Some(38),
            snapshot: Some(30),
            purged: Some(20),
            entries_held: Some(20),
            proposed_entries: 12,
            proposed_commands: 50,
            voters: vec![
                voter(1, Some(40), 0, true),
                voter(2, Some(38), 20, true),
                voter(3, None, 1500, false),
            ],
        };
        let mut out = String::new();
        render(&mut out, &st);
        for line in [
            "nvmq_raft_term{group=\"1\"} 4",
            "nvmq_raft_leader{group=\"1\"} 1",
            "nvmq_raft_is_leader{group=\"1\"} 1",
            "nvmq_raft_committed_index{group=\"1\"} 38",
            "nvmq_raft_snapshot_index{group=\"1\"} 30",
            "nvmq_raft_purged_index{group=\"1\"} 20",
            "nvmq_raft_log_entries{group=\"1\"} 20",
            "nvmq_raft_proposed_entries_total{group=\"1\"} 12",
            "nvmq_raft_proposed_commands_total{group=\"1\"} 50",
            "nvmq_raft_voter_matched_index{group=\"1\",voter=\"2\"} 38",
            "nvmq_raft_voter_matched_index{group=\"1\",voter=\"3\"} -1",
            "nvmq_raft_voter_bytes_behind{group=\"1\",voter=\"3\"} 300",
            "nvmq_raft_voter_behind_seconds{group=\"1\",voter=\"3\"} 1.5",
            "nvmq_raft_voter_last_answer_seconds{group=\"1\",voter=\"3\"} -1",
            "nvmq_raft_voter_in_sync{group=\"1\",voter=\"3\"} 0",
            "nvmq_raft_voter_in_sync{group=\"1\",voter=\"2\"} 1",
        ] {
            assert!(out.lines().any(|l| l == line), "no {line:?} in\n{out}");
        }
    }

    #[test]
    fn a_follower_shows_the_group_but_no_voters() {
        let st = QuorumStatus {
            node_id: 2,
            leader: None,
            term: 7,
            is_leader: false,
            last_index: None,
            committed: None,
            applied: None,
            snapshot: None,
            purged: None,
            entries_held: None,
            proposed_entries: 0,
            proposed_commands: 0,
            voters: Vec::new(),
        };
        let mut out = String::new();
        render(&mut out, &st);
        assert!(out.contains("nvmq_raft_leader{group=\"1\"} -1\n"), "{out}");
        assert!(
            out.contains("nvmq_raft_last_index{group=\"1\"} -1\n"),
            "{out}"
        );
        assert!(
            out.contains("nvmq_raft_log_entries{group=\"1\"} -1\n"),
            "{out}"
        );
        assert!(!out.contains("voter="), "{out}");
    }
}
