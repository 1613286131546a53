//! Little-endian binary encoding of the messages filters pass between contexts (the
//! router → picker handoff, the Wasm workers ↔ state-owner queue messages): a bounds-checked
//! [`Reader`] over untrusted bytes and the writers that match it. Every read checks the
//! length first and answers `None` instead of panicking.

/// A cursor over untrusted bytes: every read checks the length first.
#[derive(Debug)]
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    /// The next `n` bytes.
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N).and_then(|b| <[u8; N]>::try_from(b).ok())
    }
    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|[b]| b)
    }
    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }
    /// A `u16`-length-prefixed UTF-8 string ([`put_string`]).
    pub(crate) fn string(&mut self) -> Option<String> {
        let len = usize::from(self.array().map(u16::from_le_bytes)?);
        let bytes = self.take(len)?;
        core::str::from_utf8(bytes).ok().map(str::to_owned)
    }
    /// A `u32`-count-prefixed list of `u64`s ([`put_u64s`]).
    pub(crate) fn u64s(&mut self) -> Option<Vec<u64>> {
        let count = usize::try_from(self.u32()?).ok()?;
        let raw = self.take(count.checked_mul(8)?)?;
        // Sized at once (the bytes are there): a prompt's block hashes are hundreds of
        // values, which a collect through `Result` would grow by doubling.
        let mut values = Vec::with_capacity(count);
        values.extend(raw.chunks_exact(8).map(|chunk| {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            u64::from_le_bytes(word)
        }));
        Some(values)
    }
    /// Whether every byte was read (a decoder rejects trailing bytes).
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Append `s` as a `u16` length and its bytes; `None` if it is longer than `u16::MAX`.
pub(crate) fn put_string(out: &mut Vec<u8>, s: &str) -> Option<()> {
    let len = u16::try_from(s.len()).ok()?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    Some(())
}

/// Append `values` as a `u32` count and each value; `None` if there are too many.
pub(crate) fn put_u64s(
    out: &mut Vec<u8>,
    values: impl ExactSizeIterator<Item = u64>,
) -> Option<()> {
    let count = u32::try_from(values.len()).ok()?;
    out.extend_from_slice(&count.to_le_bytes());
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    Some(())
}
