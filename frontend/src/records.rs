//! The records inside a produced batch, checked as Kafka's broker checks them (LogValidator and
//! DefaultRecord.readFrom): exactly as many records as the header claims, each one parsing to
//! its stated length, offset deltas 0, 1, ..., n-1 in order. nvmq stores the batch as sent, so a
//! batch that lies (a header claiming 5,000 records over one) would otherwise take offsets that
//! hold nothing and hand consumers a batch their clients refuse.
//!
//! A compressed batch is decompressed as a stream, through a small buffer, and never held whole
//! (but for a raw, unframed snappy block, which decodes in one piece): what it costs is the
//! decompression itself, bounded by `Checks::max_uncompressed`. A batch yielding more is
//! refused, so a decompression bomb costs at most that many bytes of decompression work and no
//! memory beyond the codec's window (gzip 32 KiB, lz4 a few 64 KiB-4 MiB blocks, zstd a window
//! capped at the bound, snappy-java blocks of 32 KiB).

use std::io::{self, BufRead, BufReader, Read};

use crate::batch::{BatchFault, BatchInfo, HEADER_LEN};
use crate::codes;

/// What a batch must also satisfy, from the broker's configuration and the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checks {
    /// Largest number of bytes the records of a compressed batch may decompress to.
    pub max_uncompressed: usize,
    /// Whether zstd batches are taken: Kafka refuses them in Produce requests below v7 (the
    /// version that says the client knows zstd), with UNSUPPORTED_COMPRESSION_TYPE.
    pub zstd: bool,
}

impl Default for Checks {
    fn default() -> Self {
        Checks {
            max_uncompressed: DEFAULT_MAX_UNCOMPRESSED,
            zstd: true,
        }
    }
}

/// Default bound on what a compressed batch may decompress to: well above what clients batch by
/// default (librdkafka batch.size 1 MB, Java and kafka-python 16 KiB before compression), and a
/// Java producer answered MESSAGE_TOO_LARGE splits its batch and retries.
pub const DEFAULT_MAX_UNCOMPRESSED: usize = 16 << 20;

/// Buffer between a decompressor and the record parser.
const STREAM_BUFFER: usize = 32 << 10;
/// The smallest record: length, attributes, timestamp delta, offset delta, null key, null value,
/// no headers, one byte each.
const MIN_RECORD_BODY: i64 = 6;
/// Snappy expands at most about 21 times (a 3-byte copy op yields 64 bytes): a block claiming
/// more than this per input byte lies, and is refused before its buffer is allocated.
const SNAPPY_MAX_RATIO: usize = 22;
/// xerial snappy-java's stream header (magic, then version and compatible version, 4 bytes each).
const XERIAL_MAGIC: &[u8; 8] = b"\x82SNAPPY\x00";
const XERIAL_HEADER: usize = 16;

fn fault(code: i16, what: String) -> BatchFault {
    BatchFault { code, what }
}

/// The compression codecs of the batch attributes' low three bits.
fn codec_name(id: i16) -> &'static str {
    match id {
        0 => "uncompressed",
        1 => "gzip",
        2 => "snappy",
        3 => "lz4",
        4 => "zstd",
        _ => "unknown",
    }
}

/// Checks the records of one batch (`b` is the whole batch, header included, as `check` cut it).
pub fn check(b: &[u8], info: &BatchInfo, checks: &Checks) -> Result<(), BatchFault> {
    let records = b.get(HEADER_LEN..info.len).unwrap_or_default();
    let codec = info.attributes & 0x07;
    let limit = checks.max_uncompressed as u64;
    let r = match codec {
        0 => parse(&mut Src::new(records, u64::MAX), info.record_count),
        1 => {
            // Concatenated gzip members are one stream, as Java's GZIPInputStream reads them.
            let d = flate2::read::MultiGzDecoder::new(records);
            parse(&mut Src::new(buffered(d, limit), limit), info.record_count)
        }
        2 => {
            let d = Snappy::new(records, limit);
            parse(&mut Src::new(buffered(d, limit), limit), info.record_count)
        }
        3 => {
            let d = lz4_flex::frame::FrameDecoder::new(records);
            parse(&mut Src::new(buffered(d, limit), limit), info.record_count)
        }
        4 if !checks.zstd => {
            return Err(fault(
                codes::UNSUPPORTED_COMPRESSION_TYPE,
                "zstd batches need Produce v7 or later".into(),
            ))
        }
        4 => match zstd_reader(records, limit) {
            Ok(d) => parse(&mut Src::new(buffered(d, limit), limit), info.record_count),
            Err(e) => Err(Why::from_stream(e)),
        },
        other => {
            return Err(fault(
                codes::INVALID_RECORD,
                format!("record batch compression type {other} is not one Kafka defines"),
            ))
        }
    };
    r.map_err(|why| why.fault(codec, info.record_count, checks.max_uncompressed))
}

/// Records of an uncompressed batch checked on the event loop at most (parsing takes about
/// 0.5 ms per MiB: this is about 0.1 ms); a larger batch is checked off the loop.
pub const INLINE_PLAIN: usize = 256 << 10;
/// Decompressed bytes a compressed batch's check may yield on the event loop (gzip decompresses
/// and parses at 3-5 ms per MiB of records: this is 0.1-0.15 ms, and covers the small batches
/// most clients send); a batch that yields more is checked again, whole, off the loop, so what
/// the loop spends on one is bounded by this, whatever the batch holds.
pub const INLINE_UNPACKED: usize = 32 << 10;
/// More than any codec's framing adds to 32 KiB of incompressible data.
const COMPRESSION_FRAMING: usize = 4 << 10;

/// Checks a batch's records when that is cheap enough for the event loop; None when it is not
/// (check it with `check` elsewhere).
pub fn check_inline(b: &[u8], info: &BatchInfo, checks: &Checks) -> Option<Result<(), BatchFault>> {
    if info.attributes & 0x07 == 0 {
        return (info.len.saturating_sub(HEADER_LEN) <= INLINE_PLAIN)
            .then(|| check(b, info, checks));
    }
    if checks.max_uncompressed <= INLINE_UNPACKED {
        return Some(check(b, info, checks));
    }
    // Compression hardly ever makes data larger by more than its framing: a compressed payload
    // well over the loop's share decompresses past it too, so trying on the loop first would
    // only decompress its start twice.
    if info.len.saturating_sub(HEADER_LEN) > INLINE_UNPACKED + COMPRESSION_FRAMING {
        return None;
    }
    let small = Checks {
        max_uncompressed: INLINE_UNPACKED,
        ..*checks
    };
    match check(b, info, &small) {
        // More than the loop's share, not necessarily more than the batch may yield.
        Err(f) if f.code == codes::MESSAGE_TOO_LARGE => None,
        r => Some(r),
    }
}

/// At most `limit + 1` decompressed bytes, through a buffer: one past the limit is how the parser
/// learns there was more.
fn buffered<R: Read>(r: R, limit: u64) -> BufReader<io::Take<R>> {
    BufReader::with_capacity(STREAM_BUFFER, r.take(limit.saturating_add(1)))
}

fn zstd_reader(records: &[u8], limit: u64) -> io::Result<zstd::stream::read::Decoder<'_, &[u8]>> {
    let mut d = zstd::stream::read::Decoder::with_buffer(records)?;
    // The window is memory the decoder allocates from what the frame header says: a frame may
    // not ask for more than the batch may decompress to (clients compress one batch in one
    // go, so their window never exceeds the content).
    let log = (64 - limit.max(1 << 10).saturating_sub(1).leading_zeros()).min(27);
    d.window_log_max(log)?;
    Ok(d)
}

/// Why a batch's records were refused (turned into a fault naming the batch's codec and count).
#[derive(Debug)]
enum Why {
    /// Fewer records than the header claims.
    Missing { found: i32 },
    /// Bytes after the last record the header claims.
    Trailing,
    /// Record `index` is malformed.
    Record { index: i32, what: String },
    /// The stream yielded more than the bound.
    TooLarge,
    /// The decompressor failed.
    Stream(io::Error),
}

impl Why {
    fn fault(self, codec: i16, count: i32, limit: usize) -> BatchFault {
        let name = codec_name(codec);
        match self {
            Why::Missing { found } => fault(
                codes::INVALID_RECORD,
                format!("{name} record batch claims {count} records but holds {found}"),
            ),
            Why::Trailing => fault(
                codes::INVALID_RECORD,
                format!("{name} record batch claims {count} records but holds more"),
            ),
            Why::Record { index, what } => fault(
                codes::INVALID_RECORD,
                format!("{name} record batch, record {index}: {what}"),
            ),
            Why::TooLarge => fault(
                codes::MESSAGE_TOO_LARGE,
                format!("{name} record batch decompresses to more than {limit} bytes"),
            ),
            Why::Stream(e) => fault(
                codes::CORRUPT_MESSAGE,
                format!("{name} record batch does not decompress: {e}"),
            ),
        }
    }
}

/// A byte source over a buffered stream, counting what it consumed. Its reads answer
/// `Err(Why)` for what ends the check at once (the limit, a failing decompressor) and
/// `Ok(Err(what))` for a field that is malformed (the record's fault).
struct Src<R> {
    r: R,
    at: u64,
    limit: u64,
}

type Field<T> = Result<Result<T, &'static str>, Why>;

impl<R: BufRead> Src<R> {
    fn new(r: R, limit: u64) -> Self {
        Src { r, at: 0, limit }
    }

    fn at_end(&mut self) -> Result<bool, Why> {
        Ok(self.r.fill_buf().map_err(Why::from_stream)?.is_empty())
    }

    fn advance(&mut self, n: usize) -> Result<(), Why> {
        self.r.consume(n);
        self.at += n as u64;
        if self.at > self.limit {
            return Err(Why::TooLarge);
        }
        Ok(())
    }

    fn byte(&mut self) -> Field<u8> {
        let b = match self.r.fill_buf().map_err(Why::from_stream)?.first() {
            Some(&b) => b,
            None => return Ok(Err("the records end inside it")),
        };
        self.advance(1)?;
        Ok(Ok(b))
    }

    /// Skips `n` bytes.
    fn skip(&mut self, mut n: u64) -> Field<()> {
        while n > 0 {
            let avail = self.r.fill_buf().map_err(Why::from_stream)?.len();
            if avail == 0 {
                return Ok(Err("the records end inside it"));
            }
            let k = n.min(avail as u64) as usize;
            self.advance(k)?;
            n -= k as u64;
        }
        Ok(Ok(()))
    }

    /// A zigzag varint of at most `max_bytes` bytes (5 for an int, 10 for a long, as Kafka's
    /// ByteUtils reads them).
    fn varint(&mut self, max_bytes: u32) -> Field<i64> {
        let mut v: u64 = 0;
        for i in 0..max_bytes {
            let b = match self.byte()? {
                Ok(b) => b,
                Err(e) => return Ok(Err(e)),
            };
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(Ok(((v >> 1) as i64) ^ -((v & 1) as i64)));
            }
        }
        Ok(Err("a varint longer than Kafka allows"))
    }
}

/// Reads exactly `count` records and then the end of the stream.
fn parse<R: BufRead>(src: &mut Src<R>, count: i32) -> Result<(), Why> {
    for index in 0..count {
        // The end of the stream where a record should start: fewer records than claimed.
        if src.at_end()? {
            return Err(Why::Missing { found: index });
        }
        record(src, index)?;
    }
    if !src.at_end()? {
        return Err(Why::Trailing);
    }
    Ok(())
}

/// One record: a length, then fields that take exactly that many bytes.
fn record<R: BufRead>(src: &mut Src<R>, index: i32) -> Result<(), Why> {
    let bad = |what: String| Why::Record { index, what };
    let len = match src.varint(5)? {
        Ok(n) => n,
        Err(e) => return Err(bad(format!("length: {e}"))),
    };
    if len < MIN_RECORD_BODY {
        return Err(bad(format!("length {len} is below the smallest record's")));
    }
    let start = src.at;
    let end = start.saturating_add(len as u64);
    // The next field; one that is malformed or runs past the record's length is its fault.
    macro_rules! field {
        ($read:expr, $what:expr) => {{
            let v = match $read? {
                Ok(v) => v,
                Err(e) => return Err(bad(format!("{}: {e}", $what))),
            };
            if src.at > end {
                return Err(bad(format!("{} runs past its {len}-byte length", $what)));
            }
            v
        }};
    }
    field!(src.byte(), "attributes");
    field!(src.varint(10), "timestamp delta");
    let delta = field!(src.varint(5), "offset delta");
    if delta != i64::from(index) {
        return Err(bad(format!(
            "offset delta {delta} where {index} was due (deltas run 0, 1, ... in order)"
        )));
    }
    let key = field!(src.varint(5), "key length");
    if key >= 0 {
        field!(skip_within(src, key, end), format!("key of {key} bytes"));
    }
    let value = field!(src.varint(5), "value length");
    if value >= 0 {
        field!(
            skip_within(src, value, end),
            format!("value of {value} bytes")
        );
    }
    let headers = field!(src.varint(5), "header count");
    if headers < 0 {
        return Err(bad(format!("header count {headers}")));
    }
    for h in 0..headers {
        let k = field!(src.varint(5), format!("header {h} key length"));
        if k < 0 {
            return Err(bad(format!("header {h} has key length {k}")));
        }
        field!(skip_within(src, k, end), format!("header {h} key"));
        let v = field!(src.varint(5), format!("header {h} value length"));
        if v >= 0 {
            field!(skip_within(src, v, end), format!("header {h} value"));
        }
    }
    if src.at != end {
        return Err(bad(format!(
            "its fields take {} of its {len} bytes",
            src.at - start
        )));
    }
    Ok(())
}

/// Skips a field of `n` bytes, checked against the record's end (`end`) before anything is read.
fn skip_within<R: BufRead>(src: &mut Src<R>, n: i64, end: u64) -> Field<()> {
    if src.at.saturating_add(n as u64) > end {
        return Ok(Err("runs past the record's length"));
    }
    src.skip(n as u64)
}

/// Snappy as Kafka producers write it: xerial snappy-java's framing (a header, then blocks, each
/// a 4-byte length and a raw snappy block), or one raw block (what snappy-java also reads).
/// Blocks are decompressed one at a time into a buffer reused across them; a block may not
/// claim more than the bytes left under the limit, nor more than its input could yield.
struct Snappy<'a> {
    input: &'a [u8],
    framed: bool,
    block: Vec<u8>,
    pos: usize,
    /// Decompressed bytes still allowed (one past the limit, as `buffered` allows).
    allowance: u64,
    dec: snap::raw::Decoder,
}

impl<'a> Snappy<'a> {
    fn new(input: &'a [u8], limit: u64) -> Self {
        let framed = input.starts_with(XERIAL_MAGIC);
        Snappy {
            input: if framed {
                input.get(XERIAL_HEADER..).unwrap_or_default()
            } else {
                input
            },
            framed,
            block: Vec::new(),
            pos: 0,
            allowance: limit.saturating_add(1),
            dec: snap::raw::Decoder::new(),
        }
    }

    /// Decompresses the next block into `self.block`; false at the end of the input.
    fn next_block(&mut self) -> io::Result<bool> {
        if self.input.is_empty() {
            return Ok(false);
        }
        let compressed = if self.framed {
            let (len, rest) = match self.input.split_first_chunk::<4>() {
                Some((l, rest)) => (u32::from_be_bytes(*l) as usize, rest),
                None => return Err(corrupt("snappy block length cut short")),
            };
            let Some((block, rest)) = rest.split_at_checked(len) else {
                return Err(corrupt("snappy block runs past the batch"));
            };
            self.input = rest;
            block
        } else {
            std::mem::take(&mut self.input)
        };
        let n = snap::raw::decompress_len(compressed).map_err(|e| corrupt(&e.to_string()))?;
        if n > compressed.len().saturating_mul(SNAPPY_MAX_RATIO) + 64 {
            return Err(corrupt("snappy block claims more than its bytes can hold"));
        }
        if n as u64 > self.allowance {
            // More than the limit allows: yield what is allowed so the parser sees the excess.
            return Err(io::Error::other(TooLarge));
        }
        self.allowance -= n as u64;
        self.block.clear();
        self.block.resize(n, 0);
        self.dec
            .decompress(compressed, &mut self.block)
            .map_err(|e| corrupt(&e.to_string()))?;
        self.pos = 0;
        Ok(true)
    }
}

/// A snappy block larger than the bytes a batch may still decompress to.
#[derive(Debug, thiserror::Error)]
#[error("over the decompression limit")]
struct TooLarge;

fn corrupt(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

impl Read for Snappy<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.block.len() {
            if !self.next_block()? {
                return Ok(0);
            }
        }
        let n = buf.len().min(self.block.len() - self.pos);
        buf[..n].copy_from_slice(&self.block[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Why {
    /// A decompressor's error that is the limit speaking is the limit's fault, not corruption.
    fn from_stream(e: io::Error) -> Why {
        // zstd refuses a frame whose window exceeds `window_log_max` with this error (its
        // ZSTD_error_frameParameter_windowTooLarge, which the crate passes on only as text).
        let window = e.kind() == io::ErrorKind::Other
            && e.to_string() == "Frame requires too much memory for decoding";
        if window || e.get_ref().is_some_and(|x| x.is::<TooLarge>()) {
            Why::TooLarge
        } else {
            Why::Stream(e)
        }
    }
}

#[cfg(test)]
#[path = "records_tests.rs"]
mod tests;
