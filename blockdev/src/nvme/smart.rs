//! The SMART / Health Information log page (Get Log Page 02h): what an operator checks before
//! trusting a drive with ack-after-flush, above all the critical warning bit for a failed
//! power-loss-protection (volatile memory backup) device.

/// The fields of the 512-byte log page nvmq reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmartLog {
    /// Byte 0: bit 0 spare below threshold, 1 temperature, 2 reliability degraded, 3 read-only,
    /// 4 volatile memory backup device failed, 5 persistent memory region read-only.
    pub critical_warning: u8,
    /// Composite temperature in kelvin (bytes 1–2).
    pub temperature_k: u16,
    /// Available spare, percent (byte 3).
    pub available_spare: u8,
    /// Percentage used of the rated endurance (byte 5).
    pub percentage_used: u8,
    /// Unsafe shutdowns (bytes 144–159, low 64 bits).
    pub unsafe_shutdowns: u64,
    /// Media and data integrity errors (bytes 160–175, low 64 bits).
    pub media_errors: u64,
}

const WARNINGS: [&str; 6] = [
    "available spare below threshold",
    "temperature out of range",
    "reliability degraded",
    "media read-only",
    "volatile memory backup (power-loss protection) failed",
    "persistent memory region read-only",
];

impl SmartLog {
    pub fn parse(page: &[u8]) -> SmartLog {
        let b = |i: usize| page.get(i).copied().unwrap_or(0);
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            for (k, v) in x.iter_mut().enumerate() {
                *v = b(i + k);
            }
            u64::from_le_bytes(x)
        };
        SmartLog {
            critical_warning: b(0),
            temperature_k: u16::from_le_bytes([b(1), b(2)]),
            available_spare: b(3),
            percentage_used: b(5),
            unsafe_shutdowns: u64_at(144),
            media_errors: u64_at(160),
        }
    }

    /// True when the drive says its power-loss protection failed: its "durable on completion"
    /// promise no longer holds.
    pub fn plp_failed(&self) -> bool {
        self.critical_warning & (1 << 4) != 0
    }

    /// The critical warning bits in words ("none" when clear).
    pub fn warnings(&self) -> String {
        let set: Vec<&str> = WARNINGS
            .iter()
            .enumerate()
            .filter(|(i, _)| self.critical_warning & (1 << i) != 0)
            .map(|(_, w)| *w)
            .collect();
        if set.is_empty() {
            "none".into()
        } else {
            set.join(", ")
        }
    }

    /// One line for reports.
    pub fn summary(&self) -> String {
        format!(
            "SMART critical warning 0x{:02x} ({}); {} °C; spare {}%; {}% used; {} unsafe shutdowns; {} media errors",
            self.critical_warning,
            self.warnings(),
            i32::from(self.temperature_k) - 273,
            self.available_spare,
            self.percentage_used,
            self.unsafe_shutdowns,
            self.media_errors
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_fields_and_names_a_failed_backup_device() {
        let mut page = [0u8; 512];
        page[0] = 0x10;
        page[1..3].copy_from_slice(&310u16.to_le_bytes());
        page[3] = 100;
        page[5] = 7;
        page[144..152].copy_from_slice(&3u64.to_le_bytes());
        page[160..168].copy_from_slice(&2u64.to_le_bytes());
        let s = SmartLog::parse(&page);
        assert!(s.plp_failed());
        assert_eq!(s.temperature_k, 310);
        assert_eq!((s.unsafe_shutdowns, s.media_errors), (3, 2));
        assert!(
            s.summary().contains("power-loss protection) failed"),
            "{}",
            s.summary()
        );
        assert!(s.summary().contains("37 °C"));
        let ok = SmartLog::parse(&[0u8; 512]);
        assert!(!ok.plp_failed());
        assert!(ok.summary().contains("0x00 (none)"));
        // A short page reads as zeros instead of panicking.
        assert_eq!(SmartLog::parse(&[0x01]).critical_warning, 1);
    }
}
