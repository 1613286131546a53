//! Golden samples from `testdata/usage/` (see `testdata/README.md` for how they were made):
//! engine-shaped streams and bodies, what each kind of client must receive, and the report
//! expected for each. `include_str!` keeps these runnable on wasm32 without a filesystem.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use super::tests::run;
use super::*;
use alloc::format;
use alloc::string::{String, ToString};
use serde_json::Value;

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const EXPECTED: &str = include_str!("../../../testdata/usage/expected.json");

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

/// The report `expected.json` gives for `name`.
fn expected(name: &str) -> UsageReport {
    let all: Value = serde_json::from_str(EXPECTED).unwrap();
    let e = &all[name];
    let n = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("{name}: {v}"));
    let source = match e["source"].as_str().unwrap() {
        "usage" => UsageSource::Usage,
        "continuous_usage" => UsageSource::ContinuousUsage,
        "chunk_count" => UsageSource::ChunkCount,
        "none" => UsageSource::None,
        s => panic!("{name}: source {s}"),
    };
    assert_eq!(source.as_str(), e["source"].as_str().unwrap());
    UsageReport {
        usage: Usage {
            prompt_tokens: n(&e["usage"]["prompt_tokens"]),
            completion_tokens: n(&e["usage"]["completion_tokens"]),
            cached_tokens: n(&e["usage"]["cached_tokens"]),
        },
        source,
        content_chunks: n(&e["content_chunks"]),
        done: e["done"].as_bool().unwrap(),
    }
}

/// Feeds `stream` whole, split at every `step`-th position, and in 1,460-byte segments;
/// all must agree. Returns what the client receives and the report.
fn check_chunkings(
    name: &str,
    wants: ClientWants,
    stream: &str,
    step: usize,
) -> (String, UsageReport) {
    let bytes = stream.as_bytes();
    let whole = run(BodyKind::EventStream, wants, &[bytes]);
    for at in (0..=bytes.len()).step_by(step) {
        let (a, b) = bytes.split_at(at);
        assert_eq!(
            run(BodyKind::EventStream, wants, &[a, b]),
            whole,
            "{name} {wants:?} split at {at}"
        );
    }
    let segments: Vec<&[u8]> = bytes.chunks(1460).collect();
    assert_eq!(
        run(BodyKind::EventStream, wants, &segments),
        whole,
        "{name} segments"
    );
    (String::from_utf8(whole.0).unwrap(), whole.1)
}

/// A forced stream and what the two other kinds of client receive.
fn stream_for_each_client(name: &str, forced: &str, final_only: &str, no_usage: &str) {
    let want = expected(name);
    for (wants, client, step) in [
        (ALL, forced, 13),
        (FINAL_ONLY, final_only, 7),
        (NONE, no_usage, 1),
    ] {
        let (out, report) = check_chunkings(name, wants, forced, step);
        assert_eq!(out, client, "{name} for {wants:?}");
        assert_eq!(report, want, "{name} for {wants:?}");
    }
}

#[test]
fn vllm_stream_with_continuous_usage() {
    stream_for_each_client(
        "vllm-chat-stream.sse",
        include_str!("../../../testdata/usage/vllm-chat-stream.sse"),
        include_str!("../../../testdata/usage/vllm-chat-stream.final-only.sse"),
        include_str!("../../../testdata/usage/vllm-chat-stream.no-usage.sse"),
    );
}

#[test]
fn sglang_stream_with_null_usage_and_crlf() {
    stream_for_each_client(
        "sglang-chat-stream.sse",
        include_str!("../../../testdata/usage/sglang-chat-stream.sse"),
        include_str!("../../../testdata/usage/sglang-chat-stream.final-only.sse"),
        include_str!("../../../testdata/usage/sglang-chat-stream.no-usage.sse"),
    );
}

#[test]
fn stream_cut_off_mid_way_is_billed_by_its_last_chunk() {
    let name = "vllm-chat-stream-cut.sse";
    let cut = include_str!("../../../testdata/usage/vllm-chat-stream-cut.sse");
    let want = expected(name);
    // Complete events as a client without usage gets them, then the cut line as it came.
    let no_usage = include_str!("../../../testdata/usage/vllm-chat-stream.no-usage.sse");
    let complete: String = no_usage.split_inclusive("\n\n").take(7).collect();
    let partial = &cut[cut.rfind("\n\n").unwrap() + 2..];
    assert!(!partial.is_empty() && !partial.contains('\n'));
    for (wants, client) in [(ALL, cut.into()), (NONE, complete + partial)] {
        let (out, report) = check_chunkings(name, wants, cut, 3);
        assert_eq!(out, client, "{wants:?}");
        assert_eq!(report, want, "{wants:?}");
    }
    // Asked before the end: the same, since nothing after the last full chunk counts.
    let mut t = UsageTracker::new(BodyKind::EventStream, NONE);
    let mut out = Vec::new();
    t.feed(cut.as_bytes(), false, &mut out);
    assert_eq!(t.report(), want);
}

#[test]
fn engine_without_usage_is_counted() {
    let name = "no-usage-stream.sse";
    let s = include_str!("../../../testdata/usage/no-usage-stream.sse");
    for wants in [ALL, FINAL_ONLY, NONE] {
        let (out, report) = check_chunkings(name, wants, s, 11);
        assert_eq!(out, s);
        assert_eq!(report, expected(name));
    }
}

#[test]
fn json_bodies() {
    for (name, body) in [
        (
            "vllm-chat-completion.json",
            include_str!("../../../testdata/usage/vllm-chat-completion.json"),
        ),
        (
            "anthropic-message.json",
            include_str!("../../../testdata/usage/anthropic-message.json"),
        ),
    ] {
        let bytes = body.as_bytes();
        let whole = run(BodyKind::Json, NONE, &[bytes]);
        assert_eq!(whole, (bytes.to_vec(), expected(name)), "{name}");
        for at in 0..=bytes.len() {
            let (a, b) = bytes.split_at(at);
            assert_eq!(
                run(BodyKind::Json, NONE, &[a, b]).1,
                whole.1,
                "{name} split at {at}"
            );
        }
        // Cut anywhere before its end: not done, and no usage unless it was complete.
        let cut = &bytes[..bytes.len() - 2];
        let r = run(BodyKind::Json, NONE, &[cut]).1;
        assert!(!r.done, "{name}");
    }
}

#[test]
fn sglang_stream_keeps_its_null_usage_for_a_client_of_such_an_engine() {
    let name = "sglang-chat-stream.sse";
    let forced = include_str!("../../../testdata/usage/sglang-chat-stream.sse");
    // Its content chunks already say `"usage":null`: a client that asked for the final
    // usage gets the stream as it came, one that did not loses the usage-only event.
    let usage_only = |e: &&str| e.contains(r#""choices":[]"#);
    assert_eq!(
        forced
            .split_inclusive("\r\n\r\n")
            .filter(usage_only)
            .count(),
        1
    );
    let no_usage: String = forced
        .split_inclusive("\r\n\r\n")
        .filter(|e| !usage_only(e))
        .collect();
    let wants = |include_usage| ClientWants {
        include_usage,
        null_when_absent: true,
        ..NONE
    };
    for (wants, client) in [(wants(true), forced), (wants(false), &no_usage)] {
        let (out, report) = check_chunkings(name, wants, forced, 5);
        assert_eq!(out, client, "{wants:?}");
        assert_eq!(report, expected(name), "{wants:?}");
    }
}

#[test]
fn vllm_stream_gets_null_usage_for_a_completions_client() {
    let name = "vllm-chat-stream.sse";
    let forced = include_str!("../../../testdata/usage/vllm-chat-stream.sse");
    let no_usage = include_str!("../../../testdata/usage/vllm-chat-stream.no-usage.sse");
    let wants = ClientWants {
        null_when_absent: true,
        ..NONE
    };
    let (out, report) = check_chunkings(name, wants, forced, 3);
    assert_eq!(report, expected(name));
    // Every content chunk is the member-less one with `"usage":null` as its last member.
    let want: String = no_usage
        .split_inclusive("\n\n")
        .map(|e| match e.strip_suffix("}\n\n") {
            Some(body) if e.starts_with("data: {") => format!("{body},\"usage\":null}}\n\n"),
            _ => e.to_string(),
        })
        .collect();
    assert!(want.contains(r#""usage":null"#));
    assert_eq!(out, want);
}
