//! Completions in, D forward, acks out: the writer's side of the flush rule (storage.md §1).

use super::*;

impl<D: BlockDevice> Writer<D> {
    pub(super) fn complete(&mut self, c: Completion) {
        match c.tag & TAG_KIND {
            TAG_WRITE => {
                if let Some(b) = c.buffer {
                    self.free_bufs.push(b);
                }
                let Some(pos) = self.write_tags.remove(&c.tag) else {
                    return;
                };
                if let Err(e) = c.result {
                    self.fail_after_settling(LogError::Device {
                        op: "write a batch",
                        source: e,
                    });
                    return;
                }
                if let Some(b) = self.batches.iter_mut().find(|b| b.position == pos) {
                    b.ios_left -= 1;
                    if b.ios_left == 0 {
                        b.written = true;
                        self.writes_in_flight -= 1;
                    }
                }
            }
            TAG_FLUSH => {
                if let Some(f) = self.flushes.iter_mut().find(|f| f.tag == c.tag) {
                    f.result = Some(c.result);
                }
            }
            TAG_SUPERBLOCK => {
                if let Some(b) = c.buffer {
                    self.free_bufs.push(b);
                }
                if let Err(e) = c.result {
                    self.fail_after_settling(LogError::Device {
                        op: "write a superblock",
                        source: e,
                    });
                    return;
                }
                if let Some(w) = &mut self.sb_write {
                    w.state = SbState::Written;
                }
                if !self.volatile_cache {
                    self.superblock_durable();
                }
            }
            TAG_READ => self.read_done(c),
            _ => {}
        }
    }

    /// Moves written-through, D and the acks forward after completions.
    pub(super) fn settle(&mut self) {
        // The contiguous prefix of completed writes.
        for b in &self.batches {
            if b.written && b.position == self.written_through {
                self.written_through = b.end;
            } else if !b.written {
                break;
            }
        }
        if !self.volatile_cache {
            self.durable = self.written_through;
        }
        // Flushes settle in submission order: a success behind a pending or failed flush waits.
        while let Some(f) = self.flushes.front() {
            match &f.result {
                None => break,
                Some(Err(e)) => {
                    // Nothing from this flush on settles; what the flushes before it made
                    // durable is still published below, then the step fails the writer.
                    let e = LogError::Device {
                        op: "flush",
                        source: e.clone(),
                    };
                    self.fail_after_settling(e);
                    break;
                }
                Some(Ok(())) => {
                    let (covers, linked) = (f.covers, f.linked);
                    let sb = f.covers_superblock;
                    self.flushes.pop_front();
                    self.durable = self.durable.max(covers);
                    // A linked flush also covers its own batch, which starts where the prefix it
                    // covers ends (the device delivered the write's completion before the flush's).
                    if let Some((start, end)) = linked {
                        if start <= self.durable && end <= self.written_through {
                            self.durable = self.durable.max(end);
                        }
                    }
                    if sb {
                        self.superblock_durable();
                    }
                }
            }
        }
        // Relaxed modes acknowledge at write completion, still in log order; not once a failure
        // is known (the writer stops at the end of this step).
        if self.cfg.flush != FlushMode::Always && self.failing.is_none() {
            for b in self.batches.iter_mut() {
                if b.end > self.written_through {
                    break;
                }
                ack_once(&self.shared, &mut self.token_acks, b);
            }
        }
        self.publish_durable();
    }

    /// Publishes every batch below D to readers and acknowledges it (default mode).
    pub(super) fn publish_durable(&mut self) {
        let mut done: Vec<InFlight> = Vec::new();
        while self
            .batches
            .front()
            .is_some_and(|b| b.end <= self.durable && b.written)
        {
            if let Some(b) = self.batches.pop_front() {
                done.push(b);
            }
        }
        if done.is_empty() {
            return;
        }
        if self.cfg.tail_cache_bytes > 0 {
            self.shared.cache().publish_through(self.durable);
        }
        {
            let mut s = self.shared.lock();
            s.durable = self.durable;
            let acks: usize = done.iter().filter(|b| !b.acked).map(|b| b.acks.len()).sum();
            if acks > 0 {
                s.stats.records_per_flush.record(acks as u64);
            }
            for b in &mut done {
                for (id, topic, index) in b.created.drain(..) {
                    s.insert_partition(
                        id,
                        PartitionView {
                            topic,
                            index,
                            ..PartitionView::default()
                        },
                    );
                }
                for (pid, e) in b.index.drain(..) {
                    if let Some(v) = s.partitions.get_mut(&pid) {
                        v.durable_end = e.end_offset;
                        v.entries.push_back(e);
                    }
                }
                // After its index: records of a partition precede its delete in a batch.
                for id in b.deleted.drain(..) {
                    s.remove_partition(id);
                }
            }
        }
        self.shared.notify();
        for mut b in done {
            self.retained.push_back(RetainedBatch {
                position: b.position,
                end: b.end,
                timestamp_ms: b.timestamp_ms,
            });
            // The last batch of a checkpoint: every batch of it is durable now (D moves over a
            // contiguous prefix), so the superblock may name its first.
            if let Some(first) = b.checkpoint_done {
                self.checkpoint_in_flight = false;
                self.durable_checkpoint = Some(first);
                self.checkpoint_end = b.end;
            }
            ack_once(&self.shared, &mut self.token_acks, &mut b);
        }
    }

    pub(super) fn maybe_flush(&mut self, now: Now) -> bool {
        if !self.volatile_cache {
            return false;
        }
        let sb_waiting = self
            .sb_write
            .as_ref()
            .is_some_and(|w| w.state == SbState::Written);
        let data_waiting = self.written_through > self.flush_requested;
        if !(sb_waiting || data_waiting) || self.flushes.len() >= self.cfg.max_flushes_in_flight {
            return false;
        }
        // A linked flush reaches the device only when its write completes: a flush submitted
        // before that would reach the device first, out of the order the writer settles them in
        // (storage.md §6: a later flush may "succeed" over an earlier one's lost data). Wait.
        if self.linked_unissued() {
            return false;
        }
        let urgent = sb_waiting
            || self.closing
            || self.window_full()
            // A checkpoint's last part (only it lets the recovery point move): one flush for
            // the whole checkpoint, not one per part.
            || self
                .batches
                .iter()
                .any(|b| b.checkpoint_done.is_some() && b.written);
        let due = match self.cfg.flush {
            FlushMode::Always => !self.only_mid_checkpoint_waits(),
            FlushMode::Interval(i) => {
                now.mono_ns.saturating_sub(self.last_flush_ns) >= i.as_nanos() as u64
            }
            // Only when the writer has gone quiet: under load nothing is flushed before W fills,
            // but the last records of a burst do not stay unflushed, and so invisible to
            // readers (who see only below D), for as long as nothing else comes.
            FlushMode::Never => {
                now.mono_ns.saturating_sub(self.last_activity_ns)
                    >= self.cfg.quiet_flush.as_nanos() as u64
            }
        };
        if !(due || urgent) {
            return false;
        }
        let tag = TAG_FLUSH | self.bump_tag();
        if let Err(e) = self.dev.submit_flush(tag) {
            self.fail(LogError::Device {
                op: "submit a flush",
                source: e,
            });
            return true;
        }
        self.flush_submitted(tag, None, now);
        true
    }

    /// Whether the written data no flush covers yet is all checkpoint batches that others
    /// follow: the flush after the checkpoint's last batch covers them (and nothing waits on
    /// them before that), unless the window fills first (`window_full` makes it urgent).
    fn only_mid_checkpoint_waits(&self) -> bool {
        self.batches
            .iter()
            .filter(|b| b.written && b.end > self.flush_requested)
            .all(|b| b.mid_checkpoint)
    }

    /// How long until a flush the mode asks for falls due, while written data waits for one: the
    /// owner must step the writer by then even if nothing else happens, or an idle writer would
    /// keep acknowledged data unflushed (and unseen by readers) past what its mode promises.
    /// None when nothing waits, or when the mode flushes as soon as data is written.
    pub fn flush_due_in(&self, now: Now) -> Option<Duration> {
        if !self.volatile_cache || self.written_through <= self.flush_requested || self.closing {
            return None;
        }
        let (since, wait) = match self.cfg.flush {
            FlushMode::Always => return None,
            FlushMode::Interval(i) => (self.last_flush_ns, i),
            FlushMode::Never => (self.last_activity_ns, self.cfg.quiet_flush),
        };
        let elapsed = Duration::from_nanos(now.mono_ns.saturating_sub(since));
        Some(wait.saturating_sub(elapsed))
    }

    /// Whether the batch about to be written at `position` goes out with a linked flush: in the
    /// default mode, on a device with a volatile cache that takes linked pairs, when every batch
    /// below it is written (so that the flush covers a contiguous prefix) and a flush may start.
    pub(super) fn link_flush(&self, position: u64) -> bool {
        self.linked_flush
            && self.volatile_cache
            && self.cfg.flush == FlushMode::Always
            && self.written_through == position
            && self.flushes.len() < self.cfg.max_flushes_in_flight
    }

    /// A linked flush whose write has not completed yet (so the device has not issued it).
    fn linked_unissued(&self) -> bool {
        self.flushes
            .iter()
            .any(|f| f.linked.is_some_and(|(_, end)| self.written_through < end))
    }

    /// Books a flush just submitted: it covers everything written (delivered) so far, the
    /// superblock write if that completed, and `linked` (the batch whose write it follows).
    pub(super) fn flush_submitted(&mut self, tag: u64, linked: Option<(u64, u64)>, now: Now) {
        let sb_waiting = match &mut self.sb_write {
            Some(w) if w.state == SbState::Written => {
                w.state = SbState::Flushing;
                true
            }
            _ => false,
        };
        self.flushes.push_back(FlushSlot {
            tag,
            submitted_ns: now.mono_ns,
            covers: self.written_through,
            linked,
            covers_superblock: sb_waiting,
            result: None,
        });
        self.flush_requested = linked.map_or(self.written_through, |(_, end)| end);
        self.last_flush_ns = now.mono_ns;
        self.shared.lock().stats.flushes += 1;
    }

    /// Counts a flush completion in the latency figure (metrics only; decides nothing).
    pub(super) fn note_flush_latency(&self, c: &Completion, now: Now) {
        if c.tag & TAG_KIND != TAG_FLUSH {
            return;
        }
        if let Some(f) = self.flushes.iter().find(|f| f.tag == c.tag) {
            let took = now.mono_ns.saturating_sub(f.submitted_ns);
            self.shared
                .lock()
                .stats
                .flush_latency_us
                .record(took / 1000);
        }
    }
}
