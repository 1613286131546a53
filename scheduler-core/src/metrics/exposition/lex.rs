//! The lexical layer of the exposition reader: line splitting, a checked byte cursor,
//! quoted strings and label items. Everything here is total: malformed input yields
//! `None`, never a panic.

use alloc::borrow::Cow;
use alloc::string::String;

/// Splits a page into raw lines without their `\n` / `\r\n` terminators (like
/// `split(b'\n')`, including a last empty piece after a final `\n`).
pub(crate) fn raw_lines(page: &[u8]) -> RawLines<'_> {
    RawLines { rest: Some(page) }
}

/// Iterator of [`raw_lines`]. Finding line ends dominates the cost of reading a page (most
/// lines are dropped after their name), so it scans eight bytes per step.
pub(crate) struct RawLines<'a> {
    rest: Option<&'a [u8]>,
}

impl<'a> Iterator for RawLines<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.rest?;
        let (line, after) = match find_newline(rest) {
            Some(at) => (rest.get(..at)?, rest.get(at + 1..)),
            None => (rest, None),
        };
        self.rest = after;
        Some(line.strip_suffix(b"\r").unwrap_or(line))
    }
}

/// Index of the first `\n` in `bytes`. Word-at-a-time: `x - 0x01..01 & !x & 0x80..80` is
/// non-zero iff a byte of `x` is zero, and its lowest set bit marks the first such byte
/// (higher ones may be false positives, which is why only the lowest is used).
fn find_newline(bytes: &[u8]) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    const NEWLINES: u64 = LO * b'\n' as u64;
    let mut chunks = bytes.chunks_exact(8);
    let mut offset = 0;
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word) ^ NEWLINES;
        let found = x.wrapping_sub(LO) & !x & HI;
        if found != 0 {
            return Some(offset + (found.trailing_zeros() / 8) as usize);
        }
        offset += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| b == b'\n')
        .map(|at| offset + at)
}

/// An item inside `{...}`: a `name="value"` pair or a lone quoted metric name.
pub(super) enum LabelItem<'a> {
    Pair(Cow<'a, str>, Cow<'a, str>),
    Name(Cow<'a, str>),
}

/// Reads one item and the separator after it (leaves the cursor on `,`/`}` or the next
/// item). Returns `None` at the end of the set or on malformed input.
pub(super) fn parse_label_item<'a>(cur: &mut Cursor<'a>) -> Option<LabelItem<'a>> {
    cur.skip_blanks();
    if cur.peek() == Some(b',') {
        cur.bump();
        cur.skip_blanks();
    }
    let key = match cur.peek()? {
        b'"' => {
            let quoted = parse_quoted(cur)?;
            cur.skip_blanks();
            if cur.peek() != Some(b'=') {
                return Some(LabelItem::Name(quoted));
            }
            quoted
        }
        b if is_label_start(b) => Cow::Borrowed(cur.take_while(is_label_byte)),
        _ => return None,
    };
    cur.skip_blanks();
    if cur.peek() != Some(b'=') {
        return None;
    }
    cur.bump();
    cur.skip_blanks();
    if cur.peek() != Some(b'"') {
        return None;
    }
    let value = parse_quoted(cur)?;
    Some(LabelItem::Pair(key, value))
}

/// Reads a `"..."` string at the cursor, undoing `\\`, `\"` and `\n`.
fn parse_quoted<'a>(cur: &mut Cursor<'a>) -> Option<Cow<'a, str>> {
    cur.bump(); // opening quote
    let start = cur.pos;
    let mut escaped = false;
    loop {
        match cur.peek()? {
            b'"' => break,
            b'\\' => {
                escaped = true;
                cur.bump();
                cur.peek()?;
                cur.bump();
            }
            _ => cur.bump(),
        }
    }
    let raw = cur.s.get(start..cur.pos)?;
    cur.bump(); // closing quote
    if !escaped {
        return Some(Cow::Borrowed(raw));
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            // Lenient: keep an unknown escape as written instead of dropping the line.
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    Some(Cow::Owned(out))
}

pub(super) fn is_name_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b':'
}

pub(super) fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

fn is_label_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

fn is_label_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// A byte cursor over a `&str`. It only stops on ASCII bytes, so every slice it hands
/// out starts and ends on a char boundary; slicing still goes through `get`.
#[derive(Clone, Debug)]
pub(super) struct Cursor<'a> {
    pub(super) s: &'a str,
    pub(super) pos: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(s: &'a str) -> Self {
        Cursor { s, pos: 0 }
    }

    pub(super) fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.pos).copied()
    }

    pub(super) fn bump(&mut self) {
        if self.pos < self.s.len() {
            self.pos += 1;
        }
    }

    /// Skips blanks and tabs; returns how many were skipped.
    pub(super) fn skip_blanks(&mut self) -> usize {
        let start = self.pos;
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
        self.pos - start
    }

    pub(super) fn take_while(&mut self, keep: impl Fn(u8) -> bool) -> &'a str {
        let start = self.pos;
        while self.peek().is_some_and(&keep) {
            self.pos += 1;
        }
        self.s.get(start..self.pos).unwrap_or("")
    }

    pub(super) fn rest(&self) -> &'a str {
        self.s.get(self.pos..).unwrap_or("")
    }
}
