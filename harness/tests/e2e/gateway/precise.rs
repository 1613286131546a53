//! The precise prefix index through the real Envoy (native flavour, at the suite's worker
//! count): the simulator publishes vLLM's KV events from its real cache over ZMQ, the
//! module's subscriber thread feeds one index per Envoy process, and the picker follows it.
//!
//! The pool's config has no placement scorer and no speculative entries (TTL 0), so a
//! conversation's second turn can only find its first turn's replica through the engine's
//! own events. Then the faults: a replica whose cache is reset publishes
//! `AllBlocksCleared` and the index forgets it; a replica whose events are lost (the
//! simulator drops a message, so the next one skips a sequence number) is marked stale and
//! forgotten; every request is still answered. The Wasm flavour refuses the producer.
//!
//! The Hugging Face tokenizer loads inside Envoy (the tiny model of `testdata/tokenizer`):
//! requests are keyed by its tokens (a second turn finds the first turn's speculative
//! entry, written under those keys), none fails to tokenize, and a directory without a
//! `tokenizer.json` is refused at config time.

use super::tag;
use crate::support::gw::{self, Plan};
use infergate_harness::launch::client::post_json;
use infergate_harness::launch::stats::Stats;
use infergate_harness::launch::{Flavor, PoolSpec, Stack};
use infergate_harness::sim::{self, EngineConfig, SimConfig, SimHandle, REPLICA_ADDR_HEADER};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;

const MODEL: &str = "precise-model";

/// The simulator's KV events at each replica's HTTP port + this.
const EVENTS_OFFSET: u16 = 1000;

/// Replicas of the pool.
const REPLICAS: u32 = 4;

/// Time for an engine's events to reach the index (loopback, one thread).
const SETTLE: Duration = Duration::from_millis(400);

for_each_flavour!(
    the_wasm_flavour_refuses_the_precise_producer;
    native_only: picks_follow_the_engines_kv_events, the_hugging_face_tokenizer_keys_requests;
    wasm_ignored:
);

fn epp_config() -> Value {
    json!({
        "plugins": [
            {"type": "precise-prefix-cache-producer", "parameters": {
                "kvEventsPortOffset": EVENTS_OFFSET, "speculativeTtlMs": 0}},
            {"type": "prefix-cache-scorer"},
            {"type": "inflight-load-scorer"},
            {"type": "max-score-picker"}
        ],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "prefix-cache-scorer", "weight": 3},
            {"pluginRef": "inflight-load-scorer", "weight": 1},
            {"pluginRef": "max-score-picker"}
        ]}]
    })
}

async fn simulator() -> SimHandle {
    sim::start(SimConfig {
        replicas: REPLICAS,
        models: vec![MODEL.into()],
        time_scale: 4.0,
        engine: EngineConfig {
            kv_capacity_tokens: 200_000,
            ..EngineConfig::default()
        },
        kv_events_port_offset: Some(EVENTS_OFFSET),
        ..SimConfig::default()
    })
    .await
    .unwrap()
}

fn pool() -> PoolSpec {
    let mut pool = PoolSpec::all(MODEL);
    pool.picker_config = epp_config();
    pool
}

/// The pool with the precise producer on the Hugging Face tokenizer in `dir`, and its
/// speculative entries on.
fn hf_pool(dir: &str) -> PoolSpec {
    let mut pool = pool();
    pool.picker_config["plugins"][0]["parameters"] = json!({
        "kvEventsPortOffset": EVENTS_OFFSET,
        "speculativeTtlMs": 60_000,
        "tokenizer": {"type": "huggingface", "path": dir},
    });
    pool
}

/// Conversation `id`'s messages: a ~1,500-token system prompt of its own and `turns`
/// user questions.
fn conversation(id: usize, turns: usize) -> Value {
    let system = format!("conversation {id}: ") + &"the assistant answers briefly. ".repeat(200);
    let mut messages = vec![json!({"role": "system", "content": system})];
    for t in 0..turns {
        messages.push(json!({"role": "user", "content": format!("question {t} of {id}")}));
    }
    json!({"model": MODEL, "max_tokens": 4, "messages": messages})
}

/// What one request through the gateway did.
struct Turn {
    replica: SocketAddr,
    cached_tokens: u64,
    /// The picker's matched prefix blocks for this request (its stat's delta).
    matched_blocks: i64,
}

/// The precise index's gauges, for failure messages.
fn precise_stats(s: &Stats) -> String {
    s.iter()
        .filter(|(name, _)| name.contains("infergate.precise"))
        .map(|(name, v)| format!("{name}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

async fn stats(stack: &Stack) -> Stats {
    stack.envoy().stats().await.unwrap()
}

async fn send(stack: &Stack, body: &Value) -> Turn {
    let before = stats(stack)
        .await
        .sum_containing("infergate.picker.prefix_matched_blocks");
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let resp = post_json(&url, body, &[]).await.unwrap();
    assert_eq!(resp.status, 200, "{}", resp.text());
    let replica: SocketAddr = resp.header(REPLICA_ADDR_HEADER).unwrap().parse().unwrap();
    let json: Value = serde_json::from_slice(&resp.body).unwrap();
    let cached_tokens = json["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    let after = stats(stack)
        .await
        .sum_containing("infergate.picker.prefix_matched_blocks");
    Turn {
        replica,
        cached_tokens,
        matched_blocks: after - before,
    }
}

/// A request sent straight to `replica`, past the gateway (its engine caches the prompt
/// and publishes the blocks).
async fn direct(replica: SocketAddr, body: &Value) {
    let url = format!("http://{replica}/v1/chat/completions");
    let resp = post_json(&url, body, &[]).await.unwrap();
    assert_eq!(resp.status, 200, "{}", resp.text());
}

fn index_of(sim: &SimHandle, replica: SocketAddr) -> usize {
    sim.addrs().iter().position(|a| *a == replica).unwrap()
}

async fn picks_follow_the_engines_kv_events(flavor: Flavor) {
    let sim = simulator().await;
    let Some(stack) = gw::start_over(flavor, sim.addrs().to_vec(), Plan::new(vec![pool()])).await
    else {
        return;
    };
    let t = format!("{} x{}", tag(flavor), crate::support::workers());
    // The subscriber polls its targets every second; a PUB socket drops what it sends before
    // a subscriber joins (ZMQ's slow joiner), so let every replica's stream connect first.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // Turn 1 of six conversations, then (once the events are in) turn 2 of each.
    let mut first = Vec::new();
    for id in 0..6 {
        first.push(send(&stack, &conversation(id, 1)).await.replica);
    }
    tokio::time::sleep(SETTLE).await;
    for (id, replica) in first.iter().enumerate() {
        let turn = send(&stack, &conversation(id, 2)).await;
        assert_eq!(
            turn.replica,
            *replica,
            "{t}: conversation {id}'s turn 2 must follow its engine's blocks ({} matched); {}",
            turn.matched_blocks,
            precise_stats(&stats(&stack).await)
        );
        // ~1,500 tokens of system prompt in 16-token blocks.
        assert!(
            turn.matched_blocks >= 80,
            "{t}: conversation {id}: {} blocks matched",
            turn.matched_blocks
        );
        assert!(
            turn.cached_tokens >= 1_280,
            "{t}: {} cached",
            turn.cached_tokens
        );
    }
    let s = stats(&stack).await;
    assert!(
        s.sum_containing("kind.block_stored") > 0,
        "{t}: no BlockStored counted"
    );
    assert!(s.sum_containing("infergate.precise.blocks") > 0, "{t}");

    // A replica restarts (its cache is reset): AllBlocksCleared, and the index forgets it.
    let reset = first[0];
    sim.reset_prefix_cache(index_of(&sim, reset)).await.unwrap();
    tokio::time::sleep(SETTLE).await;
    let turn = send(&stack, &conversation(0, 3)).await;
    assert_eq!(
        turn.matched_blocks, 0,
        "{t}: the reset replica's blocks must be forgotten"
    );
    assert_eq!(
        turn.cached_tokens, 0,
        "{t}: the engine holds nothing either"
    );
    assert!(
        stats(&stack)
            .await
            .sum_containing("kind.all_blocks_cleared")
            >= 1,
        "{t}"
    );

    // Events are lost: the next message skips a sequence number, the subscriber marks the
    // replica stale, and what it was known to hold is forgotten.
    let (id, lossy) = first
        .iter()
        .enumerate()
        .skip(1)
        .find(|(_, r)| **r != reset)
        .map(|(id, r)| (id, *r))
        .unwrap();
    let control = sim.kv_events(index_of(&sim, lossy)).unwrap().unwrap();
    let stale_before = stats(&stack)
        .await
        .sum_containing("infergate.precise.stale");
    control.drop_next(1);
    direct(lossy, &conversation(100, 1)).await;
    tokio::time::sleep(SETTLE).await;
    direct(lossy, &conversation(101, 1)).await;
    tokio::time::sleep(SETTLE).await;
    assert!(control.stats().dropped_messages >= 1, "{t}");
    let turn = send(&stack, &conversation(id, 3)).await;
    assert_eq!(
        turn.matched_blocks, 0,
        "{t}: a replica whose events were lost must be unknown until new events say"
    );
    assert!(
        stats(&stack)
            .await
            .sum_containing("infergate.precise.stale")
            > stale_before,
        "{t}: the gap must mark the replica stale"
    );
    // Its new events count again: a conversation sent straight to it is found there.
    direct(lossy, &conversation(200, 1)).await;
    tokio::time::sleep(SETTLE).await;
    let turn = send(&stack, &conversation(200, 2)).await;
    assert_eq!(turn.replica, lossy, "{t}: events after the gap count");
    assert!(turn.matched_blocks >= 80, "{t}: {}", turn.matched_blocks);
    drop(stack);
    sim.shutdown().await;
}

async fn the_wasm_flavour_refuses_the_precise_producer(flavor: Flavor) {
    if flavor != Flavor::Wasm || crate::support::unbuilt(flavor) {
        return;
    }
    let sim = simulator().await;
    let pools = vec![pool()];
    let addrs = sim.addrs().to_vec();
    let started = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::spawn(async move { gw::try_start_over(flavor, addrs, Plan::new(pools)).await }),
    )
    .await;
    sim.shutdown().await;
    let outcome = started.unwrap().unwrap();
    let Err(err) = outcome else {
        panic!("the Wasm gateway must refuse the config");
    };
    let err = format!("{err:#}");
    assert!(
        err.contains("precise-prefix-cache-producer needs the native flavour"),
        "the refusal must say why: {err}"
    );
}

async fn the_hugging_face_tokenizer_keys_requests(flavor: Flavor) {
    let tiny = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tokenizer/tiny");
    let sim = simulator().await;
    let Some(stack) =
        gw::start_over(flavor, sim.addrs().to_vec(), Plan::new(vec![hf_pool(tiny)])).await
    else {
        return;
    };
    let t = format!("{} x{}", tag(flavor), crate::support::workers());
    let first = send(&stack, &conversation(7, 1)).await;
    let second = send(&stack, &conversation(7, 2)).await;
    let s = stats(&stack).await;
    assert_eq!(
        second.replica,
        first.replica,
        "{t}: turn 2 must find turn 1's speculative entry; {}",
        precise_stats(&s)
    );
    // ~6,000 bytes of system prompt: the tiny BPE gives a few thousand tokens, well over
    // ten 16-token blocks.
    assert!(
        second.matched_blocks >= 10,
        "{t}: {} blocks matched; {}",
        second.matched_blocks,
        precise_stats(&s)
    );
    assert_eq!(
        s.sum_containing("infergate.precise.tokenize_errors"),
        0,
        "{t}: {}",
        precise_stats(&s)
    );
    // A user role the tiny template refuses: answered, scheduled without precise keys,
    // counted.
    let mut refused = conversation(8, 1);
    refused["messages"][1]["role"] = json!("robot");
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let resp = post_json(&url, &refused, &[]).await.unwrap();
    assert_eq!(resp.status, 200, "{t}: {}", resp.text());
    let s = stats(&stack).await;
    assert_eq!(
        s.sum_containing("infergate.precise.tokenize_errors"),
        1,
        "{t}: {}",
        precise_stats(&s)
    );
    drop(stack);

    let addrs = sim.addrs().to_vec();
    let outcome = gw::try_start_over(flavor, addrs, Plan::new(vec![hf_pool("/nonexistent")])).await;
    sim.shutdown().await;
    let Err(err) = outcome else {
        panic!("{t}: a tokenizer directory without tokenizer.json must be refused");
    };
    let err = format!("{err:#}");
    assert!(err.contains("/nonexistent/tokenizer.json"), "{t}: {err}");
}
