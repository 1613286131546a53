//! Deterministic mode: a response's bytes depend only on the prompt, model and length, so
//! the same request asked with forced usage on one replica and without on another is byte
//! for byte the same once usage is removed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{call, chat, payloads, pool};
use infergate_sim::SimConfig;
use serde_json::{json, Value};

fn cfg(deterministic: bool) -> SimConfig {
    SimConfig {
        replicas: 2,
        time_scale: 50.0,
        deterministic,
        ..SimConfig::default()
    }
}

/// Removes `,"usage":{…}` (one nesting level at most) from each chunk and drops the
/// usage-only chunk: what a gateway removes when the client did not ask for usage.
fn without_usage(body: &str) -> String {
    let mut out = String::new();
    for p in payloads(body) {
        if p.contains(r#""choices":[],"usage""#) {
            continue;
        }
        let chunk = match p.find(r#","usage":{"#) {
            Some(start) => {
                let rest = &p[start..];
                let mut depth = 0;
                let mut end = None;
                for (i, c) in rest.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = Some(start + i + 1);
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                format!("{}{}", &p[..start], &p[end.unwrap()..])
            }
            None => p.to_string(),
        };
        out.push_str("data: ");
        out.push_str(&chunk);
        out.push_str("\n\n");
    }
    out
}

#[tokio::test]
async fn forced_usage_minus_usage_equals_the_plain_stream() {
    let sim = pool(cfg(true)).await;
    let (a, b) = (sim.addrs()[0], sim.addrs()[1]);
    let content = "tell me about the weather ".repeat(20);
    let plain = chat(&content, json!({"stream": true, "max_tokens": 12}));
    let forced = chat(
        &content,
        json!({"stream": true, "max_tokens": 12,
               "stream_options": {"include_usage": true, "continuous_usage_stats": true}}),
    );
    let direct = call(&a, "POST", "/v1/chat/completions", Some(&plain), &[]).await;
    let through = call(&b, "POST", "/v1/chat/completions", Some(&forced), &[]).await;
    assert_ne!(direct.body, through.body, "usage was sent");
    assert_eq!(without_usage(&through.body), direct.body);
    // A second plain request (now partly cached, later in time) is the same bytes too.
    let again = call(&b, "POST", "/v1/chat/completions", Some(&plain), &[]).await;
    assert_eq!(again.body, direct.body);
    let first: Value = serde_json::from_str(payloads(&direct.body)[0]).unwrap();
    let id = first["id"].as_str().unwrap();
    let hex = id.strip_prefix("chatcmpl-").unwrap();
    assert_eq!(hex.len(), 32);
    assert!(hex.chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(
        first["created"],
        infergate_sim::config::DETERMINISTIC_CREATED
    );
    // Another prompt: another id and another text.
    let other = call(
        &a,
        "POST",
        "/v1/chat/completions",
        Some(&chat(
            "something else",
            json!({"stream": true, "max_tokens": 12}),
        )),
        &[],
    )
    .await;
    let o: Value = serde_json::from_str(payloads(&other.body)[0]).unwrap();
    assert_ne!(o["id"], first["id"]);
    assert_ne!(without_usage(&other.body), direct.body);
    // Non-streamed: the same bytes on both replicas apart from the cached-token count.
    let mut full = plain.clone();
    full.as_object_mut().unwrap().remove("stream");
    let x = call(&a, "POST", "/v1/chat/completions", Some(&full), &[]).await;
    let y = call(&b, "POST", "/v1/chat/completions", Some(&full), &[]).await;
    let strip = |s: &str| {
        let mut v: Value = serde_json::from_str(s).unwrap();
        v.as_object_mut().unwrap().remove("usage");
        v
    };
    assert_eq!(strip(&x.body), strip(&y.body));
    assert_eq!(strip(&x.body)["id"], first["id"]);
}

#[tokio::test]
async fn without_the_flag_ids_are_per_request() {
    let sim = pool(cfg(false)).await;
    let a = sim.addrs()[0];
    let body = chat("hi", json!({"stream": true, "max_tokens": 2}));
    let x = call(&a, "POST", "/v1/chat/completions", Some(&body), &[]).await;
    let y = call(&a, "POST", "/v1/chat/completions", Some(&body), &[]).await;
    let id =
        |s: &str| -> Value { serde_json::from_str::<Value>(payloads(s)[0]).unwrap()["id"].clone() };
    assert_ne!(id(&x.body), id(&y.body));
    // The text is the prompt's either way.
    let text = |s: &str| -> Vec<Value> {
        payloads(s)
            .iter()
            .filter(|p| **p != "[DONE]")
            .map(|p| serde_json::from_str::<Value>(p).unwrap()["choices"][0]["delta"].clone())
            .collect()
    };
    assert_eq!(text(&x.body), text(&y.body));
}
