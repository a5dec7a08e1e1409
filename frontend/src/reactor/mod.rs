//! The front door: one event loop per core, each owning its connections and, on the loop that
//! owns a device, that device's writer, stepped inline.
//!
//! A loop is a tokio current-thread runtime on a thread of its own (pinned to a core when asked),
//! with no work stealing. A Produce that arrives on a loop owning the partition's device is
//! decoded, its record batches go into the writer's queue as `Bytes` views of the receive buffer
//! (copied once, into the device buffer), and the same loop's service task steps the writer after
//! every connection of the pass had its turn, so one batch takes all of them; the ack is a token
//! the service routes back to the request's slot in its connection's FIFO, and the connection
//! answers everything ready in one write. Nothing crosses a thread and nothing wakes another one.
//! A partition on another loop's device costs one message each way over the loops' inboxes,
//! batched per pass, with a doorbell only when the receiving loop sleeps (see `bell`).
//!
//! Everything else (Metadata, groups, commits, admin) runs as before: an async answer per request,
//! kept in order in the same FIFO.

mod bell;
mod checker;
mod checking;
mod conn;
mod driver;
mod fast;
mod limits;
mod secure;
mod service;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use blockdev::BlockDevice;
use nvmq_log::{Log, Writer};

use crate::broker::{Broker, Config};
use crate::FrontendError;
use bell::LoopBell;
pub use checker::CheckGate;

/// How the front door is laid out.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Event loops (threads); 0: one per core the process may run on.
    pub loops: usize,
    /// Pin loop i to the i-th core the process may run on.
    pub pin: bool,
    /// Requests queued for a writer from other threads (partition creation, reads, internal
    /// records).
    pub queue_capacity: usize,
    /// Payload bytes a loop lets its connections have queued or in flight in the writers; a
    /// connection stops reading Produce requests while its loop is over it.
    pub append_budget: usize,
    /// How long a loop with device I/O in flight and nothing else to do keeps polling before it
    /// sleeps (0: it sleeps at once). Polling costs the core; a wake-up from sleep costs latency,
    /// much of it on a virtual machine.
    pub spin: Duration,
    /// For tests: a gate the checks of large and compressed batches pass before they run.
    pub check_gate: Option<CheckGate>,
    /// TLS on the listener (every connection); None: plain TCP.
    pub tls: Option<crate::tls::Tls>,
    /// This broker as one node of a cluster; None: a single broker.
    pub cluster: Option<crate::replica::ClusterOptions>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            loops: 0,
            pin: true,
            queue_capacity: 4096,
            append_budget: 64 << 20,
            spin: Duration::ZERO,
            check_gate: None,
            tls: None,
            cluster: None,
        }
    }
}

impl ServerOptions {
    /// The loops the server runs: `loops`, or one per core when it is 0.
    pub fn loop_count(&self) -> usize {
        match self.loops {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

/// What every loop and the server's handle share.
pub(crate) struct ServerShared {
    pub bells: Vec<Arc<LoopBell>>,
    /// Device index → the loop hosting its writer.
    pub device_loop: Vec<usize>,
    /// Stop accepting, close every connection, and let the writers finish.
    pub stopping: AtomicBool,
    /// Fast-path appends routed and not yet answered (for a clean shutdown).
    pub outstanding: AtomicU64,
    /// Stop at once, whatever the writers hold (a crash, for tests and the power-cut rig).
    pub killed: AtomicBool,
    pub opts: ServerOptions,
    /// Connections open and bytes held, against the broker's limits.
    pub limits: Arc<limits::Limits>,
    /// Where the records of large and compressed batches are checked, off the loops.
    pub checker: checker::CheckPool,
}

/// A running broker: its loops, and the state they share.
pub struct Server {
    broker: Arc<Broker>,
    addr: SocketAddr,
    shared: Arc<ServerShared>,
    /// The loops' threads; empty once stopped.
    threads: Vec<JoinHandle<()>>,
}

/// How long a clean shutdown waits for appends in flight before its last snapshot.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

impl Server {
    /// Starts the loops, hands each device's writer to one of them (device i to loop i mod
    /// loops), opens the broker over the logs (replaying its internal partitions), and starts
    /// accepting on `listener`. Blocking; call it outside any runtime's thread.
    pub fn start<D: BlockDevice + 'static>(
        writers: Vec<Writer<D>>,
        listener: std::net::TcpListener,
        cfg: Config,
        opts: ServerOptions,
    ) -> Result<Server, FrontendError> {
        if writers.is_empty() {
            return Err(FrontendError::Config(
                "a broker needs at least one device".into(),
            ));
        }
        let addr = listener.local_addr().map_err(|source| FrontendError::Io {
            op: "reading the listening address",
            source,
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| FrontendError::Io {
                op: "making the listener non-blocking",
                source,
            })?;
        let loops = opts.loop_count().max(1);
        let bells: Vec<Arc<LoopBell>> = (0..loops).map(|_| Arc::new(LoopBell::default())).collect();
        let device_loop: Vec<usize> = (0..writers.len()).map(|d| d % loops).collect();
        let shared = Arc::new(ServerShared {
            bells,
            device_loop,
            stopping: AtomicBool::new(false),
            outstanding: AtomicU64::new(0),
            killed: AtomicBool::new(false),
            opts: opts.clone(),
            limits: Arc::default(),
            checker: checker::CheckPool::start(opts.check_gate.clone())?,
        });
        // Each writer goes to its loop; the logs (their handles) to the broker.
        let mut logs = Vec::new();
        let mut hosted: Vec<Vec<(usize, Box<dyn service::Hostable>)>> =
            (0..loops).map(|_| Vec::new()).collect();
        for (d, w) in writers.into_iter().enumerate() {
            let l = shared.device_loop[d];
            let bell: Arc<dyn nvmq_log::Doorbell> = shared.bells[l].clone();
            let (log, h) = Log::hosted(w, opts.queue_capacity, bell);
            shared.bells[l].watch_queue(h.queue());
            logs.push(log);
            hosted[l].push((d, Box::new(h)));
        }
        let (start_tx, start_rx) = crossbeam::channel::unbounded::<service::Start>();
        let cores = if opts.pin {
            core_affinity::get_core_ids().unwrap_or_default()
        } else {
            Vec::new()
        };
        let mut threads = Vec::new();
        for (id, devices) in hosted.into_iter().enumerate() {
            let shared = shared.clone();
            let start = start_rx.clone();
            let core = cores.get(id % cores.len().max(1)).copied();
            let spawned = std::thread::Builder::new()
                .name(format!("nvmq-loop-{id}"))
                .spawn(move || {
                    if let Some(c) = core {
                        if !core_affinity::set_for_current(c) {
                            tracing::warn!(core = c.id, "could not pin the loop to its core");
                        }
                    }
                    service::run_loop(id, shared, devices, start)
                });
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => return Err(FrontendError::Thread(e.to_string())),
            }
        }
        // The writers turn now: the broker's replay reads through them.
        let queue = opts.queue_capacity;
        let opened = Broker::open_many(logs, queue, cfg);
        let broker = match opened {
            Ok(b) => b,
            Err(e) => {
                stop_loops(&shared, threads);
                return Err(e);
            }
        };
        if let Some(c) = &opts.cluster {
            match crate::replica::start(&broker, c) {
                Ok(r) => broker.set_replica(r),
                Err(e) => {
                    stop_loops(&shared, threads);
                    return Err(e);
                }
            }
        }
        let listener = Some(listener);
        let mut listener = listener;
        for id in 0..loops {
            let msg = service::Start {
                broker: broker.clone(),
                listener: if id == 0 { listener.take() } else { None },
            };
            if start_tx.send(msg).is_err() {
                stop_loops(&shared, threads);
                return Err(FrontendError::Thread("an event loop ended at start".into()));
            }
        }
        for b in &shared.bells {
            b.ring();
        }
        Ok(Server {
            broker,
            addr,
            shared,
            threads,
        })
    }

    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections open now, and how many were closed at once for a connection limit.
    pub fn connections(&self) -> (usize, u64) {
        let l = &self.shared.limits;
        (l.open(), l.refused())
    }

    /// Bytes all connections hold: requests read and not yet answered, answers not yet sent
    /// (bounded by `max_queued_bytes`, give or take one request per connection).
    pub fn queued_bytes(&self) -> usize {
        self.shared.limits.queued()
    }

    /// Reads (connections open, connections refused, queued bytes) from any thread, for
    /// metrics; keeps working after the server is dropped (the last figures).
    pub fn front_probe(&self) -> impl Fn() -> (usize, u64, usize) + Send + Sync + 'static {
        let l = self.shared.limits.clone();
        move || (l.open(), l.refused(), l.queued())
    }

    /// Event loops running.
    pub fn loops(&self) -> usize {
        self.shared.bells.len()
    }

    /// Stops accepting and drops every connection (their acknowledged appends are durable;
    /// unanswered ones are the clients' to retry), waits for appends in flight, records the
    /// idempotent producers' state for the next start, and stops the writers and the loops.
    pub fn shutdown(mut self) -> Result<Arc<Broker>, FrontendError> {
        self.shared.stopping.store(true, Ordering::SeqCst);
        for b in &self.shared.bells {
            b.ring();
        }
        let until = Instant::now() + SHUTDOWN_WAIT;
        while self.shared.outstanding.load(Ordering::SeqCst) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
        let fast_done = self.shared.outstanding.load(Ordering::SeqCst) == 0;
        let b = self.broker.clone();
        // On a thread of its own, with a runtime of its own: the caller may be inside one.
        let last = move || -> Result<(), FrontendError> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|source| FrontendError::Io {
                    op: "starting the shutdown runtime",
                    source,
                })?;
            rt.block_on(async move {
                // Once every queued append is acknowledged, a snapshot of every partition's
                // producers lets the next start replay nothing.
                if fast_done && b.quiesce(SHUTDOWN_WAIT).await {
                    match b.snapshot_producers(false).await {
                        Ok(n) => tracing::info!(partitions = n, "producer state recorded"),
                        Err(e) => {
                            tracing::warn!(error = %e, "snapshot of the producer state failed")
                        }
                    }
                } else {
                    tracing::warn!(
                        "appends still in flight at shutdown: no final producer snapshot"
                    );
                }
            });
            Ok(())
        };
        let snapshot = std::thread::Builder::new()
            .name("nvmq-shutdown".into())
            .spawn(last)
            .map_err(|e| FrontendError::Thread(e.to_string()))?;
        match snapshot.join() {
            Ok(r) => r?,
            Err(_) => tracing::error!("the shutdown snapshot panicked"),
        }
        if let Some(r) = self.broker.replica() {
            r.stop();
        }
        self.broker.close_logs();
        stop_loops(&self.shared, std::mem::take(&mut self.threads));
        Ok(self.broker.clone())
    }

    /// Stops the loops at once, as a crash would: no connection is answered again, and what the
    /// writers hold is dropped unwritten (acknowledged appends are durable already). For tests
    /// and the power-cut rig; returns the broker for inspection.
    pub fn kill(mut self) -> Arc<Broker> {
        self.halt();
        self.broker.clone()
    }

    fn halt(&mut self) {
        if let Some(r) = self.broker.replica() {
            r.stop();
        }
        self.shared.killed.store(true, Ordering::SeqCst);
        stop_loops(&self.shared, std::mem::take(&mut self.threads));
    }
}

impl Drop for Server {
    /// A server dropped without `shutdown` stops like `kill`.
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.halt();
        }
    }
}

/// Tells the loops to stop and waits for them; each ends once its writers have stopped.
fn stop_loops(shared: &ServerShared, threads: Vec<JoinHandle<()>>) {
    shared.stopping.store(true, Ordering::SeqCst);
    for b in &shared.bells {
        b.ring();
    }
    for t in threads {
        if t.join().is_err() {
            tracing::error!("an event loop panicked");
        }
    }
}
