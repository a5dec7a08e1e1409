//! The broker's background tasks (group timers, producer-id and empty-group expiry, snapshots,
//! generation records, retention).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::broker::Broker;
use crate::meta::MetaRecord;
use crate::producer_snapshots::PRODUCER_SNAPSHOT_BYTES;

/// Ticks (of 200 ms) between sweeps of expired producer ids and empty groups.
const EXPIRE_EVERY_TICKS: u64 = 50;
/// How often topics' retention.ms and retention.bytes are applied (Kafka's
/// log.retention.check.interval.ms is 5 minutes; a pass here reads only what the time index has
/// not covered yet, so it can run more often and keep expired records from being served long).
const RETENTION_EVERY: Duration = Duration::from_secs(10);

/// Starts the broker's background tasks on the current runtime: group timers, producer-id
/// expiry, the periodic snapshots of the internal state, and the recorder of group generations.
pub fn spawn_background(broker: &Arc<Broker>) {
    let (gen_tx, mut gen_rx) = mpsc::unbounded_channel::<(String, i32)>();
    broker.groups.set_generation_sink(gen_tx);
    {
        let b = broker.clone();
        tokio::spawn(async move {
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
        tokio::spawn(async move {
            let mut every = tokio::time::interval(RETENTION_EVERY);
            loop {
                every.tick().await;
                match b.enforce_retention(crate::producers::now_ms()).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(partitions = n, "retention moved log start offsets"),
                    Err(e) => tracing::warn!(error = %e, "applying retention failed"),
                }
            }
        });
    }
    {
        let b = broker.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(200));
            // Per device: its ring wraps on its own, over its own partitions' snapshots.
            let quarter: Vec<u64> = b
                .logs()
                .iter()
                .map(|l| (l.geometry().log_size / 4).max(1))
                .collect();
            let mut snapped_at: Vec<Option<u64>> = vec![None; quarter.len()];
            let mut producers_at = vec![0u64; quarter.len()];
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
                    if let Err(e) = b.expire_groups(std::time::Instant::now()).await {
                        tracing::warn!(error = %e, "deleting expired groups failed");
                    }
                }
                for (dev, &quarter_ring) in quarter.iter().enumerate() {
                    let Ok(dev16) = u16::try_from(dev) else {
                        break;
                    };
                    let d = b.logs()[dev].durable();
                    let producers_every = PRODUCER_SNAPSHOT_BYTES.min(quarter_ring);
                    // A snapshot at start too: what was replayed may sit near the ring's head.
                    if snapped_at[dev].is_none_or(|s| d.saturating_sub(s) >= quarter_ring) {
                        // Device 0 holds the broker's own state: all of it is re-recorded
                        // (with every device's producers); another device, its producers.
                        let r = if dev == 0 {
                            b.snapshot().await
                        } else {
                            b.snapshot_producers_of(Some(dev16), false)
                                .await
                                .map(|_| ())
                        };
                        if let Err(e) = r {
                            tracing::warn!(device = dev, error = %e, "snapshot of the internal state failed");
                        }
                        snapped_at[dev] = Some(d);
                        producers_at[dev] = d;
                    } else if d.saturating_sub(producers_at[dev]) >= producers_every {
                        if let Err(e) = b.snapshot_producers_of(Some(dev16), true).await {
                            tracing::warn!(device = dev, error = %e, "snapshot of the producer state failed");
                        }
                        producers_at[dev] = d;
                    }
                }
            }
        });
    }
}
