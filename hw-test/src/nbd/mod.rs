//! `nvmq-nbd`: an NBD server that models a drive's volatile write cache and can cut its power.
//!
//! Killing QEMU loses nothing QEMU already wrote to its backing file, so the power cut of a
//! guest's NVMe has to happen in the storage behind it. QEMU attaches NBD natively, and a guest
//! NVMe Flush reaches the server as NBD_CMD_FLUSH. The server keeps every write it has answered
//! in a volatile cache over a backing image (the medium, written only by a flush, a FUA write or
//! destaging of an oversized cache) and, on a cut, applies blockdev's sim crash model to the
//! cache: each unflushed write survives whole, is lost, or is torn at 512-byte sectors, in a
//! seeded order, from a given seed. A flushed write is on the synced image before its flush is
//! answered, so a cut never touches it.
//!
//! Protocol subset: fixed newstyle negotiation (NBD_OPT_GO, NBD_OPT_INFO, NBD_OPT_EXPORT_NAME,
//! NBD_OPT_LIST, NBD_OPT_ABORT; others answered NBD_REP_ERR_UNSUP), simple replies, READ, WRITE
//! (with FUA), FLUSH, DISC. Requests must be 512-byte aligned (advertised as the minimum block
//! size).
mod client;
mod conn;
pub mod control;
mod error;
mod proto;
mod server;
mod store;

pub use client::{list_exports, Client};
pub use error::NbdError;
pub use proto::{CMD_FLAG_FUA, CMD_FLUSH, CMD_READ, CMD_WRITE, EINVAL, ENOSPC};
pub use server::{Server, ServerConfig};
pub use store::{CutOutcome, StoreStats};
