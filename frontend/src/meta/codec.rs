//! The byte layout of each `MetaRecord`: a tag byte, then its fields big-endian, strings and
//! byte strings with a u16 length, lists with a u32 count. Decoding refuses (by what is wrong)
//! anything but one whole record: damage is reported, never taken.

use super::records::*;
use super::Cursor;
use crate::sasl::ScramCredential;

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
        let mut c = Cursor::new(b);
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
        c.finish()?;
        Ok(r)
    }
}
