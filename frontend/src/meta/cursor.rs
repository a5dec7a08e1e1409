//! Reading a record's bytes in order, each read refusing (by byte position) what the record
//! does not hold.

use crate::sasl::ScramMechanism;

pub(crate) struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(b: &'a [u8]) -> Cursor<'a> {
        Cursor { b, at: 0 }
    }
    /// Ok once every byte was read: a record is all of its bytes, nothing after.
    pub(crate) fn finish(&self) -> Result<(), String> {
        match self.b.len() - self.at {
            0 => Ok(()),
            n => Err(format!("{n} trailing bytes")),
        }
    }
    pub(crate) fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| format!("truncated at byte {} (wanted {n} more)", self.at))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    /// A count of items that take at least `min_len` bytes each: one beyond the record is
    /// corrupt (and must not size an allocation).
    pub(crate) fn count(&mut self, min_len: usize, what: &str) -> Result<usize, String> {
        let n = self.i32()? as u32 as usize;
        if n > self.b.len() / min_len {
            return Err(format!("{n} {what} cannot fit {} bytes", self.b.len()));
        }
        Ok(n)
    }
    pub(crate) fn i16(&mut self) -> Result<i16, String> {
        let s = self.take(2)?;
        Ok(i16::from_be_bytes([s[0], s[1]]))
    }
    pub(crate) fn i32(&mut self) -> Result<i32, String> {
        let s = self.take(4)?;
        Ok(i32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
    pub(crate) fn i64(&mut self) -> Result<i64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(i64::from_be_bytes(a))
    }
    pub(crate) fn bytes(&mut self) -> Result<Vec<u8>, String> {
        let s = self.take(2)?;
        let n = usize::from(u16::from_be_bytes([s[0], s[1]]));
        Ok(self.take(n)?.to_vec())
    }
    pub(crate) fn mechanism(&mut self) -> Result<ScramMechanism, String> {
        let c = self.u8()?;
        ScramMechanism::from_code(c as i8).ok_or_else(|| format!("unknown SCRAM mechanism {c}"))
    }
    pub(crate) fn str(&mut self) -> Result<String, String> {
        let s = self.take(2)?;
        let n = usize::from(u16::from_be_bytes([s[0], s[1]]));
        let at = self.at;
        String::from_utf8(self.take(n)?.to_vec())
            .map_err(|_| format!("string at byte {at} is not UTF-8"))
    }
}
