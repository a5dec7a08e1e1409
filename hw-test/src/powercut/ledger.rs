//! The controller's record of what the broker acknowledged, kept on the controller's own disk.
//!
//! One text line per acknowledged record, each ending in the CRC32C of the rest of the line, and a
//! header line naming the run. An entry is written and fdatasync'ed before the controller counts
//! the ack, so whatever the count says is on the ledger. A line cut short by a crash of the
//! controller itself (no newline, or a checksum that does not match on the last line) was never
//! counted and is ignored; a bad line anywhere else is corruption and refuses the ledger.
//!
//! Marks between the entries say where each cycle began (and with which seed) and what its load
//! sent, so that a run can be resumed from its ledger with its cycles numbered on. Ledgers
//! written before the marks existed hold none and still read.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::powercut::payload::RecordId;

/// One acknowledged record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub partition: i32,
    pub offset: i64,
    pub id: RecordId,
    pub len: u32,
    /// CRC32C of the whole payload as sent.
    pub hash: u32,
}

/// What the header line says about the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub run: u64,
    pub seed: u64,
    pub topic: String,
    pub partitions: i32,
    /// Bounds of the record body length (the verifier regenerates bodies from ids).
    pub body_len: (usize, usize),
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger {path}: {op}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("ledger {path} exists already (each run starts a ledger of its own; resuming continues the run it holds)")]
    Exists { path: PathBuf },
    #[error("ledger {path} is held by another controller (it has the file locked); one controller per run")]
    Busy { path: PathBuf },
    #[error("ledger {path} does not exist: there is no run to resume or check")]
    Missing { path: PathBuf },
    #[error("ledger {path} holds {len} bytes, fewer than the {good} read before resuming: another writer?")]
    Shrunk { path: PathBuf, len: u64, good: u64 },
    #[error("ledger {path}, line {line}: {what}")]
    Corrupt {
        path: PathBuf,
        line: usize,
        what: String,
    },
}

/// A cycle's load began (written before any record of the cycle is sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CycleStart {
    pub cycle: u32,
    /// The seed of the controller session that ran the cycle (its cut moment).
    pub seed: u64,
}

/// A cycle's cut came and its load ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CycleCut {
    pub cycle: u32,
    /// Records sent in the cycle, resends included.
    pub sent: u64,
}

/// The ledger as written: appends go to the end and reach the disk before `append` returns.
pub struct Ledger {
    file: File,
    path: PathBuf,
}

fn seal(body: &str) -> String {
    format!("{body} {:08x}\n", crc32c::crc32c(body.as_bytes()))
}

fn header_line(h: &Header) -> String {
    seal(&format!(
        "run {:016x} seed {} partitions {} body {} {} topic {}",
        h.run, h.seed, h.partitions, h.body_len.0, h.body_len.1, h.topic
    ))
}

fn entry_line(e: &Entry) -> String {
    seal(&format!(
        "ack {} {} {} {} {} {} {:08x}",
        e.partition, e.offset, e.id.cycle, e.id.producer, e.id.seq, e.len, e.hash
    ))
}

fn io_error(path: &Path, op: &'static str) -> impl Fn(std::io::Error) -> LedgerError {
    let path = path.to_path_buf();
    move |source| LedgerError::Io {
        op,
        path: path.clone(),
        source,
    }
}

fn start_line(m: &CycleStart) -> String {
    seal(&format!("cycle {} seed {}", m.cycle, m.seed))
}

fn cut_line(m: &CycleCut) -> String {
    seal(&format!("cut {} sent {}", m.cycle, m.sent))
}

/// How long opening a ledger waits for its lock before calling it busy.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Ledger {
    /// Opens the file at `path` to append: a new one (refusing an existing file), or an existing
    /// one (refusing a missing file).
    fn open(path: &Path, new: bool) -> Result<Ledger, LedgerError> {
        let file = OpenOptions::new()
            .append(true)
            .create_new(new)
            .open(path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => LedgerError::Exists {
                    path: path.to_path_buf(),
                },
                std::io::ErrorKind::NotFound if !new => LedgerError::Missing {
                    path: path.to_path_buf(),
                },
                _ => io_error(path, if new { "creating" } else { "opening to append" })(e),
            })?;
        // Held while this controller appends (released when the file closes, also when the
        // controller dies): two controllers appending to one ledger would interleave their runs.
        // A lock still held for a moment is waited for: a process forked while the file was
        // open holds its description until it execs (or a dead controller's until it is reaped).
        let waited = std::time::Instant::now();
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if waited.elapsed() < LOCK_WAIT => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(LedgerError::Busy {
                        path: path.to_path_buf(),
                    })
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io_error(path, "locking")(e)),
            }
        }
        Ok(Ledger {
            file,
            path: path.to_path_buf(),
        })
    }

    /// Creates a new ledger (refusing an existing file) and makes its header durable.
    pub fn create(path: &Path, header: &Header) -> Result<Ledger, LedgerError> {
        let mut l = Ledger::open(path, true)?;
        l.write(header_line(header).as_bytes())?;
        // The new name must survive too: sync the directory that holds it.
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io_error(path, "syncing its directory"))?;
        }
        Ok(l)
    }

    /// Opens a ledger read as `read` found it, to append to it. A torn last line is cut off
    /// first (it was never counted, and entries after it would turn it into corruption).
    pub fn resume(path: &Path, read: &Contents) -> Result<Ledger, LedgerError> {
        let l = Ledger::open(path, false)?;
        let io = |op| io_error(path, op);
        let len = l.file.metadata().map_err(io("reading its length"))?.len();
        if len < read.good_len {
            return Err(LedgerError::Shrunk {
                path: path.to_path_buf(),
                len,
                good: read.good_len,
            });
        }
        if len > read.good_len {
            l.file
                .set_len(read.good_len)
                .map_err(io("cutting off the torn last line"))?;
            l.file
                .sync_all()
                .map_err(io("syncing after cutting the torn last line"))?;
        }
        Ok(l)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), LedgerError> {
        let io = |op| io_error(&self.path, op);
        self.file.write_all(bytes).map_err(io("appending"))?;
        self.file.sync_data().map_err(io("fdatasync"))
    }

    /// Appends entries and waits until they are on the controller's disk.
    pub fn append(&mut self, entries: &[Entry]) -> Result<(), LedgerError> {
        let text: String = entries.iter().map(entry_line).collect();
        self.write(text.as_bytes())
    }

    /// Marks the start of a cycle's load, before any of its records is sent.
    pub fn start_cycle(&mut self, m: &CycleStart) -> Result<(), LedgerError> {
        self.write(start_line(m).as_bytes())
    }

    /// Marks the end of a cycle's load, after its cut.
    pub fn cut_cycle(&mut self, m: &CycleCut) -> Result<(), LedgerError> {
        self.write(cut_line(m).as_bytes())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A ledger read back.
#[derive(Debug, Clone)]
pub struct Contents {
    pub header: Header,
    pub entries: Vec<Entry>,
    pub starts: Vec<CycleStart>,
    pub cuts: Vec<CycleCut>,
    /// A last line cut short (never counted), if there was one.
    pub torn_tail: bool,
    /// Bytes up to the end of the last sound line (the file's length unless the tail is torn).
    pub good_len: u64,
}

impl Contents {
    /// The highest cycle the ledger knows of: marked as started, or holding an ack.
    pub fn highest_cycle(&self) -> u32 {
        let marked = self.starts.iter().map(|m| m.cycle);
        let cuts = self.cuts.iter().map(|m| m.cycle);
        let acked = self.entries.iter().map(|e| e.id.cycle);
        marked.chain(cuts).chain(acked).max().unwrap_or(0)
    }
}

fn unseal(line: &str) -> Option<&str> {
    let (body, crc) = line.rsplit_once(' ')?;
    let crc = u32::from_str_radix(crc, 16)
        .ok()
        .filter(|_| crc.len() == 8)?;
    (crc32c::crc32c(body.as_bytes()) == crc).then_some(body)
}

fn parse_header(body: &str) -> Option<Header> {
    let f: Vec<&str> = body.splitn(11, ' ').collect();
    match f[..] {
        ["run", run, "seed", seed, "partitions", p, "body", lo, hi, "topic", topic] => {
            Some(Header {
                run: u64::from_str_radix(run, 16).ok()?,
                seed: seed.parse().ok()?,
                partitions: p.parse().ok()?,
                body_len: (lo.parse().ok()?, hi.parse().ok()?),
                topic: topic.to_string(),
            })
        }
        _ => None,
    }
}

/// One line after the header.
enum Line {
    Entry(Entry),
    Start(CycleStart),
    Cut(CycleCut),
}

fn parse_line(body: &str) -> Option<Line> {
    let f: Vec<&str> = body.split(' ').collect();
    match f[..] {
        ["cycle", cycle, "seed", seed] => Some(Line::Start(CycleStart {
            cycle: cycle.parse().ok()?,
            seed: seed.parse().ok()?,
        })),
        ["cut", cycle, "sent", sent] => Some(Line::Cut(CycleCut {
            cycle: cycle.parse().ok()?,
            sent: sent.parse().ok()?,
        })),
        ["ack", partition, offset, cycle, producer, seq, len, hash] => Some(Line::Entry(Entry {
            partition: partition.parse().ok()?,
            offset: offset.parse().ok()?,
            id: RecordId {
                cycle: cycle.parse().ok()?,
                producer: producer.parse().ok()?,
                seq: seq.parse().ok()?,
            },
            len: len.parse().ok()?,
            hash: u32::from_str_radix(hash, 16).ok()?,
        })),
        _ => None,
    }
}

/// Reads a ledger back, ignoring a torn last line.
pub fn read(path: &Path) -> Result<Contents, LedgerError> {
    let bytes = std::fs::read(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => LedgerError::Missing {
            path: path.to_path_buf(),
        },
        _ => LedgerError::Io {
            op: "reading",
            path: path.to_path_buf(),
            source,
        },
    })?;
    let corrupt = |line: usize, what: String| LedgerError::Corrupt {
        path: path.to_path_buf(),
        line,
        what,
    };
    let mut lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    // What follows the last newline is either nothing or a line the crash cut short.
    let tail = lines.pop().unwrap_or_default();
    let mut torn_tail = !tail.is_empty();
    let mut header = None;
    let mut entries = Vec::new();
    let (mut starts, mut cuts) = (Vec::new(), Vec::new());
    let mut good_len = 0u64;
    let count = lines.len();
    for (i, raw) in lines.into_iter().enumerate() {
        let end = good_len + raw.len() as u64 + 1;
        let body = std::str::from_utf8(raw).ok().and_then(unseal);
        let Some(body) = body else {
            // A whole last line with a bad checksum: written in part before the crash (the
            // newline landed, an earlier block of the line did not).
            if i + 1 == count && !torn_tail && header.is_some() {
                torn_tail = true;
                continue;
            }
            return Err(corrupt(i + 1, "checksum does not match".into()));
        };
        good_len = end;
        if i == 0 {
            header = Some(
                parse_header(body)
                    .ok_or_else(|| corrupt(1, format!("not a ledger header: {body:?}")))?,
            );
            continue;
        }
        match parse_line(body) {
            Some(Line::Entry(e)) => entries.push(e),
            Some(Line::Start(m)) => starts.push(m),
            Some(Line::Cut(m)) => cuts.push(m),
            None => return Err(corrupt(i + 1, format!("not an entry or a mark: {body:?}"))),
        }
    }
    let header = header.ok_or_else(|| corrupt(1, "no header line".into()))?;
    Ok(Contents {
        header,
        entries,
        starts,
        cuts,
        torn_tail,
        good_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("nvmq-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("test dir");
        d
    }

    fn header() -> Header {
        Header {
            run: 0xabc,
            seed: 9,
            topic: "rig-x".into(),
            partitions: 2,
            body_len: (16, 300),
        }
    }

    fn entry(seq: u64) -> Entry {
        Entry {
            partition: 1,
            offset: 10 + seq as i64,
            id: RecordId {
                cycle: 2,
                producer: 3,
                seq,
            },
            len: 77,
            hash: 0xdead_beef,
        }
    }

    #[test]
    fn a_ledger_in_use_cannot_be_resumed_by_a_second_controller() {
        let p = dir("ledger-busy").join("ledger");
        let mut first = Ledger::create(&p, &header()).expect("create");
        first.append(&[entry(0)]).expect("append");
        let c = read(&p).expect("read");
        assert!(matches!(
            Ledger::resume(&p, &c),
            Err(LedgerError::Busy { .. })
        ));
        drop(first);
        let mut second = Ledger::resume(&p, &c).expect("resume once the first is gone");
        second.append(&[entry(1)]).expect("append");
        assert_eq!(read(&p).expect("read").entries, vec![entry(0), entry(1)]);
    }

    #[test]
    fn entries_read_back_and_a_torn_last_line_is_ignored() {
        let p = dir("ledger-torn").join("ledger");
        let mut l = Ledger::create(&p, &header()).expect("create");
        l.append(&[entry(0), entry(1)]).expect("append");
        l.append(&[entry(2)]).expect("append");
        let c = read(&p).expect("read");
        assert_eq!(c.header, header());
        assert_eq!(c.entries, vec![entry(0), entry(1), entry(2)]);
        assert!(!c.torn_tail);

        // The last line cut short, without its newline.
        let whole = std::fs::read(&p).expect("bytes");
        std::fs::write(&p, &whole[..whole.len() - 5]).expect("cut");
        let c = read(&p).expect("read torn");
        assert_eq!(c.entries, vec![entry(0), entry(1)]);
        assert!(c.torn_tail);

        // The last line whole but with a byte that never landed.
        let mut b = whole.clone();
        let n = b.len();
        b[n - 20] = 0;
        std::fs::write(&p, &b).expect("damage last");
        let c = read(&p).expect("read damaged last");
        assert_eq!(c.entries, vec![entry(0), entry(1)]);
        assert!(c.torn_tail);

        assert!(matches!(
            Ledger::create(&p, &header()),
            Err(LedgerError::Exists { .. })
        ));
    }

    #[test]
    fn a_bad_line_before_the_last_refuses_the_ledger() {
        let p = dir("ledger-corrupt").join("ledger");
        let mut l = Ledger::create(&p, &header()).expect("create");
        l.append(&[entry(0), entry(1), entry(2)]).expect("append");
        let text = std::fs::read_to_string(&p).expect("text");
        let damaged = text.replacen("ack 1 11", "ack 1 19", 1);
        assert_ne!(damaged, text);
        std::fs::write(&p, damaged).expect("write");
        match read(&p) {
            Err(LedgerError::Corrupt { line, .. }) => assert_eq!(line, 3),
            other => panic!("damage in the middle not refused: {other:?}"),
        }
    }

    #[test]
    fn marks_read_back_and_a_resumed_ledger_drops_its_torn_tail() {
        let p = dir("ledger-resume").join("ledger");
        let mut l = Ledger::create(&p, &header()).expect("create");
        l.start_cycle(&CycleStart { cycle: 1, seed: 9 })
            .expect("start");
        l.append(&[entry(0), entry(1)]).expect("append");
        l.cut_cycle(&CycleCut { cycle: 1, sent: 8 }).expect("cut");
        l.start_cycle(&CycleStart { cycle: 2, seed: 9 })
            .expect("start");
        l.append(&[entry(2)]).expect("append");
        drop(l);
        let whole = std::fs::read(&p).expect("bytes");
        let c = read(&p).expect("read");
        assert_eq!(c.entries, vec![entry(0), entry(1), entry(2)]);
        assert_eq!(c.starts.len(), 2);
        assert_eq!(c.cuts, vec![CycleCut { cycle: 1, sent: 8 }]);
        assert_eq!(c.highest_cycle(), 2);
        assert_eq!(c.good_len, whole.len() as u64);

        // The controller stopped while writing entry 2: its line is torn.
        std::fs::write(&p, &whole[..whole.len() - 7]).expect("tear");
        let c = read(&p).expect("read torn");
        assert!(c.torn_tail);
        assert_eq!(c.entries, vec![entry(0), entry(1)]);
        let mut l = Ledger::resume(&p, &c).expect("resume");
        l.append(&[entry(5)]).expect("append after resume");
        drop(l);
        let c = read(&p).expect("read resumed");
        assert!(!c.torn_tail, "the torn line was not cut off");
        assert_eq!(c.entries, vec![entry(0), entry(1), entry(5)]);

        let gone = p.with_file_name("absent");
        assert!(matches!(read(&gone), Err(LedgerError::Missing { .. })));
        assert!(matches!(
            Ledger::resume(&gone, &c),
            Err(LedgerError::Missing { .. })
        ));
    }
}
