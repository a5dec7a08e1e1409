//! Errors of the cluster transport, each naming the peer and what was wrong.

use std::net::SocketAddr;

use super::wire::WireError;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("node {node}: listen on {addr}: {source}")]
    Bind {
        node: u64,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("connection with {peer}: {source}")]
    Frame {
        peer: SocketAddr,
        #[source]
        source: WireError,
    },
    #[error(
        "connection with {peer}: frame {id} is for group {group}, which this node does not run"
    )]
    UnknownGroup {
        peer: SocketAddr,
        id: u64,
        group: u32,
    },
    #[error("connection with {peer}: a {kind} frame where {expected} was expected")]
    Unexpected {
        peer: SocketAddr,
        kind: &'static str,
        expected: &'static str,
    },
    #[error("connection with {peer}: it speaks transport version {theirs}, this node {ours}")]
    Version {
        peer: SocketAddr,
        theirs: u16,
        ours: u16,
    },
    #[error("connection with {peer}: it dialled node {asked}, this is node {me}")]
    WrongNode {
        peer: SocketAddr,
        asked: u64,
        me: u64,
    },
    #[error(
        "connection with {peer}: group {group}: snapshot chunk at offset {offset} of transfer \
         {transfer}: {why}"
    )]
    Chunk {
        peer: SocketAddr,
        group: u32,
        transfer: u64,
        offset: u64,
        why: String,
    },
    #[error("node {target} at {addr}: {op}: {source}")]
    Connect {
        target: u64,
        addr: String,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("node {target} at {addr}: {why}")]
    Handshake {
        target: u64,
        addr: String,
        why: String,
    },
    #[error("node {target}: no internal address known (not in the peer table: {why})")]
    NoAddress { target: u64, why: String },
    #[error("node {node}: group {group}: shut down its Raft: {why}")]
    Shutdown { node: u64, group: u32, why: String },
}
