//! The bytes of the cluster transport: length-prefixed frames, each carrying a request id, the
//! Raft group it is for, the kind of message and its body (postcard, docs/cluster.md
//! "Transport").
//!
//! ```text
//! u32 length (of everything after it) | u64 request id | u32 group | u8 kind | body
//! ```
//!
//! All integers of the header are big-endian. The decoder checks the length against the cap
//! before it allocates, and every way a frame can be wrong is a [`WireError`] naming it.

use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

use crate::types::{SnapshotMeta, TypeConfig, Vote};

/// Bytes after the length prefix that every frame has: request id, group, kind.
pub const HEADER: usize = 8 + 4 + 1;

/// The largest frame (length prefix excluded) either side sends or accepts. Bigger append
/// batches are cut into prefixes that fit (the client answers openraft `PartialSuccess`), and
/// snapshots travel in chunks of [`SNAPSHOT_CHUNK`].
pub const MAX_FRAME: usize = 16 << 20;

/// Snapshot bytes per chunk frame: small enough that heartbeats of other groups sharing the
/// connection wait at most one chunk's write.
pub const SNAPSHOT_CHUNK: usize = 1 << 20;

/// The transport's protocol version, checked at the handshake.
pub const VERSION: u16 = 1;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("frame length {len} is shorter than the {HEADER}-byte header")]
    Short { len: usize },
    #[error("frame length {len} is over the cap of {cap} bytes")]
    TooLarge { len: usize, cap: usize },
    #[error("frame {id} (group {group}): unknown kind {kind:#04x}")]
    UnknownKind { id: u64, group: u32, kind: u8 },
    #[error("frame {id} (group {group}): {kind} body does not decode: {why}")]
    BadBody {
        id: u64,
        group: u32,
        kind: &'static str,
        why: String,
    },
    #[error("frame {id} (group {group}): {extra} bytes after the {kind} body")]
    Trailing {
        id: u64,
        group: u32,
        kind: &'static str,
        extra: usize,
    },
    #[error("frame ends after {got} of {want} bytes (connection closed mid-frame)")]
    Truncated { got: usize, want: usize },
    #[error("encode a {kind} frame: {why}")]
    Encode { kind: &'static str, why: String },
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// The opening of a connection: who dials whom, so a node that took over an address is never
/// mistaken for the one that had it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub version: u16,
    pub from: u64,
    pub to: u64,
}

/// One piece of a snapshot. Chunks of a transfer arrive in order (the sender waits for each
/// ack); the last one carries the leader's vote and the snapshot's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    pub transfer: u64,
    pub offset: u64,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    pub done: Option<(Vote, SnapshotMeta)>,
}

/// Every message either side sends.
#[derive(Debug, Clone)]
pub enum Message {
    Hello(Hello),
    /// The server's answer to [`Hello`]: its node id.
    HelloAck(u64),
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<TypeConfig>),
    PreVote(VoteRequest<TypeConfig>),
    SnapshotChunk(Chunk),
    AppendEntriesReply(AppendEntriesResponse<TypeConfig>),
    VoteReply(VoteResponse<TypeConfig>),
    /// A chunk that was not the last was taken.
    ChunkAck,
    SnapshotReply(SnapshotResponse<TypeConfig>),
    /// The group's Raft on the server failed the request (it is shutting down or stopped).
    RemoteFatal(String),
    /// The server refused a frame and closes the connection; says why.
    Refused(String),
}

/// The kind byte of each message.
mod kind {
    pub const HELLO: u8 = 0x01;
    pub const APPEND_ENTRIES: u8 = 0x02;
    pub const VOTE: u8 = 0x03;
    pub const PRE_VOTE: u8 = 0x04;
    pub const SNAPSHOT_CHUNK: u8 = 0x05;
    pub const HELLO_ACK: u8 = 0x81;
    pub const APPEND_ENTRIES_REPLY: u8 = 0x82;
    pub const VOTE_REPLY: u8 = 0x83;
    pub const CHUNK_ACK: u8 = 0x85;
    pub const SNAPSHOT_REPLY: u8 = 0x86;
    pub const REMOTE_FATAL: u8 = 0xE0;
    pub const REFUSED: u8 = 0xEF;
}

impl Message {
    pub fn kind(&self) -> u8 {
        match self {
            Message::Hello(_) => kind::HELLO,
            Message::HelloAck(_) => kind::HELLO_ACK,
            Message::AppendEntries(_) => kind::APPEND_ENTRIES,
            Message::Vote(_) => kind::VOTE,
            Message::PreVote(_) => kind::PRE_VOTE,
            Message::SnapshotChunk(_) => kind::SNAPSHOT_CHUNK,
            Message::AppendEntriesReply(_) => kind::APPEND_ENTRIES_REPLY,
            // A pre-vote is answered with a vote response too.
            Message::VoteReply(_) => kind::VOTE_REPLY,
            Message::ChunkAck => kind::CHUNK_ACK,
            Message::SnapshotReply(_) => kind::SNAPSHOT_REPLY,
            Message::RemoteFatal(_) => kind::REMOTE_FATAL,
            Message::Refused(_) => kind::REFUSED,
        }
    }

    pub fn name(&self) -> &'static str {
        kind_name(self.kind()).unwrap_or("unknown")
    }

    /// Whether the message asks for an answer (a server accepts only these, after the hello).
    pub fn is_request(&self) -> bool {
        self.kind() < 0x80
    }

    fn body(&self) -> Result<Vec<u8>, postcard::Error> {
        match self {
            Message::Hello(h) => postcard::to_stdvec(h),
            Message::HelloAck(id) => postcard::to_stdvec(id),
            Message::AppendEntries(r) => postcard::to_stdvec(r),
            Message::Vote(r) | Message::PreVote(r) => postcard::to_stdvec(r),
            Message::SnapshotChunk(c) => postcard::to_stdvec(c),
            Message::AppendEntriesReply(r) => postcard::to_stdvec(r),
            Message::VoteReply(r) => postcard::to_stdvec(r),
            Message::ChunkAck => Ok(Vec::new()),
            Message::SnapshotReply(r) => postcard::to_stdvec(r),
            Message::RemoteFatal(s) | Message::Refused(s) => postcard::to_stdvec(s),
        }
    }
}

fn kind_name(k: u8) -> Option<&'static str> {
    Some(match k {
        kind::HELLO => "hello",
        kind::HELLO_ACK => "hello ack",
        kind::APPEND_ENTRIES => "append entries",
        kind::VOTE => "vote",
        kind::PRE_VOTE => "pre-vote",
        kind::SNAPSHOT_CHUNK => "snapshot chunk",
        kind::APPEND_ENTRIES_REPLY => "append entries reply",
        kind::VOTE_REPLY => "vote reply",
        kind::CHUNK_ACK => "chunk ack",
        kind::SNAPSHOT_REPLY => "snapshot reply",
        kind::REMOTE_FATAL => "remote fatal",
        kind::REFUSED => "refused",
        _ => return None,
    })
}

/// A frame as read: header fields and the undecoded body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub id: u64,
    pub group: u32,
    pub kind: u8,
    pub body: Vec<u8>,
}

/// The bytes of one frame, length prefix included; refuses a frame over [`MAX_FRAME`].
pub fn encode(id: u64, group: u32, msg: &Message) -> Result<Vec<u8>, WireError> {
    let body = msg.body().map_err(|e| WireError::Encode {
        kind: msg.name(),
        why: e.to_string(),
    })?;
    let len = HEADER + body.len();
    if len > MAX_FRAME {
        return Err(WireError::TooLarge {
            len,
            cap: MAX_FRAME,
        });
    }
    let mut out = Vec::with_capacity(4 + len);
    // len <= MAX_FRAME, which fits a u32.
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&group.to_be_bytes());
    out.push(msg.kind());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Sets the request id of an encoded frame (encoded with any id, before the id is known).
pub fn set_id(frame: &mut [u8], id: u64) {
    if let Some(slot) = frame.get_mut(4..12) {
        slot.copy_from_slice(&id.to_be_bytes());
    }
}

/// Writes the frames queued on `rx` until every sender is gone; frames queued together go out
/// in one flush.
pub(crate) async fn write_frames<W: AsyncWrite + Unpin>(
    w: W,
    mut rx: mpsc::Receiver<Vec<u8>>,
) -> Result<(), WireError> {
    let io = |source| WireError::Io {
        op: "write frames",
        source,
    };
    let mut w = BufWriter::new(w);
    while let Some(frame) = rx.recv().await {
        w.write_all(&frame).await.map_err(io)?;
        while let Ok(more) = rx.try_recv() {
            w.write_all(&more).await.map_err(io)?;
        }
        w.flush().await.map_err(io)?;
    }
    w.shutdown().await.map_err(io)
}

/// Checks a length prefix before anything is allocated for the frame.
fn check_len(len: u32) -> Result<usize, WireError> {
    let len = len as usize;
    if len < HEADER {
        return Err(WireError::Short { len });
    }
    if len > MAX_FRAME {
        return Err(WireError::TooLarge {
            len,
            cap: MAX_FRAME,
        });
    }
    Ok(len)
}

fn split_header(rest: &[u8]) -> Frame {
    let mut id = [0u8; 8];
    id.copy_from_slice(&rest[..8]);
    let mut group = [0u8; 4];
    group.copy_from_slice(&rest[8..12]);
    Frame {
        id: u64::from_be_bytes(id),
        group: u32::from_be_bytes(group),
        kind: rest[12],
        body: rest[HEADER..].to_vec(),
    }
}

/// Decodes the frame at the start of `buf`: `Ok(None)` when more bytes are needed, else the
/// frame and how many bytes it took.
pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, WireError> {
    let Some(prefix) = buf.get(..4) else {
        return Ok(None);
    };
    let len = check_len(u32::from_be_bytes([
        prefix[0], prefix[1], prefix[2], prefix[3],
    ]))?;
    let Some(rest) = buf.get(4..4 + len) else {
        return Ok(None);
    };
    Ok(Some((split_header(rest), 4 + len)))
}

/// Reads one frame; `Ok(None)` when the peer closed the connection between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Frame>, WireError> {
    let mut prefix = [0u8; 4];
    let got = read_full(r, &mut prefix).await?;
    if got == 0 {
        return Ok(None);
    }
    if got < 4 {
        return Err(WireError::Truncated { got, want: 4 });
    }
    let len = check_len(u32::from_be_bytes(prefix))?;
    let mut rest = vec![0u8; len];
    let got = read_full(r, &mut rest).await?;
    if got < len {
        return Err(WireError::Truncated {
            got: 4 + got,
            want: 4 + len,
        });
    }
    Ok(Some(split_header(&rest)))
}

/// Fills `buf` unless the stream ends first; returns how much it read.
async fn read_full<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> Result<usize, WireError> {
    let mut got = 0;
    while got < buf.len() {
        let n = r
            .read(&mut buf[got..])
            .await
            .map_err(|source| WireError::Io {
                op: "read a frame",
                source,
            })?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}

impl Frame {
    fn body_as<T: DeserializeOwned>(&self, kind: &'static str) -> Result<T, WireError> {
        let (value, extra) =
            postcard::take_from_bytes::<T>(&self.body).map_err(|e| WireError::BadBody {
                id: self.id,
                group: self.group,
                kind,
                why: e.to_string(),
            })?;
        if !extra.is_empty() {
            return Err(WireError::Trailing {
                id: self.id,
                group: self.group,
                kind,
                extra: extra.len(),
            });
        }
        Ok(value)
    }

    /// Decodes the body as its kind says.
    pub fn message(&self) -> Result<Message, WireError> {
        let name = kind_name(self.kind).ok_or(WireError::UnknownKind {
            id: self.id,
            group: self.group,
            kind: self.kind,
        })?;
        Ok(match self.kind {
            kind::HELLO => Message::Hello(self.body_as(name)?),
            kind::HELLO_ACK => Message::HelloAck(self.body_as(name)?),
            kind::APPEND_ENTRIES => Message::AppendEntries(self.body_as(name)?),
            kind::VOTE => Message::Vote(self.body_as(name)?),
            kind::PRE_VOTE => Message::PreVote(self.body_as(name)?),
            kind::SNAPSHOT_CHUNK => Message::SnapshotChunk(self.body_as(name)?),
            kind::APPEND_ENTRIES_REPLY => Message::AppendEntriesReply(self.body_as(name)?),
            kind::VOTE_REPLY => Message::VoteReply(self.body_as(name)?),
            kind::CHUNK_ACK => {
                self.body_as::<()>(name)?;
                Message::ChunkAck
            }
            kind::SNAPSHOT_REPLY => Message::SnapshotReply(self.body_as(name)?),
            kind::REMOTE_FATAL => Message::RemoteFatal(self.body_as(name)?),
            // `kind_name` knows no other kind than refused.
            _ => Message::Refused(self.body_as(name)?),
        })
    }
}
