//! Parsing the Identify Controller and Identify Namespace data structures (4 KiB each).

/// The Identify Controller fields the driver uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerId {
    pub vendor: u16,
    pub serial: String,
    pub model: String,
    pub firmware: String,
    /// Maximum Data Transfer Size as a power of two of the minimum page size; 0 = no limit.
    pub mdts: u8,
    /// Number of namespaces (highest NSID).
    pub nn: u32,
    /// Volatile Write Cache byte: bit 0 = a volatile write cache is present.
    pub vwc: u8,
    /// Atomic Write Unit Power Fail, 0's based, in logical blocks.
    pub awupf: u16,
}

impl ControllerId {
    pub fn parse(d: &[u8; 4096]) -> ControllerId {
        ControllerId {
            vendor: le16(d, 0),
            serial: ascii(&d[4..24]),
            model: ascii(&d[24..64]),
            firmware: ascii(&d[64..72]),
            mdts: d[77],
            nn: le32(d, 516),
            vwc: d[525],
            awupf: le16(d, 528),
        }
    }

    pub fn cache_present(&self) -> bool {
        self.vwc & 1 == 1
    }

    /// Largest transfer in bytes, or None for no limit.
    pub fn max_transfer(&self, min_page: usize) -> Option<usize> {
        (self.mdts != 0).then(|| {
            min_page
                .checked_shl(u32::from(self.mdts))
                .unwrap_or(usize::MAX)
        })
    }
}

/// One LBA format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LbaFormat {
    /// Metadata bytes per block.
    pub ms: u16,
    /// Block size as a power of two.
    pub lbads: u8,
}

/// The Identify Namespace fields the driver uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceId {
    /// Size in logical blocks; zero for an inactive namespace.
    pub nsze: u64,
    pub nsfeat: u8,
    pub nlbaf: u8,
    pub flbas: u8,
    pub nawupf: u16,
    pub npwg: u16,
    pub formats: [LbaFormat; 16],
}

impl NamespaceId {
    pub fn parse(d: &[u8; 4096]) -> NamespaceId {
        let mut formats = [LbaFormat { ms: 0, lbads: 0 }; 16];
        for (i, f) in formats.iter_mut().enumerate() {
            let v = le32(d, 128 + 4 * i);
            *f = LbaFormat {
                ms: v as u16,
                lbads: (v >> 16) as u8,
            };
        }
        NamespaceId {
            nsze: le64(d, 0),
            nsfeat: d[24],
            nlbaf: d[25],
            flbas: d[26],
            nawupf: le16(d, 36),
            npwg: le16(d, 64),
            formats,
        }
    }

    /// The format in use (FLBAS bits 3:0).
    pub fn active_format(&self) -> LbaFormat {
        self.formats[usize::from(self.flbas & 0xF)]
    }

    /// NAWUPF is valid (NSFEAT bit 1, NSABP).
    pub fn has_atomic_params(&self) -> bool {
        self.nsfeat >> 1 & 1 == 1
    }

    /// NPWG and friends are valid (NSFEAT bit 4, OPTPERF).
    pub fn has_perf_params(&self) -> bool {
        self.nsfeat >> 4 & 1 == 1
    }
}

fn le16(d: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([d[at], d[at + 1]])
}

fn le32(d: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([d[at], d[at + 1], d[at + 2], d[at + 3]])
}

fn le64(d: &[u8], at: usize) -> u64 {
    u64::from(le32(d, at)) | u64::from(le32(d, at + 4)) << 32
}

/// Space-padded ASCII, trimmed; anything else shown as '?'.
fn ascii(b: &[u8]) -> String {
    b.iter()
        .map(|&c| {
            if (0x20..0x7F).contains(&c) {
                c as char
            } else {
                '?'
            }
        })
        .collect::<String>()
        .trim_end_matches([' ', '?'])
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_fields_come_from_their_offsets() {
        let mut d = [0u8; 4096];
        d[0..2].copy_from_slice(&0x1b36u16.to_le_bytes());
        d[4..24].copy_from_slice(b"SERIAL-1            ");
        d[24..64].copy_from_slice(b"QEMU NVMe Ctrl                          ");
        d[64..72].copy_from_slice(b"7.2.22  ");
        d[77] = 7;
        d[516..520].copy_from_slice(&256u32.to_le_bytes());
        d[525] = 0x07;
        d[528..530].copy_from_slice(&3u16.to_le_bytes());
        let c = ControllerId::parse(&d);
        assert_eq!(c.vendor, 0x1b36);
        assert_eq!(c.serial, "SERIAL-1");
        assert_eq!(c.model, "QEMU NVMe Ctrl");
        assert_eq!(c.firmware, "7.2.22");
        assert_eq!(c.max_transfer(4096), Some(512 << 10));
        assert_eq!(c.nn, 256);
        assert!(c.cache_present());
        assert_eq!(c.awupf, 3);
        d[77] = 0;
        d[525] = 0x06;
        let c = ControllerId::parse(&d);
        assert_eq!(c.max_transfer(4096), None);
        assert!(!c.cache_present());
    }

    #[test]
    fn namespace_fields_and_the_active_format() {
        let mut d = [0u8; 4096];
        d[0..8].copy_from_slice(&1000u64.to_le_bytes());
        d[24] = 0b1_0010;
        d[25] = 1;
        d[26] = 1;
        d[36..38].copy_from_slice(&7u16.to_le_bytes());
        d[64..66].copy_from_slice(&3u16.to_le_bytes());
        d[128..132].copy_from_slice(&(9u32 << 16).to_le_bytes());
        d[132..136].copy_from_slice(&(12u32 << 16 | 8).to_le_bytes());
        let n = NamespaceId::parse(&d);
        assert_eq!(n.nsze, 1000);
        assert_eq!(n.active_format(), LbaFormat { ms: 8, lbads: 12 });
        assert_eq!(n.formats[0], LbaFormat { ms: 0, lbads: 9 });
        assert!(n.has_atomic_params() && n.has_perf_params());
        assert_eq!((n.nawupf, n.npwg), (7, 3));
    }
}
