//! Accepting connections, and the broker's background tasks (group timers, generation records).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::broker::Broker;
use crate::meta::MetaRecord;
use crate::{conn, FrontendError};

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
            // A snapshot at start too: what was replayed may sit near the head of the ring.
            let mut snapped_at: Option<u64> = None;
            loop {
                every.tick().await;
                b.groups.tick(std::time::Instant::now());
                let d = b.log().durable();
                if snapped_at.is_none_or(|s| d.saturating_sub(s) >= quarter_ring) {
                    match b.snapshot().await {
                        Ok(()) => snapped_at = Some(d),
                        Err(e) => {
                            tracing::warn!(error = %e, "snapshot of the internal state failed");
                            snapped_at = Some(d);
                        }
                    }
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
    Ok(())
}
