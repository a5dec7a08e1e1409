use blockdev::DeviceError;

/// Everything the log refuses or fails at. Each variant names what was being done and where.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LogError {
    #[error("device {op} failed: {source}")]
    Device {
        op: &'static str,
        #[source]
        source: DeviceError,
    },
    #[error(
        "the writer stopped after a fatal device error ({0}); check the device before restarting"
    )]
    WriterStopped(String),
    #[error("the log is shut down")]
    Shutdown,
    #[error("record of {len} bytes does not fit one batch (at most {max} bytes of payload)")]
    RecordTooLarge { len: usize, max: usize },
    #[error("log full: {needed} bytes needed, nothing can be freed without dropping unexpired data (on_full = refuse)")]
    LogFull { needed: u64 },
    #[error("unknown partition {0}")]
    UnknownPartition(u32),
    #[error("partition {topic}/{index} already exists")]
    PartitionExists { topic: String, index: u32 },
    #[error("offset {offset} of partition {partition} is out of range (retained {start}..{end})")]
    OffsetOutOfRange {
        partition: u32,
        offset: u64,
        start: u64,
        end: u64,
    },
    #[error("corrupt record: partition {partition}, offset {offset}, at log position {position}: {what}")]
    Corrupt {
        partition: u32,
        offset: u64,
        position: u64,
        what: String,
    },
    #[error("partition {partition} is at offset {next}: {span} more would pass the largest offset a log holds (2^62)")]
    OffsetsExhausted {
        partition: u32,
        next: u64,
        span: u32,
    },
    #[error("no partition id left: every id below {0} was assigned")]
    PartitionIdsExhausted(u32),
    #[error("not available yet: {0}")]
    Unavailable(String),
    #[error("bad configuration: {0}")]
    Config(String),
    #[error("device holds no nvmq log: {0}")]
    NotFormatted(String),
}

impl LogError {
    pub(crate) fn device(op: &'static str) -> impl FnOnce(DeviceError) -> LogError {
        move |source| LogError::Device { op, source }
    }
}
