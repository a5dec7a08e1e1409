//! A walk over a request body before the codec decodes it. The codec sizes each array from the
//! count on the wire before reading a single element, so a frame claiming two billion elements
//! would make it allocate gigabytes (and abort the process). The walk touches every length and
//! count of the served (non-flexible) versions without allocating, and refuses a body whose
//! counts or lengths run past its end; after it, every count the codec sees is backed by bytes.

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

    /// An unsigned varint (flexible versions' counts and lengths).
    fn uvarint(&mut self, what: &str) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..35).step_by(7) {
            let at = self.at;
            self.skip(1, what)?;
            let byte = self.b[at];
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!(
            "{what} at byte {}: varint longer than 5 bytes",
            self.at
        ))
    }
    /// A compact string (length + 1; 0 is null).
    fn cstring(&mut self, nullable: bool) -> R {
        match self.uvarint("compact string length")? {
            0 if nullable => Ok(()),
            0 => Err(format!("null string at byte {}", self.at - 1)),
            n => self.skip((n - 1) as usize, "compact string"),
        }
    }
    /// A compact array (count + 1; 0 is null).
    fn carray(&mut self, mut each: impl FnMut(&mut Self) -> R) -> R {
        let at = self.at;
        let n = self.uvarint("compact array count")?;
        for _ in 1..n {
            let before = self.at;
            each(self)?;
            if self.at == before {
                return Err(format!("array at byte {at}: empty element"));
            }
        }
        Ok(())
    }
    /// A tagged-field section: a count, then (tag, size, bytes) each.
    fn tags(&mut self) -> R {
        let n = self.uvarint("tagged field count")?;
        for _ in 0..n {
            self.uvarint("tag")?;
            let size = self.uvarint("tagged field size")?;
            self.skip(size as usize, "tagged field")?;
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
        // The ACL creations and deletion filters (v2 on: flexible).
        ApiKey::CreateAcls | ApiKey::DeleteAcls => {
            let create = api == ApiKey::CreateAcls;
            let element = |w: &mut Walk<'_>| {
                let flexible = v >= 2;
                let string = |w: &mut Walk<'_>, nullable| match flexible {
                    true => w.cstring(nullable),
                    false => w.string(nullable),
                };
                w.i8()?;
                string(w, !create)?;
                w.i8()?;
                string(w, !create)?;
                string(w, !create)?;
                w.i8()?;
                w.i8()?;
                if flexible {
                    w.tags()?;
                }
                Ok(())
            };
            if v >= 2 {
                w.carray(element)?;
                w.tags()
            } else {
                w.array(false, element)
            }
        }
        // Heartbeat, FindCoordinator, InitProducerId, ApiVersions, DescribeAcls: no counts in
        // the served versions; the codec's own bounds checks cover their strings.
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
}
