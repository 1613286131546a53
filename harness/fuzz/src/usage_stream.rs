//! The `usage_stream` target: the response-side usage tracker on any bytes, cut into any
//! chunks.
//!
//! Input: a mode byte (bits 0-1: what the client asked for; bit 2: a JSON body instead of
//! an event stream; bit 3: end of stream on a last, empty chunk; bit 4: the engine writes
//! `"usage":null` on chunks without usage), a chunking byte (seed of the chunk sizes), then
//! the body. Every input is also run as through a host that cannot
//! replace chunks (it forwards the first replaced one as it came and stops the
//! rewriting): the tracker must not ask to replace again, and reads the same usage.

use scheduler_core::usage::{
    BodyKind, ClientWants, Forward, UsageReport, UsageSource, UsageTracker, MAX_COUNT, MAX_LINE,
    MAX_USAGE_TEXT,
};

use crate::meter::peak_during;
use crate::targets::memory_bound;

/// Chunk sizes from `seed`: mostly small (0 to 66 bytes: boundaries inside every line,
/// number and UTF-8 sequence), now and then up to 4 KiB.
fn chunks(body: &[u8], seed: u8) -> Vec<&[u8]> {
    let mut state = u32::from(seed).wrapping_mul(0x9E37_79B9) | 1;
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let n = if state % 16 == 0 {
            state as usize % 4096
        } else {
            state as usize % 67
        };
        let (a, b) = rest.split_at(n.min(rest.len()));
        out.push(a);
        rest = b;
    }
    out
}

/// Feeds `chunks` (end of stream on the last one, or on an extra empty one) and returns
/// what the client receives, the final report, and the largest chunk forwarded.
fn feed(
    kind: BodyKind,
    wants: ClientWants,
    chunks: &[&[u8]],
    eos_alone: bool,
) -> (Vec<u8>, UsageReport, usize) {
    let mut t = UsageTracker::new(kind, wants);
    let observe_only = !t.rewrites();
    let mut sent = Vec::new();
    let mut out = Vec::new();
    let mut largest = 0;
    let mut counted = 0;
    let n = chunks.len();
    let extra: &[u8] = b"";
    let all = chunks.iter().copied().chain(eos_alone.then_some(extra));
    for (i, c) in all.enumerate() {
        let last = if eos_alone { i == n } else { i + 1 == n };
        let f = t.feed(c, last, &mut out);
        if observe_only {
            assert_eq!(
                f,
                Forward::Unchanged,
                "an observe-only tracker replaced a chunk"
            );
        }
        let fwd: &[u8] = match f {
            Forward::Unchanged => c,
            Forward::Replaced => &out,
        };
        largest = largest.max(fwd.len());
        sent.extend_from_slice(fwd);
        // The report is sane at every point, and content chunks only ever grow.
        let r = t.report();
        check_report(&r);
        assert!(r.content_chunks >= counted);
        counted = r.content_chunks;
    }
    (sent, t.report(), largest)
}

fn check_report(r: &UsageReport) {
    match r.source {
        UsageSource::Usage | UsageSource::ContinuousUsage => {
            let u = r.usage;
            assert!(u.prompt_tokens <= MAX_COUNT, "{r:?}");
            assert!(u.completion_tokens <= MAX_COUNT, "{r:?}");
            assert!(u.cached_tokens <= MAX_COUNT, "{r:?}");
        }
        UsageSource::ChunkCount => {
            assert_eq!(
                (r.usage.prompt_tokens, r.usage.completion_tokens),
                (0, r.content_chunks)
            );
            assert!(r.content_chunks > 0);
        }
        UsageSource::None => assert_eq!(r.usage, Default::default()),
    }
}

/// A host whose replacing fails: the first replaced chunk goes out as it came and the
/// tracker is told to stop rewriting; after that it must never ask to replace again.
/// Returns the report, which must not depend on the rewriting.
fn feed_failing_host(wants: ClientWants, chunks: &[&[u8]]) -> UsageReport {
    let mut t = UsageTracker::new(BodyKind::EventStream, wants);
    let mut out = Vec::new();
    let mut stopped = false;
    for (i, c) in chunks.iter().enumerate() {
        let f = t.feed(c, i + 1 == chunks.len(), &mut out);
        if stopped {
            assert_eq!(
                f,
                Forward::Unchanged,
                "replaced a chunk after stop_rewriting"
            );
        } else if f == Forward::Replaced {
            t.stop_rewriting();
            assert!(!t.rewrites());
            stopped = true;
        }
    }
    t.report()
}

/// Whether `sub` is `full` with some bytes removed.
fn is_subsequence(sub: &[u8], full: &[u8]) -> bool {
    let mut it = full.iter();
    sub.iter().all(|b| it.any(|c| c == b))
}

/// Whether `sent` is `body` with some lines dropped and, in some others, one range of
/// bytes replaced by `null`. Matching each line at the first body line it fits is enough:
/// an earlier match never leaves fewer body lines for the rest.
fn lines_with_nulls(sent: &[u8], body: &[u8]) -> bool {
    let mut body_lines = body.split_inclusive(|&b| b == b'\n');
    sent.split_inclusive(|&b| b == b'\n')
        .all(|s| body_lines.any(|b| s == b || nulled(s, b)))
}

/// Whether `s` is `b` with one non-empty range replaced by `null`.
fn nulled(s: &[u8], b: &[u8]) -> bool {
    // `s` = `b[..a]` + `null` + `b[e..]` with `a < e`: the kept bytes number `k`.
    let Some(k) = s.len().checked_sub(4) else {
        return false;
    };
    if k >= b.len() {
        return false;
    }
    let prefix = s.iter().zip(b).take_while(|(x, y)| x == y).count();
    let suffix = s
        .iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    (0..=prefix.min(k)).any(|a| k - a <= suffix && s.get(a..a + 4) == Some(b"null"))
}

/// The usage tracker on the raw bytes: never panics; chunking never changes what the
/// client receives or the report; observe-only trackers never replace a chunk; a
/// rewritten stream only ever loses bytes; the report is sane at every chunk; and memory
/// stays within a few held lines and chunks whatever the body (and within
/// [`memory_bound`]).
pub fn usage_stream(data: &[u8]) {
    let [mode, seed, body @ ..] = data else {
        return;
    };
    let wants = ClientWants {
        include_usage: mode & 1 != 0,
        continuous_usage: mode & 2 != 0,
        null_when_absent: mode & 16 != 0,
    };
    let kind = if mode & 4 != 0 {
        BodyKind::Json
    } else {
        BodyKind::EventStream
    };
    let eos_alone = mode & 8 != 0;
    let cut = chunks(body, *seed);
    let ((sent, report, largest), peak) = peak_during(|| feed(kind, wants, &cut, eos_alone));
    let whole = feed(kind, wants, &[body], false);
    assert_eq!(
        (&sent, &report),
        (&whole.0, &whole.1),
        "chunking changed the result"
    );
    if kind == BodyKind::Json || !UsageTracker::new(kind, wants).rewrites() {
        assert_eq!(sent, body, "an observe-only tracker changed the body");
    } else {
        if wants.null_when_absent {
            assert!(
                lines_with_nulls(&sent, body),
                "a rewrite did more than drop lines and write null for values"
            );
        } else {
            assert!(is_subsequence(&sent, body), "a rewrite added bytes");
        }
        assert_eq!(feed_failing_host(wants, &cut), report);
    }
    assert!(report.content_chunks <= body.len() as u64);
    if report.done && kind == BodyKind::EventStream {
        assert!(body.windows(6).any(|w| w == b"[DONE]"));
    }
    // What the tracker may hold: one line (and its growth), a usage text, the output of
    // one chunk; `sent` (the test's own copy) is bounded by the body.
    let held = 4 * MAX_LINE + 2 * MAX_USAGE_TEXT + 4 * largest.max(4096);
    assert!(
        peak <= held + 2 * body.len() + 16 * 1024,
        "{peak} bytes at once for a body of {} (chunks up to {largest})",
        body.len()
    );
    assert!(peak <= memory_bound(body.len()) + 2 * MAX_LINE);
}
