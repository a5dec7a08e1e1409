//! Checkpoints (storage.md §4.5): the registry written as one or more consecutive checkpoint
//! batches, so that it fits however many partitions exist (the `state` module has the encoding).
//!
//! While a checkpoint's batches are being written nothing else is: the registry then stays as
//! the first batch found it (no create, delete or data record changes it), so the parts, each
//! encoded when its batch is built, add up to the registry at one instant, and recovery can
//! replay every batch after the last part on top of it. The superblock names a checkpoint (its
//! first batch) only once its last batch is durable, and batches become durable in log order, so
//! a cut in the middle of one leaves the previous checkpoint named, with the torn one's batches
//! above it to be skipped by the next recovery's scan like any other checkpoint batch there.

use super::build::{b_finish, Contents};
use super::*;
use crate::state::{checkpoint_bound, part_capacity, PART_CONTINUES, PART_HEADER_LEN};

/// A checkpoint whose batches are being written.
pub(super) struct Run {
    /// (position, link) of its first batch: what the superblock will name.
    first: (u64, u32),
    /// The partition id the next part starts at.
    next: u32,
    /// The next part's index.
    part: u64,
}

impl<D: BlockDevice> Writer<D> {
    /// Whether the next batch must be (part of) a checkpoint: one is being written, or the
    /// recovery point lags (or must move for space) and none is waiting to be named. The lag
    /// counts from the end of the newest checkpoint, not from its start: a checkpoint larger
    /// than the lag must not call for the next one at once.
    pub(super) fn want_checkpoint(&self) -> bool {
        self.checkpoint_run.is_some()
            || (!self.checkpoint_in_flight
                && self.durable_checkpoint.is_none()
                && (self.force_checkpoint
                    || self.tail.saturating_sub(self.checkpoint_end) >= self.lag))
    }

    /// Ring bytes that batches of records leave free, so that a checkpoint can always be
    /// written and the ring move on: the most the current registry's checkpoint can take.
    pub(super) fn checkpoint_reserve(&self) -> u64 {
        checkpoint_bound(&self.geo, self.registry.entry_bytes())
    }

    /// Bytes the next checkpoint batch needs at most (its part may hold every entry left).
    pub(super) fn checkpoint_part_need(&self) -> u64 {
        let left = PART_HEADER_LEN as u64 + self.registry.entry_bytes();
        let need = BATCH_HEADER_LEN as u64 + record_size(left as usize) as u64;
        self.geo.round_up(need).min(self.geo.max_batch)
    }

    /// Writes the next part of the checkpoint (the first one starts it), filling up to `room`
    /// bytes of log.
    pub(super) fn write_checkpoint_part(&mut self, room: u64, now: Now) {
        let (first, from, part) = match &self.checkpoint_run {
            Some(r) => (r.first, r.next, r.part),
            None => ((self.tail, self.last_hash), 0, 0),
        };
        let enc = self.registry.encode_part(from, part_capacity(room));
        // A part holds at least one entry, and any entry fits the smallest batch a log has.
        if BATCH_HEADER_LEN + record_size(enc.payload.len()) > room as usize {
            self.fail(LogError::Config(format!(
                "a checkpoint part of {} B does not fit the {room} B left for it (a writer bug)",
                enc.payload.len()
            )));
            return;
        }
        let Some(mut buf) = self.take_batch_buffer() else {
            return;
        };
        buf.set_len(buf.capacity());
        let mut b = BatchBuilder::new(&mut buf, self.geo.format_id, self.epoch, self.tail);
        let continues = if enc.next.is_some() {
            PART_CONTINUES
        } else {
            0
        };
        b.push(RecordKind::Checkpoint, continues, part, &enc.payload);
        self.force_checkpoint = false;
        self.checkpoint_in_flight = true;
        self.checkpoint_run = enc.next.map(|next| Run {
            first,
            next,
            part: part + 1,
        });
        let sealed = b_finish(b);
        let contents = Contents {
            checkpoint_done: enc.next.is_none().then_some(first),
            ..Contents::default()
        };
        self.seal_and_submit(buf, sealed, BatchKind::Checkpoint, contents, now);
        let mut s = self.shared.lock();
        s.stats.checkpoint_batches += 1;
        if enc.next.is_none() {
            s.stats.checkpoints += 1;
            s.stats.checkpoint_bytes = self.tail - first.0;
        }
    }

    /// Refuses a partition whose registry entry would take the checkpoint past its budget.
    pub(super) fn registry_room_for(&self, topic: &str) -> Result<(), LogError> {
        crate::state::check_registry_room(
            &self.geo,
            self.registry.len(),
            self.registry.entry_bytes(),
            topic,
            1,
            self.checkpoint_budget,
        )
    }
}
