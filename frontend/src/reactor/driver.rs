//! A device's writer hosted on a loop: appended to straight from the loop's connections, turned
//! by the loop's service task, and waited on through the device's completion fd (or polled, for
//! a device that has none, as SPDK polls its queues).

use std::os::fd::OwnedFd;
use std::task::{Context, Poll};

use blockdev::BlockDevice;
use bytes::Bytes;
use nvmq_log::{Ack, Hosted, TokenAck, Turn};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// What the service task needs of a hosted writer, whatever its device type.
pub trait Driver {
    fn append(&mut self, partition: u32, payload: Bytes, span: u32, token: u64);
    fn turn(&mut self) -> Turn;
    /// Nothing on the device: an append turned at once goes out at once.
    fn quiet(&self) -> bool;
    fn drain_acks(&mut self, out: &mut Vec<TokenAck>);
    /// D as the writer has published it.
    fn durable(&self) -> u64;
    /// Whether a completion can be waited for without polling; then `poll_completion` wakes
    /// the task when one may be ready.
    fn has_fd(&self) -> bool;
    /// The loop is about to sleep: arm the device's completion fd (see
    /// `BlockDevice::arm_completion_fd`).
    fn arm_fd(&mut self);
    fn poll_completion(&mut self, cx: &mut Context<'_>) -> Poll<()>;
}

pub struct HostedDriver<D: BlockDevice> {
    /// A duplicate of the device's completion fd (the same file description), owned here so that
    /// it stays open for as long as it is registered with the loop's reactor.
    fd: Option<AsyncFd<OwnedFd>>,
    hosted: Hosted<D>,
}

impl<D: BlockDevice> HostedDriver<D> {
    /// Must be called on the loop's runtime (the fd is registered with its reactor).
    pub fn new(hosted: Hosted<D>) -> HostedDriver<D> {
        let mut hosted = hosted;
        let fd = hosted
            .writer()
            .device()
            .completion_fd()
            .map(|fd| fd.try_clone_to_owned())
            .and_then(|dup| {
                // `AsyncFd::new` is deprecated because an `AsRawFd` value that does not own its
                // fd could let it close while registered; an `OwnedFd` cannot, so this is sound.
                #[allow(deprecated)]
                let registered = dup.and_then(|d| AsyncFd::with_interest(d, Interest::READABLE));
                match registered {
                    Ok(a) => Some(a),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot wait on the device's completion fd; polling it instead");
                        None
                    }
                }
            });
        HostedDriver { fd, hosted }
    }
}

impl<D: BlockDevice> Driver for HostedDriver<D> {
    fn append(&mut self, partition: u32, payload: Bytes, span: u32, token: u64) {
        self.hosted
            .writer()
            .append(partition, payload, span, Ack::Token(token));
    }

    fn turn(&mut self) -> Turn {
        self.hosted.turn()
    }

    fn quiet(&self) -> bool {
        self.hosted.quiet()
    }

    fn drain_acks(&mut self, out: &mut Vec<TokenAck>) {
        self.hosted.writer().drain_acks(out);
    }

    fn durable(&self) -> u64 {
        self.hosted.durable()
    }

    fn has_fd(&self) -> bool {
        self.fd.is_some()
    }

    fn arm_fd(&mut self) {
        if self.fd.is_some() {
            self.hosted.writer().arm_completion_fd();
        }
    }

    fn poll_completion(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(fd) = &self.fd else {
            return Poll::Pending;
        };
        match fd.poll_read_ready(cx) {
            Poll::Ready(Ok(mut guard)) => {
                // The next turn's poll resets the fd before reaping, so a completion landing
                // after this leaves it readable again (a fresh edge).
                guard.clear_ready();
                Poll::Ready(())
            }
            Poll::Ready(Err(e)) => {
                tracing::error!(error = %e, "waiting on the device's completion fd failed");
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
