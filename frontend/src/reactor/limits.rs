//! What the loops share to bound connections and memory: connections open in total and per
//! client address, and the bytes all connections hold (requests read and not yet answered,
//! answers not yet sent), so that clients that flood or never read cannot grow the broker
//! without bound.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often a refused connection is logged at warn level (the others are counted).
const WARN_EVERY: Duration = Duration::from_secs(5);

#[derive(Default)]
pub(crate) struct Limits {
    open: AtomicUsize,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    /// Connections closed at once for a limit.
    refused: AtomicU64,
    /// Bytes held by all connections.
    queued: AtomicUsize,
    last_warn: Mutex<Option<Instant>>,
}

/// A connection counted against the limits until it is dropped.
pub(crate) struct Admission {
    limits: Arc<Limits>,
    ip: Option<IpAddr>,
}

impl Limits {
    /// Counts a new connection from `ip`, or refuses it (and says why) when either limit is
    /// reached.
    pub fn admit(
        self: &Arc<Self>,
        ip: Option<IpAddr>,
        max_open: usize,
        max_per_ip: usize,
    ) -> Result<Admission, String> {
        let mut per_ip = self.per_ip.lock().unwrap_or_else(PoisonError::into_inner);
        let open = self.open.load(Ordering::Relaxed);
        let from_ip = ip.and_then(|a| per_ip.get(&a).copied()).unwrap_or(0);
        let why = if open >= max_open {
            Some(format!("{open} connections open (max_connections)"))
        } else if from_ip >= max_per_ip {
            Some(format!(
                "{from_ip} connections open from this address (max_connections_per_ip)"
            ))
        } else {
            None
        };
        if let Some(why) = why {
            drop(per_ip);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(why);
        }
        self.open.fetch_add(1, Ordering::Relaxed);
        if let Some(a) = ip {
            *per_ip.entry(a).or_insert(0) += 1;
        }
        Ok(Admission {
            limits: self.clone(),
            ip,
        })
    }

    /// Whether a refusal should be logged now (at most once per few seconds).
    pub fn warn_now(&self) -> bool {
        let mut last = self
            .last_warn
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < WARN_EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.limits.open.fetch_sub(1, Ordering::Relaxed);
        if let Some(a) = self.ip {
            let mut per_ip = self
                .limits
                .per_ip
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(n) = per_ip.get_mut(&a) {
                *n -= 1;
                if *n == 0 {
                    per_ip.remove(&a);
                }
            }
        }
    }
}

/// One connection's share of the queued bytes; given back when dropped.
pub(crate) struct Charge {
    limits: Arc<Limits>,
    held: usize,
}

impl Charge {
    pub fn new(limits: Arc<Limits>) -> Charge {
        Charge { limits, held: 0 }
    }

    /// The connection now holds `bytes`.
    pub fn set(&mut self, bytes: usize) {
        if bytes == self.held {
            // No write to the line every loop shares.
            return;
        }
        if bytes > self.held {
            self.limits
                .queued
                .fetch_add(bytes - self.held, Ordering::Relaxed);
        } else {
            self.limits
                .queued
                .fetch_sub(self.held - bytes, Ordering::Relaxed);
        }
        self.held = bytes;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admissions_count_in_total_and_per_address_and_are_given_back() {
        let l = Arc::new(Limits::default());
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = l.admit(Some(a), 3, 2).unwrap();
        let _a2 = l.admit(Some(a), 3, 2).unwrap();
        assert!(l.admit(Some(a), 3, 2).err().unwrap().contains("per_ip"));
        let _b1 = l.admit(Some(b), 3, 2).unwrap();
        assert!(l
            .admit(Some(b), 3, 2)
            .err()
            .unwrap()
            .contains("max_connections)"));
        assert_eq!((l.open(), l.refused()), (3, 2));
        drop(a1);
        assert!(l.admit(Some(a), 3, 2).is_ok());
    }

    #[test]
    fn charges_add_up_and_are_given_back_on_drop() {
        let l = Arc::new(Limits::default());
        let mut c1 = Charge::new(l.clone());
        let mut c2 = Charge::new(l.clone());
        c1.set(100);
        c2.set(50);
        c1.set(30);
        assert_eq!(l.queued(), 80);
        drop(c2);
        assert_eq!(l.queued(), 30);
        drop(c1);
        assert_eq!(l.queued(), 0);
    }
}
