//! The simulator over real sockets: response shapes (SSE chunks, usage, errors), headers,
//! metrics names, queueing when KV is full, disconnects freeing KV, and the time scale.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use infergate_harness::load::client::{self, BaseUrl, ConnPool, SseEvents};
use infergate_harness::sim::{self, EngineConfig, SimConfig, SimHandle};
use serde_json::{json, Value};
use tokio::net::TcpStream;

async fn pool(replicas: u32, engine: EngineConfig, time_scale: f64) -> SimHandle {
    sim::start(SimConfig {
        replicas,
        time_scale,
        loras: vec!["adapter-a".into()],
        engine,
        ..SimConfig::default()
    })
    .await
    .unwrap()
}

struct Reply {
    status: u16,
    headers: hyper::HeaderMap,
    body: String,
}

async fn call(base: &str, method: &str, path: &str, body: Option<Value>) -> Reply {
    let b = BaseUrl::parse(base).unwrap();
    let stream = TcpStream::connect(&b.authority).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", &b.authority)
        .body(Full::new(Bytes::from(
            body.map(|v| v.to_string()).unwrap_or_default(),
        )))
        .unwrap();
    let resp = tx.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

fn sse_payloads(body: &str) -> Vec<String> {
    let mut s = SseEvents::default();
    s.push(body.as_bytes());
    std::iter::from_fn(|| s.next_data()).collect()
}

fn chat(content: &str, extra: Value) -> Value {
    let mut v = json!({"model": "sim-model", "messages": [{"role": "user", "content": content}]});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    v
}

#[tokio::test]
async fn stream_has_role_content_finish_usage_and_done() {
    let sim = pool(2, EngineConfig::default(), 50.0).await;
    let base = &sim.base_urls()[1];
    let body = chat(
        &"x".repeat(400),
        json!({"stream": true, "max_tokens": 5, "stream_options": {"include_usage": true}}),
    );
    let r = call(base, "POST", "/v1/chat/completions", Some(body)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-infergate-replica"], "1");
    assert_eq!(
        r.headers["x-infergate-replica-addr"],
        sim.addrs()[1].to_string().as_str()
    );
    assert_eq!(r.headers["content-type"], "text/event-stream");
    let p = sse_payloads(&r.body);
    assert_eq!(p.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = p[..p.len() - 1]
        .iter()
        .map(|s| serde_json::from_str(s).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: Vec<&Value> = chunks[1..chunks.len() - 1].iter().collect();
    assert_eq!(content.len(), 5);
    for c in &content {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(
            c["choices"][0]["delta"]["content"].as_str().unwrap().len(),
            4
        );
    }
    assert!(content[..4]
        .iter()
        .all(|c| c["choices"][0]["finish_reason"].is_null()));
    assert_eq!(content[4]["choices"][0]["finish_reason"], "length");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    // "<|user|>\n" + 400 bytes + "\n" + "<|assistant|>\n" = 424 bytes = 106 tokens.
    assert_eq!(usage["usage"]["prompt_tokens"], 106);
    assert_eq!(usage["usage"]["total_tokens"], 111);
    assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

#[tokio::test]
async fn continuous_usage_and_no_usage_chunk_without_include_usage() {
    let sim = pool(1, EngineConfig::default(), 50.0).await;
    let base = &sim.base_urls()[0];
    let body = chat(
        "hello",
        json!({"stream": true, "max_tokens": 3,
               "stream_options": {"include_usage": false, "continuous_usage_stats": true}}),
    );
    let r = call(base, "POST", "/v1/chat/completions", Some(body)).await;
    let p = sse_payloads(&r.body);
    let chunks: Vec<Value> = p[..p.len() - 1]
        .iter()
        .map(|s| serde_json::from_str(s).unwrap())
        .collect();
    assert_eq!(
        chunks.len(),
        4,
        "role + 3 content chunks, no usage-only chunk"
    );
    // As vLLM: continuous_usage_stats is honoured only with include_usage.
    assert!(
        chunks.iter().all(|c| c.get("usage").is_none()),
        "{chunks:?}"
    );
}

#[tokio::test]
async fn repeated_prefix_is_cached_and_output_is_deterministic() {
    let sim = pool(1, EngineConfig::default(), 50.0).await;
    let base = &sim.base_urls()[0];
    let prompt = "the same long prefix ".repeat(100);
    let body = json!({"model": "sim-model", "prompt": prompt, "max_tokens": 8});
    let a: Value = serde_json::from_str(
        &call(base, "POST", "/v1/completions", Some(body.clone()))
            .await
            .body,
    )
    .unwrap();
    let b: Value =
        serde_json::from_str(&call(base, "POST", "/v1/completions", Some(body)).await.body)
            .unwrap();
    assert_eq!(a["object"], "text_completion");
    assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(
        cached, 512,
        "2100 bytes = 525 tokens; 32 full blocks reused"
    );
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    assert_eq!(a["choices"][0]["finish_reason"], "length");
    // Chat non-stream with an adapter: natural stop before a high max_tokens.
    let r = call(
        base,
        "POST",
        "/v1/chat/completions",
        Some(json!({"model": "adapter-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000})),
    )
    .await;
    let c: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(c["object"], "chat.completion");
    assert_eq!(c["model"], "adapter-a");
    assert_eq!(c["choices"][0]["finish_reason"], "stop");
    assert_eq!(c["usage"]["completion_tokens"], 128);
}

/// vLLM caches the blocks of generated tokens too: turn 2, which repeats turn 1's prompt and
/// its answer, finds the answer's blocks cached (the chat prompt ends with the generation
/// prompt `<|assistant|>\n`, so prompt + answer is a prefix of the next prompt).
#[tokio::test]
async fn the_next_turn_reuses_the_blocks_of_the_previous_answer() {
    let sim = pool(1, EngineConfig::default(), 50.0).await;
    let base = &sim.base_urls()[0];
    let system = "sys ".repeat(300);
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": "hi"}),
    ];
    let turn = |messages: &Vec<Value>| json!({"model": "sim-model", "messages": messages, "max_tokens": 64, "ignore_eos": true});
    let a: Value = serde_json::from_str(
        &call(base, "POST", "/v1/chat/completions", Some(turn(&messages)))
            .await
            .body,
    )
    .unwrap();
    let answer = a["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(answer.len(), 64 * 4);
    messages.push(json!({"role": "assistant", "content": answer}));
    messages.push(json!({"role": "user", "content": "more"}));
    let b: Value = serde_json::from_str(
        &call(base, "POST", "/v1/chat/completions", Some(turn(&messages)))
            .await
            .body,
    )
    .unwrap();
    // Turn 1: 11 + 1200 + 1 + 9 + 2 + 1 + 14 = 1238 bytes = 310 tokens; with its 64-token
    // answer, 373 tokens were computed: 23 full blocks = 368 tokens. The prompt alone holds
    // 19 full blocks (304 tokens).
    assert_eq!(a["usage"]["prompt_tokens"], 310);
    assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens"], 368);
}

#[tokio::test]
async fn errors_are_openai_shaped() {
    let sim = pool(1, EngineConfig::default(), 50.0).await;
    let base = &sim.base_urls()[0];
    let r = call(base, "POST", "/v1/chat/completions", None).await;
    assert_eq!(r.status, 400);
    let e: Value = serde_json::from_str(&r.body).unwrap();
    assert!(e["error"]["message"].as_str().unwrap().contains("JSON"));
    assert_eq!(e["error"]["type"], "BadRequestError");
    let r = call(
        base,
        "POST",
        "/v1/chat/completions",
        Some(json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]})),
    )
    .await;
    assert_eq!(r.status, 404);
    let e: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(e["error"]["param"], "model");
    let huge = json!({"model": "sim-model", "prompt": "x".repeat(700_000), "max_tokens": 10});
    let r = call(base, "POST", "/v1/completions", Some(huge)).await;
    assert_eq!(r.status, 400);
    assert!(r.body.contains("maximum context length"));
    // A forced answer longer than the model is refused at once (nothing that long is built).
    let endless = json!({"model": "sim-model", "prompt": "x", "max_tokens": 4_000_000_000u64, "ignore_eos": true});
    let r = call(base, "POST", "/v1/completions", Some(endless)).await;
    assert_eq!(r.status, 400);
    assert!(r.body.contains("maximum context length"), "{}", r.body);
    assert_eq!(call(base, "GET", "/nowhere", None).await.status, 404);
    assert_eq!(
        call(base, "GET", "/v1/chat/completions", None).await.status,
        405
    );
    assert_eq!(call(base, "GET", "/health", None).await.status, 200);
    let m: Value = serde_json::from_str(&call(base, "GET", "/v1/models", None).await.body).unwrap();
    let ids: Vec<&str> = m["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["sim-model", "adapter-a"]);
}

#[tokio::test]
async fn metrics_have_the_vllm_names() {
    let sim = pool(1, EngineConfig::default(), 50.0).await;
    let base = &sim.base_urls()[0];
    call(
        base,
        "POST",
        "/v1/completions",
        Some(json!({"model": "sim-model", "prompt": "abc", "max_tokens": 2})),
    )
    .await;
    let r = call(base, "GET", "/metrics", None).await;
    assert_eq!(r.status, 200);
    for name in [
        "vllm:num_requests_waiting{",
        "vllm:num_requests_running{",
        "vllm:kv_cache_usage_perc{",
        "vllm:cache_config_info{block_size=\"16\"",
        "num_gpu_blocks=\"10000\"",
        "vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"}",
        "vllm:prefix_cache_queries_total{",
        "vllm:prefix_cache_hits_total{",
        "vllm:time_to_first_token_seconds_bucket{",
        "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"sim-model\"} 1",
    ] {
        assert!(r.body.contains(name), "missing {name} in\n{}", r.body);
    }
}

#[tokio::test]
async fn full_kv_makes_requests_wait() {
    // 2000 tokens of KV; each request needs ~1250: only one runs at a time.
    let engine = EngineConfig {
        kv_capacity_tokens: 2000,
        ..EngineConfig::default()
    };
    let sim = pool(1, engine, 1.0).await;
    let base = BaseUrl::parse(&sim.base_urls()[0]).unwrap();
    let mut tasks = Vec::new();
    for i in 0..3 {
        let body = chat(
            &format!("{i}{}", "y".repeat(4800)),
            json!({"max_tokens": 40, "stream": true}),
        );
        let base = base.clone();
        tasks.push(tokio::spawn(async move {
            client::chat(
                &ConnPool::default(),
                &base,
                Bytes::from(body.to_string()),
                None,
                Duration::from_secs(30),
            )
            .await
        }));
    }
    let mut max_waiting = 0;
    for _ in 0..50 {
        max_waiting = max_waiting.max(sim.stats(0).await.unwrap().waiting);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut recs = Vec::new();
    for t in tasks {
        let rec = t.await.unwrap();
        assert!(rec.ok(), "{rec:?}");
        recs.push(rec);
    }
    assert!(max_waiting >= 1, "a request must wait for KV: {recs:?}");
    let s = sim.stats(0).await.unwrap();
    assert_eq!((s.waiting, s.running, s.free_blocks), (0, 0, s.num_blocks));
}

#[tokio::test]
async fn disconnect_mid_stream_frees_kv() {
    let sim = pool(1, EngineConfig::default(), 1.0).await;
    let b = BaseUrl::parse(&sim.base_urls()[0]).unwrap();
    let stream = TcpStream::connect(&b.authority).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let conn_task = tokio::spawn(conn);
    let body = json!({"model": "sim-model", "prompt": "z".repeat(8000), "max_tokens": 5000,
                      "ignore_eos": true, "stream": true});
    let req = Request::post("/v1/completions")
        .header("host", &b.authority)
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = tx.send_request(req).await.unwrap();
    let mut body = resp.into_body();
    // Read until some content arrived.
    let mut got = 0;
    while got < 3 {
        let f = body.frame().await.unwrap().unwrap();
        if f.is_data() {
            got += 1;
        }
    }
    let s = sim.stats(0).await.unwrap();
    assert_eq!(s.running, 1);
    assert!(s.free_blocks < s.num_blocks);
    drop(body);
    drop(tx);
    conn_task.abort();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = sim.stats(0).await.unwrap();
        if s.running == 0 && s.free_blocks == s.num_blocks {
            assert_eq!(s.counters.cancelled, 1);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "KV not freed after disconnect: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn time_scale_speeds_up_the_clock() {
    // 16 000 uncached prompt tokens at 16k tok/s: 1 s simulated, 0.1 s at scale 10.
    let sim = pool(1, EngineConfig::default(), 10.0).await;
    let b = BaseUrl::parse(&sim.base_urls()[0]).unwrap();
    let body = json!({"model": "sim-model", "messages": [{"role": "user", "content": "q".repeat(63_980)}],
                      "max_tokens": 1, "stream": true});
    let rec = client::chat(
        &ConnPool::default(),
        &b,
        Bytes::from(body.to_string()),
        None,
        Duration::from_secs(10),
    )
    .await;
    assert!(rec.ok(), "{rec:?}");
    let ttft = rec.ttft_s.unwrap();
    assert!((0.09..0.6).contains(&ttft), "TTFT {ttft} s");
}
