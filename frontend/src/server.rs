//! Accepting connections, and the broker's background tasks (group timers, generation records).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::broker::Broker;
use crate::meta::MetaRecord;
use crate::producer_snapshots::PRODUCER_SNAPSHOT_BYTES;
use crate::{conn, FrontendError};

/// Ticks (of 200 ms) between sweeps of expired producer ids.
const EXPIRE_EVERY_TICKS: u64 = 50;

/// How long a clean shutdown waits for appends in flight before its last snapshot.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

/// Serves Kafka clients on `listener` until `shutdown` resolves; then stops accepting and drops
/// every connection (their acknowledged appends are durable already; unanswered ones are the
/// clients' to retry).
pub async fn serve(
    broker: Arc<Broker>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), FrontendError> {
    let mut tasks = JoinSet::new();
    let (gen_tx, mut gen_rx) = mpsc::unbounded_channel::<(String, i32)>();
    broker.groups.set_generation_sink(gen_tx);
    {
        let b = broker.clone();
        tasks.spawn(async move {
            // Generations are recorded after the fact: a lost record only means a restarted
            // broker starts the group from an older generation, which member ids (unique per
            // start) keep from being confused with the old one.
            while let Some((group, generation)) = gen_rx.recv().await {
                let rec = MetaRecord::Generation { group, generation };
                if let Err(e) = b.append_meta(b.meta_partition, &rec).await {
                    tracing::warn!(error = %e, "recording a group generation failed");
                }
            }
        });
    }
    {
        let b = broker.clone();
        tasks.spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(200));
            let quarter_ring = (b.log().geometry().log_size / 4).max(1);
            let producers_every = PRODUCER_SNAPSHOT_BYTES.min(quarter_ring);
            // A snapshot at start too: what was replayed may sit near the head of the ring.
            let mut snapped_at: Option<u64> = None;
            let mut producers_at = 0u64;
            let mut ticks = 0u64;
            loop {
                every.tick().await;
                ticks += 1;
                b.groups.tick(std::time::Instant::now());
                if ticks.is_multiple_of(EXPIRE_EVERY_TICKS) {
                    let n = b.producers().expire(crate::producers::now_ms());
                    if n > 0 {
                        tracing::info!(producers = n, "idle producer ids expired");
                    }
                }
                let d = b.log().durable();
                if snapped_at.is_none_or(|s| d.saturating_sub(s) >= quarter_ring) {
                    if let Err(e) = b.snapshot().await {
                        tracing::warn!(error = %e, "snapshot of the internal state failed");
                    }
                    snapped_at = Some(d);
                    producers_at = d;
                } else if d.saturating_sub(producers_at) >= producers_every {
                    if let Err(e) = b.snapshot_producers(true).await {
                        tracing::warn!(error = %e, "snapshot of the producer state failed");
                    }
                    producers_at = d;
                }
            }
        });
    }
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let b = broker.clone();
                    tasks.spawn(async move { conn::serve(b, stream).await });
                }
                Err(e) => {
                    // Out of descriptors and the like: wait a little rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = &mut shutdown => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    tasks.shutdown().await;
    // Clean shutdown: once every queued append is acknowledged, a snapshot of every partition's
    // producers lets the next start replay nothing.
    if broker.quiesce(SHUTDOWN_WAIT).await {
        match broker.snapshot_producers(false).await {
            Ok(n) => tracing::info!(partitions = n, "producer state recorded for the restart"),
            Err(e) => tracing::warn!(error = %e, "snapshot of the producer state failed"),
        }
    } else {
        tracing::warn!("appends still in flight at shutdown: no final producer snapshot");
    }
    Ok(())
}
