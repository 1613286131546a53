//! Several choices per request over real sockets, as vLLM answers them: `n` choices of one
//! chat prompt, and a `/v1/completions` batch of prompts (strings or token-id lists), each
//! with `n` choices indexed prompt by prompt; the usage counts every prompt once and every
//! choice's completion tokens, streamed and not, and the served ledger says the same.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;

use common::{call, chat, payloads, pool};
use infergate_sim::SimConfig;
use serde_json::{json, Value};

fn fast() -> SimConfig {
    SimConfig {
        time_scale: 50.0,
        deterministic: true,
        ..SimConfig::default()
    }
}

/// "<|user|>\n" + content + "\n" + "<|assistant|>\n": 24 bytes around the content.
fn chat_prompt_tokens(content: &str) -> u64 {
    (24 + content.len() as u64).div_ceil(4)
}

async fn post(sim: &infergate_sim::SimHandle, path: &str, body: &Value) -> String {
    let r = call(&sim.addrs()[0], "POST", path, Some(body), &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

/// Each choice's text and finish reason, by index, from a streamed body; and its usage chunk.
fn streamed_choices(body: &str) -> (BTreeMap<u64, (String, Option<String>)>, Value) {
    let mut choices: BTreeMap<u64, (String, Option<String>)> = BTreeMap::new();
    let mut usage = Value::Null;
    let p = payloads(body);
    assert_eq!(*p.last().unwrap(), "[DONE]");
    for chunk in &p[..p.len() - 1] {
        let v: Value = serde_json::from_str(chunk).unwrap();
        let list = v["choices"].as_array().unwrap();
        if list.is_empty() {
            usage = v["usage"].clone();
            continue;
        }
        assert_eq!(list.len(), 1, "one choice per chunk: {chunk}");
        let c = &list[0];
        let entry = choices.entry(c["index"].as_u64().unwrap()).or_default();
        let text = c["delta"]["content"].as_str().or(c["text"].as_str());
        entry.0.push_str(text.unwrap_or_default());
        if let Some(f) = c["finish_reason"].as_str() {
            assert!(entry.1.is_none(), "finished twice: {chunk}");
            entry.1 = Some(f.to_owned());
        }
    }
    (choices, usage)
}

#[tokio::test]
async fn chat_n_answers_n_choices_and_counts_every_completion_token() {
    let sim = pool(fast()).await;
    let pt = chat_prompt_tokens("hello");
    let body = chat("hello", json!({"n": 3, "max_tokens": 4}));
    let v: Value = serde_json::from_str(&post(&sim, "/v1/chat/completions", &body).await).unwrap();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{v}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i as u64);
        assert_eq!(c["finish_reason"], "length");
        assert_eq!(c["message"]["content"].as_str().unwrap().len(), 16, "{c}");
    }
    assert_ne!(
        choices[0]["message"]["content"], choices[1]["message"]["content"],
        "each choice draws its own text"
    );
    assert_eq!(v["usage"]["prompt_tokens"], pt, "the prompt counts once");
    assert_eq!(v["usage"]["completion_tokens"], 12);
    assert_eq!(v["usage"]["total_tokens"], pt + 12);
    // Choice 0 is what the same request with one choice answers.
    let one: Value = serde_json::from_str(
        &post(
            &sim,
            "/v1/chat/completions",
            &chat("hello", json!({"max_tokens": 4})),
        )
        .await,
    )
    .unwrap();
    assert_eq!(
        one["choices"][0]["message"]["content"],
        choices[0]["message"]["content"]
    );

    // Streamed: a role chunk per choice first, then each choice's tokens, then the usage.
    let body = chat(
        "hello",
        json!({"n": 3, "max_tokens": 4, "stream": true,
               "stream_options": {"include_usage": true}}),
    );
    let text = post(&sim, "/v1/chat/completions", &body).await;
    let p = payloads(&text);
    assert_eq!(p.len(), 3 + 12 + 1 + 1, "{text}");
    for (i, role) in p[..3].iter().enumerate() {
        let v: Value = serde_json::from_str(role).unwrap();
        assert_eq!(v["choices"][0]["index"], i as u64);
        assert_eq!(v["choices"][0]["delta"]["role"], "assistant");
    }
    let (streamed, usage) = streamed_choices(&text);
    assert_eq!(streamed.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        let (text, finish) = &streamed[&(i as u64)];
        assert_eq!(text, c["message"]["content"].as_str().unwrap());
        assert_eq!(finish.as_deref(), Some("length"));
    }
    assert_eq!(usage["prompt_tokens"], pt);
    assert_eq!(usage["completion_tokens"], 12);
}

#[tokio::test]
async fn a_completions_batch_answers_each_prompt_n_times() {
    let sim = pool(fast()).await;
    // Two prompts of 2 tokens each (8 bytes), n = 2, 3 tokens each: 4 choices.
    for prompt in [json!(["abcdefgh", "ijklmnop"]), json!([[1, 2], [3, 4]])] {
        let body = json!({"model": "sim-model", "prompt": prompt, "n": 2, "max_tokens": 3});
        let v: Value = serde_json::from_str(&post(&sim, "/v1/completions", &body).await).unwrap();
        let choices = v["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 4, "{v}");
        for (i, c) in choices.iter().enumerate() {
            assert_eq!(c["index"], i as u64);
            assert_eq!(c["text"].as_str().unwrap().len(), 12);
        }
        assert_eq!(v["usage"]["prompt_tokens"], 4, "each prompt once");
        assert_eq!(v["usage"]["completion_tokens"], 12);

        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({"include_usage": true});
        let text = post(&sim, "/v1/completions", &streamed).await;
        let (got, usage) = streamed_choices(&text);
        assert_eq!(got.len(), 4);
        for (i, c) in choices.iter().enumerate() {
            assert_eq!(got[&(i as u64)].0, c["text"].as_str().unwrap());
        }
        assert_eq!(usage["prompt_tokens"], 4);
        assert_eq!(usage["completion_tokens"], 12);
    }
    // The first choice of each prompt is what that prompt alone answers.
    let alone = |p: &str| json!({"model": "sim-model", "prompt": p, "max_tokens": 3});
    let batch: Value = serde_json::from_str(
        &post(
            &sim,
            "/v1/completions",
            &json!({"model": "sim-model", "prompt": ["abcdefgh", "ijklmnop"], "n": 2,
                    "max_tokens": 3}),
        )
        .await,
    )
    .unwrap();
    for (prompt, index) in [("abcdefgh", 0), ("ijklmnop", 2)] {
        let v: Value =
            serde_json::from_str(&post(&sim, "/v1/completions", &alone(prompt)).await).unwrap();
        assert_eq!(batch["choices"][index]["text"], v["choices"][0]["text"]);
    }
}

#[tokio::test]
async fn the_served_ledger_counts_what_the_usage_reports() {
    let sim = pool(fast()).await;
    let body = json!({"model": "sim-model", "prompt": ["abcdefgh", "ijkl", "mnopqrst"],
                      "n": 2, "max_tokens": 5});
    let v: Value = serde_json::from_str(&post(&sim, "/v1/completions", &body).await).unwrap();
    let usage = &v["usage"];
    assert_eq!(usage["prompt_tokens"], 2 + 1 + 2);
    assert_eq!(usage["completion_tokens"], 3 * 2 * 5);
    let served = sim.served(0).unwrap();
    assert_eq!(served.len(), 1);
    let totals = &served[0].1;
    assert_eq!(totals.prompt_tokens, 5);
    assert_eq!(totals.completion_tokens, 30);
    assert_eq!(totals.requests_completed, 1);
}

#[tokio::test]
async fn unsupported_multiplicity_is_a_400_naming_the_param() {
    let sim = pool(fast()).await;
    let addr = sim.addrs()[0];
    for (body, param) in [
        (chat("x", json!({"n": 0})), "n"),
        (chat("x", json!({"best_of": 2})), "best_of"),
        (chat("x", json!({"n": 1025})), "n"),
    ] {
        let r = call(&addr, "POST", "/v1/chat/completions", Some(&body), &[]).await;
        assert_eq!(r.status, 400, "{body}");
        let v: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["error"]["param"], param, "{body}");
    }
    let batch = json!({"model": "sim-model", "prompt": ["a", 1]});
    let r = call(&addr, "POST", "/v1/completions", Some(&batch), &[]).await;
    assert_eq!(r.status, 400);
}
