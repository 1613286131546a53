//! A tolerant, allocation-free reader for the Prometheus text exposition format.
//!
//! One page is a sequence of lines; [`parse_line`] classifies each as blank, comment,
//! `# HELP`, `# TYPE`, a sample, or invalid. What is accepted:
//!
//! - `\n` or `\r\n` line ends; blanks and tabs as separators (leading ones too);
//! - `# HELP name text`, `# TYPE name kind`, any other `#` line is a comment
//!   (OpenMetrics `# UNIT` and `# EOF` included);
//! - samples `name{label="value",...} value [timestamp]`, with an optional trailing comma in
//!   the label set, blanks around labels, label values escaped with `\\`, `\"` and `\n`
//!   (an unknown escape is kept literally rather than rejecting the line), and the
//!   Prometheus 3 quoted forms `{"metric.name", "label.name"="v"}`;
//! - values as Rust's float grammar reads them, which covers `NaN`, `+Inf`, `-Inf` and
//!   exponents; an optional integer or float timestamp; an OpenMetrics exemplar
//!   (`# {...} v`) after the value is ignored.
//!
//! Histogram and summary series (`_bucket`, `_sum`, `_count`, `quantile=`) are ordinary
//! samples here; the extractor ignores them simply because it never asks for their names.
//! A line that fits none of the above is [`Line::Invalid`]: it is skipped, never an error
//! for the page, and nothing here can panic — every byte access is checked.
//!
//! Cost: one pass over the line; label sets are validated on parse and re-read lazily by
//! [`Sample::labels`], so no sample allocates unless a label value contains an escape.

use alloc::borrow::Cow;
use alloc::string::String;

/// The declared type of a metric family (`# TYPE name kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    /// `counter`
    Counter,
    /// `gauge`
    Gauge,
    /// `histogram`
    Histogram,
    /// `summary`
    Summary,
    /// `untyped` or OpenMetrics `unknown`
    Untyped,
    /// Any other word (`info`, `stateset`, `gaugehistogram`, ...).
    Other,
}

impl MetricKind {
    fn from_word(word: &str) -> MetricKind {
        match word {
            "counter" => MetricKind::Counter,
            "gauge" => MetricKind::Gauge,
            "histogram" => MetricKind::Histogram,
            "summary" => MetricKind::Summary,
            "untyped" | "unknown" => MetricKind::Untyped,
            _ => MetricKind::Other,
        }
    }
}

/// One classified line of an exposition page.
#[derive(Clone, Debug, PartialEq)]
pub enum Line<'a> {
    /// Empty or only blanks.
    Blank,
    /// A `#` line that is neither a well-formed HELP nor TYPE.
    Comment,
    /// `# HELP name text` (the text is kept raw, escapes not undone).
    Help {
        /// Metric family name.
        name: &'a str,
        /// The docstring as written.
        text: &'a str,
    },
    /// `# TYPE name kind`.
    Type {
        /// Metric family name.
        name: &'a str,
        /// Declared kind.
        kind: MetricKind,
    },
    /// A sample line.
    Sample(Sample<'a>),
    /// Anything malformed (including invalid UTF-8); skipped by readers.
    Invalid,
}

/// One sample: a metric name, its label set, a value and an optional timestamp.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample<'a> {
    /// The metric name (borrowed unless it was quoted and escaped).
    pub name: Cow<'a, str>,
    /// The validated text between `{` and `}`; read it with [`Sample::labels`].
    raw_labels: &'a str,
    /// The value; may be NaN or infinite, exactly as the page said.
    pub value: f64,
    /// The timestamp as written: milliseconds in the Prometheus format, seconds in
    /// OpenMetrics. The extractor ignores it.
    pub timestamp: Option<f64>,
}

impl<'a> Sample<'a> {
    /// Iterates the `(name, value)` label pairs, escapes undone.
    pub fn labels(&self) -> Labels<'a> {
        Labels {
            cur: Cursor::new(self.raw_labels),
        }
    }

    /// The value of label `key`, if present (the first one if repeated).
    pub fn label(&self, key: &str) -> Option<Cow<'a, str>> {
        self.labels().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

/// Iterator over a sample's label pairs (see [`Sample::labels`]).
#[derive(Clone, Debug)]
pub struct Labels<'a> {
    cur: Cursor<'a>,
}

impl<'a> Iterator for Labels<'a> {
    type Item = (Cow<'a, str>, Cow<'a, str>);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let item = parse_label_item(&mut self.cur)?;
            if let LabelItem::Pair(k, v) = item {
                return Some((k, v));
            }
            // A quoted metric name inside the braces is not a label: skip it.
        }
    }
}

/// Splits a page into lines (`\n`, with a trailing `\r` removed) and classifies each.
/// A line that is not valid UTF-8 is [`Line::Invalid`].
pub fn lines(page: &[u8]) -> impl Iterator<Item = Line<'_>> {
    raw_lines(page).map(|raw| match core::str::from_utf8(raw) {
        Ok(text) => parse_line(text),
        Err(_) => Line::Invalid,
    })
}

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

/// Classifies one line (without its line terminator; a stray trailing `\r` is tolerated).
pub fn parse_line(line: &str) -> Line<'_> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    let mut cur = Cursor::new(line);
    cur.skip_blanks();
    match cur.peek() {
        None => Line::Blank,
        Some(b'#') => parse_comment(&mut cur),
        Some(_) => parse_sample(&mut cur).map_or(Line::Invalid, Line::Sample),
    }
}

/// The bare metric name a sample line starts with, or `None` for comments, blank lines
/// and quoted-name samples. Lets a reader skip unwanted lines before UTF-8 validation.
pub(crate) fn leading_bare_name(line: &[u8]) -> Option<&[u8]> {
    let start = line.iter().position(|&b| b != b' ' && b != b'\t')?;
    let rest = line.get(start..)?;
    let len = rest
        .iter()
        .position(|&b| !is_name_byte(b))
        .unwrap_or(rest.len());
    match rest.first() {
        Some(&b) if is_name_start(b) => rest.get(..len),
        _ => None,
    }
}

fn parse_comment<'a>(cur: &mut Cursor<'a>) -> Line<'a> {
    cur.bump(); // '#'
    if cur.skip_blanks() == 0 {
        return Line::Comment;
    }
    let keyword = cur.take_while(|b| b != b' ' && b != b'\t');
    if keyword != "HELP" && keyword != "TYPE" {
        return Line::Comment;
    }
    if cur.skip_blanks() == 0 {
        return Line::Comment;
    }
    let name = cur.take_while(is_name_byte);
    if name.is_empty() || !name.bytes().next().is_some_and(is_name_start) {
        return Line::Comment;
    }
    let gap = cur.skip_blanks();
    let rest = cur.rest();
    if keyword == "HELP" {
        if gap == 0 && !rest.is_empty() {
            return Line::Comment;
        }
        return Line::Help { name, text: rest };
    }
    let kind = rest.trim_end_matches([' ', '\t']);
    if gap == 0 || kind.is_empty() || kind.contains([' ', '\t']) {
        return Line::Comment;
    }
    Line::Type {
        name,
        kind: MetricKind::from_word(kind),
    }
}

fn parse_sample<'a>(cur: &mut Cursor<'a>) -> Option<Sample<'a>> {
    let mut name: Option<Cow<'a, str>> = None;
    if cur.peek().is_some_and(is_name_start) {
        name = Some(Cow::Borrowed(cur.take_while(is_name_byte)));
        cur.skip_blanks();
    }
    let mut raw_labels = "";
    if cur.peek() == Some(b'{') {
        cur.bump();
        let start = cur.pos;
        let mut first = true;
        loop {
            cur.skip_blanks();
            if cur.peek() == Some(b'}') {
                break;
            }
            match parse_label_item(cur)? {
                LabelItem::Name(quoted) => {
                    // Only the first item may be a quoted metric name, and only once.
                    if !first || name.is_some() {
                        return None;
                    }
                    name = Some(quoted);
                }
                LabelItem::Pair(..) => {}
            }
            first = false;
            cur.skip_blanks();
            match cur.peek() {
                Some(b',') => cur.bump(),
                Some(b'}') => break,
                _ => return None,
            }
        }
        raw_labels = cur.s.get(start..cur.pos)?;
        cur.bump(); // '}'
    }
    let name = name.filter(|n| !n.is_empty())?;
    cur.skip_blanks();
    // The value follows a blank or the closing brace; anything else glued to the name
    // (`foo-1`) is malformed.
    let before_value = cur.pos.checked_sub(1).and_then(|p| cur.s.as_bytes().get(p));
    if !matches!(before_value, Some(b' ' | b'\t' | b'}')) {
        return None;
    }
    let value = parse_float(cur.take_while(|b| b != b' ' && b != b'\t'))?;
    let mut timestamp = None;
    if cur.skip_blanks() > 0 && cur.peek().is_some_and(|b| b != b'#') {
        timestamp = Some(parse_float(cur.take_while(|b| b != b' ' && b != b'\t'))?);
        cur.skip_blanks();
    }
    match cur.peek() {
        None | Some(b'#') => Some(Sample {
            name,
            raw_labels,
            value,
            timestamp,
        }),
        Some(_) => None,
    }
}

/// An item inside `{...}`: a `name="value"` pair or a lone quoted metric name.
enum LabelItem<'a> {
    Pair(Cow<'a, str>, Cow<'a, str>),
    Name(Cow<'a, str>),
}

/// Reads one item and the separator after it (leaves the cursor on `,`/`}` or the next
/// item). Returns `None` at the end of the set or on malformed input.
fn parse_label_item<'a>(cur: &mut Cursor<'a>) -> Option<LabelItem<'a>> {
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

/// Parses a value or timestamp token. Rust's grammar accepts `NaN`, `+Inf`, `-Inf`,
/// `Infinity` (any case) and exponents, which is what the format allows.
fn parse_float(token: &str) -> Option<f64> {
    if token.is_empty() {
        return None;
    }
    token.parse::<f64>().ok()
}

fn is_name_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b':'
}

fn is_name_byte(b: u8) -> bool {
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
struct Cursor<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(s: &'a str) -> Self {
        Cursor { s, pos: 0 }
    }

    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.pos).copied()
    }

    fn bump(&mut self) {
        if self.pos < self.s.len() {
            self.pos += 1;
        }
    }

    /// Skips blanks and tabs; returns how many were skipped.
    fn skip_blanks(&mut self) -> usize {
        let start = self.pos;
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
        self.pos - start
    }

    fn take_while(&mut self, keep: impl Fn(u8) -> bool) -> &'a str {
        let start = self.pos;
        while self.peek().is_some_and(&keep) {
            self.pos += 1;
        }
        self.s.get(start..self.pos).unwrap_or("")
    }

    fn rest(&self) -> &'a str {
        self.s.get(self.pos..).unwrap_or("")
    }
}
