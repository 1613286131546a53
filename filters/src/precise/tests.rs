//! The shared precise index: request keys from bodies, events applied, staleness,
//! speculative entries and the block size's sources.

use scheduler_core::prefix::precise::{kv_seed, token_block_keys, PreciseSettings};
use scheduler_core::request::Api;
use scheduler_core::types::Millis;

use super::*;
use crate::tokenize::{PromptInput, SimTokenizer, Tokenizer};

/// A minimal MessagePack writer for the event shapes vLLM sends.
#[derive(Default)]
struct Pack(Vec<u8>);

impl Pack {
    fn array(&mut self, n: usize) -> &mut Self {
        assert!(n < 16);
        self.0.push(0x90 | n as u8);
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        assert!(s.len() < 32);
        self.0.push(0xa0 | s.len() as u8);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn nil(&mut self) -> &mut Self {
        self.0.push(0xc0);
        self
    }
    fn uint(&mut self, v: u64) -> &mut Self {
        self.0.push(0xcf);
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn uints(&mut self, vs: &[u64]) -> &mut Self {
        self.0.push(0xdd);
        self.0.extend_from_slice(&(vs.len() as u32).to_be_bytes());
        for v in vs {
            self.uint(*v);
        }
        self
    }
    fn float(&mut self, v: f64) -> &mut Self {
        self.0.push(0xcb);
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
}

/// `[ts, [event...], nil]` with the events written by `events` (`n` of them).
fn batch(n: usize, events: impl FnOnce(&mut Pack)) -> Vec<u8> {
    let mut p = Pack::default();
    p.array(3).float(1.5);
    p.0.push(0xdc);
    p.0.extend_from_slice(&(n as u16).to_be_bytes());
    events(&mut p);
    p.nil();
    p.0
}

fn stored(p: &mut Pack, hashes: &[u64], parent: Option<u64>, tokens: &[u32], bs: u64) {
    p.array(8).str("BlockStored").uints(hashes);
    match parent {
        Some(h) => p.uint(h),
        None => p.nil(),
    };
    let t: Vec<u64> = tokens.iter().map(|t| u64::from(*t)).collect();
    p.uints(&t).uint(bs).nil().nil().nil();
}

const MODEL: &str = "m";

fn body() -> Vec<u8> {
    let system = "you are a helpful assistant ".repeat(10);
    serde_json::to_vec(&serde_json::json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "there"}]}
        ]
    }))
    .unwrap()
}

fn tokens_of_body() -> Vec<u32> {
    let system = "you are a helpful assistant ".repeat(10);
    let msgs = [
        ChatMessage {
            role: "system",
            content: &system,
        },
        ChatMessage {
            role: "user",
            content: "hello there",
        },
    ];
    SimTokenizer.tokenize(&PromptInput::Chat(&msgs)).unwrap()
}

fn shared(settings: PreciseSettings) -> PreciseShared {
    PreciseShared::new(&settings).unwrap()
}

#[test]
fn request_keys_are_the_engines_tokens_in_blocks() {
    let p = shared(PreciseSettings::default());
    let keys = p.keys(Api::ChatCompletions, MODEL, &body());
    let tokens = tokens_of_body();
    assert_eq!(
        keys,
        token_block_keys(kv_seed(MODEL), &tokens, 16, usize::MAX)
    );
    assert_eq!(keys.len(), tokens.len() / 16);
    assert!(keys.len() >= 4);
    // A salted request, a body that is no JSON, a completions body without a string prompt.
    let salted = serde_json::to_vec(&serde_json::json!({
        "model": MODEL, "cache_salt": "s", "messages": [{"role": "user", "content": "x".repeat(400)}]
    }))
    .unwrap();
    assert!(p.keys(Api::ChatCompletions, MODEL, &salted).is_empty());
    assert!(p.keys(Api::ChatCompletions, MODEL, b"{nope").is_empty());
    assert_eq!(p.counters().tokenize_errors, 1);
    let text = serde_json::to_vec(&serde_json::json!({"model": MODEL, "prompt": "y".repeat(200)}))
        .unwrap();
    assert_eq!(p.keys(Api::Completions, MODEL, &text).len(), 200 / 4 / 16);
}

#[test]
fn events_make_the_index_hold_the_request() {
    let p = shared(PreciseSettings::default());
    let keys = p.keys(Api::ChatCompletions, MODEL, &body());
    let tokens = tokens_of_body();
    let n = keys.len();
    let full = &tokens[..n * 16];
    // The first two blocks, then the rest chained from the second's engine hash.
    let first = batch(1, |b| stored(b, &[101, 102], None, &full[..32], 16));
    let hashes: Vec<u64> = (103..103 + n as u64 - 2).collect();
    let rest = batch(1, |b| stored(b, &hashes, Some(102), &full[32..], 16));
    p.deliver("10.0.0.1:8000", MODEL, &first).unwrap();
    let held =
        |p: &PreciseShared| p.with_index(|i| i.matched_blocks("10.0.0.1:8000", &keys, Millis(0)));
    assert_eq!(held(&p), 2);
    p.deliver("10.0.0.1:8000", MODEL, &rest).unwrap();
    assert_eq!(held(&p), n);
    assert_eq!(p.stored_blocks("10.0.0.1:8000"), n);
    // The engine evicts block 1: the match stops at 1.
    let removed = batch(1, |b| {
        b.array(3).str("BlockRemoved").uints(&[102]).nil();
    });
    p.deliver("10.0.0.1:8000", MODEL, &removed).unwrap();
    assert_eq!(held(&p), 1);
    // A restart: AllBlocksCleared forgets the endpoint.
    let cleared = batch(1, |b| {
        b.array(1).str("AllBlocksCleared");
    });
    p.deliver("10.0.0.1:8000", MODEL, &cleared).unwrap();
    assert_eq!(held(&p), 0);
    let c = p.counters();
    assert_eq!(
        (
            c.batches,
            c.stored_events,
            c.removed_events,
            c.cleared_events
        ),
        (4, 2, 1, 1)
    );
}

#[test]
fn a_bad_message_or_a_gap_makes_the_endpoint_unknown() {
    let p = shared(PreciseSettings::default());
    let keys = p.keys(Api::ChatCompletions, MODEL, &body());
    let tokens = tokens_of_body();
    p.deliver(
        "e",
        MODEL,
        &batch(1, |b| stored(b, &[1], None, &tokens[..16], 16)),
    )
    .unwrap();
    assert_eq!(p.with_index(|i| i.matched_blocks("e", &keys, Millis(0))), 1);
    assert!(p.deliver("e", MODEL, &[0xc1]).is_err());
    assert_eq!(p.with_index(|i| i.matched_blocks("e", &keys, Millis(0))), 0);
    p.deliver(
        "e",
        MODEL,
        &batch(1, |b| stored(b, &[1], None, &tokens[..16], 16)),
    )
    .unwrap();
    p.mark_stale("e");
    assert_eq!(p.with_index(|i| i.matched_blocks("e", &keys, Millis(0))), 0);
    let c = p.counters();
    assert_eq!((c.decode_errors, c.stale), (1, 2));
}

#[test]
fn speculative_entries_count_until_their_ttl() {
    let p = shared(PreciseSettings {
        speculative_ttl_ms: 100,
        ..PreciseSettings::default()
    });
    let keys = p.keys(Api::ChatCompletions, MODEL, &body());
    p.record_speculative("e", &keys, Millis(1_000));
    let at = |t| p.with_index(|i| i.matched_blocks("e", &keys, Millis(t)));
    assert_eq!(at(1_050), keys.len());
    assert_eq!(at(1_100), 0);
    let none = shared(PreciseSettings {
        speculative_ttl_ms: 0,
        ..PreciseSettings::default()
    });
    none.record_speculative("e", &keys, Millis(0));
    assert_eq!(
        none.with_index(|i| i.matched_blocks("e", &keys, Millis(0))),
        0
    );
}

#[test]
fn block_size_configured_then_scraped_then_from_events() {
    let p = shared(PreciseSettings::default());
    assert_eq!(p.block_size(), 16);
    let tokens: Vec<u32> = (0..64).collect();
    p.deliver(
        "e",
        MODEL,
        &batch(1, |b| stored(b, &[1], None, &tokens[..32], 32)),
    )
    .unwrap();
    assert_eq!(p.block_size(), 32);
    p.learn_block_size(64);
    assert_eq!(p.block_size(), 64);
    let fixed = shared(PreciseSettings {
        block_size_tokens: Some(8),
        ..PreciseSettings::default()
    });
    fixed.learn_block_size(64);
    assert_eq!(fixed.block_size(), 8);
}

#[test]
fn huge_bursts_apply_in_slices() {
    let p = shared(PreciseSettings::default());
    let tokens: Vec<u32> = (0..16).collect();
    let n = EVENTS_PER_HOLD * 2 + 3;
    let payload = batch(n, |b| {
        for i in 0..n {
            stored(b, &[i as u64 + 1], None, &tokens, 16);
        }
    });
    p.deliver("e", MODEL, &payload).unwrap();
    assert_eq!(p.counters().stored_events, n as u64);
    // Every event stored the same first block under another engine hash.
    assert_eq!(p.stored_blocks("e"), n);
}
