//! The decode replica as its own prefill sidecar: a request naming a prefiller is
//! prefilled there over HTTP (that replica's engine computes the prompt), the KV transfer is
//! charged, and the decode replica computes only the last partial block; the response
//! headers say who did what.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use infergate_sim::disagg::{
    DECODED_BY_HEADER, KV_TRANSFER_MS_HEADER, PREFILLED_BY_HEADER, PREFILLER_HEADER,
    PREFILL_FAILED_HEADER,
};
use infergate_sim::{EngineConfig, SimConfig};
use serde_json::{json, Value};
use tokio::net::TcpStream;

use common::{chat, pool};

/// One non-streamed request: status, response headers, wall time.
async fn post(
    addr: &SocketAddr,
    body: &Value,
    headers: &[(&str, &str)],
) -> (u16, hyper::HeaderMap, Duration) {
    let started = Instant::now();
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::post("/v1/chat/completions").header("host", addr.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let resp = tx.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    resp.into_body().collect().await.unwrap();
    (status, headers, started.elapsed())
}

fn header<'h>(h: &'h hyper::HeaderMap, name: &str) -> &'h str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// Two replicas whose prefill is slow enough to measure (4,000 tokens/s).
fn cfg() -> SimConfig {
    SimConfig {
        replicas: 2,
        engine: EngineConfig {
            prefill_tokens_per_s: 4_000.0,
            ..EngineConfig::default()
        },
        kv_transfer_ms_per_1k_tokens: 50.0,
        kv_transfer_base_ms: 0.0,
        ..SimConfig::default()
    }
}

#[tokio::test]
async fn a_named_prefiller_computes_the_prompt_and_the_decoder_only_decodes() {
    let sim = pool(cfg()).await;
    let (decode, prefill) = (sim.addrs()[0], sim.addrs()[1]);
    // 8,000 bytes: 2,000 prompt tokens (and the chat template's few), 125 full blocks.
    let body = chat(&"long prompt ".repeat(667), json!({"max_tokens": 4}));
    let prefill_at = prefill.to_string();
    let (status, h, took) = post(&decode, &body, &[(PREFILLER_HEADER, &prefill_at)]).await;
    assert_eq!(status, 200);
    assert_eq!(header(&h, PREFILLED_BY_HEADER), prefill_at);
    assert_eq!(header(&h, DECODED_BY_HEADER), decode.to_string());
    let transfer: f64 = header(&h, KV_TRANSFER_MS_HEADER).parse().unwrap();
    assert!((100.0..102.0).contains(&transfer), "transfer {transfer} ms");
    // The prefill replica computed the prompt (one request, one token, nothing cached).
    let p = sim.stats(1).await.unwrap();
    assert_eq!(p.counters.finished, 1);
    assert_eq!(p.counters.generation_tokens, 1);
    assert_eq!(p.counters.prefix_hits_tokens, 0);
    assert!(p.counters.prompt_tokens >= 2_000);
    // The decode replica found all but the last partial block cached.
    let d = sim.stats(0).await.unwrap();
    let full_blocks = d.counters.prompt_tokens / 16 * 16;
    assert_eq!(d.counters.prefix_hits_tokens, full_blocks);
    assert_eq!(d.counters.generation_tokens, 4);
    // Honest time: ~0.5 s of prefill on the other replica plus 0.1 s of transfer.
    assert!(took >= Duration::from_millis(600), "took {took:?}");

    // Aggregated, for comparison: the same replica names itself for both phases.
    let other = chat(&"other prompt ".repeat(616), json!({"max_tokens": 4}));
    let (status, h, _) = post(&decode, &other, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(header(&h, PREFILLED_BY_HEADER), decode.to_string());
    assert_eq!(header(&h, DECODED_BY_HEADER), decode.to_string());
    assert_eq!(header(&h, KV_TRANSFER_MS_HEADER), "");
}

#[tokio::test]
async fn an_unreachable_prefiller_means_a_local_prefill_and_says_so() {
    let sim = pool(cfg()).await;
    let decode = sim.addrs()[0];
    // A port nobody listens on (bound, then released).
    let gone = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let body = chat(&"x".repeat(2_000), json!({"max_tokens": 2}));
    let (status, h, _) = post(&decode, &body, &[(PREFILLER_HEADER, &gone)]).await;
    assert_eq!(status, 200);
    assert_eq!(header(&h, PREFILLED_BY_HEADER), decode.to_string());
    assert!(
        header(&h, PREFILL_FAILED_HEADER).starts_with(&gone),
        "{h:?}"
    );
    let d = sim.stats(0).await.unwrap();
    assert_eq!(d.counters.prefix_hits_tokens, 0, "nothing was imported");
}
