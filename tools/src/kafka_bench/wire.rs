//! Request frames encoded once (the load loops re-send them with only the correlation id, and for
//! Fetch the offset, patched in place) and the few response fields the bench reads, parsed in
//! place without decoding whole responses.

use anyhow::{anyhow, bail, Result};
use bytes::Bytes;
use frontend::client::{record_batch, request_frame};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{BrokerId, FetchRequest, ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

pub use frontend::client::set_correlation_id;

/// Produce v7 (acks, timeout, topics; base offset and log start offset in the answer).
pub const PRODUCE_VERSION: i16 = 7;
/// Fetch v4: the first with isolation_level; no sessions, no top-level error code.
pub const FETCH_VERSION: i16 = 4;
const CLIENT_ID: &str = "kafka-bench";

/// A Produce frame (acks=-1) carrying one RecordBatch of `records` records of `size` bytes.
pub fn produce_frame(topic: &str, partition: i32, records: usize, size: usize) -> Result<Vec<u8>> {
    let value = vec![0x5au8; size];
    let values: Vec<&[u8]> = vec![&value; records];
    let mut p = PartitionProduceData::default();
    p.index = partition;
    p.records = Some(Bytes::from(record_batch(&values, None)));
    let mut t = TopicProduceData::default();
    t.name = TopicName(StrBytes::from_string(topic.to_string()));
    t.partition_data = vec![p];
    let mut r = ProduceRequest::default();
    r.acks = -1;
    r.timeout_ms = 30_000;
    r.topic_data = vec![t];
    Ok(request_frame(PRODUCE_VERSION, &r, 0, CLIENT_ID)?)
}

/// A Fetch frame for one partition, and where its fetch offset sits (patch it with
/// [`set_fetch_offset`]).
pub fn fetch_frame(
    topic: &str,
    partition: i32,
    max_wait_ms: i32,
    min_bytes: i32,
    max_bytes: i32,
) -> Result<(Vec<u8>, usize)> {
    let mut p = FetchPartition::default();
    p.partition = partition;
    p.fetch_offset = 0;
    p.partition_max_bytes = max_bytes;
    let mut t = FetchTopic::default();
    t.topic = TopicName(StrBytes::from_string(topic.to_string()));
    t.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.replica_id = BrokerId(-1);
    r.max_wait_ms = max_wait_ms;
    r.min_bytes = min_bytes;
    r.max_bytes = max_bytes;
    r.topics = vec![t];
    let frame = request_frame(FETCH_VERSION, &r, 0, CLIENT_ID)?;
    // v4 ends with the one partition: partition, fetch_offset (i64), partition_max_bytes (i32).
    let at = frame
        .len()
        .checked_sub(12)
        .ok_or_else(|| anyhow!("Fetch frame of {} bytes is too short", frame.len()))?;
    Ok((frame, at))
}

pub fn set_fetch_offset(frame: &mut [u8], at: usize, offset: i64) {
    if let Some(slot) = frame.get_mut(at..at + 8) {
        slot.copy_from_slice(&offset.to_be_bytes());
    }
}

/// Reads big-endian fields from a response body, naming the field a short body cut.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Cursor<'a> {
    fn new(b: &'a [u8], what: &'static str) -> Self {
        Cursor { b, at: 0, what }
    }

    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let Some(end) = end else {
            bail!(
                "{} response of {} bytes is cut short reading {field} at byte {}",
                self.what,
                self.b.len(),
                self.at
            );
        };
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn i16(&mut self, field: &str) -> Result<i16> {
        let s = self.take(2, field)?;
        Ok(i16::from_be_bytes([s[0], s[1]]))
    }

    fn i32(&mut self, field: &str) -> Result<i32> {
        let s = self.take(4, field)?;
        Ok(i32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn i64(&mut self, field: &str) -> Result<i64> {
        let s = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(i64::from_be_bytes(a))
    }

    /// A non-nullable string: skipped.
    fn skip_string(&mut self, field: &str) -> Result<()> {
        let n = self.i16(field)?;
        self.take(n.max(0) as usize, field)?;
        Ok(())
    }

    /// An array count that must be `want` (the bench asks about one topic and one partition).
    fn count_is(&mut self, want: i32, field: &str) -> Result<()> {
        let n = self.i32(field)?;
        if n != want {
            bail!("{} response has {n} {field}, expected {want}", self.what);
        }
        Ok(())
    }
}

/// The length of the response frame at the start of `buf` (without its 4-byte length), once its
/// length is there.
pub fn frame_len(buf: &[u8], max: usize) -> Result<Option<usize>> {
    let Some(h) = buf.get(..4) else {
        return Ok(None);
    };
    let n = i32::from_be_bytes([h[0], h[1], h[2], h[3]]);
    match usize::try_from(n) {
        Ok(n) if (4..=max).contains(&n) => Ok(Some(n)),
        _ => bail!("response frame length {n} is outside 4..={max}"),
    }
}

/// The fields of a Produce v7 answer the bench needs.
#[derive(Debug, PartialEq, Eq)]
pub struct ProduceAnswer {
    pub correlation_id: i32,
    pub error_code: i16,
    pub base_offset: i64,
}

/// Parses a Produce answer (frame without its length) to one topic and one partition.
pub fn produce_answer(body: &[u8]) -> Result<ProduceAnswer> {
    let mut c = Cursor::new(body, "Produce");
    let correlation_id = c.i32("correlation_id")?;
    c.count_is(1, "topics")?;
    c.skip_string("topic name")?;
    c.count_is(1, "partitions")?;
    c.i32("partition index")?;
    let error_code = c.i16("error_code")?;
    let base_offset = c.i64("base_offset")?;
    Ok(ProduceAnswer {
        correlation_id,
        error_code,
        base_offset,
    })
}

/// The fields of a Fetch v4 answer the bench needs; `records` borrows the answer's bytes.
#[derive(Debug)]
pub struct FetchAnswer<'a> {
    pub correlation_id: i32,
    pub error_code: i16,
    pub high_watermark: i64,
    pub records: &'a [u8],
}

/// Parses a Fetch v4 answer (frame without its length) to one topic and one partition.
pub fn fetch_answer(body: &[u8]) -> Result<FetchAnswer<'_>> {
    let mut c = Cursor::new(body, "Fetch");
    let correlation_id = c.i32("correlation_id")?;
    c.i32("throttle_time_ms")?;
    c.count_is(1, "topics")?;
    c.skip_string("topic name")?;
    c.count_is(1, "partitions")?;
    c.i32("partition index")?;
    let error_code = c.i16("error_code")?;
    let high_watermark = c.i64("high_watermark")?;
    c.i64("last_stable_offset")?;
    let aborted = c.i32("aborted_transactions")?;
    if aborted > 0 {
        c.take(aborted as usize * 16, "aborted_transactions")?;
    }
    let n = c.i32("records length")?;
    let records = if n > 0 {
        c.take(n as usize, "records")?
    } else {
        &[]
    };
    Ok(FetchAnswer {
        correlation_id,
        error_code,
        high_watermark,
        records,
    })
}

/// One whole RecordBatch in a Fetch answer's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSpan {
    pub base_offset: i64,
    /// Offset of its last record.
    pub last_offset: i64,
    /// Bytes of the batch, header included.
    pub bytes: usize,
}

/// The whole batches at the start of `records` (a trailing partial batch, which a broker may
/// send when it cuts at max_bytes, is left out).
pub fn batches(records: &[u8]) -> impl Iterator<Item = BatchSpan> + '_ {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let h = records.get(at..at + 27)?;
        let base = i64::from_be_bytes(h[..8].try_into().ok()?);
        let len = i32::from_be_bytes(h[8..12].try_into().ok()?);
        let delta = i32::from_be_bytes(h[23..27].try_into().ok()?);
        let bytes = 12usize.checked_add(usize::try_from(len).ok()?)?;
        if bytes < 61 || at + bytes > records.len() || delta < 0 {
            return None;
        }
        at += bytes;
        Some(BatchSpan {
            base_offset: base,
            last_offset: base + i64::from(delta),
            bytes,
        })
    })
}

/// A Kafka error code with its name, for messages.
pub fn error_name(code: i16) -> String {
    match kafka_protocol::error::ResponseError::try_from_code(code) {
        Some(e) => format!("error code {code} ({e})"),
        None => "no error".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::produce_response::{
        PartitionProduceResponse, TopicProduceResponse,
    };
    use kafka_protocol::messages::{FetchResponse, ProduceResponse, RequestHeader};
    use kafka_protocol::protocol::{Decodable, Encodable};

    fn decode_request<R: Decodable>(
        frame: &[u8],
        version: i16,
        header_version: i16,
    ) -> (RequestHeader, R) {
        let len = i32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - 4);
        let mut b = Bytes::copy_from_slice(&frame[4..]);
        let h = RequestHeader::decode(&mut b, header_version).unwrap();
        let r = R::decode(&mut b, version).unwrap();
        assert!(b.is_empty());
        (h, r)
    }

    #[test]
    fn patched_produce_frame_decodes_with_the_new_id_and_the_batch() {
        let mut f = produce_frame("t", 3, 10, 100).unwrap();
        set_correlation_id(&mut f, 0x0102_0304);
        let (h, r): (_, ProduceRequest) = decode_request(&f, PRODUCE_VERSION, 1);
        assert_eq!(h.correlation_id, 0x0102_0304);
        assert_eq!(h.request_api_version, PRODUCE_VERSION);
        assert_eq!(r.acks, -1);
        let p = &r.topic_data[0].partition_data[0];
        assert_eq!(p.index, 3);
        let spans: Vec<_> = batches(p.records.as_ref().unwrap()).collect();
        assert_eq!(spans.len(), 1);
        assert_eq!((spans[0].base_offset, spans[0].last_offset), (0, 9));
    }

    #[test]
    fn patched_fetch_frame_decodes_with_the_new_offset() {
        let (mut f, at) = fetch_frame("topic", 0, 500, 1, 1 << 20).unwrap();
        set_correlation_id(&mut f, 77);
        set_fetch_offset(&mut f, at, 123_456_789_012);
        let (h, r): (_, FetchRequest) = decode_request(&f, FETCH_VERSION, 1);
        assert_eq!(h.correlation_id, 77);
        assert_eq!(r.replica_id, BrokerId(-1));
        assert_eq!((r.max_wait_ms, r.min_bytes, r.max_bytes), (500, 1, 1 << 20));
        let p = &r.topics[0].partitions[0];
        assert_eq!(p.fetch_offset, 123_456_789_012);
        assert_eq!(p.partition_max_bytes, 1 << 20);
    }

    fn body<R: Encodable>(correlation: i32, r: &R, version: i16) -> Vec<u8> {
        let mut b = BytesMut::new();
        b.extend_from_slice(&correlation.to_be_bytes());
        r.encode(&mut b, version).unwrap();
        b.to_vec()
    }

    #[test]
    fn produce_answer_reads_code_and_base_offset() {
        let mut p = PartitionProduceResponse::default();
        p.index = 2;
        p.error_code = 7;
        p.base_offset = 4242;
        let mut t = TopicProduceResponse::default();
        t.name = TopicName(StrBytes::from_static_str("kafka-bench-closed"));
        t.partition_responses = vec![p];
        let mut r = ProduceResponse::default();
        r.responses = vec![t];
        let b = body(9, &r, PRODUCE_VERSION);
        let a = produce_answer(&b).unwrap();
        assert_eq!(
            a,
            ProduceAnswer {
                correlation_id: 9,
                error_code: 7,
                base_offset: 4242
            }
        );
        assert!(error_name(7).contains("RequestTimedOut"));
        let e = format!("{:#}", produce_answer(&b[..20]).unwrap_err());
        assert!(e.contains("cut short"), "{e}");
    }

    #[test]
    fn fetch_answer_yields_whole_batches_only() {
        let one = record_batch(&[b"a", b"b", b"c"], None);
        let two = record_batch(&[b"d"], None);
        let mut records = one.clone();
        records[..8].copy_from_slice(&10i64.to_be_bytes());
        let mut second = two.clone();
        second[..8].copy_from_slice(&13i64.to_be_bytes());
        records.extend_from_slice(&second);
        records.extend_from_slice(&one[..30]); // a cut batch
        let mut p = PartitionData::default();
        p.partition_index = 0;
        p.high_watermark = 14;
        p.aborted_transactions = Some(vec![Default::default()]);
        p.records = Some(Bytes::from(records));
        let mut t = FetchableTopicResponse::default();
        t.topic = TopicName(StrBytes::from_static_str("e"));
        t.partitions = vec![p];
        let mut r = FetchResponse::default();
        r.responses = vec![t];
        let b = body(5, &r, FETCH_VERSION);
        let a = fetch_answer(&b).unwrap();
        assert_eq!(
            (a.correlation_id, a.error_code, a.high_watermark),
            (5, 0, 14)
        );
        let spans: Vec<_> = batches(a.records).collect();
        assert_eq!(
            spans,
            [
                BatchSpan {
                    base_offset: 10,
                    last_offset: 12,
                    bytes: one.len()
                },
                BatchSpan {
                    base_offset: 13,
                    last_offset: 13,
                    bytes: two.len()
                },
            ]
        );
    }

    #[test]
    fn frame_len_refuses_nonsense() {
        assert_eq!(frame_len(&[0, 0], 100).unwrap(), None);
        assert_eq!(frame_len(&[0, 0, 0, 8, 1], 100).unwrap(), Some(8));
        assert!(frame_len(&[0xff, 0xff, 0xff, 0xff], 100).is_err());
        assert!(frame_len(&[0, 0, 1, 0], 100).is_err());
    }
}
