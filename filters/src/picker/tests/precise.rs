//! A pool with `precise-prefix-cache-producer`: requests keyed by their tokens, the index
//! fed by KV events (here delivered by hand, as the event thread does), picks that follow
//! the engines' blocks, speculative entries, membership, and the targets the event thread
//! follows.

use super::*;
use crate::tokenize::{ChatMessage, PromptInput, SimTokenizer, Tokenizer};
use scheduler_core::prefix::precise::{kv_seed, token_block_keys};

/// A precise pool over `endpoints`: prefix scorer only, speculative entries for `ttl` ms,
/// events at the endpoint's port + 1000.
fn precise_pool(endpoints: &[&str], ttl: u64) -> Value {
    pool(
        endpoints,
        json!({"eppConfig": {
            "plugins": [
                {"type": "precise-prefix-cache-producer", "parameters": {
                    "kvEventsPortOffset": 1000, "speculativeTtlMs": ttl}},
                {"type": "prefix-cache-scorer"},
                {"type": "max-score-picker"}
            ]
        }}),
    )
}

fn content() -> String {
    "a long shared conversation prefix ".repeat(20)
}

/// The engine's tokens of `chat(content)`.
fn tokens(content: &str) -> Vec<u32> {
    let msgs = [ChatMessage {
        role: "user",
        content,
    }];
    SimTokenizer.tokenize(&PromptInput::Chat(&msgs)).unwrap()
}

/// msgpack `[0.0, [["BlockStored", [hashes], nil, [tokens], 16, nil, nil, nil]], nil]`.
fn stored_batch(first_hash: u64, tokens: &[u32]) -> Vec<u8> {
    let blocks = tokens.len() / 16;
    let mut b = vec![0x93, 0xcb];
    b.extend_from_slice(&0f64.to_be_bytes());
    b.extend_from_slice(&[0x91, 0x98, 0xab]);
    b.extend_from_slice(b"BlockStored");
    b.push(0xdd);
    b.extend_from_slice(&(blocks as u32).to_be_bytes());
    for i in 0..blocks as u64 {
        b.push(0xcf);
        b.extend_from_slice(&(first_hash + i).to_be_bytes());
    }
    b.push(0xc0);
    b.push(0xdd);
    b.extend_from_slice(&((blocks * 16) as u32).to_be_bytes());
    for t in &tokens[..blocks * 16] {
        b.push(0xce);
        b.extend_from_slice(&t.to_be_bytes());
    }
    b.extend_from_slice(&[0x10, 0xc0, 0xc0, 0xc0, 0xc0]);
    b
}

#[test]
fn picks_follow_the_blocks_the_engines_report() {
    let mut s = shared(json!({"pools": [precise_pool(&[A, B, C], 0)]}));
    let plan = s.pool_plan("llama").unwrap();
    let index = Arc::clone(plan.precise().expect("a precise index"));
    let body = chat(&content());
    // The request's keys are the engine's tokens in 16-token blocks.
    let t = tokens(&content());
    assert_eq!(
        index.keys(Api::ChatCompletions, "llama", &body),
        token_block_keys(kv_seed("llama"), &t, 16, usize::MAX)
    );
    // B's engine reports the prompt's blocks: every pick goes to B.
    index.deliver(B, "llama", &stored_batch(500, &t)).unwrap();
    for _ in 0..5 {
        let mut host = host_for(&body, Some(fresh_all(&[A, B, C])));
        let (status, _req) = pick_one(&mut s, &mut host);
        assert_eq!(status, FilterStatus::Continue);
        let dest = host.header(DESTINATION_ENDPOINT).unwrap_or_default();
        assert!(dest.starts_with(B), "{dest}");
    }
    // B restarts (its stream goes stale) and C's engine reports them: picks follow C.
    index.mark_stale(B);
    index.deliver(C, "llama", &stored_batch(900, &t)).unwrap();
    let mut host = host_for(&body, Some(fresh_all(&[A, B, C])));
    let _ = pick_one(&mut s, &mut host);
    let dest = host.header(DESTINATION_ENDPOINT).unwrap_or_default();
    assert!(dest.starts_with(C), "{dest}");
}

#[test]
fn a_pick_is_speculatively_held_until_the_ttl() {
    let mut s = shared(json!({"pools": [precise_pool(&[A, B, C], 60_000)]}));
    let plan = s.pool_plan("llama").unwrap();
    let index = Arc::clone(plan.precise().unwrap());
    let body = chat(&content());
    let keys = index.keys(Api::ChatCompletions, "llama", &body);
    let mut host = host_for(&body, Some(fresh_all(&[A, B, C])));
    let (_, _req) = pick_one(&mut s, &mut host);
    let first = host.header(DESTINATION_ENDPOINT).unwrap_or_default();
    let first = first.split(',').next().unwrap_or_default().to_owned();
    let held = |at: u64| index.with_index(|i| i.matched_blocks(&first, &keys, Millis(at)));
    assert_eq!(held(NOW), keys.len());
    assert_eq!(held(NOW + 60_000), 0);
    // No event came, yet the next turn follows the first.
    for _ in 0..3 {
        let mut host = host_for(&body, Some(fresh_all(&[A, B, C])));
        let _ = pick_one(&mut s, &mut host);
        let dest = host.header(DESTINATION_ENDPOINT).unwrap_or_default();
        assert!(dest.starts_with(&first), "{dest} vs {first}");
    }
}

#[test]
fn targets_are_the_members_at_their_events_port() {
    let s = shared(
        json!({"pools": [precise_pool(&[A, B], 0), pool(&[C], json!({"pool": "q", "baseModel": "other"}))]}),
    );
    let mut targets: Vec<(String, String, String)> = s
        .precise_targets()
        .into_iter()
        .map(|t| (t.pool, t.endpoint, t.events.to_string()))
        .collect();
    targets.sort();
    assert_eq!(
        targets,
        [
            ("p".into(), A.into(), "10.0.0.1:9000".into()),
            ("p".into(), B.into(), "10.0.0.2:9000".into())
        ]
    );
    assert!(s.has_precise());
    assert!(!shared(json!({"pools": [pool(&[A], json!({}))]})).has_precise());
}

#[test]
fn a_tokenizer_that_cannot_load_is_a_config_error() {
    let bad = pool(
        &[A],
        json!({"eppConfig": {"plugins": [
            {"type": "precise-prefix-cache-producer", "parameters": {"tokenizer": {"type": "nope"}}},
            {"type": "prefix-cache-scorer"}]}}),
    );
    let err = PickerShared::from_json(json!({"pools": [bad]}))
        .unwrap_err()
        .to_string();
    assert!(err.contains("precise-prefix-cache-producer"), "{err}");
}
