//! The node's internal listener: reads frames from peers, hands each request to its group's
//! Raft, and answers on the same connection as each answer is ready (out of order; the request
//! id pairs them). A frame it cannot take closes the connection after a `Refused` frame that
//! says why; a request for a group this node does not run (yet) is answered `RemoteFatal`,
//! keeping the connection.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

use super::error::NetError;
use super::registry::{GroupRaft, Registry};
use super::wire::{self, Chunk, Frame, Message, WireError, VERSION};
use crate::types::TypeConfig;

type Snapshot = openraft::alias::SnapshotOf<TypeConfig, Vec<u8>>;

/// The most snapshot bytes a connection assembles for one group before it is refused. This
/// crate's snapshots are bounded by the log's largest record; the cap keeps a peer from
/// growing a node's memory without end.
pub const MAX_SNAPSHOT: u64 = 256 << 20;

/// Frames queued for the writer of one connection before handlers wait.
const WRITE_QUEUE: usize = 1024;

/// How long the refusal of a bad frame may take to write before the connection is dropped.
const REFUSE_GRACE: Duration = Duration::from_secs(1);

/// Binds the listener (port 0 picks one) and serves it until the returned task is aborted;
/// aborting it drops every connection and every request in flight.
pub(crate) async fn listen(
    me: u64,
    addr: SocketAddr,
    registry: Registry,
) -> Result<(SocketAddr, JoinHandle<()>), NetError> {
    let bind = |source| NetError::Bind {
        node: me,
        addr,
        source,
    };
    let listener = TcpListener::bind(addr).await.map_err(bind)?;
    let bound = listener.local_addr().map_err(bind)?;
    Ok((bound, tokio::spawn(accept(me, listener, registry))))
}

async fn accept(me: u64, listener: TcpListener, registry: Registry) {
    // Owned here so that aborting this task aborts every connection.
    let mut conns = JoinSet::new();
    loop {
        while conns.try_join_next().is_some() {}
        match listener.accept().await {
            Ok((sock, peer)) => {
                conns.spawn(serve(me, sock, peer, registry.clone()));
            }
            Err(e) => {
                // Out of descriptors and the like: the next accept may succeed.
                tracing::warn!(node = me, "accept on the internal listener: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

async fn serve(me: u64, sock: TcpStream, peer: SocketAddr, registry: Registry) {
    // Raft messages are small and latency-bound.
    let _ = sock.set_nodelay(true);
    let (rd, wr) = sock.into_split();
    let (tx, rx) = mpsc::channel(WRITE_QUEUE);
    let writer = tokio::spawn(wire::write_frames(wr, rx));
    let mut conn = Conn {
        me,
        peer,
        registry,
        tx,
        handlers: JoinSet::new(),
        snapshots: HashMap::new(),
    };
    let outcome = conn.run(rd).await;
    let Conn {
        tx, mut handlers, ..
    } = conn;
    handlers.shutdown().await;
    if let Err((id, group, e)) = outcome {
        tracing::warn!(node = me, "{e}; closing the connection");
        if let Ok(bytes) = wire::encode(id, group, &Message::Refused(e.to_string())) {
            let _ = tx.send(bytes).await;
        }
    }
    drop(tx);
    if tokio::time::timeout(REFUSE_GRACE, writer).await.is_err() {
        tracing::warn!(node = me, "connection with {peer}: writer did not finish");
    }
}

/// A snapshot being received for one group.
struct Partial {
    transfer: u64,
    data: Vec<u8>,
}

struct Conn {
    me: u64,
    peer: SocketAddr,
    registry: Registry,
    tx: mpsc::Sender<Vec<u8>>,
    handlers: JoinSet<()>,
    snapshots: HashMap<u32, Partial>,
}

/// A connection's failure: the request id and group of the frame at fault (0 before one was
/// read), and what was wrong.
type Fault = (u64, u32, NetError);

impl Conn {
    fn frame_err(&self, source: WireError) -> NetError {
        NetError::Frame {
            peer: self.peer,
            source,
        }
    }

    async fn read(&self, rd: &mut OwnedReadHalf) -> Result<Option<Frame>, Fault> {
        wire::read_frame(rd)
            .await
            .map_err(|e| (0, 0, self.frame_err(e)))
    }

    async fn send(&self, id: u64, group: u32, msg: &Message) -> Result<(), Fault> {
        let bytes = wire::encode(id, group, msg).map_err(|e| (id, group, self.frame_err(e)))?;
        // A closed writer means the socket is gone; the reader sees it next.
        let _ = self.tx.send(bytes).await;
        Ok(())
    }

    /// The handshake, then requests until the peer closes or sends a frame that is refused.
    async fn run(&mut self, mut rd: OwnedReadHalf) -> Result<(), Fault> {
        let Some(first) = self.read(&mut rd).await? else {
            return Ok(());
        };
        let fault = |e| (first.id, first.group, e);
        match first.message().map_err(|e| fault(self.frame_err(e)))? {
            Message::Hello(h) if h.version != VERSION => {
                return Err(fault(NetError::Version {
                    peer: self.peer,
                    theirs: h.version,
                    ours: VERSION,
                }))
            }
            Message::Hello(h) if h.to != self.me => {
                return Err(fault(NetError::WrongNode {
                    peer: self.peer,
                    asked: h.to,
                    me: self.me,
                }))
            }
            Message::Hello(_) => {
                self.send(first.id, 0, &Message::HelloAck(self.me)).await?;
            }
            other => {
                return Err(fault(NetError::Unexpected {
                    peer: self.peer,
                    kind: other.name(),
                    expected: "hello",
                }))
            }
        }
        while let Some(frame) = self.read(&mut rd).await? {
            while self.handlers.try_join_next().is_some() {}
            self.dispatch(frame).await?;
        }
        Ok(())
    }

    async fn dispatch(&mut self, frame: Frame) -> Result<(), Fault> {
        let (id, group) = (frame.id, frame.group);
        let fault = |e| (id, group, e);
        let msg = frame.message().map_err(|e| fault(self.frame_err(e)))?;
        if !msg.is_request() || matches!(msg, Message::Hello(_)) {
            return Err(fault(NetError::Unexpected {
                peer: self.peer,
                kind: msg.name(),
                expected: "a request",
            }));
        }
        let Some(raft) = self.registry.get(group) else {
            // Answered, not fatal to the connection: nodes start their groups at different
            // moments, and closing would cut every other group's traffic with the peer too.
            // The caller sees its group unreachable here and tries again later.
            let why = NetError::UnknownGroup {
                peer: self.peer,
                id,
                group,
            };
            return self
                .send(id, group, &Message::RemoteFatal(why.to_string()))
                .await;
        };
        let msg = match msg {
            Message::SnapshotChunk(chunk) => match self.take_chunk(group, chunk).map_err(fault)? {
                Some(done) => done,
                None => return self.send(id, group, &Message::ChunkAck).await,
            },
            other => other,
        };
        let tx = self.tx.clone();
        self.handlers.spawn(async move {
            let reply = answer(&raft, msg).await;
            let bytes = wire::encode(id, group, &reply).or_else(|e| {
                wire::encode(
                    id,
                    group,
                    &Message::RemoteFatal(format!("encode reply: {e}")),
                )
            });
            if let Ok(bytes) = bytes {
                let _ = tx.send(bytes).await;
            }
        });
        Ok(())
    }

    /// Adds a chunk to the group's snapshot; returns the install request once the last chunk
    /// is in.
    fn take_chunk(&mut self, group: u32, c: Chunk) -> Result<Option<Message>, NetError> {
        let (peer, transfer, offset) = (self.peer, c.transfer, c.offset);
        let bad = |why: String| NetError::Chunk {
            peer,
            group,
            transfer,
            offset,
            why,
        };
        let mut partial = if c.offset == 0 {
            Partial {
                transfer: c.transfer,
                data: Vec::new(),
            }
        } else {
            match self.snapshots.remove(&group) {
                Some(p) if p.transfer == c.transfer && p.data.len() as u64 == c.offset => p,
                Some(p) if p.transfer == c.transfer => {
                    return Err(bad(format!(
                        "{} bytes were received before it",
                        p.data.len()
                    )))
                }
                _ => return Err(bad("no transfer of that id is under way".into())),
            }
        };
        let total = c.offset.saturating_add(c.data.len() as u64);
        if total > MAX_SNAPSHOT {
            return Err(bad(format!(
                "the snapshot would reach {total} bytes, over the cap of {MAX_SNAPSHOT}"
            )));
        }
        partial.data.extend_from_slice(&c.data);
        match c.done {
            Some((vote, meta)) => Ok(Some(Message::SnapshotChunk(Chunk {
                transfer: c.transfer,
                offset: 0,
                data: partial.data,
                done: Some((vote, meta)),
            }))),
            None => {
                self.snapshots.insert(group, partial);
                Ok(None)
            }
        }
    }
}

/// Runs one request on the group's Raft; an error of the Raft (it is stopped) is answered as
/// `RemoteFatal`.
async fn answer(raft: &GroupRaft, msg: Message) -> Message {
    let reply = match msg {
        Message::AppendEntries(r) => raft
            .append_entries(r)
            .await
            .map(Message::AppendEntriesReply)
            .map_err(|e| e.to_string()),
        Message::Vote(r) => raft
            .vote(r)
            .await
            .map(Message::VoteReply)
            .map_err(|e| e.to_string()),
        Message::PreVote(r) => raft
            .pre_vote(r)
            .await
            .map(Message::VoteReply)
            .map_err(|e| e.to_string()),
        Message::SnapshotChunk(Chunk {
            data,
            done: Some((vote, meta)),
            ..
        }) => raft
            .install_full_snapshot(
                vote,
                Snapshot {
                    meta,
                    snapshot: data,
                },
            )
            .await
            .map(Message::SnapshotReply)
            .map_err(|e| e.to_string()),
        other => Err(format!(
            "{} is not a request this node answers",
            other.name()
        )),
    };
    reply.unwrap_or_else(Message::RemoteFatal)
}
