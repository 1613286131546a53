//! The event-stream side: SSE lines found as chunks pass, each `data:` line's JSON scanned
//! for `choices` and `usage`, and (when rewriting) the usage the client did not ask for cut
//! out.
//!
//! Lines are found with `memchr`. A complete line inside a chunk is read in place; only a
//! line cut by the chunk's end is copied (into `held`), and completed by the next chunk.
//! While rewriting, that incomplete trailing line is also held back from the client (it
//! cannot use half an event anyway) and sent, edited or not, with the chunk that completes
//! it. A line longer than [`MAX_LINE`] is never held: from that point it is forwarded
//! unchanged and not read, so memory stays bounded whatever the engine sends.
//!
//! Edits, when the client did not ask for them:
//! - a usage-only chunk (`"choices":[]` and a usage object) is dropped with the blank line
//!   that ends its event (the blank line stays if the event had other lines, such as
//!   `event:`, so the next event's fields are not merged into it);
//! - the top-level `"usage"` member of a content chunk (at least one choice) is cut out of
//!   the JSON with its comma, every other byte as the engine sent it; or, for an engine
//!   that writes `"usage":null` on chunks without usage, only its value is replaced by
//!   `null` (a value already `null` is left alone).
//!
//! Each `data:` line is read on its own (engines write one line per event); a JSON value
//! split over several `data:` lines of one event is not reassembled. Lines end at `\n`
//! (`\r\n` included); a bare `\r`, which SSE also allows but no engine writes, does not end
//! a line here, so such a stream is forwarded unchanged once its first "line" passes
//! [`MAX_LINE`].

use super::json::{scan_event, Choices, UsageValue, USAGE_KEY};
use super::{Stats, Usage};
use alloc::vec::Vec;
use core::ops::Range;
use memchr::memchr;
use memchr::memmem::Finder;

/// The longest line (without its line end) read or held back; longer ones are forwarded
/// unchanged and counted as a content chunk if they are `data:` lines.
pub const MAX_LINE: usize = 64 * 1024;

/// The most capacity the held-line buffer keeps between lines (a rare long line's buffer
/// is freed once it has been read).
const KEPT_CAPACITY: usize = 4096;

/// What to do with one line.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Edit {
    Keep,
    /// The whole line, line end included.
    Drop,
    /// These bytes of the line (relative to its start) removed.
    Cut(Range<usize>),
    /// These bytes of the line (relative to its start) replaced by `null`.
    Null(Range<usize>),
}

/// What replaces a usage value the client did not ask for, when the member stays.
const NULL: &[u8] = b"null";

/// Which usage the client's stream keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rewrite {
    /// Drop usage-only chunks.
    pub drop_final: bool,
    /// Remove the usage of content chunks.
    pub strip_chunks: bool,
    /// Remove it by writing `null` for its value (the member stays), not by cutting the
    /// member out.
    pub null_chunks: bool,
}

/// Output written lazily: while nothing was edited, forwarding the chunk's bytes costs
/// nothing; the first edit copies what was forwarded so far and switches to `out`.
struct Out<'a> {
    chunk: &'a [u8],
    out: &'a mut Vec<u8>,
    /// Rewriting at all (observe-only: every call is a no-op).
    on: bool,
    /// `out` holds everything forwarded so far.
    replaced: bool,
    /// Bytes of `chunk` dealt with (forwarded or dropped).
    cursor: usize,
}

impl Out<'_> {
    fn switch(&mut self) {
        if self.on && !self.replaced {
            self.out
                .extend_from_slice(self.chunk.get(..self.cursor).unwrap_or_default());
            self.replaced = true;
        }
    }

    /// Forwards the chunk's bytes up to `end`.
    fn keep(&mut self, end: usize) {
        if self.on && self.replaced {
            self.out
                .extend_from_slice(self.chunk.get(self.cursor..end).unwrap_or_default());
        }
        self.cursor = end;
    }

    /// Does not forward the chunk's bytes up to `end`.
    fn skip(&mut self, end: usize) {
        self.switch();
        self.cursor = end;
    }

    /// Forwards bytes that are not the chunk's (a line held from earlier chunks).
    fn emit(&mut self, bytes: &[u8]) {
        if self.on && !bytes.is_empty() {
            self.switch();
            self.out.extend_from_slice(bytes);
        }
    }

    /// Forwards the chunk's line at `line`, edited.
    fn line(&mut self, line: Range<usize>, edit: &Edit) {
        match edit {
            Edit::Keep => self.keep(line.end),
            Edit::Drop => self.skip(line.end),
            Edit::Cut(cut) => {
                self.keep(line.start + cut.start);
                self.skip(line.start + cut.end);
                self.keep(line.end);
            }
            Edit::Null(value) => {
                self.keep(line.start + value.start);
                self.skip(line.start + value.end);
                self.emit(NULL);
                self.keep(line.end);
            }
        }
    }
}

/// Forwards `line` (not the chunk's bytes), edited.
fn emit_edited(out: &mut Out<'_>, line: &[u8], edit: &Edit) {
    match edit {
        Edit::Keep => out.emit(line),
        Edit::Drop => out.skip(out.cursor),
        Edit::Cut(cut) => {
            out.emit(line.get(..cut.start).unwrap_or_default());
            out.emit(line.get(cut.end..).unwrap_or_default());
            // A cut that leaves nothing around it still replaces the chunk.
            out.skip(out.cursor);
        }
        Edit::Null(value) => {
            out.emit(line.get(..value.start).unwrap_or_default());
            out.emit(NULL);
            out.emit(line.get(value.end..).unwrap_or_default());
            out.skip(out.cursor);
        }
    }
}

/// Whether `a` followed by `b` starts with `data:`.
fn starts_with_data(a: &[u8], b: &[u8]) -> bool {
    const DATA: &[u8] = b"data:";
    let n = a.len().min(DATA.len());
    a.get(..n) == DATA.get(..n) && (n == DATA.len() || b.get(..DATA.len() - n) == DATA.get(n..))
}

/// The SSE state of one response.
#[derive(Debug)]
pub(crate) struct SseScan {
    /// Edits made (`None`: observe only).
    rewrite: Option<Rewrite>,
    /// The start of a line cut by a chunk's end (at most [`MAX_LINE`] bytes).
    held: Vec<u8>,
    /// The current line passed [`MAX_LINE`]: forwarded unchanged up to its line end.
    overlong: bool,
    /// A usage-only event's line was dropped: drop the blank line that ends its event.
    drop_blank: bool,
    /// A line of the current event was forwarded.
    event_open: bool,
    /// The search for the `"usage"` key, built once.
    finder: Finder<'static>,
    /// The text before `choices` that this stream's events start with (see
    /// [`scan_event`]).
    known_prefix: Vec<u8>,
}

impl SseScan {
    pub fn new(rewrite: Option<Rewrite>) -> Self {
        SseScan {
            rewrite,
            held: Vec::new(),
            overlong: false,
            drop_blank: false,
            event_open: false,
            finder: Finder::new(USAGE_KEY),
            known_prefix: Vec::new(),
        }
    }

    /// Bytes held for an incomplete line.
    #[cfg(test)]
    pub fn held_len(&self) -> usize {
        self.held.len()
    }

    /// From now on only reads (what was held is kept for reading, never sent).
    pub fn stop_rewriting(&mut self) {
        self.rewrite = None;
        self.drop_blank = false;
    }

    /// Whether any edit is ever made.
    pub fn rewrites(&self) -> bool {
        self.rewrite.is_some()
    }

    /// Reads one chunk. Returns whether `out` replaces it.
    pub fn feed(
        &mut self,
        chunk: &[u8],
        end_of_stream: bool,
        out: &mut Vec<u8>,
        stats: &mut Stats,
    ) -> bool {
        out.clear();
        let mut w = Out {
            chunk,
            out,
            on: self.rewrite.is_some(),
            replaced: false,
            cursor: 0,
        };
        let mut pos = 0;
        // The rest of a line begun in an earlier chunk.
        if self.overlong {
            match memchr(b'\n', chunk) {
                Some(j) => {
                    self.overlong = false;
                    pos = j + 1;
                }
                None => pos = chunk.len(),
            }
            w.keep(pos);
        } else if !self.held.is_empty() {
            let (end, complete) = match memchr(b'\n', chunk) {
                Some(j) => (j + 1, true),
                None => (chunk.len(), false),
            };
            let part = chunk.get(..end).unwrap_or_default();
            let content = self.held.len() + end - usize::from(complete);
            if content > MAX_LINE {
                self.overlong_line(starts_with_data(&self.held, part), stats);
                w.emit(&self.held);
                w.keep(end);
                self.held.clear();
                self.overlong = !complete;
            } else if complete {
                self.held.extend_from_slice(part);
                let line = core::mem::take(&mut self.held);
                let edit = self.line(&line, stats);
                emit_edited(&mut w, &line, &edit);
                w.skip(end);
                // Keep the buffer for the next cut line, unless a long one grew it.
                if line.capacity() <= KEPT_CAPACITY {
                    self.held = line;
                    self.held.clear();
                }
            } else {
                self.held.extend_from_slice(part);
                w.skip(end);
            }
            pos = end;
        }
        // Lines complete within the chunk, read in place.
        while let Some(j) = chunk.get(pos..).and_then(|rest| memchr(b'\n', rest)) {
            let line = pos..pos + j + 1;
            if j > MAX_LINE {
                let text = chunk.get(line.clone()).unwrap_or_default();
                self.overlong_line(starts_with_data(text, b""), stats);
                w.keep(line.end);
            } else {
                let edit = self.line(chunk.get(line.clone()).unwrap_or_default(), stats);
                w.line(line.clone(), &edit);
            }
            pos = line.end;
        }
        // A line cut by the chunk's end.
        if let Some(tail) = chunk.get(pos..).filter(|t| !t.is_empty()) {
            if tail.len() > MAX_LINE {
                self.overlong_line(starts_with_data(tail, b""), stats);
                w.keep(chunk.len());
                self.overlong = true;
            } else {
                self.held.extend_from_slice(tail);
                w.skip(chunk.len());
            }
        }
        if end_of_stream {
            // The last line has no line end; it is read all the same.
            if !self.held.is_empty() {
                let line = core::mem::take(&mut self.held);
                let edit = self.line(&line, stats);
                emit_edited(&mut w, &line, &edit);
            }
            self.overlong = false;
        }
        w.replaced
    }

    /// A line too long to read: forwarded unchanged; a `data:` line counts as a content
    /// chunk (only generated text makes an event that long), its usage unread.
    fn overlong_line(&mut self, is_data: bool, stats: &mut Stats) {
        if is_data {
            stats.content_chunks = stats.content_chunks.saturating_add(1);
        }
        self.drop_blank = false;
        self.event_open = true;
    }

    /// Reads one complete line (with its line end, if it has one) and decides its edit.
    fn line(&mut self, line: &[u8], stats: &mut Stats) -> Edit {
        let content = line.strip_suffix(b"\n").unwrap_or(line);
        let content = content.strip_suffix(b"\r").unwrap_or(content);
        if content.is_empty() {
            let drop = core::mem::take(&mut self.drop_blank);
            self.event_open = false;
            return if drop { Edit::Drop } else { Edit::Keep };
        }
        self.drop_blank = false;
        let edit = match content.strip_prefix(b"data:") {
            Some(payload) => self.data(content.len() - payload.len(), payload, stats),
            None => Edit::Keep,
        };
        if edit != Edit::Drop {
            self.event_open = true;
        }
        edit
    }

    /// Reads a `data:` line's payload (at `offset` in its line) and decides its edit.
    fn data(&mut self, mut offset: usize, payload: &[u8], stats: &mut Stats) -> Edit {
        let payload = match payload.strip_prefix(b" ") {
            Some(p) => {
                offset += 1;
                p
            }
            None => payload,
        };
        if payload.trim_ascii() == b"[DONE]" {
            stats.done = true;
            return Edit::Keep;
        }
        let Some(ev) = scan_event(payload, &self.finder, &mut self.known_prefix) else {
            return Edit::Keep;
        };
        if ev.choices == Choices::NonEmpty {
            stats.content_chunks = stats.content_chunks.saturating_add(1);
        }
        let Some(member) = ev.usage else {
            return Edit::Keep;
        };
        let is_object = matches!(member.value, UsageValue::Object(_));
        if let UsageValue::Object(Some(u)) = member.value {
            record(stats, u, ev.choices);
        }
        let Some(rw) = self.rewrite else {
            return Edit::Keep;
        };
        match ev.choices {
            Choices::Empty if is_object && rw.drop_final => {
                if !self.event_open {
                    self.drop_blank = true;
                }
                Edit::Drop
            }
            Choices::NonEmpty if rw.strip_chunks && rw.null_chunks => {
                let value = member.value_at;
                if payload.get(value.clone()) == Some(NULL) {
                    // Already what the client would have received.
                    Edit::Keep
                } else {
                    Edit::Null(value.start + offset..value.end + offset)
                }
            }
            Choices::NonEmpty if rw.strip_chunks => {
                Edit::Cut(member.cut.start + offset..member.cut.end + offset)
            }
            _ => Edit::Keep,
        }
    }
}

/// Records one event's usage: per-chunk usage on a content chunk, the final usage
/// otherwise (the usage-only chunk, or an event with no `choices` at all).
fn record(stats: &mut Stats, u: Usage, choices: Choices) {
    match choices {
        Choices::NonEmpty => stats.chunk_usage = Some(u),
        Choices::Empty | Choices::Absent => stats.final_usage = Some(u),
    }
}
