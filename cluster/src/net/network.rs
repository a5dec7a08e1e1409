//! openraft's network traits over the node's peer connections: one [`Network`] per group,
//! all of a node's groups sharing its connections.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use openraft::errors::{
    NetworkError, RPCError, ReplicationClosed, StreamingError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use tokio::time::Instant;

use super::pool::{CallError, Pool};
use super::wire::{self, Chunk, Message, WireError, SNAPSHOT_CHUNK};
use crate::types::{LogId, TypeConfig, Vote};

type Snapshot = openraft::alias::SnapshotOf<TypeConfig, Vec<u8>>;

/// A group's view of the network: what its `Raft` is built with.
#[derive(Clone)]
pub struct Network {
    pub(crate) pool: Arc<Pool>,
    pub(crate) group: u32,
}

/// One group's client of one peer.
pub struct PeerClient {
    pool: Arc<Pool>,
    group: u32,
    target: u64,
    /// The address openraft's membership holds for the peer, used when the peer table has none.
    fallback: String,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerClient {
        PeerClient {
            pool: self.pool.clone(),
            group: self.group,
            target,
            fallback: node.addr.clone(),
        }
    }
}

impl PeerClient {
    fn rpc_error(&self, e: CallError, action: RPCTypes, ttl: Duration) -> RPCError<TypeConfig> {
        match e {
            CallError::Unreachable(why) => RPCError::Unreachable(Unreachable::from_string(why)),
            CallError::Network(why) => RPCError::Network(NetworkError::from_string(why)),
            CallError::Timeout => RPCError::Timeout(Timeout {
                action,
                id: self.pool.me(),
                target: self.target,
                timeout: ttl,
            }),
        }
    }

    fn encode_err(&self, e: WireError) -> RPCError<TypeConfig> {
        RPCError::Network(NetworkError::from_string(format!(
            "group {} to node {}: {e}",
            self.group, self.target
        )))
    }

    fn wrong_answer(&self, asked: &str, got: &Message) -> RPCError<TypeConfig> {
        RPCError::Network(NetworkError::from_string(format!(
            "group {}: node {} answered {asked} with a {} frame",
            self.group,
            self.target,
            got.name()
        )))
    }

    /// Sends `msg` and returns the answer, within `option`'s hard deadline.
    async fn call(
        &self,
        msg: &Message,
        action: RPCTypes,
        ttl: Duration,
    ) -> Result<Message, RPCError<TypeConfig>> {
        let frame = wire::encode(0, self.group, msg).map_err(|e| self.encode_err(e))?;
        self.pool
            .call(self.target, &self.fallback, frame, Instant::now() + ttl)
            .await
            .map_err(|e| self.rpc_error(e, action, ttl))
    }

    async fn vote_like(
        &self,
        msg: Message,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        match self.call(&msg, RPCTypes::Vote, option.hard_ttl()).await? {
            Message::VoteReply(r) => Ok(r),
            other => Err(self.wrong_answer(msg.name(), &other)),
        }
    }
}

/// The longest prefix of `rpc`'s entries whose frame fits the cap (halving until it does),
/// with the log id of its last entry when it is shorter than the whole batch.
fn fit(
    group: u32,
    rpc: &AppendEntriesRequest<TypeConfig>,
) -> Result<(Vec<u8>, Option<LogId>), WireError> {
    let mut n = rpc.entries.len();
    loop {
        let cut = n < rpc.entries.len();
        let last = if cut {
            rpc.entries.get(n.wrapping_sub(1)).map(|e| e.log_id)
        } else {
            None
        };
        let req = AppendEntriesRequest {
            vote: rpc.vote,
            prev_log_id: rpc.prev_log_id,
            entries: rpc.entries[..n].to_vec(),
            // The follower must not commit past what this prefix proves it holds: entries after
            // it may be stale ones of an older term not yet truncated there.
            leader_commit: match last {
                Some(l) if rpc.leader_commit.as_ref().is_some_and(|c| *c > l) => Some(l),
                _ => rpc.leader_commit,
            },
        };
        match wire::encode(0, group, &Message::AppendEntries(req)) {
            Ok(frame) => return Ok((frame, last)),
            Err(WireError::TooLarge { .. }) if n > 1 => n /= 2,
            Err(e) => return Err(e),
        }
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = Vec<u8>;

    /// A batch whose frame would be over the cap is cut to a prefix that fits; openraft is
    /// told `PartialSuccess` up to its last entry and sends the rest next.
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let ttl = option.hard_ttl();
        let (frame, cut) = fit(self.group, &rpc).map_err(|e| self.encode_err(e))?;
        let answer = self
            .pool
            .call(self.target, &self.fallback, frame, Instant::now() + ttl)
            .await
            .map_err(|e| self.rpc_error(e, RPCTypes::AppendEntries, ttl))?;
        match (answer, cut) {
            (Message::AppendEntriesReply(AppendEntriesResponse::Success), Some(last)) => {
                Ok(AppendEntriesResponse::PartialSuccess(Some(last)))
            }
            (Message::AppendEntriesReply(r), _) => Ok(r),
            (other, _) => Err(self.wrong_answer("append entries", &other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.vote_like(Message::Vote(rpc), option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.vote_like(Message::PreVote(rpc), option).await
    }

    /// Sends the snapshot in chunks of openraft's `snapshot_max_chunk_size` (at most
    /// [`SNAPSHOT_CHUNK`]), each acknowledged before the next,
    /// each within `option`'s deadline (openraft itself puts no deadline on the whole
    /// transfer); `cancel` stops it between or during chunks.
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let transfer = self.pool.next_id();
        let ttl = option.hard_ttl();
        // openraft's `snapshot_max_chunk_size`, within what a frame carries.
        let chunk_size = option
            .snapshot_chunk_size()
            .unwrap_or(SNAPSHOT_CHUNK)
            .clamp(1, SNAPSHOT_CHUNK);
        let Snapshot {
            meta,
            snapshot: data,
        } = snapshot;
        let send = async {
            let mut offset = 0usize;
            loop {
                let end = data.len().min(offset + chunk_size);
                let last = end == data.len();
                let chunk = Message::SnapshotChunk(Chunk {
                    transfer,
                    offset: offset as u64,
                    data: data[offset..end].to_vec(),
                    done: last.then(|| (vote, meta.clone())),
                });
                let answer = self.call(&chunk, RPCTypes::InstallSnapshot, ttl).await?;
                match (answer, last) {
                    (Message::SnapshotReply(r), true) => return Ok(r),
                    (Message::ChunkAck, false) => offset = end,
                    (other, _) => return Err(self.wrong_answer("a snapshot chunk", &other)),
                }
            }
        };
        tokio::select! {
            r = send => r.map_err(StreamingError::from),
            closed = cancel => Err(StreamingError::Closed(closed)),
        }
    }
}
