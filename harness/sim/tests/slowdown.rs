//! `/sim/slowdown`: one replica made slow at run time and restored, seen from outside as
//! its time to first streamed chunk, while the other replica keeps its speed; and the
//! refusals of bad queries. Timings are compared as ratios with wide margins (the slowed
//! figures are 20 times the normal ones, the assertions ask for 5).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{call, chat, pool, time_to_first_chunk};
use infergate_sim::{SimConfig, Slowdown};
use serde_json::{json, Value};

fn cfg() -> SimConfig {
    SimConfig {
        replicas: 2,
        time_scale: 1.0,
        ..SimConfig::default()
    }
}

/// A chat prompt of about 1 200 tokens (75 ms of prefill at the default 16 000 tok/s),
/// which no other prompt of these tests shares a first block with.
fn prompt(tag: &str) -> Value {
    let content = format!("{tag}: {}", "lorem ipsum dolor sit amet ".repeat(178));
    chat(&content, json!({"stream": true, "max_tokens": 1}))
}

/// Time to the first SSE chunk of a streamed chat request on `addr`.
async fn ttft(addr: &SocketAddr, tag: &str) -> Duration {
    let (elapsed, first) = time_to_first_chunk(addr, "/v1/chat/completions", &prompt(tag)).await;
    assert!(first.starts_with("data: "), "not an SSE chunk: {first:?}");
    elapsed
}

/// The better of two measurements with fresh prompts: noise only ever adds time.
async fn best_ttft(addr: &SocketAddr, tag: &str) -> Duration {
    let a = ttft(addr, &format!("{tag} a")).await;
    let b = ttft(addr, &format!("{tag} b")).await;
    a.min(b)
}

async fn control(addr: &SocketAddr, method: &str, path: &str) -> (u16, Value) {
    let r = call(addr, method, path, None, &[]).await;
    (r.status, serde_json::from_str(&r.body).unwrap())
}

#[tokio::test]
async fn a_slowed_replica_answers_its_first_token_later_until_restored() {
    let sim = pool(cfg()).await;
    let (r0, r1) = (sim.addrs()[0], sim.addrs()[1]);
    // Warm both replicas' connections and tasks up.
    ttft(&r0, "warm-up").await;
    ttft(&r1, "warm-up").await;
    let before = best_ttft(&r1, "before").await;

    let (status, set) = control(&r1, "POST", "/sim/slowdown?factor=20").await;
    assert_eq!(status, 200, "{set}");
    assert_eq!(set, json!({"factor": 20.0, "delay_ms": 0.0}));
    assert_eq!(
        control(&r1, "GET", "/sim/slowdown").await,
        (200, json!({"factor": 20.0, "delay_ms": 0.0}))
    );
    assert_eq!(
        control(&r0, "GET", "/sim/slowdown").await,
        (200, json!({"factor": 1.0, "delay_ms": 0.0})),
        "only replica 1 is slowed"
    );
    assert_eq!(sim.slowdown(1).await.unwrap().factor(), 20.0);

    let slow = ttft(&r1, "slow").await;
    // 20 × 75 ms of prefill; simulated steps never end early in wall time.
    assert!(slow >= Duration::from_millis(1200), "slowed TTFT {slow:?}");
    assert!(
        slow > before * 5,
        "slowed TTFT {slow:?} is not well above {before:?}"
    );
    let other = best_ttft(&r0, "other").await;
    assert!(
        other * 5 < slow,
        "replica 0 ({other:?}) is slowed with replica 1 ({slow:?})"
    );

    let (status, restored) = control(&r1, "POST", "/sim/slowdown?factor=1").await;
    assert_eq!(status, 200, "{restored}");
    assert_eq!(restored, json!({"factor": 1.0, "delay_ms": 0.0}));
    let after = best_ttft(&r1, "after").await;
    assert!(
        after * 5 < slow,
        "replica 1 did not recover: {after:?} after, {slow:?} slowed"
    );
}

#[tokio::test]
async fn a_prefill_delay_slows_a_cached_prompt_on_an_idle_replica() {
    let sim = pool(cfg()).await;
    let r1 = sim.addrs()[1];
    // The conversation's prefix is cached on replica 1: its prefill is nearly free.
    ttft(&r1, "conversation").await;
    let cached = ttft(&r1, "conversation").await;

    let (status, set) = control(&r1, "POST", "/sim/slowdown?delay_ms=600").await;
    assert_eq!(status, 200, "{set}");
    assert_eq!(set, json!({"factor": 1.0, "delay_ms": 600.0}));
    let delayed = ttft(&r1, "conversation").await;
    assert!(
        delayed >= Duration::from_millis(600),
        "delayed TTFT {delayed:?}"
    );
    assert!(
        delayed > cached * 5,
        "delayed {delayed:?}, cached {cached:?}"
    );

    // `factor=1` alone restores everything: an absent parameter is neutral.
    sim.set_slowdown(1, Slowdown::new(1.0, 600.0).unwrap())
        .await
        .unwrap();
    let (_, restored) = control(&r1, "POST", "/sim/slowdown?factor=1").await;
    assert_eq!(restored, json!({"factor": 1.0, "delay_ms": 0.0}));
    let a = ttft(&r1, "conversation").await;
    let b = ttft(&r1, "conversation").await;
    assert!(a.min(b) * 5 < delayed, "not restored: {a:?}, {b:?}");
}

#[tokio::test]
async fn bad_slowdown_queries_answer_400_and_change_nothing() {
    let sim = pool(cfg()).await;
    let r0 = sim.addrs()[0];
    let (status, _) = control(&r0, "POST", "/sim/slowdown?factor=3").await;
    assert_eq!(status, 200);
    for (query, param) in [
        ("", json!("factor")),
        ("?", json!("factor")),
        ("?factor", json!("factor")),
        ("?factor=", json!("factor")),
        ("?factor=fast", json!("factor")),
        ("?factor=NaN", json!("factor")),
        ("?factor=inf", json!("factor")),
        ("?factor=0.99", json!("factor")),
        ("?factor=1001", json!("factor")),
        ("?factor=2&factor=4", json!("factor")),
        ("?speed=2", Value::Null),
        ("?delay_ms=-5", json!("delay_ms")),
        ("?delay_ms=60001", json!("delay_ms")),
        ("?factor=2&delay_ms=later", json!("delay_ms")),
    ] {
        let (status, body) = control(&r0, "POST", &format!("/sim/slowdown{query}")).await;
        assert_eq!(status, 400, "{query:?}: {body}");
        let err = &body["error"];
        assert_eq!(err["type"], "BadRequestError", "{query:?}: {body}");
        assert_eq!(err["code"], 400, "{query:?}: {body}");
        assert_eq!(err["param"], param, "{query:?}: {body}");
        assert!(err["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    assert_eq!(
        control(&r0, "GET", "/sim/slowdown").await,
        (200, json!({"factor": 3.0, "delay_ms": 0.0})),
        "a refused query changed the slowdown"
    );
    let (status, body) = control(&r0, "PUT", "/sim/slowdown?factor=2").await;
    assert_eq!(status, 405, "{body}");
}
