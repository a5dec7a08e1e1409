//! A group's state survives the log's ring wrapping over the records that first held it (with
//! a checkpoint every quarter ring) and a power cut; without checkpoints, open refuses the
//! group by name instead of running with a lost vote.

use crate::common;

use common::Node;
use nvmq_cluster::{ClusterError, Entry, LogId, LogStore, Request, StateMachine, Vote};
use openraft::storage::{IOFlushed, RaftLogStorage, RaftStateMachine};
use openraft::type_config::TypeConfigExt;
use openraft::{EntryPayload, RaftSnapshotBuilder};

const GROUP: u32 = 4;
const QUARTER_RING: u64 = 256 << 10;

fn id(term: u64, index: u64) -> LogId {
    LogId::new_term_index(term, index)
}

fn entry(index: u64) -> Entry {
    Entry {
        log_id: id(5, index),
        payload: EntryPayload::Normal(Request::from(format!("entry {index}").into_bytes())),
    }
}

/// Vote, entries 1..=4, a snapshot through 2, a purge through 2, commit at 2.
async fn set_up(ls: &mut LogStore, sm: &mut StateMachine) -> Result<(), String> {
    let e = |e: std::io::Error| e.to_string();
    ls.save_vote(&Vote::new_committed(5, 2)).await.map_err(e)?;
    let (tx, rx) = nvmq_cluster::TypeConfig::oneshot();
    let entries: Vec<Entry> = (1..=4).map(entry).collect();
    ls.append(entries.clone(), IOFlushed::signal(tx))
        .await
        .map_err(e)?;
    rx.await
        .map_err(|_| "append callback dropped")?
        .map_err(e)?;
    let items: Vec<_> = entries[..2].iter().map(|e| Ok((e.clone(), None))).collect();
    sm.apply(futures::stream::iter(items)).await.map_err(e)?;
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .map_err(e)?;
    ls.purge(id(5, 2)).await.map_err(e)?;
    ls.save_committed(Some(id(5, 2))).await.map_err(e)?;
    Ok(())
}

/// Appends 3 MiB to another partition (three laps of the 1 MiB ring), checkpointing the group
/// when due if `ls` is given.
async fn fill(node: &Node, ls: Option<&LogStore>) -> Result<(), String> {
    let filler = node
        .log
        .create_partition("filler", 0)
        .map_err(|e| e.to_string())?;
    for i in 0..768u32 {
        node.log
            .append_wait(filler, vec![(i % 251) as u8; 4000])
            .map_err(|e| format!("filler {i}: {e}"))?;
        if let Some(ls) = ls {
            ls.group_log()
                .checkpoint_due(QUARTER_RING)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// The group's first retained offset: above 0 once the ring freed its first records.
fn group_start(node: &Node) -> u64 {
    let id = node.log.partition_id(nvmq_cluster::RAFT_TOPIC, GROUP);
    id.and_then(|p| node.log.partition(p))
        .map_or(0, |v| v.start_offset)
}

#[tokio::test(flavor = "current_thread")]
async fn vote_purge_snapshot_and_entries_survive_three_laps_of_the_ring_and_a_cut() {
    let (fmt, cfg) = common::small_ring();
    let node = Node::with(21, &fmt, cfg).unwrap_or_else(|e| panic!("{e}"));
    let (mut ls, mut sm) = node.open(GROUP).unwrap_or_else(|e| panic!("{e}"));
    set_up(&mut ls, &mut sm)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    fill(&node, Some(&ls))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        group_start(&node) > 0,
        "the ring never freed the group's first records"
    );
    drop((ls, sm));

    let node = node.power_cycle().unwrap_or_else(|e| panic!("{e}"));
    let (ls, sm) = node.open(GROUP).unwrap_or_else(|e| panic!("{e}"));
    let st = ls.group_log().current().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(st.vote, Some(Vote::new_committed(5, 2)));
    assert_eq!(st.purged, Some(id(5, 2)));
    assert_eq!(st.committed, Some(id(5, 2)));
    assert_eq!(
        st.entries.values().cloned().collect::<Vec<_>>(),
        vec![entry(3), entry(4)]
    );
    let applied = sm.applied().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(applied.last, Some(id(5, 2)));
    let data: Vec<_> = applied.data.into_values().collect();
    assert_eq!(data, vec![b"entry 1".to_vec(), b"entry 2".to_vec()]);
}

#[tokio::test(flavor = "current_thread")]
async fn without_checkpoints_a_wrapped_group_is_refused_by_name() {
    let (fmt, cfg) = common::small_ring();
    let node = Node::with(22, &fmt, cfg).unwrap_or_else(|e| panic!("{e}"));
    let (mut ls, mut sm) = node.open(GROUP).unwrap_or_else(|e| panic!("{e}"));
    set_up(&mut ls, &mut sm)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    drop((ls, sm));
    fill(&node, None).await.unwrap_or_else(|e| panic!("{e}"));
    let node = node.power_cycle().unwrap_or_else(|e| panic!("{e}"));
    match node.open(GROUP) {
        Err(e @ ClusterError::StateLost { group: GROUP, .. }) => {
            assert!(e.to_string().contains("raft group 4"), "{e}");
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a group whose vote the ring freed was opened"),
    }
}

/// A group whose live entries outgrow a quarter ring (a voter that is down holds back their
/// purge) checkpoints after twice what its last checkpoint wrote, not at every look: measured
/// from where the checkpoint ended, its own bytes never make the next one due.
#[tokio::test(flavor = "current_thread")]
async fn a_large_live_log_is_checkpointed_at_a_pace_its_size_sets() {
    let (fmt, cfg) = common::small_ring();
    let node = Node::with(23, &fmt, cfg).unwrap_or_else(|e| panic!("{e}"));
    let (mut ls, _sm) = node.open(GROUP).unwrap_or_else(|e| panic!("{e}"));
    // 80 live entries of 4 KiB: 320 KiB, more than the 256 KiB quarter ring.
    let entries: Vec<Entry> = (1..=80)
        .map(|i| common::normal(5, i, vec![(i % 251) as u8; 4096]))
        .collect();
    common::append(&mut ls, entries)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let filler = node
        .log
        .create_partition("filler", 0)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut checkpoints = 0u64;
    let from = node.log.durable();
    // 160 other writes of 4000 bytes, looking before each.
    for i in 0..160u32 {
        let due = ls
            .group_log()
            .checkpoint_due(QUARTER_RING)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        checkpoints += u64::from(due);
        node.log
            .append_wait(filler, vec![(i % 251) as u8; 4000])
            .unwrap_or_else(|e| panic!("filler {i}: {e}"));
    }
    // The first look checkpoints (none since open), then one each time the log grew by twice
    // a checkpoint's size: never the 160 a checkpoint that makes itself due again would write.
    let st = ls.group_log().current().unwrap_or_else(|e| panic!("{e}"));
    assert!(st.checkpoint_bytes > 320 << 10, "{}", st.checkpoint_bytes);
    let grown = node.log.durable() - from;
    let most = 1 + grown / (2 * st.checkpoint_bytes);
    println!(
        "{checkpoints} checkpoints of {} bytes while the log grew by {grown}",
        st.checkpoint_bytes
    );
    assert!(
        (2..=most).contains(&checkpoints),
        "{checkpoints} checkpoints of {} bytes while the log grew by {grown} (at most {most})",
        st.checkpoint_bytes
    );
}
