//! What a raw log read is, whichever queue carries it (the writer's, `writer::reads`, or a
//! reader's own pair, `direct`): the bounds within which a read is served, and the landing of
//! its pieces (cut by `Geometry::pieces`) in the caller's buffer. Kept in one place so that the
//! two paths cannot drift apart in what they serve or in how a bad piece fails the read.

use blockdev::{DeviceError, IoBuffer};

use crate::LogError;

/// Refuses a read the writer would not serve: below the head, past D, or longer than a batch.
/// Only bytes below D are served (storage.md §1), so nothing read can vanish in a power cut.
pub(crate) fn check_bounds(
    position: u64,
    len: u64,
    head: u64,
    durable: u64,
    max_batch: u64,
) -> Result<(), LogError> {
    if position < head || position.saturating_add(len) > durable || len > max_batch {
        return Err(out_of_range(position, head, durable));
    }
    Ok(())
}

/// A read at `position` outside [head, durable).
pub(crate) fn out_of_range(position: u64, head: u64, durable: u64) -> LogError {
    LogError::OffsetOutOfRange {
        partition: u32::MAX,
        offset: position,
        start: head,
        end: durable,
    }
}

/// A read's buffer while its pieces come back, in any order.
pub(crate) struct Landing {
    data: Vec<u8>,
    /// Each piece's (offset into `data`, length), by piece index.
    spans: Vec<(usize, usize)>,
    /// The first failure: the read answers with it once every submitted piece is back.
    failed: Option<LogError>,
}

impl Landing {
    /// A read of `len` bytes cut into `pieces` (device offset, offset into the read, length).
    pub fn new(len: u64, pieces: &[(u64, u64, u64)]) -> Landing {
        Landing {
            data: vec![0; len as usize],
            spans: pieces
                .iter()
                .map(|&(_, from, n)| (from as usize, n as usize))
                .collect(),
            failed: None,
        }
    }

    /// Takes piece `piece`'s completion: its bytes go to their place in the read, or the read
    /// fails (a device error, a buffer not handed back, a piece that is not the one asked for).
    pub fn land(
        &mut self,
        piece: usize,
        result: Result<(), DeviceError>,
        buffer: Option<IoBuffer>,
    ) {
        let failure = match (result, buffer) {
            (Ok(()), Some(b)) => {
                let dst = self
                    .spans
                    .get(piece)
                    .filter(|&&(_, n)| n == b.len())
                    .and_then(|&(from, n)| self.data.get_mut(from..from + n));
                match dst {
                    Some(dst) => {
                        dst.copy_from_slice(&b);
                        return;
                    }
                    None => LogError::Unavailable(format!(
                        "read piece {piece} came back with {} B, which is not its place in the read",
                        b.len()
                    )),
                }
            }
            (Err(e), _) => LogError::Device {
                op: "read the log",
                source: e,
            },
            (Ok(()), None) => LogError::Shutdown,
        };
        self.fail(failure);
    }

    /// Fails the read (the first failure is the one reported).
    pub fn fail(&mut self, e: LogError) {
        self.failed.get_or_insert(e);
    }

    pub fn has_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// The bytes read, or why the read failed.
    pub fn finish(self) -> Result<Vec<u8>, LogError> {
        match self.failed {
            Some(e) => Err(e),
            None => Ok(self.data),
        }
    }
}
