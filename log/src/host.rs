//! Running a writer: either on a thread of its own ([`crate::Log::start`]) or hosted by an event
//! loop that steps it between its other work ([`crate::Log::hosted`]), so that a request that
//! arrives, joins a batch, is flushed and is answered crosses no thread.
//!
//! Either way, requests from other threads (partition creation, reads for readers, the index
//! rebuild and the scrub) come over the log's bounded queue; a hosted writer's owner is woken for
//! them by its [`Doorbell`].

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockdev::BlockDevice;
use crossbeam::channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use crate::shared::Shared;
use crate::writer::{Now, Request, Writer};
use crate::{mkfs, LogError};

/// Wakes the owner of a hosted writer: called after a request was queued for it from another
/// thread. It should cost nothing when the owner is awake (the owner drains the queue on its
/// next turn anyway).
pub trait Doorbell: Send + Sync {
    fn ring(&self);
}

/// The sending side of a log's request queue: every send rings the owner's doorbell.
#[derive(Clone)]
pub(crate) struct Queue {
    pub tx: Sender<Request>,
    pub bell: Option<Arc<dyn Doorbell>>,
    /// The queue's other end, to answer what a request sent after the writer's last look at
    /// the queue would otherwise wait for for ever (a channel keeps messages while it has a
    /// sender, even with no receiver left).
    pub rx: Receiver<Request>,
    pub shared: Arc<Shared>,
}

impl Queue {
    pub fn send(&self, req: Request) -> Result<(), LogError> {
        self.tx.send(req).map_err(|_| LogError::Shutdown)?;
        if let Some(b) = &self.bell {
            b.ring();
        }
        // The writer marks itself gone before its last look at the queue: if it is gone now, this
        // request may have come after that look, and nobody else will answer it.
        if self.shared.writer_gone() {
            while let Ok(r) = self.rx.try_recv() {
                refuse(r, gone(&self.shared));
            }
        }
        Ok(())
    }
}

/// What a turn of the writer left to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Something moved: turn again soon (after the owner's other work).
    Moved,
    /// Nothing to do until a request arrives, a device completion is ready, or `after` passes.
    Idle {
        /// I/O is in flight: a device completion will come.
        io_in_flight: bool,
        /// When the writer wants another turn even if nothing arrives (an idle superblock
        /// update, appends waiting for space, a relaxed mode's flush falling due).
        after: Duration,
    },
    /// The writer has stopped (closed and idle, or failed): it takes no more turns.
    Stopped,
}

/// A writer with its request queue, stepped by its owner.
pub struct Hosted<D: BlockDevice> {
    writer: Writer<D>,
    rx: Receiver<Request>,
    queue_capacity: usize,
    closing: bool,
    stopped: bool,
    start: Instant,
    /// The wall clock as last read, and when: a turn reuses it for up to a millisecond (its
    /// resolution) instead of reading it again, as turns come millions of times a second.
    wall: Cell<(Instant, u64)>,
    /// The instant the last turn read its clocks at: the spin of `run_thread` measures with it
    /// instead of reading the clock again.
    turned_at: Instant,
}

impl<D: BlockDevice> Hosted<D> {
    pub(crate) fn new(writer: Writer<D>, rx: Receiver<Request>, queue_capacity: usize) -> Self {
        let start = Instant::now();
        Hosted {
            writer,
            rx,
            queue_capacity,
            closing: false,
            stopped: false,
            start,
            wall: Cell::new((start, mkfs::now_ms())),
            turned_at: start,
        }
    }

    /// The writer, for appends straight from the owner's thread (`Writer::append` with token
    /// acks) and for collecting those acks (`Writer::drain_acks`).
    pub fn writer(&mut self) -> &mut Writer<D> {
        &mut self.writer
    }

    /// Another receiving end of the request queue, so that the owner can see requests waiting
    /// (before it sleeps) without taking them.
    pub fn queue(&self) -> Receiver<Request> {
        self.rx.clone()
    }

    /// Nothing is on the device and nothing waits but what was just appended: a turn now sends
    /// it at once (the owner need not wait for its next pass).
    pub fn quiet(&self) -> bool {
        !self.writer.has_io_in_flight() && !self.writer.has_completions()
    }

    /// D as the writer sees it.
    pub fn durable(&self) -> u64 {
        self.writer.durable()
    }

    /// The clocks for a step.
    pub fn now(&self) -> Now {
        self.clocks().0
    }

    /// The clocks for a step, and the instant they were read at.
    fn clocks(&self) -> (Now, Instant) {
        let at = Instant::now();
        let (read_at, mut wall_ms) = self.wall.get();
        if at.saturating_duration_since(read_at) >= Duration::from_millis(1) {
            wall_ms = mkfs::now_ms();
            self.wall.set((at, wall_ms));
        }
        let now = Now {
            mono_ns: at.saturating_duration_since(self.start).as_nanos() as u64,
            wall_ms,
        };
        (now, at)
    }

    /// Takes the requests queued from other threads, and steps the writer once.
    pub fn turn(&mut self) -> Turn {
        if self.stopped {
            return Turn::Stopped;
        }
        if !self.closing && self.writer.shared().close_requested() {
            self.close();
        }
        // One clock read for the turn: the step, the appends taken in it, and the wake-up.
        let (now, at) = self.clocks();
        self.turned_at = at;
        self.writer.set_clock(at);
        let mut got = false;
        while !self.closing && self.writer.pending_len() < self.queue_capacity {
            match self.rx.try_recv() {
                Ok(r) => {
                    self.writer.submit(r);
                    got = true;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => self.close(),
            }
        }
        let moved = self.writer.step(now);
        if self.writer.fatal().is_some() {
            // Everything still queued gets the error too; then the writer is gone.
            while let Ok(r) = self.rx.try_recv() {
                self.writer.submit(r);
            }
            return self.stop();
        }
        if self.closing && self.writer.is_idle() {
            return self.stop();
        }
        if moved || got || self.writer.has_completions() {
            return Turn::Moved;
        }
        // Appends still waiting (for space or the window) want the writer back soon; an idle
        // writer only needs to wake for its idle superblock update.
        // A relaxed flush mode's flush falls due on a clock: be back by then (the floor keeps a
        // flush that is due but cannot start yet from spinning the owner).
        let after = if self.writer.pending_len() > 0 || self.closing {
            Duration::from_millis(1)
        } else {
            Duration::from_millis(100)
        };
        let after = match self.writer.flush_due_in(now) {
            Some(due) => after.min(due.max(DEVICE_WAIT_SLICE)),
            None => after,
        };
        Turn::Idle {
            io_in_flight: self.writer.has_io_in_flight(),
            after,
        }
    }

    /// The log handle is gone: finish what is held, then stop.
    fn close(&mut self) {
        if !self.closing {
            self.closing = true;
            self.writer.close();
        }
    }

    fn stop(&mut self) -> Turn {
        // Gone first, then a last look: a request sent after that look finds the mark and is
        // answered by its sender (`Queue::send`).
        self.writer.shared().mark_writer_gone();
        // Whoever still waits in the queue hears that the log is gone.
        let shared = self.writer.shared();
        while let Ok(r) = self.rx.try_recv() {
            refuse(r, gone(&shared));
        }
        self.stopped = true;
        self.writer.shared().lock().stopped = true;
        self.writer.shared().notify();
        Turn::Stopped
    }

    /// Sleeps on the doorbell and the device's completion fd until a request, a completion or
    /// `after`.
    #[cfg(unix)]
    fn sleep_on(&mut self, bell: &WakeBell, after: Duration) {
        bell.arm();
        // A request queued before the bell was armed rang nobody: look once more.
        if !self.rx.is_empty() {
            bell.disarm();
            return;
        }
        self.writer.arm_completion_fd();
        bell.sleep(self.writer.device().completion_fd(), after);
        bell.disarm();
    }

    /// Blocks the calling thread until a request arrives, a completion is ready or `after`
    /// passes (the thread runner's wait).
    fn wait_on_thread(&mut self, io_in_flight: bool, after: Duration) {
        if io_in_flight {
            self.writer.wait_device(DEVICE_WAIT_SLICE.min(after));
            return;
        }
        if self.closing {
            // The queue is gone; appends still waiting for space fail after full_wait.
            std::thread::sleep(after);
            return;
        }
        match self.rx.recv_timeout(after) {
            Ok(r) => self.writer.submit(r),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => self.close(),
        }
    }
}

impl<D: BlockDevice> Drop for Hosted<D> {
    /// An owner that goes away without turning the writer to its end (a killed event loop):
    /// whoever waits for the log to stop, or in its queue, hears that it is gone.
    fn drop(&mut self) {
        if !self.stopped {
            self.stop();
        }
    }
}

/// Why a request the writer will never take is refused: its fatal error, or a shutdown.
fn gone(shared: &Shared) -> LogError {
    match &shared.lock().fatal {
        Some(f) => LogError::WriterStopped(f.clone()),
        None => LogError::Shutdown,
    }
}

/// Answers a request the writer will never take.
fn refuse(req: Request, err: LogError) {
    match req {
        Request::Append { ack, .. }
        | Request::CreatePartition { ack, .. }
        | Request::DeletePartition { ack, .. } => ack(Err(err)),
        Request::Read { reply, .. } => reply(Err(err)),
        Request::Backfilled(_) => {}
    }
}

/// How long the writer thread waits on the device before looking at the request queue again,
/// on a device without a completion fd (or without a doorbell): appends that arrive while a
/// flush runs are picked up within this slice.
const DEVICE_WAIT_SLICE: Duration = Duration::from_micros(100);

/// The writer thread's doorbell (see `bell`).
#[cfg(unix)]
pub(crate) type WakeBell = crate::bell::ThreadBell;
/// No doorbell off unix: the thread waits in slices.
#[cfg(not(unix))]
pub(crate) enum WakeBell {}

/// The writer thread: turn, and wait between turns. With a doorbell and a device that has a
/// completion fd it sleeps on both at once, so a request or a completion wakes it at once;
/// otherwise it waits on the device in slices and on the queue in turn.
pub(crate) fn run_thread<D: BlockDevice>(mut h: Hosted<D>, bell: Option<Arc<WakeBell>>) {
    let spin = h.writer.config().spin;
    // Since when the writer has turned without progress (None: it just moved or slept), by the
    // turns' own clock readings: an idle spin reads the clock once per turn, in the turn.
    let mut idle_since: Option<Instant> = None;
    loop {
        let turn = h.turn();
        let at = h.turned_at;
        match turn {
            Turn::Moved => idle_since = None,
            Turn::Idle { .. }
                if !spin.is_zero()
                    && !h.closing
                    && at.saturating_duration_since(*idle_since.get_or_insert(at)) < spin =>
            {
                // Yield, not a busy hint: a producer sharing this core (a loaded machine) then
                // runs at once instead of after the whole spin.
                std::thread::yield_now();
            }
            Turn::Idle {
                io_in_flight,
                after,
            } => match &bell {
                #[cfg(unix)]
                Some(b) if !h.closing && h.writer.device().completion_fd().is_some() => {
                    h.sleep_on(b, after);
                    idle_since = None;
                }
                _ => {
                    h.wait_on_thread(io_in_flight, after);
                    idle_since = None;
                }
            },
            Turn::Stopped => return,
        }
    }
}
