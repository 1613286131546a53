//! KV events over a real ZMQ socket: a `zeromq` SUB follows one replica's PUB and checks
//! the wire (three frames, topic, big-endian sequence numbers, vLLM's msgpack read by the
//! gateway's decoder), stores whose token ids and hashes are the request's, removals under
//! cache pressure, a clear on reset, a sequence gap when messages are dropped, and a pause.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{call, chat, pool};
use infergate_sim::engine::EngineConfig;
use infergate_sim::prompt::{block_hashes, model_seed};
use infergate_sim::{SimConfig, SimHandle};
use scheduler_core::kv_events::{decode_batch, EngineBlockHash, KvEvent, KvEventBatch};
use serde_json::{json, Value};
use zeromq::{Socket, SocketRecv, SubSocket};

struct Msg {
    topic: String,
    seq: u64,
    batch: KvEventBatch,
}

async fn next(sub: &mut SubSocket, wait: Duration) -> Option<Msg> {
    let m = tokio::time::timeout(wait, sub.recv()).await.ok()?.unwrap();
    assert_eq!(m.len(), 3, "three frames");
    let topic = String::from_utf8(m.get(0).unwrap().to_vec()).unwrap();
    let seq = u64::from_be_bytes(m.get(1).unwrap().as_ref().try_into().unwrap());
    let batch = decode_batch(m.get(2).unwrap()).unwrap();
    Some(Msg { topic, seq, batch })
}

async fn post(sim: &SimHandle, path: &str, body: Option<&Value>) -> Value {
    let r = call(&sim.addrs()[0], "POST", path, body, &[]).await;
    assert_eq!(r.status, 200, "{path}: {}", r.body);
    serde_json::from_str(&r.body).unwrap()
}

fn is_cleared(m: &Msg) -> bool {
    m.batch.events.contains(&KvEvent::AllBlocksCleared)
}

/// A subscriber connected and known to the publisher: resets until one's clear arrives
/// (PUB drops what it sends before the subscription lands). Returns the last sequence.
async fn subscribed(sim: &SimHandle) -> (SubSocket, u64) {
    let ep = sim.kv_events_endpoints()[0].clone().unwrap();
    let mut sub = SubSocket::new();
    sub.connect(&ep).await.unwrap();
    sub.subscribe("kv@").await.unwrap();
    for _ in 0..100 {
        post(sim, "/reset_prefix_cache", None).await;
        if let Some(m) = next(&mut sub, Duration::from_millis(100)).await {
            if is_cleared(&m) {
                return (sub, m.seq);
            }
        }
    }
    panic!("no subscription after 100 tries");
}

fn sim_config(kv_blocks: u32) -> SimConfig {
    SimConfig {
        time_scale: 50.0,
        kv_events_port_offset: Some(1),
        engine: EngineConfig {
            kv_capacity_tokens: kv_blocks * 16,
            ..EngineConfig::default()
        },
        ..SimConfig::default()
    }
}

/// "<|user|>\n" + content + "\n<|assistant|>\n".
fn chat_bytes(content: &str) -> Vec<u8> {
    format!("<|user|>\n{content}\n<|assistant|>\n").into_bytes()
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks(4)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(w)
        })
        .collect()
}

fn stored(batch: &KvEventBatch) -> Vec<(Vec<EngineBlockHash>, Option<EngineBlockHash>, &[u32])> {
    batch
        .events
        .iter()
        .filter_map(|e| match e {
            KvEvent::BlockStored {
                block_hashes,
                parent,
                token_ids,
                block_size,
                lora_name,
            } => {
                assert_eq!(*block_size, 16);
                assert_eq!(*lora_name, None);
                assert_eq!(token_ids.len(), block_hashes.len() * 16);
                Some((block_hashes.clone(), *parent, token_ids.as_slice()))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_evictions_clears_gaps_and_pauses() {
    let sim = pool(sim_config(40)).await;
    let addr = sim.addrs()[0];
    let (mut sub, mut last) = subscribed(&sim).await;

    // A store: the prompt's blocks, with the request's token ids and the engine's hashes.
    let content =
        "a question that is long enough to fill a few blocks of sixteen tokens; ".repeat(4);
    let r = call(
        &addr,
        "POST",
        "/v1/chat/completions",
        Some(&chat(&content, json!({"max_tokens": 2}))),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let prompt = chat_bytes(&content);
    let want_hashes = block_hashes(model_seed("sim-model", None), &prompt, 16);
    assert!(want_hashes.len() >= 4);
    let mut got_hashes = Vec::new();
    let mut got_tokens = Vec::new();
    while got_hashes.len() < want_hashes.len() {
        let m = next(&mut sub, Duration::from_secs(5))
            .await
            .expect("stores");
        assert_eq!(m.topic, format!("kv@{addr}@sim-model"));
        assert_eq!(m.seq, last + 1, "consecutive sequence numbers");
        assert_eq!(m.batch.dp_rank, Some(0));
        assert!(m.batch.ts > 1.7e9, "unix seconds");
        last = m.seq;
        for (hashes, parent, tokens) in stored(&m.batch) {
            assert_eq!(parent, got_hashes.last().copied(), "the chain's parent");
            got_hashes.extend(hashes);
            got_tokens.extend_from_slice(tokens);
        }
    }
    let want: Vec<EngineBlockHash> = want_hashes.iter().map(|h| EngineBlockHash(h.0)).collect();
    assert_eq!(got_hashes[..want.len()], want[..]);
    assert_eq!(
        got_tokens[..want.len() * 16],
        words(&prompt)[..want.len() * 16]
    );
    // `/tokenize` gives the same ids.
    let t = post(&sim, "/tokenize", Some(&chat(&content, json!({})))).await;
    let ids: Vec<u32> = t["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids, words(&prompt));
    assert_eq!(t["count"], json!(ids.len()));
    assert_eq!(t["max_model_len"], json!(640));

    // Cache pressure: distinct prompts until the first prompt's blocks are evicted.
    let mut removed = Vec::new();
    for i in 0..40 {
        let other =
            format!("{i} other text to push the first prompt out of the cache, {i}; ").repeat(4);
        call(
            &addr,
            "POST",
            "/v1/chat/completions",
            Some(&chat(&other, json!({"max_tokens": 2}))),
            &[],
        )
        .await;
        while let Some(m) = next(&mut sub, Duration::from_millis(50)).await {
            assert_eq!(m.seq, last + 1);
            last = m.seq;
            for e in &m.batch.events {
                if let KvEvent::BlockRemoved { block_hashes } = e {
                    removed.extend(block_hashes.iter().copied());
                }
            }
        }
        if want.iter().all(|h| removed.contains(h)) {
            break;
        }
    }
    assert!(
        want.iter().all(|h| removed.contains(h)),
        "the first prompt was evicted"
    );

    // A reset publishes one clear.
    post(&sim, "/reset_prefix_cache", None).await;
    let m = next(&mut sub, Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        (m.seq, m.batch.events.clone()),
        (last + 1, vec![KvEvent::AllBlocksCleared])
    );
    last = m.seq;

    // Dropped messages leave a gap in the sequence numbers.
    let s = post(&sim, "/sim/kv_events/drop?count=2", None).await;
    assert_eq!(s["drop_pending"], json!(2));
    for _ in 0..3 {
        post(&sim, "/reset_prefix_cache", None).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let m = next(&mut sub, Duration::from_secs(5)).await.unwrap();
    assert!(is_cleared(&m));
    assert_eq!(m.seq, last + 3, "two sequence numbers skipped");
    last = m.seq;
    assert!(next(&mut sub, Duration::from_millis(200)).await.is_none());

    // Paused: nothing goes out; on resume what waited follows, in order.
    post(&sim, "/sim/kv_events/pause", None).await;
    post(&sim, "/reset_prefix_cache", None).await;
    post(&sim, "/reset_prefix_cache", None).await;
    assert!(
        next(&mut sub, Duration::from_millis(300)).await.is_none(),
        "paused"
    );
    let s = post(&sim, "/sim/kv_events/resume", None).await;
    assert_eq!(s["paused"], json!(false));
    let mut clears = 0;
    while clears < 2 {
        let m = next(&mut sub, Duration::from_secs(5))
            .await
            .expect("released on resume");
        assert_eq!(m.seq, last + 1);
        last = m.seq;
        clears += m
            .batch
            .events
            .iter()
            .filter(|e| **e == KvEvent::AllBlocksCleared)
            .count();
    }

    // Counters: what went out, and the engine's own cached-token truth.
    let r = call(&addr, "GET", "/sim/kv_events", None, &[]).await;
    let s: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(s["dropped_messages"], json!(2));
    assert_eq!(s["next_seq"], json!(last + 1));
    assert!(s["stored_blocks"].as_u64().unwrap() >= want.len() as u64);
    assert!(s["removed_blocks"].as_u64().unwrap() >= want.len() as u64);
    assert!(s["prefix_cache_queries_tokens"].as_u64().unwrap() > 0);
    assert!(s["prompt_tokens"].as_u64().unwrap() > 0);
    sim.shutdown().await;
}

/// A second turn hits the first's blocks: the engine counts the cached tokens, and only the
/// new blocks are stored again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_store_only_new_blocks_and_count_cached_tokens() {
    let sim = pool(sim_config(400)).await;
    let addr = sim.addrs()[0];
    let (mut sub, _) = subscribed(&sim).await;
    let content = "the shared history of a conversation, long enough for blocks; ".repeat(8);
    let first = chat(&content, json!({"max_tokens": 2}));
    call(&addr, "POST", "/v1/chat/completions", Some(&first), &[]).await;
    let mut first_hashes = Vec::new();
    while let Some(m) = next(&mut sub, Duration::from_millis(300)).await {
        for (h, _, _) in stored(&m.batch) {
            first_hashes.extend(h);
        }
    }
    assert!(!first_hashes.is_empty());
    let r = call(&addr, "POST", "/v1/chat/completions", Some(&first), &[]).await;
    let v: Value = serde_json::from_str(&r.body).unwrap();
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= 16 * (first_hashes.len() as u64 - 1), "{cached}");
    while let Some(m) = next(&mut sub, Duration::from_millis(300)).await {
        for (h, _, _) in stored(&m.batch) {
            assert!(
                h.iter().all(|h| !first_hashes.contains(h)),
                "a hit is not stored again"
            );
        }
    }
    let s: Value =
        serde_json::from_str(&call(&addr, "GET", "/sim/kv_events", None, &[]).await.body).unwrap();
    assert_eq!(s["prefix_cache_hits_tokens"], json!(cached));
    sim.shutdown().await;
}

#[tokio::test]
async fn off_by_default_and_offset_zero_refused() {
    let sim = pool(SimConfig::default()).await;
    assert_eq!(sim.kv_events_endpoints(), vec![None]);
    let r = call(&sim.addrs()[0], "GET", "/sim/kv_events", None, &[]).await;
    assert_eq!(r.status, 409);
    // Reset and tokenize work without events.
    let r = call(&sim.addrs()[0], "POST", "/reset_prefix_cache", None, &[]).await;
    assert_eq!(r.status, 200);
    let t = call(
        &sim.addrs()[0],
        "POST",
        "/tokenize",
        Some(&json!({"model": "sim-model", "prompt": "abcdef"})),
        &[],
    )
    .await;
    let v: Value = serde_json::from_str(&t.body).unwrap();
    assert_eq!(v["tokens"], json!([u32::from_le_bytes(*b"abcd"), 0x6665]));
    let t = call(
        &sim.addrs()[0],
        "POST",
        "/tokenize",
        Some(&json!({"model": "nope", "prompt": "x"})),
        &[],
    )
    .await;
    assert_eq!(t.status, 404);
    let t = call(&sim.addrs()[0], "POST", "/tokenize", Some(&json!({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": false})), &[]).await;
    let v: Value = serde_json::from_str(&t.body).unwrap();
    assert_eq!(v["tokens"], json!(words(b"<|user|>\nhi\n")));
    sim.shutdown().await;
    let bad = infergate_sim::start(SimConfig {
        kv_events_port_offset: Some(0),
        ..SimConfig::default()
    })
    .await;
    assert!(bad.is_err());
}
