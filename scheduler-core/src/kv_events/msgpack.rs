//! A small, bounded MessagePack reader: just what the KV event decoder needs.
//!
//! It reads one value at a time from a byte slice and never allocates; lengths are checked
//! against the bytes left before anything is sliced, and skipping an unknown value is
//! limited in nesting depth ([`MAX_DEPTH`]) and in elements visited ([`MAX_SKIPPED`]), so a
//! hostile payload costs at most linear time and no stack beyond the depth bound.

use super::KvDecodeError;

/// Deepest nesting skipped inside an unknown field (vLLM's deepest is 3: `extra_keys`).
pub(crate) const MAX_DEPTH: u32 = 16;

/// Most values visited while skipping the unknown fields of one payload.
pub(crate) const MAX_SKIPPED: u32 = 1 << 20;

/// The kind of the next value, with its inline payload or length.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Head {
    Nil,
    Bool,
    /// An integer that fits `u64`.
    Uint(u64),
    /// A negative integer.
    Int(i64),
    Float(f64),
    /// A UTF-8 string of this many bytes (not yet read).
    Str(usize),
    /// A byte string of this many bytes (not yet read).
    Bin(usize),
    /// An array of this many values.
    Array(usize),
    /// A map of this many key/value pairs.
    Map(usize),
    /// An extension value of this many bytes (type byte consumed).
    Ext(usize),
}

/// A cursor over a MessagePack byte slice.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    skipped: u32,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader {
            buf,
            pos: 0,
            skipped: 0,
        }
    }

    /// Bytes not yet read.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], KvDecodeError> {
        let end = self.pos.checked_add(n).ok_or(KvDecodeError::Truncated)?;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or(KvDecodeError::Truncated)?;
        self.pos = end;
        Ok(s)
    }

    fn byte(&mut self) -> Result<u8, KvDecodeError> {
        Ok(self.take(1)?.first().copied().unwrap_or(0))
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], KvDecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn len8(&mut self) -> Result<usize, KvDecodeError> {
        Ok(usize::from(self.byte()?))
    }
    fn len16(&mut self) -> Result<usize, KvDecodeError> {
        Ok(usize::from(u16::from_be_bytes(self.be()?)))
    }
    fn len32(&mut self) -> Result<usize, KvDecodeError> {
        usize::try_from(u32::from_be_bytes(self.be()?)).map_err(|_| KvDecodeError::TooLarge)
    }

    /// Reads the head of the next value. Lengths of strings, byte strings and extensions
    /// are checked against the bytes left; element counts of arrays and maps against the
    /// bytes left too (every element takes at least one byte).
    pub(crate) fn head(&mut self) -> Result<Head, KvDecodeError> {
        let m = self.byte()?;
        let h = match m {
            0x00..=0x7f => Head::Uint(u64::from(m)),
            0x80..=0x8f => Head::Map(usize::from(m & 0x0f)),
            0x90..=0x9f => Head::Array(usize::from(m & 0x0f)),
            0xa0..=0xbf => Head::Str(usize::from(m & 0x1f)),
            0xc0 => Head::Nil,
            0xc2 | 0xc3 => Head::Bool,
            0xc4 => Head::Bin(self.len8()?),
            0xc5 => Head::Bin(self.len16()?),
            0xc6 => Head::Bin(self.len32()?),
            0xc7 => {
                let n = self.len8()?;
                self.take(1)?;
                Head::Ext(n)
            }
            0xc8 => {
                let n = self.len16()?;
                self.take(1)?;
                Head::Ext(n)
            }
            0xc9 => {
                let n = self.len32()?;
                self.take(1)?;
                Head::Ext(n)
            }
            0xca => Head::Float(f64::from(f32::from_be_bytes(self.be()?))),
            0xcb => Head::Float(f64::from_be_bytes(self.be()?)),
            0xcc => Head::Uint(u64::from(self.byte()?)),
            0xcd => Head::Uint(u64::from(u16::from_be_bytes(self.be()?))),
            0xce => Head::Uint(u64::from(u32::from_be_bytes(self.be()?))),
            0xcf => Head::Uint(u64::from_be_bytes(self.be()?)),
            0xd0 => int(i64::from(i8::from_be_bytes(self.be()?))),
            0xd1 => int(i64::from(i16::from_be_bytes(self.be()?))),
            0xd2 => int(i64::from(i32::from_be_bytes(self.be()?))),
            0xd3 => int(i64::from_be_bytes(self.be()?)),
            0xd4 => self.fixext(1)?,
            0xd5 => self.fixext(2)?,
            0xd6 => self.fixext(4)?,
            0xd7 => self.fixext(8)?,
            0xd8 => self.fixext(16)?,
            0xd9 => Head::Str(self.len8()?),
            0xda => Head::Str(self.len16()?),
            0xdb => Head::Str(self.len32()?),
            0xdc => Head::Array(self.len16()?),
            0xdd => Head::Array(self.len32()?),
            0xde => Head::Map(self.len16()?),
            0xdf => Head::Map(self.len32()?),
            0xc1 => return Err(KvDecodeError::Malformed),
            0xe0..=0xff => Head::Int(i64::from(m as i8)),
        };
        match h {
            Head::Str(n) | Head::Bin(n) | Head::Ext(n) | Head::Array(n) if n > self.remaining() => {
                Err(KvDecodeError::Truncated)
            }
            Head::Map(n) if n > self.remaining() / 2 => Err(KvDecodeError::Truncated),
            _ => Ok(h),
        }
    }

    /// The next value if it is an unsigned integer that fits `u32` (`None`: another value,
    /// consumed). A fast path for token ids, which are most of a payload.
    pub(crate) fn u32_value(&mut self) -> Result<Option<u32>, KvDecodeError> {
        let rest = self.buf.get(self.pos..).unwrap_or(&[]);
        let (v, n) = match *rest {
            [m @ 0x00..=0x7f, ..] => (u32::from(m), 1),
            [0xcc, b, ..] => (u32::from(b), 2),
            [0xcd, a, b, ..] => (u32::from(u16::from_be_bytes([a, b])), 3),
            [0xce, a, b, c, d, ..] => (u32::from_be_bytes([a, b, c, d]), 5),
            _ => {
                return Ok(match self.head()? {
                    Head::Uint(u) => u32::try_from(u).ok(),
                    _ => None,
                })
            }
        };
        self.pos += n;
        Ok(Some(v))
    }

    fn fixext(&mut self, n: usize) -> Result<Head, KvDecodeError> {
        self.take(1)?;
        Ok(Head::Ext(n))
    }

    /// The `n` bytes of a string, byte string or extension whose head was just read.
    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], KvDecodeError> {
        self.take(n)
    }

    /// Skips the rest of a value whose head was just read (its elements, or its bytes).
    pub(crate) fn skip_body(&mut self, h: Head, depth: u32) -> Result<(), KvDecodeError> {
        match h {
            Head::Str(n) | Head::Bin(n) | Head::Ext(n) => self.take(n).map(|_| ()),
            Head::Array(n) => self.skip_values(n, depth),
            Head::Map(n) => self.skip_values(n.saturating_mul(2), depth),
            _ => Ok(()),
        }
    }

    /// Skips one whole value, nesting at most `MAX_DEPTH - depth` levels.
    pub(crate) fn skip(&mut self, depth: u32) -> Result<(), KvDecodeError> {
        let h = self.head()?;
        self.skip_body(h, depth)
    }

    fn skip_values(&mut self, n: usize, depth: u32) -> Result<(), KvDecodeError> {
        if depth >= MAX_DEPTH {
            return Err(KvDecodeError::TooDeep);
        }
        for _ in 0..n {
            self.skipped = self.skipped.saturating_add(1);
            if self.skipped > MAX_SKIPPED {
                return Err(KvDecodeError::TooLarge);
            }
            self.skip(depth + 1)?;
        }
        Ok(())
    }
}

fn int(v: i64) -> Head {
    match u64::try_from(v) {
        Ok(u) => Head::Uint(u),
        Err(_) => Head::Int(v),
    }
}
