//! Just enough JSON for usage: the top-level members of one event's object, and the counters
//! of a usage object.
//!
//! [`scan_event`] walks one object's top-level members once, skipping every value it does
//! not need (strings with `memchr2` to the next quote or backslash, containers by counting
//! brackets outside strings), and reports only what the tracker needs: whether `choices` is
//! an empty or non-empty array, and where the top-level `usage` member and its value lie (so
//! the member can be cut out with its comma, or its value replaced) with its counters.
//! Nothing is allocated and every byte is looked at once, so a 300-byte chunk costs a few
//! hundred cycles.
//!
//! Keys are compared as raw bytes: a key written with escapes (`"us\u0061ge"`) is not
//! recognised, which no engine does. Inside skipped values the scanner is lenient (bracket
//! kinds are not matched against each other); the top-level object itself must be well
//! formed up to its closing brace, followed by nothing but whitespace, or the event is not
//! trusted at all.

use alloc::vec::Vec;
use core::ops::Range;
use memchr::memchr2;
use memchr::memmem::Finder;

/// The largest counter trusted: integers above 2^53 are not exactly representable in the
/// engines' JSON (Python floats, JavaScript numbers), so they are noise, not counts.
pub const MAX_COUNT: u64 = 1 << 53;

/// Counters read from one usage object; `None` where the field was absent or not a sane
/// integer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub prompt: Option<u64>,
    pub completion: Option<u64>,
    pub cached: Option<u64>,
    /// Anthropic's names for the same three, used where the OpenAI ones are absent.
    pub input: Option<u64>,
    pub output: Option<u64>,
    pub cache_read: Option<u64>,
}

impl Counts {
    /// The usage these counters give, if the object held at least one token count.
    pub fn usage(&self) -> Option<super::Usage> {
        let prompt = self.prompt.or(self.input);
        let completion = self.completion.or(self.output);
        if prompt.is_none() && completion.is_none() {
            return None;
        }
        Some(super::Usage {
            prompt_tokens: prompt.unwrap_or(0),
            completion_tokens: completion.unwrap_or(0),
            cached_tokens: self.cached.or(self.cache_read).unwrap_or(0),
        })
    }
}

/// What an event's top-level `choices` member holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Choices {
    /// No `choices` member (or not an array).
    Absent,
    /// `[]`: the usage-only chunk has this.
    Empty,
    /// At least one choice: a content chunk.
    NonEmpty,
}

/// The value of a top-level `usage` member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UsageValue {
    /// An object, with its usage if it held at least one token count.
    Object(Option<super::Usage>),
    /// `null`, or anything that is not an object.
    NotObject,
}

/// A top-level `usage` member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UsageMember {
    /// The bytes to remove so the object reads as if the member had never been there: the
    /// member with the comma before it, or (as the first member) with the comma and
    /// whitespace after it.
    pub cut: Range<usize>,
    /// The bytes of the value alone (from its first byte to its last), for replacing it.
    pub value_at: Range<usize>,
    pub value: UsageValue,
}

/// What one event's JSON object says about usage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Event {
    pub choices: Choices,
    /// The last top-level `usage` member (JSON parsers keep the last of repeated keys).
    pub usage: Option<UsageMember>,
}

#[inline]
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

#[inline]
fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while let Some(&b) = s.get(i) {
        if !is_ws(b) {
            break;
        }
        i += 1;
    }
    i
}

/// `0x01` in every byte of a `u64`.
const ONES: u64 = 0x0101_0101_0101_0101;

/// The high bit of the first byte of `w` (in memory order) equal to `b` is the lowest set
/// bit of the result (higher bits may be false positives; only the lowest is used).
#[inline]
fn byte_eq(w: u64, b: u8) -> u64 {
    let x = w ^ (ONES * u64::from(b));
    x.wrapping_sub(ONES) & !x & (ONES << 7)
}

/// From just after an opening quote to just after its closing quote.
#[inline]
fn skip_string(s: &[u8], mut i: usize) -> Option<usize> {
    // Keys and most values are short: eight bytes at a time for the first 64, then
    // `memchr2` takes the long texts.
    let short_end = i.saturating_add(64);
    while i < short_end {
        let Some(w) = s.get(i..).and_then(|r| r.first_chunk::<8>()) else {
            break;
        };
        let w = u64::from_le_bytes(*w);
        let hit = byte_eq(w, b'"') | byte_eq(w, b'\\');
        if hit == 0 {
            i += 8;
            continue;
        }
        i += (hit.trailing_zeros() / 8) as usize;
        if s.get(i) == Some(&b'"') {
            return Some(i + 1);
        }
        i += 2;
    }
    loop {
        let rest = s.get(i..)?;
        let k = memchr2(b'"', b'\\', rest)?;
        if rest.get(k) == Some(&b'"') {
            return Some(i + k + 1);
        }
        i += k + 2;
    }
}

/// From just after an opening bracket to just after the bracket that closes it.
fn skip_container(s: &[u8], mut i: usize) -> Option<usize> {
    let mut depth: u32 = 1;
    while let Some(&b) = s.get(i) {
        match b {
            b'"' => {
                i = skip_string(s, i + 1)?;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Bytes that can be part of a number or a literal (`true`, `false`, `null`): letters,
/// digits, `+`, `-`, `.`. A scalar ends at anything else (structure, whitespace, quote).
const SCALAR: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric() || c == b'+' || c == b'-' || c == b'.';
        b += 1;
    }
    t
};

/// From the first byte of a value to just after it.
fn skip_value(s: &[u8], i: usize) -> Option<usize> {
    match s.get(i)? {
        b'"' => skip_string(s, i + 1),
        b'{' | b'[' => skip_container(s, i + 1),
        _ => {
            let mut j = i;
            while s.get(j).is_some_and(|&b| SCALAR[usize::from(b)]) {
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

/// A non-negative integer no larger than [`MAX_COUNT`] at `i`, or `None` (and the value
/// skipped) for anything else: negative, fractional, exponent, string, too large.
fn count(s: &[u8], i: usize) -> Option<(Option<u64>, usize)> {
    let mut j = i;
    let mut v: u64 = 0;
    while let Some(&b) = s.get(j) {
        if !b.is_ascii_digit() {
            break;
        }
        v = v.saturating_mul(10).saturating_add(u64::from(b - b'0'));
        j += 1;
    }
    let plain = j > i
        && !matches!(s.get(j), Some(b'.' | b'e' | b'E'))
        && !(s.get(i) == Some(&b'0') && j > i + 1);
    if plain && matches!(s.get(j), Some(&b) if b == b',' || b == b'}' || is_ws(b)) {
        return Some(((v <= MAX_COUNT).then_some(v), j));
    }
    Some((None, skip_value(s, i)?))
}

/// Calls `f(key, value_start)` for each member of the object whose `{` is at `i`; `f`
/// returns where the value ends. Returns the index just after the closing `}`.
fn members(s: &[u8], i: usize, mut f: impl FnMut(&[u8], usize) -> Option<usize>) -> Option<usize> {
    let mut i = skip_ws(s, i + 1);
    if s.get(i) == Some(&b'}') {
        return Some(i + 1);
    }
    loop {
        if s.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = skip_string(s, i + 1)?;
        let key = s.get(i + 1..key_end - 1)?;
        i = skip_ws(s, key_end);
        if s.get(i) != Some(&b':') {
            return None;
        }
        i = f(key, skip_ws(s, i + 1))?;
        i = skip_ws(s, i);
        match s.get(i)? {
            b',' => i = skip_ws(s, i + 1),
            b'}' => return Some(i + 1),
            _ => return None,
        }
    }
}

/// Reads the usage object whose `{` is at `i`: its counters and the index after its `}`.
/// `None` only if it is not well-formed enough to find its end.
pub(crate) fn usage_object(s: &[u8], i: usize) -> Option<(Counts, usize)> {
    let mut c = Counts::default();
    let end = members(s, i, |key, v| {
        let slot = match key {
            b"prompt_tokens" => &mut c.prompt,
            b"completion_tokens" => &mut c.completion,
            b"input_tokens" => &mut c.input,
            b"output_tokens" => &mut c.output,
            b"cache_read_input_tokens" => &mut c.cache_read,
            b"prompt_tokens_details" if s.get(v) == Some(&b'{') => {
                return members(s, v, |key, v| {
                    if key == b"cached_tokens" {
                        let (n, end) = count(s, v)?;
                        c.cached = n;
                        Some(end)
                    } else {
                        skip_value(s, v)
                    }
                });
            }
            _ => return skip_value(s, v),
        };
        let (n, end) = count(s, v)?;
        *slot = n;
        Some(end)
    })?;
    Some((c, end))
}

/// How many `"usage"` look-alikes after `choices` are checked before giving up: each check
/// scans to the end of the object holding it, so a line of nested look-alikes would
/// otherwise cost its length squared.
const MAX_CANDIDATES: usize = 16;

/// Scans one event's JSON text (an object, with optional whitespace around it). `None` if
/// it is not an object, or its top level is not well formed as far as it was read.
///
/// Members are read one by one until `choices`; its value (the bulk of a content chunk)
/// is not walked. Instead the rest is searched for `"usage"` with `memmem`, and a hit is
/// taken as the top-level member only if what follows its value closes exactly one
/// object and then the text ends. For well-formed JSON this is exact: a `"usage"` whose
/// quote is not escaped is a key, and only a top-level key is followed by nothing but the
/// top-level object's closing brace and further top-level members.
///
/// `known` is the text up to the `choices` value of an earlier event of the same stream
/// whose members before `choices` held no `usage`: engines start every chunk of a stream
/// with the same bytes (id, object, created, model), and the same bytes read the same, so
/// an event that starts with them goes straight to its `choices` value.
pub(crate) fn scan_event(p: &[u8], finder: &Finder<'_>, known: &mut Vec<u8>) -> Option<Event> {
    let mut i = skip_ws(p, 0);
    // An object from its first byte to its last: a line cut short is not trusted, even
    // where the members read before `choices` look fine.
    if p.get(i) != Some(&b'{') || p.trim_ascii_end().last() != Some(&b'}') {
        return None;
    }
    if !known.is_empty() && p.starts_with(known) {
        return Some(after_choices(p, known.len(), finder));
    }
    let mut ev = Event {
        choices: Choices::Absent,
        usage: None,
    };
    i = skip_ws(p, i + 1);
    if p.get(i) == Some(&b'}') {
        return (skip_ws(p, i + 1) == p.len()).then_some(ev);
    }
    // The comma before the current member, if it is not the first.
    let mut comma: Option<usize> = None;
    loop {
        if p.get(i) != Some(&b'"') {
            return None;
        }
        let key_start = i;
        let key_end = skip_string(p, i + 1)?;
        let key = p.get(i + 1..key_end - 1)?;
        i = skip_ws(p, key_end);
        if p.get(i) != Some(&b':') {
            return None;
        }
        let v = skip_ws(p, i + 1);
        let end = match key {
            b"usage" => {
                let (value, end) = usage_value(p, v)?;
                let after = skip_ws(p, end);
                let cut = match (comma, p.get(after)) {
                    (Some(c), _) => c..end,
                    (None, Some(b',')) => key_start..skip_ws(p, after + 1),
                    (None, _) => key_start..end,
                };
                ev.usage = Some(UsageMember {
                    cut,
                    value_at: v..end,
                    value,
                });
                end
            }
            b"choices" => {
                if ev.usage.is_some() {
                    // Both found: the rest cannot change what this event is.
                    ev.choices = choices(p, v);
                    return Some(ev);
                }
                if v <= MAX_KNOWN {
                    known.clear();
                    known.extend_from_slice(p.get(..v)?);
                }
                return Some(after_choices(p, v, finder));
            }
            _ => skip_value(p, v)?,
        };
        i = skip_ws(p, end);
        match p.get(i)? {
            b',' => {
                comma = Some(i);
                i = skip_ws(p, i + 1);
            }
            b'}' => {
                return (skip_ws(p, i + 1) == p.len()).then_some(ev);
            }
            _ => return None,
        }
    }
}

/// The most bytes before `choices` remembered for the next event.
const MAX_KNOWN: usize = 1024;

/// What the `choices` value at `v` holds.
fn choices(p: &[u8], v: usize) -> Choices {
    match p.get(v) {
        Some(b'[') if p.get(skip_ws(p, v + 1)) == Some(&b']') => Choices::Empty,
        Some(b'[') => Choices::NonEmpty,
        _ => Choices::Absent,
    }
}

/// The event whose `choices` value is at `v`, no `usage` member having come before it.
fn after_choices(p: &[u8], v: usize, finder: &Finder<'_>) -> Event {
    Event {
        choices: choices(p, v),
        usage: find_usage(p, v, finder),
    }
}

/// The value of a `usage` member at `v` and the index after it.
fn usage_value(p: &[u8], v: usize) -> Option<(UsageValue, usize)> {
    match p.get(v) {
        Some(b'{') => {
            let (c, end) = usage_object(p, v)?;
            Some((UsageValue::Object(c.usage()), end))
        }
        _ => Some((UsageValue::NotObject, skip_value(p, v)?)),
    }
}

/// The top-level `usage` member after `from` (where the `choices` value starts), found by
/// search rather than by walking the members in between.
fn find_usage(p: &[u8], from: usize, finder: &Finder<'_>) -> Option<UsageMember> {
    let mut at = from;
    let mut checked = 0;
    let mut found = None;
    while checked < MAX_CANDIDATES {
        let Some(k) = p.get(at..).and_then(|rest| finder.find(rest)) else {
            break;
        };
        let k = at + k;
        at = k + 1;
        // An escaped quote: the look-alike is inside a string.
        let backslashes = p
            .get(..k)?
            .iter()
            .rev()
            .take_while(|&&b| b == b'\\')
            .count();
        if backslashes % 2 == 1 {
            continue;
        }
        checked += 1;
        let colon = skip_ws(p, k + USAGE_KEY.len());
        if p.get(colon) != Some(&b':') {
            continue;
        }
        let start = skip_ws(p, colon + 1);
        let Some((value, end)) = usage_value(p, start) else {
            continue;
        };
        match closes_top_level(p, end) {
            Some(true) => {}
            Some(false) => continue,
            None => return found,
        }
        // Not the first member (`choices` came before), so a comma precedes it.
        let before = p.get(..k)?.iter().rposition(|&b| !is_ws(b))?;
        if p.get(before) != Some(&b',') {
            return found;
        }
        found = Some(UsageMember {
            cut: before..end,
            value_at: start..end,
            value,
        });
        // A later top-level `usage` (a repeated key) would win; look on.
        at = end;
    }
    found
}

/// The key searched for.
pub(crate) const USAGE_KEY: &[u8] = b"\"usage\"";

/// Whether the text after a member's value (from `i`) closes the object holding that
/// member and then ends: `Some(true)` if so (the member is at the top level),
/// `Some(false)` if that object closes before the end (the member was nested), `None` if
/// it never closes (not well-formed JSON).
fn closes_top_level(p: &[u8], mut i: usize) -> Option<bool> {
    let mut depth: u32 = 0;
    while let Some(&b) = p.get(i) {
        match b {
            b'"' => {
                i = skip_string(p, i + 1)?;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                if depth == 0 {
                    return Some(b == b'}' && skip_ws(p, i + 1) == p.len());
                }
                depth -= 1;
            }
            _ => {}
        }
        i += 1;
    }
    None
}
