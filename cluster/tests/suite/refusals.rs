//! What the store refuses, with an error naming the group and what was wrong: a log that acks
//! before its flush, and a truncation below the committed index (which also writes nothing).

use crate::common;

use common::Node;
use nvmq_cluster::{open_group, ClusterError, Entry, LogId, Request};
use nvmq_log::config::{FlushMode, LogConfig};
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::type_config::TypeConfigExt;
use openraft::EntryPayload;

fn id(index: u64) -> LogId {
    LogId::new_term_index(1, index)
}

#[test]
fn a_log_that_acks_before_its_flush_is_refused() {
    for flush in [
        FlushMode::Never,
        FlushMode::Interval(std::time::Duration::from_millis(5)),
    ] {
        let cfg = LogConfig {
            flush,
            ..LogConfig::default()
        };
        let node = Node::with(31, &common::format_options(), cfg).unwrap_or_else(|e| panic!("{e}"));
        match open_group(node.log.clone(), 9) {
            Err(e @ ClusterError::RelaxedFlush { group: 9, .. }) => {
                assert!(e.to_string().contains("needs flush = always"), "{e}")
            }
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => panic!("a group was opened on a log in flush mode {flush:?}"),
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn truncating_below_the_committed_index_fails_and_drops_nothing() {
    let node = Node::new(32).unwrap_or_else(|e| panic!("{e}"));
    let (mut ls, sm) = node.open(2).unwrap_or_else(|e| panic!("{e}"));
    let entries: Vec<Entry> = (1..=4)
        .map(|i| Entry {
            log_id: id(i),
            payload: EntryPayload::Normal(Request::from(vec![i as u8])),
        })
        .collect();
    let (tx, rx) = nvmq_cluster::TypeConfig::oneshot();
    let appended = ls.append(entries.clone(), IOFlushed::signal(tx)).await;
    assert!(appended.is_ok(), "{appended:?}");
    assert!(matches!(rx.await, Ok(Ok(()))));
    assert!(ls.save_committed(Some(id(3))).await.is_ok());

    let err = ls
        .truncate_after(Some(id(2)))
        .await
        .err()
        .map(|e| e.to_string());
    let err = err.unwrap_or_default();
    assert!(
        err.contains("raft group 2") && err.contains("below the committed index 3"),
        "{err}"
    );
    assert!(ls.truncate_after(None).await.is_err());
    // Nothing was dropped, in memory or on the device.
    let held = ls.group_log().current().map(|s| s.entries.len());
    assert_eq!(held.map_err(|e| e.to_string()), Ok(4));
    assert!(ls.truncate_after(Some(id(3))).await.is_ok());
    drop((ls, sm));
    let node = node.power_cycle().unwrap_or_else(|e| panic!("{e}"));
    let (ls, _sm) = node.open(2).unwrap_or_else(|e| panic!("{e}"));
    let kept = ls
        .group_log()
        .current()
        .map(|s| s.entries.into_values().collect::<Vec<_>>());
    assert_eq!(kept.map_err(|e| e.to_string()), Ok(entries[..3].to_vec()));
}
