//! Unit tests of usage tracking: what is read, what is cut, and what passes untouched.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use super::*;
use alloc::string::String;
use alloc::vec;
use std::format;

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const NONE: ClientWants = ClientWants {
    include_usage: false,
    continuous_usage: false,
    null_when_absent: false,
};
const FINAL_ONLY: ClientWants = ClientWants {
    include_usage: true,
    continuous_usage: false,
    null_when_absent: false,
};
const ALL: ClientWants = ClientWants {
    include_usage: true,
    continuous_usage: true,
    null_when_absent: false,
};

/// Feeds `chunks` in order (the last one with end of stream) and returns what the client
/// receives and the final report.
pub(super) fn run(kind: BodyKind, wants: ClientWants, chunks: &[&[u8]]) -> (Vec<u8>, UsageReport) {
    let mut t = UsageTracker::new(kind, wants);
    let mut sent = Vec::new();
    let mut out = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        match t.feed(c, i + 1 == chunks.len(), &mut out) {
            Forward::Unchanged => sent.extend_from_slice(c),
            Forward::Replaced => sent.extend_from_slice(&out),
        }
    }
    (sent, t.report())
}

fn sse(wants: ClientWants, stream: &str) -> (String, UsageReport) {
    let (out, r) = run(BodyKind::EventStream, wants, &[stream.as_bytes()]);
    (String::from_utf8(out).unwrap(), r)
}

fn usage(p: u64, c: u64, cached: u64) -> Usage {
    Usage {
        prompt_tokens: p,
        completion_tokens: c,
        cached_tokens: cached,
    }
}

fn chunk(content: &str, usage: Option<(u64, u64)>) -> String {
    let u = match usage {
        Some((p, c)) => format!(
            r#","usage":{{"prompt_tokens":{p},"total_tokens":{},"completion_tokens":{c}}}"#,
            p + c
        ),
        None => String::new(),
    };
    format!(
        r#"data: {{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{{"index":0,"delta":{{"content":"{content}"}},"logprobs":null,"finish_reason":null}}]{u}}}"#
    ) + "\n\n"
}

fn final_chunk(p: u64, c: u64) -> String {
    format!(
        r#"data: {{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{{"prompt_tokens":{p},"total_tokens":{},"completion_tokens":{c}}}}}"#,
        p + c
    ) + "\n\n"
}

const DONE: &str = "data: [DONE]\n\n";

#[test]
fn source_names() {
    assert_eq!(UsageSource::Usage.as_str(), "usage");
    assert_eq!(UsageSource::ContinuousUsage.as_str(), "continuous_usage");
    assert_eq!(UsageSource::ChunkCount.as_str(), "chunk_count");
    assert_eq!(UsageSource::None.as_str(), "none");
}

#[test]
fn rewrites_only_event_streams_missing_some_usage() {
    for (kind, wants, rewrites) in [
        (BodyKind::Json, NONE, false),
        (BodyKind::Json, ALL, false),
        (BodyKind::EventStream, ALL, false),
        (BodyKind::EventStream, FINAL_ONLY, true),
        (BodyKind::EventStream, NONE, true),
        (
            BodyKind::EventStream,
            ClientWants {
                include_usage: false,
                continuous_usage: true,
                null_when_absent: false,
            },
            true,
        ),
    ] {
        assert_eq!(
            UsageTracker::new(kind, wants).rewrites(),
            rewrites,
            "{kind:?} {wants:?}"
        );
    }
}

#[test]
fn full_stream_for_each_client() {
    let forced = [
        chunk("Hi", Some((12, 1))),
        chunk(" there", Some((12, 2))),
        final_chunk(12, 2),
        DONE.into(),
    ]
    .concat();
    let expected = UsageReport {
        usage: usage(12, 2, 0),
        source: UsageSource::Usage,
        content_chunks: 2,
        done: true,
    };
    let (out, r) = sse(ALL, &forced);
    assert_eq!((out.as_str(), r), (forced.as_str(), expected));
    let (out, r) = sse(FINAL_ONLY, &forced);
    let want = [
        chunk("Hi", None),
        chunk(" there", None),
        final_chunk(12, 2),
        DONE.into(),
    ]
    .concat();
    assert_eq!((out, r), (want, expected));
    let (out, r) = sse(NONE, &forced);
    let want = [chunk("Hi", None), chunk(" there", None), DONE.into()].concat();
    assert_eq!((out, r), (want, expected));
}

#[test]
fn usage_member_cut_with_its_comma_wherever_it_is() {
    for (event, want) in [
        (
            r#"{"id":"x","choices":[{"index":0}],"usage":{"prompt_tokens":1}}"#,
            r#"{"id":"x","choices":[{"index":0}]}"#,
        ),
        (
            r#"{"usage":{"prompt_tokens":1},"id":"x","choices":[{"index":0}]}"#,
            r#"{"id":"x","choices":[{"index":0}]}"#,
        ),
        (
            r#"{"id":"x","usage":{"prompt_tokens":1},"choices":[{"index":0}]}"#,
            r#"{"id":"x","choices":[{"index":0}]}"#,
        ),
        (
            r#"{"id":"x","choices":[{"index":0}],"usage":null}"#,
            r#"{"id":"x","choices":[{"index":0}]}"#,
        ),
        (
            r#"{ "usage" : null , "choices" : [ 1 ] }"#,
            r#"{ "choices" : [ 1 ] }"#,
        ),
        (
            r#"{"choices":[1] , "usage" : {"completion_tokens":3} }"#,
            r#"{"choices":[1]  }"#,
        ),
    ] {
        for (prefix, end) in [("data: ", "\n\n"), ("data:", "\r\n\r\n")] {
            let (out, _) = sse(NONE, &format!("{prefix}{event}{end}"));
            assert_eq!(out, format!("{prefix}{want}{end}"), "{event}");
        }
    }
}

/// A client of an engine that writes `"usage":null`, with what it asked for.
const fn nulls(include_usage: bool, continuous_usage: bool) -> ClientWants {
    ClientWants {
        include_usage,
        continuous_usage,
        null_when_absent: true,
    }
}

#[test]
fn usage_value_becomes_null_wherever_it_is() {
    for (event, want) in [
        (
            r#"{"id":"x","choices":[{"index":0}],"usage":{"prompt_tokens":5,"completion_tokens":1}}"#,
            r#"{"id":"x","choices":[{"index":0}],"usage":null}"#,
        ),
        (
            r#"{"usage":{"prompt_tokens":1},"id":"x","choices":[{"index":0}]}"#,
            r#"{"usage":null,"id":"x","choices":[{"index":0}]}"#,
        ),
        (
            r#"{"id":"x","usage":{"prompt_tokens":1},"choices":[{"index":0}]}"#,
            r#"{"id":"x","usage":null,"choices":[{"index":0}]}"#,
        ),
        (
            r#"{ "choices" : [ 1 ] , "usage" : { "completion_tokens" : 3 } }"#,
            r#"{ "choices" : [ 1 ] , "usage" : null }"#,
        ),
        // Not an object: still not what the client asked for.
        (
            r#"{"choices":[1],"usage":7}"#,
            r#"{"choices":[1],"usage":null}"#,
        ),
        (
            r#"{"choices":[1],"usage":{"prompt_tokens":1},"usage":[2]}"#,
            r#"{"choices":[1],"usage":{"prompt_tokens":1},"usage":null}"#,
        ),
        // Already null: as it came.
        (
            r#"{"id":"x","choices":[{"index":0}],"usage":null}"#,
            r#"{"id":"x","choices":[{"index":0}],"usage":null}"#,
        ),
        (
            r#"{"usage" :null, "choices":[1]}"#,
            r#"{"usage" :null, "choices":[1]}"#,
        ),
    ] {
        for (prefix, end) in [("data: ", "\n\n"), ("data:", "\r\n\r\n"), ("data: ", "")] {
            let line = format!("{prefix}{event}{end}");
            for wants in [nulls(false, false), nulls(true, false), nulls(false, true)] {
                let (out, r) = sse(wants, &line);
                assert_eq!(out, format!("{prefix}{want}{end}"), "{event} {wants:?}");
                assert_eq!(r.content_chunks, 1);
            }
            // A client that asked for per-chunk usage gets it.
            assert_eq!(sse(nulls(true, true), &line).0, line);
        }
    }
}

#[test]
fn null_when_absent_still_drops_the_usage_only_chunk() {
    let forced = [
        chunk("Hi", Some((12, 1))),
        chunk(" there", Some((12, 2))),
        final_chunk(12, 2),
        DONE.into(),
    ]
    .concat();
    let null_chunk =
        |content: &str| chunk(content, None).replace("}]}\n", r#"}],"usage":null}"#) + "\n";
    let (out, r) = sse(nulls(false, false), &forced);
    let want = [null_chunk("Hi"), null_chunk(" there"), DONE.into()].concat();
    assert_eq!(out, want);
    assert_eq!((r.usage, r.source), (usage(12, 2, 0), UsageSource::Usage));
    let (out, _) = sse(nulls(true, false), &forced);
    let want = [
        null_chunk("Hi"),
        null_chunk(" there"),
        final_chunk(12, 2),
        DONE.into(),
    ]
    .concat();
    assert_eq!(out, want);
    // Every split point and one byte at a time give the same.
    let bytes = forced.as_bytes();
    let whole = run(BodyKind::EventStream, nulls(false, false), &[bytes]);
    for at in 0..=bytes.len() {
        let (a, b) = bytes.split_at(at);
        assert_eq!(
            run(BodyKind::EventStream, nulls(false, false), &[a, b]),
            whole,
            "split at {at}"
        );
    }
    let singles: Vec<&[u8]> = bytes.chunks(1).collect();
    assert_eq!(
        run(BodyKind::EventStream, nulls(false, false), &singles),
        whole
    );
}

#[test]
fn usage_only_chunk_dropped_with_its_blank_line() {
    let s = format!(": ping\n\n{}{}", final_chunk(3, 4), DONE);
    let (out, r) = sse(NONE, &s);
    assert_eq!(out, format!(": ping\n\n{DONE}"));
    assert_eq!((r.usage, r.source), (usage(3, 4, 0), UsageSource::Usage));
    // CRLF.
    let crlf = s.replace('\n', "\r\n");
    let (out, _) = sse(NONE, &crlf);
    assert_eq!(out, ": ping\r\n\r\ndata: [DONE]\r\n\r\n");
    // An event with another field before: only the data line goes, the event still ends.
    let s = format!("event: usage\n{}{}", final_chunk(3, 4), DONE);
    let (out, _) = sse(NONE, &s);
    assert_eq!(out, format!("event: usage\n\n{DONE}"));
    // The final chunk kept for a client that asked for it.
    let (out, _) = sse(FINAL_ONLY, &s);
    assert_eq!(out, s);
}

#[test]
fn nested_or_quoted_usage_is_not_usage() {
    let nested = concat!(
        r#"data: {"choices":[{"index":0,"delta":{"usage":{"prompt_tokens":99}}}],"#,
        r#""meta":{"usage":{"completion_tokens":7}}}"#,
        "\n\n"
    );
    let (out, r) = sse(NONE, nested);
    assert_eq!(out, nested);
    assert_eq!(
        (r.source, r.usage),
        (UsageSource::ChunkCount, usage(0, 1, 0))
    );
    let quoted = concat!(
        r#"data: {"choices":[{"delta":{"content":"\"usage\":{\"prompt_tokens\":5}"}}]}"#,
        "\n\n"
    );
    let (out, r) = sse(NONE, quoted);
    assert_eq!(out, quoted);
    assert_eq!(r.source, UsageSource::ChunkCount);
    // A usage-only look-alike nested one level down is a content chunk, untouched.
    let deep = "data: {\"choices\":[{\"choices\":[],\"usage\":{\"prompt_tokens\":1}}]}\n\n";
    let (out, r) = sse(NONE, deep);
    assert_eq!((out.as_str(), r.content_chunks), (deep, 1));
}

#[test]
fn continuous_usage_until_the_final_one() {
    let cut_off = [chunk("a", Some((5, 1))), chunk("b", Some((5, 2)))].concat();
    let (_, r) = sse(NONE, &cut_off);
    assert_eq!(
        r,
        UsageReport {
            usage: usage(5, 2, 0),
            source: UsageSource::ContinuousUsage,
            content_chunks: 2,
            done: false
        }
    );
    let (_, r) = sse(NONE, &(cut_off + &final_chunk(5, 3) + DONE));
    assert_eq!(
        (r.usage, r.source, r.done),
        (usage(5, 3, 0), UsageSource::Usage, true)
    );
}

#[test]
fn no_usage_counts_content_chunks() {
    let s = [
        chunk("a", None),
        chunk("b", None),
        chunk("c", None),
        DONE.into(),
    ]
    .concat();
    let (out, r) = sse(NONE, &s);
    assert_eq!(out, s);
    assert_eq!(
        r,
        UsageReport {
            usage: usage(0, 3, 0),
            source: UsageSource::ChunkCount,
            content_chunks: 3,
            done: true
        }
    );
    let (_, r) = sse(NONE, "");
    assert_eq!((r.source, r.usage), (UsageSource::None, Usage::default()));
}

#[test]
fn counters_read_and_insane_ones_ignored() {
    for (u, want) in [
        (
            r#"{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}"#,
            Some(usage(10, 2, 8)),
        ),
        (
            r#"{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":null}"#,
            Some(usage(10, 2, 0)),
        ),
        (
            r#"{"input_tokens":10,"output_tokens":2,"cache_read_input_tokens":4}"#,
            Some(usage(10, 2, 4)),
        ),
        (
            r#"{"prompt_tokens":-1,"completion_tokens":2}"#,
            Some(usage(0, 2, 0)),
        ),
        (
            r#"{"prompt_tokens":1.5,"completion_tokens":2}"#,
            Some(usage(0, 2, 0)),
        ),
        (
            r#"{"prompt_tokens":1e3,"completion_tokens":2}"#,
            Some(usage(0, 2, 0)),
        ),
        (
            r#"{"prompt_tokens":"3","completion_tokens":2}"#,
            Some(usage(0, 2, 0)),
        ),
        (
            r#"{"prompt_tokens":01,"completion_tokens":2}"#,
            Some(usage(0, 2, 0)),
        ),
        (
            r#"{"prompt_tokens":9007199254740992,"completion_tokens":2}"#,
            Some(usage(1 << 53, 2, 0)),
        ),
        (
            r#"{"prompt_tokens":9007199254740993,"completion_tokens":2}"#,
            Some(usage(0, 2, 0)),
        ),
        (
            r#"{"prompt_tokens":99999999999999999999999999,"completion_tokens":2}"#,
            Some(usage(0, 2, 0)),
        ),
        (r#"{"total_tokens":3}"#, None),
        (r#"{}"#, None),
    ] {
        let body = format!(r#"{{"id":"x","choices":[{{"index":0}}],"usage":{u}}}"#);
        let (_, r) = run(BodyKind::Json, NONE, &[body.as_bytes()]);
        assert!(r.done, "{u}");
        match want {
            Some(w) => assert_eq!((r.usage, r.source), (w, UsageSource::Usage), "{u}"),
            None => assert_eq!(r.source, UsageSource::None, "{u}"),
        }
        // The same object as a stream's final chunk.
        let ev = format!("data: {{\"choices\":[],\"usage\":{u}}}\n\n");
        let (_, r) = sse(ALL, &ev);
        match want {
            Some(w) => assert_eq!((r.usage, r.source), (w, UsageSource::Usage), "{u}"),
            None => assert_eq!(r.source, UsageSource::None, "{u}"),
        }
    }
}

#[test]
fn json_body_usage_only_at_top_level() {
    let body = concat!(
        r#"{"id":"x","choices":[{"message":{"content":"\"usage\":{\"prompt_tokens\":1}","#,
        r#""usage":{"prompt_tokens":50}}}],"usage":{"prompt_tokens":7,"completion_tokens":3},"#,
        r#""extra":{"usage":{"prompt_tokens":60}}}"#
    );
    let (_, r) = run(BodyKind::Json, NONE, &[body.as_bytes()]);
    assert_eq!(
        r,
        UsageReport {
            usage: usage(7, 3, 0),
            source: UsageSource::Usage,
            content_chunks: 0,
            done: true
        }
    );
    let (_, r) = run(BodyKind::Json, NONE, &[br#"{"error":{"message":"bad"}}"#]);
    assert_eq!((r.source, r.done), (UsageSource::None, true));
    let (_, r) = run(BodyKind::Json, NONE, &[br#"{"usage":{"prompt_tokens":1}"#]);
    assert_eq!((r.source, r.done), (UsageSource::Usage, false));
    // Not JSON at all: nothing in it is read, even an object further on.
    for body in [
        &b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\n"[..],
        b"<html>{\"usage\":{\"prompt_tokens\":3}}</html>",
        b"} {\"usage\":{\"prompt_tokens\":3}}",
    ] {
        let (_, r) = run(BodyKind::Json, NONE, &[body]);
        assert_eq!((r.source, r.done), (UsageSource::None, false));
    }
    let (_, r) = run(
        BodyKind::Json,
        NONE,
        &[b" \r\n", br#"{"usage":{"prompt_tokens":3}}"#],
    );
    assert_eq!((r.source, r.done), (UsageSource::Usage, true));
}

#[test]
fn everything_else_passes_unchanged() {
    let s = concat!(
        ": keep-alive\n",
        "event: message\n",
        "id: 7\n",
        "retry: 100\n",
        "data: not json\n",
        "data: {\"choices\":[1],\"usage\":{\"prompt_tokens\":1} trailing\n",
        "data: {\"error\":{\"message\":\"x\"}}\n",
        "\n",
        "data: [DONE]\r\n\r\n",
    );
    let (out, r) = sse(NONE, s);
    assert_eq!(out, s);
    assert_eq!((r.content_chunks, r.done), (0, true));
}

#[test]
fn incomplete_line_held_back_only_while_rewriting() {
    let c = chunk("Hi", Some((1, 1)));
    let (a, b) = c.as_bytes().split_at(40);
    let mut t = UsageTracker::new(BodyKind::EventStream, NONE);
    let mut out = vec![1, 2, 3];
    assert_eq!(t.feed(a, false, &mut out), Forward::Replaced);
    assert!(out.is_empty());
    assert_eq!(t.feed(b, false, &mut out), Forward::Replaced);
    assert_eq!(out, chunk("Hi", None).as_bytes());
    // Observe only: never replaced.
    let mut t = UsageTracker::new(BodyKind::EventStream, ALL);
    assert_eq!(t.feed(a, false, &mut out), Forward::Unchanged);
    assert_eq!(t.feed(b, false, &mut out), Forward::Unchanged);
    assert_eq!(t.report().usage, usage(1, 1, 0));
    // A chunk with nothing to edit is forwarded as it came.
    let mut t = UsageTracker::new(BodyKind::EventStream, NONE);
    let plain = chunk("x", None);
    assert_eq!(
        t.feed(plain.as_bytes(), false, &mut out),
        Forward::Unchanged
    );
    // The held line is flushed at end of stream even without its line end.
    let mut t = UsageTracker::new(BodyKind::EventStream, NONE);
    assert_eq!(t.feed(b": partial", false, &mut out), Forward::Replaced);
    assert!(out.is_empty());
    assert_eq!(t.feed(b"", true, &mut out), Forward::Replaced);
    assert_eq!(out, b": partial");
}

#[test]
fn overlong_lines_pass_unchanged_and_memory_stays_bounded() {
    let text = "x".repeat(MAX_LINE + 10);
    let line = format!(
        "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{text}\"}}}}],\"usage\":{{\"prompt_tokens\":1}}}}\n\n"
    );
    for step in [1000, 4096, line.len()] {
        let chunks: Vec<&[u8]> = line.as_bytes().chunks(step).collect();
        let (out, r) = run(BodyKind::EventStream, NONE, &chunks);
        assert_eq!(out, line.as_bytes(), "step {step}");
        assert_eq!((r.content_chunks, r.source), (1, UsageSource::ChunkCount));
    }
    let mut t = UsageTracker::new(BodyKind::EventStream, NONE);
    let mut out = Vec::new();
    for c in line.as_bytes().chunks(1000) {
        t.feed(c, false, &mut out);
        let Scan::Sse(s) = &t.scan else { panic!() };
        assert!(s.held_len() <= MAX_LINE);
    }
}

#[test]
fn line_cap_boundary_is_the_same_for_every_chunking() {
    // Content chunks whose line (without its line end) is exactly MAX_LINE and one more.
    for extra in [0usize, 1] {
        let empty = chunk("", Some((1, 1)));
        let pad = MAX_LINE + extra - (empty.len() - 2);
        let line = chunk(&"y".repeat(pad), Some((1, 1)));
        assert_eq!(line.len() - 2, MAX_LINE + extra);
        let stream = [line.clone(), final_chunk(1, 2), DONE.into()].concat();
        let bytes = stream.as_bytes();
        let whole = run(BodyKind::EventStream, NONE, &[bytes]);
        if extra == 0 {
            assert_eq!(
                whole.0,
                [chunk(&"y".repeat(pad), None), DONE.into()]
                    .concat()
                    .as_bytes()
            );
        } else {
            // Too long to read: forwarded as it came, its usage unread.
            assert_eq!(whole.0, [line.as_str(), DONE].concat().as_bytes());
        }
        assert_eq!(whole.1.content_chunks, 1);
        for at in [
            1,
            100,
            MAX_LINE - 1,
            MAX_LINE,
            MAX_LINE + 1,
            MAX_LINE + 2,
            line.len(),
        ] {
            let (a, b) = bytes.split_at(at);
            assert_eq!(
                run(BodyKind::EventStream, NONE, &[a, b]),
                whole,
                "{extra} {at}"
            );
            let (b1, b2) = b.split_at(1);
            assert_eq!(
                run(BodyKind::EventStream, NONE, &[a, b1, b2]),
                whole,
                "{extra} {at}+1"
            );
        }
    }
}

#[test]
fn events_without_choices_pass_untouched_and_their_usage_is_final() {
    let s = concat!(
        "event: message_delta\n",
        r#"data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}"#,
        "\n\n"
    );
    let (out, r) = sse(NONE, s);
    assert_eq!(out, s);
    assert_eq!(
        (r.usage, r.source, r.content_chunks),
        (usage(0, 15, 0), UsageSource::Usage, 0)
    );
}

#[test]
fn the_final_usage_is_not_replaced_by_a_later_chunk() {
    let s = [final_chunk(9, 9), chunk("late", Some((9, 10)))].concat();
    let (out, r) = sse(FINAL_ONLY, &s);
    assert_eq!(out, [final_chunk(9, 9), chunk("late", None)].concat());
    assert_eq!((r.usage, r.source), (usage(9, 9, 0), UsageSource::Usage));
    // A later final usage does replace it.
    let (_, r) = sse(NONE, &[final_chunk(9, 9), final_chunk(9, 11)].concat());
    assert_eq!(r.usage, usage(9, 11, 0));
}

#[test]
fn a_host_that_cannot_replace_falls_back_to_the_engine_stream() {
    let stream = [
        chunk("a", Some((4, 1))),
        chunk("b", Some((4, 2))),
        final_chunk(4, 2),
        DONE.into(),
    ]
    .concat();
    let bytes = stream.as_bytes();
    for first in [10, 200, 400] {
        let mut t = UsageTracker::new(BodyKind::EventStream, NONE);
        let mut out = Vec::new();
        let mut sent = Vec::new();
        let (a, rest) = bytes.split_at(first);
        // The host fails to replace the first chunk it is asked to and sends it as it came.
        assert_eq!(t.feed(a, false, &mut out), Forward::Replaced);
        sent.extend_from_slice(a);
        t.stop_rewriting();
        assert!(!t.rewrites());
        for c in rest.chunks(37) {
            assert_eq!(t.feed(c, false, &mut out), Forward::Unchanged);
            sent.extend_from_slice(c);
        }
        assert_eq!(t.feed(b"", true, &mut out), Forward::Unchanged);
        assert_eq!(sent, bytes, "first chunk {first}");
        assert_eq!(
            (t.report().usage, t.report().source),
            (usage(4, 2, 0), UsageSource::Usage)
        );
    }
}
