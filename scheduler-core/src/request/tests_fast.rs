//! The fast path against the `serde_json` path it stands in for: on every input, valid or
//! not, [`parse_with_limit`] (fast path first) and [`parse_reference`] (the `serde_json`
//! path alone) give the same request or the same error.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

use super::*;
use alloc::string::ToString;
use alloc::vec;
use proptest::prelude::*;
use std::format;

const APIS: [Api; 3] = [
    Api::ChatCompletions,
    Api::Completions,
    Api::AnthropicMessages,
];

/// Both paths agree on `body` for every API, whole and cut at `limit`.
fn agree(body: &[u8], limit: usize) -> Result<(), TestCaseError> {
    for api in APIS {
        for max in [usize::MAX, limit] {
            let fast = parse_with_limit(api, body, max);
            let reference = parse_reference(api, body, max);
            prop_assert_eq!(
                &fast,
                &reference,
                "{:?} limit {} body {:?}",
                api,
                max,
                String::from_utf8_lossy(body)
            );
        }
    }
    Ok(())
}

/// A JSON string literal (quotes included) from raw pieces: plain text, every escape, `\u`
/// forms valid and not, surrogate pairs and lone halves, raw control bytes, non-ASCII.
fn string_literal() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        4 => "[a-z ]{0,20}".prop_map(String::into_bytes),
        1 => "[\u{e9}\u{2014}\u{30c7}\u{1f600}]{1,3}".prop_map(String::into_bytes),
        1 => prop::sample::select(vec![
            &b"\\n"[..], b"\\t", b"\\\"", b"\\\\", b"\\/", b"\\b", b"\\f", b"\\r",
            b"\\u0041", b"\\u00e9", b"\\u0000", b"\\u001f", b"\\u2014", b"\\uFFFF",
            b"\\ud83d\\ude00", b"\\ud83d", b"\\ude00", b"\\ud83dx", b"\\ud83d\\u0041",
            b"\\u12", b"\\uzzzz", b"\\x", b"\\", b"\x01", b"\x1f", b"\x7f", b"\xff", b"\xc3",
            b"\xed\xa0\x80", b"\xe2\x80",
        ])
        .prop_map(<[u8]>::to_vec),
    ];
    proptest::collection::vec(piece, 0..8).prop_map(|pieces| {
        let mut s = vec![b'"'];
        s.extend(pieces.concat());
        s.push(b'"');
        s
    })
}

/// Any small JSON-ish value: scalars (numbers in every form), strings, arrays, objects.
fn value() -> impl Strategy<Value = Vec<u8>> {
    let leaf = prop_oneof![
        string_literal(),
        prop::sample::select(vec![
            &b"null"[..],
            b"true",
            b"false",
            b"0",
            b"-0",
            b"12",
            b"01",
            b"1.5",
            b"1.",
            b"1e3",
            b"-1",
            b"18446744073709551615",
            b"18446744073709551616",
            b"2.0",
            b"nul",
            b"-",
        ])
        .prop_map(<[u8]>::to_vec),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(|v| {
                let mut s = vec![b'['];
                s.extend(v.join(&b","[..]));
                s.push(b']');
                s
            }),
            proptest::collection::vec((key(), inner), 0..4).prop_map(|v| object(&v)),
        ]
    })
}

/// A key the parser reads somewhere, or another one.
fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "model", "messages", "prompt", "tools", "system", "max_tokens",
            "max_completion_tokens", "stream", "stream_options", "include_usage",
            "continuous_usage_stats", "cache_salt", "role", "content", "name", "tool_call_id",
            "tool_calls", "type", "text", "image_url", "temperature", "mod\\u0065l", "n",
            "best_of",
        ])
        .prop_map(|k| format!("\"{k}\"").into_bytes()),
        1 => string_literal(),
    ]
}

fn object(members: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut s = vec![b'{'];
    for (i, (k, v)) in members.iter().enumerate() {
        if i > 0 {
            s.push(b',');
        }
        s.extend_from_slice(k);
        s.push(b':');
        s.extend_from_slice(v);
    }
    s.push(b'}');
    s
}

/// A chat message: usually role and string content, sometimes anything.
fn message() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => (prop::sample::select(vec!["user", "assistant", "system", "tool", "r\\u00f4le"]),
              string_literal())
            .prop_map(|(role, content)| {
                object(&[
                    (b"\"role\"".to_vec(), format!("\"{role}\"").into_bytes()),
                    (b"\"content\"".to_vec(), content),
                ])
            }),
        1 => proptest::collection::vec((key(), value()), 0..4).prop_map(|v| object(&v)),
        1 => value(),
    ]
}

/// A request body: the usual fields with generated values, in any order, some repeated.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let member = prop_oneof![
        2 => Just((b"\"model\"".to_vec(), b"\"m\"".to_vec())),
        2 => proptest::collection::vec(message(), 0..5).prop_map(|m| {
            let mut s = vec![b'['];
            s.extend(m.join(&b","[..]));
            s.push(b']');
            (b"\"messages\"".to_vec(), s)
        }),
        3 => (key(), value()),
    ];
    (proptest::collection::vec(member, 0..7), any::<bool>()).prop_map(|(members, spaced)| {
        let b = object(&members);
        if spaced {
            // Whitespace of every kind between tokens (and, harmlessly, inside strings).
            b.iter()
                .flat_map(|&c| match c {
                    b',' => vec![b' ', b',', b'\n'],
                    b':' => vec![b'\t', b':', b'\r'],
                    _ => vec![c],
                })
                .collect()
        } else {
            b
        }
    })
}

#[test]
fn typical_bodies_take_the_fast_path() {
    let body = br#" {"model": "m", "messages": [{"role": "system", "content": "be \"brief\"\n"},
        {"role": "user", "content": "caf\u00e9 \u2014 d\u30c7 x", "x": [1, {"y": null}]}],
        "max_completion_tokens": 12, "temperature": 0.7, "stream": true,
        "stream_options": {"include_usage": true}, "cache_salt": "s",
        "tools": [{"type": "function", "function": {"name": "f"}}]} "#;
    assert!(fast::parse(Api::ChatCompletions, body, usize::MAX).is_some());
    agree(body, 40).unwrap();
    let p = parse(Api::ChatCompletions, body).unwrap();
    assert!(p
        .prompt
        .starts_with(b"\x1dtools\x1f[{\"function\":{\"name\":\"f\"}"));
    let completion = br#"{"model": "m", "prompt": "a\tb"}"#;
    assert!(fast::parse(Api::Completions, completion, usize::MAX).is_some());
    assert_eq!(parse(Api::Completions, completion).unwrap().prompt, b"a\tb");
}

#[test]
fn unusual_bodies_are_left_to_serde_json() {
    for body in [
        &br#"{"model": "m", "model": "n"}"#[..],
        br#"{"model": "m", "messages": [{"role": "user", "content": "\ud83d"}]}"#,
        br#"{"model": "m", "max_tokens": 1e3}"#,
        br#"{"mod\u0065l": "m"}"#,
        br#"{"model": ""}"#,
        br#"{"model": "m"} x"#,
    ] {
        assert!(fast::parse(Api::ChatCompletions, body, usize::MAX).is_none());
        agree(body, 3).unwrap();
    }
}

#[test]
fn invalid_utf8_and_control_bytes_in_content_agree() {
    for bad in [
        &b"\xff"[..],
        b"\xc3",
        b"\xc3(",
        b"\xed\xa0\x80",
        b"\xe2\x80",
        b"\xf4\x90\x80\x80",
        b"\x01",
        b"\x1f",
        b"\n",
    ] {
        for pad in [0, 1, 7, 8, 15, 16, 17, 40] {
            let mut b = b"{\"model\":\"m\",\"messages\":[{\"role\":\"u\",\"content\":\"".to_vec();
            b.extend(core::iter::repeat_n(b'a', pad));
            b.extend_from_slice(bad);
            b.extend_from_slice(b"caf\xc3\xa9 and more text\"}]}");
            assert!(parse(Api::ChatCompletions, &b).is_err(), "{b:?}");
            agree(&b, 9).unwrap();
        }
    }
}

#[test]
fn every_kind_of_stop_at_every_offset_of_the_16_byte_steps_agrees() {
    // Escapes, quotes, control bytes, non-ASCII and invalid UTF-8 at each offset within and
    // across the decoder's 16-byte steps, with tools after the messages (so they are put
    // before them in the prompt) and the body cut short at each of its last bytes.
    for piece in [
        &b"\\n"[..],
        b"\\\"",
        b"\\u0041",
        b"\\u00e9",
        b"\\ud83d\\ude00",
        b"\\q",
        b"\x01",
        b"\xc3\xa9",
        b"\xf0\x9f\x98\x80",
        b"\xff",
        b"\xe2\x80",
        b"\\n\xc3\xa9\\t",
        b"\xff\\n",
        b"\xc3\\n\xc3\xa9",
    ] {
        for pad in 0..40 {
            let mut b = b"{\"model\":\"m\",\"messages\":[{\"role\":\"u\",\"content\":\"".to_vec();
            b.extend(core::iter::repeat_n(b'a', pad));
            b.extend_from_slice(piece);
            b.extend(core::iter::repeat_n(b'b', 40 - pad));
            b.extend_from_slice(b"\"},{\"role\":\"v\",\"content\":\"");
            b.extend(core::iter::repeat_n(b'c', pad % 17));
            b.extend_from_slice(b"\"}],\"tools\":[{\"type\":\"function\"}]}");
            agree(&b, 9).unwrap();
            agree(&b, 50).unwrap();
            for cut in b.len() - 70..b.len() {
                agree(&b[..cut], 30).unwrap();
            }
        }
    }
}

#[test]
fn deep_nesting_agrees() {
    for depth in [10, 60, 63, 64, 65, 66, 127, 128, 129, 200, 1000] {
        let mut b = b"{\"model\":\"m\",\"x\":".to_vec();
        b.extend(core::iter::repeat_n(b'[', depth));
        b.extend(core::iter::repeat_n(b']', depth));
        b.push(b'}');
        agree(&b, 8).unwrap();
        let mut m =
            b"{\"model\":\"m\",\"messages\":[{\"role\":\"u\",\"content\":\"c\",\"x\":".to_vec();
        m.extend(core::iter::repeat_n(b'[', depth));
        m.extend(core::iter::repeat_n(b']', depth));
        m.extend_from_slice(b"}]}");
        agree(&m, 8).unwrap();
    }
}

#[test]
fn huge_strings_agree() {
    let text = "word \"q\" caf\u{e9}\n\t\\ ".repeat(20_000);
    let body = serde_json::to_vec(&serde_json::json!({
        "model": "m", "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": text}]
    }))
    .unwrap();
    assert!(fast::parse(Api::ChatCompletions, &body, usize::MAX).is_some());
    agree(&body, 100_003).unwrap();
    agree(&body, 7).unwrap();
}

/// A count as a client may write one: plain digits of every size, null, and the forms the
/// fast path leaves to `serde_json` (a fraction, an exponent, a sign, a string).
fn count() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => (0u64..300).prop_map(|n| n.to_string().into_bytes()),
        1 => any::<u64>().prop_map(|n| n.to_string().into_bytes()),
        1 => prop::sample::select(vec![
            &b"null"[..], b"4294967296", b"18446744073709551616", b"2.0", b"2.5", b"1e2",
            b"-1", b"\"8\"", b"[8]", b"true", b"08",
        ])
        .prop_map(<[u8]>::to_vec),
    ]
}

/// A `/v1/completions` prompt of every shape: a string, a batch of strings, a flat list of
/// token ids, a batch of token-id lists, an empty list, null, and mixed or wrong elements.
fn prompt() -> impl Strategy<Value = Vec<u8>> {
    let ids = proptest::collection::vec(0u64..5_000_000_000, 0..4).prop_map(|v| {
        let ids: Vec<String> = v.iter().map(u64::to_string).collect();
        format!("[{}]", ids.join(",")).into_bytes()
    });
    prop_oneof![
        2 => string_literal(),
        2 => proptest::collection::vec(string_literal(), 0..10).prop_map(|v| {
            let mut s = vec![b'['];
            s.extend(v.join(&b","[..]));
            s.push(b']');
            s
        }),
        1 => ids.clone(),
        2 => proptest::collection::vec(ids, 0..10).prop_map(|v| {
            let mut s = vec![b'['];
            s.extend(v.join(&b","[..]));
            s.push(b']');
            s
        }),
        1 => value(),
    ]
}

/// A body with a prompt (or messages), `n`, `best_of` and output limits in any order, some
/// repeated.
fn multiplicity_body() -> impl Strategy<Value = Vec<u8>> {
    let member = prop_oneof![
        2 => Just((b"\"model\"".to_vec(), b"\"m\"".to_vec())),
        3 => prompt().prop_map(|p| (b"\"prompt\"".to_vec(), p)),
        1 => proptest::collection::vec(message(), 0..3).prop_map(|m| {
            let mut s = vec![b'['];
            s.extend(m.join(&b","[..]));
            s.push(b']');
            (b"\"messages\"".to_vec(), s)
        }),
        3 => count().prop_map(|c| (b"\"n\"".to_vec(), c)),
        2 => count().prop_map(|c| (b"\"best_of\"".to_vec(), c)),
        1 => count().prop_map(|c| (b"\"max_tokens\"".to_vec(), c)),
        1 => count().prop_map(|c| (b"\"max_completion_tokens\"".to_vec(), c)),
    ];
    proptest::collection::vec(member, 0..7).prop_map(|members| object(&members))
}

#[test]
fn multiplicity_bodies_take_the_fast_path() {
    for (api, body, sequences) in [
        (
            Api::ChatCompletions,
            &br#"{"model": "m", "n": 8, "max_completion_tokens": 400, "messages": [{"role": "user", "content": "hi"}]}"#[..],
            8,
        ),
        (
            Api::Completions,
            br#"{"model": "m", "prompt": ["a", "b", "c"], "n": 2, "best_of": 3}"#,
            9,
        ),
        (
            Api::Completions,
            br#"{"model": "m", "prompt": [[1, 2], [3]], "n": null}"#,
            2,
        ),
        (Api::Completions, br#"{"model": "m", "prompt": "a", "n": 4}"#, 4),
    ] {
        assert!(fast::parse(api, body, usize::MAX).is_some());
        agree(body, 5).unwrap();
        assert_eq!(parse(api, body).unwrap().output_sequences, sequences);
    }
}

proptest! {
    #[test]
    fn agree_on_multiplicity_bodies(b in multiplicity_body(), limit in 0usize..64) {
        agree(&b, limit)?;
    }

    #[test]
    fn agree_on_generated_bodies(b in body(), limit in 0usize..64) {
        agree(&b, limit)?;
    }

    #[test]
    fn agree_on_truncated_and_mutated_bodies(
        b in body(),
        cut in any::<prop::sample::Index>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        limit in 0usize..64,
    ) {
        let mut m = b;
        for (at, v) in flips {
            if !m.is_empty() {
                let i = at.index(m.len());
                m[i] = v;
            }
        }
        agree(&m, limit)?;
        let n = cut.index(m.len() + 1);
        agree(&m[..n], limit)?;
    }

    #[test]
    fn agree_on_arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        agree(&b, 5)?;
    }

    #[test]
    fn agree_on_chat_bodies_from_serde(
        contents in proptest::collection::vec(any::<String>(), 0..4),
        limit in 0usize..200,
    ) {
        let messages: Vec<_> = contents
            .iter()
            .map(|c| serde_json::json!({"role": "user", "content": c}))
            .collect();
        let b = serde_json::to_vec(&serde_json::json!({"model": "m", "messages": messages})).unwrap();
        prop_assert!(fast::parse(Api::ChatCompletions, &b, usize::MAX).is_some());
        agree(&b, limit)?;
    }
}
