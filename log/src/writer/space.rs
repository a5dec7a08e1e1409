//! Superblock updates, retention and the space the ring has (storage.md §4.1, §4.3).

use super::*;

impl<D: BlockDevice> Writer<D> {
    /// Decides whether a superblock update is due and submits it.
    pub(super) fn maybe_superblock(&mut self, now: Now) -> bool {
        if self.sb_write.is_some() {
            return false;
        }
        let cur = *self.newest_sb();
        let (rp, link) = match self.durable_checkpoint {
            Some((pos, link)) => (pos, link),
            None => (cur.recovery_point, cur.recovery_link),
        };
        let (head, unexpired) = self.wanted_head(rp, now);
        let other = &self.superblocks[usize::from(1 - self.newest)];
        let reasons = [
            rp != cur.recovery_point,
            head > cur.head,
            // The older copy still pins space the writer is waiting for.
            self.space_needed_head > 0 && other.head < cur.head,
            // An idle writer records its D within about a second, and at once when it is
            // shutting down, so that a clean stop leaves D in the superblock.
            self.pending.is_empty()
                && self.batches.is_empty()
                && self.durable > cur.durable_through
                && (self.closing
                    || now
                        .mono_ns
                        .saturating_sub(self.last_activity_ns.max(self.sb_last_ns))
                        >= self.cfg.idle_superblock.as_nanos() as u64),
        ];
        if !reasons.iter().any(|&r| r) {
            // Space is needed but the recovery point pins the head: checkpoint now.
            if self.space_needed_head > rp && !self.checkpoint_in_flight {
                self.force_checkpoint = true;
            }
            return false;
        }
        let copy = 1 - self.newest;
        let sb = Superblock {
            version: FORMAT_VERSION,
            copy,
            sequence: cur.sequence + 1,
            parent: cur.checksum(),
            head,
            recovery_point: rp,
            recovery_link: link,
            checkpoint: rp,
            durable_through: self.durable,
            ..cur
        };
        let u = self.geo.write_unit as usize;
        let Some(mut buf) = self.take_io_buffer(u) else {
            return false;
        };
        buf.set_len(u);
        buf.fill(0);
        buf[..crate::format::SUPERBLOCK_LEN].copy_from_slice(&sb.encode());
        let tag = TAG_SUPERBLOCK | self.bump_tag();
        if let Err(e) =
            self.dev
                .submit_write(tag, superblock_offset(copy) / self.geo.logical_block, buf)
        {
            self.fail(LogError::Device {
                op: "submit a superblock write",
                source: e,
            });
            return true;
        }
        if self.durable_checkpoint.is_some_and(|(p, _)| p == rp) {
            self.durable_checkpoint = None;
        }
        self.sb_write = Some(SbWrite {
            sb,
            state: SbState::Submitted,
            unexpired,
        });
        self.sb_last_ns = now.mono_ns;
        self.shared.lock().stats.superblock_writes += 1;
        true
    }

    /// Where retention (and, in drop-oldest mode, the need for space) wants the head, never past
    /// the recovery point the next superblock names; and what of that no retention expired.
    pub(super) fn wanted_head(&self, rp: u64, now: Now) -> (u64, Unexpired) {
        let mut head = self.newest_sb().head;
        let mut unexpired = Unexpired::default();
        if self.backfill_pending {
            return (head, unexpired);
        }
        // Free an eighth of the ring at a time: freeing only what the next batch needs would
        // cost two superblock updates (and their flushes) per batch once the ring is full.
        let need = if self.cfg.on_full == OnFull::DropOldest && self.space_needed_head > 0 {
            self.space_needed_head + self.geo.log_size / 8
        } else {
            0
        };
        for b in &self.retained {
            if b.end > rp {
                break;
            }
            let by_size = self
                .cfg
                .retain_bytes
                .is_some_and(|keep| self.durable - b.position > keep);
            let by_time = self
                .cfg
                .retain_time
                // Timestamps come from the device: a forged one must not overflow.
                .is_some_and(|t| b.timestamp_ms.saturating_add(t.as_millis() as u64) < now.wall_ms);
            let by_space = b.position < need;
            if !(by_size || by_time || by_space) {
                break;
            }
            if b.end > head && !(by_size || by_time) {
                unexpired.batches += 1;
                unexpired.bytes += b.end - b.position.max(head);
            }
            head = b.end;
        }
        (head, unexpired)
    }

    /// A superblock write became durable: it is now one of the two copies.
    pub(super) fn superblock_durable(&mut self) {
        let Some(w) = self.sb_write.take() else {
            return;
        };
        let old_head = self.head();
        self.superblocks[usize::from(w.sb.copy)] = w.sb;
        self.newest = w.sb.copy;
        if w.unexpired.batches > 0 {
            // Only now is the data gone: the superblock naming the new head is durable.
            tracing::warn!(
                batches = w.unexpired.batches,
                bytes = w.unexpired.bytes,
                head = w.sb.head,
                "the log is full and on_full = drop-oldest: dropped the oldest records before \
                 retention expired them (set on_full = refuse to refuse appends instead, or give \
                 the log more space)"
            );
            let mut s = self.shared.lock();
            s.stats.dropped_unexpired_batches += w.unexpired.batches;
            s.stats.dropped_unexpired_bytes += w.unexpired.bytes;
        }
        if w.sb.head > old_head {
            self.drop_below(w.sb.head);
        }
    }

    /// Forgets batches below the new head and moves partition start offsets past them.
    pub(super) fn drop_below(&mut self, head: u64) {
        self.shared.cache().drop_below(head);
        while self.retained.front().is_some_and(|b| b.end <= head) {
            self.retained.pop_front();
        }
        let mut s = self.shared.lock();
        s.head = head;
        for (id, v) in s.partitions.iter_mut() {
            while v.entries.front().is_some_and(|e| e.batch_position < head) {
                v.entries.pop_front();
            }
            let start = v.entries.front().map_or(v.durable_end, |e| e.first_offset);
            v.start_offset = start;
            if let Some(p) = self.registry.get_mut(*id) {
                p.start_offset = start;
            }
        }
        drop(s);
        self.shared.notify();
    }

    /// With on_full = refuse, appends that waited too long for space fail with "log full".
    pub(super) fn check_full(&mut self, now: Now) {
        if self.space_needed_head == 0 || self.pending.is_empty() {
            self.full_since_ns = None;
            return;
        }
        if self.cfg.on_full != OnFull::Refuse {
            return;
        }
        let since = *self.full_since_ns.get_or_insert(now.mono_ns);
        if now.mono_ns.saturating_sub(since) < self.cfg.full_wait.as_nanos() as u64 {
            return;
        }
        let needed = self.space_needed_head.saturating_sub(self.ring_floor());
        tracing::warn!(
            appends = self.pending.len(),
            needed,
            "log full (on_full = refuse): refusing the appends waiting; retention frees nothing \
             more yet"
        );
        self.fail_waiting(LogError::LogFull { needed });
        self.full_since_ns = None;
    }
}

impl<D: BlockDevice> Writer<D> {
    /// Appends waiting while nothing is in flight are waiting for something only the writer
    /// could do (free space, write a checkpoint) and cannot: it says so in its log after a
    /// quarter of the stall limit, and at the limit fails them with an error naming why, so
    /// that producers hear of it (and a closing writer can stop) instead of waiting for ever.
    pub(super) fn check_stall(&mut self, now: Now) {
        // Waiting for space with on_full = refuse is `check_full`'s, with its own limit
        // (full_wait) and error (LogFull).
        let refusing = self.cfg.on_full == OnFull::Refuse && self.space_needed_head > 0;
        let in_flight =
            !self.batches.is_empty() || !self.flushes.is_empty() || self.sb_write.is_some();
        if self.pending.is_empty() || in_flight || refusing {
            if self.stall_warned {
                tracing::warn!("the writer writes again");
            }
            self.stalled_since_ns = None;
            self.stall_warned = false;
            return;
        }
        let since = *self.stalled_since_ns.get_or_insert(now.mono_ns);
        let waited = now.mono_ns.saturating_sub(since);
        let limit = self.cfg.stall_wait.as_nanos() as u64;
        if !self.stall_warned && waited >= limit / 4 {
            self.stall_warned = true;
            tracing::warn!(
                appends = self.pending.len(),
                waited_ms = waited / 1_000_000,
                why = %self.stall_reason(),
                "appends are waiting and the writer can write nothing"
            );
        }
        if waited < limit {
            return;
        }
        let e = LogError::Stalled {
            waited_ms: waited / 1_000_000,
            why: self.stall_reason(),
        };
        tracing::error!(appends = self.pending.len(), error = %e, "failing the appends waiting");
        self.fail_waiting(e);
        self.stalled_since_ns = None;
        self.stall_warned = false;
    }

    /// Answers every append waiting for the writer with `e` (they were never written).
    fn fail_waiting(&mut self, e: LogError) {
        self.pending_bytes = 0;
        for p in std::mem::take(&mut self.pending) {
            self.answer(p.ack, Err(e.clone()));
        }
    }

    /// Why the writer cannot write, for its log and the error appends get.
    fn stall_reason(&self) -> String {
        let sb = self.newest_sb();
        let at = format!(
            "tail {}, head {}, recovery point {}, ring floor {}, log {} B, window {} B",
            self.tail,
            sb.head,
            sb.recovery_point,
            self.ring_floor(),
            self.geo.log_size,
            self.geo.window
        );
        if self.want_checkpoint() {
            format!(
                "a checkpoint of the registry ({} partitions, up to {} B) must be written first \
                 and finds no room: {at}",
                self.registry.len(),
                self.checkpoint_reserve()
            )
        } else if self.space_needed_head > 0 && self.backfill_pending {
            format!(
                "the ring is full and nothing is freed until the index below the recovery point \
                 is rebuilt: {at}"
            )
        } else if self.space_needed_head > 0 {
            format!("the ring is full and the head cannot move past the recovery point: {at}")
        } else {
            format!("no room for the next batch: {at}")
        }
    }
}
