//! Produce: each partition's RecordBatch is checked and stored whole as one log record spanning
//! its messages; acks=-1 and acks=1 are answered once the flush covering it completed.

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;
use nvmq_log::{Appended, LogError};
use tokio::sync::oneshot;

use crate::batch;
use crate::broker::Broker;
use crate::codes;
use crate::conn::{Ctx, Outcome, Reply};
use crate::part::PartRef;
use crate::producers::{BatchKey, Landing, Verdict};

enum Wait {
    Stored(oneshot::Receiver<Result<Appended, LogError>>),
    Duplicate(Landing),
    /// Ceiling mode: answered without storing.
    Ceiling,
}

struct PartWait {
    index: i32,
    partition: Option<PartRef>,
    error: Option<(i16, String)>,
    waits: Vec<Wait>,
}

pub fn log_error_code(e: &LogError) -> i16 {
    match e {
        LogError::RecordTooLarge { .. } => codes::MESSAGE_TOO_LARGE,
        LogError::UnknownPartition(_) => codes::UNKNOWN_TOPIC_OR_PARTITION,
        LogError::OffsetOutOfRange { .. } => codes::OFFSET_OUT_OF_RANGE,
        LogError::Corrupt { .. } => codes::CORRUPT_MESSAGE,
        _ => codes::KAFKA_STORAGE_ERROR,
    }
}

pub async fn produce(b: &Arc<Broker>, ctx: &Ctx, req: ProduceRequest) -> Reply {
    let acks = req.acks;
    let mut topics: Vec<(kafka_protocol::messages::TopicName, Vec<PartWait>)> = Vec::new();
    for t in req.topic_data {
        let mut parts = Vec::new();
        for p in t.partition_data {
            let pid = b.topics().partition(t.name.as_str(), p.index);
            let mut pw = PartWait {
                index: p.index,
                partition: pid,
                error: None,
                waits: Vec::new(),
            };
            pw.error = if req.transactional_id.is_some() {
                Some((
                    codes::INVALID_REQUEST,
                    "transactions are not supported".into(),
                ))
            } else if !matches!(acks, -1..=1) {
                Some((codes::INVALID_REQUIRED_ACKS, format!("acks={acks}")))
            } else if let Some(pid) = pid {
                start_partition(b, pid, p.records.as_deref().unwrap_or(&[]), &mut pw.waits).await
            } else {
                Some((
                    codes::UNKNOWN_TOPIC_OR_PARTITION,
                    format!("{}/{} does not exist", t.name.as_str(), p.index),
                ))
            };
            if let Some((code, what)) = &pw.error {
                tracing::debug!(topic = t.name.as_str(), partition = p.index, code, %what, "produce refused");
            }
            parts.push(pw);
        }
        topics.push((t.name, parts));
    }
    if acks == 0 {
        return Box::pin(async { Outcome::Nothing });
    }
    let b = b.clone();
    let ctx = ctx.clone();
    let timeout = u64::try_from(req.timeout_ms).ok().filter(|&t| t > 0);
    Box::pin(async move {
        let mut resp = ProduceResponse::default();
        let deadline = timeout.map(|t| tokio::time::Instant::now() + Duration::from_millis(t));
        for (name, parts) in topics {
            let mut tr = TopicProduceResponse::default();
            tr.name = name;
            for pw in parts {
                let mut pr = PartitionProduceResponse::default();
                pr.index = pw.index;
                pr.log_append_time_ms = -1;
                match pw.error {
                    Some((code, what)) => {
                        pr.error_code = code;
                        pr.base_offset = -1;
                        if ctx.version >= 8 {
                            pr.error_message = Some(StrBytes::from_string(what));
                        }
                    }
                    None => {
                        let (code, base) = finish(pw.waits, deadline).await;
                        pr.error_code = code;
                        pr.base_offset = base;
                    }
                }
                if ctx.version >= 5 {
                    pr.log_start_offset = pw
                        .partition
                        .and_then(|p| b.bounds(p))
                        .map_or(-1, |(s, _)| s as i64);
                }
                tr.partition_responses.push(pr);
            }
            resp.responses.push(tr);
        }
        ctx.encode(&resp)
    })
}

/// Checks and queues the partition's batches in order; None when all are queued.
async fn start_partition(
    b: &Broker,
    pid: PartRef,
    records: &[u8],
    waits: &mut Vec<Wait>,
) -> Option<(i16, String)> {
    let batches = match batch::split(records) {
        Ok(v) => v,
        Err(f) => return Some((f.code, f.what)),
    };
    if b.cfg.ceiling {
        // Checked like any batch, answered without the log: the bench's ceiling.
        waits.extend(batches.iter().map(|_| Wait::Ceiling));
        return None;
    }
    if let Some(refused) = oversized(&batches, b.log_of(pid).max_payload()) {
        return Some(refused);
    }
    for (info, bytes) in batches {
        match b.producers.check(pid, &info) {
            Verdict::Refuse(code, what) => return Some((code, what)),
            Verdict::Duplicate(l) => waits.push(Wait::Duplicate(l)),
            Verdict::Store(landing) => {
                // Every append to a data partition reports its acknowledgement (in log order):
                // the producer snapshots rely on seeing all of them.
                let producers = b.producers().clone();
                let key = BatchKey::of(&info);
                let span = info.span();
                let r = b
                    .append_with(pid, bytes.to_vec(), span, move |r| {
                        let result = r.as_ref().map(|a| (a.offset, span)).map_err(|_| ());
                        producers.acknowledged(pid, key, landing, result);
                    })
                    .await;
                match r {
                    Ok(rx) => waits.push(Wait::Stored(rx)),
                    // The refused append dropped its landing's sender: the producers take the
                    // retry as a new batch (see `Producers::check`), not as a duplicate.
                    Err(e) => return Some((log_error_code(&e), e.to_string())),
                }
            }
        }
    }
    None
}

/// MESSAGE_TOO_LARGE for the first batch larger than a record of the log may be.
pub(crate) fn oversized(
    batches: &[(crate::batch::BatchInfo, &[u8])],
    max: usize,
) -> Option<(i16, String)> {
    let (info, _) = batches.iter().find(|(_, bytes)| bytes.len() > max)?;
    Some((
        codes::MESSAGE_TOO_LARGE,
        format!(
            "record batch of {} bytes exceeds the {max}-byte limit",
            info.len
        ),
    ))
}

/// Waits for the partition's batches; (error code, base offset of the first).
async fn finish(waits: Vec<Wait>, deadline: Option<tokio::time::Instant>) -> (i16, i64) {
    let all = async {
        let mut base = -1i64;
        for w in waits {
            let offset = match w {
                Wait::Stored(rx) => match rx.await {
                    Ok(Ok(a)) => a.offset as i64,
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "append failed");
                        return (log_error_code(&e), -1);
                    }
                    Err(_) => return (codes::KAFKA_STORAGE_ERROR, -1),
                },
                Wait::Ceiling => 0,
                Wait::Duplicate(mut l) => match l.wait_for(|v| v.is_some()).await {
                    Ok(v) => match *v {
                        Some(Ok(o)) => o,
                        _ => return (codes::KAFKA_STORAGE_ERROR, -1),
                    },
                    Err(_) => return (codes::KAFKA_STORAGE_ERROR, -1),
                },
            };
            if base < 0 {
                base = offset;
            }
        }
        (codes::NONE, base)
    };
    match deadline {
        Some(d) => tokio::time::timeout_at(d, all)
            .await
            .unwrap_or((codes::REQUEST_TIMED_OUT, -1)),
        None => all.await,
    }
}
