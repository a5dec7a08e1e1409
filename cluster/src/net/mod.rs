//! The cluster's transport between nodes: openraft's RPCs in length-prefixed frames over one TCP
//! connection per peer, shared by every Raft group of the node (docs/cluster.md "Transport").
//!
//! - [`wire`]: the frame format and its decoder.
//! - `server`: the internal listener, dispatching frames to the groups' Rafts.
//! - `pool`: the connections to peers, with request ids matching replies.
//! - `network`: openraft's `RaftNetworkFactory` / `RaftNetworkV2` over the pool.
//! - `node`: a node tying them together.

mod error;
mod network;
mod node;
mod pool;
mod registry;
mod server;
pub mod wire;

pub use error::NetError;
pub use network::{Network, PeerClient};
pub use node::Node;
pub use pool::{Peer, PeerTable};
pub use registry::{GroupRaft, Registry};
pub use server::MAX_SNAPSHOT;
