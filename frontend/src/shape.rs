//! A walk over a request body before the codec decodes it. The codec sizes each array from the
//! count on the wire before reading a single element, so a frame claiming two billion elements
//! would make it allocate gigabytes (and abort the process). The walk touches every length and
//! count of the served versions, flexible ones too (varint lengths, tagged fields), without
//! allocating, and refuses a body whose counts or lengths run past its end; after it, every
//! count the codec sees is backed by bytes.

use kafka_protocol::messages::ApiKey;

mod admin_walks;

struct Walk<'a> {
    b: &'a [u8],
    at: usize,
    /// A flexible version: compact strings, bytes and arrays (unsigned varint lengths, plus
    /// one), and tagged fields after every struct.
    flex: bool,
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
    /// An unsigned varint of at most 32 bits, as the codec reads them.
    fn uvarint(&mut self, what: &str) -> Result<u32, String> {
        let start = self.at;
        let mut v: u64 = 0;
        for i in 0..5 {
            let Some(&x) = self.b.get(self.at) else {
                return Err(format!("{what} at byte {start}: the varint ends early"));
            };
            self.at += 1;
            v |= u64::from(x & 0x7f) << (7 * i);
            if x & 0x80 == 0 {
                return u32::try_from(v)
                    .map_err(|_| format!("{what} at byte {start}: varint {v} exceeds 32 bits"));
            }
        }
        Err(format!(
            "{what} at byte {start}: varint longer than 5 bytes"
        ))
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
    fn uuid(&mut self) -> R {
        self.skip(16, "uuid")
    }
    /// A length (strings: int16, bytes: int32; compact: varint less one), None for null.
    fn len(&mut self, wide: usize, nullable: bool, what: &str) -> Result<Option<usize>, String> {
        let at = self.at;
        let n = if self.flex {
            i64::from(self.uvarint(what)?) - 1
        } else {
            self.int(wide, what)?
        };
        match n {
            -1 if nullable => Ok(None),
            n if n >= 0 => Ok(Some(n as usize)),
            n => Err(format!("{what} {n} at byte {at}")),
        }
    }
    fn string(&mut self, nullable: bool) -> R {
        match self.len(2, nullable, "string length")? {
            Some(n) => self.skip(n, "string"),
            None => Ok(()),
        }
    }
    fn bytes(&mut self, nullable: bool) -> R {
        match self.len(4, nullable, "bytes length")? {
            Some(n) => self.skip(n, "bytes"),
            None => Ok(()),
        }
    }
    /// An array of primitives.
    fn array(&mut self, nullable: bool, mut each: impl FnMut(&mut Self) -> R) -> R {
        let at = self.at;
        let Some(n) = self.len(4, nullable, "array count")? else {
            return Ok(());
        };
        for _ in 0..n {
            let before = self.at;
            each(self)?;
            if self.at == before {
                return Err(format!("array at byte {at}: empty element"));
            }
        }
        Ok(())
    }
    /// An array of structs: in flexible versions each ends with its tagged fields.
    fn structs(&mut self, nullable: bool, mut each: impl FnMut(&mut Self) -> R) -> R {
        self.array(nullable, |w| {
            each(w)?;
            w.tags()
        })
    }
    /// The tagged fields ending a struct (flexible versions), none of them known.
    fn tags(&mut self) -> R {
        self.tags_with(|_, _| Ok(false))
    }
    /// Tagged fields; `known` walks a tag the codec decodes by its type (true) rather than
    /// skipping its size, which must then be exactly what the walk took: otherwise the codec
    /// would read on from a place the walk never checked.
    fn tags_with(&mut self, mut known: impl FnMut(&mut Self, u32) -> Result<bool, String>) -> R {
        if !self.flex {
            return Ok(());
        }
        let n = self.uvarint("tagged field count")?;
        for _ in 0..n {
            let tag = self.uvarint("tag")?;
            let size = self.uvarint("tagged field size")? as usize;
            let start = self.at;
            if !known(self, tag)? {
                self.skip(size, "tagged field")?;
            } else if self.at - start != size {
                return Err(format!(
                    "tagged field {tag} at byte {start} claims {size} bytes and holds {}",
                    self.at - start
                ));
            }
        }
        Ok(())
    }
}

/// Ok when every count and length of the body (`b`, after the request header) is backed by bytes.
pub fn check(api: ApiKey, v: i16, b: &[u8]) -> R {
    walked(api, v, b).map(|_| ())
}

/// The bytes of the body the walk took.
fn walked(api: ApiKey, v: i16, b: &[u8]) -> Result<usize, String> {
    let flex = api.request_header_version(v) >= 2;
    let w = &mut Walk { b, at: 0, flex };
    if api == ApiKey::Fetch {
        // Its top-level tagged fields hold fields the codec decodes by type.
        fetch(v, w)?;
    } else {
        walk(api, v, w)?;
        w.tags()?;
    }
    Ok(w.at)
}

/// The body's fields up to its top-level tagged fields.
fn walk(api: ApiKey, v: i16, w: &mut Walk<'_>) -> R {
    match api {
        ApiKey::Produce => {
            if v >= 3 {
                w.string(true)?;
            }
            w.i16()?;
            w.i32()?;
            w.structs(false, |w| {
                if v >= 13 {
                    w.uuid()?;
                } else {
                    w.string(false)?;
                }
                w.structs(false, |w| {
                    w.i32()?;
                    w.bytes(true)
                })
            })
        }
        ApiKey::ListOffsets => {
            w.i32()?;
            if v >= 2 {
                w.i8()?;
            }
            w.structs(false, |w| {
                w.string(false)?;
                w.structs(false, |w| {
                    w.i32()?;
                    if v >= 4 {
                        w.i32()?;
                    }
                    w.i64()
                })
            })?;
            if v >= 10 {
                w.i32()?;
            }
            Ok(())
        }
        ApiKey::Metadata => {
            w.structs(v >= 1, |w| {
                if v >= 10 {
                    w.uuid()?;
                }
                w.string(v >= 10)
            })?;
            if v >= 4 {
                w.i8()?;
            }
            if v >= 8 {
                w.skip(if v <= 10 { 2 } else { 1 }, "booleans")?;
            }
            Ok(())
        }
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
            w.structs(false, |w| {
                w.string(false)?;
                w.structs(false, |w| {
                    w.i32()?;
                    w.i64()?;
                    if v >= 6 {
                        w.i32()?;
                    }
                    w.string(true)
                })
            })
        }
        ApiKey::OffsetFetch if v >= 8 => {
            w.structs(false, |w| {
                w.string(false)?;
                if v >= 9 {
                    w.string(true)?;
                    w.i32()?;
                }
                w.structs(true, |w| {
                    w.string(false)?;
                    w.array(false, |w| w.i32())
                })
            })?;
            w.i8()
        }
        ApiKey::OffsetFetch => {
            w.string(false)?;
            w.structs(v >= 2, |w| {
                w.string(false)?;
                w.array(false, |w| w.i32())
            })?;
            if v >= 7 {
                w.i8()?;
            }
            Ok(())
        }
        ApiKey::FindCoordinator => {
            if v <= 3 {
                w.string(false)?;
            }
            if v >= 1 {
                w.i8()?;
            }
            if v >= 4 {
                w.array(false, |w| w.string(false))?;
            }
            Ok(())
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
            w.structs(false, |w| {
                w.string(false)?;
                w.bytes(false)
            })?;
            if v >= 8 {
                w.string(true)?;
            }
            Ok(())
        }
        ApiKey::Heartbeat => {
            w.string(false)?;
            w.i32()?;
            w.string(false)?;
            if v >= 3 {
                w.string(true)?;
            }
            Ok(())
        }
        ApiKey::SyncGroup => {
            w.string(false)?;
            w.i32()?;
            w.string(false)?;
            if v >= 3 {
                w.string(true)?;
            }
            if v >= 5 {
                w.string(true)?;
                w.string(true)?;
            }
            w.structs(false, |w| {
                w.string(false)?;
                w.bytes(false)
            })
        }
        ApiKey::LeaveGroup => {
            w.string(false)?;
            if v >= 3 {
                w.structs(false, |w| {
                    w.string(false)?;
                    w.string(true)?;
                    if v >= 5 {
                        w.string(true)?;
                    }
                    Ok(())
                })
            } else {
                w.string(false)
            }
        }
        ApiKey::ApiVersions if v >= 3 => {
            w.string(false)?;
            w.string(false)
        }
        ApiKey::CreateTopics => {
            w.structs(false, |w| {
                w.string(false)?;
                w.i32()?;
                w.i16()?;
                w.structs(false, |w| {
                    w.i32()?;
                    w.array(false, |w| w.i32())
                })?;
                w.structs(false, |w| {
                    w.string(false)?;
                    w.string(true)
                })
            })?;
            w.i32()?;
            w.i8()
        }
        ApiKey::DeleteTopics => {
            if v >= 6 {
                w.structs(false, |w| {
                    w.string(true)?;
                    w.uuid()
                })?;
            } else {
                w.array(false, |w| w.string(false))?;
            }
            w.i32()
        }
        ApiKey::CreatePartitions => {
            w.structs(false, |w| {
                w.string(false)?;
                w.i32()?;
                w.structs(true, |w| w.array(false, |w| w.i32()))
            })?;
            w.i32()?;
            w.i8()
        }
        ApiKey::InitProducerId => {
            w.string(true)?;
            w.i32()?;
            if v >= 3 {
                w.i64()?;
                w.i16()?;
            }
            Ok(())
        }
        // The ACL creations, and the describe and delete filters (v1+: with a pattern type).
        ApiKey::CreateAcls | ApiKey::DeleteAcls | ApiKey::DescribeAcls => {
            let nullable = api != ApiKey::CreateAcls;
            let acl = |w: &mut Walk<'_>| {
                w.i8()?;
                w.string(nullable)?;
                w.i8()?;
                w.string(nullable)?;
                w.string(nullable)?;
                w.i8()?;
                w.i8()
            };
            if api == ApiKey::DescribeAcls {
                acl(w)
            } else {
                w.structs(false, acl)
            }
        }
        ApiKey::DescribeConfigs
        | ApiKey::AlterConfigs
        | ApiKey::IncrementalAlterConfigs
        | ApiKey::DeleteRecords
        | ApiKey::DescribeLogDirs => admin_walks::walk(api, v, w),
        ApiKey::SaslHandshake => w.string(false),
        ApiKey::SaslAuthenticate => w.bytes(false),
        ApiKey::DescribeUserScramCredentials => w.structs(true, |w| w.string(false)),
        ApiKey::AlterUserScramCredentials => {
            w.structs(false, |w| {
                w.string(false)?;
                w.i8()
            })?;
            w.structs(false, |w| {
                w.string(false)?;
                w.i8()?;
                w.i32()?;
                w.bytes(false)?;
                w.bytes(false)
            })
        }
        ApiKey::ListGroups => {
            // v4's states filter, then v5's types filter.
            for since in [4, 5] {
                if v >= since {
                    w.array(false, |w| w.string(false))?;
                }
            }
            Ok(())
        }
        ApiKey::DescribeGroups => {
            w.array(false, |w| w.string(false))?;
            if v >= 3 {
                w.i8()?;
            }
            Ok(())
        }
        ApiKey::DeleteGroups => w.array(false, |w| w.string(false)),
        ApiKey::OffsetDelete => {
            w.string(false)?;
            w.structs(false, |w| {
                w.string(false)?;
                w.structs(false, |w| w.i32())
            })
        }
        ApiKey::DescribeCluster => {
            // include_cluster_authorized_operations, v1's endpoint type, v2's
            // include_fenced_brokers.
            for since in [0, 1, 2] {
                if v >= since {
                    w.i8()?;
                }
            }
            Ok(())
        }
        ApiKey::OffsetForLeaderEpoch => {
            if v >= 3 {
                w.i32()?;
            }
            w.structs(false, |w| {
                w.string(false)?;
                w.structs(false, |w| {
                    w.i32()?;
                    w.i32()?;
                    w.i32()
                })
            })
        }
        ApiKey::DescribeQuorum => w.structs(false, |w| {
            w.string(false)?;
            w.structs(false, |w| w.i32())
        }),
        // ApiVersions v0-2: an empty body (Fetch: `fetch`). Every field is walked, so that in
        // flexible versions the tagged fields are found where the codec reads them.
        _ => Ok(()),
    }
}

/// Fetch: v13+ name topics by id; v15+ moved the replica id into a tagged field.
fn fetch(v: i16, w: &mut Walk<'_>) -> R {
    if v <= 14 {
        w.i32()?;
    }
    w.i32()?;
    w.i32()?;
    w.i32()?;
    w.i8()?;
    if v >= 7 {
        w.i32()?;
        w.i32()?;
    }
    w.structs(false, |w| {
        if v >= 13 {
            w.uuid()?;
        } else {
            w.string(false)?;
        }
        w.array(false, |w| {
            w.i32()?;
            if v >= 9 {
                w.i32()?;
            }
            w.i64()?;
            if v >= 12 {
                w.i32()?;
            }
            if v >= 5 {
                w.i64()?;
            }
            w.i32()?;
            // Replica directory id (v17+), the replica's high watermark (v18+).
            w.tags_with(|w, tag| match tag {
                0 if v >= 17 => w.uuid().map(|()| true),
                1 if v >= 18 => w.i64().map(|()| true),
                0 | 1 => Err(format!("tag {tag} is not valid in Fetch v{v}")),
                _ => Ok(false),
            })
        })
    })?;
    if v >= 7 {
        w.structs(false, |w| {
            if v >= 13 {
                w.uuid()?;
            } else {
                w.string(false)?;
            }
            w.array(false, |w| w.i32())
        })?;
    }
    if v >= 11 {
        w.string(false)?;
    }
    // The cluster id (a nullable string) and, v15+, the replica state (id, epoch, tags).
    w.tags_with(|w, tag| match tag {
        0 => w.string(true).map(|()| true),
        1 if v >= 15 => {
            w.i32()?;
            w.i64()?;
            w.tags().map(|()| true)
        }
        1 => Err(format!("tag 1 is not valid in Fetch v{v}")),
        _ => Ok(false),
    })
}

#[cfg(test)]
#[path = "shape_tests.rs"]
mod tests;
