//! A walk over a request body before the codec decodes it. The codec sizes each array from the
//! count on the wire before reading a single element, so a frame claiming two billion elements
//! would make it allocate gigabytes (and abort the process). The walk touches every length and
//! count of the served versions (flexible ones' compact counts and tagged fields too) without
//! allocating, and refuses a body whose counts or lengths run past its end; after it, every
//! count the codec sees is backed by bytes.

use kafka_protocol::messages::ApiKey;

struct Walk<'a> {
    b: &'a [u8],
    at: usize,
}

type R = Result<(), String>;

impl Walk<'_> {
    fn skip(&mut self, n: usize, what: &str) -> R {
        match self.at.checked_add(n) {
            Some(end) if end <= self.b.len() => {
                self.at = end;
                Ok(())
            }
            _ => Err(format!(
                "{what} at byte {} needs {n} bytes, {} left",
                self.at,
                self.b.len() - self.at
            )),
        }
    }
    fn int(&mut self, n: usize, what: &str) -> Result<i64, String> {
        let start = self.at;
        self.skip(n, what)?;
        let mut v: i64 = if self.b[start] & 0x80 != 0 { -1 } else { 0 };
        for &x in &self.b[start..start + n] {
            v = (v << 8) | i64::from(x);
        }
        Ok(v)
    }
    fn i8(&mut self) -> R {
        self.skip(1, "int8")
    }
    fn i16(&mut self) -> R {
        self.skip(2, "int16")
    }
    fn i32(&mut self) -> R {
        self.skip(4, "int32")
    }
    fn i64(&mut self) -> R {
        self.skip(8, "int64")
    }
    fn string(&mut self, nullable: bool) -> R {
        let n = self.int(2, "string length")?;
        match n {
            -1 if nullable => Ok(()),
            n if n >= 0 => self.skip(n as usize, "string"),
            n => Err(format!("string length {n} at byte {}", self.at - 2)),
        }
    }
    fn bytes(&mut self, nullable: bool) -> R {
        let n = self.int(4, "bytes length")?;
        match n {
            -1 if nullable => Ok(()),
            n if n >= 0 => self.skip(n as usize, "bytes"),
            n => Err(format!("bytes length {n} at byte {}", self.at - 4)),
        }
    }
    fn array(&mut self, nullable: bool, mut each: impl FnMut(&mut Self) -> R) -> R {
        let at = self.at;
        let n = self.int(4, "array count")?;
        if n == -1 && nullable {
            return Ok(());
        }
        if n < 0 {
            return Err(format!("array count {n} at byte {at}"));
        }
        for _ in 0..n {
            let before = self.at;
            each(self)?;
            if self.at == before {
                return Err(format!("array at byte {at}: empty element"));
            }
        }
        Ok(())
    }
}

/// The compact (flexible-version) encoding: unsigned varint lengths and counts, stored plus one
/// (zero is null), and tagged fields after each structure.
impl Walk<'_> {
    fn uvarint(&mut self, what: &str) -> Result<u64, String> {
        let at = self.at;
        let mut v = 0u64;
        for shift in (0..35).step_by(7) {
            let byte = self.int(1, what)? as u8;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!("{what} at byte {at}: varint longer than 5 bytes"))
    }
    /// A compact length or count: None for null.
    fn compact_len(&mut self, nullable: bool, what: &str) -> Result<Option<usize>, String> {
        let at = self.at;
        match self.uvarint(what)? {
            0 if nullable => Ok(None),
            0 => Err(format!("{what} at byte {at} is null")),
            n => Ok(Some((n - 1) as usize)),
        }
    }
    fn compact_string(&mut self, nullable: bool) -> R {
        match self.compact_len(nullable, "compact string length")? {
            Some(n) => self.skip(n, "compact string"),
            None => Ok(()),
        }
    }
    fn compact_array(&mut self, nullable: bool, mut each: impl FnMut(&mut Self) -> R) -> R {
        let at = self.at;
        let Some(n) = self.compact_len(nullable, "compact array count")? else {
            return Ok(());
        };
        // Every element takes a byte at least: a count past the end is refused before the loop.
        if n > self.b.len() - self.at {
            return Err(format!(
                "compact array at byte {at}: {n} elements cannot fit"
            ));
        }
        for _ in 0..n {
            each(self)?;
        }
        Ok(())
    }
    fn tags(&mut self) -> R {
        let at = self.at;
        let n = self.uvarint("tagged field count")?;
        if n > (self.b.len() - self.at) as u64 {
            return Err(format!("{n} tagged fields at byte {at} cannot fit"));
        }
        for _ in 0..n {
            self.uvarint("tag")?;
            let len = self.uvarint("tagged field length")?;
            self.skip(len as usize, "tagged field")?;
        }
        Ok(())
    }
}

/// Ok when every count and length of the body (`b`, after the request header) is backed by bytes.
pub fn check(api: ApiKey, v: i16, b: &[u8]) -> R {
    let w = &mut Walk { b, at: 0 };
    match api {
        ApiKey::Produce => {
            if v >= 3 {
                w.string(true)?;
            }
            w.i16()?;
            w.i32()?;
            w.array(false, |w| {
                w.string(false)?;
                w.array(false, |w| {
                    w.i32()?;
                    w.bytes(true)
                })
            })
        }
        ApiKey::Fetch => {
            w.i32()?;
            w.i32()?;
            w.i32()?;
            w.i32()?;
            w.i8()?;
            if v >= 7 {
                w.i32()?;
                w.i32()?;
            }
            w.array(false, |w| {
                w.string(false)?;
                w.array(false, |w| {
                    w.i32()?;
                    if v >= 9 {
                        w.i32()?;
                    }
                    w.i64()?;
                    if v >= 5 {
                        w.i64()?;
                    }
                    w.i32()
                })
            })?;
            if v >= 7 {
                w.array(false, |w| {
                    w.string(false)?;
                    w.array(false, |w| w.i32())
                })?;
            }
            if v >= 11 {
                w.string(false)?;
            }
            Ok(())
        }
        ApiKey::ListOffsets => {
            w.i32()?;
            if v >= 2 {
                w.i8()?;
            }
            w.array(false, |w| {
                w.string(false)?;
                w.array(false, |w| {
                    w.i32()?;
                    if v >= 4 {
                        w.i32()?;
                    }
                    w.i64()
                })
            })
        }
        ApiKey::Metadata => w.array(v >= 1, |w| w.string(false)),
        ApiKey::OffsetCommit => {
            w.string(false)?;
            w.i32()?;
            w.string(false)?;
            if v >= 7 {
                w.string(true)?;
            }
            if v <= 4 {
                w.i64()?;
            }
            w.array(false, |w| {
                w.string(false)?;
                w.array(false, |w| {
                    w.i32()?;
                    w.i64()?;
                    if v >= 6 {
                        w.i32()?;
                    }
                    w.string(true)
                })
            })
        }
        ApiKey::OffsetFetch => {
            w.string(false)?;
            w.array(v >= 2, |w| {
                w.string(false)?;
                w.array(false, |w| w.i32())
            })
        }
        ApiKey::JoinGroup => {
            w.string(false)?;
            w.i32()?;
            if v >= 1 {
                w.i32()?;
            }
            w.string(false)?;
            if v >= 5 {
                w.string(true)?;
            }
            w.string(false)?;
            w.array(false, |w| {
                w.string(false)?;
                w.bytes(false)
            })
        }
        ApiKey::SyncGroup => {
            w.string(false)?;
            w.i32()?;
            w.string(false)?;
            if v >= 3 {
                w.string(true)?;
            }
            w.array(false, |w| {
                w.string(false)?;
                w.bytes(false)
            })
        }
        ApiKey::LeaveGroup => {
            w.string(false)?;
            if v >= 3 {
                w.array(false, |w| {
                    w.string(false)?;
                    w.string(true)
                })
            } else {
                w.string(false)
            }
        }
        ApiKey::CreateTopics => w.array(false, |w| {
            w.string(false)?;
            w.i32()?;
            w.i16()?;
            w.array(false, |w| {
                w.i32()?;
                w.array(false, |w| w.i32())
            })?;
            w.array(false, |w| {
                w.string(false)?;
                w.string(true)
            })
        }),
        ApiKey::DeleteTopics => w.array(false, |w| w.string(false)),
        ApiKey::CreatePartitions => w.array(false, |w| {
            w.string(false)?;
            w.i32()?;
            w.array(true, |w| w.array(false, |w| w.i32()))
        }),
        ApiKey::ListGroups => {
            if v >= 4 {
                w.compact_array(false, |w| w.compact_string(false))?;
            }
            if v >= 3 {
                w.tags()?;
            }
            Ok(())
        }
        ApiKey::DescribeGroups if v >= 5 => {
            w.compact_array(false, |w| w.compact_string(false))?;
            w.i8()?;
            w.tags()
        }
        ApiKey::DescribeGroups => w.array(false, |w| w.string(false)),
        ApiKey::DeleteGroups if v >= 2 => {
            w.compact_array(false, |w| w.compact_string(false))?;
            w.tags()
        }
        ApiKey::DeleteGroups => w.array(false, |w| w.string(false)),
        ApiKey::OffsetDelete => {
            w.string(false)?;
            w.array(false, |w| {
                w.string(false)?;
                w.array(false, |w| w.i32())
            })
        }
        ApiKey::DescribeCluster => {
            w.i8()?;
            if v >= 1 {
                w.i8()?;
            }
            w.tags()
        }
        ApiKey::OffsetForLeaderEpoch if v >= 4 => {
            w.i32()?;
            w.compact_array(false, |w| {
                w.compact_string(false)?;
                w.compact_array(false, |w| {
                    w.i32()?;
                    w.i32()?;
                    w.i32()?;
                    w.tags()
                })?;
                w.tags()
            })?;
            w.tags()
        }
        ApiKey::OffsetForLeaderEpoch => {
            if v >= 3 {
                w.i32()?;
            }
            w.array(false, |w| {
                w.string(false)?;
                w.array(false, |w| {
                    w.i32()?;
                    w.i32()?;
                    w.i32()
                })
            })
        }
        // Heartbeat, FindCoordinator, InitProducerId, ApiVersions: no counts in the served
        // versions; the codec's own bounds checks cover their strings.
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_counts_are_refused_before_decoding() {
        // Metadata v1 with a topic count of two billion and no topics.
        let body = 0x7fff_ffffi32.to_be_bytes();
        assert!(check(ApiKey::Metadata, 1, &body).is_err());
        assert!(check(ApiKey::Metadata, 1, &(-1i32).to_be_bytes()).is_ok());
        assert!(check(ApiKey::Metadata, 0, &(-1i32).to_be_bytes()).is_err());
        let mut ok = 1i32.to_be_bytes().to_vec();
        ok.extend(3i16.to_be_bytes());
        ok.extend(b"abc");
        assert!(check(ApiKey::Metadata, 1, &ok).is_ok());
        assert!(check(ApiKey::Metadata, 1, &ok[..ok.len() - 1]).is_err());
    }

    #[test]
    fn compact_counts_and_tagged_fields_are_walked() {
        // ListGroups v4: states filter ["Stable"], no tagged fields.
        let mut ok = vec![2, 7];
        ok.extend(b"Stable");
        ok.push(0);
        assert!(check(ApiKey::ListGroups, 4, &ok).is_ok());
        assert!(check(ApiKey::ListGroups, 4, &ok[..ok.len() - 1]).is_err());
        // A count of two billion (as a varint) with nothing behind it.
        assert!(check(ApiKey::ListGroups, 4, &[0xff, 0xff, 0xff, 0xff, 0x07, 0]).is_err());
        // A varint that never ends.
        assert!(check(ApiKey::ListGroups, 4, &[0xff; 8]).is_err());
        // DescribeCluster v0: a tagged field claiming more bytes than there are.
        assert!(check(ApiKey::DescribeCluster, 0, &[0, 0]).is_ok());
        assert!(check(ApiKey::DescribeCluster, 0, &[0, 1, 0, 9, 1]).is_err());
        assert!(check(ApiKey::DescribeCluster, 0, &[0, 1, 0, 1, 1]).is_ok());
    }
}
