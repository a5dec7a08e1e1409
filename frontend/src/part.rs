//! Partitions across devices: a broker has one log per device, and each topic partition lives in
//! exactly one of them, under that log's own partition id.

use std::fmt;

/// A partition as the broker names it: the device whose log holds it, and its id in that log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartRef {
    pub dev: u16,
    pub id: u32,
}

impl PartRef {
    pub fn new(dev: u16, id: u32) -> PartRef {
        PartRef { dev, id }
    }

    /// The device's index, for indexing the broker's logs.
    pub fn device(self) -> usize {
        usize::from(self.dev)
    }
}

impl fmt::Display for PartRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.dev, self.id)
    }
}

/// The device a new partition `index` of `topic` goes to: round-robin from a start that depends
/// on the name, so that one topic's partitions spread over every device and small topics do not
/// all start on the first one. Only creation asks; a partition's device is recorded by where it
/// was created (a restart finds it in that device's registry).
pub fn place(topic: &str, index: u32, devices: usize) -> u16 {
    if devices <= 1 {
        return 0;
    }
    // FNV-1a: stable across builds and platforms, unlike the std hasher.
    let h = topic.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    ((h.wrapping_add(u64::from(index))) % devices as u64) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topics_partitions_spread_over_every_device() {
        for devices in 1..5 {
            let mut seen = vec![0; devices];
            for i in 0..(4 * devices as u32) {
                seen[usize::from(place("orders", i, devices))] += 1;
            }
            assert!(seen.iter().all(|&n| n == 4), "{devices}: {seen:?}");
        }
        assert_eq!(place("any", 7, 1), 0);
        assert_eq!(place("same", 3, 2), place("same", 3, 2));
    }
}
