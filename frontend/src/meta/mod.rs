//! nvmq's own records in its internal partitions: topic tombstones, producer ids, group
//! generations, idempotent producers' state, time indexes, SCRAM credentials, ACL bindings,
//! topic configs and log start offsets in `__nvmq_meta`, committed offsets in
//! `__consumer_offsets`. Replayed on start.
//!
//! What the records say (`records`) is kept apart from how their bytes are laid out (`codec`,
//! which reads them through `cursor`).

mod codec;
mod cursor;
mod records;

pub(crate) use codec::put_str;
pub(crate) use cursor::Cursor;
pub use records::*;

pub const META_TOPIC: &str = "__nvmq_meta";
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("internal record at offset {offset} of {topic}: {what}")]
pub struct MetaFault {
    pub topic: &'static str,
    pub offset: u64,
    pub what: String,
}

#[cfg(test)]
mod tests;
