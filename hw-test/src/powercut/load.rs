//! The producers: acks=all batches of rig records, each ack written to the ledger (and synced)
//! before it is counted.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use frontend::client::{record_batch, Client};
use kafka_protocol::messages::ProduceRequest;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::powercut::ledger::{Entry, Ledger};
use crate::powercut::payload::{self, RecordId};
use crate::powercut::{wire, RigError};

/// What every producer of a cycle shares.
pub struct LoadCtx {
    pub addr: String,
    pub topic: String,
    pub partitions: i32,
    pub run: u64,
    pub cycle: u32,
    pub body_len: (usize, usize),
    pub batch: u32,
    pub in_flight: usize,
    pub request_timeout: Duration,
    /// How long after the stop signal answers still in flight are waited for.
    pub drain: Duration,
    pub ledger: Arc<Mutex<Ledger>>,
    /// Records acknowledged and on the ledger, this cycle.
    pub acked: Arc<AtomicU64>,
}

/// Records sent together in one produce request. Resent as they were (same ids, same bytes).
#[derive(Debug, Clone)]
pub struct Batch {
    pub partition: i32,
    pub ids: Vec<RecordId>,
}

/// How one producer's cycle ended.
#[derive(Debug, Default)]
pub struct ProducerOutcome {
    pub sent: u64,
    pub acked: u64,
    /// Records the broker answered with an error (not acknowledged; resent next cycle).
    pub refused: u64,
    /// Batches sent (or queued) without an ack: resent in the next cycle.
    pub unacked: Vec<Batch>,
    pub ended: String,
}

struct InFlight {
    correlation: i32,
    batch: Batch,
    /// (length, CRC32C) of each record as sent.
    sums: Vec<(u32, u32)>,
}

fn lost_ledger(e: impl std::fmt::Display) -> RigError {
    RigError::Ledger(e.to_string())
}

/// One producer for one cycle: resends `queue` first, then new records, until the stop signal
/// (then waits up to `drain` for the answers in flight) or until the connection breaks.
pub async fn producer(
    ctx: Arc<LoadCtx>,
    producer: u32,
    mut queue: VecDeque<Batch>,
    mut stop: watch::Receiver<bool>,
) -> Result<ProducerOutcome, RigError> {
    let mut out = ProducerOutcome::default();
    let partition = (producer % ctx.partitions.max(1) as u32) as i32;
    let mut seq = 0u64;
    let mut inflight: VecDeque<InFlight> = VecDeque::new();
    let client_id = format!("nvmq-rig-p{producer}");
    let mut client = match wire::connect(&ctx.addr, &client_id, ctx.request_timeout).await {
        Ok(c) => c,
        Err(e) => {
            out.unacked = queue.into();
            out.ended = e.to_string();
            return Ok(out);
        }
    };
    let mut stopping = *stop.borrow();
    let mut deadline = Instant::now() + ctx.drain;
    out.ended = loop {
        while !stopping && inflight.len() < ctx.in_flight {
            let batch = queue.pop_front().unwrap_or_else(|| {
                let ids = (0..ctx.batch)
                    .map(|_| {
                        seq += 1;
                        RecordId {
                            cycle: ctx.cycle,
                            producer,
                            seq,
                        }
                    })
                    .collect();
                Batch { partition, ids }
            });
            match send(&mut client, &ctx, &batch).await {
                Ok((correlation, sums)) => {
                    out.sent += batch.ids.len() as u64;
                    inflight.push_back(InFlight {
                        correlation,
                        batch,
                        sums,
                    });
                }
                Err(e) => {
                    queue.push_front(batch);
                    stopping = true;
                    deadline = Instant::now();
                    tracing::debug!(producer, error = %e, "send failed");
                }
            }
        }
        if inflight.is_empty() {
            break "stopped".to_string();
        }
        // The receive is kept across the stop signal (dropping it half-read would desynchronise
        // the connection); only the drain deadline abandons it, and the connection with it.
        let answer = {
            let recv = client.recv::<ProduceRequest>(wire::PRODUCE_VERSION);
            tokio::pin!(recv);
            loop {
                tokio::select! {
                    r = &mut recv => break Some(r),
                    _ = stop.changed(), if !stopping => {
                        stopping = true;
                        deadline = Instant::now() + ctx.drain;
                    }
                    _ = tokio::time::sleep_until(deadline), if stopping => break None,
                }
            }
        };
        let (correlation, resp) = match answer {
            None => break "drain deadline passed with answers outstanding".to_string(),
            Some(Err(e)) => break format!("connection lost: {e}"),
            Some(Ok(r)) => r,
        };
        let Some(sent) = inflight.pop_front() else {
            break "an answer nobody asked for".to_string();
        };
        if sent.correlation != correlation {
            inflight.push_front(sent);
            break format!("answer {correlation} out of order");
        }
        let pr = resp
            .responses
            .first()
            .and_then(|t| t.partition_responses.first());
        match pr {
            Some(pr) if pr.error_code == 0 && pr.base_offset >= 0 => {
                let entries: Vec<Entry> = sent
                    .batch
                    .ids
                    .iter()
                    .zip(&sent.sums)
                    .enumerate()
                    .map(|(i, (&id, &(len, hash)))| Entry {
                        partition: sent.batch.partition,
                        offset: pr.base_offset + i as i64,
                        id,
                        len,
                        hash,
                    })
                    .collect();
                let ledger = ctx.ledger.clone();
                tokio::task::spawn_blocking(move || {
                    crate::powercut::lock(&ledger)
                        .append(&entries)
                        .map(|()| entries.len() as u64)
                })
                .await
                .map_err(lost_ledger)?
                .map_err(lost_ledger)
                .map(|n| {
                    // Counted only now that the ledger holds it on disk.
                    out.acked += n;
                    ctx.acked.fetch_add(n, Ordering::Relaxed);
                })?;
            }
            other => {
                tracing::debug!(producer, code = ?other.map(|p| p.error_code), "produce refused");
                out.refused += sent.batch.ids.len() as u64;
                out.unacked.push(sent.batch);
            }
        }
    };
    out.unacked.extend(inflight.into_iter().map(|f| f.batch));
    out.unacked.extend(queue);
    Ok(out)
}

async fn send(
    client: &mut Client,
    ctx: &LoadCtx,
    batch: &Batch,
) -> Result<(i32, Vec<(u32, u32)>), RigError> {
    let values: Vec<Vec<u8>> = batch
        .ids
        .iter()
        .map(|&id| payload::encode(ctx.run, id, ctx.body_len))
        .collect();
    let sums = values
        .iter()
        .map(|v| (v.len() as u32, crc32c::crc32c(v)))
        .collect();
    let refs: Vec<&[u8]> = values.iter().map(|v| v.as_slice()).collect();
    let timeout_ms = i32::try_from(ctx.request_timeout.as_millis()).unwrap_or(i32::MAX);
    let req = wire::produce(
        &ctx.topic,
        batch.partition,
        record_batch(&refs, None),
        timeout_ms,
    );
    let net = |source| RigError::Net {
        op: "sending a produce request",
        addr: ctx.addr.clone(),
        source,
    };
    match tokio::time::timeout(
        ctx.request_timeout,
        client.send(wire::PRODUCE_VERSION, &req),
    )
    .await
    {
        Ok(Ok(id)) => Ok((id, sums)),
        Ok(Err(e)) => Err(net(e)),
        Err(_) => Err(net(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "send did not complete",
        ))),
    }
}
