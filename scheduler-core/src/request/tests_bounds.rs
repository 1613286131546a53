//! Tests of the parser's bounds: the stored prompt is exactly the leading bytes of the whole
//! canonical stream, the whole stream stays within a small multiple of the body, canonical
//! JSON written while parsing equals canonical JSON of the parsed value, and numbers take
//! their shortest form.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

use super::canonical::{write_f64, CanonSeed};
use super::stream::Stream;
use super::*;
use crate::prefix::{self, PrefixConfig};
use alloc::string::ToString;
use alloc::vec;
use proptest::prelude::*;
use serde_json::{json, Value};
use std::format;

/// The whole stream (nothing cut).
fn full(api: Api, body: &[u8]) -> Result<ParsedRequest, RequestError> {
    parse_with_limit(api, body, usize::MAX)
}

/// The most bytes the whole canonical stream may take per body byte (module doc: the worst
/// case is `1e15,`, 5 bytes written as 17).
const EXPANSION: usize = 4;

/// Canonical JSON of an already-parsed value, the way version 1 wrote it (sort the map,
/// recurse), with the new float rule: the oracle for the streaming writer.
fn oracle(v: &Value, out: &mut Stream) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                out.extend_from_slice(u.to_string().as_bytes());
            } else if let Some(i) = n.as_i64() {
                out.extend_from_slice(i.to_string().as_bytes());
            } else {
                write_f64(n.as_f64().unwrap(), out);
            }
        }
        Value::String(s) => super::canonical::write_string(s.as_bytes(), out),
        Value::Array(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                oracle(x, out);
            }
            out.push(b']');
        }
        Value::Object(m) => {
            let mut entries: Vec<(&String, &Value)> = m.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, x)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                super::canonical::write_string(k.as_bytes(), out);
                out.push(b':');
                oracle(x, out);
            }
            out.push(b'}');
        }
    }
}

/// Canonical JSON written while parsing `text`, keeping at most `limit` bytes.
fn streamed(text: &str, limit: usize) -> Stream {
    let mut out = Stream::with_limit(limit, 0);
    let mut de = serde_json::Deserializer::from_str(text);
    serde::de::DeserializeSeed::deserialize(CanonSeed { out: &mut out }, &mut de).unwrap();
    out
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(|n| json!(n)),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        prop::sample::select(vec![1e308, -1e308, 1e15, 5e-324, 1.5e-7, 0.1, 2.5e100])
            .prop_map(|f| json!(f)),
        "[a-z\"\\\\\n\t\u{0}\u{1f}é😀]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-d\"\\\\é]{0,3}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// One content part: text, media or another kind, with arbitrary extra fields.
fn part() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec!["text", "image_url", "tool_use", "input_audio", "x"]),
        proptest::option::of("[a-z\n\"]{0,40}"),
        proptest::option::of(json_value()),
        any::<bool>(),
    )
        .prop_map(|(ty, text, extra, type_last)| {
            let mut m = serde_json::Map::new();
            if !type_last {
                m.insert("type".into(), json!(ty));
            }
            if let Some(t) = text {
                m.insert("text".into(), json!(t));
            }
            if let Some(x) = extra {
                m.insert("input".into(), x);
            }
            if type_last {
                m.insert("type".into(), json!(ty));
            }
            Value::Object(m)
        })
}

fn message() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            "[a-z \n]{0,60}".prop_map(Value::String),
            prop::collection::vec(part(), 0..4).prop_map(Value::Array),
            Just(Value::Null),
        ],
        prop::sample::select(vec!["user", "assistant", "tool"]),
        proptest::option::of(json_value()),
    )
        .prop_map(|(content, role, calls)| {
            let mut m = json!({"role": role, "content": content});
            if let Some(c) = calls {
                m["tool_calls"] = c;
            }
            m
        })
}

/// A chat or Anthropic body with arbitrary tools, messages and system prompt.
fn body() -> impl Strategy<Value = (Api, String)> {
    (
        prop::sample::select(vec![Api::ChatCompletions, Api::AnthropicMessages]),
        proptest::option::of(prop::collection::vec(json_value(), 0..4)),
        prop::collection::vec(message(), 0..6),
        proptest::option::of("[a-z]{0,30}"),
    )
        .prop_map(|(api, tools, messages, system)| {
            let mut b = json!({"model": "m", "messages": messages});
            if let Some(t) = tools {
                b["tools"] = Value::Array(t);
            }
            if let Some(s) = system {
                b["system"] = json!(s);
            }
            (api, b.to_string())
        })
}

proptest! {
    #[test]
    fn bounded_prompt_is_the_leading_bytes_of_the_whole((api, text) in body(), cut in 0usize..2048) {
        let whole = full(api, text.as_bytes()).unwrap();
        prop_assert_eq!(whole.prompt.len(), whole.prompt_len);
        prop_assert!(whole.prompt_len <= EXPANSION * text.len());
        let limit = cut.min(whole.prompt_len + 8);
        let cut = parse_with_limit(api, text.as_bytes(), limit).unwrap();
        let keep = whole.prompt_len.min(limit);
        prop_assert_eq!(&cut.prompt[..], &whole.prompt[..keep]);
        prop_assert_eq!(cut.prompt_len, whole.prompt_len);
        prop_assert_eq!(cut.prompt_tokens, whole.prompt_tokens);
        // So the hashes of every block the cut prompt covers are the same.
        let cfg = PrefixConfig {
            block_size_tokens: 4,
            max_prefix_tokens_to_match: (limit / prefix::BYTES_PER_TOKEN) as u64,
            ..PrefixConfig::default()
        };
        prop_assert!(cfg.max_prompt_bytes() <= limit);
        let seed = prefix::seed("m", None);
        prop_assert_eq!(
            prefix::block_hashes(seed, &cut.prompt, &cfg),
            prefix::block_hashes(seed, &whole.prompt, &cfg)
        );
    }

    #[test]
    fn streamed_canonical_json_equals_the_oracle(v in json_value(), cut in 0usize..512) {
        let text = v.to_string();
        // Parsed back rather than `v` itself: serde_json's default float parsing may land
        // one unit in the last place away from the value it printed.
        let parsed: Value = serde_json::from_str(&text).unwrap();
        let mut want = Stream::unbounded();
        oracle(&parsed, &mut want);
        let got = streamed(&text, usize::MAX);
        prop_assert_eq!(got.bytes(), want.bytes());
        prop_assert!(got.len() <= EXPANSION * text.len());
        let cut_out = streamed(&text, cut);
        prop_assert_eq!(cut_out.len(), want.len());
        prop_assert_eq!(cut_out.bytes(), &want.bytes()[..want.len().min(cut)]);
    }

    #[test]
    fn floats_take_their_shortest_exact_form(f in any::<f64>().prop_filter("finite", |f| f.is_finite())) {
        let mut out = Stream::unbounded();
        write_f64(f, &mut out);
        let s = core::str::from_utf8(out.bytes()).unwrap();
        prop_assert_eq!(s.parse::<f64>().unwrap(), f, "{}", s);
        if f.abs() < 9.007_199_254_740_992e15 && f.fract() == 0.0 {
            prop_assert_eq!(s, format!("{}", f as i64));
        } else {
            let plain = format!("{f}");
            let exp = format!("{f:e}");
            let want = if exp.len() < plain.len() { exp } else { plain };
            prop_assert_eq!(s, want);
        }
    }

    #[test]
    fn whole_stream_of_completions_prompts_is_bounded(ids in prop::collection::vec(0u32..10, 0..200), batches in any::<bool>()) {
        let prompt = if batches {
            json!(ids.chunks(3).map(|c| c.to_vec()).collect::<Vec<_>>())
        } else {
            json!(ids)
        };
        let text = json!({"model": "m", "prompt": prompt}).to_string();
        let p = full(Api::Completions, text.as_bytes()).unwrap();
        prop_assert!(p.prompt_len <= EXPANSION * text.len());
    }
}

#[test]
fn float_forms() {
    let f = |x: f64| {
        let mut out = Stream::unbounded();
        write_f64(x, &mut out);
        String::from_utf8(out.into_bytes()).unwrap()
    };
    assert_eq!(f(1e308), "1e308");
    assert_eq!(f(-1e308), "-1e308");
    assert_eq!(f(1.5e-7), "1.5e-7");
    assert_eq!(f(0.1), "0.1");
    assert_eq!(f(123.25), "123.25");
    assert_eq!(f(2.0), "2");
    assert_eq!(f(-0.0), "0");
    assert_eq!(f(1e15), "1000000000000000");
    assert_eq!(f(1.2e21), "1.2e21");
    assert_eq!(f(5e-324), "5e-324");
    assert_eq!(f(f64::MAX), "1.7976931348623157e308");
}

#[test]
fn repeated_keys_in_canonical_json_keep_the_last() {
    let s = streamed(
        r#"{"b":1,"a":2,"b":{"y":1,"x":[1.0,1e308]},"a":3}"#,
        usize::MAX,
    );
    assert_eq!(s.bytes(), br#"{"a":3,"b":{"x":[1,1e308],"y":1}}"#);
}

/// A body of `n` bytes at least: `tools` is an array of `1e308`.
fn floats_body(n: usize) -> String {
    let mut body = String::with_capacity(n + 64);
    body.push_str(r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":["#);
    while body.len() < n {
        body.push_str("1e308,");
    }
    body.push_str("1e308]}");
    body
}

#[test]
fn four_mib_of_floats_in_tools_is_bounded() {
    let body = floats_body(4 << 20);
    let p = parse(Api::ChatCompletions, body.as_bytes()).unwrap();
    // Stored: exactly what hashing reads; counted: about the body (it was 309 bytes per float).
    assert_eq!(p.prompt.len(), DEFAULT_MAX_PROMPT_BYTES);
    assert!(p.prompt.starts_with(b"\x1dtools\x1f[1e308,1e308,"));
    assert!(
        p.prompt_len <= body.len(),
        "{} > {}",
        p.prompt_len,
        body.len()
    );
    assert!(p.prompt_len > body.len() - 64);
    assert_eq!(p.prompt_tokens, estimate_tokens(p.prompt_len));
    std::println!(
        "4 MiB floats body: {} body bytes -> {} prompt bytes stored, {} counted, {} tokens",
        body.len(),
        p.prompt.len(),
        p.prompt_len,
        p.prompt_tokens.0
    );
    // The whole stream is the same size when nothing is cut.
    let whole = full(Api::ChatCompletions, body.as_bytes()).unwrap();
    assert_eq!(whole.prompt_len, p.prompt_len);
    assert_eq!(&whole.prompt[..p.prompt.len()], &p.prompt[..]);
}

#[test]
fn cut_text_inside_a_non_text_part_still_makes_the_same_marker() {
    // The text comes before the type, so the parser cannot know it is not text while
    // cutting it; the marker must still hold all of it.
    let long = "x".repeat(300);
    let body = json!({"model": "m", "messages": [{"role": "user", "content": [
        {"text": long, "type": "image_url", "image_url": {"url": "u"}},
        {"text": long, "type": "tool_use"},
    ]}]})
    .to_string();
    let whole = full(Api::ChatCompletions, body.as_bytes()).unwrap();
    for limit in [0, 1, 10, 40, 100, 299, 400, 2000] {
        let cut = parse_with_limit(Api::ChatCompletions, body.as_bytes(), limit).unwrap();
        assert_eq!(cut.prompt_len, whole.prompt_len, "limit {limit}");
        assert_eq!(
            &cut.prompt[..],
            &whole.prompt[..limit.min(whole.prompt_len)],
            "limit {limit}"
        );
    }
}

#[test]
fn prompt_is_cut_at_the_limit_and_counted_beyond() {
    let body = json!({"model": "m", "system": "s", "tools": [{"a": 1}],
        "messages": [{"role": "user", "content": "0123456789"}]})
    .to_string();
    let whole = full(Api::AnthropicMessages, body.as_bytes()).unwrap();
    for limit in 0..=whole.prompt_len + 1 {
        let cut = parse_with_limit(Api::AnthropicMessages, body.as_bytes(), limit).unwrap();
        assert_eq!(cut.prompt, whole.prompt[..limit.min(whole.prompt_len)]);
        assert_eq!(cut.prompt_len, whole.prompt_len);
    }
    let ids = json!({"model": "m", "prompt": [[1, 2], [3]]}).to_string();
    let cut = parse_with_limit(Api::Completions, ids.as_bytes(), 6).unwrap();
    assert_eq!(cut.prompt, [1, 0, 0, 0, 2, 0]);
    assert_eq!(cut.prompt_tokens, Tokens(4));
}
