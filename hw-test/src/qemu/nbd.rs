//! An NBD server exporting an image over a unix socket, for namespaces whose writes must pass
//! through a process the test controls: qemu-nbd (writes go straight to the image), or nvmq's own
//! power-cut server ([`crate::nbd`]: a volatile write cache that [`NbdServer::cut`] drops or tears).
//! Stopped when dropped.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::error::{Result, RigError};
use super::host;
use crate::nbd::{CutOutcome, Server, ServerConfig};

pub struct NbdServer {
    backend: Backend,
    socket: PathBuf,
}

enum Backend {
    QemuNbd(Child),
    PowerCut(Server),
}

impl NbdServer {
    /// Serves the raw image `image` on `socket` until dropped.
    pub fn start(image: &Path, socket: &Path) -> Result<Self> {
        let _ = std::fs::remove_file(socket);
        let mut cmd = Command::new("qemu-nbd");
        cmd.args(["-f", "raw", "--persistent", "--cache=none", "-k"])
            .arg(socket)
            .arg(image)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child = cmd.spawn().map_err(|source| RigError::Spawn {
            command: host::describe(&cmd),
            source,
        })?;
        let mut child = child;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(RigError::CommandFailed {
                    command: host::describe(&cmd),
                    status: status.to_string(),
                    stderr: "qemu-nbd exited before creating its socket".into(),
                });
            }
            if Instant::now() > deadline {
                return Err(RigError::Provision(format!(
                    "qemu-nbd did not create {} within 10 s",
                    socket.display()
                )));
            }
            thread::sleep(Duration::from_millis(20));
        }
        Ok(Self {
            backend: Backend::QemuNbd(child),
            socket: socket.to_path_buf(),
        })
    }

    /// Serves the raw image `image` on `socket` through nvmq's power-cut server (in this process,
    /// no control socket): writes stay in a volatile cache until the guest flushes, and
    /// [`NbdServer::cut`] applies the crash model to what is still cached.
    pub fn start_power_cut(image: &Path, socket: &Path) -> Result<Self> {
        Self::start_power_cut_with(image, socket, std::time::Duration::ZERO)
    }

    /// [`NbdServer::start_power_cut`] whose flushes take `flush_delay` (a slow drive), so that a
    /// cut at a random moment often finds writes not yet durable.
    pub fn start_power_cut_with(
        image: &Path,
        socket: &Path,
        flush_delay: std::time::Duration,
    ) -> Result<Self> {
        let mut cfg = ServerConfig::new(image, socket);
        cfg.control = None;
        cfg.flush_delay = flush_delay;
        let server = Server::start(cfg)?;
        Ok(Self {
            backend: Backend::PowerCut(server),
            socket: socket.to_path_buf(),
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The power cut of a server from [`NbdServer::start_power_cut`] (kill QEMU first, so that
    /// the guest sends nothing more): each unflushed write survives, is lost or is torn at
    /// 512-byte sectors, decided by `seed`. A qemu-nbd server has no cache to cut: an error.
    pub fn cut(&self, seed: u64) -> Result<CutOutcome> {
        match &self.backend {
            Backend::PowerCut(s) => Ok(s.cut(Some(seed))?),
            Backend::QemuNbd(_) => Err(RigError::Option {
                option: "disk",
                reason: "qemu-nbd writes through to the image: it has no cache to cut".into(),
            }),
        }
    }

    /// The power-cut server itself (counters, cuts without a seed); `None` for qemu-nbd.
    pub fn power_cut_server(&self) -> Option<&Server> {
        match &self.backend {
            Backend::PowerCut(s) => Some(s),
            Backend::QemuNbd(_) => None,
        }
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        if let Backend::QemuNbd(child) = &mut self.backend {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}
