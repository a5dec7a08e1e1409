use std::path::PathBuf;

/// Failures of the power-cut NBD server and its control and test clients, each naming the
/// operation and the file, socket or offset involved.
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    #[error("{op} image {path}: {source}")]
    Image {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("image {path} is {size} bytes: the export needs a positive multiple of 512")]
    ImageSize { path: PathBuf, size: u64 },
    #[error("{op} {addr}: {source}")]
    Socket {
        op: &'static str,
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("NBD peer {peer}: {reason}")]
    Protocol { peer: String, reason: String },
    #[error("NBD request {op} at offset {offset} length {length} failed with error {errno}")]
    Request {
        op: &'static str,
        offset: u64,
        length: u32,
        errno: u32,
    },
    #[error("control command {command:?}: {reason}")]
    Control { command: String, reason: String },
}
