//! Three nodes on loopback TCP (real sockets, real time), each with its own sim device and log,
//! joined by the cluster transport (`nvmq_cluster::net`): they elect a leader, replicate
//! writes, elect another when the leader is stopped, and keep committing with a peer down.

use crate::common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmq_cluster::net::wire::{self, Hello, Message, VERSION};
use nvmq_cluster::net::{GroupRaft, Node};
use nvmq_cluster::{Request, StateMachine};
use openraft::async_runtime::WatchReceiver;
use openraft::errors::RPCError;
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::VoteRequest;
use openraft::{BasicNode, Config, Raft, ServerState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GROUP: u32 = 1;
/// How long a cluster gets to reach a state before the test gives up: a hang guard, far above
/// what any step takes, not a performance target.
const PATIENCE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(5);

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A running node and the sim device its group's log lives on (kept alive with it).
struct Member {
    node: Node,
    _disk: common::Node,
}

impl Member {
    fn raft(&self) -> Result<GroupRaft, String> {
        self.node
            .group(GROUP)
            .ok_or(format!("node {} runs no group {GROUP}", self.node.id()))
    }
}

struct Cluster {
    members: BTreeMap<u64, Member>,
    config: Arc<Config>,
}

/// Starts node `id`'s listener.
async fn listen(id: u64) -> Result<Node, String> {
    let kafka = format!("127.0.0.1:{}", 19_090 + id);
    Node::start(id, loopback(), kafka)
        .await
        .map_err(|e| e.to_string())
}

/// Starts group `GROUP` on `node`, on a fresh sim device.
async fn join(node: Node, config: &Arc<Config>) -> Result<Member, String> {
    let id = node.id();
    let disk = common::Node::new(100 + id)?;
    let (ls, sm) = disk.open(GROUP).map_err(|e| e.to_string())?;
    let raft = Raft::new(id, config.clone(), node.network(GROUP), ls, sm)
        .await
        .map_err(|e| format!("node {id}: {e}"))?;
    node.add_group(GROUP, raft);
    Ok(Member { node, _disk: disk })
}

/// Starts the listeners of `ids`, gives every node the others' addresses, starts group
/// `GROUP` on each and initializes it with all of them (even those `down`, whose listener is
/// closed again before the group starts: members that never answer).
async fn start(ids: &[u64], down: &[u64], config: Config) -> Result<Cluster, String> {
    let config = Arc::new(config.validate().map_err(|e| e.to_string())?);
    let mut nodes = BTreeMap::new();
    for &id in ids {
        nodes.insert(id, listen(id).await?);
    }
    for (&id, node) in &nodes {
        for (&other, peer) in &nodes {
            if other != id {
                peer.set_peer(id, node.peer());
            }
        }
    }
    let mut members = BTreeMap::new();
    for (id, node) in nodes {
        if down.contains(&id) {
            node.stop().await.map_err(|e| e.to_string())?;
            continue;
        }
        members.insert(id, join(node, &config).await?);
    }
    let (_, first) = members.iter().next().ok_or("no node is up")?;
    let mut all = first.node.members();
    for id in ids {
        if !all.contains_key(id) {
            return Err(format!("node {id} missing from the members {all:?}"));
        }
    }
    all.retain(|id, _| ids.contains(id));
    first
        .raft()?
        .initialize(all)
        .await
        .map_err(|e| format!("initialize: {e}"))?;
    Ok(Cluster { members, config })
}

impl Cluster {
    /// The node that says it leads, once one does.
    async fn leader(&self) -> Result<u64, String> {
        let until = Instant::now() + PATIENCE;
        while Instant::now() < until {
            for (&id, m) in &self.members {
                if m.raft()?.metrics().borrow_watched().state == ServerState::Leader {
                    return Ok(id);
                }
            }
            tokio::time::sleep(POLL).await;
        }
        Err(format!(
            "no leader among {:?} after {PATIENCE:?}",
            self.members.keys()
        ))
    }

    /// Writes through whoever leads, retrying while leadership moves; returns the index the
    /// write committed at. Every attempt is recorded: a failed one may still commit.
    async fn write(&self, bytes: Vec<u8>, attempted: &mut Vec<Vec<u8>>) -> Result<u64, String> {
        attempted.push(bytes.clone());
        let until = Instant::now() + PATIENCE;
        let mut last_err = String::from("no attempt");
        while Instant::now() < until {
            let leader = self.leader().await?;
            let raft = self.members[&leader].raft()?;
            match raft.client_write(Request::from(bytes.clone())).await {
                Ok(r) => return Ok(r.log_id.index),
                Err(e) => last_err = e.to_string(),
            }
            tokio::time::sleep(POLL).await;
        }
        Err(format!("write never committed: {last_err}"))
    }

    /// What node `id` applied, once it applied everything up to `index`.
    async fn applied(&self, id: u64, index: u64) -> Result<BTreeMap<u64, Vec<u8>>, String> {
        let raft = self
            .members
            .get(&id)
            .ok_or(format!("node {id} is not running"))?
            .raft()?;
        let until = Instant::now() + PATIENCE;
        while Instant::now() < until {
            let last = raft
                .metrics()
                .borrow_watched()
                .last_applied
                .map(|l| l.index);
            if last.is_some_and(|l| l >= index) {
                return raft
                    .with_state_machine(|sm: &mut StateMachine| {
                        Box::pin(async move { sm.applied().map(|a| a.data) })
                    })
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("node {id}'s state machine: {e}"));
            }
            tokio::time::sleep(POLL).await;
        }
        Err(format!("node {id} never applied index {index}"))
    }

    /// Writes `range` and records each acknowledged one at its index.
    async fn write_range(
        &self,
        range: std::ops::Range<u32>,
        acked: &mut BTreeMap<u64, Vec<u8>>,
        attempted: &mut Vec<Vec<u8>>,
    ) -> Result<(), String> {
        for i in range {
            let bytes = format!("tcp write {i}").into_bytes();
            let index = self.write(bytes.clone(), attempted).await?;
            acked.insert(index, bytes);
        }
        Ok(())
    }

    /// Every running node holds every acknowledged write at its index, nothing nobody wrote,
    /// and all of them agree on every index up to the last acknowledged one.
    async fn check_agree(
        &self,
        acked: &BTreeMap<u64, Vec<u8>>,
        attempted: &[Vec<u8>],
    ) -> Result<(), String> {
        let last = acked.keys().next_back().copied().ok_or("nothing acked")?;
        let mut first_view: Option<(u64, BTreeMap<u64, Vec<u8>>)> = None;
        for &id in self.members.keys() {
            let applied = self.applied(id, last).await?;
            for (index, bytes) in acked {
                if applied.get(index) != Some(bytes) {
                    return Err(format!(
                        "node {id}: acknowledged write at index {index} is {:?}",
                        applied.get(index).map(|b| String::from_utf8_lossy(b))
                    ));
                }
            }
            if let Some((i, _)) = applied.iter().find(|(_, b)| !attempted.contains(b)) {
                return Err(format!("node {id}: entry nobody wrote at index {i}"));
            }
            let mine: BTreeMap<u64, Vec<u8>> = applied
                .range(..=last)
                .map(|(i, b)| (*i, b.clone()))
                .collect();
            match &first_view {
                Some((other, view)) if *view != mine => {
                    return Err(format!("nodes {other} and {id} differ up to index {last}"))
                }
                Some(_) => {}
                None => first_view = Some((id, mine)),
            }
        }
        Ok(())
    }

    /// `n` writes commit and agree on every node; then the cluster stops.
    async fn commits_then_stop(self, n: u32) -> Result<(), String> {
        let mut acked = BTreeMap::new();
        let mut attempted = Vec::new();
        self.write_range(0..n, &mut acked, &mut attempted).await?;
        self.check_agree(&acked, &attempted).await?;
        self.stop().await
    }

    async fn stop(mut self) -> Result<(), String> {
        for (_, m) in std::mem::take(&mut self.members) {
            m.node.stop().await.map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_tcp_nodes_elect_replicate_and_fail_over() -> Result<(), String> {
    let config = Config::default();
    let timeouts = format!(
        "heartbeat {} ms, election timeout {}-{} ms",
        config.heartbeat_interval, config.election_timeout_min, config.election_timeout_max
    );
    let mut cluster = start(&[1, 2, 3], &[], config).await?;
    let first = cluster.leader().await?;
    let mut acked = BTreeMap::new();
    let mut attempted = Vec::new();
    cluster
        .write_range(0..20, &mut acked, &mut attempted)
        .await?;
    cluster.check_agree(&acked, &attempted).await?;

    // Stop the leader: its listener closes, its connections drop, its Raft shuts down.
    let old = cluster.members.remove(&first).ok_or("leader vanished")?;
    let stopped = Instant::now();
    old.node.stop().await.map_err(|e| e.to_string())?;
    let second = cluster.leader().await?;
    let failover = stopped.elapsed();
    if second == first {
        return Err(format!("stopped node {first} still leads"));
    }
    println!(
        "failover: node {first} stopped, node {second} leads after {failover:?} (openraft \
         defaults: {timeouts})"
    );
    cluster
        .write_range(20..30, &mut acked, &mut attempted)
        .await?;
    cluster.check_agree(&acked, &attempted).await?;
    cluster.stop().await
}

/// A group's client of `target`, as openraft builds it from the membership.
async fn client_of(from: &Node, target: u64, addr: String) -> nvmq_cluster::net::PeerClient {
    from.network(GROUP)
        .new_client(target, &BasicNode::new(addr))
        .await
}

fn vote_request() -> VoteRequest<nvmq_cluster::TypeConfig> {
    VoteRequest::new(nvmq_cluster::Vote::new(1, 1), None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_is_down_is_unreachable_and_a_majority_still_commits() -> Result<(), String> {
    let cluster = start(&[11, 12, 13], &[13], Config::default()).await?;
    let one = &cluster.members.get(&11).ok_or("node 11 not running")?.node;
    let addr3 = one
        .peers()
        .get(&13)
        .ok_or("node 13 not in the table")?
        .internal
        .clone();

    // Nothing listens at node 13's address any more.
    let mut client = client_of(one, 13, addr3).await;
    let option = RPCOption::new(Duration::from_secs(5));
    match client.vote(vote_request(), option.clone()).await {
        Err(RPCError::Unreachable(e)) => println!("down peer: {e}"),
        other => return Err(format!("vote to a down peer answered {other:?}")),
    }

    // Node 12 listens at the address now given for node 13: the handshake tells them apart
    // (node 12 refuses a hello meant for node 13).
    let addr2 = cluster.members[&12].node.addr().to_string();
    let mut wrong = client_of(one, 13, String::new()).await;
    one.set_peer(
        13,
        nvmq_cluster::net::Peer {
            internal: addr2,
            kafka: String::new(),
        },
    );
    match wrong.vote(vote_request(), option).await {
        Err(RPCError::Unreachable(e)) if e.to_string().contains("this is node 12") => {}
        other => return Err(format!("vote to the wrong node answered {other:?}")),
    }

    cluster.commits_then_stop(10).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_frame_closes_only_its_own_connection() -> Result<(), String> {
    let cluster = start(&[21, 22, 23], &[], Config::default()).await?;
    let addr = cluster.members[&22].node.addr();
    let hello = |to| {
        let h = Message::Hello(Hello {
            version: VERSION,
            from: 9,
            to,
        });
        wire::encode(1, 0, &h).map_err(|e| e.to_string())
    };
    let mut reply_as_request = hello(22)?;
    reply_as_request.extend(wire::encode(2, GROUP, &Message::ChunkAck).map_err(|e| e.to_string())?);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "garbage",
            b"GET / HTTP/1.1\r\n\r\n".to_vec(),
            "over the cap",
        ),
        ("short length", vec![0, 0, 0, 2, 0, 0], "shorter than"),
        (
            "unknown kind",
            {
                let mut f = vec![0, 0, 0, 13];
                f.extend_from_slice(&[0; 12]);
                f.push(0x7f);
                f
            },
            "unknown kind",
        ),
        ("wrong node", hello(23)?, "this is node 22"),
        (
            "reply sent as a request",
            reply_as_request,
            "chunk ack frame where a request",
        ),
    ];
    for (what, bytes, expect) in cases {
        let mut sock = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        sock.write_all(&bytes).await.map_err(|e| e.to_string())?;
        let mut answer = Vec::new();
        tokio::time::timeout(PATIENCE, sock.read_to_end(&mut answer))
            .await
            .map_err(|_| format!("{what}: the connection was not closed"))?
            .map_err(|e| format!("{what}: {e}"))?;
        // The answer is the hello's ack (when the hello was good), then the refusal.
        let mut frames = Vec::new();
        let mut at = 0;
        while let Some((frame, used)) = wire::decode(&answer[at..])
            .map_err(|e| format!("{what}: answer does not decode: {e}"))?
        {
            frames.push(frame.message().map_err(|e| format!("{what}: {e}"))?);
            at += used;
        }
        match frames.last() {
            Some(Message::Refused(why)) if why.contains(expect) => {
                println!("{what}: refused: {why}")
            }
            other => {
                return Err(format!(
                    "{what}: last answer {other:?}, not a refusal naming {expect:?}"
                ))
            }
        }
    }
    // The nodes' own connections were not touched: the cluster still commits.
    cluster.commits_then_stop(5).await
}

/// Nodes start their groups at different moments: a request for a group the node does not run
/// (yet) is answered `RemoteFatal` naming it (the caller's Raft sees the peer unreachable for
/// that group and tries again later), and the connection goes on serving the groups it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_a_group_not_running_is_answered_and_the_connection_stays(
) -> Result<(), String> {
    let cluster = start(&[24, 25, 26], &[], Config::default()).await?;
    let addr = cluster.members[&25].node.addr();
    let frame = |id, group, m: &Message| wire::encode(id, group, m).map_err(|e| e.to_string());
    let hello = Message::Hello(Hello {
        version: VERSION,
        from: 9,
        to: 25,
    });
    let mut bytes = frame(1, 0, &hello)?;
    bytes.extend(frame(2, 99, &Message::Vote(vote_request()))?);
    bytes.extend(frame(3, GROUP, &Message::Vote(vote_request()))?);
    let mut sock = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    sock.write_all(&bytes).await.map_err(|e| e.to_string())?;
    // The hello's ack and both answers (in either order: answers go as they are ready).
    let mut answer = Vec::new();
    let mut frames = Vec::new();
    let until = Instant::now() + PATIENCE;
    while frames.len() < 3 {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout_at(until.into(), sock.read(&mut buf))
            .await
            .map_err(|_| format!("{} answers after {PATIENCE:?}: {frames:?}", frames.len()))?
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!("the connection closed after {frames:?}"));
        }
        answer.extend_from_slice(&buf[..n]);
        while let Some((f, used)) = wire::decode(&answer).map_err(|e| e.to_string())? {
            frames.push((f.id, f.message().map_err(|e| e.to_string())?));
            answer.drain(..used);
        }
    }
    let unknown = frames
        .iter()
        .find(|(id, _)| *id == 2)
        .ok_or(format!("no answer to the request for group 99: {frames:?}"))?;
    match &unknown.1 {
        Message::RemoteFatal(why) if why.contains("group 99, which this node does not run") => {
            println!("group 99: {why}")
        }
        other => return Err(format!("group 99 answered {other:?}")),
    }
    if !frames
        .iter()
        .any(|(id, m)| *id == 3 && matches!(m, Message::VoteReply(_)))
    {
        return Err(format!("the group it runs did not answer: {frames:?}"));
    }
    // Still open: no end of stream, no refusal.
    let mut buf = [0u8; 64];
    match tokio::time::timeout(Duration::from_millis(300), sock.read(&mut buf)).await {
        Err(_) => {}
        Ok(r) => return Err(format!("the connection did not stay open: read {r:?}")),
    }
    cluster.commits_then_stop(3).await
}

/// Waits until `pred` holds for node `id`'s metrics.
async fn wait_metrics(
    raft: &GroupRaft,
    what: &str,
    pred: impl Fn(&openraft::RaftMetrics<nvmq_cluster::TypeConfig>) -> bool,
) -> Result<(), String> {
    let until = Instant::now() + PATIENCE;
    while Instant::now() < until {
        if pred(&raft.metrics().borrow_watched()) {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
    Err(format!("{what}: not after {PATIENCE:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_the_purge_point_catches_up_from_a_chunked_snapshot() -> Result<(), String> {
    // Small chunks, so that the snapshot crosses the wire in many frames.
    let config = Config {
        snapshot_max_chunk_size: 4096,
        max_in_snapshot_log_to_keep: 0,
        ..Config::default()
    };
    let mut cluster = start(&[31, 32, 33], &[33], config).await?;
    let mut acked = BTreeMap::new();
    let mut attempted = Vec::new();
    for i in 0..20u32 {
        let bytes = format!("{i:>4} {}", "x".repeat(600)).into_bytes();
        let index = cluster.write(bytes.clone(), &mut attempted).await?;
        acked.insert(index, bytes);
    }
    let last = acked.keys().next_back().copied().ok_or("nothing acked")?;
    let leader = cluster.leader().await?;
    let raft = cluster.members[&leader].raft()?;
    raft.trigger().snapshot().await.map_err(|e| e.to_string())?;
    let has_snapshot = |m: &openraft::RaftMetrics<_>| m.snapshot.is_some_and(|s| s.index >= last);
    wait_metrics(&raft, "the leader's snapshot", has_snapshot).await?;
    raft.trigger()
        .purge_log(last)
        .await
        .map_err(|e| e.to_string())?;
    wait_metrics(&raft, "the leader's purge", |m| {
        m.purged.is_some_and(|p| p.index >= last)
    })
    .await?;
    let size = raft
        .get_snapshot()
        .await
        .map_err(|e| e.to_string())?
        .map(|s| s.snapshot.len())
        .ok_or("no snapshot on the leader")?;

    // Node 33 comes up for the first time, on a new port: the others learn it from their peer
    // tables (the membership still holds the address it had), and it can only be brought up to
    // date by the snapshot, as the entries are purged.
    let node = listen(33).await?;
    for m in cluster.members.values() {
        m.node.set_peer(33, node.peer());
        node.set_peer(m.node.id(), m.node.peer());
    }
    let member = join(node, &cluster.config).await?;
    cluster.members.insert(33, member);
    let newcomer = cluster.members[&33].raft()?;
    wait_metrics(&newcomer, "node 33 installing the snapshot", has_snapshot).await?;
    println!("node 33 installed a snapshot of {size} bytes sent in 4 KiB chunks");
    cluster
        .write_range(20..25, &mut acked, &mut attempted)
        .await?;
    cluster.check_agree(&acked, &attempted).await?;
    cluster.stop().await
}

/// A peer that answers the hello as node `id` and then reads requests without answering any.
async fn black_hole(id: u64) -> Result<SocketAddr, String> {
    let listener = tokio::net::TcpListener::bind(loopback())
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(Some(hello)) = wire::read_frame(&mut sock).await {
                    if let Ok(ack) = wire::encode(hello.id, 0, &Message::HelloAck(id)) {
                        let _ = sock.write_all(&ack).await;
                    }
                }
                while let Ok(Some(_)) = wire::read_frame(&mut sock).await {}
            });
        }
    });
    Ok(addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_answers_times_out_within_the_rpc_deadline() -> Result<(), String> {
    let me = listen(41).await?;
    let addr = black_hole(42).await?;
    me.set_peer(
        42,
        nvmq_cluster::net::Peer {
            internal: addr.to_string(),
            kafka: String::new(),
        },
    );
    let mut client = client_of(&me, 42, String::new()).await;
    let ttl = Duration::from_millis(200);
    for attempt in 0..2 {
        let answer =
            tokio::time::timeout(PATIENCE, client.vote(vote_request(), RPCOption::new(ttl)))
                .await
                .map_err(|_| format!("attempt {attempt}: the call outlived its deadline"))?;
        match answer {
            Err(RPCError::Timeout(t)) if t.timeout == ttl && t.target == 42 && t.id == 41 => {}
            other => {
                return Err(format!(
                    "attempt {attempt}: answered {other:?}, not a timeout"
                ))
            }
        }
    }
    me.stop().await.map_err(|e| e.to_string())
}
