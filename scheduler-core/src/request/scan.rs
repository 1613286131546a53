//! Byte-level JSON scanning for the fast path ([`super::fast`]): finding the next byte of a
//! string that is not plain ASCII 8 bytes at a time, decoding a string straight into a
//! [`Stream`], and skipping a value while checking its syntax.
//!
//! Everything here is strict where `serde_json` is strict and gives up (`None`) wherever the
//! two might disagree or the input is unusual (a `\u` surrogate, an exponent, nesting deeper
//! than [`MAX_DEPTH`]): the fast path then leaves the body to the `serde_json` path, so a
//! `Some` only ever stands for input that path accepts with the same meaning.

use super::stream::Stream;
use super::utf8;
use alloc::vec::Vec;

/// The deepest nesting the fast path follows; `serde_json` stops at 128, and a value handed
/// to it from the fast path starts at most a few levels down.
pub(crate) const MAX_DEPTH: usize = 64;

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// High bit set in each byte of `x` that is zero; the lowest flagged byte is always a real
/// zero (a borrow only flags bytes above one).
fn zero_bytes(x: u64) -> u64 {
    x.wrapping_sub(ONES) & !x & HIGH
}

/// Flags the bytes of `x` that are `"`, `\`, a control byte (< 0x20) or not ASCII.
fn special_bytes(x: u64) -> u64 {
    zero_bytes(x ^ (ONES * u64::from(b'"')))
        | zero_bytes(x ^ (ONES * u64::from(b'\\')))
        | (x.wrapping_sub(ONES * 0x20) & !x & HIGH)
        | (x & HIGH)
}

/// Whether `c` needs a look inside a string (`"`, `\`, control or non-ASCII).
fn is_special(c: u8) -> bool {
    c == b'"' || c == b'\\' || !(0x20..0x80).contains(&c)
}

/// The index of the first byte at or after `i` that is `"`, `\`, a control byte or not
/// ASCII, or `b.len()`.
pub(crate) fn find_special(b: &[u8], mut i: usize) -> usize {
    while let Some(w) = b.get(i..).and_then(|r| r.first_chunk::<8>()) {
        let m = special_bytes(u64::from_le_bytes(*w));
        if m != 0 {
            return i + (m.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if is_special(c) {
            return i;
        }
        i += 1;
    }
    b.len()
}

/// Index after the JSON whitespace starting at `i`.
pub(crate) fn ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\r' | b'\t') = b.get(i) {
        i += 1;
    }
    i
}

/// The value of one hex digit.
fn hex(c: u8) -> Option<u32> {
    char::from(c).to_digit(16)
}

/// The code unit of the 4 hex digits at `i`.
fn hex4(b: &[u8], i: usize) -> Option<u32> {
    let d = b.get(i..i + 4)?;
    d.iter().try_fold(0, |n, &c| Some(n * 16 + hex(c)?))
}

/// The byte a one-letter escape (`\n`, `\"`, ...) stands for, given the letter; `None`
/// for `u` and for anything that is not an escape (see [`escape`]).
#[inline]
fn simple_escape(letter: u8) -> Option<u8> {
    Some(match letter {
        b'"' => b'"',
        b'\\' => b'\\',
        b'/' => b'/',
        b'b' => 8,
        b'f' => 0xc,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        _ => return None,
    })
}

/// Decodes the escape whose `\` is at `i`: the character and the index after it. A `\u`
/// surrogate (paired or not) gives up, as does anything that is not a JSON escape.
fn escape(b: &[u8], i: usize) -> Option<(char, usize)> {
    let c = match *b.get(i + 1)? {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => return Some((char::from_u32(hex4(b, i + 2)?)?, i + 6)),
        _ => return None,
    };
    Some((c, i + 2))
}

/// Decodes the string whose opening `"` is just before `i` into `out`; returns the index
/// after its closing `"`.
pub(crate) fn decode_into(b: &[u8], mut i: usize, out: &mut Stream) -> Option<usize> {
    let mut run = i;
    loop {
        i = find_special(b, i);
        match *b.get(i)? {
            b'"' => {
                out.extend_from_slice(b.get(run..i)?);
                return Some(i + 1);
            }
            b'\\' => {
                out.extend_from_slice(b.get(run..i)?);
                let (c, next) = escape(b, i)?;
                let mut buf = [0; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                i = next;
                run = i;
            }
            c if c >= 0x80 => i += utf8::char_width(b, i)?,
            _ => return None,
        }
    }
}

/// Flags the bytes of `x` that end a run of a string: `"`, `\` or a control byte (< 0x20).
/// Non-ASCII bytes do not: a run is checked as UTF-8 as a whole, once it ends.
fn stop_bytes(x: u64) -> u64 {
    zero_bytes(x ^ (ONES * u64::from(b'"')))
        | zero_bytes(x ^ (ONES * u64::from(b'\\')))
        | (x.wrapping_sub(ONES * 0x20) & !x & HIGH)
}

/// Like [`decode_into`], appending to `out` directly and copying 16 bytes at a time: the
/// decoded string is never longer than its JSON (an escape or a `\u` takes at least as many
/// bytes as it decodes to), so `out` is given room for the rest of the body once, and each
/// 16 bytes are stored whole while only their leading plain bytes are kept. A run between
/// escapes is checked as UTF-8 once it ends, and only if it has a non-ASCII byte: `"`, `\`
/// and control bytes are ASCII, so they never split a character, and the string is
/// well-formed exactly when each run is.
pub(crate) fn decode_vec(b: &[u8], mut i: usize, out: &mut Vec<u8>) -> Option<usize> {
    out.reserve(b.len().saturating_sub(i).saturating_add(16));
    let mut run = i;
    let mut high = 0;
    loop {
        while let Some(w) = b.get(i..).and_then(|r| r.first_chunk::<16>()) {
            let Some(dst) = out.spare_capacity_mut().get_mut(..16) else {
                break;
            };
            for (d, s) in dst.iter_mut().zip(w) {
                d.write(*s);
            }
            let (lo, hi) = w.split_at(8);
            let x = u64::from_le_bytes(lo.try_into().ok()?);
            let y = u64::from_le_bytes(hi.try_into().ok()?);
            // Bytes past a stop count too: they only make the check below run.
            high |= (x | y) & HIGH;
            let (mx, my) = (stop_bytes(x), stop_bytes(y));
            let plain = match (mx, my) {
                (0, 0) => 16,
                (0, _) => 8 + (my.trailing_zeros() / 8) as usize,
                _ => (mx.trailing_zeros() / 8) as usize,
            };
            // SAFETY: `plain` <= 16, and the first 16 bytes of the spare capacity were just
            // initialized by the loop above, so the new length covers initialized bytes only.
            unsafe { out.set_len(out.len() + plain) };
            i += plain;
            if plain < 16 {
                break;
            }
        }
        let c = *b.get(i)?;
        if c >= 0x20 && c != b'"' && c != b'\\' {
            // One of the last few bytes of the body, taken one at a time.
            high |= u64::from(c & 0x80);
            out.push(c);
            i += 1;
            continue;
        }
        if high != 0 && !utf8::is_valid(b.get(run..i)?) {
            return None;
        }
        high = 0;
        match c {
            b'"' => return Some(i + 1),
            b'\\' => {
                match simple_escape(*b.get(i + 1)?) {
                    Some(byte) => {
                        out.push(byte);
                        i += 2;
                    }
                    None => {
                        let (ch, next) = escape(b, i)?;
                        out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                        i = next;
                    }
                }
                run = i;
            }
            _ => return None,
        }
    }
}

/// Decodes a string like [`decode_into`], through [`decode_vec`] when `out` has room for
/// the rest of the body.
pub(crate) fn decode(b: &[u8], i: usize, out: &mut Stream) -> Option<usize> {
    let rest = b.len().saturating_sub(i);
    match out.write_direct(rest, |v| decode_vec(b, i, v)) {
        Some(end) => end,
        None => decode_into(b, i, out),
    }
}

/// Checks the string whose opening `"` is just before `i`; returns the index after its
/// closing `"` and whether it held an escape.
pub(crate) fn skip_string(b: &[u8], mut i: usize) -> Option<(usize, bool)> {
    let mut escaped = false;
    loop {
        i = find_special(b, i);
        match *b.get(i)? {
            b'"' => return Some((i + 1, escaped)),
            b'\\' => {
                i = escape(b, i)?.1;
                escaped = true;
            }
            c if c >= 0x80 => i += utf8::char_width(b, i)?,
            _ => return None,
        }
    }
}

/// The index after the digits starting at `i` (at least one).
fn digits(b: &[u8], i: usize) -> Option<usize> {
    let n = b
        .get(i..)?
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count();
    (n > 0).then_some(i + n)
}

/// Checks the number starting at `i` (JSON grammar, no exponent); returns the index after it.
fn skip_number(b: &[u8], mut i: usize) -> Option<usize> {
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    i = match b.get(i)? {
        b'0' => i + 1,
        b'1'..=b'9' => digits(b, i)?,
        _ => return None,
    };
    if b.get(i) == Some(&b'.') {
        i = digits(b, i + 1)?;
    }
    match b.get(i) {
        Some(b'e' | b'E') => None,
        _ => Some(i),
    }
}

/// Checks the JSON value starting at `i` (no leading whitespace); returns the index after it.
pub(crate) fn skip_value(b: &[u8], i: usize, depth: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => Some(skip_string(b, i + 1)?.0),
        b'{' => skip_object(b, i + 1, depth + 1),
        b'[' => skip_array(b, i + 1, depth + 1),
        b't' => literal(b, i, b"true"),
        b'f' => literal(b, i, b"false"),
        b'n' => literal(b, i, b"null"),
        _ => skip_number(b, i),
    }
}

/// The index after the literal `word` at `i`.
pub(crate) fn literal(b: &[u8], i: usize, word: &[u8]) -> Option<usize> {
    (b.get(i..i + word.len())? == word).then_some(i + word.len())
}

fn skip_array(b: &[u8], mut i: usize, depth: usize) -> Option<usize> {
    if depth > MAX_DEPTH {
        return None;
    }
    i = ws(b, i);
    if b.get(i) == Some(&b']') {
        return Some(i + 1);
    }
    loop {
        i = ws(b, skip_value(b, i, depth)?);
        match b.get(i)? {
            b',' => i = ws(b, i + 1),
            b']' => return Some(i + 1),
            _ => return None,
        }
    }
}

fn skip_object(b: &[u8], mut i: usize, depth: usize) -> Option<usize> {
    if depth > MAX_DEPTH {
        return None;
    }
    i = ws(b, i);
    if b.get(i) == Some(&b'}') {
        return Some(i + 1);
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        i = ws(b, skip_string(b, i + 1)?.0);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = ws(b, skip_value(b, ws(b, i + 1), depth)?);
        match b.get(i)? {
            b',' => i = ws(b, i + 1),
            b'}' => return Some(i + 1),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly
    use super::{find_special, is_special};
    use proptest::prelude::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn finds_each_kind_of_special_byte_at_each_position() {
        for special in [b'"', b'\\', 0, 0x1f, 0x80, 0xff] {
            for pos in 0..20 {
                let mut b = [b'a'; 20];
                b[pos] = special;
                assert_eq!(find_special(&b, 0), pos, "{special:#x} at {pos}");
            }
        }
        let plain = b" !#[]~\x7f plain";
        assert_eq!(find_special(plain, 0), plain.len());
    }

    proptest! {
        #[test]
        fn agrees_with_a_byte_loop(b in proptest::collection::vec(any::<u8>(), 0..64), from in 0usize..64) {
            let from = from.min(b.len());
            let expected = (from..b.len()).find(|&i| is_special(b[i])).unwrap_or(b.len());
            prop_assert_eq!(find_special(&b, from), expected);
        }
    }
}
