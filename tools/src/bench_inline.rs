//! `nvmq bench --inline`: the producers driven on the writer's own thread, as `nvmq serve`'s
//! event loops drive the writer they host. An ack is collected by the thread that stepped the
//! writer and the producer's next record is appended at once: no channel, no callback, no
//! wake-up of another thread. What is left per ack is the log's own work and the device's, which
//! is what a host with power-loss-protected drives pays (the threaded scenarios add a hand-off
//! per ack that costs more than a 10 us write on a virtual machine).
//!
//! The thread never sleeps while records are in flight: it turns the writer and polls the
//! device, as SPDK's reactors poll, so the figure is for a core given to the writer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use blockdev::BlockDevice;
use bytes::Bytes;
use hdrhistogram::Histogram;
use nvmq_log::{Ack, Doorbell, Hosted, Log, TokenAck, Turn, Writer, WriterStats};

/// The bench's own thread turns the writer without ever sleeping on a doorbell.
struct NoBell;

impl Doorbell for NoBell {
    fn ring(&self) {}
}

/// A log whose writer the bench steps on its own thread.
pub(crate) struct InlineLog {
    pub log: Log,
    hosted: Hosted<Box<dyn BlockDevice>>,
}

/// What one inline scenario measured, for `bench::summarize`.
pub(crate) struct Measured {
    pub hist: Histogram<u64>,
    pub mid: WriterStats,
    pub end: WriterStats,
}

impl InlineLog {
    /// Hosts `writer` and creates the bench's `count` partitions of topic `bench`. The creates
    /// are requests through the log's queue, so a helper thread turns the writer meanwhile.
    pub fn start(
        writer: Writer<Box<dyn BlockDevice>>,
        queue: usize,
        count: u32,
    ) -> Result<(InlineLog, Vec<u32>)> {
        let (log, hosted) = Log::hosted(writer, queue, Arc::new(NoBell));
        let done = AtomicBool::new(false);
        let (hosted, created) = std::thread::scope(|s| {
            let done = &done;
            let turner = s.spawn(move || {
                let mut hosted = hosted;
                while !done.load(Ordering::Relaxed) {
                    if let Turn::Stopped = hosted.turn() {
                        break;
                    }
                    std::thread::yield_now();
                }
                hosted
            });
            let indexes: Vec<u32> = (0..count).collect();
            let created = log.create_partitions("bench", &indexes);
            done.store(true, Ordering::Relaxed);
            (turner.join(), created)
        });
        let Ok(hosted) = hosted else {
            bail!("the thread turning the writer while partitions were created panicked");
        };
        let mut partitions = Vec::new();
        for r in created.context("creating the bench partitions")? {
            partitions.push(r.context("creating a bench partition")?);
        }
        Ok((InlineLog { log, hosted }, partitions))
    }

    /// `producers` closed-loop producers of `size`-byte records, spread over `partitions`, for
    /// a warm-up of a fifth of `duration` and then `duration`.
    pub fn scenario(
        &mut self,
        partitions: &[u32],
        producers: usize,
        size: usize,
        duration: Duration,
    ) -> Result<Measured> {
        let payload = Bytes::from(vec![0x5au8; size]);
        let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
        let started = Instant::now();
        let warmup = duration / 5;
        let mut sent = vec![started; producers];
        for (p, at) in sent.iter_mut().enumerate() {
            *at = Instant::now();
            self.append(partitions, p, &payload);
        }
        let mut acks: Vec<TokenAck> = Vec::with_capacity(producers);
        let mut mid = None;
        let mut outstanding = producers;
        let mut stopping = false;
        let mut end = None;
        let mut last_ack = Instant::now();
        while outstanding > 0 {
            if let Turn::Stopped = self.hosted.turn() {
                bail!(
                    "the writer stopped: {}",
                    self.log.fatal().unwrap_or_default()
                );
            }
            self.hosted.writer().drain_acks(&mut acks);
            // One clock read per turn: it ends every ack collected in it and starts every
            // record sent after them.
            let now = Instant::now();
            if acks.is_empty() {
                if now.duration_since(last_ack) > Duration::from_secs(5) {
                    bail!("no ack for 5 s with {outstanding} records in flight");
                }
            } else {
                last_ack = now;
            }
            let elapsed = now.duration_since(started);
            if mid.is_none() && elapsed > warmup {
                mid = Some(self.log.stats());
            }
            if !stopping && elapsed > warmup + duration {
                stopping = true;
                end = Some(self.log.stats());
            }
            for (token, result) in acks.drain(..) {
                result.context("an append failed")?;
                let p = token as usize;
                if mid.is_some() && !stopping {
                    hist.record(now.duration_since(sent[p]).as_nanos() as u64)?;
                }
                if stopping {
                    outstanding -= 1;
                } else {
                    sent[p] = now;
                    self.append(partitions, p, &payload);
                }
            }
        }
        let (Some(mid), Some(end)) = (mid, end) else {
            bail!("the scenario ended before its measured window");
        };
        Ok(Measured { hist, mid, end })
    }

    fn append(&mut self, partitions: &[u32], p: usize, payload: &Bytes) {
        let partition = partitions[p % partitions.len()];
        self.hosted
            .writer()
            .append(partition, payload.clone(), 1, Ack::Token(p as u64));
    }

    /// Closes the log and turns the writer until it has written what it holds and stopped.
    /// Dropping the handle waits for the writer to stop, so it is dropped on another thread.
    pub fn shutdown(self) -> Result<()> {
        let InlineLog { log, mut hosted } = self;
        let fatal = log.fatal();
        let since = Instant::now();
        let stopped = std::thread::scope(|s| {
            s.spawn(move || drop(log));
            while !matches!(hosted.turn(), Turn::Stopped) {
                if since.elapsed() > Duration::from_secs(30) {
                    return false;
                }
                std::thread::yield_now();
            }
            true
        });
        if let Some(f) = fatal {
            bail!("the writer stopped: {f}");
        }
        if !stopped {
            bail!("the writer did not stop within 30 s of the log closing");
        }
        Ok(())
    }
}
