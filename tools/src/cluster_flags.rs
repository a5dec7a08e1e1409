//! `serve --node-id N --peers ...`: the cluster a broker joins (docs/cluster.md "Running a
//! cluster"), checked before anything opens.

use std::collections::BTreeMap;
use std::net::ToSocketAddrs;

use anyhow::{anyhow, bail, Context, Result};
use frontend::replica::{ClusterOptions, MemberAddrs};

/// One `--peers` entry: `ID=KAFKA_HOST:PORT/INTERNAL_HOST:PORT`.
fn parse_member(entry: &str) -> Result<(u64, MemberAddrs)> {
    let (id, addrs) = entry
        .split_once('=')
        .ok_or_else(|| anyhow!("--peers entry {entry:?}: expected ID=KAFKA_ADDR/INTERNAL_ADDR"))?;
    let id: u64 = id
        .trim()
        .parse()
        .with_context(|| format!("--peers entry {entry:?}: node id {id:?}"))?;
    let (kafka, internal) = addrs.split_once('/').ok_or_else(|| {
        anyhow!("--peers entry {entry:?}: expected KAFKA_ADDR/INTERNAL_ADDR after the '='")
    })?;
    for (what, a) in [("Kafka", kafka), ("internal", internal)] {
        let port = a.rsplit_once(':').map(|(_, p)| p.parse::<u16>());
        if !matches!(port, Some(Ok(p)) if p > 0) {
            bail!("--peers entry {entry:?}: {what} address {a:?} is not HOST:PORT");
        }
    }
    Ok((
        id,
        MemberAddrs {
            kafka: kafka.to_string(),
            internal: internal.to_string(),
        },
    ))
}

/// The cluster of `--node-id` and `--peers`; None when neither is given (a single broker).
/// The peers' internal traffic is not authenticated yet: an internal address off loopback
/// needs `insecure_network`.
pub fn parse(
    node_id: Option<u64>,
    peers: &[String],
    insecure_network: bool,
    compact_every: u64,
    merge_commands: usize,
) -> Result<Option<ClusterOptions>> {
    let Some(node_id) = node_id else {
        if peers.is_empty() {
            return Ok(None);
        }
        bail!("--peers needs --node-id (which of them this node is)");
    };
    let mut members = BTreeMap::new();
    for entry in peers.iter().filter(|e| !e.trim().is_empty()) {
        let (id, addrs) = parse_member(entry.trim())?;
        if members.insert(id, addrs).is_some() {
            bail!("--peers names node {id} twice");
        }
    }
    if !members.contains_key(&node_id) {
        bail!("--node-id {node_id} is not one of --peers (every node is listed, this one too)");
    }
    if compact_every == 1 {
        // Each compaction point is an entry itself: a floor that must move by 1 moves at every
        // point written, and an idle cluster would write one every tick.
        bail!("--raft-compact-entries 1: give 0 (never purge) or at least 2");
    }
    if merge_commands == 0 {
        bail!("--raft-merge-commands 0: give at least 1 (1: every command is an entry of its own)");
    }
    if members.len() < 3 {
        bail!(
            "--peers lists {} node(s): a cluster has at least 3, so that one can fail",
            members.len()
        );
    }
    if !insecure_network {
        for (id, a) in &members {
            let loopback = a
                .internal
                .to_socket_addrs()
                .map(|mut it| it.all(|s| s.ip().is_loopback()))
                .unwrap_or(false);
            if !loopback {
                bail!(
                    "node {id}'s internal address {} is not on loopback: the nodes' Raft traffic \
                     is not authenticated yet; pass --insecure-network on a network only the \
                     nodes reach",
                    a.internal
                );
            }
        }
    }
    Ok(Some(ClusterOptions {
        node_id,
        members,
        compact_every,
        merge_commands,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(s: &str) -> Vec<String> {
        s.split(',').map(String::from).collect()
    }

    const THREE: &str = "1=127.0.0.1:9092/127.0.0.1:9192,2=127.0.0.1:9093/127.0.0.1:9193,\
                         3=127.0.0.1:9094/127.0.0.1:9194";

    #[test]
    fn a_cluster_of_three_on_loopback_parses() {
        let c = parse(Some(2), &peers(THREE), false, 4096, 1024)
            .expect("parse")
            .expect("a cluster");
        assert_eq!(c.node_id, 2);
        assert_eq!(c.members.len(), 3);
        assert_eq!(c.members[&3].kafka, "127.0.0.1:9094");
        assert_eq!(c.members[&3].internal, "127.0.0.1:9194");
        assert_eq!(
            parse(None, &[], false, 4096, 1024).expect("no cluster"),
            None
        );
    }

    #[test]
    fn bad_peers_are_refused_by_name() {
        let cases: &[(Option<u64>, &str, &str)] = &[
            (Some(4), THREE, "--node-id 4 is not one of --peers"),
            (None, THREE, "--peers needs --node-id"),
            (Some(1), "1=127.0.0.1:9092/127.0.0.1:9192", "at least 3"),
            (Some(1), "x=a:1/b:2", "node id \"x\""),
            (
                Some(1),
                "1=127.0.0.1:9092",
                "expected KAFKA_ADDR/INTERNAL_ADDR",
            ),
            (
                Some(1),
                "1:127.0.0.1:9092",
                "expected ID=KAFKA_ADDR/INTERNAL_ADDR",
            ),
            (
                Some(1),
                "1=127.0.0.1/127.0.0.1:9192",
                "Kafka address \"127.0.0.1\"",
            ),
            (
                Some(1),
                "1=127.0.0.1:9092/127.0.0.1:0",
                "internal address \"127.0.0.1:0\"",
            ),
            (
                Some(1),
                "1=a:1/127.0.0.1:2,1=a:1/127.0.0.1:3,2=a:1/127.0.0.1:4",
                "names node 1 twice",
            ),
            (
                Some(1),
                "1=a:1/127.0.0.1:2,2=a:1/127.0.0.1:3,3=a:1/10.1.2.3:4",
                "--insecure-network",
            ),
        ];
        for (id, p, want) in cases {
            let e = parse(*id, &peers(p), false, 4096, 1024).expect_err(p);
            let e = format!("{e:#}");
            assert!(e.contains(want), "{p}: {e:?} lacks {want:?}");
        }
        let e = parse(Some(2), &peers(THREE), false, 1, 1024).expect_err("compacting every entry");
        assert!(format!("{e:#}").contains("at least 2"), "{e:#}");
        let open = "1=a:1/127.0.0.1:2,2=a:1/127.0.0.1:3,3=a:1/10.1.2.3:4";
        assert!(parse(Some(1), &peers(open), true, 4096, 1024).is_ok());
    }
}
