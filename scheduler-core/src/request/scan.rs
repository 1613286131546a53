//! Byte-level JSON scanning for the fast path ([`super::fast`]): finding the next byte of a
//! string that is not plain ASCII 16 bytes at a time (SSE2 on x86_64, SIMD128 on wasm32
//! built with it, SWAR words elsewhere: `lanes`), decoding a string straight into a
//! [`Stream`] or the prompt's own buffer, and skipping a value while checking its syntax.
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

/// The 16-byte step of [`find_special`] and [`decode_vec`]: SSE2 on x86_64 (where it is part
/// of the baseline, so no runtime detection; one load, three compares and a `movemask`),
/// SIMD128 on wasm32 when the build enables it (the proxy-wasm module does: Wasm SIMD is a
/// compile-time feature, and a runtime without it refuses the module), two 8-byte SWAR words
/// elsewhere. All answer in the same terms, so the callers have one shape; `tests` checks
/// each against a byte loop.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
mod lanes {
    use core::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };

    /// The 16 bytes of `w` in one register.
    #[target_feature(enable = "sse2")]
    #[inline]
    fn load(w: &[u8; 16]) -> __m128i {
        // SAFETY: `w` is 16 readable bytes and `_mm_loadu_si128` takes any alignment.
        unsafe { _mm_loadu_si128(w.as_ptr().cast()) }
    }

    /// All ones in each byte of `v` that is `"`, `\` or a control byte (< 0x20).
    #[target_feature(enable = "sse2")]
    #[inline]
    fn stops(v: __m128i) -> __m128i {
        let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
        let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
        // Unsigned `v <= 0x1f`: the minimum with 0x1f is `v` itself.
        let control = _mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(0x1f)), v);
        _mm_or_si128(_mm_or_si128(quote, backslash), control)
    }

    /// One bit per byte of `v`, from its high bit; bit 16 set, so that `trailing_zeros` of
    /// an empty mask is 16.
    #[target_feature(enable = "sse2")]
    #[inline]
    fn mask(v: __m128i) -> u32 {
        (_mm_movemask_epi8(v) as u32) | 1 << 16
    }

    /// [`plain`], with the intrinsics allowed.
    #[target_feature(enable = "sse2")]
    #[inline]
    fn plain_sse2(w: &[u8; 16]) -> (Option<usize>, bool) {
        let v = load(w);
        let stop = _mm_movemask_epi8(stops(v)) as u32;
        // Only the bytes before the first stop (all 16 when none).
        let kept = stop.wrapping_sub(1) & !stop;
        let wide = _mm_movemask_epi8(v) as u32 & kept != 0;
        if stop == 0 {
            (None, wide)
        } else {
            (Some(stop.trailing_zeros() as usize), wide)
        }
    }

    /// [`first_special`], with the intrinsics allowed.
    #[target_feature(enable = "sse2")]
    #[inline]
    fn first_special_sse2(w: &[u8; 16]) -> usize {
        let v = load(w);
        mask(_mm_or_si128(stops(v), v)).trailing_zeros() as usize
    }

    /// The index of the first byte of `w` that is `"`, `\` or a control byte (`None`: all
    /// 16 are plain), and whether a byte before it is not ASCII (here exactly; a `true` for
    /// a byte after it would only cost a needless UTF-8 check).
    #[inline(always)]
    pub(super) fn plain(w: &[u8; 16]) -> (Option<usize>, bool) {
        // SAFETY: this module is built only where SSE2 is enabled at compile time.
        unsafe { plain_sse2(w) }
    }

    /// The index of the first byte of `w` that is `"`, `\`, a control byte or not ASCII (16:
    /// none).
    #[inline(always)]
    pub(super) fn first_special(w: &[u8; 16]) -> usize {
        // SAFETY: this module is built only where SSE2 is enabled at compile time.
        unsafe { first_special_sse2(w) }
    }
}

/// See the x86_64 variant: the same steps in Wasm's 128-bit vectors, whose bitmask takes
/// each lane's high bit as `movemask` does.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod lanes {
    use core::arch::wasm32::{u8x16_bitmask, u8x16_eq, u8x16_lt, u8x16_splat, v128, v128_or};

    /// The 16 bytes of `w` in one vector.
    #[inline(always)]
    fn load(w: &[u8; 16]) -> v128 {
        // SAFETY: `w` is 16 readable bytes, and `v128` is plain data read unaligned.
        unsafe { core::ptr::read_unaligned(w.as_ptr().cast::<v128>()) }
    }

    /// All ones in each byte of `v` that is `"`, `\` or a control byte (< 0x20).
    #[inline(always)]
    fn stops(v: v128) -> v128 {
        let quote = u8x16_eq(v, u8x16_splat(b'"'));
        let backslash = u8x16_eq(v, u8x16_splat(b'\\'));
        let control = u8x16_lt(v, u8x16_splat(0x20));
        v128_or(v128_or(quote, backslash), control)
    }

    /// See the x86_64 variant.
    #[inline(always)]
    pub(super) fn plain(w: &[u8; 16]) -> (Option<usize>, bool) {
        let v = load(w);
        let stop = u32::from(u8x16_bitmask(stops(v)));
        // Only the bytes before the first stop (all 16 when none).
        let kept = stop.wrapping_sub(1) & !stop;
        let wide = u32::from(u8x16_bitmask(v)) & kept != 0;
        if stop == 0 {
            (None, wide)
        } else {
            (Some(stop.trailing_zeros() as usize), wide)
        }
    }

    /// See the x86_64 variant.
    #[inline(always)]
    pub(super) fn first_special(w: &[u8; 16]) -> usize {
        let v = load(w);
        (u32::from(u8x16_bitmask(v128_or(stops(v), v))) | 1 << 16).trailing_zeros() as usize
    }
}

/// See the x86_64 variant.
#[cfg(not(any(
    all(target_arch = "x86_64", target_feature = "sse2"),
    all(target_arch = "wasm32", target_feature = "simd128")
)))]
mod lanes {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;

    /// High bit set in each byte of `x` that is zero; the lowest flagged byte is always a
    /// real zero (a borrow only flags bytes above one).
    #[inline(always)]
    fn zero_bytes(x: u64) -> u64 {
        x.wrapping_sub(ONES) & !x & HIGH
    }

    /// Flags the bytes of `x` that are `"`, `\` or a control byte (< 0x20); as with
    /// [`zero_bytes`], the lowest flag is always right.
    #[inline(always)]
    fn stops(x: u64) -> u64 {
        zero_bytes(x ^ (ONES * u64::from(b'"')))
            | zero_bytes(x ^ (ONES * u64::from(b'\\')))
            | (x.wrapping_sub(ONES * 0x20) & !x & HIGH)
    }

    /// The two little-endian words of `w`.
    #[inline(always)]
    fn words(w: &[u8; 16]) -> (u64, u64) {
        let mut lo = [0; 8];
        let mut hi = [0; 8];
        let (a, b) = w.split_at(8);
        lo.copy_from_slice(a);
        hi.copy_from_slice(b);
        (u64::from_le_bytes(lo), u64::from_le_bytes(hi))
    }

    /// The index of the first flagged byte of the 16 whose halves are flagged `mx`, `my`.
    #[inline(always)]
    fn first(mx: u64, my: u64) -> usize {
        match (mx, my) {
            (0, 0) => 16,
            (0, _) => 8 + (my.trailing_zeros() / 8) as usize,
            _ => (mx.trailing_zeros() / 8) as usize,
        }
    }

    /// See the x86_64 variant; here the second answer covers all 16 bytes.
    #[inline(always)]
    pub(super) fn plain(w: &[u8; 16]) -> (Option<usize>, bool) {
        let (x, y) = words(w);
        let n = first(stops(x), stops(y));
        ((n < 16).then_some(n), (x | y) & HIGH != 0)
    }

    /// See the x86_64 variant.
    #[inline(always)]
    pub(super) fn first_special(w: &[u8; 16]) -> usize {
        let (x, y) = words(w);
        first(stops(x) | (x & HIGH), stops(y) | (y & HIGH))
    }
}

/// Whether `c` needs a look inside a string (`"`, `\`, control or non-ASCII).
fn is_special(c: u8) -> bool {
    c == b'"' || c == b'\\' || !(0x20..0x80).contains(&c)
}

/// The index of the first byte at or after `i` that is `"`, `\`, a control byte or not
/// ASCII, or `b.len()`.
pub(crate) fn find_special(b: &[u8], mut i: usize) -> usize {
    while let Some(w) = b.get(i..).and_then(|r| r.first_chunk::<16>()) {
        let n = lanes::first_special(w);
        if n < 16 {
            return i + n;
        }
        i += 16;
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

/// Like [`decode_into`], appending to `out` directly and copying 16 bytes at a time: the
/// decoded string is never longer than its JSON (an escape or a `\u` takes at least as many
/// bytes as it decodes to), so `out` is given room for the rest of the body once, and each
/// 16 bytes are stored whole into the spare capacity while only their leading plain bytes
/// are kept. A one-letter escape (the common kind) is decoded in place without leaving that
/// loop; anything else (`"`, `\u`, a control byte, the last bytes of the body) is taken
/// below it. A run between escapes is checked as UTF-8 once it ends, and only if it has a
/// non-ASCII byte: `"`, `\` and control bytes are ASCII, so they never split a character,
/// and the string is well-formed exactly when each run is.
pub(crate) fn decode_vec(b: &[u8], mut i: usize, out: &mut Vec<u8>) -> Option<usize> {
    out.reserve(b.len().saturating_sub(i).saturating_add(16));
    let mut run = i;
    let mut high = false;
    loop {
        let spare = out.spare_capacity_mut();
        // Bytes of `spare` initialized and kept.
        let mut k = 0;
        while let (Some(w), Some(dst)) = (
            b.get(i..).and_then(|r| r.first_chunk::<16>()),
            spare.get_mut(k..).and_then(|r| r.first_chunk_mut::<16>()),
        ) {
            for (d, s) in dst.iter_mut().zip(w) {
                d.write(*s);
            }
            let (stop, wide) = lanes::plain(w);
            high |= wide;
            // All 16 plain: a constant step, so the next load need not wait for this one.
            let Some(n) = stop else {
                i += 16;
                k += 16;
                continue;
            };
            i += n;
            k += n;
            if b.get(i) == Some(&b'\\') {
                // `spare[k]` is within the 16 bytes just written (n < 16).
                if let (Some(byte), Some(d)) = (
                    b.get(i + 1).copied().and_then(simple_escape),
                    spare.get_mut(k),
                ) {
                    if high && !utf8::is_valid(b.get(run..i)?) {
                        return None;
                    }
                    high = false;
                    d.write(byte);
                    k += 1;
                    i += 2;
                    run = i;
                    continue;
                }
            }
            break;
        }
        // SAFETY: the first `k` bytes of the spare capacity were initialized above (each
        // kept byte is one of the 16 written with it, or an escape's byte written in place).
        unsafe { out.set_len(out.len() + k) };
        let c = *b.get(i)?;
        if c >= 0x20 && c != b'"' && c != b'\\' {
            // One of the last few bytes of the body, taken one at a time.
            high |= c >= 0x80;
            out.push(c);
            i += 1;
            continue;
        }
        if high && !utf8::is_valid(b.get(run..i)?) {
            return None;
        }
        high = false;
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
    use super::{decode_into, decode_vec, find_special, is_special, lanes};
    use crate::request::stream::Stream;
    use alloc::vec;
    use alloc::vec::Vec;
    use proptest::prelude::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// `decode_vec` (16 bytes a step, escapes in place) and `decode_into` (a byte search,
    /// each escape and character decoded alone) agree on the string at `i` of `b`: the same
    /// end and, when it is decoded, the same bytes.
    fn decoders_agree(b: &[u8], i: usize) {
        let mut fast = b"prefix".to_vec();
        let end = decode_vec(b, i, &mut fast);
        let mut slow = Stream::unbounded();
        slow.extend_from_slice(b"prefix");
        let expected = decode_into(b, i, &mut slow);
        assert_eq!(end, expected, "{b:?} from {i}");
        if end.is_some() {
            assert_eq!(fast, slow.bytes(), "{b:?} from {i}");
        }
    }

    /// Stops, escapes and characters (well-formed or not) a string may hold.
    const PIECES: &[&[u8]] = &[
        b"\"",
        b"\\n",
        b"\\\"",
        b"\\\\",
        b"\\/",
        b"\\t",
        b"\\u0041",
        b"\\u00e9",
        b"\\u2014",
        b"\\ud83d\\ude00",
        b"\\ud83d",
        b"\\x",
        b"\\",
        b"\x00",
        b"\x01",
        b"\x1f",
        b"\x7f",
        b"\xc3\xa9",
        b"\xe2\x80\x94",
        b"\xf0\x9f\x98\x80",
        b"\xff",
        b"\x80",
        b"\xc3",
        b"\xe2\x80",
        b"\xed\xa0\x80",
        b"\xc0\x80",
    ];

    #[test]
    fn lanes_agree_with_a_byte_loop_at_each_position() {
        for special in 0..=255u8 {
            for pos in 0..16 {
                for other in [b'a', 0xc3, b'"'] {
                    let mut w = [b'a'; 16];
                    w[(pos + 5) % 16] = other;
                    w[pos] = special;
                    let stop = w.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20);
                    let (found, wide) = lanes::plain(&w);
                    assert_eq!(found, stop, "{w:?}");
                    let before = &w[..stop.unwrap_or(16)];
                    if before.iter().any(|&c| c >= 0x80) {
                        assert!(wide, "{w:?}");
                    }
                    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
                    assert_eq!(wide, before.iter().any(|&c| c >= 0x80), "{w:?}");
                    let special_at = w.iter().position(|&c| is_special(c)).unwrap_or(16);
                    assert_eq!(lanes::first_special(&w), special_at, "{w:?}");
                }
            }
        }
    }

    #[test]
    fn decoders_agree_on_each_piece_at_each_offset() {
        // Every offset within and across two 16-byte steps, with the string ending at, just
        // before and just after a step's end, and the body ending right after it or not.
        for piece in PIECES {
            for pad in 0..40 {
                for tail in [0, 1, 2, 14, 15, 16, 17, 33] {
                    for after in [&b""[..], b"}", b"\"}]} more"] {
                        let mut b = b"\"".to_vec();
                        b.extend(core::iter::repeat_n(b'a', pad));
                        b.extend_from_slice(piece);
                        b.extend(core::iter::repeat_n(b'b', tail));
                        b.push(b'"');
                        b.extend_from_slice(after);
                        decoders_agree(&b, 1);
                        // Cut short, so no closing quote, or one within the last bytes.
                        for cut in b.len().saturating_sub(20)..b.len() {
                            decoders_agree(&b[..cut], 1);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn decoders_agree_on_two_pieces_at_each_pair_of_offsets() {
        for first in PIECES {
            for second in [&b"\\n"[..], b"\xc3\xa9", b"\xff", b"\"", b"\x01"] {
                for gap in 0..34 {
                    for pad in [0, 3, 15, 16] {
                        let mut b = vec![b'"'];
                        b.extend(core::iter::repeat_n(b'a', pad));
                        b.extend_from_slice(first);
                        b.extend(core::iter::repeat_n(b'c', gap));
                        b.extend_from_slice(second);
                        b.extend_from_slice(b"end\"");
                        decoders_agree(&b, 1);
                    }
                }
            }
        }
    }

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
        fn decoders_agree_on_generated_strings(
            pieces in proptest::collection::vec(
                prop_oneof![
                    3 => "[a-z ]{0,40}".prop_map(alloc::string::String::into_bytes),
                    1 => "[\u{e9}\u{2014}\u{30c7}\u{1f600}]{1,3}".prop_map(alloc::string::String::into_bytes),
                    2 => prop::sample::select(PIECES).prop_map(<[u8]>::to_vec),
                    1 => any::<u8>().prop_map(|c| vec![c]),
                ],
                0..12,
            ),
            closed in any::<bool>(),
            start in 0usize..20,
        ) {
            let mut b: Vec<u8> = core::iter::repeat_n(b'x', start).collect();
            b.extend(pieces.concat());
            if closed {
                b.push(b'"');
            }
            decoders_agree(&b, start);
        }

        #[test]
        fn agrees_with_a_byte_loop(b in proptest::collection::vec(any::<u8>(), 0..64), from in 0usize..64) {
            let from = from.min(b.len());
            let expected = (from..b.len()).find(|&i| is_special(b[i])).unwrap_or(b.len());
            prop_assert_eq!(find_special(&b, from), expected);
        }
    }
}
