//! `GroupLog::bytes_after`: how many request bytes a follower matched up to an index still has
//! to receive (what `nvmq cluster status` and `/metrics` show as bytes behind). Counts only the
//! entries the group holds: purged ones are gone, truncated ones were never there.

use crate::common;

use std::collections::BTreeSet;

use common::{append, Node};
use nvmq_cluster::{Entry, LogId, Request};
use openraft::storage::RaftLogStorage;
use openraft::{EntryPayload, Membership};

const GROUP: u32 = 3;

fn id(index: u64) -> LogId {
    LogId::new_term_index(1, index)
}

/// Entry `index` carries `index * 100` request bytes.
fn normal(index: u64) -> Entry {
    Entry {
        log_id: id(index),
        payload: EntryPayload::Normal(Request::from(vec![7; index as usize * 100])),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn bytes_behind_count_the_requests_after_the_index_the_group_still_holds(
) -> Result<(), String> {
    let node = Node::new(17)?;
    let (mut ls, _sm) = node.open(GROUP).map_err(|e| e.to_string())?;
    let log = ls.group_log().clone();
    let blank = Entry {
        log_id: id(1),
        payload: EntryPayload::Blank,
    };
    let members = Entry {
        log_id: id(2),
        payload: EntryPayload::Membership(Membership::new_with_defaults(
            vec![BTreeSet::from([1u64, 2, 3])],
            [],
        )),
    };
    let mut entries = vec![blank, members];
    entries.extend((3..=6).map(normal));
    append(&mut ls, entries).await.map_err(|e| e.to_string())?;

    let after = |i: Option<u64>| log.bytes_after(i).map_err(|e| e.to_string());
    // Blank and membership entries carry no request bytes.
    assert_eq!(after(None)?, 300 + 400 + 500 + 600);
    assert_eq!(after(Some(2))?, 300 + 400 + 500 + 600);
    assert_eq!(after(Some(4))?, 500 + 600);
    assert_eq!(after(Some(6))?, 0);
    assert_eq!(after(Some(60))?, 0);

    ls.truncate_after(Some(id(5)))
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(after(Some(4))?, 500, "a truncated entry still counted");
    ls.purge(id(4)).await.map_err(|e| e.to_string())?;
    assert_eq!(after(None)?, 500, "a purged entry still counted");
    Ok(())
}
