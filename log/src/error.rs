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
    /// The registry's checkpoint would outgrow the room the log keeps for it
    /// (`state::checkpoint_budget`).
    #[error(
        "no room for another partition: with it the partition registry ({partitions} partitions) \
         would take a checkpoint of up to {needed} B, more than the {budget} B this log keeps for \
         one (an eighth of its ring besides the in-flight window); delete topics, use shorter \
         topic names, or format a larger log"
    )]
    RegistryFull {
        partitions: usize,
        needed: u64,
        budget: u64,
    },
    /// Appends waited longer than the writer allows without it being able to write anything.
    #[error("not stored: the writer could not write for {waited_ms} ms ({why})")]
    Stalled { waited_ms: u64, why: String },
    #[error("not available yet: {0}")]
    Unavailable(String),
    #[error("bad configuration: {0}")]
    Config(String),
    #[error("device holds no nvmq log: {0}")]
    NotFormatted(String),
    /// The device addresses in blocks that do not divide the log's write unit U: batches, which
    /// start at multiples of U, cannot even be read or written there.
    #[error(
        "the device's logical block is {logical_block} B, which does not divide this log's write \
         unit of {write_unit} B: its batches cannot be addressed on this device. Refusing to open \
         (nothing was written); open it on a device with logical blocks of at most {write_unit} B"
    )]
    LogicalBlockMismatch { logical_block: u64, write_unit: u64 },
    /// The device's read-modify-write granularity (its physical block, or the file system's
    /// block under the file backend) is larger than U, so a batch write would rewrite the end of
    /// the previous, acknowledged batch (see `Geometry::check_device`).
    #[error(
        "the device's {block} is {size} B, but this log was formatted with a write unit of \
         {write_unit} B: every batch write would be a read-modify-write of a {block} it shares \
         with the previous, acknowledged batch, and a power cut during it could damage \
         acknowledged data that recovery would take for a torn tail. Refusing to open (nothing \
         was written). Open the log where that block is at most {write_unit} B (where it was \
         formatted) and drain it there; the device here needs a new format (which picks a write \
         unit of at least {size} B)"
    )]
    BlockExceedsWriteUnit {
        /// "physical block" or "file system block".
        block: &'static str,
        size: u64,
        write_unit: u64,
    },
    /// The device cannot move even one write unit in one I/O.
    #[error(
        "the device's maximum transfer is {max_transfer} B, smaller than this log's write unit \
         of {write_unit} B: not one block of the log can be written whole in one I/O. Refusing to \
         open (nothing was written); use a device or driver setting that takes transfers of at \
         least {write_unit} B"
    )]
    TransferBelowWriteUnit { max_transfer: u64, write_unit: u64 },
    /// The writes of one batch, cut to the device's maximum transfer, with the flushes and the
    /// superblock write the writer keeps in flight, do not fit the device's queue: a submission
    /// would be refused, and a refused write is fatal.
    #[error(
        "the device's queue depth {queue_depth} is too shallow for this log: a batch of up to \
         {max_batch} B goes out in up to {ios_per_batch} writes of at most {max_io} B (the \
         device's maximum transfer), and with {writes} batch(es) and {flushes} flush(es) in \
         flight, a superblock write and room for one read the writer needs {needed} I/Os at \
         once. Refusing to start \
         the writer; lower max_writes_in_flight or max_flushes_in_flight, or use a device (or \
         driver setting) with a deeper queue or a larger maximum transfer"
    )]
    QueueTooShallow {
        queue_depth: usize,
        needed: usize,
        max_batch: u64,
        max_io: u64,
        ios_per_batch: u32,
        writes: usize,
        flushes: usize,
    },
}

impl LogError {
    pub(crate) fn device(op: &'static str) -> impl FnOnce(DeviceError) -> LogError {
        move |source| LogError::Device { op, source }
    }
}
