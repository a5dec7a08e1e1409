//! An NBD server (qemu-nbd) exporting an image over a unix socket, for namespaces whose writes
//! must pass through a process the test controls. Stopped when dropped.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::error::{Result, RigError};
use super::host;

pub struct NbdServer {
    child: Child,
    socket: PathBuf,
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
        let mut server = Self {
            child,
            socket: socket.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if let Ok(Some(status)) = server.child.try_wait() {
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
        Ok(server)
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}
