//! The recovery scan, the probe past its stop, and the decision between a torn tail and damage
//! (storage.md §5, steps 2–3), plus the index rebuild below the recovery point.

use std::collections::{HashMap, HashSet, VecDeque};

use blockdev::BlockDevice;
use nvmq_log::batch::{check_records, follows, BatchFault, RecordRef};
use nvmq_log::format::{BatchHeader, BatchKind, HeaderFault, RecordKind, Superblock, MAX_OFFSET};
use nvmq_log::layout::Geometry;
use nvmq_log::shared::IndexEntry;
use nvmq_log::state::{decode_create, Registry, PART_CONTINUES};
use nvmq_log::RetainedBatch;

use crate::cursor::{Cursor, DeviceSource, LogSource, WriterSource};
use crate::RecoveryError;
use nvmq_log::backfill::{Backfilled, RawRead};

/// Where and why a scan stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanStop {
    pub position: u64,
    pub what: String,
    /// The device could not read the block (a latent sector error), rather than bytes that do
    /// not check.
    pub read_error: bool,
}

impl std::fmt::Display for ScanStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at position {}: {}", self.position, self.what)
    }
}

/// What a scan over a range of the log found.
#[derive(Debug, Clone, Default)]
pub struct Scanned {
    /// End of the last valid batch: where the log is cut.
    pub cut: u64,
    /// Header checksum of the last valid batch (the next batch's link).
    pub last_hash: u32,
    pub max_epoch: u64,
    /// Largest "durable through" in any valid header read (scan and probe).
    pub max_durable_through: u64,
    pub batches: u64,
    pub records: u64,
    pub bytes_read: u64,
    pub stop: StopOrEnd,
    /// Bytes of valid-looking batches found past the stop by the probe.
    pub valid_past_cut: u64,
    pub registry: Registry,
    pub index: HashMap<u32, VecDeque<IndexEntry>>,
    pub retained: VecDeque<RetainedBatch>,
}

/// A scan either stopped at a failure or reached the end it was given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum StopOrEnd {
    #[default]
    End,
    Stop(ScanStop),
}

impl std::fmt::Display for StopOrEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopOrEnd::End => f.write_str("reached the end of the range"),
            StopOrEnd::Stop(s) => write!(f, "stopped {s}"),
        }
    }
}

/// The rules a batch must pass besides its own checksums.
#[derive(Debug, Clone, Copy)]
pub struct ChainRules {
    /// The link the first batch must carry; None when unknown (an index scan from the head).
    pub first_link: Option<u32>,
    pub epoch: u64,
    pub epoch_start: u64,
}

/// Scans batches from `from` up to `until` (exclusive; None = until the first failure), calling
/// `visit` with each valid batch and its records. `visit` may refuse a batch (an inconsistency a
/// checksum cannot see), which stops the scan there like any other failure.
pub fn scan_range<D: BlockDevice + ?Sized>(
    dev: &mut D,
    geo: &Geometry,
    from: u64,
    until: Option<u64>,
    rules: ChainRules,
    visit: impl FnMut(&BatchHeader, &[RecordRef<'_>]) -> Result<(), String>,
) -> Scanned {
    scan_source(&mut DeviceSource(dev), geo, from, until, rules, visit)
}

/// [`scan_range`] over any source of log bytes.
pub fn scan_source<S: LogSource + ?Sized>(
    src: &mut S,
    geo: &Geometry,
    from: u64,
    until: Option<u64>,
    rules: ChainRules,
    mut visit: impl FnMut(&BatchHeader, &[RecordRef<'_>]) -> Result<(), String>,
) -> Scanned {
    let mut out = Scanned {
        cut: from,
        ..Scanned::default()
    };
    let mut cursor = Cursor::new(src, *geo);
    let mut link = rules.first_link;
    let mut last_epoch = 0u64;
    let mut pos = from;
    let u = geo.write_unit;
    loop {
        if until.is_some_and(|end| pos >= end) {
            break;
        }
        let stop = |what: String, read_error: bool| {
            StopOrEnd::Stop(ScanStop {
                position: pos,
                what,
                read_error,
            })
        };
        let head_block = match cursor.get(pos, u) {
            Ok(b) => b,
            Err(e) => {
                out.stop = stop(format!("read failed: {e}"), true);
                break;
            }
        };
        let (h, crc) = match BatchHeader::decode(head_block, geo.format_id, pos, u as u32) {
            Ok(x) => x,
            Err(HeaderFault::Invalid(w)) => {
                out.stop = stop(format!("no valid batch header ({w})"), false);
                break;
            }
            Err(HeaderFault::Misplaced { header }) => {
                out.stop = stop(
                    format!("batch header of position {}", header.position),
                    false,
                );
                break;
            }
        };
        if u64::from(h.length) > geo.max_batch {
            out.stop = stop("batch longer than the maximum batch".into(), false);
            break;
        }
        if let Err(why) = follows(&h, link, last_epoch) {
            out.stop = stop(why, false);
            break;
        }
        if pos >= rules.epoch_start && h.epoch < rules.epoch {
            out.stop = stop(
                format!(
                    "epoch {} is fenced off (epoch {} starts at {})",
                    h.epoch, rules.epoch, rules.epoch_start
                ),
                false,
            );
            break;
        }
        let body = match cursor.get(pos, u64::from(h.length)) {
            Ok(b) => b,
            Err(e) => {
                out.stop = stop(format!("read failed: {e}"), true);
                break;
            }
        };
        let mut local: Vec<RecordRef<'_>> = Vec::new();
        if let Err(f) = check_records(&h, body, |r| local.push(r)) {
            out.stop = stop(fault_text(&f), false);
            break;
        }
        if let Err(why) = visit(&h, &local) {
            out.stop = stop(why, false);
            break;
        }
        out.batches += 1;
        out.records += u64::from(h.record_count);
        out.max_epoch = out.max_epoch.max(h.epoch);
        out.max_durable_through = out.max_durable_through.max(h.durable_through);
        last_epoch = h.epoch;
        link = Some(crc);
        out.last_hash = crc;
        pos += u64::from(h.length);
        out.cut = pos;
    }
    out.bytes_read = cursor.bytes_read;
    out
}

fn fault_text(f: &BatchFault) -> String {
    f.to_string()
}

/// What the probe past a stop found.
struct Probe {
    max_durable_through: u64,
    max_epoch: u64,
    /// Start of the furthest valid header found.
    furthest: Option<u64>,
    valid_bytes: u64,
    misdirected: Option<(u64, u64)>,
    bytes_read: u64,
}

/// Looks one write unit at a time past `stop`, no further than W plus one maximum batch, for
/// valid headers at their expected positions (storage.md §5.3).
fn probe<D: BlockDevice + ?Sized>(
    dev: &mut D,
    geo: &Geometry,
    stop: u64,
    rules: ChainRules,
) -> Probe {
    let mut p = Probe {
        max_durable_through: 0,
        max_epoch: 0,
        furthest: None,
        valid_bytes: 0,
        misdirected: None,
        bytes_read: 0,
    };
    let u = geo.write_unit;
    // Saturating: a damaged superblock may name positions near u64::MAX.
    let end = stop.saturating_add((geo.window + geo.max_batch).min(geo.log_size - u));
    let mut src = DeviceSource(dev);
    let mut cursor = Cursor::new(&mut src, *geo);
    let mut q = stop;
    while q < end {
        let block = match cursor.get(q, u) {
            Ok(b) => b,
            Err(_) => {
                q = q.saturating_add(u);
                continue;
            }
        };
        match BatchHeader::decode(block, geo.format_id, q, u as u32) {
            Ok((h, _)) => {
                let fenced = q >= rules.epoch_start && h.epoch < rules.epoch;
                if !fenced {
                    p.max_durable_through = p.max_durable_through.max(h.durable_through);
                    p.max_epoch = p.max_epoch.max(h.epoch);
                    p.furthest = Some(q);
                    p.valid_bytes += u64::from(h.length);
                }
            }
            Err(HeaderFault::Misplaced { header }) => {
                // A header of an earlier lap names a position one or more laps below: stale,
                // expected. Any other position means the write landed at the wrong address.
                if header.position % geo.log_size != q % geo.log_size && p.misdirected.is_none() {
                    p.misdirected = Some((q, header.position));
                }
            }
            Err(HeaderFault::Invalid(_)) => {}
        }
        q = q.saturating_add(u);
    }
    p.bytes_read = cursor.bytes_read;
    p
}

/// Scans from the recovery point, replaying into the checkpoint's state, probes past the stop,
/// and decides: torn tail (returns where to cut) or damage in acknowledged data (an error).
pub fn recover_scan<D: BlockDevice + ?Sized>(
    dev: &mut D,
    geo: &Geometry,
    sb: &Superblock,
) -> Result<Scanned, RecoveryError> {
    let rules = ChainRules {
        first_link: Some(sb.recovery_link),
        epoch: sb.epoch,
        epoch_start: sb.epoch_start,
    };
    let mut checkpoint = Checkpoint::Missing;
    let mut index: HashMap<u32, VecDeque<IndexEntry>> = HashMap::new();
    let mut retained = VecDeque::new();
    let mut scanned = scan_range(dev, geo, sb.recovery_point, None, rules, |h, recs| {
        match (&mut checkpoint, h.kind) {
            (Checkpoint::Complete(reg), BatchKind::Records) => replay(reg, &mut index, h, recs)?,
            // A later checkpoint (or the start of one a cut tore): the state it holds is what
            // the replay builds anyway.
            (Checkpoint::Complete(_), BatchKind::Checkpoint) => {}
            (_, BatchKind::Checkpoint) => checkpoint.add_part(recs)?,
            (Checkpoint::Missing, BatchKind::Records) => {
                return Err("no checkpoint at the recovery point".into());
            }
            (Checkpoint::Partial { parts, .. }, BatchKind::Records) => {
                return Err(format!(
                    "the checkpoint at the recovery point ends after {parts} of its batches, \
                     without its last"
                ));
            }
        }
        retained.push_back(retained_of(h));
        Ok(())
    });
    let stop = match &scanned.stop {
        StopOrEnd::Stop(s) => s.clone(),
        StopOrEnd::End => {
            return Err(RecoveryError::Damage {
                position: scanned.cut,
                what: "the scan ended without a stop".into(),
            })
        }
    };
    let pr = probe(dev, geo, stop.position, rules);
    scanned.bytes_read += pr.bytes_read;
    scanned.max_epoch = scanned.max_epoch.max(pr.max_epoch);
    let durable_bound = sb
        .durable_through
        .max(scanned.max_durable_through)
        .max(pr.max_durable_through);
    if stop.position < durable_bound {
        return Err(RecoveryError::Damage {
            position: stop.position,
            what: format!(
                "{} (acknowledged data reaches at least {durable_bound})",
                if stop.read_error {
                    format!("unreadable: {}", stop.what)
                } else {
                    stop.what.clone()
                }
            ),
        });
    }
    if let Some((at, names)) = pr.misdirected {
        return Err(RecoveryError::Damage {
            position: at,
            what: format!("a valid batch header of position {names} (a misdirected write)"),
        });
    }
    if let Some(far) = pr.furthest {
        if far - stop.position > geo.window {
            return Err(RecoveryError::Damage {
                position: stop.position,
                what: format!(
                    "{}; valid batches continue {} B past it, more than the in-flight window",
                    stop.what,
                    far - stop.position
                ),
            });
        }
    }
    let Checkpoint::Complete(registry) = checkpoint else {
        return Err(RecoveryError::Damage {
            position: sb.recovery_point,
            what: "no complete checkpoint at the recovery point".into(),
        });
    };
    // Torn tail: cut at the start of the batch that holds the failure.
    scanned.valid_past_cut = pr.valid_bytes;
    scanned.registry = registry;
    scanned.index = index;
    scanned.retained = retained;
    Ok(scanned)
}

/// The checkpoint at the recovery point, as its batches are read (see `nvmq_log::state`).
enum Checkpoint {
    Missing,
    /// Parts read so far (the next one's index), and the registry they add up to.
    Partial {
        parts: u64,
        registry: Registry,
    },
    Complete(Registry),
}

impl Checkpoint {
    /// Adds the part a checkpoint batch holds; the parts must come in order, from 0.
    fn add_part(&mut self, recs: &[RecordRef<'_>]) -> Result<(), String> {
        // The writer puts exactly one checkpoint record in a checkpoint batch: anything else
        // (another kind, a second record) is not ours, so it is refused rather than passed over.
        let r = match recs {
            [r] if r.header.kind == RecordKind::Checkpoint => r,
            [] => return Err("a checkpoint batch without a record".into()),
            [r] => {
                return Err(format!(
                    "a checkpoint batch holding a {:?} record",
                    r.header.kind
                ))
            }
            more => {
                return Err(format!(
                    "a checkpoint batch holding {} records, not one",
                    more.len()
                ))
            }
        };
        let continues = match r.header.partition {
            0 => false,
            PART_CONTINUES => true,
            other => return Err(format!("checkpoint record with continuation {other}")),
        };
        let part = Registry::decode(r.payload).map_err(|w| format!("checkpoint: {w}"))?;
        let (expected, registry) = match std::mem::replace(self, Checkpoint::Missing) {
            Checkpoint::Missing => (0, None),
            Checkpoint::Partial { parts, registry } => (parts, Some(registry)),
            Checkpoint::Complete(_) => return Err("a checkpoint part after its last".into()),
        };
        if r.header.offset != expected {
            return Err(format!(
                "checkpoint part {} where part {expected} was expected",
                r.header.offset
            ));
        }
        let registry = match registry {
            None => part,
            Some(mut reg) => {
                reg.append_part(part)
                    .map_err(|w| format!("checkpoint part {expected}: {w}"))?;
                reg
            }
        };
        *self = if continues {
            Checkpoint::Partial {
                parts: expected + 1,
                registry,
            }
        } else {
            Checkpoint::Complete(registry)
        };
        Ok(())
    }
}

fn retained_of(h: &BatchHeader) -> RetainedBatch {
    RetainedBatch {
        position: h.position,
        end: h.position + u64::from(h.length),
        timestamp_ms: h.timestamp_ms,
    }
}

/// Applies a valid records batch to the registry and the index. Inconsistencies a checksum
/// cannot catch (an unknown partition, an offset out of sequence, a record of a partition after
/// its delete) refuse the batch.
fn replay(
    reg: &mut Registry,
    index: &mut HashMap<u32, VecDeque<IndexEntry>>,
    h: &BatchHeader,
    recs: &[RecordRef<'_>],
) -> Result<(), String> {
    // Check first, then apply, so that a refused batch leaves no trace.
    let mut next: HashMap<u32, u64> = HashMap::new();
    let mut creates: Vec<(u32, String, u32)> = Vec::new();
    let mut created: HashSet<u32> = HashSet::new();
    let mut deleted: HashSet<u32> = HashSet::new();
    for r in recs {
        let id = r.header.partition;
        match r.header.kind {
            RecordKind::Data => {
                if deleted.contains(&id) {
                    return Err(format!(
                        "record at {} names partition {id}, deleted before it",
                        r.header.position
                    ));
                }
                let known = reg
                    .get(id)
                    .map(|p| p.next_offset)
                    .or_else(|| created.contains(&id).then_some(0));
                let expect = *next.get(&id).or(known.as_ref()).ok_or_else(|| {
                    format!(
                        "record at {} names unknown partition {id}",
                        r.header.position
                    )
                })?;
                if r.header.offset != expect {
                    return Err(format!(
                        "record at {} has offset {} of partition {id}, expected {expect}",
                        r.header.position, r.header.offset
                    ));
                }
                let end = expect
                    .checked_add(u64::from(r.header.span))
                    .filter(|&e| e <= MAX_OFFSET)
                    .ok_or_else(|| {
                        format!(
                            "record at {} spans past the largest offset (partition {id}, \
                             offset {expect}, span {})",
                            r.header.position, r.header.span
                        )
                    })?;
                next.insert(id, end);
            }
            RecordKind::CreatePartition if id == u32::MAX => {
                return Err(format!(
                    "record at {} creates partition {id}, an id never assigned",
                    r.header.position
                ));
            }
            RecordKind::CreatePartition => {
                // Ids are assigned in order and never reused: a create of an id the registry
                // has passed (live, deleted, or created earlier in this batch) would bring back
                // offsets from 0 under an old id.
                if id < reg.next_id() || reg.get(id).is_some() || !created.insert(id) {
                    return Err(format!(
                        "record at {} creates partition {id}, an id already assigned",
                        r.header.position
                    ));
                }
                let (topic, idx) = decode_create(r.payload)?;
                creates.push((id, topic, idx));
            }
            RecordKind::DeletePartition => {
                let known = reg.get(id).is_some() || created.contains(&id);
                if !known || !deleted.insert(id) {
                    return Err(format!(
                        "record at {} deletes unknown partition {id}",
                        r.header.position
                    ));
                }
            }
            RecordKind::Checkpoint => {}
        }
    }
    for (id, topic, idx) in creates {
        reg.insert(id, topic, idx);
    }
    for r in recs.iter().filter(|r| r.header.kind == RecordKind::Data) {
        add_entry(index, h, r);
    }
    for (id, n) in next {
        if let Some(p) = reg.get_mut(id) {
            p.next_offset = n;
        }
    }
    // A deleted partition keeps neither its entry nor its index (its records earlier in the
    // log are never served again).
    for id in deleted {
        reg.remove(id);
        index.remove(&id);
    }
    Ok(())
}

fn add_entry(index: &mut HashMap<u32, VecDeque<IndexEntry>>, h: &BatchHeader, rec: &RecordRef<'_>) {
    let r = &rec.header;
    // What the record takes in the batch: a partition's share of the ring.
    let bytes = nvmq_log::format::record_size(rec.payload.len()) as u32;
    let end = r.offset + u64::from(r.span);
    let entries = index.entry(r.partition).or_default();
    match entries.back_mut() {
        Some(e) if e.batch_position == h.position => {
            e.end_offset = end;
            e.bytes = e.bytes.saturating_add(bytes);
        }
        _ => entries.push_back(IndexEntry {
            first_offset: r.offset,
            end_offset: end,
            batch_position: h.position,
            batch_length: h.length,
            epoch: h.epoch,
            bytes,
        }),
    }
}

/// The index and retained batches below the recovery point, merged with what the recovery scan
/// found above it.
pub struct Below {
    pub registry: Registry,
    pub index: HashMap<u32, VecDeque<IndexEntry>>,
    pub retained: VecDeque<RetainedBatch>,
    pub bytes_read: u64,
}

/// Rebuilds the index over [head, recovery point). That data was acknowledged, so a batch that
/// does not check there is damage, reported with its position.
pub fn index_below<D: BlockDevice + ?Sized>(
    dev: &mut D,
    geo: &Geometry,
    sb: &Superblock,
    above: &Scanned,
) -> Result<Below, RecoveryError> {
    let b = scan_below(&mut DeviceSource(dev), geo, sb.head, sb.recovery_point)
        .map_err(|(position, what)| RecoveryError::Damage { position, what })?;
    let (mut index, mut retained) = (b.index, b.retained);
    for (id, entries) in &above.index {
        index
            .entry(*id)
            .or_default()
            .extend(entries.iter().copied());
    }
    retained.extend(above.retained.iter().copied());
    let mut registry = above.registry.clone();
    // Partitions deleted from the registry keep no index.
    index.retain(|id, _| registry.get(*id).is_some());
    let ids: Vec<u32> = registry.iter().map(|p| p.id).collect();
    for id in ids {
        if let Some(p) = registry.get_mut(id) {
            p.start_offset = index
                .get(&id)
                .and_then(|e| e.front())
                .map_or(p.next_offset, |e| e.first_offset);
        }
    }
    Ok(Below {
        registry,
        index,
        retained,
        bytes_read: b.bytes_read,
    })
}

/// Indexes the batches of [from, to): acknowledged data, so any failure is damage, returned as
/// (position, what).
pub fn scan_below<S: LogSource + ?Sized>(
    src: &mut S,
    geo: &Geometry,
    from: u64,
    to: u64,
) -> Result<Backfilled, (u64, String)> {
    let mut index: HashMap<u32, VecDeque<IndexEntry>> = HashMap::new();
    let mut retained = VecDeque::new();
    let rules = ChainRules {
        first_link: None,
        epoch: 0,
        epoch_start: u64::MAX,
    };
    let scanned = scan_source(src, geo, from, Some(to), rules, |h, recs| {
        for r in recs.iter().filter(|r| r.header.kind == RecordKind::Data) {
            add_entry(&mut index, h, r);
        }
        retained.push_back(retained_of(h));
        Ok(())
    });
    if let StopOrEnd::Stop(s) = &scanned.stop {
        return Err((s.position, format!("below the recovery point: {}", s.what)));
    }
    if scanned.cut != to {
        return Err((
            scanned.cut,
            format!(
                "batches below the recovery point end at {}, not at the recovery point {to}",
                scanned.cut
            ),
        ));
    }
    Ok(Backfilled {
        index,
        retained,
        bytes_read: scanned.bytes_read,
    })
}

/// The background index rebuild ([`nvmq_log::backfill`]): [`scan_below`] through the writer.
pub fn backfill_scan(
    geo: &Geometry,
    from: u64,
    to: u64,
    read: &mut RawRead<'_>,
) -> Result<Backfilled, String> {
    scan_below(&mut WriterSource(read), geo, from, to)
        .map_err(|(position, what)| format!("at log position {position}: {what}"))
}

#[cfg(test)]
#[path = "scan_tests.rs"]
mod tests;
