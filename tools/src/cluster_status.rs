//! `nvmq cluster status`: who leads the cluster's Raft group, in which term, what is committed,
//! and where each voter stands (the index its log matches, entries and bytes behind, for how
//! long, when it last answered, in sync or not), asked of a running node with DescribeQuorum.
//! A follower names the leader and where clients reach it; the command then asks the leader.

use std::time::SystemTime;

use anyhow::{anyhow, bail, Context, Result};
use frontend::codes;
use frontend::quorum_api::{ms_since_epoch, BYTES_BEHIND_TAG, QUORUM_TOPIC};
use frontend::replica::GROUP;
use frontend::tls::ClientFiles;
use kafka_protocol::messages::describe_quorum_request::{PartitionData, TopicData};
use kafka_protocol::messages::describe_quorum_response::ReplicaState;
use kafka_protocol::messages::{DescribeQuorumRequest, DescribeQuorumResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use serde::Serialize;

use crate::kafka_bench::dial::Dial;
use crate::Status;

#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Example:\n  nvmq cluster status --bootstrap 127.0.0.1:9092\n\n\
Asks the node with DescribeQuorum (Kafka's KIP-595 API, on the group __nvmq_raft/1); a \
follower names the leader, which is then asked. Exits 0 when every voter is in sync, 6 when \
one is not, 1 when no node answers as leader."
)]
pub struct ClusterArgs {
    /// host:port of any node's Kafka listener (comma-separated: tried in turn).
    #[arg(long, global = true, value_delimiter = ',')]
    pub bootstrap: Vec<String>,
    /// Print one JSON object instead of the table.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(flatten)]
    pub tls: crate::tls_client_flags::TlsClientFlags,
    #[command(subcommand)]
    pub action: ClusterAction,
}

#[derive(clap::Subcommand, Debug, Clone)]
pub enum ClusterAction {
    /// The Raft group's leader, term and committed index, and each voter's position: matched
    /// index, entries and bytes behind, how long it has been behind, its last answer, in sync.
    Status,
}

/// One voter, as printed.
#[derive(Debug, Clone, Serialize)]
pub struct Voter {
    pub node: i32,
    pub leader: bool,
    /// The last index its log matches the leader's at (None: nothing yet).
    pub matched_index: Option<i64>,
    pub entries_behind: i64,
    pub bytes_behind: Option<u64>,
    /// Milliseconds it has lacked entries the leader had (0: holds them all).
    pub behind_ms: i64,
    /// Milliseconds since its last answer to the leader (None: none this term).
    pub last_answer_ms: Option<i64>,
    pub in_sync: bool,
}

/// The group, as printed.
#[derive(Debug, Clone, Serialize)]
pub struct Quorum {
    /// The node that answered (the leader).
    pub asked: String,
    pub group: String,
    pub leader: i32,
    pub term: i32,
    /// The last committed index (None: nothing committed yet).
    pub committed_index: Option<i64>,
    pub voters: Vec<Voter>,
}

fn request() -> DescribeQuorumRequest {
    let mut p = PartitionData::default();
    p.partition_index = GROUP as i32;
    let mut t = TopicData::default();
    t.topic_name = TopicName(StrBytes::from_static_str(QUORUM_TOPIC));
    t.partitions = vec![p];
    let mut r = DescribeQuorumRequest::default();
    r.topics = vec![t];
    r
}

/// What one node said: the group (from the leader), or who leads and where it listens.
enum Answer {
    Leader(Quorum),
    Follower { leader: i32, at: Option<String> },
}

/// An end offset (index + 1) as the index it is one past.
fn index_of(end_offset: i64) -> Option<i64> {
    (end_offset > 0).then(|| end_offset - 1)
}

fn voter(r: &ReplicaState, leader: i32, hw: i64, leo: i64, now_ms: i64) -> Result<Voter> {
    let bytes_behind = match r.unknown_tagged_fields.get(&BYTES_BEHIND_TAG) {
        None => None,
        Some(b) => Some(u64::from_be_bytes(b.as_ref().try_into().map_err(|_| {
            anyhow!(
                "voter {}: bytes-behind field of {} bytes, not 8",
                r.replica_id.0,
                b.len()
            )
        })?)),
    };
    Ok(Voter {
        node: r.replica_id.0,
        leader: r.replica_id.0 == leader,
        matched_index: index_of(r.log_end_offset),
        entries_behind: leo.saturating_sub(r.log_end_offset).max(0),
        bytes_behind,
        behind_ms: now_ms.saturating_sub(r.last_caught_up_timestamp).max(0),
        last_answer_ms: (r.last_fetch_timestamp >= 0)
            .then(|| now_ms.saturating_sub(r.last_fetch_timestamp).max(0)),
        in_sync: r.log_end_offset >= hw,
    })
}

/// Reads one node's DescribeQuorum answer.
fn read_answer(addr: &str, resp: &DescribeQuorumResponse, now_ms: i64) -> Result<Answer> {
    if resp.error_code != 0 {
        let why = resp.error_message.as_ref().map_or("", |m| m.as_str());
        bail!(
            "{addr} refused DescribeQuorum: {} {why}",
            crate::kafka_bench::error_name(resp.error_code)
        );
    }
    let p = resp
        .topics
        .iter()
        .find(|t| t.topic_name.as_str() == QUORUM_TOPIC)
        .and_then(|t| {
            t.partitions
                .iter()
                .find(|p| p.partition_index == GROUP as i32)
        })
        .ok_or_else(|| anyhow!("{addr} answered without the group {QUORUM_TOPIC}/{GROUP}"))?;
    let leader = p.leader_id.0;
    if p.error_code == codes::NOT_LEADER_OR_FOLLOWER {
        let at = resp
            .nodes
            .iter()
            .find(|n| n.node_id.0 == leader)
            .and_then(|n| {
                n.listeners
                    .first()
                    .map(|l| format!("{}:{}", l.host.as_str(), l.port))
            });
        return Ok(Answer::Follower { leader, at });
    }
    if p.error_code != 0 {
        let why = p.error_message.as_ref().map_or("", |m| m.as_str());
        bail!(
            "{addr}: group {QUORUM_TOPIC}/{GROUP}: {} {why}",
            crate::kafka_bench::error_name(p.error_code)
        );
    }
    let leo = p
        .current_voters
        .iter()
        .find(|v| v.replica_id.0 == leader)
        .map_or(p.high_watermark, |v| v.log_end_offset);
    let voters = p
        .current_voters
        .iter()
        .map(|r| voter(r, leader, p.high_watermark, leo, now_ms))
        .collect::<Result<Vec<_>>>()?;
    Ok(Answer::Leader(Quorum {
        asked: addr.to_string(),
        group: format!("{QUORUM_TOPIC}/{GROUP}"),
        leader,
        term: p.leader_epoch,
        committed_index: index_of(p.high_watermark),
        voters,
    }))
}

async fn ask(addr: &str, files: Option<ClientFiles>) -> Result<Answer> {
    let mut c = Dial::new(addr, files)?.client().await?;
    // v2: the answer names every node's listener, so a follower's points at the leader.
    let resp = c
        .call(2, &request())
        .await
        .with_context(|| format!("DescribeQuorum to {addr}"))?;
    let now_ms = ms_since_epoch(SystemTime::now());
    read_answer(addr, &resp, now_ms)
}

/// Asks each bootstrap node in turn, following a follower's pointer to the leader once.
async fn find_leader(args: &ClusterArgs, files: &Option<ClientFiles>) -> Result<Quorum> {
    let mut errors = Vec::new();
    for addr in &args.bootstrap {
        match ask(addr, files.clone()).await {
            Ok(Answer::Leader(q)) => return Ok(q),
            Ok(Answer::Follower { leader, at }) => match at {
                Some(at) => match ask(&at, files.clone()).await {
                    Ok(Answer::Leader(q)) => return Ok(q),
                    Ok(Answer::Follower { .. }) => {
                        errors.push(format!("{addr} named node {leader} at {at}, which does not lead either (an election under way?)"))
                    }
                    Err(e) => errors.push(format!("{addr} named node {leader} at {at}: {e:#}")),
                },
                None => errors.push(format!(
                    "{addr} does not lead and knows no leader yet (an election under way?)"
                )),
            },
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    bail!("no node answered as the leader:\n  {}", errors.join("\n  "))
}

fn fmt_bytes(b: Option<u64>) -> String {
    b.map_or("?".into(), crate::describe::bytes)
}

fn fmt_ms(ms: Option<i64>) -> String {
    match ms {
        None => "never".into(),
        Some(ms) => format!("{:.3} s", ms as f64 / 1000.0),
    }
}

pub fn table(q: &Quorum) -> String {
    let mut out = format!(
        "group {}: leader node {}, term {}, committed index {} (asked {})\n",
        q.group,
        q.leader,
        q.term,
        q.committed_index.map_or("none".into(), |i| i.to_string()),
        q.asked
    );
    out.push_str(&format!(
        "{:>6}  {:<8}  {:>10}  {:>8}  {:>12}  {:>10}  {:>11}  {}\n",
        "node", "role", "matched", "behind", "bytes behind", "behind for", "last answer", "in sync"
    ));
    for v in &q.voters {
        out.push_str(&format!(
            "{:>6}  {:<8}  {:>10}  {:>8}  {:>12}  {:>10}  {:>11}  {}\n",
            v.node,
            if v.leader { "leader" } else { "follower" },
            v.matched_index.map_or("-".into(), |i| i.to_string()),
            v.entries_behind,
            fmt_bytes(v.bytes_behind),
            fmt_ms(Some(v.behind_ms)),
            fmt_ms(v.last_answer_ms),
            if v.in_sync { "yes" } else { "NO" }
        ));
    }
    out
}

pub fn run(args: ClusterArgs) -> Result<Status> {
    let ClusterAction::Status = args.action;
    if args.bootstrap.is_empty() {
        bail!("cluster status needs --bootstrap HOST:PORT (any node's Kafka listener)");
    }
    let files = args.tls.files();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let q = rt.block_on(find_leader(&args, &files))?;
    if args.json {
        println!("{}", serde_json::to_string(&q)?);
    } else {
        print!("{}", table(&q));
    }
    Ok(match q.voters.iter().all(|v| v.in_sync) {
        true => Status::Ok,
        false => Status::Lagging,
    })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use kafka_protocol::messages::describe_quorum_response::{
        Listener, Node, PartitionData as RespPartition, TopicData as RespTopic,
    };
    use kafka_protocol::messages::BrokerId;

    use super::*;

    fn replica(id: i32, leo: i64, fetch: i64, caught_up: i64, bytes: Option<u64>) -> ReplicaState {
        let mut r = ReplicaState::default();
        r.replica_id = BrokerId(id);
        r.log_end_offset = leo;
        r.last_fetch_timestamp = fetch;
        r.last_caught_up_timestamp = caught_up;
        if let Some(b) = bytes {
            r.unknown_tagged_fields
                .insert(BYTES_BEHIND_TAG, Bytes::copy_from_slice(&b.to_be_bytes()));
        }
        r
    }

    fn response(p: RespPartition) -> DescribeQuorumResponse {
        let mut t = RespTopic::default();
        t.topic_name = TopicName(StrBytes::from_static_str(QUORUM_TOPIC));
        t.partitions = vec![p];
        let mut r = DescribeQuorumResponse::default();
        r.topics = vec![t];
        r
    }

    #[test]
    fn the_leaders_answer_reads_as_each_voters_position() -> Result<()> {
        let mut p = RespPartition::default();
        p.partition_index = GROUP as i32;
        p.leader_id = BrokerId(2);
        p.leader_epoch = 5;
        p.high_watermark = 100;
        p.current_voters = vec![
            replica(1, 100, 9_990, 9_990, Some(0)),
            replica(2, 101, 10_000, 10_000, Some(0)),
            replica(3, 40, -1, 8_500, Some(61 * 1024)),
        ];
        let Answer::Leader(q) = read_answer("n2", &response(p), 10_000)? else {
            bail!("read as a follower's answer");
        };
        assert_eq!((q.leader, q.term, q.committed_index), (2, 5, Some(99)));
        let v3 = &q.voters[2];
        assert_eq!(v3.matched_index, Some(39));
        assert_eq!(v3.entries_behind, 61);
        assert_eq!(v3.bytes_behind, Some(61 * 1024));
        assert_eq!(v3.behind_ms, 1_500);
        assert_eq!(v3.last_answer_ms, None);
        assert!(!v3.in_sync);
        assert!(q.voters[0].in_sync && q.voters[1].leader);
        assert_eq!(q.voters[0].entries_behind, 1);
        let t = table(&q);
        assert!(
            t.contains("61.0 KiB") && t.contains("1.500 s") && t.contains("NO"),
            "{t}"
        );
        Ok(())
    }

    #[test]
    fn a_followers_answer_points_at_the_leader() -> Result<()> {
        let mut p = RespPartition::default();
        p.partition_index = GROUP as i32;
        p.error_code = codes::NOT_LEADER_OR_FOLLOWER;
        p.leader_id = BrokerId(3);
        let mut r = response(p);
        let mut n = Node::default();
        n.node_id = BrokerId(3);
        let mut l = Listener::default();
        l.host = StrBytes::from_static_str("127.0.0.1");
        l.port = 9094;
        n.listeners = vec![l];
        r.nodes = vec![n];
        match read_answer("n1", &r, 0)? {
            Answer::Follower { leader: 3, at } => {
                assert_eq!(at.as_deref(), Some("127.0.0.1:9094"))
            }
            _ => bail!("not read as a follower's answer"),
        }
        Ok(())
    }

    #[test]
    fn a_malformed_bytes_field_and_a_lone_broker_are_refused_by_name() {
        let mut p = RespPartition::default();
        p.partition_index = GROUP as i32;
        p.leader_id = BrokerId(1);
        let mut bad = replica(1, 1, 0, 0, None);
        bad.unknown_tagged_fields
            .insert(BYTES_BEHIND_TAG, Bytes::from_static(&[1, 2, 3]));
        p.current_voters = vec![bad];
        let e = read_answer("n1", &response(p), 0)
            .err()
            .map(|e| e.to_string());
        assert!(e.as_deref().is_some_and(|e| e.contains("not 8")), "{e:?}");

        let mut alone = DescribeQuorumResponse::default();
        alone.error_code = codes::INVALID_REQUEST;
        alone.error_message = Some(StrBytes::from_static_str("runs alone"));
        let e = read_answer("n1", &alone, 0).err().map(|e| e.to_string());
        assert!(
            e.as_deref().is_some_and(|e| e.contains("runs alone")),
            "{e:?}"
        );
    }
}
