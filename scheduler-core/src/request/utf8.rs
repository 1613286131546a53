//! UTF-8 validation: of the whole body, once, before the `serde_json` path parses it, and of
//! each run of a string between escapes that holds a non-ASCII byte, on the fast path
//! (`scan::decode_vec`).
//!
//! `serde_json` validates every string it reads with `core::str::from_utf8`, which falls back
//! to a byte loop around every non-ASCII character; on chat text with the occasional "é" or
//! "—" that was 40% of the parse time. Validating the whole body here (16 ASCII bytes per
//! step, resuming the fast path right after each multi-byte character) lets `parse` use
//! `serde_json`'s `&str` reader, which does not validate again.

/// High bit of every byte of a `u64`.
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// Whether `b` is well-formed UTF-8, exactly as `core::str::from_utf8` decides (RFC 3629:
/// no overlong forms, no surrogates, nothing above U+10FFFF, no truncated sequences).
pub(crate) fn is_valid(b: &[u8]) -> bool {
    let mut i = 0;
    while i < b.len() {
        let rest = b.get(i..).unwrap_or_default();
        if let (Some(x), Some(y)) = (
            rest.first_chunk::<8>(),
            rest.get(8..).and_then(|r| r.first_chunk::<8>()),
        ) {
            let (x, y) = (
                u64::from_le_bytes(*x) & HIGH_BITS,
                u64::from_le_bytes(*y) & HIGH_BITS,
            );
            if x | y == 0 {
                i += 16;
                continue;
            }
            // Jump to the first non-ASCII byte of these 16.
            i += if x != 0 {
                (x.trailing_zeros() / 8) as usize
            } else {
                8 + (y.trailing_zeros() / 8) as usize
            };
        }
        let Some(&lead) = b.get(i) else {
            break;
        };
        if lead < 0x80 {
            i += 1;
            continue;
        }
        match char_width(b, i) {
            Some(width) => i += width,
            None => return false,
        }
    }
    true
}

/// The width of the well-formed multi-byte UTF-8 character at `i` (whose lead byte is not
/// ASCII), or `None` if the bytes there are not one.
pub(crate) fn char_width(b: &[u8], i: usize) -> Option<usize> {
    let lead = *b.get(i)?;
    let width = match lead {
        0xc2..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf4 => 4,
        _ => return None,
    };
    let Some(&[_, second, ref tail @ ..]) = b.get(i..i + width) else {
        return None;
    };
    let second_ok = match lead {
        0xe0 => (0xa0..=0xbf).contains(&second), // no overlong 3-byte forms
        0xed => (0x80..=0x9f).contains(&second), // no surrogates
        0xf0 => (0x90..=0xbf).contains(&second), // no overlong 4-byte forms
        0xf4 => (0x80..=0x8f).contains(&second), // nothing above U+10FFFF
        _ => (0x80..=0xbf).contains(&second),
    };
    (second_ok && tail.iter().all(|&c| c & 0xc0 == 0x80)).then_some(width)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly
    use super::is_valid;
    use alloc::vec::Vec;
    use proptest::prelude::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn edge_cases_agree_with_core() {
        let cases: &[&[u8]] = &[
            b"",
            b"plain ascii text that is longer than sixteen bytes",
            "caf\u{e9} \u{2014} \u{30c7}\u{30fc}\u{30bf} \u{1f600}".as_bytes(),
            b"\xc0\x80",
            b"\xc1\xbf",
            b"\xe0\x80\x80",
            b"\xe0\x9f\xbf",
            b"\xed\xa0\x80",
            b"\xed\x9f\xbf",
            b"\xf0\x8f\xbf\xbf",
            b"\xf4\x90\x80\x80",
            b"\xf4\x8f\xbf\xbf",
            b"\xf5\x80\x80\x80",
            b"\xff",
            b"\x80",
            b"0123456789abcde\xe2\x82",
            b"0123456789abcdef\xe2\x82\xac0123456789abcdef",
        ];
        for c in cases {
            assert_eq!(is_valid(c), core::str::from_utf8(c).is_ok(), "{c:?}");
        }
    }

    proptest! {
        #[test]
        fn agrees_with_core_on_arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            prop_assert_eq!(is_valid(&b), core::str::from_utf8(&b).is_ok());
        }

        #[test]
        fn agrees_with_core_on_corrupted_text(
            s in "[a-z \u{e9}\u{2014}\u{30c7}\u{1f600}]{0,80}",
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3),
        ) {
            let mut b: Vec<u8> = s.into_bytes();
            for (pos, v) in flips {
                let n = b.len();
                if n > 0 {
                    b[pos % n] = v;
                }
            }
            prop_assert_eq!(is_valid(&b), core::str::from_utf8(&b).is_ok());
        }
    }
}
