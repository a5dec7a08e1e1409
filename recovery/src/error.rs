use blockdev::DeviceError;
use nvmq_log::LogError;

/// Why a device could not be opened. Every variant names where and what.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RecoveryError {
    #[error("recovery could not {op}: {source}")]
    Device {
        op: &'static str,
        #[source]
        source: DeviceError,
    },
    #[error("device holds no nvmq log (superblock A: {a}; superblock B: {b})")]
    NotFormatted { a: String, b: String },
    #[error("both superblock copies are damaged (A: {a}; B: {b}); refusing to guess")]
    SuperblocksDamaged { a: String, b: String },
    #[error(
        "superblock copy {slot} is in format version {version}, which this build does not read (it reads {oldest} to {newest}): a newer nvmq wrote this log, so open it with that one; refusing to open"
    )]
    UnreadableVersion {
        slot: char,
        version: u32,
        oldest: u32,
        newest: u32,
    },
    #[error("superblock copies disagree: {0}; refusing to open (two devices mixed, or a fork)")]
    SuperblockConflict(String),
    #[error(
        "the device ({capacity} B) is smaller than the log its superblock records ({needed} B)"
    )]
    DeviceTooSmall { capacity: u64, needed: u64 },
    #[error("damage inside acknowledged data at log position {position}: {what}; refusing to open (nothing was cut)")]
    Damage { position: u64, what: String },
    #[error(transparent)]
    Log(#[from] LogError),
}
