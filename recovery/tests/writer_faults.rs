//! The stepped writer when one poll brings both good and bad news: what a successful flush made
//! durable is acknowledged before the writer stops for a failure in the same poll (an error for a
//! durable record makes its producer retry it into a duplicate).
//!
//! Deterministic: the sim runs on a virtual clock, and a gate in front of it holds completions back
//! so that the writer sees a chosen set of them in one poll.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use blockdev::sim::{Latency, SimClock, SimConfig, SimDevice, SimHandle};
use blockdev::{BlockDevice, Completion, DeviceError, DeviceInfo, IoBuffer, Tag};
use nvmq_log::mkfs::format;
use nvmq_log::{
    Ack, Appended, FlushMode, FormatOptions, LogConfig, LogError, Now, Request, Writer,
};

/// What the gate holds back.
#[derive(Clone, Copy, PartialEq)]
enum Hold {
    Nothing,
    Everything,
    /// Flush completions (those without a buffer); writes pass.
    Flushes,
    /// Nothing: a wait hands everything over, then reports that it failed.
    FailingWait,
}

/// Holds completions back as `held` says, then hands them all over in one poll.
struct Gate {
    inner: SimDevice,
    held: Arc<Mutex<Hold>>,
    kept: Vec<Completion>,
}

impl Gate {
    fn pass_on(&mut self, out: &mut Vec<Completion>) -> usize {
        let before = out.len();
        match *self.held.lock().unwrap() {
            Hold::Everything => {}
            Hold::Nothing | Hold::FailingWait => out.append(&mut self.kept),
            Hold::Flushes => {
                let (flushes, others) = std::mem::take(&mut self.kept)
                    .into_iter()
                    .partition(|c| c.buffer.is_none());
                self.kept = flushes;
                out.extend(others);
            }
        }
        out.len() - before
    }
}

impl BlockDevice for Gate {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }
    fn alloc_buffer(&mut self, len: usize) -> Result<IoBuffer, DeviceError> {
        self.inner.alloc_buffer(len)
    }
    fn queue_depth(&self) -> usize {
        self.inner.queue_depth()
    }
    fn submit_write(&mut self, tag: Tag, lba: u64, b: IoBuffer) -> Result<(), DeviceError> {
        self.inner.submit_write(tag, lba, b)
    }
    fn submit_read(&mut self, tag: Tag, lba: u64, b: IoBuffer) -> Result<(), DeviceError> {
        self.inner.submit_read(tag, lba, b)
    }
    fn submit_flush(&mut self, tag: Tag) -> Result<(), DeviceError> {
        self.inner.submit_flush(tag)
    }
    fn submit_write_flush(
        &mut self,
        tag: Tag,
        lba: u64,
        b: IoBuffer,
        flush: Tag,
    ) -> Result<(), DeviceError> {
        self.inner.submit_write_flush(tag, lba, b, flush)
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, DeviceError> {
        self.inner.poll(&mut self.kept)?;
        Ok(self.pass_on(out))
    }
    fn wait(&mut self, out: &mut Vec<Completion>, t: Duration) -> Result<usize, DeviceError> {
        self.inner.wait(&mut self.kept, t)?;
        let n = self.pass_on(out);
        if *self.held.lock().unwrap() == Hold::FailingWait {
            return Err(DeviceError::Timeout {
                op: blockdev::Op::Flush,
                millis: 0,
            });
        }
        Ok(n)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.kept.len()
    }
}

fn now(clock: &SimClock) -> Now {
    let ns = clock.now_nanos();
    Now {
        mono_ns: ns,
        wall_ms: 1_700_000_000_000 + ns / 1_000_000,
    }
}

/// Steps (advancing virtual time) until `done` holds or `steps` run out.
fn drive(clock: &SimClock, w: &mut Writer<Gate>, steps: usize, mut done: impl FnMut() -> bool) {
    for _ in 0..steps {
        if done() || w.fatal().is_some() {
            return;
        }
        if !w.step(now(clock)) {
            clock.advance(Duration::from_micros(100));
        }
    }
}

type Answers = Arc<Mutex<Vec<(&'static str, Result<Appended, LogError>)>>>;

fn append(w: &mut Writer<Gate>, part: u32, name: &'static str, answers: &Answers) {
    let a = answers.clone();
    let ack: Ack = Ack::Call(Box::new(move |r| a.lock().unwrap().push((name, r))));
    w.append(part, name.as_bytes().to_vec().into(), 1, ack);
}

struct Rig {
    clock: SimClock,
    handle: SimHandle,
    held: Arc<Mutex<Hold>>,
    w: Writer<Gate>,
    part: u32,
}

fn rig(linked_flush: bool) -> Rig {
    let clock = SimClock::virtual_at_zero();
    let mut sim = SimConfig::new(7, 64 << 20);
    sim.write_latency = Latency::Fixed(Duration::from_micros(50));
    sim.flush_latency = Latency::Fixed(Duration::from_micros(500));
    sim.linked_flush = linked_flush;
    sim.clock = clock.clone();
    let (mut dev, handle) = SimDevice::new(sim);
    format(&mut dev, &FormatOptions::default()).expect("format");
    let held = Arc::new(Mutex::new(Hold::Nothing));
    let gate = Gate {
        inner: dev,
        held: held.clone(),
        kept: Vec::new(),
    };
    let cfg = LogConfig {
        flush: FlushMode::Always,
        max_writes_in_flight: 4,
        max_flushes_in_flight: 4,
        idle_superblock: Duration::from_secs(3600),
        scrub_rate: 0,
        ..LogConfig::default()
    };
    let (mut w, _) = recovery::open(gate, cfg).expect("open");
    let created: Arc<Mutex<Vec<Result<Appended, LogError>>>> = Arc::default();
    let c = created.clone();
    w.submit(Request::CreatePartition {
        topic: "t".into(),
        index: 0,
        ack: Box::new(move |r| c.lock().unwrap().push(r)),
    });
    drive(&clock, &mut w, 10_000, || {
        !created.lock().unwrap().is_empty()
    });
    let part = match created.lock().unwrap().pop() {
        Some(Ok(a)) => a.partition,
        other => panic!("creating the partition: {other:?}"),
    };
    Rig {
        clock,
        handle,
        held,
        w,
        part,
    }
}

/// With A durable and B failed on the device but nothing seen yet: lets the device finish
/// everything in flight, still held, then delivers it all in one poll, and checks that A is
/// acknowledged (its flush succeeded), B gets an error and the writer has stopped.
fn release_and_check(r: &mut Rig, answers: &Answers, why_b_fails: &str) {
    assert!(
        answers.lock().unwrap().is_empty(),
        "nothing answered while held"
    );
    r.clock.advance(Duration::from_millis(10));
    *r.held.lock().unwrap() = Hold::Nothing;
    drive(&r.clock, &mut r.w, 100, || {
        answers.lock().unwrap().len() == 2
    });
    let answers = answers.lock().unwrap();
    let a = answers.iter().find(|(n, _)| *n == "A").map(|(_, r)| r);
    let b = answers.iter().find(|(n, _)| *n == "B").map(|(_, r)| r);
    assert!(
        matches!(a, Some(Ok(x)) if x.offset == 0),
        "A was made durable by a flush that succeeded; it must be acknowledged at offset 0, \
         got {a:?}"
    );
    assert!(
        matches!(b, Some(Err(LogError::WriterStopped(_)))),
        "{why_b_fails}; got {b:?}"
    );
    assert!(
        matches!(r.w.fatal(), Some(LogError::Device { .. })),
        "{why_b_fails}: the writer must stop on the device error, got {:?}",
        r.w.fatal()
    );
}

/// A's write and its flush complete and B's write fails, all seen in one poll: A is durable and
/// must be acknowledged with its offset; B gets the error, and the writer stops.
fn flush_success_and_write_failure_in_one_poll(linked_flush: bool) {
    let mut r = rig(linked_flush);
    let answers: Answers = Arc::default();
    let flushes_before = r.handle.stats().flushes;
    if linked_flush {
        // A's write goes out with its flush linked; hold everything from here on.
        *r.held.lock().unwrap() = Hold::Everything;
        append(&mut r.w, r.part, "A", &answers);
        drive(&r.clock, &mut r.w, 5, || false);
    } else {
        // A separate flush goes out once A's write is seen complete: let that through, then
        // hold everything from the moment the flush is submitted.
        append(&mut r.w, r.part, "A", &answers);
        let h = r.handle.clone();
        drive(&r.clock, &mut r.w, 1_000, || {
            h.stats().flushes > flushes_before
        });
        *r.held.lock().unwrap() = Hold::Everything;
    }
    assert_eq!(
        r.handle.stats().flushes,
        flushes_before + 1,
        "A's flush is out"
    );
    r.handle.fail_next_write();
    append(&mut r.w, r.part, "B", &answers);
    let writes = r.handle.stats().writes;
    let h = r.handle.clone();
    drive(&r.clock, &mut r.w, 1_000, || h.stats().writes > writes);
    assert_eq!(r.handle.stats().writes, writes + 1, "B's write is out");
    release_and_check(&mut r, &answers, "B's write failed");
}

#[test]
fn a_flush_that_succeeded_is_acknowledged_before_a_failed_write_stops_the_writer() {
    flush_success_and_write_failure_in_one_poll(false);
}

#[test]
fn a_linked_flush_that_succeeded_is_acknowledged_before_a_failed_write_stops_the_writer() {
    flush_success_and_write_failure_in_one_poll(true);
}

/// A's linked flush succeeds and B's fails, both seen in one poll: A is durable (its flush
/// completed without error, and every flush before it too) and must be acknowledged; B gets the
/// error, and the writer stops.
#[test]
fn a_flush_that_succeeded_is_acknowledged_before_a_later_failed_flush_stops_the_writer() {
    let mut r = rig(true);
    let answers: Answers = Arc::default();
    // A goes out as a linked write+flush; its write completes and is seen, its flush is held.
    *r.held.lock().unwrap() = Hold::Flushes;
    append(&mut r.w, r.part, "A", &answers);
    let h = r.handle.clone();
    let written = h.stats().bytes_written;
    drive(&r.clock, &mut r.w, 1_000, || {
        h.stats().bytes_written > written
    });
    // B follows A's completed write, so it is linked too; its flush fails.
    r.handle.fail_next_flush();
    let linked = h.stats().linked_flushes;
    append(&mut r.w, r.part, "B", &answers);
    drive(&r.clock, &mut r.w, 1_000, || {
        h.stats().linked_flushes > linked
    });
    assert_eq!(h.stats().linked_flushes, linked + 1, "B went out linked");
    // The sim submits a linked flush when its write completes: let B's write complete (and be
    // seen), so that both flushes are done and held.
    let written = h.stats().bytes_written;
    drive(&r.clock, &mut r.w, 1_000, || {
        h.stats().bytes_written > written
    });
    release_and_check(&mut r, &answers, "B's flush failed");
}

/// A wait that collects A's write and flush completions and then fails: A is durable and must
/// be acknowledged by the next step before the writer stops (the same rule as for a poll).
#[test]
fn what_a_failing_wait_collected_is_acknowledged_before_the_writer_stops() {
    let mut r = rig(false);
    let answers: Answers = Arc::default();
    *r.held.lock().unwrap() = Hold::Everything;
    append(&mut r.w, r.part, "A", &answers);
    // A's write goes out; let it through alone so that its flush goes out, then hold again.
    drive(&r.clock, &mut r.w, 5, || false);
    let flushes = r.handle.stats().flushes;
    r.clock.advance(Duration::from_millis(1));
    *r.held.lock().unwrap() = Hold::Nothing;
    let h = r.handle.clone();
    drive(&r.clock, &mut r.w, 1_000, || h.stats().flushes > flushes);
    *r.held.lock().unwrap() = Hold::Everything;
    r.clock.advance(Duration::from_millis(10));
    assert!(
        answers.lock().unwrap().is_empty(),
        "nothing answered while held"
    );
    *r.held.lock().unwrap() = Hold::FailingWait;
    r.w.wait_device(Duration::from_millis(1));
    assert!(r.w.has_completions(), "the owner is told to step again");
    r.w.step(now(&r.clock));
    let answers = answers.lock().unwrap();
    match answers.as_slice() {
        [("A", Ok(a))] => assert_eq!(a.offset, 0),
        other => panic!("A's flush succeeded; it must be acknowledged, got {other:?}"),
    }
    assert!(
        matches!(r.w.fatal(), Some(LogError::Device { op: "wait", .. })),
        "the failed wait stops the writer: {:?}",
        r.w.fatal()
    );
}
