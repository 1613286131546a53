//! Per-replica token accounting: a stream cut off by its client stops generating, and the
//! replica's /metrics counts what its responses delivered per fairness id, next to vLLM's
//! own prompt and generation counters.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{call, chat, eventually, pool, stream_then_cut};
use infergate_sim::{EngineConfig, SimConfig};
use serde_json::{json, Value};

/// The value of the one sample of `series` (name and labels exactly) on a metrics page.
fn sample(page: &str, series: &str) -> Option<u64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse::<f64>().unwrap() as u64)
}

#[tokio::test]
async fn a_cut_stream_stops_and_every_token_is_accounted() {
    // 80 ms per decode step in real time: the client reads each token as it comes, even
    // on a busy machine.
    let sim = pool(SimConfig {
        engine: EngineConfig {
            decode_base_ms: 80.0,
            ..EngineConfig::default()
        },
        ..SimConfig::default()
    })
    .await;
    let addr = sim.addrs()[0];
    let long = chat(
        &"x".repeat(400),
        json!({"stream": true, "max_tokens": 5000, "ignore_eos": true,
               "stream_options": {"include_usage": true, "continuous_usage_stats": true}}),
    );
    let got = stream_then_cut(
        &addr,
        "/v1/chat/completions",
        &long,
        &[("x-llm-d-inference-fairness-id", "tenant-a")],
        5,
    )
    .await;
    // The last usage the client saw: what a gateway would bill.
    let seen = got
        .split_terminator("\n\n")
        .filter_map(|e| serde_json::from_str::<Value>(e.strip_prefix("data: ")?).ok())
        .filter_map(|v| v["usage"]["completion_tokens"].as_u64())
        .max()
        .unwrap();
    assert_eq!(seen, 5);
    assert!(
        eventually(5, || async {
            let s = sim.stats(0).await.unwrap();
            s.running == 0 && s.counters.cancelled == 1
        })
        .await,
        "the cut request kept running"
    );
    let generated = sim.stats(0).await.unwrap().counters.generation_tokens;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        sim.stats(0).await.unwrap().counters.generation_tokens,
        generated,
        "generation stopped"
    );
    assert!(
        generated <= 5 + 4,
        "{generated} tokens generated for 5 read"
    );
    let served = sim.served(0).unwrap();
    assert_eq!(served.len(), 1);
    let (key, t) = &served[0];
    assert_eq!(
        (key.fairness_id.as_str(), key.model.as_str()),
        ("tenant-a", "sim-model")
    );
    assert_eq!((t.requests_cut_off, t.requests_completed), (1, 0));
    // Handed to the connection: what the client read, and at most the chunk or two in
    // flight when it closed; never more than was generated.
    assert!(
        (5..=8).contains(&t.cut_off_completion_tokens),
        "{t:?} for 5 read"
    );
    assert!(t.cut_off_completion_tokens <= generated);
    assert_eq!(t.completion_tokens, t.cut_off_completion_tokens);
    assert_eq!(
        t.prompt_tokens, 106,
        "424 prompt bytes: the prompt is counted"
    );

    // A completed request of another tenant, non-streamed.
    let short = chat("hello", json!({"max_tokens": 3}));
    let r = call(
        &addr,
        "POST",
        "/v1/chat/completions",
        Some(&short),
        &[("x-llm-d-inference-fairness-id", "tenant-b")],
    )
    .await;
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 3);
    let page = call(&addr, "GET", "/metrics", None, &[]).await.body;
    let lab = |tenant: &str| {
        format!("{{engine=\"0\",fairness_id=\"{tenant}\",model_name=\"sim-model\"}}")
    };
    let get = |name: &str, tenant: &str| sample(&page, &format!("{name}{}", lab(tenant)));
    assert_eq!(
        get("infergate_sim:served_prompt_tokens_total", "tenant-b"),
        Some(8)
    );
    assert_eq!(
        get("infergate_sim:served_completion_tokens_total", "tenant-b"),
        Some(3)
    );
    assert_eq!(
        get("infergate_sim:requests_completed_total", "tenant-b"),
        Some(1)
    );
    assert_eq!(
        get("infergate_sim:requests_cut_off_total", "tenant-b"),
        Some(0)
    );
    assert_eq!(
        get("infergate_sim:requests_cut_off_total", "tenant-a"),
        Some(1)
    );
    assert_eq!(
        get("infergate_sim:cut_off_completion_tokens_total", "tenant-a"),
        Some(t.cut_off_completion_tokens)
    );
    assert!(page.contains("# TYPE infergate_sim:served_prompt_tokens_total counter"));
    // vLLM's counters: every prompt that produced a token, every token generated.
    let engine = "{engine=\"0\",model_name=\"sim-model\"}";
    assert_eq!(
        sample(&page, &format!("vllm:prompt_tokens_total{engine}")),
        Some(106 + 8)
    );
    assert_eq!(
        sample(&page, &format!("vllm:generation_tokens_total{engine}")),
        Some(generated + 3)
    );
    assert_eq!(
        sample(&page, &format!("vllm:request_success_total{engine}")),
        Some(1)
    );
}

#[tokio::test]
async fn a_non_streamed_request_whose_client_leaves_is_cancelled() {
    let sim = pool(SimConfig {
        engine: EngineConfig {
            decode_base_ms: 40.0,
            ..EngineConfig::default()
        },
        ..SimConfig::default()
    })
    .await;
    let addr = sim.addrs()[0];
    let body = chat("hi", json!({"max_tokens": 5000, "ignore_eos": true}));
    let task =
        tokio::spawn(
            async move { call(&addr, "POST", "/v1/chat/completions", Some(&body), &[]).await },
        );
    assert!(eventually(5, || async { sim.stats(0).await.unwrap().running == 1 }).await);
    task.abort();
    assert!(
        eventually(5, || async {
            sim.served(0)
                .unwrap()
                .first()
                .is_some_and(|(_, t)| t.requests_cut_off == 1)
        })
        .await
    );
    let (key, t) = &sim.served(0).unwrap()[0];
    assert_eq!(key.fairness_id, "");
    assert_eq!((t.prompt_tokens, t.completion_tokens), (0, 0));
    assert_eq!(sim.stats(0).await.unwrap().running, 0);
}
