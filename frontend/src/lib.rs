//! nvmq's Kafka protocol frontend: a tokio TCP server that speaks the Kafka wire protocol (a
//! subset: see `versions::TABLE`) over the shared log. Produced RecordBatches are stored whole as
//! log records spanning their messages; acks go out only after the flush that covers them.
#![forbid(unsafe_code)]

pub mod acl;
pub mod admin;
pub mod batch;
pub mod broker;
pub mod broker_config;
pub mod client;
pub mod codes;
pub mod config_api;
pub mod conn;
pub mod credentials;
pub mod epoch;
pub mod fetch;
pub mod group_admin;
pub mod group_admin_api;
pub mod group_api;
pub mod groups;
pub mod log_api;
pub mod meta;
pub mod offload;
pub mod offsets;
pub mod part;
pub mod placement;
pub mod produce;
pub mod producer_snapshots;
pub mod producers;
pub mod quorum_api;
pub mod reactor;
pub mod records;
pub mod replica;
pub mod sasl;
pub mod scram_api;
pub mod server;
pub mod session;
pub mod shape;
pub mod snapshot_parts;
mod startup;
pub mod time_index;
pub mod tls;
pub mod topic_config;
pub mod topic_ids;
pub mod versions;

pub use broker::{Broker, Config, Startup};
pub use part::PartRef;
pub use reactor::{CheckGate, Server, ServerOptions};

use nvmq_log::LogError;

/// What can stop the frontend from starting or serving.
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    #[error("log error while {op}: {source}")]
    Log {
        op: &'static str,
        #[source]
        source: LogError,
    },
    #[error("internal record at offset {offset} of {topic} is unreadable: {what}")]
    Meta {
        topic: &'static str,
        offset: u64,
        what: String,
    },
    #[error("could not start a thread: {0}")]
    Thread(String),
    #[error("bad configuration: {0}")]
    Config(String),
    #[error("network error while {op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
}
