//! Clients that try to exhaust `nvmq serve`, for a test that runs them beside a normal load:
//! thousands of idle connections, connections stalled halfway through a frame, and waves of
//! clients that pipeline large Fetches and never read their answers. The budgets they run
//! against, and what each may make the broker hold under them, are here too, so that the test's
//! bounds follow from the flags.

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use frontend::client::{request_frame, set_correlation_id, Client};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::FetchRequest;

use super::kafka;

pub const IDLE: usize = 2_000;
pub const STALLED: usize = 100;
pub const NON_READERS: usize = 10;

/// `nvmq serve` flags setting the budgets below.
pub const SERVE_FLAGS: [&str; 6] = [
    "--max-connection-bytes",
    "4M",
    "--max-queued-bytes",
    "128M",
    "--write-timeout",
    "5s",
];
pub const CONNECTION_BUDGET: usize = 4 << 20;
pub const QUEUED_BUDGET: usize = 128 << 20;
/// Long enough that a normal producer's slowest ack beside the 100,000-partition load on a busy
/// 2-core machine (under 2 s seen) stays below it: an ack past it would have waited for the
/// non-readers to be closed.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// A stalled connection sends this much of a frame announcing [`STALLED_FRAME`] bytes, then
/// nothing: the broker holds what it read of the frame.
pub const STALLED_SENT: usize = 4096;
const STALLED_FRAME: i32 = 8_000_000;

/// The topic the non-readers fetch; each wave first writes a fill of [`FILL_RECORDS`] records of
/// [`FILL_RECORD`] bytes to it, and each Fetch asks for all of it from the fill's start.
pub const TOPIC: &str = "fetched-by-non-readers";
const FILL_RECORDS: usize = 60;
const FILL_RECORD: usize = 100_000;
/// Fetches each non-reader pipelines (each asks for up to 50 MB).
const PIPELINED: i32 = 100;
/// A record batch's framing around one record (61 B of header, the record's own few bytes),
/// and a Fetch answer's around its batches (headers, names, error codes), rounded up.
const BATCH_FRAMING: usize = 128;
const ANSWER_FRAMING: usize = 4096;
/// One pipelined Fetch frame, rounded up (its size is checked when the frames are built).
const FETCH_FRAME: usize = 256;

/// One Fetch answer: all of a fill, framed.
const ANSWER: usize = FILL_RECORDS * (FILL_RECORD + BATCH_FRAMING) + ANSWER_FRAMING;

/// The most one non-reader makes the broker hold (counted in its queued bytes): its connection
/// budget, plus the one answer it may make while under it, plus the Fetch frames it sent.
pub const NON_READER_HOLDS: usize = CONNECTION_BUDGET + ANSWER + PIPELINED as usize * FETCH_FRAME;

/// The most one non-reader makes the broker's memory grow: what it holds, plus the three copies
/// its answer passes through on the way (the records read from the device, their concatenation,
/// the encoded answer), each a buffer grown by doubling whose smaller predecessors, like the
/// copies themselves once freed, the allocator keeps for reuse: up to twice the answer each.
pub const NON_READER_MEMORY: usize = NON_READER_HOLDS + 3 * 2 * ANSWER;

/// The most an idle or stalled connection costs the broker: its state (task, slot, socket) is a
/// few KiB, and what it reads goes into an input buffer of 16 KiB (`INPUT_CHUNK` in
/// `frontend/src/reactor/conn.rs`) that an idle connection never touches and a stalled one's
/// 4 KiB fit in.
pub const CROWD_MEMORY: usize = 16 << 10;

// One wave of non-readers stays under the global budget, so that the broker never has to turn
// the other connections away: the bounds of the test are the per-connection ones.
const _: () = assert!(NON_READERS * NON_READER_HOLDS < QUEUED_BUDGET);

/// Idle and stalled connections, open until dropped.
pub struct Crowd {
    pub idle: Vec<TcpStream>,
    pub stalled: Vec<TcpStream>,
}

/// Opens [`IDLE`] connections that send nothing and [`STALLED`] that send [`STALLED_SENT`] bytes
/// of a frame and stop.
pub fn crowd(addr: &str) -> Crowd {
    let idle = (0..IDLE)
        .map(|_| TcpStream::connect(addr).expect("idle connection"))
        .collect();
    let mut frame = STALLED_FRAME.to_be_bytes().to_vec();
    frame.resize(4 + STALLED_SENT, 0);
    let stalled = (0..STALLED)
        .map(|_| {
            let mut s = TcpStream::connect(addr).expect("stalled connection");
            s.write_all(&frame).expect("partial frame");
            s
        })
        .collect();
    Crowd { idle, stalled }
}

/// Waves of [`NON_READERS`] clients that never read, one wave at a time, on a thread.
pub struct Waves {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<(usize, Vec<TcpStream>), String>>,
}

impl Waves {
    /// Starts the waves against `kafka`. Each writes a fill to [`TOPIC`] and opens its clients,
    /// which pipeline Fetches from the fill's start and never read; the next starts once the
    /// broker closed them (after [`WRITE_TIMEOUT`]): the connections open, scraped from
    /// `metrics`, are back to what they were before the first wave. So the other connections
    /// must stay open, and no new ones come, until [`Waves::stop`].
    pub fn start(kafka: &str, metrics: &str) -> Waves {
        let stop = Arc::new(AtomicBool::new(false));
        let (kafka, metrics, flag) = (kafka.to_string(), metrics.to_string(), stop.clone());
        let thread = std::thread::spawn(move || run_waves(&kafka, &metrics, &flag));
        Waves { stop, thread }
    }

    /// Starts no more waves: how many ran, and the clients of the last, still open (the broker
    /// closes them after [`WRITE_TIMEOUT`]).
    pub fn stop(self) -> (usize, Vec<TcpStream>) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .join()
            .expect("the waves' thread")
            .unwrap_or_else(|e| panic!("non-reader waves: {e}"))
    }
}

fn connections(metrics: &str) -> f64 {
    super::metric(&super::scrape(metrics), "nvmq_connections")
}

fn run_waves(
    kafka: &str,
    metrics: &str,
    stop: &AtomicBool,
) -> Result<(usize, Vec<TcpStream>), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut filler = rt.block_on(kafka::connect(kafka, "filler"));
    rt.block_on(kafka::auto_create(&mut filler, TOPIC));
    let base = connections(metrics);
    let mut waves = 0;
    let mut wave = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let first = rt.block_on(fill(&mut filler))?;
        wave = non_readers(kafka, first);
        waves += 1;
        // Seen open (the broker may accept them a moment after the connects return), then
        // closed, or told to stop.
        let wanted = base + NON_READERS as f64;
        let until = Instant::now() + Duration::from_secs(10);
        while connections(metrics) < wanted {
            if Instant::now() > until {
                return Err(format!("the broker never had {wanted} connections open"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        while !stop.load(Ordering::SeqCst) && connections(metrics) > base {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok((waves, wave))
}

/// Writes a fill to [`TOPIC`]; the offset of its first record.
async fn fill(c: &mut Client) -> Result<i64, String> {
    let value = vec![0x5a; FILL_RECORD];
    let mut first = None;
    for _ in 0..FILL_RECORDS {
        let (base, errors) = kafka::produce(c, TOPIC, 1, &value).await?;
        if !errors.is_empty() {
            return Err(format!("fill of {TOPIC}: errors {errors:?}"));
        }
        first.get_or_insert(base);
    }
    first.ok_or_else(|| "an empty fill".into())
}

/// [`NON_READERS`] clients, each with [`PIPELINED`] Fetches of [`TOPIC`] from `from` sent.
fn non_readers(addr: &str, from: i64) -> Vec<TcpStream> {
    let mut p = FetchPartition::default();
    p.fetch_offset = from;
    p.partition_max_bytes = 50 << 20;
    let mut ft = FetchTopic::default();
    ft.topic = kafka::tname(TOPIC);
    ft.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.replica_id = kafka_protocol::messages::BrokerId(-1);
    r.min_bytes = 1;
    r.max_bytes = 50 << 20;
    r.topics = vec![ft];
    let mut frame = request_frame(11, &r, 0, "non-reader").expect("frame");
    assert!(frame.len() <= FETCH_FRAME, "{} B Fetch frame", frame.len());
    let mut all = Vec::new();
    for id in 0..PIPELINED {
        set_correlation_id(&mut frame, id);
        all.extend_from_slice(&frame);
    }
    (0..NON_READERS)
        .map(|_| {
            let mut s = TcpStream::connect(addr).expect("non-reader connection");
            s.write_all(&all).expect("pipelined fetches");
            s
        })
        .collect()
}
