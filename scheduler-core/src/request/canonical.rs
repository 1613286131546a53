//! Canonical JSON: the byte form of structured request parts (tools, tool calls, non-text
//! content parts) inside the prompt byte stream.
//!
//! Compact JSON (no whitespace) with object keys sorted by their UTF-8 bytes (a repeated key:
//! the last one wins), so two clients that send the same tools with keys in a different order
//! or with different whitespace produce the same bytes. Strings escape only `"`, `\` and
//! control characters (`\u00XX`, lowercase hex); everything else is raw UTF-8.
//!
//! Numbers: integers, and floats that are integral and below 2^53 in magnitude, print in
//! decimal (`2.0` → `2`). Every other float prints as Rust's shortest round-trip form, in
//! exponent notation where that is strictly shorter than the positional one: `0.1`, `123.25`,
//! but `1e308`, `1.5e-7`, `-2.5e100`. (Version 1 of the stream wrote every float
//! positionally, so `1e308` took 309 bytes; now no number is written more than a few bytes
//! longer than its shortest form, and the stream stays within a small multiple of the body.)
//!
//! [`CanonSeed`] writes a value while serde parses it, without building a `serde_json::Value`
//! (which costs 32 bytes or more per JSON value, whatever its text size). Arrays and scalars
//! go straight to the output; an object's members are gathered in one arena ([`Members`]),
//! then sorted and joined. A member can only land after the object's `{`, so it never stores more
//! than the output could still hold from there. The sort is done here rather than relying on
//! `serde_json::Map` ordering, which a `preserve_order` feature elsewhere in the build could
//! change.

use super::scalar::KeySeed;
use super::stream::Stream;
use alloc::vec::Vec;
use core::fmt::{self, Write};
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// The members of one object, gathered until they can be sorted: every key and value in
/// one byte arena, and 16 bytes of offsets per member (a `String` and a `Vec` per member
/// would cost 80 bytes or more, whatever their text: 13 times a body of `"k":0,`).
#[derive(Default)]
pub(crate) struct Members {
    /// Per member: the key's bytes as sent (escapes decoded), then its value's canonical JSON
    /// (a prefix of it, if it was cut).
    arena: Vec<u8>,
    entries: Vec<Entry>,
}

/// Where one member lives in the arena: key `start..key_end`, value `key_end..end`, and
/// `uncounted` bytes of value that were counted but not stored.
#[derive(Clone, Copy)]
struct Entry {
    start: u32,
    key_end: u32,
    end: u32,
    uncounted: u32,
}

impl Members {
    /// Adds a member: `key`, and a value that `write` appends to a stream that stores at most
    /// `room` bytes of it. Fails (with `write`'s error, or as too large past 4 GiB of
    /// members, which no body limit allows) without adding anything usable.
    pub fn push_with<E: de::Error>(
        &mut self,
        key: &str,
        room: usize,
        write: impl FnOnce(&mut Stream) -> Result<(), E>,
    ) -> Result<(), E> {
        let offset = |n: usize| u32::try_from(n).map_err(|_| E::custom("object too large"));
        let start = offset(self.arena.len())?;
        self.arena.extend_from_slice(key.as_bytes());
        let key_end = self.arena.len();
        let mut value = Stream::resume(core::mem::take(&mut self.arena), room);
        let written = write(&mut value);
        let uncounted = value.len() - value.bytes().len();
        self.arena = value.into_bytes();
        written?;
        self.entries.push(Entry {
            start,
            key_end: offset(key_end)?,
            end: offset(self.arena.len())?,
            // Only a cut value has uncounted bytes, and its length only feeds the estimate.
            uncounted: u32::try_from(uncounted).unwrap_or(u32::MAX),
        });
        Ok(())
    }

    fn key(&self, e: &Entry) -> &[u8] {
        self.arena
            .get(e.start as usize..e.key_end as usize)
            .unwrap_or_default()
    }

    /// Appends the canonical JSON of the object: members sorted by key bytes, of repeated
    /// keys only the last one.
    pub fn write_sorted(mut self, out: &mut Stream) {
        let mut entries = core::mem::take(&mut self.entries);
        // Ties broken by position: as stable as a stable sort, without its buffer.
        entries.sort_unstable_by(|a, b| self.key(a).cmp(self.key(b)).then(a.start.cmp(&b.start)));
        entries.dedup_by(|later, earlier| {
            if self.key(later) == self.key(earlier) {
                core::mem::swap(later, earlier);
                true
            } else {
                false
            }
        });
        out.push(b'{');
        for (i, e) in entries.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_string(self.key(e), out);
            out.push(b':');
            let value = self
                .arena
                .get(e.key_end as usize..e.end as usize)
                .unwrap_or_default();
            out.extend_from_slice(value);
            out.count(e.uncounted as usize);
        }
        out.push(b'}');
    }
}

/// Appends a JSON string with the minimal canonical escaping described in the module doc.
pub(crate) fn write_string(bytes: &[u8], out: &mut Stream) {
    out.push(b'"');
    let mut plain = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escaped: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0..=0x1f => &[],
            _ => continue,
        };
        // Copy the run of bytes that need no escape in one call.
        out.extend_from_slice(bytes.get(plain..i).unwrap_or_default());
        plain = i + 1;
        if escaped.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(escaped);
        }
    }
    out.extend_from_slice(bytes.get(plain..).unwrap_or_default());
    out.push(b'"');
}

/// Appends an unsigned integer in decimal.
pub(crate) fn write_u64(u: u64, out: &mut Stream) {
    // Writing into a Stream cannot fail; the Result only exists for the fmt::Write signature.
    let _ = write!(StreamWriter(out), "{u}");
}

fn write_i64(i: i64, out: &mut Stream) {
    let _ = write!(StreamWriter(out), "{i}");
}

/// Appends a float in the canonical form of the module doc.
pub(crate) fn write_f64(f: f64, out: &mut Stream) {
    if f.abs() < 9.007_199_254_740_992e15 && (f as i64) as f64 == f {
        // Integral floats print like integers so `2.0` and `2` agree.
        return write_i64(f as i64, out);
    }
    let mut exp = SmallBuf::default();
    if write!(exp, "{f:e}").is_ok() && exp.len < positional_len(exp.as_bytes()) {
        out.extend_from_slice(exp.as_bytes());
    } else {
        let _ = write!(StreamWriter(out), "{f}");
    }
}

/// The length of Rust's positional (`{}`) form of the float whose shortest exponent form
/// (`{:e}`: `[-]d[.ddd]e[-]x`) is `exp`, without formatting it (`1e308` would take 309 bytes).
fn positional_len(exp: &[u8]) -> usize {
    let Some(e) = exp.iter().position(|&b| b == b'e') else {
        return exp.len();
    };
    let (mantissa, exponent) = exp.split_at(e);
    let sign = usize::from(mantissa.first() == Some(&b'-'));
    let digits = mantissa.iter().filter(|b| b.is_ascii_digit()).count();
    let (negative, magnitude) = match exponent.get(1..) {
        Some([b'-', rest @ ..]) => (true, rest),
        Some(rest) => (false, rest),
        None => (false, &[][..]),
    };
    let x = magnitude
        .iter()
        .fold(0usize, |n, d| n * 10 + usize::from(d.wrapping_sub(b'0')));
    sign + if negative {
        // 0.000ddd: "0." + (x − 1) zeros + digits.
        digits + 1 + x
    } else if x + 1 >= digits {
        // ddd000: the digits, padded with zeros up to x + 1 places.
        x + 1
    } else {
        // dd.d: the digits and a point.
        digits + 1
    }
}

/// A fixed buffer big enough for any `f64` in exponent form (at most 24 bytes).
#[derive(Default)]
struct SmallBuf {
    buf: [u8; 32],
    len: usize,
}

impl SmallBuf {
    fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or_default()
    }
}

impl Write for SmallBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        let dst = self.buf.get_mut(self.len..end).ok_or(fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// `core::fmt::Write` into a [`Stream`].
struct StreamWriter<'a>(&'a mut Stream);

impl Write for StreamWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Appends the canonical JSON of the array `seq` is reading; returns its element count.
pub(crate) fn write_array<'de, A: SeqAccess<'de>>(
    mut seq: A,
    out: &mut Stream,
) -> Result<usize, A::Error> {
    out.push(b'[');
    let mut count = 0;
    loop {
        // The comma is written before the element is known to exist, and taken back when
        // the array turns out to have ended.
        let mark = out.len();
        if count > 0 {
            out.push(b',');
        }
        if seq
            .next_element_seed(CanonSeed { out: &mut *out })?
            .is_none()
        {
            out.truncate(mark);
            break;
        }
        count += 1;
    }
    out.push(b']');
    Ok(count)
}

/// Like [`CanonSeed`], but JSON null writes nothing; the value is whether anything else was there.
pub(crate) struct OptCanonSeed<'a> {
    /// Where the canonical JSON goes.
    pub out: &'a mut Stream,
}

impl<'de> DeserializeSeed<'de> for OptCanonSeed<'_> {
    type Value = bool;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for OptCanonSeed<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_none<E>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        CanonSeed { out: self.out }.deserialize(d).map(|()| true)
    }
}

/// Parses any JSON value and appends its canonical JSON to `out` as it goes.
pub(crate) struct CanonSeed<'a> {
    /// Where the canonical JSON goes.
    pub out: &'a mut Stream,
}

impl<'de> DeserializeSeed<'de> for CanonSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for CanonSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn visit_none<E>(self) -> Result<(), E> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }
    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        write_u64(v, self.out);
        Ok(())
    }
    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        write_i64(v, self.out);
        Ok(())
    }
    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        write_f64(v, self.out);
        Ok(())
    }
    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        write_string(v.as_bytes(), self.out);
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        write_array(seq, self.out).map(|_| ())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // Every member lands after the `{`.
        let room = self.out.room_from(self.out.len()).saturating_sub(1);
        let mut members = Members::default();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            members.push_with(&key, room, |value| {
                map.next_value_seed(CanonSeed { out: value })
            })?;
        }
        members.write_sorted(self.out);
        Ok(())
    }
}
