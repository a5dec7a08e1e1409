//! How a log is formatted and how its writer behaves.

use std::time::Duration;

/// When the writer flushes, and so what an ack means (storage.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushMode {
    /// Ack only after a covering flush completed: the promise. The default.
    Always,
    /// Ack when the write completes; flush at most every interval (and whenever the in-flight
    /// window fills). Loses up to min(rate x (interval + flush latency), W) at a power cut.
    Interval(Duration),
    /// Ack when the write completes; flush only when the window fills, a superblock is written,
    /// or the writer has been quiet for `LogConfig::quiet_flush` (so that readers, who see only
    /// flushed data, see the end of a burst). For throwaway runs: loses up to W at a power cut.
    Never,
}

impl FlushMode {
    /// What a power cut may take back from acknowledged appends in this mode, as numbers, for the
    /// log line every relaxed start prints; None for `always`, which loses nothing acknowledged.
    /// `window` is the log's W: no mode lets more than W bytes sit unflushed.
    pub fn loss_window(&self, window: u64) -> Option<String> {
        match self {
            FlushMode::Always => None,
            // The flush that covers an ack starts at most the interval after the previous one,
            // but it completes one flush latency later (and later still behind other flushes):
            // the crash simulator loses acks that old at its cuts.
            FlushMode::Interval(i) => Some(format!(
                "flush = interval:{}: a power cut may lose up to {} ms of acknowledged appends plus the time their flush takes, and never more than {window} bytes",
                i.as_millis(),
                i.as_millis()
            )),
            FlushMode::Never => Some(format!(
                "flush = never: a power cut may lose up to {window} bytes of acknowledged appends (flushed only when that fills, or when writes pause)"
            )),
        }
    }
}

impl std::str::FromStr for FlushMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "always" => Ok(FlushMode::Always),
            "never" => Ok(FlushMode::Never),
            _ => match s.strip_prefix("interval:") {
                Some(ms) => ms
                    .parse::<u64>()
                    .ok()
                    .filter(|&ms| ms > 0)
                    .map(|ms| FlushMode::Interval(Duration::from_millis(ms)))
                    .ok_or_else(|| format!("flush mode {s:?}: interval wants a positive number of milliseconds, e.g. interval:5")),
                None => Err(format!("flush mode {s:?}: expected always, interval:<ms> or never")),
            },
        }
    }
}

/// What happens when the ring has no room for a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFull {
    /// Free the oldest retained data (the head moves) to make room. The default.
    DropOldest,
    /// Free only data that retention already expired; otherwise fail appends with "log full"
    /// after a bounded wait.
    Refuse,
}

impl std::str::FromStr for OnFull {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "drop-oldest" | "drop_oldest" => Ok(OnFull::DropOldest),
            "refuse" => Ok(OnFull::Refuse),
            _ => Err(format!("on_full {s:?}: expected drop-oldest or refuse")),
        }
    }
}

/// The writer's behaviour; none of it is on disk.
#[derive(Debug, Clone)]
pub struct LogConfig {
    pub flush: FlushMode,
    pub on_full: OnFull,
    /// Keep at most this many bytes of log (None: as much as fits).
    pub retain_bytes: Option<u64>,
    /// Drop batches older than this (None: keep until space is needed).
    pub retain_time: Option<Duration>,
    /// Bytes of log between recovery points: bounds recovery time (about one second of reads).
    pub recovery_lag: u64,
    /// Appends (and reads) waiting for the writer; a full queue makes producers wait.
    pub queue_capacity: usize,
    /// Flushes the writer keeps in flight at once. More than one lets a group that arrives during
    /// a flush get its own flush at once instead of waiting for the running one.
    pub max_flushes_in_flight: usize,
    /// Batch writes the writer keeps in flight at once.
    pub max_writes_in_flight: usize,
    /// An idle writer records its durable position in the superblock after this long.
    pub idle_superblock: Duration,
    /// With `flush = never`, a writer quiet for this long flushes what it wrote, so that the
    /// end of a burst becomes visible to readers (who see only flushed data).
    pub quiet_flush: Duration,
    /// How long appends wait for space with `on_full = refuse` before failing.
    pub full_wait: Duration,
    /// Bytes per second the background scrub re-reads and checks (0: no scrub).
    pub scrub_rate: u64,
    /// Bytes of the newest durable batches kept in memory, so that readers at the tail never
    /// read the device (0: none).
    pub tail_cache_bytes: usize,
    /// How long appends may wait while the writer can write nothing at all (nothing in flight,
    /// no room it can free, no checkpoint it can write) before they fail naming why.
    pub stall_wait: Duration,
    /// How long the writer thread ([`crate::Log::start`]) keeps turning after its last progress
    /// before it sleeps (0: it sleeps at once). Polling the request queue and the device instead
    /// of sleeping on them saves the wake-ups (on a virtual machine, a timer due within
    /// microseconds or the wake of a halted vCPU costs 10-30 us each), at the price of a core's
    /// time for that long. An owner that hosts the writer (`Log::hosted`) decides for itself.
    pub spin: Duration,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            flush: FlushMode::Always,
            on_full: OnFull::DropOldest,
            retain_bytes: None,
            retain_time: None,
            recovery_lag: 256 << 20,
            queue_capacity: 4096,
            max_flushes_in_flight: 4,
            max_writes_in_flight: 1,
            idle_superblock: Duration::from_secs(1),
            quiet_flush: Duration::from_millis(10),
            full_wait: Duration::from_secs(5),
            scrub_rate: 16 << 20,
            tail_cache_bytes: 32 << 20,
            stall_wait: Duration::from_secs(10),
            spin: Duration::ZERO,
        }
    }
}

/// Geometry chosen at format time and recorded in the superblock.
#[derive(Debug, Clone)]
pub struct FormatOptions {
    /// In-flight window W in bytes.
    pub window: u64,
    /// Largest batch in bytes (clamped to the device's maximum transfer).
    pub max_batch: u32,
    /// Log size in bytes; None uses the whole device after the 2 MiB of superblocks.
    pub log_size: Option<u64>,
    /// The format id; None draws a random one.
    pub format_id: Option<u64>,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            window: 16 << 20,
            max_batch: 1 << 20,
            log_size: None,
            format_id: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relaxed_modes_state_their_loss_window_as_numbers() {
        assert_eq!(FlushMode::Always.loss_window(16 << 20), None);
        let i = FlushMode::Interval(Duration::from_millis(5))
            .loss_window(16 << 20)
            .unwrap_or_default();
        assert!(i.contains("5 ms") && i.contains("16777216 bytes"), "{i}");
        let n = FlushMode::Never.loss_window(1 << 20).unwrap_or_default();
        assert!(n.contains("1048576 bytes"), "{n}");
    }

    #[test]
    fn flush_modes_parse_and_bad_ones_say_why() {
        assert_eq!("always".parse::<FlushMode>(), Ok(FlushMode::Always));
        assert_eq!(
            "interval:5".parse::<FlushMode>(),
            Ok(FlushMode::Interval(Duration::from_millis(5)))
        );
        assert_eq!("never".parse::<FlushMode>(), Ok(FlushMode::Never));
        assert!("interval:0"
            .parse::<FlushMode>()
            .unwrap_err()
            .contains("positive"));
        assert!("sometimes"
            .parse::<FlushMode>()
            .unwrap_err()
            .contains("expected"));
        assert_eq!("refuse".parse::<OnFull>(), Ok(OnFull::Refuse));
        assert!("panic".parse::<OnFull>().is_err());
    }
}
