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

mod lex;

pub(crate) use lex::raw_lines;
use lex::{is_name_byte, is_name_start, parse_label_item, Cursor, LabelItem};

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

/// Parses a value or timestamp token. Rust's grammar accepts `NaN`, `+Inf`, `-Inf`,
/// `Infinity` (any case) and exponents, which is what the format allows.
fn parse_float(token: &str) -> Option<f64> {
    if token.is_empty() {
        return None;
    }
    token.parse::<f64>().ok()
}
