//! Unit and property tests of request parsing: every body shape and every error.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use super::*;
use alloc::string::ToString;
use alloc::vec;
use proptest::prelude::*;
use std::format;

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn chat(body: &str) -> ParsedRequest {
    match parse(Api::ChatCompletions, body.as_bytes()) {
        Ok(p) => p,
        Err(e) => panic!("chat body rejected: {e:?}: {body}"),
    }
}

fn err(api: Api, body: &str) -> RequestError {
    match parse(api, body.as_bytes()) {
        Ok(p) => panic!("accepted {body}: {p:?}"),
        Err(e) => e,
    }
}

/// Canonical bytes of one message with no attributes.
fn msg(content: &str, role: &str) -> Vec<u8> {
    let mut v = content.as_bytes().to_vec();
    v.push(US);
    v.extend_from_slice(role.as_bytes());
    v.push(RS);
    v
}

#[test]
fn api_from_path() {
    assert_eq!(
        Api::from_path("/v1/chat/completions"),
        Some(Api::ChatCompletions)
    );
    assert_eq!(
        Api::from_path("/v1/completions?x=1"),
        Some(Api::Completions)
    );
    assert_eq!(
        Api::from_path("/v1/messages?beta=true"),
        Some(Api::AnthropicMessages)
    );
    assert_eq!(Api::from_path("/v1/models"), None);
    assert_eq!(Api::from_path("/v1/chat/completions/"), None);
    assert_eq!(Api::from_path(""), None);
    for api in [
        Api::ChatCompletions,
        Api::Completions,
        Api::AnthropicMessages,
    ] {
        assert_eq!(Api::from_path(api.path()), Some(api));
    }
}

#[test]
fn chat_string_content_and_fields() {
    let p = chat(
        r#"{"model":"llama","messages":[{"role":"system","content":"be brief"},
        {"role":"user","content":"hi\n\"there\""}],"max_tokens":7,"stream":true,
        "stream_options":{"include_usage":true},"cache_salt":"t1","temperature":0.5}"#,
    );
    assert_eq!(p.api, Api::ChatCompletions);
    assert_eq!(p.model, "llama");
    let mut want = msg("be brief", "system");
    want.extend(msg("hi\n\"there\"", "user"));
    assert_eq!(p.prompt, want);
    assert_eq!(p.prompt_tokens, Tokens((want.len() as u64).div_ceil(4)));
    assert_eq!(p.max_output_tokens, Some(7));
    assert!(p.stream);
    assert!(p.include_usage);
    assert_eq!(p.cache_salt.as_deref(), Some("t1"));
}

#[test]
fn defaults_when_fields_absent() {
    let p = chat(r#"{"model":"m"}"#);
    assert!(p.prompt.is_empty());
    assert_eq!(p.prompt_tokens, Tokens(0));
    assert_eq!(p.max_output_tokens, None);
    assert!(!p.stream && !p.include_usage);
    assert_eq!(p.cache_salt, None);
    let p = chat(
        r#"{"model":"m","max_tokens":null,"stream":null,"stream_options":null,"cache_salt":null,"messages":null,"tools":null}"#,
    );
    assert!(p.prompt.is_empty() && !p.stream && p.max_output_tokens.is_none());
}

#[test]
fn max_completion_tokens_wins_over_max_tokens() {
    let p = chat(r#"{"max_completion_tokens":5,"model":"m","max_tokens":9}"#);
    assert_eq!(p.max_output_tokens, Some(5));
    let p = chat(r#"{"model":"m","max_tokens":9,"max_completion_tokens":null}"#);
    assert_eq!(p.max_output_tokens, Some(9));
    let p = chat(r#"{"model":"m","max_tokens":9.0}"#);
    assert_eq!(p.max_output_tokens, Some(9));
}

/// `(n, best_of, prompts, output_sequences)` of `body` parsed as `api`, by both paths.
fn multiplicity(api: Api, body: &str) -> (Option<u64>, Option<u64>, u64, u32) {
    let p = match parse(api, body.as_bytes()) {
        Ok(p) => p,
        Err(e) => panic!("{api:?} body rejected: {e:?}: {body}"),
    };
    assert_eq!(
        parse_reference(api, body.as_bytes(), usize::MAX).as_ref(),
        Ok(&p),
        "{body}"
    );
    (p.n, p.best_of, p.prompts, p.output_sequences)
}

#[test]
fn n_and_best_of_multiply_the_output() {
    let chat = Api::ChatCompletions;
    assert_eq!(multiplicity(chat, r#"{"model":"m"}"#), (None, None, 1, 1));
    assert_eq!(
        multiplicity(chat, r#"{"model":"m","n":8,"max_completion_tokens":400}"#),
        (Some(8), None, 1, 8)
    );
    // best_of generates that many per prompt and returns n; the larger counts.
    assert_eq!(
        multiplicity(chat, r#"{"model":"m","n":2,"best_of":5}"#),
        (Some(2), Some(5), 1, 5)
    );
    assert_eq!(
        multiplicity(chat, r#"{"model":"m","best_of":3}"#),
        (None, Some(3), 1, 3)
    );
    assert_eq!(
        multiplicity(chat, r#"{"model":"m","n":4,"best_of":2}"#),
        (Some(4), Some(2), 1, 4)
    );
    // null is absent; 0 generates no fewer than one (the engine refuses it anyway).
    assert_eq!(
        multiplicity(chat, r#"{"model":"m","n":null,"best_of":null}"#),
        (None, None, 1, 1)
    );
    assert_eq!(
        multiplicity(chat, r#"{"model":"m","n":0}"#),
        (Some(0), None, 1, 1)
    );
    assert_eq!(
        multiplicity(chat, r#"{"model":"m","n":3.0}"#),
        (Some(3), None, 1, 3)
    );
    // A repeated key replaces the earlier value.
    assert_eq!(
        multiplicity(chat, r#"{"model":"m","n":9,"n":2}"#),
        (Some(2), None, 1, 2)
    );
    // Huge values saturate, never overflow.
    assert_eq!(
        multiplicity(chat, r#"{"model":"m","n":18446744073709551615}"#),
        (Some(u64::MAX), None, 1, u32::MAX)
    );
    assert_eq!(
        multiplicity(chat, r#"{"model":"m","n":4294967296}"#).3,
        u32::MAX
    );
    // The Messages API has neither field: both are ignored, whatever their type.
    assert_eq!(
        multiplicity(
            Api::AnthropicMessages,
            r#"{"model":"m","n":8,"best_of":"x"}"#
        ),
        (None, None, 1, 1)
    );
}

#[test]
fn completions_batches_count_their_prompts() {
    let c = Api::Completions;
    for (prompt, prompts) in [
        (r#""one""#, 1),
        (r#"["one"]"#, 1),
        (r#"["a","b","c","d","e","f","g","h"]"#, 8),
        (r#"[1,2,3]"#, 1),
        (r#"[[1,2],[3],[4,5,6]]"#, 3),
        (r#"[[]]"#, 1),
        (r#"[[],[]]"#, 2),
        (r#"[]"#, 1),
        (r#"null"#, 1),
    ] {
        let body = format!(r#"{{"model":"m","prompt":{prompt}}}"#);
        assert_eq!(
            multiplicity(c, &body),
            (None, None, prompts, prompts as u32),
            "{prompt}"
        );
        let body = format!(r#"{{"model":"m","n":4,"prompt":{prompt},"max_tokens":16}}"#);
        assert_eq!(multiplicity(c, &body).3, 4 * prompts as u32, "{prompt}");
    }
    // The later prompt replaces the earlier, its count too.
    assert_eq!(
        multiplicity(c, r#"{"model":"m","prompt":["a","b"],"prompt":"c"}"#).2,
        1
    );
    // Chat has no prompt batch: a `prompt` there is skipped.
    assert_eq!(
        multiplicity(Api::ChatCompletions, r#"{"model":"m","prompt":["a","b"]}"#).2,
        1
    );
    // A batch times a huge n saturates.
    assert_eq!(
        multiplicity(c, r#"{"model":"m","n":4294967295,"prompt":["a","b"]}"#).3,
        u32::MAX
    );
}

#[test]
fn n_and_best_of_of_the_wrong_type_name_the_param() {
    for api in [Api::ChatCompletions, Api::Completions] {
        for (body, param) in [
            (r#"{"model":"m","n":"8"}"#, "n"),
            (r#"{"model":"m","n":-1}"#, "n"),
            (r#"{"model":"m","n":1.5}"#, "n"),
            (r#"{"model":"m","n":[8]}"#, "n"),
            (r#"{"model":"m","n":true}"#, "n"),
            (r#"{"model":"m","best_of":{}}"#, "best_of"),
            (r#"{"model":"m","best_of":-3}"#, "best_of"),
            (r#"{"model":"m","best_of":1e30}"#, "best_of"),
        ] {
            let e = err(api, body);
            assert_eq!(
                (e.code(), e.param()),
                ("invalid_type", Some(param)),
                "{body}"
            );
            assert_eq!(
                parse_reference(api, body.as_bytes(), usize::MAX),
                Err(e),
                "{body}"
            );
        }
    }
}

#[test]
fn output_sequences_saturates() {
    assert_eq!(output_sequences(None, None, 0), 1);
    assert_eq!(output_sequences(Some(0), Some(0), 0), 1);
    assert_eq!(output_sequences(Some(8), None, 1), 8);
    assert_eq!(output_sequences(Some(2), Some(3), 4), 12);
    assert_eq!(
        output_sequences(Some(u64::MAX), Some(u64::MAX), u64::MAX),
        u32::MAX
    );
    assert_eq!(output_sequences(Some(65_536), None, 65_536), u32::MAX);
    assert_eq!(output_sequences(Some(65_535), None, 65_537), 4_294_967_295);
}

#[test]
fn key_order_does_not_change_the_prompt() {
    let a = chat(
        r#"{"model":"m","messages":[{"role":"user","content":"x","name":"bob"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":[true,null]}}}]}"#,
    );
    let b = chat(
        r#"{"tools":[{"function":{"parameters":{"a":[true,null],"b":1.0},"name":"f"},"type":"function"}],"messages":[{"name":"bob","content":"x","role":"user"}],"model":"m"}"#,
    );
    assert_eq!(a.prompt, b.prompt);
    let mut want = vec![GS];
    want.extend_from_slice(b"tools");
    want.push(US);
    want.extend_from_slice(
        br#"[{"function":{"name":"f","parameters":{"a":[true,null],"b":1}},"type":"function"}]"#,
    );
    want.push(RS);
    want.extend_from_slice(b"x");
    want.push(US);
    want.extend_from_slice(b"user");
    want.push(US);
    want.extend_from_slice(b"name");
    want.push(US);
    want.extend_from_slice(b"bob");
    want.push(RS);
    assert_eq!(a.prompt, want);
}

#[test]
fn empty_tools_are_like_no_tools() {
    let a = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[]}"#);
    let b = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#);
    assert_eq!(a.prompt, b.prompt);
}

#[test]
fn content_parts_text_and_media() {
    let parts = chat(
        r#"{"model":"m","messages":[{"role":"user","content":[
        {"type":"text","text":"look at "},
        {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},
        {"text":"this","type":"text"}]}]}"#,
    );
    let s = &parts.prompt;
    assert!(s.starts_with(b"look at \x1aimage_url\x1f"), "{s:?}");
    // 16 hex digits of digest, then SUB, then the second text part, then the trailer.
    let tail = s.get(19..).unwrap_or_default();
    assert_eq!(tail.len(), 16 + 1 + 4 + 1 + 4 + 1);
    assert!(tail
        .get(..16)
        .unwrap_or_default()
        .iter()
        .all(u8::is_ascii_hexdigit));
    assert!(tail.ends_with(b"\x1athis\x1fuser\x1e"));
    assert!(
        !s.windows(4).any(|w| w == b"AAAA"),
        "image data must not be in the prompt"
    );

    let other_image = chat(
        r#"{"model":"m","messages":[{"role":"user","content":[
        {"type":"text","text":"look at "},
        {"type":"image_url","image_url":{"url":"data:image/png;base64,BBBB"}},
        {"text":"this","type":"text"}]}]}"#,
    );
    assert_ne!(parts.prompt, other_image.prompt);
    assert_eq!(parts.prompt.len(), other_image.prompt.len());
}

#[test]
fn text_parts_equal_string_content() {
    let a = chat(
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"ab"},{"type":"text","text":"c"}]}]}"#,
    );
    let b = chat(r#"{"model":"m","messages":[{"role":"user","content":"abc"}]}"#);
    let c = chat(r#"{"model":"m","messages":[{"role":"user","content":["ab","c"]}]}"#);
    assert_eq!(a.prompt, b.prompt);
    assert_eq!(c.prompt, b.prompt);
}

#[test]
fn tool_calls_and_tool_messages() {
    let p = chat(
        r#"{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},
        {"role":"tool","tool_call_id":"c1","content":"42"}]}"#,
    );
    let mut want = vec![US];
    want.extend_from_slice(b"assistant");
    want.push(US);
    want.extend_from_slice(b"tool_calls");
    want.push(US);
    want.extend_from_slice(
        br#"[{"function":{"arguments":"{\"x\":1}","name":"f"},"id":"c1","type":"function"}]"#,
    );
    want.push(RS);
    want.extend_from_slice(b"42");
    want.push(US);
    want.extend_from_slice(b"tool");
    want.push(US);
    want.extend_from_slice(b"tool_call_id");
    want.push(US);
    want.extend_from_slice(b"c1");
    want.push(RS);
    assert_eq!(p.prompt, want);
}

#[test]
fn completions_prompt_shapes() {
    let c = |body: &str| match parse(Api::Completions, body.as_bytes()) {
        Ok(p) => p,
        Err(e) => panic!("{e:?}"),
    };
    let s = c(r#"{"model":"m","prompt":"Hello\u00e9 \"w\"","messages":"ignored here"}"#);
    assert_eq!(s.prompt, "Hello\u{e9} \"w\"".as_bytes());
    assert_eq!(s.prompt_tokens, Tokens(3)); // 11 bytes
    assert_eq!(c(r#"{"model":"m","prompt":["abc"]}"#).prompt, b"abc");
    assert_eq!(c(r#"{"model":"m","prompt":["a","b"]}"#).prompt, b"a\x1eb");
    let ids = c(r#"{"model":"m","prompt":[1,256,4294967295]}"#);
    assert_eq!(ids.prompt, [1, 0, 0, 0, 0, 1, 0, 0, 255, 255, 255, 255]);
    assert_eq!(ids.prompt_tokens, Tokens(3));
    let batches = c(r#"{"model":"m","prompt":[[1],[2,3]]}"#);
    assert_eq!(
        batches.prompt,
        [1, 0, 0, 0, 255, 255, 255, 255, 2, 0, 0, 0, 3, 0, 0, 0]
    );
    assert!(c(r#"{"model":"m","prompt":[]}"#).prompt.is_empty());
    assert!(c(r#"{"model":"m","prompt":null}"#).prompt.is_empty());
    assert!(c(r#"{"model":"m"}"#).prompt.is_empty());
    assert!(!c(r#"{"model":"m","stream":true}"#).include_usage);
}

#[test]
fn stream_options_flags_are_read_separately() {
    let c = |body: &str| parse(Api::Completions, body.as_bytes()).unwrap();
    let both = c(r#"{"model":"m","stream":true,
        "stream_options":{"continuous_usage_stats":true,"include_usage":true}}"#);
    assert!(both.include_usage && both.continuous_usage);
    let only = c(r#"{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true}}"#);
    assert!(!only.include_usage && only.continuous_usage);
    assert!(!c(r#"{"model":"m","stream_options":null}"#).continuous_usage);
    let err = parse(
        Api::Completions,
        br#"{"model":"m","stream_options":{"continuous_usage_stats":"yes"}}"#,
    )
    .unwrap_err();
    assert_eq!(err.param(), Some("stream_options.continuous_usage_stats"));
}

#[test]
fn anthropic_system_and_blocks() {
    let a = match parse(
        Api::AnthropicMessages,
        br#"{"model":"claude","max_tokens":1024,"messages":[{"role":"user","content":[
        {"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}],
        "system":[{"type":"text","text":"sys","cache_control":{"type":"ephemeral"}}],"stream":true}"#,
    ) {
        Ok(p) => p,
        Err(e) => panic!("{e:?}"),
    };
    let mut want = msg("sys", "system");
    want.extend(msg("hi", "user"));
    assert_eq!(a.prompt, want);
    assert_eq!(a.max_output_tokens, Some(1024));
    assert!(a.stream && a.include_usage);
    // The same conversation as OpenAI chat gives the same bytes.
    let o = chat(
        r#"{"model":"claude","messages":[{"role":"system","content":"sys"},{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(o.prompt, a.prompt);
}

#[test]
fn anthropic_tool_blocks_are_canonical_json() {
    let a = match parse(
        Api::AnthropicMessages,
        br#"{"model":"c","system":"s","messages":[{"role":"assistant","content":[
        {"type":"tool_use","id":"t1","name":"get","input":{"q":"x"}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}]}"#,
    ) {
        Ok(p) => p,
        Err(e) => panic!("{e:?}"),
    };
    let text = String::from_utf8_lossy(&a.prompt).to_string();
    assert!(
        text.contains(
            "\u{1a}tool_use\u{1f}{\"id\":\"t1\",\"input\":{\"q\":\"x\"},\"name\":\"get\"}\u{1a}"
        ),
        "{text:?}"
    );
    assert!(
        text.contains("\u{1a}tool_result\u{1f}{\"content\":\"ok\",\"tool_use_id\":\"t1\"}\u{1a}"),
        "{text:?}"
    );
    assert!(a.prompt.starts_with(b"s\x1fsystem\x1e"));
}

#[test]
fn repeated_keys_replace() {
    let p = chat(
        r#"{"model":"a","messages":[{"role":"user","content":"1"}],"model":"b","messages":[{"role":"user","content":"2"}]}"#,
    );
    assert_eq!(p.model, "b");
    assert_eq!(p.prompt, msg("2", "user"));
}

#[test]
fn escaped_keys_and_unicode() {
    let p =
        chat(r#"{"mod\u0065l":"m\u00fc","messages":[{"role":"user","content":"\ud83d\ude00"}]}"#);
    assert_eq!(p.model, "m\u{fc}");
    assert_eq!(p.prompt, msg("\u{1F600}", "user"));
}

#[test]
fn not_json_errors() {
    for body in [
        "",
        "{",
        "{\"model\":\"m\"",
        "nope",
        "{\"model\":\"m\"} x",
        "{\"model\":'m'}",
    ] {
        assert_eq!(
            err(Api::ChatCompletions, body),
            RequestError::NotJson,
            "{body}"
        );
    }
    assert_eq!(
        parse(Api::ChatCompletions, b"{\"model\":\"m\xff\"}"),
        Err(RequestError::NotJson)
    );
    let e = RequestError::NotJson;
    assert_eq!(
        (e.http_status(), e.code(), e.param()),
        (400, "invalid_json", None)
    );
}

#[test]
fn not_object_errors() {
    for body in ["[]", "1", "\"model\"", "null", "true", "-1", "1.5"] {
        let e = err(Api::ChatCompletions, body);
        assert_eq!(e, RequestError::NotObject, "{body}");
        assert_eq!(e.param(), None);
    }
}

#[test]
fn model_errors() {
    let e = err(Api::ChatCompletions, r#"{"messages":[]}"#);
    assert_eq!(e, RequestError::MissingModel);
    assert_eq!(
        (e.param(), e.code()),
        (Some("model"), "missing_required_parameter")
    );
    assert!(e.message().contains("model"));
    assert_eq!(
        err(Api::Completions, r#"{"model":""}"#),
        RequestError::MissingModel
    );
    for body in [
        r#"{"model":1}"#,
        r#"{"model":null}"#,
        r#"{"model":["m"]}"#,
        r#"{"model":{}}"#,
    ] {
        let e = err(Api::AnthropicMessages, body);
        assert_eq!(
            e,
            RequestError::WrongType {
                field: "model",
                expected: "string"
            },
            "{body}"
        );
        assert_eq!((e.param(), e.code()), (Some("model"), "invalid_type"));
    }
}

#[test]
fn wrong_type_errors_name_the_field() {
    let cases: &[(Api, &str, &str)] = &[
        (
            Api::ChatCompletions,
            r#"{"model":"m","messages":{}}"#,
            "messages",
        ),
        (
            Api::ChatCompletions,
            r#"{"model":"m","messages":"hi"}"#,
            "messages",
        ),
        (
            Api::ChatCompletions,
            r#"{"model":"m","messages":[1]}"#,
            "messages[]",
        ),
        (
            Api::ChatCompletions,
            r#"{"model":"m","messages":[null]}"#,
            "messages[]",
        ),
        (
            Api::ChatCompletions,
            r#"{"model":"m","messages":[{"role":1}]}"#,
            "messages[].role",
        ),
        (
            Api::ChatCompletions,
            r#"{"model":"m","messages":[{"content":7}]}"#,
            "messages[].content",
        ),
        (
            Api::ChatCompletions,
            r#"{"model":"m","messages":[{"content":{"text":"x"}}]}"#,
            "messages[].content",
        ),
        (
            Api::ChatCompletions,
            r#"{"model":"m","messages":[{"content":[1]}]}"#,
            "messages[].content[]",
        ),
        (
            Api::ChatCompletions,
            r#"{"model":"m","messages":[{"content":[{"type":"text","text":5}]}]}"#,
            "messages[].content[].text",
        ),
        (
            Api::ChatCompletions,
            r#"{"model":"m","messages":[{"content":[{"type":3}]}]}"#,
            "messages[].content[].type",
        ),
        (
            Api::ChatCompletions,
            r#"{"model":"m","messages":[{"name":[]}]}"#,
            "messages[].name",
        ),
        (
            Api::ChatCompletions,
            r#"{"model":"m","messages":[{"tool_call_id":false}]}"#,
            "messages[].tool_call_id",
        ),
        (Api::ChatCompletions, r#"{"model":"m","tools":{}}"#, "tools"),
        (
            Api::ChatCompletions,
            r#"{"model":"m","max_tokens":"9"}"#,
            "max_tokens",
        ),
        (
            Api::ChatCompletions,
            r#"{"model":"m","max_tokens":-1}"#,
            "max_tokens",
        ),
        (
            Api::ChatCompletions,
            r#"{"model":"m","max_tokens":1.5}"#,
            "max_tokens",
        ),
        (
            Api::ChatCompletions,
            r#"{"model":"m","max_completion_tokens":true}"#,
            "max_completion_tokens",
        ),
        (
            Api::ChatCompletions,
            r#"{"model":"m","stream":"yes"}"#,
            "stream",
        ),
        (
            Api::ChatCompletions,
            r#"{"model":"m","stream_options":true}"#,
            "stream_options",
        ),
        (
            Api::ChatCompletions,
            r#"{"model":"m","stream_options":{"include_usage":1}}"#,
            "stream_options.include_usage",
        ),
        (
            Api::ChatCompletions,
            r#"{"model":"m","cache_salt":5}"#,
            "cache_salt",
        ),
        (Api::Completions, r#"{"model":"m","prompt":5}"#, "prompt"),
        (Api::Completions, r#"{"model":"m","prompt":{}}"#, "prompt"),
        (
            Api::Completions,
            r#"{"model":"m","prompt":["a",1]}"#,
            "prompt",
        ),
        (
            Api::Completions,
            r#"{"model":"m","prompt":[1,"a"]}"#,
            "prompt",
        ),
        (
            Api::Completions,
            r#"{"model":"m","prompt":[[1],2]}"#,
            "prompt",
        ),
        (
            Api::Completions,
            r#"{"model":"m","prompt":[null]}"#,
            "prompt",
        ),
        (
            Api::Completions,
            r#"{"model":"m","prompt":[-1]}"#,
            "prompt[]",
        ),
        (
            Api::Completions,
            r#"{"model":"m","prompt":[4294967296]}"#,
            "prompt[]",
        ),
        (
            Api::Completions,
            r#"{"model":"m","prompt":[1.5]}"#,
            "prompt[]",
        ),
        (
            Api::Completions,
            r#"{"model":"m","prompt":[[1,"x"]]}"#,
            "prompt[][]",
        ),
        (
            Api::Completions,
            r#"{"model":"m","prompt":[[4294967296]]}"#,
            "prompt[]",
        ),
        (
            Api::AnthropicMessages,
            r#"{"model":"m","system":5}"#,
            "system",
        ),
        (
            Api::AnthropicMessages,
            r#"{"model":"m","system":[5]}"#,
            "system[]",
        ),
        (
            Api::AnthropicMessages,
            r#"{"model":"m","system":[{"type":"text","text":{}}]}"#,
            "system[].text",
        ),
    ];
    for (api, body, field) in cases {
        let e = err(*api, body);
        assert!(
            matches!(e, RequestError::WrongType { field: f, .. } if f == *field),
            "{body}: {e:?}"
        );
        assert_eq!(e.param(), Some(*field));
        assert_eq!(e.code(), "invalid_type");
        assert!(e.message().contains(field), "{}", e.message());
        assert_eq!(format!("{e}"), e.message());
    }
}

#[test]
fn wrong_types_in_fields_of_other_apis_are_ignored() {
    // Completions ignores `messages`/`tools`; chat ignores `prompt`/`system`.
    assert!(parse(Api::Completions, br#"{"model":"m","messages":5,"tools":1}"#).is_ok());
    assert!(parse(
        Api::ChatCompletions,
        br#"{"model":"m","prompt":5,"system":1}"#
    )
    .is_ok());
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let mut body = String::from(r#"{"model":"m","tools":"#);
    for _ in 0..10_000 {
        body.push('[');
    }
    assert_eq!(
        parse(Api::ChatCompletions, body.as_bytes()),
        Err(RequestError::NotJson)
    );
}

/// A small realistic body to mutate.
const SEED_BODY: &str = r#"{"model":"llama-3","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":[{"type":"text","text":"Hi \"you\"\n"},{"type":"image_url","image_url":{"url":"http://x/y.png"}}]},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"max_tokens":100,"stream":true,"stream_options":{"include_usage":true},"cache_salt":"s","prompt":[1,2,[3]],"system":[{"type":"text","text":"x"}]}"#;

proptest! {
    #[test]
    fn never_panics_on_arbitrary_bytes(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        for api in [Api::ChatCompletions, Api::Completions, Api::AnthropicMessages] {
            let _ = parse(api, &body);
        }
    }

    #[test]
    fn never_panics_on_mutated_json(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 1..8)
    ) {
        let mut body = SEED_BODY.as_bytes().to_vec();
        for (pos, byte, op) in edits {
            let i = pos % (body.len() + 1);
            match op {
                0 => body.insert(i, byte),
                1 if i < body.len() => { body.remove(i); }
                _ => if let Some(b) = body.get_mut(i) { *b = byte; },
            }
        }
        for api in [Api::ChatCompletions, Api::Completions, Api::AnthropicMessages] {
            if let Ok(p) = parse(api, &body) {
                prop_assert!(!p.model.is_empty());
                prop_assert_eq!(p.prompt_tokens, estimate_tokens(p.prompt_len));
                prop_assert!(p.prompt.len() <= p.prompt_len);
            }
        }
    }

    #[test]
    fn json_token_swaps_never_panic(
        picks in proptest::collection::vec((0usize..64, 0usize..12), 1..4)
    ) {
        // Replace whole JSON values with values of other types.
        const VALUES: [&str; 12] = ["null", "true", "0", "-1", "1.5", "\"s\"", "[]", "{}", "[1]", "[\"a\"]", "[{}]", "{\"type\":\"text\"}"];
        let mut body = SEED_BODY.to_string();
        for (nth, v) in picks {
            let starts: Vec<usize> = body.match_indices(':').map(|(i, _)| i + 1).collect();
            if let Some(&start) = starts.get(nth % starts.len().max(1)) {
                let end = body[start..].find([',', '}', ']']).map_or(body.len(), |e| start + e);
                body.replace_range(start..end, VALUES[v]);
            }
        }
        for api in [Api::ChatCompletions, Api::Completions, Api::AnthropicMessages] {
            let _ = parse(api, body.as_bytes());
        }
    }

    #[test]
    fn completion_string_prompt_bytes_exact(s in ".*") {
        let body = serde_json::to_string(&serde_json::json!({"model": "m", "prompt": s})).unwrap_or_default();
        let p = parse(Api::Completions, body.as_bytes());
        prop_assert_eq!(p.map(|p| p.prompt), Ok(s.as_bytes().to_vec()));
    }
}

#[test]
fn example_bodies() {
    let ok = |api: Api, body: &str| match parse(api, body.as_bytes()) {
        Ok(p) => p,
        Err(e) => panic!("{e:?}"),
    };
    let p = ok(
        Api::ChatCompletions,
        include_str!("../../../testdata/requests/chat-simple.json"),
    );
    assert_eq!(p.model, "meta-llama/Llama-3.1-8B-Instruct");
    assert_eq!(p.max_output_tokens, Some(128));
    let mut want = msg("You are a concise assistant.", "system");
    want.extend(msg(
        "What is prefix caching in LLM serving?\nAnswer in two sentences.",
        "user",
    ));
    assert_eq!(p.prompt, want);

    let p = ok(
        Api::ChatCompletions,
        include_str!("../../../testdata/requests/chat-stream-tools.json"),
    );
    assert!(p.stream && p.include_usage);
    assert_eq!(
        (p.max_output_tokens, p.cache_salt.as_deref()),
        (Some(256), Some("tenant-a"))
    );
    assert!(p.prompt.starts_with(b"\x1dtools\x1f[{\"function\":{\"description\":\"Current weather for a city.\",\"name\":\"get_weather\""));
    assert!(p
        .prompt
        .ends_with("18°C, light rain\x1ftool\x1ftool_call_id\x1fcall_1\x1e".as_bytes()));

    let p = ok(
        Api::Completions,
        include_str!("../../../testdata/requests/completions-string.json"),
    );
    assert_eq!(
        p.prompt,
        b"def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
    );
    assert!(!p.stream);

    let p = ok(
        Api::Completions,
        include_str!("../../../testdata/requests/completions-token-ids.json"),
    );
    assert_eq!(p.prompt_tokens, Tokens(7)); // 6 ids + 1 separator pseudo-token
    assert_eq!(p.prompt.get(..4), Some(&9707u32.to_le_bytes()[..]));
    assert_eq!((p.prompts, p.output_sequences), (2, 2));

    let p = ok(
        Api::ChatCompletions,
        include_str!("../../../testdata/requests/chat-n.json"),
    );
    assert_eq!((p.n, p.best_of, p.prompts), (Some(8), None, 1));
    assert_eq!((p.max_output_tokens, p.output_sequences), (Some(400), 8));

    let p = ok(
        Api::Completions,
        include_str!("../../../testdata/requests/completions-batch.json"),
    );
    // Three prompts, each generating best_of = 3 sequences of which n = 2 are returned.
    assert_eq!((p.n, p.best_of, p.prompts), (Some(2), Some(3), 3));
    assert_eq!(p.output_sequences, 9);
    assert_eq!(
        p.prompt,
        b"The capital of France is\x1eThe capital of Japan is\x1eThe capital of Peru is"
    );

    let p = ok(
        Api::AnthropicMessages,
        include_str!("../../../testdata/requests/anthropic-messages.json"),
    );
    assert_eq!(
        (p.model.as_str(), p.max_output_tokens, p.stream),
        ("claude-sonnet-4", Some(1024), true)
    );
    let mut want = msg("You are a code reviewer.", "system");
    want.extend(msg(
        "Review this function:\n\nfn add(a: i32, b: i32) -> i32 { a - b }",
        "user",
    ));
    want.extend(msg(
        "The function subtracts instead of adding.",
        "assistant",
    ));
    want.extend(msg("Fix it.", "user"));
    assert_eq!(p.prompt, want);

    let e = err(
        Api::ChatCompletions,
        include_str!("../../../testdata/requests/error-missing-model.json"),
    );
    assert_eq!(
        (e.code(), e.param()),
        ("missing_required_parameter", Some("model"))
    );
    let e = err(
        Api::ChatCompletions,
        include_str!("../../../testdata/requests/error-wrong-type.json"),
    );
    assert_eq!(
        (e.code(), e.param()),
        ("invalid_type", Some("messages[].content"))
    );
}
