//! The on-disk format (storage.md §4): superblock copies, batch headers and records.
//!
//! Everything is little-endian at fixed offsets. Every checksum covers the *position* the bytes
//! belong at, the epoch and the format id, so a stale block from an earlier lap, an older epoch,
//! another format, or a write that landed at the wrong address never validates where it is read.

/// Byte offset of superblock copy A; copy B sits at [`SUPERBLOCK_B`]. Fixed, so that choosing a
/// copy never depends on what a copy says.
pub const SUPERBLOCK_A: u64 = 0;
pub const SUPERBLOCK_B: u64 = 1 << 20;
/// Where the log region starts on the device; also the largest write unit the layout allows.
pub const LOG_START: u64 = 2 << 20;
pub const MAX_WRITE_UNIT: u32 = 1 << 20;

/// No log position (byte count since format) and no partition offset reaches this: 2^62 bytes is
/// 146 years at 1 GB/s, 2^62 records 14,000 years at 10M records/s. Anything read from a device
/// at or above it is damaged or forged, and every sum of a position or offset with a length
/// (both far below 2^62) stays in range.
pub const MAX_POSITION: u64 = 1 << 62;
pub const MAX_OFFSET: u64 = 1 << 62;

/// The format version this build writes. Version 2 lets a checkpoint span several batches (a
/// version-1 reader would take the second batch of such a checkpoint for appended records), so
/// every superblock this build writes says 2 and an older build refuses the log instead of
/// misreading it. Version-1 logs (single-batch checkpoints only, a subset of version 2) open
/// unchanged; recovery's first superblock update moves them to version 2.
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format version this build reads.
pub const OLDEST_READABLE_VERSION: u32 = 1;
const SB_MAGIC: u64 = u64::from_le_bytes(*b"NVMQ-SB\x01");
const BATCH_MAGIC: u32 = u32::from_le_bytes(*b"NQB1");

/// Encoded superblock length (the rest of its write unit is zero).
pub const SUPERBLOCK_LEN: usize = 128;
/// Encoded batch header length; records follow it.
pub const BATCH_HEADER_LEN: usize = 64;
/// Encoded record header length; the payload follows it. Records are padded to 8 bytes.
pub const RECORD_HEADER_LEN: usize = 48;

/// Byte offset of superblock copy `copy` (0 = A, 1 = B).
pub fn superblock_offset(copy: u8) -> u64 {
    if copy == 0 {
        SUPERBLOCK_A
    } else {
        SUPERBLOCK_B
    }
}

/// One superblock copy (storage.md §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    /// The format version this copy was written in. A successor is always written in
    /// [`FORMAT_VERSION`]; a decoded copy keeps its own so that its checksum (which a successor
    /// names as its parent) is the one on the device.
    pub version: u32,
    pub format_id: u64,
    /// 0 for copy A, 1 for copy B; must match the slot it is read from.
    pub copy: u8,
    /// Grows by one with every update, alternating copies.
    pub sequence: u64,
    /// Checksum of the superblock this one replaced (0 for the first).
    pub parent: u32,
    pub write_unit: u32,
    pub log_start: u64,
    pub log_size: u64,
    /// Largest batch (bytes on disk) the writer builds.
    pub max_batch: u32,
    /// Oldest retained position.
    pub head: u64,
    /// Batch boundary where a recovery scan starts; the first batch of a checkpoint sits there,
    /// and the superblock names it only once every batch of that checkpoint is durable.
    pub recovery_point: u64,
    /// The header checksum of the batch before the recovery point (the hash chain's link), 0 at 0.
    pub recovery_link: u32,
    /// Position of the (first) checkpoint batch the recovery point resumes from.
    pub checkpoint: u64,
    /// A position known durable when this copy was written.
    pub durable_through: u64,
    pub epoch: u64,
    /// Position where `epoch` starts: batches at or above it carry at least `epoch`.
    pub epoch_start: u64,
    /// In-flight window W in bytes.
    pub window: u64,
}

impl Superblock {
    pub fn encode(&self) -> [u8; SUPERBLOCK_LEN] {
        let mut b = [0u8; SUPERBLOCK_LEN];
        let mut w = Writer::new(&mut b[4..]);
        w.u64(SB_MAGIC);
        w.u32(self.version);
        w.u32(u32::from(self.copy));
        w.u64(self.format_id);
        w.u64(self.sequence);
        w.u32(self.parent);
        w.u32(self.write_unit);
        w.u64(self.log_start);
        w.u64(self.log_size);
        w.u32(self.max_batch);
        w.u32(self.recovery_link);
        w.u64(self.head);
        w.u64(self.recovery_point);
        w.u64(self.checkpoint);
        w.u64(self.durable_through);
        w.u64(self.epoch);
        w.u64(self.epoch_start);
        w.u64(self.window);
        let crc = crc32c::crc32c(&b[4..]);
        b[..4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The checksum a successor names as its parent.
    pub fn checksum(&self) -> u32 {
        let b = self.encode();
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// Decodes the copy read from slot `slot`; the error says why it is not valid.
    pub fn decode(bytes: &[u8], slot: u8) -> Result<Superblock, SuperblockFault> {
        if bytes.len() < SUPERBLOCK_LEN {
            return Err(SuperblockFault::Short);
        }
        let stored = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let mut r = Reader::new(&bytes[4..SUPERBLOCK_LEN]);
        if r.u64() != SB_MAGIC {
            return Err(if bytes.iter().all(|&x| x == 0) {
                SuperblockFault::Blank
            } else {
                SuperblockFault::BadMagic
            });
        }
        if crc32c::crc32c(&bytes[4..SUPERBLOCK_LEN]) != stored {
            return Err(SuperblockFault::BadChecksum);
        }
        let version = r.u32();
        if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(SuperblockFault::Version(version));
        }
        let copy = r.u32();
        let sb = Superblock {
            version,
            copy: copy as u8,
            format_id: r.u64(),
            sequence: r.u64(),
            parent: r.u32(),
            write_unit: r.u32(),
            log_start: r.u64(),
            log_size: r.u64(),
            max_batch: r.u32(),
            recovery_link: r.u32(),
            head: r.u64(),
            recovery_point: r.u64(),
            checkpoint: r.u64(),
            durable_through: r.u64(),
            epoch: r.u64(),
            epoch_start: r.u64(),
            window: r.u64(),
        };
        if copy != u32::from(slot) {
            return Err(SuperblockFault::WrongSlot { says: copy });
        }
        sb.check_geometry()?;
        Ok(sb)
    }

    /// The geometry rules every valid copy obeys; a copy that breaks them is damaged, however
    /// its checksum looks.
    fn check_geometry(&self) -> Result<(), SuperblockFault> {
        let u = u64::from(self.write_unit);
        let bad = SuperblockFault::Geometry;
        if self.write_unit < 512
            || !self.write_unit.is_power_of_two()
            || self.write_unit > MAX_WRITE_UNIT
        {
            return Err(bad(
                "write unit is not a power of two between 512 B and 1 MiB",
            ));
        }
        if self.log_start != LOG_START {
            return Err(bad("log start is not 2 MiB"));
        }
        if self.log_size == 0 || !self.log_size.is_multiple_of(u) {
            return Err(bad("log size is not a positive multiple of the write unit"));
        }
        if self.log_start.checked_add(self.log_size).is_none() {
            return Err(bad("log size runs past the largest device offset"));
        }
        if u64::from(self.max_batch) % u != 0 || self.max_batch == 0 {
            return Err(bad(
                "maximum batch is not a positive multiple of the write unit",
            ));
        }
        if self.window < u64::from(self.max_batch) || self.window >= self.log_size {
            return Err(bad(
                "in-flight window is smaller than a batch or not smaller than the log",
            ));
        }
        // Every update adds one to the sequence and every recovery one to the epoch: 2^63 of
        // either cannot have happened, and such a copy would leave no room for the next update.
        if self.sequence >= 1 << 63 || self.epoch >= 1 << 63 {
            return Err(bad("sequence or epoch is implausibly large"));
        }
        if self.durable_through >= MAX_POSITION || self.epoch_start >= MAX_POSITION {
            return Err(bad("a position is beyond any a log reaches (2^62)"));
        }
        let ordered = self.head <= self.recovery_point
            && self.head <= self.checkpoint
            && self.recovery_point <= self.durable_through
            && self.checkpoint <= self.durable_through;
        if !ordered {
            return Err(bad(
                "head, recovery point, checkpoint and durable through are out of order",
            ));
        }
        if self.durable_through - self.head > self.log_size {
            return Err(bad("retained span is larger than the log"));
        }
        let aligned = [
            self.head,
            self.recovery_point,
            self.checkpoint,
            self.epoch_start,
        ]
        .iter()
        .all(|p| p % u == 0);
        if !aligned {
            return Err(bad(
                "a position that must be a batch boundary is not aligned",
            ));
        }
        Ok(())
    }
}

/// Why a superblock copy is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SuperblockFault {
    #[error("blank (all zero)")]
    Blank,
    #[error("shorter than a superblock")]
    Short,
    #[error("bad magic")]
    BadMagic,
    #[error("checksum mismatch")]
    BadChecksum,
    #[error(
        "format version {0}, which this build cannot read (it reads versions {OLDEST_READABLE_VERSION} to {FORMAT_VERSION}); a newer nvmq wrote this log: open it with that version"
    )]
    Version(u32),
    #[error("copy index says {says}, found in the other slot")]
    WrongSlot { says: u32 },
    #[error("bad geometry: {0}")]
    Geometry(&'static str),
    #[error("read failed: {0}")]
    Unreadable(String),
}

/// What a batch is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchKind {
    /// Appended records (data and registry changes).
    Records = 0,
    /// The state a recovery resumes from (storage.md §4.5).
    Checkpoint = 1,
}

/// A batch header (storage.md §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub format_id: u64,
    pub epoch: u64,
    pub position: u64,
    /// Bytes on disk, header and padding included; a multiple of the write unit.
    pub length: u32,
    pub record_count: u32,
    /// D when the batch was built.
    pub durable_through: u64,
    /// Checksum of the previous batch's header (the hash chain).
    pub prev_hash: u32,
    pub kind: BatchKind,
    pub timestamp_ms: u64,
}

impl BatchHeader {
    /// Encodes into `out` (at least [`BATCH_HEADER_LEN`] bytes) and returns the header checksum,
    /// which the next batch names as `prev_hash`.
    pub fn encode(&self, out: &mut [u8]) -> u32 {
        let mut w = Writer::new(&mut out[4..BATCH_HEADER_LEN]);
        w.u32(BATCH_MAGIC);
        w.u64(self.format_id);
        w.u64(self.epoch);
        w.u64(self.position);
        w.u32(self.length);
        w.u32(self.record_count);
        w.u64(self.durable_through);
        w.u32(self.prev_hash);
        w.u16(self.kind as u16);
        w.u16(0);
        w.u64(self.timestamp_ms);
        let crc = crc32c::crc32c(&out[4..BATCH_HEADER_LEN]);
        out[..4].copy_from_slice(&crc.to_le_bytes());
        crc
    }

    /// Decodes a header expected at `position` of the log with `format_id`. Returns the header and
    /// its checksum. A header that authenticates but names another position is reported as
    /// misplaced, since that is evidence of a misdirected write rather than of a tear.
    pub fn decode(
        bytes: &[u8],
        format_id: u64,
        position: u64,
        write_unit: u32,
    ) -> Result<(BatchHeader, u32), HeaderFault> {
        if bytes.len() < BATCH_HEADER_LEN {
            return Err(HeaderFault::Invalid("short read"));
        }
        let stored = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if crc32c::crc32c(&bytes[4..BATCH_HEADER_LEN]) != stored {
            return Err(HeaderFault::Invalid("header checksum mismatch"));
        }
        let mut r = Reader::new(&bytes[4..BATCH_HEADER_LEN]);
        if r.u32() != BATCH_MAGIC {
            return Err(HeaderFault::Invalid("bad batch magic"));
        }
        let fid = r.u64();
        let epoch = r.u64();
        let pos = r.u64();
        let length = r.u32();
        let record_count = r.u32();
        let durable_through = r.u64();
        let prev_hash = r.u32();
        let kind = match r.u16() {
            0 => BatchKind::Records,
            1 => BatchKind::Checkpoint,
            _ => return Err(HeaderFault::Invalid("unknown batch kind")),
        };
        let _reserved = r.u16();
        let timestamp_ms = r.u64();
        if fid != format_id {
            return Err(HeaderFault::Invalid("format id of another log"));
        }
        let h = BatchHeader {
            format_id: fid,
            epoch,
            position: pos,
            length,
            record_count,
            durable_through,
            prev_hash,
            kind,
            timestamp_ms,
        };
        if pos != position {
            return Err(HeaderFault::Misplaced { header: h });
        }
        // As for superblocks: a recovery adds one to the largest epoch it finds.
        if epoch >= 1 << 63 || pos >= MAX_POSITION {
            return Err(HeaderFault::Invalid(
                "epoch or position is implausibly large",
            ));
        }
        let u = write_unit;
        if length == 0 || !length.is_multiple_of(u) || (length as usize) < BATCH_HEADER_LEN {
            return Err(HeaderFault::Invalid(
                "batch length is not a multiple of the write unit",
            ));
        }
        let min_len = BATCH_HEADER_LEN as u64 + u64::from(record_count) * RECORD_HEADER_LEN as u64;
        if min_len > u64::from(length) {
            return Err(HeaderFault::Invalid(
                "record count does not fit the batch length",
            ));
        }
        Ok((h, stored))
    }
}

/// Why no valid header was found where one was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderFault {
    /// Not a header of this log (torn, blank, stale, garbage).
    Invalid(&'static str),
    /// A valid header of this log that names another position: a misdirected write.
    Misplaced { header: BatchHeader },
}

/// What a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// A producer's payload for a partition.
    Data = 0,
    /// A registry change: the payload names the topic and index of the partition it creates.
    CreatePartition = 1,
    /// Checkpoint state (only inside checkpoint batches): one part of the registry; `offset` is
    /// the part's index and `partition` says whether another part follows (`state` module).
    Checkpoint = 2,
    /// A partition deleted from the registry (`partition` names it; no payload). Its id is never
    /// assigned again, and no record of it may follow.
    DeletePartition = 3,
}

impl RecordKind {
    fn from_u16(v: u16) -> Option<RecordKind> {
        Some(match v {
            0 => RecordKind::Data,
            1 => RecordKind::CreatePartition,
            2 => RecordKind::Checkpoint,
            3 => RecordKind::DeletePartition,
            _ => return None,
        })
    }
}

/// A record header (storage.md §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub len: u32,
    pub kind: RecordKind,
    pub partition: u32,
    /// First offset of the partition this record holds.
    pub offset: u64,
    /// How many consecutive offsets the record holds: 1 for a plain append, the message count
    /// for a Kafka record batch stored whole; 0 for records that hold no offsets (checkpoints,
    /// partition creation).
    pub span: u32,
    pub position: u64,
    pub epoch: u64,
}

/// Bytes a record with `payload_len` payload bytes takes in a batch.
pub fn record_size(payload_len: usize) -> usize {
    (RECORD_HEADER_LEN + payload_len + 7) & !7
}

/// Bytes copied (then checksummed) at a time when a record is encoded: well inside L1.
const COPY_CHUNK: usize = 4096;

fn record_crc(format_id: u64, header_tail: &[u8], payload: &[u8]) -> u32 {
    let c = crc32c::crc32c(&format_id.to_le_bytes());
    let c = crc32c::crc32c_append(c, header_tail);
    crc32c::crc32c_append(c, payload)
}

impl RecordHeader {
    /// Encodes the header and payload into `out` (at least `record_size(payload.len())` bytes).
    pub fn encode(&self, format_id: u64, payload: &[u8], out: &mut [u8]) {
        debug_assert_eq!(self.len as usize, payload.len());
        {
            let mut w = Writer::new(&mut out[4..RECORD_HEADER_LEN]);
            w.u32(self.len);
            w.u16(self.kind as u16);
            w.u16(0);
            w.u32(self.partition);
            w.u64(self.offset);
            w.u64(self.position);
            w.u64(self.epoch);
            w.u32(self.span);
            w.u32(0);
        }
        let end = RECORD_HEADER_LEN + payload.len();
        let c = crc32c::crc32c(&format_id.to_le_bytes());
        let mut crc = crc32c::crc32c_append(c, &out[4..RECORD_HEADER_LEN]);
        // Copy and checksum a piece at a time, while the piece is still in the cache: one pass
        // over the payload in memory, not two.
        for (src, dst) in payload
            .chunks(COPY_CHUNK)
            .zip(out[RECORD_HEADER_LEN..end].chunks_mut(COPY_CHUNK))
        {
            dst.copy_from_slice(src);
            crc = crc32c::crc32c_append(crc, dst);
        }
        let padded = record_size(payload.len());
        out[end..padded].fill(0);
        debug_assert_eq!(
            crc,
            record_crc(format_id, &out[4..RECORD_HEADER_LEN], payload)
        );
        out[..4].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes the record at the start of `bytes`, expected at `position` with `epoch` in the log
    /// `format_id`. Returns the header and its payload.
    pub fn decode(
        bytes: &[u8],
        format_id: u64,
        position: u64,
        epoch: u64,
    ) -> Result<(RecordHeader, &[u8]), &'static str> {
        if bytes.len() < RECORD_HEADER_LEN {
            return Err("record header runs past its batch");
        }
        let stored = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let mut r = Reader::new(&bytes[4..RECORD_HEADER_LEN]);
        let len = r.u32();
        let kind = r.u16();
        let _reserved = r.u16();
        let partition = r.u32();
        let offset = r.u64();
        let pos = r.u64();
        let ep = r.u64();
        let span = r.u32();
        let end = RECORD_HEADER_LEN
            .checked_add(len as usize)
            .ok_or("record length overflows")?;
        if end > bytes.len() {
            return Err("record payload runs past its batch");
        }
        let payload = &bytes[RECORD_HEADER_LEN..end];
        if record_crc(format_id, &bytes[4..RECORD_HEADER_LEN], payload) != stored {
            return Err("record checksum mismatch");
        }
        if pos != position {
            return Err("record names another position");
        }
        if ep != epoch {
            return Err("record epoch differs from its batch");
        }
        let kind = RecordKind::from_u16(kind).ok_or("unknown record kind")?;
        if (kind == RecordKind::Data) != (span > 0) {
            return Err("record span does not fit its kind");
        }
        if offset
            .checked_add(u64::from(span))
            .is_none_or(|end| end >= 1 << 63)
        {
            return Err("record offsets overflow");
        }
        Ok((
            RecordHeader {
                len,
                kind,
                partition,
                offset,
                span,
                position,
                epoch,
            },
            payload,
        ))
    }
}

/// Little-endian cursor writer over a slice whose size the caller guarantees.
struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl<'a> Writer<'a> {
    fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf, at: 0 }
    }
    fn put(&mut self, b: &[u8]) {
        self.buf[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
    }
    fn u16(&mut self, v: u16) {
        self.put(&v.to_le_bytes())
    }
    fn u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes())
    }
}

/// Little-endian cursor reader; reads past the end yield zeros (callers check lengths first and
/// checksums catch anything else), so device bytes can never make it panic.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, at: 0 }
    }
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        if let Some(s) = self.buf.get(self.at..self.at + N) {
            out.copy_from_slice(s);
        }
        self.at += N;
        out
    }
    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    pub(crate) fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    pub(crate) fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.buf.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.at)
    }
}

/// Maps a log position to the device byte offset where it is stored.
pub fn device_offset(sb_log_start: u64, log_size: u64, position: u64) -> u64 {
    sb_log_start + position % log_size
}
