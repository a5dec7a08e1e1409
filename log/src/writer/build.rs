//! Building batches from the appends waiting, and submitting them within the window and the ring.

use super::*;

impl<D: BlockDevice> Writer<D> {
    /// Builds and submits batches while appends wait and the window, the ring and the buffers
    /// allow.
    pub(super) fn maybe_write(&mut self, now: Now) -> bool {
        let mut moved = false;
        loop {
            if self.writes_in_flight >= self.cfg.max_writes_in_flight || !self.buffers_for_a_batch()
            {
                return moved;
            }
            let want_checkpoint = self.want_checkpoint();
            if self.pending.is_empty() && !want_checkpoint {
                self.space_needed_head = 0;
                return moved;
            }
            let in_flight = self.tail - self.durable;
            let window_room = self.geo.window.saturating_sub(in_flight);
            // Normal batches leave room for a whole checkpoint, so the ring can always move on.
            let reserve = if want_checkpoint {
                0
            } else {
                self.checkpoint_reserve()
            };
            let ring_room =
                (self.ring_floor() + self.geo.log_size).saturating_sub(self.tail + reserve);
            let room = window_room.min(ring_room).min(self.geo.max_batch);
            let room = room - room % self.geo.write_unit;
            let first_need = if want_checkpoint {
                self.checkpoint_part_need()
            } else {
                self.geo.round_up(
                    (BATCH_HEADER_LEN + record_size(self.pending.front().map_or(0, pending_len)))
                        as u64,
                )
            };
            if room < first_need {
                if ring_room < first_need.min(self.geo.max_batch) && window_room >= first_need {
                    self.space_needed_head =
                        (self.tail + first_need + reserve).saturating_sub(self.geo.log_size);
                } else {
                    self.space_needed_head = 0;
                }
                return moved;
            }
            self.space_needed_head = 0;
            self.full_since_ns = None;
            if want_checkpoint {
                self.write_checkpoint_part(room, now);
            } else {
                self.write_records(room as usize, now);
            }
            moved = true;
            if self.fatal.is_some() {
                return true;
            }
        }
    }

    pub(super) fn write_records(&mut self, room: usize, now: Now) {
        let Some(mut buf) = self.take_batch_buffer() else {
            return;
        };
        buf.set_len(buf.capacity());
        let mut c = Contents::default();
        // Where each partition's index entry for this batch sits in `c.index`: a batch may
        // hold records of thousands of partitions. The map is the writer's, emptied per batch,
        // so that a batch allocates nothing for it.
        let mut entry_of = std::mem::take(&mut self.entry_of);
        entry_of.clear();
        let mut b = BatchBuilder::new(&mut buf, self.geo.format_id, self.epoch, self.tail);
        let u = self.geo.write_unit as usize;
        while let Some(p) = self.pending.front() {
            let need = b.would_use(pending_len(p));
            if need.div_ceil(u) * u > room {
                break;
            }
            let Some(p) = self.pending.pop_front() else {
                break;
            };
            if let Item::Data { payload, .. } = &p.item {
                self.pending_bytes -= payload.len() as u64;
            }
            match p.item {
                Item::Data {
                    partition,
                    payload,
                    span,
                } => {
                    let Some(st) = self.registry.get_mut(partition) else {
                        self.answer(p.ack, Err(LogError::UnknownPartition(partition)));
                        continue;
                    };
                    let offset = st.next_offset;
                    let end = offset + u64::from(span);
                    if end > crate::format::MAX_OFFSET {
                        // Only a forged registry gets here (2^62 records); refuse, never wrap.
                        let e = LogError::OffsetsExhausted {
                            partition,
                            next: offset,
                            span,
                        };
                        self.answer(p.ack, Err(e));
                        continue;
                    }
                    st.next_offset = end;
                    let position = b.push_span(RecordKind::Data, partition, offset, span, &payload);
                    c.payload_bytes += payload.len() as u64;
                    let bytes = crate::format::record_size(payload.len()) as u32;
                    match entry_of.get(&partition).and_then(|&i| c.index.get_mut(i)) {
                        Some((_, e)) => {
                            e.end_offset = end;
                            e.bytes = e.bytes.saturating_add(bytes);
                        }
                        None => {
                            entry_of.insert(partition, c.index.len());
                            c.index.push((
                                partition,
                                IndexEntry {
                                    first_offset: offset,
                                    end_offset: end,
                                    batch_position: self.tail,
                                    batch_length: 0,
                                    epoch: self.epoch,
                                    bytes,
                                },
                            ));
                        }
                    }
                    c.acks.push((
                        p.ack,
                        Appended {
                            partition,
                            offset,
                            position,
                        },
                        p.since,
                    ));
                }
                Item::Create { topic, index: idx } => {
                    if self.registry.lookup(&topic, idx).is_some() {
                        self.answer(p.ack, Err(LogError::PartitionExists { topic, index: idx }));
                        continue;
                    }
                    let id = self.registry.next_id();
                    if id == u32::MAX {
                        self.answer(p.ack, Err(LogError::PartitionIdsExhausted(id)));
                        continue;
                    }
                    if let Err(e) = self.registry_room_for(&topic) {
                        self.answer(p.ack, Err(e));
                        continue;
                    }
                    let payload = encode_create(&topic, idx);
                    let position = b.push(RecordKind::CreatePartition, id, 0, &payload);
                    self.registry.insert(id, topic.clone(), idx);
                    c.created.push((id, topic, idx));
                    c.acks.push((
                        p.ack,
                        Appended {
                            partition: id,
                            offset: 0,
                            position,
                        },
                        p.since,
                    ));
                }
                Item::Delete { partition } => {
                    let Some(st) = self.registry.remove(partition) else {
                        self.answer(p.ack, Err(LogError::UnknownPartition(partition)));
                        continue;
                    };
                    let position = b.push(RecordKind::DeletePartition, partition, 0, &[]);
                    // Its records earlier in this batch are indexed; none can follow.
                    entry_of.remove(&partition);
                    c.deleted.push(partition);
                    c.acks.push((
                        p.ack,
                        Appended {
                            partition,
                            offset: st.next_offset,
                            position,
                        },
                        p.since,
                    ));
                }
            }
        }
        self.entry_of = entry_of;
        let sealed = b_finish(b);
        if sealed.1 == 0 {
            self.free_bufs.push(buf);
            return;
        }
        if !c.created.is_empty() || !c.deleted.is_empty() {
            let mut s = self.shared.lock();
            s.stats.registry_partitions = self.registry.len() as u64;
            s.stats.registry_bytes = self.registry.entry_bytes();
        }
        self.seal_and_submit(buf, sealed, BatchKind::Records, c, now);
    }

    /// Pads and seals the batch in `buf`, then submits it (split at the ring's end).
    pub(super) fn seal_and_submit(
        &mut self,
        mut buf: IoBuffer,
        (used, record_count): (usize, u32),
        kind: BatchKind,
        contents: Contents,
        now: Now,
    ) {
        let Contents {
            acks,
            payload_bytes,
            mut index,
            created,
            deleted,
            checkpoint_done,
        } = contents;
        let u = self.geo.write_unit as usize;
        let len = used.div_ceil(u) * u;
        // Re-seal with the real header now that kind, D and the link are known.
        let header = crate::format::BatchHeader {
            format_id: self.geo.format_id,
            epoch: self.epoch,
            position: self.tail,
            length: len as u32,
            record_count,
            durable_through: self.durable,
            prev_hash: self.last_hash,
            kind,
            timestamp_ms: now.wall_ms,
        };
        buf[used..len].fill(0);
        let crc = header.encode(&mut buf[..BATCH_HEADER_LEN]);
        let position = self.tail;
        for (_, e) in &mut index {
            e.batch_length = len as u32;
        }
        if kind == BatchKind::Records && self.cfg.tail_cache_bytes > 0 {
            // Readers at the tail are served this copy once the batch is durable.
            self.shared.cache().stage(position, &buf[..len]);
        }
        // One write per piece: the batch crosses the ring's end, or is larger than the device's
        // maximum transfer (a log moved to a device that transfers less than it was formatted
        // with). The batch counts as written only when every piece completed (`ios_left`), so D,
        // the flushes and the acks treat it exactly as one write; at a cut its pieces may land
        // or not independently, which is a torn batch like any other.
        let pieces = self.geo.pieces(position, len as u64, self.io.max_io);
        let Some(&(first_at, _, first_len)) = pieces.first() else {
            self.free_bufs.push(buf);
            return;
        };
        let mut rest = Vec::with_capacity(pieces.len() - 1);
        for &(at, from, n) in &pieces[1..] {
            // `maybe_write` saw a buffer for every piece before the batch was built.
            let Some(mut piece) = self.take_io_buffer(n as usize) else {
                self.fail(LogError::Config(format!(
                    "no buffer for a piece of {n} B of a batch of {len} B (a writer bug)"
                )));
                return;
            };
            piece.set_len(n as usize);
            piece.copy_from_slice(&buf[from as usize..(from + n) as usize]);
            rest.push((at, piece));
        }
        // The first piece goes out of the batch's own buffer, cut to its length (after the
        // copies above took the bytes past it).
        buf.set_len(first_len as usize);
        let mut ios = Vec::with_capacity(pieces.len());
        ios.push((first_at, buf));
        ios.extend(rest);
        let n = ios.len() as u32;
        // One write, and nothing below it unwritten: its flush goes with it, started by the
        // device once the write completed (one wake-up instead of two for a lone producer).
        let mid_checkpoint = kind == BatchKind::Checkpoint && checkpoint_done.is_none();
        let linked = n == 1 && !mid_checkpoint && self.link_flush(position);
        for (byte_offset, b) in ios {
            let tag = TAG_WRITE | self.bump_tag();
            let lba = byte_offset / self.geo.logical_block;
            let submitted = if linked {
                let flush = TAG_FLUSH | self.bump_tag();
                let r = self.dev.submit_write_flush(tag, lba, b, flush);
                if r.is_ok() {
                    self.flush_submitted(flush, Some((position, position + len as u64)), now);
                }
                r
            } else {
                self.dev.submit_write(tag, lba, b)
            };
            if let Err(e) = submitted {
                self.fail(LogError::Device {
                    op: "submit a batch write",
                    source: e,
                });
                return;
            }
            self.write_tags.insert(tag, position);
        }
        self.writes_in_flight += 1;
        self.tail = position + len as u64;
        self.last_hash = crc;
        {
            let mut s = self.shared.lock();
            s.stats.batches_written += 1;
            s.stats.device_bytes_written += len as u64;
        }
        self.batches.push_back(InFlight {
            position,
            end: self.tail,
            ios_left: n,
            written: false,
            acked: false,
            timestamp_ms: now.wall_ms,
            acks,
            payload_bytes,
            index,
            created,
            deleted,
            checkpoint_done,
            mid_checkpoint,
        });
        self.stalled_since_ns = None;
    }
}

impl<D: BlockDevice> Writer<D> {
    /// Whether the free buffers can carry one more batch: one to build it in (of a maximum
    /// batch), and one for each further piece it may take.
    pub(super) fn buffers_for_a_batch(&self) -> bool {
        self.free_bufs.len() >= self.io.per_batch as usize
            && self
                .free_bufs
                .iter()
                .any(|b| b.capacity() as u64 >= self.geo.max_batch)
    }

    /// A free buffer of a maximum batch, to build a batch in.
    pub(super) fn take_batch_buffer(&mut self) -> Option<IoBuffer> {
        let max = self.geo.max_batch;
        let i = self
            .free_bufs
            .iter()
            .position(|b| b.capacity() as u64 >= max)?;
        Some(self.free_bufs.swap_remove(i))
    }

    /// The smallest free buffer that holds `len` bytes, for one I/O (a piece of a batch, a
    /// superblock): the buffers of a maximum batch stay free for building batches.
    pub(super) fn take_io_buffer(&mut self, len: usize) -> Option<IoBuffer> {
        let (i, _) = self
            .free_bufs
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity())?;
        Some(self.free_bufs.swap_remove(i))
    }
}

/// What a batch carries besides its bytes, handed over when it is published (durable).
#[derive(Default)]
pub(super) struct Contents {
    pub acks: Vec<AckEntry>,
    /// Payload bytes of its data records (for write amplification).
    pub payload_bytes: u64,
    pub index: Vec<(u32, IndexEntry)>,
    pub created: Vec<(u32, String, u32)>,
    pub deleted: Vec<u32>,
    /// See `InFlight::checkpoint_done`.
    pub checkpoint_done: Option<(u64, u32)>,
}

/// (bytes used, record count) of a batch being sealed.
pub(super) fn b_finish(b: BatchBuilder<'_>) -> (usize, u32) {
    (b.used(), b.count())
}
