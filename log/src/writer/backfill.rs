//! The index below the recovery point, rebuilt in the background after the writer started
//! (`crate::backfill`), handed to the writer and installed in front of what it indexed since.

use super::*;

impl<D: BlockDevice> Writer<D> {
    /// The background index rebuild to run (once): `Log::start` runs it on a thread of its own; a
    /// caller stepping the writer runs it with reads through the stepped writer. Its result comes
    /// back as `Request::Backfilled`.
    pub fn take_backfill(&mut self) -> Option<Backfill> {
        self.backfill.take()
    }

    /// Gives the log read-only queue pairs of this writer's device (an NVMe controller's extra
    /// I/O queue pairs), on which readers read the log themselves instead of through the
    /// writer; the `Log` made from this writer takes them.
    pub fn set_direct_reads(&mut self, pairs: crate::direct::DirectReads) {
        self.direct = (!pairs.is_empty()).then_some(pairs);
    }

    pub(crate) fn take_direct_reads(&mut self) -> Option<crate::direct::DirectReads> {
        self.direct.take()
    }

    /// Runs the background index rebuild right here, for owners that step the writer themselves
    /// (simulations, tools): `read` fetches raw log bytes by stepping this writer.
    pub fn backfill_with(
        &mut self,
        mut read: impl FnMut(&mut Self, u64, u64) -> Result<Vec<u8>, LogError>,
    ) {
        let Some(job) = self.take_backfill() else {
            return;
        };
        let result = job.run(&mut |position, len| read(self, position, len));
        self.install_backfill(result);
    }

    /// Installs the index below the recovery point in front of what the writer has indexed since.
    pub(super) fn install_backfill(&mut self, result: Result<Backfilled, String>) {
        if !self.backfill_pending {
            return;
        }
        self.backfill_pending = false;
        let mut s = self.shared.lock();
        s.backfill_pending = false;
        match result {
            Ok(mut b) => {
                s.backfill_bytes = b.bytes_read;
                while let Some(r) = b.retained.pop_back() {
                    self.retained.push_front(r);
                }
                for (id, v) in s.partitions.iter_mut() {
                    if let Some(mut older) = b.index.remove(id) {
                        older.extend(v.entries.drain(..));
                        v.entries = older;
                    }
                    let start = v.entries.front().map_or(v.durable_end, |e| e.first_offset);
                    v.start_offset = start;
                    if let Some(p) = self.registry.get_mut(*id) {
                        p.start_offset = start;
                    }
                }
            }
            Err(what) => {
                tracing::error!(%what, "damage below the recovery point: older records of the log cannot be served");
                s.backfill_error = Some(what);
            }
        }
        drop(s);
        self.shared.notify();
    }
}
