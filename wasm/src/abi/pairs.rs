//! The ABI's serialised header maps and property paths.
//!
//! A map is a little-endian `u32` pair count, then per pair a `u32` name length and a
//! `u32` value length, then every name and value, each followed by one NUL byte. An empty
//! buffer is an empty map. Names and values are bytes: Envoy passes header values with
//! bytes above 0x7F (and control bytes) as they arrived.
//!
//! Decoding never trusts the buffer: every length is checked against what is left, the
//! pair count against the buffer size before anything is allocated, and a buffer that
//! does not add up is `None`.

/// Header pairs as bytes, in wire order.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// Decode a serialised map; `None` when the bytes are short or inconsistent.
pub fn decode(bytes: &[u8]) -> Option<Pairs> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let count = usize::try_from(read_u32(bytes, 0)?).ok()?;
    // The count must fit the buffer's length table before it sizes any allocation.
    let table_end = count.checked_mul(8)?.checked_add(4)?;
    if table_end > bytes.len() {
        return None;
    }
    let mut pairs = Vec::with_capacity(count);
    let mut data = table_end;
    for i in 0..count {
        let entry = 4 + i * 8; // < table_end, checked above
        let name_len = usize::try_from(read_u32(bytes, entry)?).ok()?;
        let value_len = usize::try_from(read_u32(bytes, entry + 4)?).ok()?;
        let name = take(bytes, &mut data, name_len)?;
        let value = take(bytes, &mut data, value_len)?;
        pairs.push((name.to_vec(), value.to_vec()));
    }
    Some(pairs)
}

/// `len` bytes at `*at` followed by their NUL terminator; advances `*at` past both.
fn take<'a>(bytes: &'a [u8], at: &mut usize, len: usize) -> Option<&'a [u8]> {
    let end = at.checked_add(len)?;
    let field = bytes.get(*at..end)?;
    // The terminator must be there, or the next field's offset would be wrong.
    bytes.get(end)?;
    *at = end.checked_add(1)?;
    Some(field)
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let raw: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_le_bytes(raw))
}

/// Encode pairs; `None` if a length does not fit the format's `u32`.
pub fn encode<N: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(N, V)]) -> Option<Vec<u8>> {
    let data: usize = pairs
        .iter()
        .map(|(n, v)| n.as_ref().len() + v.as_ref().len() + 2)
        .sum();
    let mut out = Vec::with_capacity(4 + pairs.len() * 8 + data);
    out.extend_from_slice(&u32::try_from(pairs.len()).ok()?.to_le_bytes());
    for (name, value) in pairs {
        out.extend_from_slice(&u32::try_from(name.as_ref().len()).ok()?.to_le_bytes());
        out.extend_from_slice(&u32::try_from(value.as_ref().len()).ok()?.to_le_bytes());
    }
    for (name, value) in pairs {
        out.extend_from_slice(name.as_ref());
        out.push(0);
        out.extend_from_slice(value.as_ref());
        out.push(0);
    }
    Some(out)
}

/// A property path: its segments joined by NUL bytes.
pub fn property_path(segments: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, segment) in segments.iter().enumerate() {
        if i > 0 {
            out.push(0);
        }
        out.extend_from_slice(segment.as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_byte_values() {
        let pairs: Vec<(&[u8], &[u8])> = vec![
            (b"x-note", b"caf\xe9"),
            (b"empty", b""),
            (b"ctl", b"\x01\x7f\xff"),
        ];
        let bytes = encode(&pairs).unwrap_or_default();
        let expected: Pairs = pairs
            .iter()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect();
        assert_eq!(decode(&bytes), Some(expected));
    }

    #[test]
    fn the_spec_layout() {
        let bytes = encode(&[("a", "1"), ("b", "22")]).unwrap_or_default();
        let expected: Vec<u8> = vec![
            2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, b'a', 0, b'1', 0, b'b', 0,
            b'2', b'2', 0,
        ];
        assert_eq!(bytes, expected);
        assert_eq!(decode(&[]), Some(Vec::new()));
        assert_eq!(decode(&[0, 0, 0, 0]), Some(Vec::new()));
    }

    #[test]
    fn short_or_garbled_buffers_are_refused() {
        let good = encode(&[("name", "value")]).unwrap_or_default();
        for cut in 1..good.len() {
            assert_eq!(decode(&good[..cut]), None, "cut at {cut}");
        }
        // A count far beyond the buffer allocates nothing and fails.
        assert_eq!(decode(&[255, 255, 255, 255]), None);
        assert_eq!(decode(&[1, 0, 0]), None);
        // Lengths that overflow the offsets.
        let mut huge = vec![1, 0, 0, 0];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(b"x\0y\0");
        assert_eq!(decode(&huge), None);
    }

    #[test]
    fn garbage_never_panics() {
        // A cheap deterministic sweep over short random buffers.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 40) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|i| (x.rotate_left(i as u32 * 5) as u8) % 12)
                .collect();
            let _ = decode(&bytes);
        }
    }

    #[test]
    fn paths_join_with_nul() {
        assert_eq!(property_path(&["a"]), b"a".to_vec());
        assert_eq!(property_path(&["a", "bc"]), b"a\0bc".to_vec());
        assert!(property_path(&[]).is_empty());
    }
}
