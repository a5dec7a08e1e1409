//! The load generator: `--client-threads` threads, each a tokio current-thread runtime with one
//! task per connection. A producer re-sends one frame encoded at the start, patching only the
//! correlation id; it reads with one buffered read per wake and parses only the answer's error
//! code and base offset. Nothing is allocated per request once a connection runs.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::dial::{Dial, Stream};
use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::e2e::E2e;
use super::wire::{self, set_correlation_id};

/// Largest Produce answer read (they are tens of bytes).
const MAX_PRODUCE_ANSWER: usize = 1 << 20;

pub fn new_histogram() -> Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).context("creating a latency histogram")
}

/// The measured window: answers received in `warm..=until` count; nothing is sent after `until`.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub warm: Instant,
    pub until: Instant,
}

impl Timing {
    fn counts(&self, at: Instant) -> bool {
        at >= self.warm && at <= self.until
    }
}

pub enum Window {
    /// A warm-up, then the measured run.
    Timed { warmup: Duration, run: Duration },
    /// Everything counts; the tasks end by themselves (a budget, a target offset).
    Unbounded,
}

/// One producer connection.
pub struct ProduceTask {
    pub frame: Arc<Vec<u8>>,
    /// Requests in flight.
    pub window: usize,
    /// Records per request.
    pub records: u64,
    /// The end-to-end table to note acks in (by base offset).
    pub e2e: Option<Arc<Mutex<E2e>>>,
    /// Records left to send, shared by the connections of a fill.
    pub budget: Option<Arc<AtomicI64>>,
}

/// One consumer connection.
pub struct FetchTask {
    pub frame: Vec<u8>,
    /// Where the frame holds its fetch offset.
    pub offset_at: usize,
    pub from: i64,
    /// Stop once everything below this offset is read; None: at the end of the window.
    pub to: Option<i64>,
    pub max_answer: usize,
    pub e2e: Option<Arc<Mutex<E2e>>>,
}

pub enum Task {
    Produce(ProduceTask),
    Fetch(FetchTask),
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    pub requests: u64,
    pub records: u64,
    pub bytes: u64,
    /// First request sent and last answer received (in the window or not).
    pub first: Option<Instant>,
    pub last: Option<Instant>,
}

impl Counts {
    fn merge(&mut self, o: &Counts) {
        self.requests += o.requests;
        self.records += o.records;
        self.bytes += o.bytes;
        self.first = match (self.first, o.first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last = self.last.max(o.last);
    }

    fn saw(&mut self, sent: Instant, answered: Instant) {
        if self.first.is_none() {
            self.first = Some(sent);
        }
        self.last = Some(answered);
    }

    /// From the first request to the last answer.
    pub fn span(&self) -> Duration {
        match (self.first, self.last) {
            (Some(a), Some(b)) => b.saturating_duration_since(a),
            _ => Duration::ZERO,
        }
    }
}

/// What one thread's (or all threads') tasks saw; latencies in ns.
#[derive(Clone)]
pub struct Totals {
    pub produce: Counts,
    pub produce_hist: Histogram<u64>,
    pub fetch: Counts,
    pub fetch_hist: Histogram<u64>,
}

impl Totals {
    fn new() -> Result<Totals> {
        Ok(Totals {
            produce: Counts::default(),
            produce_hist: new_histogram()?,
            fetch: Counts::default(),
            fetch_hist: new_histogram()?,
        })
    }

    fn merge(&mut self, o: &Totals) -> Result<()> {
        self.produce.merge(&o.produce);
        self.fetch.merge(&o.fetch);
        self.produce_hist.add(&o.produce_hist)?;
        self.fetch_hist.add(&o.fetch_hist)?;
        Ok(())
    }
}

/// Keeps the connections of a finished run open until dropped (so the broker's memory can be
/// read with them open).
pub struct Held {
    _release: Vec<Sender<()>>,
}

enum Up {
    Connected(Result<()>),
    Done(Result<Box<Totals>>),
}

/// Runs `tasks` against the broker `dial` reaches on `threads` client threads (tasks dealt round-robin, the first
/// task on the first thread). `on_start` sees the timing once every connection is open, before
/// any request is sent.
pub fn run(
    dial: &Dial,
    tasks: Vec<Task>,
    threads: usize,
    window: Window,
    on_start: impl FnOnce(&Timing),
) -> Result<(Totals, Held)> {
    let threads = threads.clamp(1, tasks.len().max(1));
    let mut shares: Vec<Vec<Task>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, t) in tasks.into_iter().enumerate() {
        shares[i % threads].push(t);
    }
    let abort = Arc::new(AtomicBool::new(false));
    let (up_tx, up_rx) = mpsc::channel::<Up>();
    let mut starts = Vec::new();
    let mut releases = Vec::new();
    for (i, share) in shares.into_iter().enumerate() {
        let (start_tx, start_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel();
        let (dial, up, abort) = (dial.clone(), up_tx.clone(), abort.clone());
        std::thread::Builder::new()
            .name(format!("kafka-bench-{i}"))
            .spawn(move || client_thread(dial, share, up, start_rx, release_rx, abort))
            .context("starting a client thread")?;
        starts.push(start_tx);
        releases.push(release_tx);
    }
    drop(up_tx);
    let wait = |deadline: Instant| -> Result<Up> {
        match up_rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(u) => Ok(u),
            Err(RecvTimeoutError::Timeout) => {
                abort.store(true, Ordering::Relaxed);
                bail!(
                    "the client threads did not finish in time: has the broker stopped answering?"
                )
            }
            Err(RecvTimeoutError::Disconnected) => bail!("a client thread ended without a word"),
        }
    };
    let connect_by = Instant::now() + Duration::from_secs(120);
    for _ in 0..threads {
        match wait(connect_by)? {
            Up::Connected(Ok(())) => {}
            Up::Connected(Err(e)) => return Err(e), // the other threads see their start dropped
            Up::Done(_) => bail!("a client thread finished before it started"),
        }
    }
    let start = Instant::now();
    let (timing, finish_by) = match window {
        Window::Timed { warmup, run } => {
            let t = Timing {
                warm: start + warmup,
                until: start + warmup + run,
            };
            (t, t.until + Duration::from_secs(60))
        }
        Window::Unbounded => {
            let t = Timing {
                warm: start,
                until: start + Duration::from_secs(10 * 365 * 86_400),
            };
            (t, start + Duration::from_secs(1800))
        }
    };
    on_start(&timing);
    for s in &starts {
        let _ = s.send(Some(timing));
    }
    let mut totals = Totals::new()?;
    let mut failed = None;
    for _ in 0..threads {
        match wait(finish_by)? {
            Up::Done(Ok(t)) => totals.merge(&t)?,
            Up::Done(Err(e)) => {
                failed.get_or_insert(e);
            }
            Up::Connected(_) => bail!("a client thread connected twice"),
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    Ok((totals, Held { _release: releases }))
}

fn client_thread(
    dial: Dial,
    share: Vec<Task>,
    up: Sender<Up>,
    start: Receiver<Option<Timing>>,
    release: Receiver<()>,
    abort: Arc<AtomicBool>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = up.send(Up::Connected(Err(anyhow!(
                "starting a client runtime: {e}"
            ))));
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let stats = match Totals::new() {
            Ok(t) => Rc::new(RefCell::new(t)),
            Err(e) => {
                let _ = up.send(Up::Connected(Err(e)));
                return;
            }
        };
        let mut conns = Vec::with_capacity(share.len());
        for t in share {
            match dial.connect().await {
                Ok(s) => conns.push((s, t)),
                Err(e) => {
                    let _ = up.send(Up::Connected(Err(e)));
                    return;
                }
            }
        }
        let _ = up.send(Up::Connected(Ok(())));
        // Nothing runs on this thread yet: blocking here holds up nobody.
        let Ok(Some(timing)) = start.recv() else {
            return;
        };
        let handles: Vec<_> = conns
            .into_iter()
            .map(|(s, t)| {
                let (stats, abort) = (stats.clone(), abort.clone());
                tokio::task::spawn_local(async move {
                    let r = match t {
                        Task::Produce(p) => produce(s, p, timing, &stats, &abort).await,
                        Task::Fetch(f) => fetch(s, f, timing, &stats, &abort).await,
                    };
                    if r.is_err() {
                        abort.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        let mut open = Vec::with_capacity(handles.len());
        let mut failed = None;
        for h in handles {
            match h.await {
                Ok(Ok(s)) => open.push(s),
                Ok(Err(e)) => {
                    failed.get_or_insert(e);
                }
                Err(e) => {
                    failed.get_or_insert(anyhow!("a client task failed: {e}"));
                }
            }
        }
        let out = match failed {
            Some(e) => Err(e),
            None => Ok(Box::new(stats.borrow().clone())),
        };
        let _ = up.send(Up::Done(out));
        // The connections stay open until the caller has looked (e.g. at the broker's memory).
        let _ = release.recv();
        drop(open);
    });
}

/// A read buffer: one read per wake, whole frames taken from it in place.
struct InBuf {
    b: Vec<u8>,
    lo: usize,
    hi: usize,
    max: usize,
}

impl InBuf {
    fn new(capacity: usize, max: usize) -> InBuf {
        InBuf {
            b: vec![0; capacity.max(64)],
            lo: 0,
            hi: 0,
            max,
        }
    }

    /// The body (without the length) of the next whole frame, as a range of `self.b`, valid
    /// until the next read.
    fn next(&mut self) -> Result<Option<(usize, usize)>> {
        match wire::frame_len(&self.b[self.lo..self.hi], self.max)? {
            Some(len) if self.hi - self.lo >= 4 + len => {
                let r = (self.lo + 4, self.lo + 4 + len);
                self.lo += 4 + len;
                if self.lo == self.hi {
                    self.lo = 0;
                    self.hi = 0;
                }
                Ok(Some(r))
            }
            _ => Ok(None),
        }
    }

    /// One read; 0 when the broker closed the connection.
    async fn read(&mut self, s: &mut Stream) -> Result<usize> {
        let need = match wire::frame_len(&self.b[self.lo..self.hi], self.max)? {
            Some(len) => 4 + len,
            None => 4,
        };
        if self.lo + need > self.b.len() || self.hi == self.b.len() {
            self.b.copy_within(self.lo..self.hi, 0);
            self.hi -= self.lo;
            self.lo = 0;
        }
        if need > self.b.len() {
            self.b.resize(need, 0);
        }
        let n = s
            .read(&mut self.b[self.hi..])
            .await
            .context("reading from the broker")?;
        self.hi += n;
        Ok(n)
    }
}

/// Writes `b` and flushes it: a TLS stream holds what it is given until flushed (on TCP the
/// flush does nothing).
async fn send_all(s: &mut Stream, b: &[u8]) -> Result<()> {
    s.write_all(b).await.context("sending to the broker")?;
    s.flush().await.context("sending to the broker")
}

/// Takes `n` records from a fill's budget; false once it is spent.
fn take_budget(budget: &Option<Arc<AtomicI64>>, n: u64) -> bool {
    match budget {
        None => true,
        Some(b) => b.fetch_sub(n as i64, Ordering::Relaxed) > 0,
    }
}

/// A producer connection: `window` requests in flight until the window ends (or the budget is
/// spent), then the ones in flight are drained.
async fn produce(
    mut s: Stream,
    t: ProduceTask,
    timing: Timing,
    stats: &RefCell<Totals>,
    abort: &AtomicBool,
) -> Result<Stream> {
    let frame: &[u8] = &t.frame;
    let mut out: Vec<u8> = Vec::with_capacity(frame.len() * t.window);
    let mut inflight: VecDeque<(i32, Instant)> = VecDeque::with_capacity(t.window);
    let mut inb = InBuf::new((t.window * 128).clamp(4 << 10, 1 << 20), MAX_PRODUCE_ANSWER);
    let mut next_id = 1i32;
    let mut send = |n: usize, inflight: &mut VecDeque<(i32, Instant)>, out: &mut Vec<u8>| {
        out.clear();
        let now = Instant::now();
        for _ in 0..n {
            let at = out.len();
            out.extend_from_slice(frame);
            set_correlation_id(&mut out[at..], next_id);
            inflight.push_back((next_id, now));
            next_id = next_id.wrapping_add(1);
        }
    };
    let may_send = |now: Instant| now < timing.until && !abort.load(Ordering::Relaxed);
    let mut first = 0;
    while first < t.window && take_budget(&t.budget, t.records) {
        first += 1;
    }
    send(first, &mut inflight, &mut out);
    send_all(&mut s, &out).await?;
    while !inflight.is_empty() {
        if inb.read(&mut s).await? == 0 {
            bail!(
                "the broker closed the connection with {} Produce requests unanswered",
                inflight.len()
            );
        }
        let now = Instant::now();
        let mut again = 0;
        {
            let mut st = stats.borrow_mut();
            while let Some((lo, hi)) = inb.next()? {
                let a = wire::produce_answer(&inb.b[lo..hi])?;
                let Some((id, sent)) = inflight.pop_front() else {
                    bail!(
                        "an answer (correlation id {}) to no request",
                        a.correlation_id
                    );
                };
                if a.correlation_id != id {
                    bail!(
                        "answer to request {} while waiting for {id}",
                        a.correlation_id
                    );
                }
                if a.error_code != 0 {
                    bail!("Produce answered with {}", wire::error_name(a.error_code));
                }
                st.produce.saw(sent, now);
                if timing.counts(now) {
                    st.produce.requests += 1;
                    st.produce.records += t.records;
                    st.produce_hist
                        .saturating_record(now.duration_since(sent).as_nanos() as u64);
                }
                if let Some(e) = &t.e2e {
                    e.lock()
                        .map_err(|_| anyhow!("the end-to-end table was poisoned"))?
                        .acked(a.base_offset, sent, now);
                }
                if may_send(now) && take_budget(&t.budget, t.records) {
                    again += 1;
                }
            }
        }
        if again > 0 {
            send(again, &mut inflight, &mut out);
            send_all(&mut s, &out).await?;
        }
    }
    Ok(s)
}

/// A consumer connection: one Fetch at a time from `from`, until `to` or the window's end.
async fn fetch(
    mut s: Stream,
    mut t: FetchTask,
    timing: Timing,
    stats: &RefCell<Totals>,
    abort: &AtomicBool,
) -> Result<Stream> {
    let mut inb = InBuf::new(64 << 10, t.max_answer);
    let mut next = t.from;
    let mut id = 1i32;
    loop {
        if abort.load(Ordering::Relaxed) || t.to.is_some_and(|to| next >= to) {
            break;
        }
        set_correlation_id(&mut t.frame, id);
        wire::set_fetch_offset(&mut t.frame, t.offset_at, next);
        let sent = Instant::now();
        send_all(&mut s, &t.frame).await?;
        let (lo, hi) = loop {
            if let Some(r) = inb.next()? {
                break r;
            }
            if inb.read(&mut s).await? == 0 {
                bail!("the broker closed the connection with a Fetch unanswered");
            }
        };
        let now = Instant::now();
        let a = wire::fetch_answer(&inb.b[lo..hi])?;
        if a.correlation_id != id {
            bail!(
                "answer to request {} while waiting for {id}",
                a.correlation_id
            );
        }
        if a.error_code != 0 {
            bail!(
                "Fetch at offset {next} answered with {}",
                wire::error_name(a.error_code)
            );
        }
        let (mut records, mut bytes) = (0u64, 0u64);
        let mut table = match &t.e2e {
            Some(e) => Some(
                e.lock()
                    .map_err(|_| anyhow!("the end-to-end table was poisoned"))?,
            ),
            None => None,
        };
        for b in wire::batches(a.records) {
            if b.last_offset < next {
                continue;
            }
            let from = b.base_offset.max(next);
            records += (b.last_offset - from + 1) as u64;
            bytes += b.bytes as u64;
            if let Some(e) = table.as_mut() {
                e.received(from, b.last_offset, now);
            }
            next = b.last_offset + 1;
        }
        drop(table);
        if records == 0 && !a.records.is_empty() && next < a.high_watermark {
            bail!(
                "Fetch at offset {next} returned {} bytes holding no whole batch past it",
                a.records.len()
            );
        }
        {
            let mut st = stats.borrow_mut();
            st.fetch.saw(sent, now);
            if timing.counts(now) {
                st.fetch.requests += 1;
                st.fetch.records += records;
                st.fetch.bytes += bytes;
                st.fetch_hist
                    .saturating_record(now.duration_since(sent).as_nanos() as u64);
            }
        }
        id = id.wrapping_add(1);
        if t.to.is_none() && now >= timing.until {
            break;
        }
    }
    Ok(s)
}
