//! A walk over a request body before the codec decodes it. The codec sizes each array from the
//! count on the wire before reading a single element, so a frame claiming two billion elements
//! would make it allocate gigabytes (and abort the process). The walk touches every length and
//! count of the served versions (the flexible ones' compact forms too) without allocating, and refuses a body whose
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
    fn array(&mut self, nullable: bool, each: impl FnMut(&mut Self) -> R) -> R {
        let at = self.at;
        let n = self.int(4, "array count")?;
        if n == -1 && nullable {
            return Ok(());
        }
        if n < 0 {
            return Err(format!("array count {n} at byte {at}"));
        }
        self.elements(n as u64, at, each)
    }
    /// `n` elements of the array whose count was at byte `at`: each must take bytes (so that a
    /// count cannot make the walk loop on nothing).
    fn elements(&mut self, n: u64, at: usize, mut each: impl FnMut(&mut Self) -> R) -> R {
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

/// The flexible versions' (KIP-482) compact encodings: unsigned varint lengths and counts (plus
/// one; 0 is null) and tagged fields.
impl Walk<'_> {
    fn uvarint(&mut self) -> Result<u64, String> {
        let at = self.at;
        let mut v = 0u64;
        for shift in (0..35).step_by(7) {
            let Some(&b) = self.b.get(self.at) else {
                return Err(format!("varint at byte {at} runs past the end"));
            };
            self.at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!("varint at byte {at} is longer than 5 bytes"))
    }
    /// A compact string or bytes (their lengths are read the same way).
    fn compact(&mut self, nullable: bool, what: &str) -> R {
        let at = self.at;
        match self.uvarint()? {
            0 if nullable => Ok(()),
            0 => Err(format!("null {what} at byte {at}")),
            n => self.skip(n as usize - 1, what),
        }
    }
    fn carray(&mut self, nullable: bool, each: impl FnMut(&mut Self) -> R) -> R {
        let at = self.at;
        match self.uvarint()? {
            0 if nullable => Ok(()),
            0 => Err(format!("null array at byte {at}")),
            n => self.elements(n - 1, at, each),
        }
    }
    fn tagged(&mut self) -> R {
        let n = self.uvarint()?;
        for _ in 0..n {
            self.uvarint()?;
            let len = self.uvarint()?;
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
        ApiKey::DescribeUserScramCredentials => {
            w.carray(true, |w| {
                w.compact(false, "user name")?;
                w.tagged()
            })?;
            w.tagged()
        }
        ApiKey::AlterUserScramCredentials => {
            w.carray(false, |w| {
                w.compact(false, "user name")?;
                w.i8()?;
                w.tagged()
            })?;
            w.carray(false, |w| {
                w.compact(false, "user name")?;
                w.i8()?;
                w.i32()?;
                w.compact(false, "salt")?;
                w.compact(false, "salted password")?;
                w.tagged()
            })?;
            w.tagged()
        }
        // Heartbeat, FindCoordinator, InitProducerId, ApiVersions, SaslHandshake,
        // SaslAuthenticate: no counts in the served
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
    fn absurd_compact_counts_are_refused_before_decoding() {
        let api = ApiKey::AlterUserScramCredentials;
        // Deletions: a varint count of about 2^32 and nothing behind it.
        assert!(check(api, 0, &[0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
        // A varint longer than five bytes.
        assert!(check(api, 0, &[0xff, 0xff, 0xff, 0xff, 0xff, 0x01]).is_err());
        // No deletions, one upsertion (user "u", SHA-256, 4096 iterations, 1-byte salt and
        // salted password), no tagged fields.
        let mut ok = vec![1, 2, 2, b'u', 1];
        ok.extend(4096i32.to_be_bytes());
        ok.extend([2, 9, 2, 9, 0, 0]);
        assert!(check(api, 0, &ok).is_ok());
        assert!(check(api, 0, &ok[..ok.len() - 1]).is_err());
        // Describe: null (every user) or a list of names.
        let d = ApiKey::DescribeUserScramCredentials;
        assert!(check(d, 0, &[0, 0]).is_ok());
        assert!(check(d, 0, &[2, 2, b'u', 0, 0]).is_ok());
        assert!(check(d, 0, &[0x80, 0x80, 0x80, 0x80, 0x08, 0]).is_err());
        // A tagged field longer than the body.
        assert!(check(d, 0, &[0, 1, 0, 100]).is_err());
    }
}
