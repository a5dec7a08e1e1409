//! Snapshots of a group whose entries an applier turns into node state: the snapshot carries the
//! applier's bookkeeping, taken between two applies, written only once the applier says the
//! entries it covers are durable on the node, and restored into the applier at open; a node
//! whose applier does not hold what a snapshot counts refuses it by name, at open and at
//! install, writing nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common;

use common::Node;
use nvmq_cluster::{
    open_applied_group, Applier, ApplyResult, Capture, ClusterError, Entry, LogId, Restore,
    SnapshotMeta, StateMachine,
};
use openraft::storage::RaftStateMachine;
use openraft::RaftSnapshotBuilder;
use tokio::sync::watch;

const GROUP: u32 = 6;

fn id(index: u64) -> LogId {
    LogId::new_term_index(2, index)
}

fn entry(index: u64) -> Entry {
    common::normal(2, index, vec![index as u8])
}

/// Counts the entries applied; its "device" holds `durable` of them, which the test moves.
struct Counting {
    applied: Arc<AtomicU64>,
    durable: watch::Sender<u64>,
}

impl Counting {
    fn holding(durable: u64) -> Arc<Counting> {
        Arc::new(Counting {
            applied: Arc::new(AtomicU64::new(0)),
            durable: watch::Sender::new(durable),
        })
    }
}

impl Applier for Counting {
    fn apply<'a>(
        &'a self,
        _index: u64,
        _data: &'a [u8],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ApplyResult> + Send + 'a>> {
        self.applied.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(Vec::new()) })
    }

    fn capture(&self) -> Result<Capture, String> {
        let n = self.applied.load(Ordering::SeqCst);
        let mut rx = self.durable.subscribe();
        Ok(Capture {
            data: n.to_le_bytes().to_vec(),
            durable: Box::pin(async move {
                rx.wait_for(|&d| d >= n)
                    .await
                    .map(|_| ())
                    .map_err(|_| "gone".to_string())
            }),
        })
    }

    fn restore(&self, data: &[u8]) -> Result<Restore, String> {
        let n = u64::from_le_bytes(data.try_into().map_err(|_| "not 8 bytes")?);
        let held = *self.durable.borrow();
        if held < n {
            return Err(format!(
                "the device holds {held} entries, the snapshot counts {n}"
            ));
        }
        let applied = self.applied.clone();
        Ok(Box::new(move || applied.store(n, Ordering::SeqCst)))
    }
}

async fn apply(sm: &mut StateMachine, range: std::ops::RangeInclusive<u64>) -> Result<(), String> {
    let items: Vec<_> = range.map(|i| Ok((entry(i), None))).collect();
    sm.apply(futures::stream::iter(items))
        .await
        .map_err(|e| e.to_string())
}

/// The index the group's current snapshot covers (None: no snapshot).
async fn snapshot_of(sm: &mut StateMachine) -> Result<Option<u64>, String> {
    let snap = sm.get_current_snapshot().await.map_err(|e| e.to_string())?;
    Ok(snap.and_then(|s| s.meta.last_log_id).map(|l| l.index))
}

fn open(node: &Node, applier: Arc<Counting>) -> Result<StateMachine, ClusterError> {
    open_applied_group(node.log.clone(), GROUP, applier).map(|(_, sm)| sm)
}

#[tokio::test(flavor = "current_thread")]
async fn a_snapshot_waits_until_its_entries_are_durable_and_a_restart_starts_from_it(
) -> Result<(), String> {
    let node = Node::new(61)?;
    let applier = Counting::holding(0);
    let (mut ls, mut sm) =
        open_applied_group(node.log.clone(), GROUP, applier.clone()).map_err(|e| e.to_string())?;
    common::append(&mut ls, (1..=6).map(entry).collect())
        .await
        .map_err(|e| e.to_string())?;
    apply(&mut sm, 1..=5).await?;

    let mut builder = sm.get_snapshot_builder().await;
    // Applied after the capture: the snapshot still covers 5 entries.
    apply(&mut sm, 6..=6).await?;
    let mut build = Box::pin(builder.build_snapshot());
    let early = tokio::time::timeout(Duration::from_millis(200), &mut build).await;
    assert!(
        early.is_err(),
        "written before the applier's entries were durable"
    );
    assert_eq!(snapshot_of(&mut sm).await?, None);
    applier.durable.send_replace(5);
    let snap = build.await.map_err(|e| e.to_string())?;
    assert_eq!(snapshot_of(&mut sm).await?, Some(5));
    assert_eq!(snap.meta.last_log_id, Some(id(5)));
    assert_eq!(snap.snapshot, 5u64.to_le_bytes().to_vec());
    drop((ls, sm));

    // Through a power cut: the snapshot was durable when build_snapshot returned.
    let node = node.power_cycle()?;
    let restarted = Counting::holding(5);
    let mut sm = open(&node, restarted.clone()).map_err(|e| e.to_string())?;
    let (last, _) = sm.applied_state().await.map_err(|e| e.to_string())?;
    assert_eq!(
        last,
        Some(id(5)),
        "openraft re-applies from after the snapshot"
    );
    assert_eq!(restarted.applied.load(Ordering::SeqCst), 5);
    drop(sm);

    // A node whose device holds less than the snapshot counts refuses to open, by name.
    let short = open(&node, Counting::holding(3)).err();
    let Some(ClusterError::Snapshot { op, index, why, .. }) = &short else {
        panic!("opened over a device holding less than its snapshot: {short:?}");
    };
    assert_eq!((*op, *index), ("restore the snapshot", Some(5)));
    assert!(
        why.contains("holds 3 entries, the snapshot counts 5"),
        "{why}"
    );
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn a_snapshot_from_the_leader_that_the_node_does_not_hold_is_refused_and_not_written(
) -> Result<(), String> {
    let node = Node::new(62)?;
    let applier = Counting::holding(2);
    let mut sm = open(&node, applier.clone()).map_err(|e| e.to_string())?;
    let meta = SnapshotMeta {
        last_log_id: Some(id(9)),
        last_membership: Default::default(),
    };
    let refused = sm
        .install_snapshot(&meta, 9u64.to_le_bytes().to_vec())
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        refused.contains("restore the snapshot (entries through 9)"),
        "{refused}"
    );
    assert!(
        refused.contains("holds 2 entries, the snapshot counts 9"),
        "{refused}"
    );
    assert_eq!(snapshot_of(&mut sm).await?, None);
    let (last, _) = sm.applied_state().await.map_err(|e| e.to_string())?;
    assert_eq!(last, None);
    assert_eq!(applier.applied.load(Ordering::SeqCst), 0);

    // One it holds is installed, durably.
    let held = SnapshotMeta {
        last_log_id: Some(id(2)),
        last_membership: Default::default(),
    };
    sm.install_snapshot(&held, 2u64.to_le_bytes().to_vec())
        .await
        .map_err(|e| e.to_string())?;
    drop(sm);
    let node = node.power_cycle()?;
    let restarted = Counting::holding(2);
    let mut sm = open(&node, restarted.clone()).map_err(|e| e.to_string())?;
    let (last, _) = sm.applied_state().await.map_err(|e| e.to_string())?;
    assert_eq!(last, Some(id(2)));
    assert_eq!(restarted.applied.load(Ordering::SeqCst), 2);
    Ok(())
}
