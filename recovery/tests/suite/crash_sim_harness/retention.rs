//! How far the head may have moved (storage.md §4.3): a record may be gone from the front of its
//! partition only if retention by size or time, or (on_full = drop-oldest) the need for space,
//! could have freed its batch. Computed from what was appended, where and when; the writer's own
//! decisions are not consulted.

use nvmq_log::OnFull;

use super::world::World;

impl World {
    /// Records [from, to) of partition `id` are gone from its front: the newest of them must have
    /// been freeable. Retention frees batches in log order and every rule that frees a batch
    /// (size, time, space) frees every older one too, so the newest one decides.
    pub fn check_freed(&mut self, id: u32, from: u64, to: u64) -> Result<(), String> {
        let Some(t) = self.truth.get(&id) else {
            return Ok(());
        };
        let newest = (from..to.min(t.len() as u64))
            .rev()
            .find_map(|off| t[off as usize].position.map(|p| (off, p, &t[off as usize])));
        let Some((off, pos, k)) = newest else {
            return Ok(());
        };
        let ring = self.ring();
        // Without the index's word, the batch starts less than a batch below the record.
        let start = k
            .batch
            .map_or(pos.saturating_sub(ring.max_batch - 1), |b| b.0);
        let d = self.max_durable;
        let now_ms = self.now().wall_ms;
        let cfg = &self.log_cfg;
        // By size: the writer frees a batch that starts more than retain_bytes below D.
        let by_size = cfg
            .retain_bytes
            .is_some_and(|keep| d.saturating_sub(start) > keep);
        // By time: a batch's timestamp is when it was built, after its records were sent.
        let by_time = cfg.retain_time.is_some_and(|keep| {
            k.sent_ms
                .is_none_or(|sent| sent + (keep.as_millis() as u64) < now_ms)
        });
        // By space: a writer that needs room frees batches below the head its next batch needs
        // plus an eighth of the ring; that head is at most the tail (at most D + W) plus two
        // batches (the next one and the checkpoint reserve), less the ring.
        let by_space = cfg.on_full == OnFull::DropOldest
            && start
                < (d + ring.window + 2 * ring.max_batch + ring.log_size / 8)
                    .saturating_sub(ring.log_size);
        if by_size || by_time || by_space {
            self.summary.freed_checked += 1;
            return Ok(());
        }
        Err(format!(
            "partition {id}: offset {off} (log position {pos}, batch at {start}, sent at {:?} ms) is gone from the front, but no retention rule could free it: retain_bytes {:?}, retain_time {:?}, on_full {:?}; D reached {d}, now {now_ms} ms",
            k.sent_ms, cfg.retain_bytes, cfg.retain_time, cfg.on_full
        ))
    }
}
