//! The storage model behind the NBD server: a backing image file (the medium) and a volatile cache
//! of completed writes not yet flushed. Reads see the cache over the medium. A flush, a FUA write
//! and the cache's own destaging are the only ways bytes reach the image outside a power cut; the
//! cut applies blockdev's crash model (`land_unflushed`) to whatever is still cached.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use blockdev::sim::{land_unflushed, CacheEntry, Rng, WriteFate, SECTOR};

use super::error::NbdError;

/// What one power cut did to the writes that were in the cache.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CutOutcome {
    pub seed: u64,
    /// Writes completed and not flushed when the power went.
    pub unflushed: u64,
    pub survived: u64,
    pub lost: u64,
    pub torn: u64,
    /// Bytes those writes held.
    pub unflushed_bytes: u64,
}

impl std::fmt::Display for CutOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed={} unflushed={} bytes={} survived={} lost={} torn={}",
            self.seed, self.unflushed, self.unflushed_bytes, self.survived, self.lost, self.torn
        )
    }
}

/// Counters since the server started (they survive cuts) and the cache as it is now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub reads: u64,
    pub writes: u64,
    pub fua_writes: u64,
    pub flushes: u64,
    /// Cached writes moved to the image because the cache was over its size limit.
    pub destaged: u64,
    pub cuts: u64,
    pub cached_writes: u64,
    pub cached_bytes: u64,
}

pub struct VolatileImage {
    path: PathBuf,
    file: File,
    size: u64,
    /// Completed, unflushed writes, oldest first (the newest wins on reads).
    cache: Vec<CacheEntry>,
    cached_bytes: u64,
    max_cached_bytes: u64,
    next_seq: u64,
    stats: StoreStats,
}

impl VolatileImage {
    /// Opens `path` read-write as the medium. Its length is the export size and must be a
    /// positive multiple of 512 bytes. When the cache holds more than `max_cached_bytes`, its
    /// oldest writes are destaged to the image (a drive may write its cache back at any time).
    pub fn open(path: &Path, max_cached_bytes: u64) -> Result<VolatileImage, NbdError> {
        let io = |op: &'static str| {
            let path = path.to_path_buf();
            move |source| NbdError::Image { op, path, source }
        };
        let file = File::options()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io("opening"))?;
        let size = file.metadata().map_err(io("reading the size of"))?.len();
        if size == 0 || !size.is_multiple_of(SECTOR) {
            return Err(NbdError::ImageSize {
                path: path.to_path_buf(),
                size,
            });
        }
        Ok(VolatileImage {
            path: path.to_path_buf(),
            file,
            size,
            cache: Vec::new(),
            cached_bytes: 0,
            max_cached_bytes,
            next_seq: 0,
            stats: StoreStats::default(),
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    fn image_err(&self, op: &'static str) -> impl FnOnce(std::io::Error) -> NbdError {
        let path = self.path.clone();
        move |source| NbdError::Image { op, path, source }
    }

    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), NbdError> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(self.image_err("reading"))?;
        for e in &self.cache {
            e.overlay(offset, buf);
        }
        self.stats.reads += 1;
        Ok(())
    }

    /// A completed write: cached (volatile) unless `fua`, in which case it is on the image, and
    /// synced, before this returns, and no older cached write can come back over it at a cut.
    pub fn write(&mut self, offset: u64, data: Vec<u8>, fua: bool) -> Result<(), NbdError> {
        self.stats.writes += 1;
        if fua {
            self.stats.fua_writes += 1;
            self.file
                .write_all_at(&data, offset)
                .map_err(self.image_err("writing (FUA)"))?;
            self.file
                .sync_data()
                .map_err(self.image_err("syncing (FUA)"))?;
            self.supersede(offset, data.len() as u64);
            return Ok(());
        }
        self.cached_bytes += data.len() as u64;
        self.cache
            .push(CacheEntry::new(self.next_seq, offset, data));
        self.next_seq += 1;
        self.destage_over_limit()
    }

    /// Older cached writes give up the sectors a durable write just replaced.
    fn supersede(&mut self, offset: u64, len: u64) {
        for e in &mut self.cache {
            e.kill(offset, len);
        }
        self.drop_dead();
    }

    fn drop_dead(&mut self) {
        self.cache.retain(CacheEntry::any_live);
        self.cached_bytes = self.cache.iter().map(|e| e.len() as u64).sum();
    }

    fn put(&self, entry: &CacheEntry) -> Result<(), NbdError> {
        for (at, bytes) in entry.live_runs() {
            self.file
                .write_all_at(bytes, at)
                .map_err(self.image_err("writing back"))?;
        }
        Ok(())
    }

    fn destage_over_limit(&mut self) -> Result<(), NbdError> {
        if self.cached_bytes <= self.max_cached_bytes {
            return Ok(());
        }
        let mut n = 0;
        let mut bytes = self.cached_bytes;
        while bytes > self.max_cached_bytes / 2 && n < self.cache.len() {
            self.put(&self.cache[n])?;
            bytes -= self.cache[n].len() as u64;
            n += 1;
        }
        self.cache.drain(..n);
        self.cached_bytes = bytes;
        self.stats.destaged += n as u64;
        Ok(())
    }

    /// Every cached write (all completed before this flush) goes to the image in completion
    /// order, then the image is synced. On error the cache is kept: nothing is claimed durable.
    pub fn flush(&mut self) -> Result<(), NbdError> {
        for e in &self.cache {
            self.put(e)?;
        }
        self.file.sync_data().map_err(self.image_err("syncing"))?;
        self.cache.clear();
        self.cached_bytes = 0;
        self.stats.flushes += 1;
        Ok(())
    }

    /// The power cut: the crash model of blockdev's sim, seeded, applied to every cached write in
    /// a seeded order; the survivors are synced to the image and the cache is empty afterwards.
    pub fn cut(&mut self, seed: u64) -> Result<CutOutcome, NbdError> {
        let mut rng = Rng::new(seed);
        let mut items = std::mem::take(&mut self.cache);
        self.cached_bytes = 0;
        self.stats.cuts += 1;
        rng.shuffle(&mut items);
        let mut out = CutOutcome {
            seed,
            unflushed: items.len() as u64,
            unflushed_bytes: items.iter().map(|e| e.len() as u64).sum(),
            ..CutOutcome::default()
        };
        let file = &self.file;
        for e in &items {
            let landed = land_unflushed(&mut rng, e, false, false, |at, bytes| {
                file.write_all_at(bytes, at)
            })
            .map_err(self.image_err("landing a cached write at the cut on"))?;
            match landed.fate {
                WriteFate::Survived => out.survived += 1,
                WriteFate::Lost => out.lost += 1,
                WriteFate::Torn => out.torn += 1,
            }
        }
        self.file
            .sync_data()
            .map_err(self.image_err("syncing after the cut"))?;
        Ok(out)
    }

    pub fn stats(&self) -> StoreStats {
        StoreStats {
            cached_writes: self.cache.len() as u64,
            cached_bytes: self.cached_bytes,
            ..self.stats.clone()
        }
    }
}
