//! Usage over real sockets, byte for byte as vLLM shapes it: the usage-only chunk, continuous
//! usage (only with `include_usage`), no `usage` key when nothing was asked, cached tokens,
//! and the mode that sends no usage at all.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{call, chat, payloads, pool};
use infergate_sim::{PromptTokensDetails, SimConfig};
use serde_json::{json, Value};

fn fast() -> SimConfig {
    SimConfig {
        time_scale: 50.0,
        ..SimConfig::default()
    }
}

/// "<|user|>\n" + content + "\n" + "<|assistant|>\n": 24 bytes around the content.
fn chat_prompt_tokens(content: &str) -> u64 {
    (24 + content.len() as u64).div_ceil(4)
}

async fn stream(sim: &infergate_sim::SimHandle, body: Value) -> String {
    let r = call(
        &sim.addrs()[0],
        "POST",
        "/v1/chat/completions",
        Some(&body),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

#[tokio::test]
async fn no_usage_key_at_all_unless_asked() {
    let sim = pool(fast()).await;
    for opts in [
        json!({}),
        json!({"stream_options": {"include_usage": false}}),
        // vLLM honours continuous_usage_stats only together with include_usage.
        json!({"stream_options": {"continuous_usage_stats": true}}),
        json!({"stream_options": {"include_usage": false, "continuous_usage_stats": true}}),
    ] {
        let mut body = chat("hello", json!({"stream": true, "max_tokens": 3}));
        body.as_object_mut()
            .unwrap()
            .extend(opts.as_object().unwrap().clone());
        let text = stream(&sim, body).await;
        assert!(!text.contains("usage"), "{opts}: {text}");
        let p = payloads(&text);
        assert_eq!(p.len(), 5, "role, 3 tokens, [DONE]: {text}");
        assert_eq!(*p.last().unwrap(), "[DONE]");
    }
}

#[tokio::test]
async fn include_usage_adds_one_usage_only_chunk_in_vllm_order() {
    let sim = pool(fast()).await;
    let body = chat(
        "hello",
        json!({"stream": true, "max_tokens": 3, "stream_options": {"include_usage": true}}),
    );
    let text = stream(&sim, body).await;
    let p = payloads(&text);
    assert_eq!(p.len(), 6, "role, 3 tokens, usage, [DONE]");
    for c in &p[..4] {
        assert!(!c.contains("usage"), "{c}");
    }
    let v: Value = serde_json::from_str(p[1]).unwrap();
    let id = v["id"].as_str().unwrap();
    let created = v["created"].as_u64().unwrap();
    let pt = chat_prompt_tokens("hello");
    assert_eq!(
        p[4],
        format!(
            r#"{{"id":"{id}","object":"chat.completion.chunk","created":{created},"model":"sim-model","choices":[],"usage":{{"prompt_tokens":{pt},"total_tokens":{},"completion_tokens":3,"prompt_tokens_details":{{"cached_tokens":0}}}}}}"#,
            pt + 3
        )
    );
    // Every content chunk but the last has finish_reason null and no stop_reason; the last
    // says why it stopped.
    assert!(
        p[1].ends_with(r#""logprobs":null,"finish_reason":null}]}"#),
        "{}",
        p[1]
    );
    assert!(
        p[3].ends_with(r#""logprobs":null,"finish_reason":"length","stop_reason":null}]}"#),
        "{}",
        p[3]
    );
    assert!(p[0].starts_with(&format!(r#"{{"id":"{id}","object":"chat.completion.chunk","created":{created},"model":"sim-model","choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},"logprobs":null,"finish_reason":null}}]"#)));
}

#[tokio::test]
async fn continuous_usage_is_on_every_chunk_with_the_counts_so_far() {
    let sim = pool(fast()).await;
    let body = chat(
        "hello",
        json!({"stream": true, "max_tokens": 4,
               "stream_options": {"include_usage": true, "continuous_usage_stats": true}}),
    );
    let text = stream(&sim, body).await;
    let p = payloads(&text);
    assert_eq!(p.len(), 7, "role, 4 tokens, usage, [DONE]");
    let pt = chat_prompt_tokens("hello");
    for (k, chunk) in p[..5].iter().enumerate() {
        let tail = format!(
            r#"],"usage":{{"prompt_tokens":{pt},"total_tokens":{},"completion_tokens":{k}}}}}"#,
            pt + k as u64
        );
        assert!(chunk.ends_with(&tail), "chunk {k}: {chunk}");
    }
    let last: Value = serde_json::from_str(p[5]).unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 4);
    assert_eq!(last["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    // Removing the usage of every chunk leaves exactly the chunks sent without usage.
    let plain = stream(
        &sim,
        chat("hello", json!({"stream": true, "max_tokens": 4})),
    )
    .await;
    let strip = |c: &str| -> String {
        let v: Value = serde_json::from_str(c).unwrap();
        let mut v = v;
        v.as_object_mut().unwrap().remove("usage");
        v.as_object_mut().unwrap().remove("id");
        v.as_object_mut().unwrap().remove("created");
        v.to_string()
    };
    let plain_p = payloads(&plain);
    assert_eq!(plain_p.len(), 6);
    for (a, b) in p[..5].iter().zip(&plain_p[..5]) {
        assert_eq!(strip(a), strip(b));
    }
}

#[tokio::test]
async fn completions_chunks_carry_usage_null_as_vllm_does() {
    let sim = pool(fast()).await;
    let addr = sim.addrs()[0];
    let plain =
        json!({"model": "sim-model", "prompt": "abcdefgh", "max_tokens": 2, "stream": true});
    let r = call(&addr, "POST", "/v1/completions", Some(&plain), &[]).await;
    let p = payloads(&r.body);
    assert_eq!(p.len(), 3, "2 tokens, [DONE]");
    assert!(
        p[0].ends_with(
            r#""logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}"#
        ),
        "{}",
        p[0]
    );
    assert!(p[1].contains(r#""finish_reason":"length","stop_reason":null}],"usage":null}"#));
    let cont = json!({"model": "sim-model", "prompt": "abcdefgh", "max_tokens": 2, "stream": true,
                      "stream_options": {"include_usage": true, "continuous_usage_stats": true}});
    let r = call(&addr, "POST", "/v1/completions", Some(&cont), &[]).await;
    let p = payloads(&r.body);
    assert_eq!(p.len(), 4, "2 tokens, usage, [DONE]");
    assert!(p[1].ends_with(r#"],"usage":{"prompt_tokens":2,"total_tokens":4,"completion_tokens":2,"prompt_tokens_details":null}}"#), "{}", p[1]);
    assert!(p[2].contains(r#""object":"text_completion","#));
    assert!(p[2].ends_with(r#""choices":[],"usage":{"prompt_tokens":2,"total_tokens":4,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}"#), "{}", p[2]);
}

#[tokio::test]
async fn cached_tokens_come_from_the_prefix_cache_streamed_and_not() {
    let sim = pool(fast()).await;
    let addr = sim.addrs()[0];
    let content = "a shared long prefix ".repeat(40);
    let pt = chat_prompt_tokens(&content);
    // 864 bytes = 216 tokens; 13 full 16-token blocks = 208 tokens can hit.
    assert_eq!(pt, 216);
    let first: Value = serde_json::from_str(
        &call(
            &addr,
            "POST",
            "/v1/chat/completions",
            Some(&chat(&content, json!({"max_tokens": 2}))),
            &[],
        )
        .await
        .body,
    )
    .unwrap();
    assert_eq!(first["usage"]["prompt_tokens"], pt);
    assert_eq!(
        first["usage"]["prompt_tokens_details"],
        json!({"cached_tokens": 0})
    );
    let streamed = call(
        &addr,
        "POST",
        "/v1/chat/completions",
        Some(&chat(
            &content,
            json!({"max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}}),
        )),
        &[],
    )
    .await;
    let p = payloads(&streamed.body);
    let usage: Value = serde_json::from_str(p[p.len() - 2]).unwrap();
    assert_eq!(
        usage["usage"]["prompt_tokens_details"]["cached_tokens"],
        208
    );
    let again: Value = serde_json::from_str(
        &call(
            &addr,
            "POST",
            "/v1/chat/completions",
            Some(&chat(&content, json!({"max_tokens": 2}))),
            &[],
        )
        .await
        .body,
    )
    .unwrap();
    assert_eq!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"],
        208
    );
}

#[tokio::test]
async fn prompt_tokens_details_modes() {
    for (mode, first, second) in [
        (PromptTokensDetails::Nonzero, None, Some(208)),
        (PromptTokensDetails::Off, None, None),
    ] {
        let sim = pool(SimConfig {
            prompt_tokens_details: mode,
            ..fast()
        })
        .await;
        let addr = sim.addrs()[0];
        let body = chat(
            &"a shared long prefix ".repeat(40),
            json!({"max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}}),
        );
        for expect in [first, second] {
            let r = call(&addr, "POST", "/v1/chat/completions", Some(&body), &[]).await;
            let p = payloads(&r.body);
            let usage: Value = serde_json::from_str(p[p.len() - 2]).unwrap();
            match expect {
                Some(n) => assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], n),
                // The usage-only chunk drops nulls: no key at all.
                None => assert!(
                    usage["usage"].get("prompt_tokens_details").is_none(),
                    "{mode:?}: {}",
                    p[p.len() - 2]
                ),
            }
        }
        let mut full = body.clone();
        full.as_object_mut().unwrap().remove("stream");
        let v: Value = serde_json::from_str(
            &call(&addr, "POST", "/v1/chat/completions", Some(&full), &[])
                .await
                .body,
        )
        .unwrap();
        // A full response keeps the field, null when there is nothing to report.
        let details = &v["usage"]["prompt_tokens_details"];
        match second {
            Some(n) => assert_eq!(details, &json!({"cached_tokens": n})),
            None => assert!(details.is_null() && v["usage"].get("prompt_tokens_details").is_some()),
        }
    }
}

#[tokio::test]
async fn no_usage_mode_sends_none_whatever_is_asked() {
    let sim = pool(SimConfig {
        no_usage: true,
        ..fast()
    })
    .await;
    let addr = sim.addrs()[0];
    let body = chat(
        "hello",
        json!({"stream": true, "max_tokens": 3,
               "stream_options": {"include_usage": true, "continuous_usage_stats": true}}),
    );
    let r = call(&addr, "POST", "/v1/chat/completions", Some(&body), &[]).await;
    assert!(!r.body.contains("usage"), "{}", r.body);
    assert_eq!(payloads(&r.body).len(), 5, "role, 3 tokens, [DONE]");
    let r = call(
        &addr,
        "POST",
        "/v1/chat/completions",
        Some(&chat("hello", json!({"max_tokens": 3}))),
        &[],
    )
    .await;
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert!(v.get("usage").is_none(), "{}", r.body);
    assert_eq!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .len(),
        12
    );
    // The replica still accounts what it served.
    let served = sim.served(0).unwrap();
    assert_eq!(served[0].1.completion_tokens, 6);
    assert_eq!(served[0].1.requests_completed, 2);
}
