//! After the broker is back: read the whole topic over the Kafka protocol and hold it against the
//! ledger.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::records::RecordBatchDecoder;

use crate::powercut::ledger::{Contents, Entry};
use crate::powercut::payload::{self, RecordId};
use crate::powercut::{wire, RigError};

/// Where a record sits.
pub type Position = (i32, i64);

/// Something served that fails its own checksum or is not what its id was sent as.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Fault {
    pub partition: i32,
    pub offset: i64,
    pub what: String,
}

/// What the broker serves for the topic, offset by offset.
#[derive(Debug, Default)]
pub struct Scan {
    pub records: HashMap<Position, Bytes>,
    /// Whole batches that failed to decode (their CRC, or their framing).
    pub faults: Vec<Fault>,
    pub high_watermarks: Vec<i64>,
}

fn be_i64(b: &[u8]) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    i64::from_be_bytes(a)
}

fn be_i32(b: &[u8]) -> i32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    i32::from_be_bytes(a)
}

/// Reads every partition of `topic` from its start to its high watermark.
pub async fn scan(
    addr: &str,
    topic: &str,
    partitions: i32,
    timeout: Duration,
) -> Result<Scan, RigError> {
    let mut c = wire::connect(addr, "nvmq-rig-verify", timeout).await?;
    let mut out = Scan::default();
    for p in 0..partitions {
        let mut next = 0i64;
        let hw = loop {
            let resp = wire::fetch(&mut c, topic, p, next).await?;
            let pd = resp
                .responses
                .first()
                .and_then(|t| t.partitions.first())
                .ok_or_else(|| RigError::Protocol {
                    op: "Fetch",
                    what: format!("{topic}/{p}: no partition in the answer"),
                })?;
            if pd.error_code == wire::UNKNOWN_TOPIC_OR_PARTITION {
                // Gone with the cut: nothing is served, every ack on it is lost.
                break -1;
            }
            if pd.error_code != 0 {
                if next < pd.log_start_offset {
                    // Retention freed the head: start from what is retained.
                    next = pd.log_start_offset;
                    continue;
                }
                return Err(RigError::Protocol {
                    op: "Fetch",
                    what: format!("{topic}/{p} at {next}: error code {}", pd.error_code),
                });
            }
            let hw = pd.high_watermark;
            if next >= hw {
                break hw;
            }
            let bytes = pd.records.clone().unwrap_or_default();
            let before = next;
            let mut at = 0usize;
            // Batch by batch, so that one bad batch is reported and the rest still read.
            while bytes.len() - at >= 27 {
                let len = be_i32(&bytes[at + 8..]);
                let Some(total) = usize::try_from(len).ok().map(|l| l + 12) else {
                    break;
                };
                if at + total > bytes.len() {
                    break; // a partial batch at the end of the answer
                }
                let base = be_i64(&bytes[at..]);
                let last = base + i64::from(be_i32(&bytes[at + 23..]));
                let mut one = bytes.slice(at..at + total);
                match RecordBatchDecoder::decode(&mut one) {
                    Ok(set) => {
                        for r in set.records {
                            if r.offset >= next {
                                out.records
                                    .insert((p, r.offset), r.value.unwrap_or_default());
                            }
                        }
                    }
                    Err(e) => out.faults.push(Fault {
                        partition: p,
                        offset: base,
                        what: format!("batch {base}..={last} fails to decode: {e}"),
                    }),
                }
                next = next.max(last + 1);
                at += total;
            }
            if next == before {
                return Err(RigError::Protocol {
                    op: "Fetch",
                    what: format!(
                        "{topic}/{p}: no whole batch at offset {next}, below the high watermark {hw}"
                    ),
                });
            }
        };
        out.high_watermarks.push(hw);
    }
    Ok(out)
}

/// An acknowledged record the broker does not give back as sent.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Lost {
    pub partition: i32,
    pub offset: i64,
    pub id: RecordId,
    pub what: String,
}

/// The ledger held against a scan.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Ledger entries checked.
    pub checked: u64,
    pub lost: Vec<Lost>,
    pub faults: Vec<Fault>,
    /// Records present that were never acknowledged.
    pub survivors: BTreeSet<RecordId>,
    /// Records present at more than one offset, with every offset.
    pub duplicates: BTreeMap<RecordId, Vec<Position>>,
    /// The highest cycle of any sound record of the run served (acknowledged or not): a resumed
    /// run numbers its cycles past it, so that no new id meets an old one.
    pub highest_cycle: u32,
}

/// Checks every ledger entry bit-exact against the scan, every served record against its own
/// checksum and against the bytes its id was sent as, and finds survivors and duplicates.
pub fn judge(ledger: &Contents, scan: &Scan) -> Verdict {
    let run = ledger.header.run;
    let body_len = ledger.header.body_len;
    let mut v = Verdict {
        checked: ledger.entries.len() as u64,
        faults: scan.faults.clone(),
        ..Verdict::default()
    };
    let mut found: HashMap<RecordId, Vec<Position>> = HashMap::new();
    for (&(partition, offset), value) in &scan.records {
        let fault = |what: String| Fault {
            partition,
            offset,
            what,
        };
        match payload::check(value) {
            Err(e) => v.faults.push(fault(e.to_string())),
            Ok((r, id)) if r != run => v.faults.push(fault(format!(
                "record {id} of run {r:016x}, not {run:016x}"
            ))),
            Ok((_, id)) if value[..] != payload::encode(run, id, body_len)[..] => v.faults.push(
                fault(format!("{id} is sound but not what {id} was sent as")),
            ),
            Ok((_, id)) => found.entry(id).or_default().push((partition, offset)),
        }
    }
    v.faults.sort_by_key(|f| (f.partition, f.offset));
    let acked: BTreeSet<RecordId> = ledger.entries.iter().map(|e| e.id).collect();
    for e in &ledger.entries {
        if let Some(what) = missing(e, scan) {
            v.lost.push(Lost {
                partition: e.partition,
                offset: e.offset,
                id: e.id,
                what,
            });
        }
    }
    v.highest_cycle = found.keys().map(|id| id.cycle).max().unwrap_or(0);
    for (id, mut at) in found {
        if !acked.contains(&id) {
            v.survivors.insert(id);
        }
        if at.len() > 1 {
            at.sort();
            v.duplicates.insert(id, at);
        }
    }
    v
}

/// Why an acknowledged record is not served back as sent, if it is not.
fn missing(e: &Entry, scan: &Scan) -> Option<String> {
    let Some(value) = scan.records.get(&(e.partition, e.offset)) else {
        let hw = scan
            .high_watermarks
            .get(usize::try_from(e.partition).ok()?)
            .copied()
            .unwrap_or(-1);
        return Some(format!("not served (partition high watermark {hw})"));
    };
    if value.len() == e.len as usize && crc32c::crc32c(value) == e.hash {
        return None;
    }
    Some(match payload::check(value) {
        Ok((_, id)) if id == e.id => format!("{id} served with other bytes"),
        Ok((_, id)) => format!("offset holds {id} instead"),
        Err(f) => format!("offset holds a damaged record: {f}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::powercut::ledger::Header;

    const RUN: u64 = 5;
    const BODY: (usize, usize) = (8, 64);

    fn id(seq: u64) -> RecordId {
        RecordId {
            cycle: 1,
            producer: 0,
            seq,
        }
    }

    fn entry(seq: u64, offset: i64) -> Entry {
        let v = payload::encode(RUN, id(seq), BODY);
        Entry {
            partition: 0,
            offset,
            id: id(seq),
            len: v.len() as u32,
            hash: crc32c::crc32c(&v),
        }
    }

    fn ledger(entries: Vec<Entry>) -> Contents {
        Contents {
            header: Header {
                run: RUN,
                seed: 1,
                topic: "t".into(),
                partitions: 1,
                body_len: BODY,
            },
            entries,
            starts: Vec::new(),
            cuts: Vec::new(),
            torn_tail: false,
            good_len: 0,
        }
    }

    fn served(list: &[(i64, u64)]) -> Scan {
        let mut s = Scan {
            high_watermarks: vec![list.len() as i64],
            ..Scan::default()
        };
        for &(offset, seq) in list {
            s.records
                .insert((0, offset), payload::encode(RUN, id(seq), BODY).into());
        }
        s
    }

    #[test]
    fn a_sound_scan_passes_and_counts_survivors_and_duplicates() {
        let l = ledger(vec![entry(1, 0), entry(2, 1)]);
        let v = judge(&l, &served(&[(0, 1), (1, 2), (2, 3), (3, 3)]));
        assert_eq!(v.checked, 2);
        assert!(v.lost.is_empty() && v.faults.is_empty(), "{v:?}");
        assert_eq!(v.survivors, BTreeSet::from([id(3)]));
        assert_eq!(v.duplicates.get(&id(3)), Some(&vec![(0, 2), (0, 3)]));
        assert_eq!(v.highest_cycle, 1);
    }

    #[test]
    fn missing_moved_and_damaged_records_are_caught() {
        let l = ledger(vec![entry(1, 0), entry(2, 1), entry(3, 2)]);
        // Offset 1 holds record 3, offset 2 is gone, offset 0 is damaged.
        let mut s = served(&[(0, 1), (1, 3)]);
        let mut bad = s.records[&(0, 0)].to_vec();
        bad[40] ^= 4;
        s.records.insert((0, 0), bad.into());
        let v = judge(&l, &s);
        let lost: Vec<i64> = v.lost.iter().map(|l| l.offset).collect();
        assert_eq!(lost, vec![0, 1, 2], "{v:?}");
        assert_eq!(v.faults.len(), 1);
        assert_eq!(v.faults[0].offset, 0);
    }
}
