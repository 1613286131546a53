//! Token usage read from responses as they stream past: SSE and JSON bodies.
//!
//! The gateway asks the engine for usage on every streamed request (it forces
//! `stream_options.include_usage` and `continuous_usage_stats`), so an engine's stream
//! carries a `"usage"` object on every content chunk and a final usage-only chunk
//! (`"choices":[]`) before `data: [DONE]`. A [`UsageTracker`] watches one response body
//! chunk by chunk and does two things:
//!
//! - **reads usage**: the top-level `usage` object's `prompt_tokens`, `completion_tokens`
//!   and `prompt_tokens_details.cached_tokens` (or Anthropic's `input_tokens`,
//!   `output_tokens`, `cache_read_input_tokens`). The final usage (the usage-only chunk,
//!   or an event without `choices`, such as Anthropic's `message_delta`) wins; a stream cut off
//!   before it is known by its last per-chunk usage; a stream without any usage by its
//!   content chunks counted ([`UsageSource`]).
//! - **gives the client its own stream back**: when the client did not ask for some of the
//!   usage the gateway forced, that usage is removed and every other byte passes as the
//!   engine sent it. Without `include_usage`, the usage-only chunk's `data:` line goes with
//!   the blank line ending its event (that line stays if the event had other fields, such
//!   as `event:`). Without per-chunk usage (`include_usage` and `continuous_usage`), the
//!   top-level `"usage"` member of each content chunk (`{...}` or `null`) is cut out of
//!   its JSON with its comma; for an engine that writes `"usage":null` on chunks without
//!   usage ([`ClientWants::null_when_absent`]), the member stays and its value becomes
//!   `null`. Comments, other fields, `[DONE]`, CRLF line ends and unknown members pass
//!   untouched.
//!
//! Nothing is buffered. Chunk boundaries may fall anywhere (inside a line, a UTF-8
//! sequence, a number); only an SSE line cut by a chunk's end is copied until the next
//! chunk completes it, and while rewriting it is held back from the client until then
//! (never more than one line, at most [`MAX_LINE`] bytes). A non-streamed JSON body is
//! scanned with its grammar state kept across chunks and never held.
//!
//! Speed (≥ 1 GB/s in every mode, `benches/usage.rs`): lines are found with `memchr`; each
//! `data:` line's JSON is read member by member up to `choices` (string contents skipped
//! eight bytes at a time; skipped altogether when the line starts with the same bytes as
//! an earlier event of the stream, as engines' chunks do), the rest searched for the
//! `"usage"` key with `memmem`, and only the usage object itself is parsed. No JSON tree
//! is ever built.
//!
//! Values that are not plain non-negative integers up to 2^53 are ignored, not trusted. A
//! `"usage"` key counts only as a member of the event's top-level object, never inside a
//! string or a nested object.

mod body;
mod json;
mod sse;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_golden;
#[cfg(test)]
mod tests_prop;

use alloc::vec::Vec;

pub use body::MAX_USAGE_TEXT;
pub use json::MAX_COUNT;
pub use sse::MAX_LINE;

/// What the client itself asked for in its request, before the gateway forced usage on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientWants {
    /// `stream_options.include_usage`: the final usage-only chunk.
    pub include_usage: bool,
    /// `stream_options.continuous_usage_stats`: usage on every content chunk. Engines honour
    /// it only together with `include_usage`, so alone it asks for nothing.
    pub continuous_usage: bool,
    /// The engine writes `"usage":null` on chunks without usage, so a removed usage value
    /// becomes `null` rather than the member going (vLLM's `/v1/completions` stream, and
    /// SGLang, do this; vLLM's chat stream omits the member).
    pub null_when_absent: bool,
}

/// How the response body is framed (from `content-type`: `text/event-stream` -> EventStream).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    /// Server-sent events: `data: {json}` lines, `data: [DONE]` last.
    EventStream,
    /// One JSON object.
    Json,
}

/// Tokens of one response.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Input tokens: `prompt_tokens`, or Anthropic's `input_tokens`; 0 if absent.
    pub prompt_tokens: u64,
    /// Generated tokens: `completion_tokens`, or Anthropic's `output_tokens`.
    pub completion_tokens: u64,
    /// Prompt tokens served from the engine's prefix cache (part of `prompt_tokens`).
    pub cached_tokens: u64,
}

/// How the tokens of a response were known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageSource {
    /// A final usage object (non-stream body, or the stream's usage-only chunk).
    Usage,
    /// Only per-chunk (continuous) usage: the stream ended before its final usage; the last one seen.
    ContinuousUsage,
    /// No usage at all; completion tokens = content chunks counted.
    ChunkCount,
    /// Nothing seen (no body, or nothing parseable).
    None,
}

impl UsageSource {
    /// The name used in billing records and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            UsageSource::Usage => "usage",
            UsageSource::ContinuousUsage => "continuous_usage",
            UsageSource::ChunkCount => "chunk_count",
            UsageSource::None => "none",
        }
    }
}

/// The usage known about a response so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsageReport {
    /// For [`UsageSource::ChunkCount`]: prompt 0, completion = `content_chunks`.
    pub usage: Usage,
    /// Where `usage` came from; the billing record names it ([`UsageSource::as_str`]).
    pub source: UsageSource,
    /// SSE data events with at least one choice (not `[DONE]`, not usage-only).
    pub content_chunks: u64,
    /// `data: [DONE]` seen, or the JSON body's value complete.
    pub done: bool,
}

/// What to forward for one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forward {
    /// The chunk as it came.
    Unchanged,
    /// The bytes the tracker wrote into `out` instead (possibly none).
    Replaced,
}

/// What was read from the body so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    /// The last final usage (usage-only chunk, or an event without `choices`).
    pub final_usage: Option<Usage>,
    /// The last per-chunk usage of a content chunk.
    pub chunk_usage: Option<Usage>,
    pub content_chunks: u64,
    pub done: bool,
}

/// The scan of one body, by its framing.
// The SSE side carries its `memmem` searcher (~300 bytes); one tracker lives per response
// and is never moved on a hot path, so it is not boxed.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Scan {
    Sse(sse::SseScan),
    Body(body::BodyScan),
}

/// Watches one response body: reads its usage and, for an event stream, removes the usage
/// the client did not ask for.
#[derive(Debug)]
pub struct UsageTracker {
    scan: Scan,
    stats: Stats,
    rewrites: bool,
}

impl UsageTracker {
    /// A tracker for a body of `kind` whose client asked for `wants`.
    pub fn new(kind: BodyKind, wants: ClientWants) -> UsageTracker {
        let scan = match kind {
            BodyKind::Json => Scan::Body(body::BodyScan::new()),
            BodyKind::EventStream => {
                // Per-chunk usage reaches a client only if it asked for both.
                let continuous = wants.include_usage && wants.continuous_usage;
                let rewrite = (!continuous).then_some(sse::Rewrite {
                    drop_final: !wants.include_usage,
                    strip_chunks: true,
                    null_chunks: wants.null_when_absent,
                });
                Scan::Sse(sse::SseScan::new(rewrite))
            }
        };
        let rewrites = matches!(&scan, Scan::Sse(s) if s.rewrites());
        UsageTracker {
            scan,
            stats: Stats::default(),
            rewrites,
        }
    }

    /// A tracker that runs the rewriting machinery (lines held back, output rebuilt) with
    /// the given edits (possibly none): for testing that it alone changes nothing.
    #[cfg(test)]
    pub(crate) fn with_edits(drop_final: bool, strip_chunks: bool) -> UsageTracker {
        UsageTracker {
            scan: Scan::Sse(sse::SseScan::new(Some(sse::Rewrite {
                drop_final,
                strip_chunks,
                null_chunks: false,
            }))),
            stats: Stats::default(),
            rewrites: true,
        }
    }

    /// Whether this tracker ever rewrites (EventStream and the client did not ask for all the usage the gateway forced).
    pub fn rewrites(&self) -> bool {
        self.rewrites
    }

    /// Observe one response chunk. With `Forward::Replaced`, `out` (cleared first) holds the bytes to send instead
    /// (possibly empty: everything held back or dropped). `end_of_stream`: last chunk: flush anything held.
    pub fn feed(&mut self, chunk: &[u8], end_of_stream: bool, out: &mut Vec<u8>) -> Forward {
        match &mut self.scan {
            Scan::Body(b) => {
                b.feed(chunk);
                self.stats.done = b.complete();
                self.stats.final_usage = b.usage();
                Forward::Unchanged
            }
            Scan::Sse(s) => {
                if !self.rewrites {
                    s.feed(chunk, end_of_stream, out, &mut self.stats);
                    return Forward::Unchanged;
                }
                if s.feed(chunk, end_of_stream, out, &mut self.stats) {
                    Forward::Replaced
                } else {
                    Forward::Unchanged
                }
            }
        }
    }

    /// The host could not send the last [`Forward::Replaced`] output and forwarded that
    /// chunk as it came instead: stop rewriting, so the line held back from it is not
    /// sent a second time with the next chunk. Usage is still read; every later chunk is
    /// [`Forward::Unchanged`]. (Only the first replaced chunk can fall back like this
    /// without loss: a line held back earlier was in neither that chunk nor the client's
    /// stream.)
    pub fn stop_rewriting(&mut self) {
        self.rewrites = false;
        if let Scan::Sse(s) = &mut self.scan {
            s.stop_rewriting();
        }
    }

    /// The usage known so far (callable at any time, e.g. when the stream is cut off).
    pub fn report(&self) -> UsageReport {
        let s = &self.stats;
        let (usage, source) = match (s.final_usage, s.chunk_usage) {
            (Some(u), _) => (u, UsageSource::Usage),
            (None, Some(u)) => (u, UsageSource::ContinuousUsage),
            (None, None) if s.content_chunks > 0 => (
                Usage {
                    prompt_tokens: 0,
                    completion_tokens: s.content_chunks,
                    cached_tokens: 0,
                },
                UsageSource::ChunkCount,
            ),
            (None, None) => (Usage::default(), UsageSource::None),
        };
        UsageReport {
            usage,
            source,
            content_chunks: s.content_chunks,
            done: s.done,
        }
    }
}
