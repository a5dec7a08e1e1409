//! Indexing the log below the recovery point after the writer has started (storage.md §4.5, §5.6):
//! recovery time grows with the bytes above the recovery point, never with the size of the log, so
//! the older part of the index is rebuilt in the background, through the writer's own read path.
//!
//! Until it is installed, the writer frees nothing (retention waits) and readers asking for an
//! offset below the indexed part wait for it. Damage found on the way is reported like any
//! reader's: the region's reads fail naming the position; the writer keeps serving new data.

use std::collections::{HashMap, VecDeque};
use std::fmt;

use crate::layout::Geometry;
use crate::shared::IndexEntry;
use crate::writer::RetainedBatch;
use crate::LogError;

/// What the background scan found below the recovery point, in log order.
#[derive(Debug, Clone, Default)]
pub struct Backfilled {
    pub index: HashMap<u32, VecDeque<IndexEntry>>,
    pub retained: VecDeque<RetainedBatch>,
    pub bytes_read: u64,
}

/// Reads log bytes `[position, position + len)`.
pub type RawRead<'a> = dyn FnMut(u64, u64) -> Result<Vec<u8>, LogError> + 'a;

/// The scan itself: it lives with recovery's scanner (`from`, `to` are log positions).
pub type BackfillScan = fn(&Geometry, u64, u64, &mut RawRead<'_>) -> Result<Backfilled, String>;

/// A pending background index rebuild of `[from, to)`.
#[derive(Clone, Copy)]
pub struct Backfill {
    pub from: u64,
    pub to: u64,
    pub geo: Geometry,
    pub scan: BackfillScan,
}

impl fmt::Debug for Backfill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Backfill [{}, {})", self.from, self.to)
    }
}

impl Backfill {
    /// Scans `[from, to)` through `read`; the result goes back to the writer as
    /// `Request::Backfilled`.
    pub fn run(&self, read: &mut RawRead<'_>) -> Result<Backfilled, String> {
        (self.scan)(&self.geo, self.from, self.to, read)
    }
}
