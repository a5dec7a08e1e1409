//! nvmq's own records in its internal partitions: topic tombstones, producer ids, group
//! generations, idempotent producers' state, time indexes, SCRAM credentials, ACL bindings,
//! topic configs and log start offsets in `__nvmq_meta`, committed offsets in
//! `__consumer_offsets`. Replayed on start.

use crate::sasl::{ScramCredential, ScramMechanism};

pub const META_TOPIC: &str = "__nvmq_meta";
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// One committed offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
}

/// A batch of an idempotent producer as the log holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredBatch {
    pub first_seq: i32,
    pub last_seq: i32,
    /// Its first offset in the partition.
    pub offset: u64,
}

/// One idempotent producer's state in one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerSnap {
    pub id: i64,
    pub epoch: i16,
    /// Wall-clock milliseconds when its last batch was taken (for producer-id expiry).
    pub last_seen_ms: i64,
    /// Its newest batches (at most `producers::REMEMBERED`), oldest first.
    pub batches: Vec<StoredBatch>,
}

/// Part `part` of `parts` of a snapshot of the idempotent producers of data partition
/// `partition`: their state as a replay of the partition's records below `through` builds it
/// (see `producer_snapshots`). The parts of one snapshot are consecutive records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerStatePart {
    pub partition: u32,
    pub through: u64,
    pub part: u32,
    pub parts: u32,
    pub producers: Vec<ProducerSnap>,
}

/// Most batches one producer's snapshot may hold (Kafka's window of 5).
pub const MAX_SNAP_BATCHES: usize = 5;

/// Encoded bytes of one producer in a `ProducerState` record at most.
pub const PRODUCER_SNAP_MAX_LEN: usize = 8 + 2 + 8 + 1 + MAX_SNAP_BATCHES * 16;

/// Encoded bytes of a `ProducerState` record without its producers.
pub const PRODUCER_STATE_HEADER_LEN: usize = 1 + 4 + 8 + 4 + 4 + 4;

/// What every part of a time index snapshot repeats: the index's state but for its samples
/// (see `time_index::Times`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimesHead {
    /// The offsets indexed: [from, to).
    pub from: u64,
    pub to: u64,
    /// The largest timestamp below `to`.
    pub running: i64,
    /// The largest timestamp and the base offset of the batch holding it.
    pub max: Option<(i64, u64)>,
    /// Payload bytes indexed since the last sample.
    pub since_sample: u64,
}

/// Part `part` of `parts` of a snapshot of data partition `partition`'s time index: its samples
/// (batch base offset, largest timestamp below it), in order, split over consecutive records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeIndexPart {
    pub partition: u32,
    pub head: TimesHead,
    pub part: u32,
    pub parts: u32,
    pub samples: Vec<(u64, i64)>,
}

/// Encoded bytes of a `TimeIndex` record without its samples (at most), and of one sample.
pub const TIME_INDEX_HEADER_LEN: usize = 1 + 4 + 8 + 8 + 8 + 1 + 16 + 8 + 4 + 4 + 4;
pub const TIME_SAMPLE_LEN: usize = 16;

/// A user's SCRAM credential for one mechanism: salt, iterations and the two keys, never the
/// password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialRecord {
    pub user: String,
    pub mechanism: ScramMechanism,
    pub credential: ScramCredential,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaRecord {
    /// The topic is deleted: a topic of that name created later is `incarnation` (the count of
    /// deletions so far, so that re-recording it in a snapshot changes nothing).
    DeleteTopic { name: String, incarnation: u32 },
    /// Producer ids up to this one are handed out.
    ProducerId { id: i64 },
    /// The group completed a rebalance to this generation (the highest recorded counts).
    Generation { group: String, generation: i32 },
    /// Offsets a group committed in one request.
    Commits { group: String, commits: Vec<Commit> },
    /// Part of a snapshot of a data partition's idempotent producers.
    ProducerState(ProducerStatePart),
    /// Part of a snapshot of a data partition's time index (ListOffsets by timestamp).
    TimeIndex(TimeIndexPart),
    /// An ACL binding was created (CreateAcls; re-recorded by every snapshot).
    AclAdded(crate::acl::Binding),
    /// An ACL binding was deleted (DeleteAcls).
    AclRemoved(crate::acl::Binding),
    /// A user's credential is set (replacing the one for that mechanism).
    Credential(CredentialRecord),
    /// A user's credential for that mechanism is removed.
    CredentialRemoved {
        user: String,
        mechanism: ScramMechanism,
    },
    /// Every config set on a topic (those not named are at their defaults), for the topic's
    /// incarnation (its deletions so far): a later incarnation starts from defaults.
    TopicConfig {
        name: String,
        incarnation: u32,
        configs: Vec<(String, String)>,
    },
    /// Data partition `partition` (of the device whose `__nvmq_meta` holds it) serves nothing
    /// below `start` (DeleteRecords, retention): its log start offset.
    LogStart { partition: u32, start: u64 },
    /// The group is deleted (DeleteGroups, or expired empty): its offsets committed before this
    /// record are gone. In `__consumer_offsets`, ordered with the commits it cancels.
    GroupDeleted { group: String },
    /// These committed offsets of the group are deleted (OffsetDelete).
    OffsetsDeleted {
        group: String,
        partitions: Vec<(String, i32)>,
    },
}

impl Commit {
    /// Bytes it takes in a `Commits` record.
    pub fn encoded_len(&self) -> usize {
        let s = |v: &str| 2 + v.len().min(usize::from(u16::MAX));
        s(&self.topic) + 4 + 8 + 4 + 1 + self.metadata.as_deref().map_or(0, s)
    }
}

/// A group's commits in `Commits` records of at most `max_payload` bytes each, cut by their
/// encoded size (commit metadata may take up to 4 KiB each). A commit that does not fit a record
/// alone goes in one of its own, to fail there rather than take the others with it; one that a
/// log took once always fits again.
pub fn commits_records(group: &str, commits: Vec<Commit>, max_payload: usize) -> Vec<MetaRecord> {
    let head = 1 + 2 + group.len().min(usize::from(u16::MAX)) + 4;
    let mut out = Vec::new();
    let mut chunk: Vec<Commit> = Vec::new();
    let mut size = head;
    for c in commits {
        let len = c.encoded_len();
        if !chunk.is_empty() && size + len > max_payload {
            out.push(MetaRecord::Commits {
                group: group.to_string(),
                commits: std::mem::take(&mut chunk),
            });
            size = head;
        }
        size += len;
        chunk.push(c);
    }
    if !chunk.is_empty() {
        out.push(MetaRecord::Commits {
            group: group.to_string(),
            commits: chunk,
        });
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("internal record at offset {offset} of {topic}: {what}")]
pub struct MetaFault {
    pub topic: &'static str,
    pub offset: u64,
    pub what: String,
}

const TAG_DELETE: u8 = 1;
const TAG_PRODUCER_ID: u8 = 2;
const TAG_GENERATION: u8 = 3;
const TAG_COMMITS: u8 = 4;
const TAG_PRODUCER_STATE: u8 = 5;
const TAG_TIME_INDEX: u8 = 6;
const TAG_ACL_ADDED: u8 = 12;
const TAG_ACL_REMOVED: u8 = 13;
const TAG_CREDENTIAL: u8 = 10;
const TAG_CREDENTIAL_REMOVED: u8 = 11;
const TAG_TOPIC_CONFIG: u8 = 14;
const TAG_LOG_START: u8 = 15;
const TAG_GROUP_DELETED: u8 = 16;
const TAG_OFFSETS_DELETED: u8 = 17;

pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes();
    out.extend((b.len().min(u16::MAX as usize) as u16).to_be_bytes());
    out.extend(&b[..b.len().min(u16::MAX as usize)]);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    let n = b.len().min(u16::MAX as usize);
    out.extend((n as u16).to_be_bytes());
    out.extend(&b[..n]);
}

impl MetaRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            MetaRecord::DeleteTopic { name, incarnation } => {
                out.push(TAG_DELETE);
                put_str(&mut out, name);
                out.extend(incarnation.to_be_bytes());
            }
            MetaRecord::ProducerId { id } => {
                out.push(TAG_PRODUCER_ID);
                out.extend(id.to_be_bytes());
            }
            MetaRecord::Generation { group, generation } => {
                out.push(TAG_GENERATION);
                put_str(&mut out, group);
                out.extend(generation.to_be_bytes());
            }
            MetaRecord::Commits { group, commits } => {
                out.push(TAG_COMMITS);
                put_str(&mut out, group);
                out.extend((commits.len() as u32).to_be_bytes());
                for c in commits {
                    put_str(&mut out, &c.topic);
                    out.extend(c.partition.to_be_bytes());
                    out.extend(c.offset.to_be_bytes());
                    out.extend(c.leader_epoch.to_be_bytes());
                    match &c.metadata {
                        None => out.push(0),
                        Some(m) => {
                            out.push(1);
                            put_str(&mut out, m);
                        }
                    }
                }
            }
            MetaRecord::ProducerState(ProducerStatePart {
                partition,
                through,
                part,
                parts,
                producers,
            }) => {
                out.push(TAG_PRODUCER_STATE);
                out.extend(partition.to_be_bytes());
                out.extend(through.to_be_bytes());
                out.extend(part.to_be_bytes());
                out.extend(parts.to_be_bytes());
                out.extend((producers.len() as u32).to_be_bytes());
                for p in producers {
                    out.extend(p.id.to_be_bytes());
                    out.extend(p.epoch.to_be_bytes());
                    out.extend(p.last_seen_ms.to_be_bytes());
                    let n = p.batches.len().min(MAX_SNAP_BATCHES);
                    out.push(n as u8);
                    for b in &p.batches[p.batches.len() - n..] {
                        out.extend(b.first_seq.to_be_bytes());
                        out.extend(b.last_seq.to_be_bytes());
                        out.extend(b.offset.to_be_bytes());
                    }
                }
            }
            MetaRecord::TimeIndex(t) => {
                let head = &t.head;
                out.push(TAG_TIME_INDEX);
                out.extend(t.partition.to_be_bytes());
                out.extend(head.from.to_be_bytes());
                out.extend(head.to.to_be_bytes());
                out.extend(head.running.to_be_bytes());
                match head.max {
                    None => out.push(0),
                    Some((ts, at)) => {
                        out.push(1);
                        out.extend(ts.to_be_bytes());
                        out.extend(at.to_be_bytes());
                    }
                }
                out.extend(head.since_sample.to_be_bytes());
                out.extend(t.part.to_be_bytes());
                out.extend(t.parts.to_be_bytes());
                out.extend((t.samples.len() as u32).to_be_bytes());
                for (offset, ts) in &t.samples {
                    out.extend(offset.to_be_bytes());
                    out.extend(ts.to_be_bytes());
                }
            }
            MetaRecord::AclAdded(b) => {
                out.push(TAG_ACL_ADDED);
                crate::acl::record::put(&mut out, b);
            }
            MetaRecord::AclRemoved(b) => {
                out.push(TAG_ACL_REMOVED);
                crate::acl::record::put(&mut out, b);
            }
            MetaRecord::Credential(c) => {
                out.push(TAG_CREDENTIAL);
                put_str(&mut out, &c.user);
                out.push(c.mechanism.code() as u8);
                put_bytes(&mut out, &c.credential.salt);
                out.extend(c.credential.iterations.to_be_bytes());
                put_bytes(&mut out, &c.credential.stored_key);
                put_bytes(&mut out, &c.credential.server_key);
            }
            MetaRecord::CredentialRemoved { user, mechanism } => {
                out.push(TAG_CREDENTIAL_REMOVED);
                put_str(&mut out, user);
                out.push(mechanism.code() as u8);
            }
            MetaRecord::TopicConfig {
                name,
                incarnation,
                configs,
            } => {
                out.push(TAG_TOPIC_CONFIG);
                put_str(&mut out, name);
                out.extend(incarnation.to_be_bytes());
                out.extend((configs.len() as u32).to_be_bytes());
                for (k, v) in configs {
                    put_str(&mut out, k);
                    put_str(&mut out, v);
                }
            }
            MetaRecord::LogStart { partition, start } => {
                out.push(TAG_LOG_START);
                out.extend(partition.to_be_bytes());
                out.extend(start.to_be_bytes());
            }
            MetaRecord::GroupDeleted { group } => {
                out.push(TAG_GROUP_DELETED);
                put_str(&mut out, group);
            }
            MetaRecord::OffsetsDeleted { group, partitions } => {
                out.push(TAG_OFFSETS_DELETED);
                put_str(&mut out, group);
                out.extend((partitions.len() as u32).to_be_bytes());
                for (topic, partition) in partitions {
                    put_str(&mut out, topic);
                    out.extend(partition.to_be_bytes());
                }
            }
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<MetaRecord, String> {
        let mut c = Cursor { b, at: 0 };
        let r = match c.u8()? {
            TAG_DELETE => MetaRecord::DeleteTopic {
                name: c.str()?,
                incarnation: c.i32()? as u32,
            },
            TAG_PRODUCER_ID => MetaRecord::ProducerId { id: c.i64()? },
            TAG_GENERATION => MetaRecord::Generation {
                group: c.str()?,
                generation: c.i32()?,
            },
            TAG_COMMITS => {
                let group = c.str()?;
                let n = c.count(19, "commits")?;
                let mut commits = Vec::with_capacity(n);
                for _ in 0..n {
                    let topic = c.str()?;
                    let partition = c.i32()?;
                    let offset = c.i64()?;
                    let leader_epoch = c.i32()?;
                    let metadata = match c.u8()? {
                        0 => None,
                        _ => Some(c.str()?),
                    };
                    commits.push(Commit {
                        topic,
                        partition,
                        offset,
                        leader_epoch,
                        metadata,
                    });
                }
                MetaRecord::Commits { group, commits }
            }
            TAG_PRODUCER_STATE => {
                let partition = c.i32()? as u32;
                let through = c.i64()? as u64;
                let part = c.i32()? as u32;
                let parts = c.i32()? as u32;
                if part >= parts {
                    return Err(format!("producer state part {part} of {parts}"));
                }
                let n = c.count(19, "producers")?;
                let mut producers = Vec::with_capacity(n);
                for _ in 0..n {
                    let id = c.i64()?;
                    let epoch = c.i16()?;
                    let last_seen_ms = c.i64()?;
                    let nb = usize::from(c.u8()?);
                    if nb > MAX_SNAP_BATCHES {
                        return Err(format!(
                            "producer {id} with {nb} batches (at most {MAX_SNAP_BATCHES})"
                        ));
                    }
                    let mut batches = Vec::with_capacity(nb);
                    for _ in 0..nb {
                        let first_seq = c.i32()?;
                        let last_seq = c.i32()?;
                        let offset = c.i64()? as u64;
                        if offset >= through {
                            return Err(format!(
                                "producer {id} batch at offset {offset}, not below the snapshot's {through}"
                            ));
                        }
                        batches.push(StoredBatch {
                            first_seq,
                            last_seq,
                            offset,
                        });
                    }
                    producers.push(ProducerSnap {
                        id,
                        epoch,
                        last_seen_ms,
                        batches,
                    });
                }
                MetaRecord::ProducerState(ProducerStatePart {
                    partition,
                    through,
                    part,
                    parts,
                    producers,
                })
            }
            TAG_TIME_INDEX => {
                let partition = c.i32()? as u32;
                let from = c.i64()? as u64;
                let to = c.i64()? as u64;
                let running = c.i64()?;
                let max = match c.u8()? {
                    0 => None,
                    _ => Some((c.i64()?, c.i64()? as u64)),
                };
                let since_sample = c.i64()? as u64;
                let part = c.i32()? as u32;
                let parts = c.i32()? as u32;
                if part >= parts || from > to {
                    return Err(format!(
                        "time index part {part} of {parts} over offsets {from}..{to}"
                    ));
                }
                let n = c.count(TIME_SAMPLE_LEN, "samples")?;
                let mut samples = Vec::with_capacity(n);
                for _ in 0..n {
                    samples.push((c.i64()? as u64, c.i64()?));
                }
                MetaRecord::TimeIndex(TimeIndexPart {
                    partition,
                    head: TimesHead {
                        from,
                        to,
                        running,
                        max,
                        since_sample,
                    },
                    part,
                    parts,
                    samples,
                })
            }
            TAG_ACL_ADDED => MetaRecord::AclAdded(crate::acl::record::get(&mut c)?),
            TAG_ACL_REMOVED => MetaRecord::AclRemoved(crate::acl::record::get(&mut c)?),
            TAG_CREDENTIAL => MetaRecord::Credential(CredentialRecord {
                user: c.str()?,
                mechanism: c.mechanism()?,
                credential: ScramCredential {
                    salt: c.bytes()?,
                    iterations: c.i32()? as u32,
                    stored_key: c.bytes()?,
                    server_key: c.bytes()?,
                },
            }),
            TAG_CREDENTIAL_REMOVED => MetaRecord::CredentialRemoved {
                user: c.str()?,
                mechanism: c.mechanism()?,
            },
            TAG_TOPIC_CONFIG => {
                let name = c.str()?;
                let incarnation = c.i32()? as u32;
                let n = c.count(4, "configs")?;
                let mut configs = Vec::with_capacity(n);
                for _ in 0..n {
                    configs.push((c.str()?, c.str()?));
                }
                MetaRecord::TopicConfig {
                    name,
                    incarnation,
                    configs,
                }
            }
            TAG_LOG_START => MetaRecord::LogStart {
                partition: c.i32()? as u32,
                start: c.i64()? as u64,
            },
            TAG_GROUP_DELETED => MetaRecord::GroupDeleted { group: c.str()? },
            TAG_OFFSETS_DELETED => {
                let group = c.str()?;
                let n = c.count(6, "partitions")?;
                let mut partitions = Vec::with_capacity(n);
                for _ in 0..n {
                    partitions.push((c.str()?, c.i32()?));
                }
                MetaRecord::OffsetsDeleted { group, partitions }
            }
            t => return Err(format!("unknown record tag {t}")),
        };
        if c.at != b.len() {
            return Err(format!("{} trailing bytes", b.len() - c.at));
        }
        Ok(r)
    }
}

pub(crate) struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| format!("truncated at byte {} (wanted {n} more)", self.at))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    /// A count of items that take at least `min_len` bytes each: one beyond the record is
    /// corrupt (and must not size an allocation).
    fn count(&mut self, min_len: usize, what: &str) -> Result<usize, String> {
        let n = self.i32()? as u32 as usize;
        if n > self.b.len() / min_len {
            return Err(format!("{n} {what} cannot fit {} bytes", self.b.len()));
        }
        Ok(n)
    }
    fn i16(&mut self) -> Result<i16, String> {
        let s = self.take(2)?;
        Ok(i16::from_be_bytes([s[0], s[1]]))
    }
    fn i32(&mut self) -> Result<i32, String> {
        let s = self.take(4)?;
        Ok(i32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn i64(&mut self) -> Result<i64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(i64::from_be_bytes(a))
    }
    fn bytes(&mut self) -> Result<Vec<u8>, String> {
        let s = self.take(2)?;
        let n = usize::from(u16::from_be_bytes([s[0], s[1]]));
        Ok(self.take(n)?.to_vec())
    }
    fn mechanism(&mut self) -> Result<ScramMechanism, String> {
        let c = self.u8()?;
        ScramMechanism::from_code(c as i8).ok_or_else(|| format!("unknown SCRAM mechanism {c}"))
    }
    pub(crate) fn str(&mut self) -> Result<String, String> {
        let s = self.take(2)?;
        let n = usize::from(u16::from_be_bytes([s[0], s[1]]));
        let at = self.at;
        String::from_utf8(self.take(n)?.to_vec())
            .map_err(|_| format!("string at byte {at} is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_are_cut_into_records_by_their_encoded_size() {
        // 300 commits with 4 KiB of metadata each: 1.2 MB, more than one record of 1 MiB takes.
        let commits: Vec<Commit> = (0..300)
            .map(|i| Commit {
                topic: format!("topic-{}", i % 7),
                partition: i,
                offset: i64::from(i) * 10,
                leader_epoch: -1,
                metadata: Some("m".repeat(4096)),
            })
            .collect();
        let max = 1 << 20;
        let recs = commits_records("a-group", commits.clone(), max);
        assert!(recs.len() >= 2, "{} records", recs.len());
        let mut back = Vec::new();
        for r in recs {
            let e = r.encode();
            assert!(e.len() <= max, "a record of {} B", e.len());
            match MetaRecord::decode(&e).unwrap() {
                MetaRecord::Commits { group, commits } => {
                    assert_eq!(group, "a-group");
                    back.extend(commits);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(back, commits);
        for c in &back {
            assert_eq!(
                c.encoded_len() + 7 + 7,
                MetaRecord::Commits {
                    group: "a-group".into(),
                    commits: vec![c.clone()]
                }
                .encode()
                .len()
            );
        }
        assert!(commits_records("g", Vec::new(), max).is_empty());
    }

    #[test]
    fn records_round_trip_and_damage_is_refused() {
        let recs = [
            MetaRecord::DeleteTopic {
                name: "t".into(),
                incarnation: 2,
            },
            MetaRecord::ProducerId { id: 42 },
            MetaRecord::Generation {
                group: "g".into(),
                generation: 7,
            },
            MetaRecord::Commits {
                group: "g".into(),
                commits: vec![
                    Commit {
                        topic: "a".into(),
                        partition: 1,
                        offset: 99,
                        leader_epoch: -1,
                        metadata: Some("m".into()),
                    },
                    Commit {
                        topic: "b".into(),
                        partition: 0,
                        offset: 5,
                        leader_epoch: 3,
                        metadata: None,
                    },
                ],
            },
            MetaRecord::ProducerState(ProducerStatePart {
                partition: 3,
                through: 100,
                part: 1,
                parts: 2,
                producers: vec![
                    ProducerSnap {
                        id: 7,
                        epoch: 2,
                        last_seen_ms: 1_700_000_000_000,
                        batches: vec![
                            StoredBatch {
                                first_seq: 0,
                                last_seq: 4,
                                offset: 10,
                            },
                            StoredBatch {
                                first_seq: 5,
                                last_seq: 5,
                                offset: 99,
                            },
                        ],
                    },
                    ProducerSnap {
                        id: 8,
                        epoch: 0,
                        last_seen_ms: 0,
                        batches: vec![],
                    },
                ],
            }),
            MetaRecord::TimeIndex(TimeIndexPart {
                partition: 3,
                head: TimesHead {
                    from: 10,
                    to: 900,
                    running: 1_700_000_000_000,
                    max: Some((1_700_000_000_000, 850)),
                    since_sample: 4096,
                },
                part: 1,
                parts: 2,
                samples: vec![(10, i64::MIN), (400, 1_600_000_000_000)],
            }),
            MetaRecord::TimeIndex(TimeIndexPart {
                partition: 3,
                head: TimesHead {
                    from: 0,
                    to: 0,
                    running: i64::MIN,
                    max: None,
                    since_sample: 0,
                },
                part: 0,
                parts: 1,
                samples: vec![],
            }),
            MetaRecord::Credential(CredentialRecord {
                user: "alice".into(),
                mechanism: ScramMechanism::Sha512,
                credential: ScramCredential {
                    salt: vec![1; 32],
                    iterations: 4096,
                    stored_key: vec![2; 64],
                    server_key: vec![3; 64],
                },
            }),
            MetaRecord::CredentialRemoved {
                user: "bob".into(),
                mechanism: ScramMechanism::Sha256,
            },
            MetaRecord::TopicConfig {
                name: "t".into(),
                incarnation: 1,
                configs: vec![
                    ("retention.ms".into(), "60000".into()),
                    ("cleanup.policy".into(), "delete".into()),
                ],
            },
            MetaRecord::TopicConfig {
                name: "u".into(),
                incarnation: 0,
                configs: vec![],
            },
            MetaRecord::LogStart {
                partition: 4,
                start: 1234,
            },
            MetaRecord::GroupDeleted { group: "g".into() },
            MetaRecord::OffsetsDeleted {
                group: "g".into(),
                partitions: vec![("a".into(), 1), ("b".into(), 0)],
            },
        ];
        let acl = crate::acl::Binding::from_wire(crate::acl::Wire {
            resource_type: 2,
            name: "orders-",
            pattern_type: 4,
            principal: "User:alice",
            host: "10.0.0.1",
            op: 4,
            permission: 3,
        })
        .unwrap();
        let recs = recs.into_iter().chain([
            MetaRecord::AclAdded(acl.clone()),
            MetaRecord::AclRemoved(acl),
        ]);
        for r in recs {
            let e = r.encode();
            assert_eq!(MetaRecord::decode(&e).unwrap(), r);
            assert!(MetaRecord::decode(&e[..e.len() - 1]).is_err());
        }
        assert!(MetaRecord::decode(&[9]).is_err());
        // A binding record whose operation code is not one: refused by name.
        let mut bad = vec![12u8, 2, 3, 0, 1, b't'];
        bad.extend([0, 6]);
        bad.extend(b"User:a");
        bad.extend([0, 1, b'*', 99, 3]);
        let e = MetaRecord::decode(&bad).unwrap_err();
        assert!(e.contains("operation code 99"), "{e}");
        // A credential of an unknown mechanism is refused, by name.
        let e = MetaRecord::decode(&[11, 0, 1, b'u', 7]).unwrap_err();
        assert!(e.contains("mechanism 7"), "{e}");
        // A batch at or past the snapshot's `through`, more than five batches, a part past the
        // count: each refused.
        let snap = |batches: Vec<StoredBatch>, part: u32| {
            MetaRecord::ProducerState(ProducerStatePart {
                partition: 0,
                through: 10,
                part,
                parts: 1,
                producers: vec![ProducerSnap {
                    id: 1,
                    epoch: 0,
                    last_seen_ms: 0,
                    batches,
                }],
            })
        };
        let at = |offset| StoredBatch {
            first_seq: 0,
            last_seq: 0,
            offset,
        };
        assert!(MetaRecord::decode(&snap(vec![at(9)], 0).encode()).is_ok());
        assert!(MetaRecord::decode(&snap(vec![at(10)], 0).encode()).is_err());
        assert!(MetaRecord::decode(&snap(vec![at(1)], 1).encode()).is_err());
        let mut six = snap(vec![at(1)], 0).encode();
        let n_at = PRODUCER_STATE_HEADER_LEN + 18;
        assert_eq!(six[n_at], 1);
        six[n_at] = 6;
        six.extend([0u8; 80]);
        assert!(MetaRecord::decode(&six).is_err());
        assert!(MetaRecord::decode(&[4, 0, 1, b'g', 0xff, 0xff, 0xff, 0xff]).is_err());
    }
}
