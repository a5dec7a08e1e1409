//! The listeners, the shared power state and the power cut itself.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};

use blockdev::sim::Rng;

use super::conn::{Conn, End, Stream};
use super::control;
use super::error::NbdError;
use super::store::{CutOutcome, StoreStats, VolatileImage};

/// How a [`Server`] is set up. [`ServerConfig::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The backing image (the medium); its length is the export size.
    pub image: PathBuf,
    /// The NBD Unix socket (replaced if it exists).
    pub socket: PathBuf,
    /// Also serve NBD on this TCP address (e.g. `127.0.0.1:10809`; port 0 picks one).
    pub tcp: Option<String>,
    /// The control socket (one text command per line, see `control.rs`); `None`: no control
    /// socket, the power is cut only through [`Server::cut`].
    pub control: Option<PathBuf>,
    /// The export's name; the empty name (QEMU's default) is always accepted too.
    pub export_name: String,
    /// Cache size above which the oldest cached writes are written back to the image.
    pub max_cached_bytes: u64,
    /// Seeds the seeds of cuts requested without one, so a scripted run still replays.
    pub seed: u64,
    /// Print one line per connection, error and cut on stderr.
    pub log: bool,
    /// How long a flush takes before it starts writing the cache back, as on a drive whose
    /// flush is slow (a laptop SSD: ~4 ms). A cut in that time loses what the flush covers.
    pub flush_delay: std::time::Duration,
}

impl ServerConfig {
    /// Control socket `<socket>.ctl`, no TCP, export "nvmq", a 256 MiB cache, seed 0, logging on.
    pub fn new(image: impl Into<PathBuf>, socket: impl Into<PathBuf>) -> ServerConfig {
        let socket: PathBuf = socket.into();
        let mut control = socket.clone().into_os_string();
        control.push(".ctl");
        ServerConfig {
            image: image.into(),
            socket,
            tcp: None,
            control: Some(control.into()),
            export_name: "nvmq".into(),
            max_cached_bytes: 256 << 20,
            seed: 0,
            log: true,
            flush_delay: std::time::Duration::ZERO,
        }
    }
}

/// The power state: the store and the number of the current power cycle.
pub(crate) struct Power {
    store: VolatileImage,
    generation: u64,
    seeds: Rng,
}

pub struct Shared {
    pub(crate) size: u64,
    pub(crate) export_name: String,
    power: Mutex<Power>,
    conns: Mutex<BTreeMap<u64, Stream>>,
    next_conn: AtomicU64,
    stopping: AtomicBool,
    log: bool,
    pub(crate) flush_delay: std::time::Duration,
}

/// Marker for "the power went while this request was being served".
pub(crate) struct PowerCut;

impl From<PowerCut> for End {
    fn from(_: PowerCut) -> End {
        End::Cut
    }
}

impl Shared {
    pub(crate) fn knows_export(&self, name: &str) -> bool {
        name.is_empty() || name == self.export_name
    }

    pub(crate) fn log(&self, line: &str) {
        if self.log {
            eprintln!("nvmq-nbd: {line}");
        }
    }

    fn power(&self) -> MutexGuard<'_, Power> {
        // A panicking connection thread must not take the server down with it.
        self.power.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn conns(&self) -> MutexGuard<'_, BTreeMap<u64, Stream>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the store if the power has not been cut since `generation` began: a request
    /// of a connection from before a cut never reaches the store.
    pub(crate) fn with_power<T>(
        &self,
        generation: u64,
        f: impl FnOnce(&mut VolatileImage) -> T,
    ) -> Result<T, PowerCut> {
        let mut p = self.power();
        if p.generation != generation {
            return Err(PowerCut);
        }
        Ok(f(&mut p.store))
    }

    pub(crate) fn cut(&self, seed: Option<u64>) -> Result<(CutOutcome, usize), NbdError> {
        let mut p = self.power();
        p.generation += 1;
        let seed = seed.unwrap_or_else(|| p.seeds.next_u64());
        let dropped: Vec<Stream> = std::mem::take(&mut *self.conns()).into_values().collect();
        for s in &dropped {
            s.shutdown();
        }
        let out = p.store.cut(seed)?;
        self.log(&format!(
            "power cut: {out} connections_dropped={}",
            dropped.len()
        ));
        Ok((out, dropped.len()))
    }

    pub(crate) fn stats(&self) -> StoreStats {
        self.power().store.stats()
    }

    fn serve(self: &Arc<Self>, stream: Stream, peer: String) {
        let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let generation = {
            // Registered under the power lock, so a cut either sees it or precedes it (and then
            // the generation it reads is already the new one).
            let p = self.power();
            match stream.try_clone() {
                Ok(c) => {
                    self.conns().insert(id, c);
                }
                Err(e) => {
                    self.log(&format!("{peer}: cannot keep a handle for cutting it: {e}"));
                    return;
                }
            }
            p.generation
        };
        let shared = self.clone();
        let spawned = thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || {
                shared.log(&format!("connection {id} from {peer}"));
                let mut conn = Conn {
                    shared: &shared,
                    stream,
                    generation,
                };
                let end = conn.serve();
                conn.stream.shutdown();
                shared.conns().remove(&id);
                match end {
                    End::Client => shared.log(&format!("connection {id} closed by the client")),
                    End::Cut => shared.log(&format!("connection {id} ended by a power cut")),
                    End::Bad(why) => shared.log(&format!("connection {id} dropped: {why}")),
                    End::Io(e) => shared.log(&format!("connection {id} failed: {e}")),
                }
            });
        if let Err(e) = spawned {
            self.log(&format!("cannot start a connection thread: {e}"));
            if let Some(s) = self.conns().remove(&id) {
                s.shutdown();
            }
        }
    }
}

/// A running power-cut NBD server. Dropping it stops the listeners and drops the connections
/// without flushing: what was only cached is gone, as after a cut where every write was lost.
pub struct Server {
    shared: Arc<Shared>,
    socket: PathBuf,
    control: Option<PathBuf>,
    tcp: Option<SocketAddr>,
    threads: Vec<JoinHandle<()>>,
}

fn sock_err(
    op: &'static str,
    addr: impl std::fmt::Display,
) -> impl FnOnce(std::io::Error) -> NbdError {
    let addr = addr.to_string();
    move |source| NbdError::Socket { op, addr, source }
}

impl Server {
    pub fn start(cfg: ServerConfig) -> Result<Server, NbdError> {
        let store = VolatileImage::open(&cfg.image, cfg.max_cached_bytes)?;
        let shared = Arc::new(Shared {
            size: store.size(),
            export_name: cfg.export_name.clone(),
            power: Mutex::new(Power {
                store,
                generation: 0,
                seeds: Rng::new(cfg.seed),
            }),
            conns: Mutex::new(BTreeMap::new()),
            next_conn: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            log: cfg.log,
            flush_delay: cfg.flush_delay,
        });
        let mut threads = Vec::new();
        let _ = std::fs::remove_file(&cfg.socket);
        let unix =
            UnixListener::bind(&cfg.socket).map_err(sock_err("binding", cfg.socket.display()))?;
        threads.push(accept_loop(
            "nbd-unix",
            &shared,
            move || unix.accept().map(|(s, _)| s),
            |sh, s| sh.serve(Stream::Unix(s), "unix".into()),
        )?);
        let mut tcp_addr = None;
        if let Some(addr) = &cfg.tcp {
            let l = TcpListener::bind(addr.as_str()).map_err(sock_err("binding", addr))?;
            tcp_addr = Some(
                l.local_addr()
                    .map_err(sock_err("reading the address of", addr))?,
            );
            threads.push(accept_loop(
                "nbd-tcp",
                &shared,
                move || l.accept(),
                |sh, (s, peer)| {
                    let _ = s.set_nodelay(true);
                    sh.serve(Stream::Tcp(s), peer.to_string())
                },
            )?);
        }
        if let Some(path) = &cfg.control {
            let _ = std::fs::remove_file(path);
            let l = UnixListener::bind(path).map_err(sock_err("binding", path.display()))?;
            threads.push(accept_loop(
                "nbd-control",
                &shared,
                move || l.accept().map(|(s, _)| s),
                |sh, s| {
                    let sh = sh.clone();
                    // Its own thread: a controller that keeps its connection open blocks no one.
                    if let Err(e) = spawn("nbd-control-conn", move || control::serve(&sh, s)) {
                        eprintln!("nvmq-nbd: {e}");
                    }
                },
            )?);
        }
        shared.log(&format!(
            "serving {} ({} bytes) on {}{}{}",
            cfg.image.display(),
            shared.size,
            cfg.socket.display(),
            tcp_addr.map(|a| format!(" and {a}")).unwrap_or_default(),
            cfg.control
                .as_ref()
                .map(|c| format!(", control {}", c.display()))
                .unwrap_or_default()
        ));
        Ok(Server {
            shared,
            socket: cfg.socket,
            control: cfg.control,
            tcp: tcp_addr,
            threads,
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn control_socket(&self) -> Option<&Path> {
        self.control.as_deref()
    }

    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp
    }

    /// Cuts the power: drops every connection and applies the crash model to the cache with
    /// `seed` (or the next seed of the server's own sequence); then new connections are served.
    pub fn cut(&self, seed: Option<u64>) -> Result<CutOutcome, NbdError> {
        self.shared.cut(seed).map(|(out, _)| out)
    }

    pub fn stats(&self) -> StoreStats {
        self.shared.stats()
    }
}

/// A thread taking connections from `accept` until the server stops, each handed to `handle`.
fn accept_loop<S>(
    name: &str,
    shared: &Arc<Shared>,
    mut accept: impl FnMut() -> std::io::Result<S> + Send + 'static,
    handle: impl Fn(&Arc<Shared>, S) + Send + 'static,
) -> Result<JoinHandle<()>, NbdError> {
    let sh = shared.clone();
    let what = name.to_string();
    spawn(name, move || loop {
        let conn = accept();
        if sh.stopping.load(Ordering::Relaxed) {
            break;
        }
        match conn {
            Ok(s) => handle(&sh, s),
            Err(e) => {
                sh.log(&format!("{what}: accept: {e}"));
                // Out of descriptors and the like: do not spin on it.
                thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    })
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, NbdError> {
    thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(sock_err("starting the thread for", name))
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        // Wake each accept loop so it sees the flag.
        let _ = UnixStream::connect(&self.socket);
        if let Some(c) = &self.control {
            let _ = UnixStream::connect(c);
        }
        if let Some(a) = self.tcp {
            let _ = TcpStream::connect(a);
        }
        for s in std::mem::take(&mut *self.shared.conns()).into_values() {
            s.shutdown();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
        if let Some(c) = &self.control {
            let _ = std::fs::remove_file(c);
        }
    }
}
