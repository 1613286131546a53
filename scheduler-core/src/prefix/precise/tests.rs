//! Key vectors, event application against a model, bounds, speculative entries and the
//! producer's parameters.

use super::*;
use crate::kv_events::{EngineBlockHash, KvEvent};
use crate::scheduling::{ConfigError, PrefixMatch};
use crate::types::Millis;
use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use proptest::prelude::*;
use serde_json::{json, Value};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const EP: &str = "10.0.0.1:8000";
const MODEL: &str = "m";

fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32], bs: u32) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: hashes.iter().map(|h| EngineBlockHash(*h)).collect(),
        parent: parent.map(EngineBlockHash),
        token_ids: tokens.to_vec(),
        block_size: bs,
        lora_name: None,
    }
}

fn removed(hashes: &[u64]) -> KvEvent {
    KvEvent::BlockRemoved {
        block_hashes: hashes.iter().map(|h| EngineBlockHash(*h)).collect(),
    }
}

fn toks(n: usize, base: u32) -> Vec<u32> {
    (0..n as u32).map(|i| base.wrapping_add(i * 31)).collect()
}

#[test]
fn key_vectors_match_the_python_reference() {
    let v: Value = serde_json::from_str(include_str!(
        "../../../../testdata/kv_events/key-vectors.json"
    ))
    .unwrap();
    let cases = v.as_array().unwrap();
    assert!(cases.len() >= 5);
    for c in cases {
        let model = c["model"].as_str().unwrap();
        let seed = kv_seed(model);
        assert_eq!(seed, c["seed"].as_u64().unwrap(), "{model}");
        let tokens: Vec<u32> = c["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let keys = token_block_keys(
            seed,
            &tokens,
            c["block_size"].as_u64().unwrap() as u32,
            c["max_blocks"].as_u64().unwrap() as usize,
        );
        let want: Vec<BlockHash> = c["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| BlockHash(k.as_u64().unwrap()))
            .collect();
        assert_eq!(keys, want, "{c}");
    }
}

#[test]
fn stored_chain_matches_the_request_keys_and_breaks_at_a_removal() {
    let t = toks(64, 7);
    let keys = token_block_keys(kv_seed(MODEL), &t, 16, 100);
    let mut ix = PreciseIndex::new(100);
    // Two events: blocks 0-1 without a parent, then 2-3 chained from block 1.
    let a = ix.apply(EP, MODEL, &stored(&[100, 101], None, &t[..32], 16));
    let b = ix.apply(EP, MODEL, &stored(&[102, 103], Some(101), &t[32..], 16));
    assert_eq!((a.stored, b.stored), (2, 2));
    assert_eq!(ix.matched_blocks(EP, &keys, Millis(0)), 4);
    assert_eq!(ix.at(Millis(0)).matched_blocks(EP, &keys), 4);
    assert_eq!(ix.matched_blocks("other:1", &keys, Millis(0)), 0);
    // Another model's seed, and a LoRA adapter's, key differently.
    let other = token_block_keys(kv_seed("m2"), &t, 16, 100);
    assert_eq!(ix.matched_blocks(EP, &other, Millis(0)), 0);
    assert_eq!(ix.apply(EP, MODEL, &removed(&[101, 999])).removed, 1);
    assert_eq!(ix.matched_blocks(EP, &keys, Millis(0)), 1);
    assert_eq!(ix.stored_blocks(EP), 3);
    let cleared = ix.apply(EP, MODEL, &KvEvent::AllBlocksCleared);
    assert_eq!(cleared.cleared, 3);
    assert_eq!(ix.stored_blocks(EP), 0);
    assert_eq!(ix.matched_blocks(EP, &keys, Millis(0)), 0);
}

#[test]
fn lora_blocks_use_the_adapter_seed() {
    let t = toks(32, 1);
    let mut ix = PreciseIndex::new(100);
    let ev = KvEvent::BlockStored {
        block_hashes: vec![EngineBlockHash(1), EngineBlockHash(2)],
        parent: None,
        token_ids: t.clone(),
        block_size: 16,
        lora_name: Some("sql-lora".into()),
    };
    ix.apply(EP, MODEL, &ev);
    let lora = token_block_keys(kv_seed("sql-lora"), &t, 16, 100);
    let base = token_block_keys(kv_seed(MODEL), &t, 16, 100);
    assert_eq!(ix.matched_blocks(EP, &lora, Millis(0)), 2);
    assert_eq!(ix.matched_blocks(EP, &base, Millis(0)), 0);
}

#[test]
fn unknown_parents_short_tokens_and_zero_block_size_are_skipped() {
    let t = toks(40, 3);
    let mut ix = PreciseIndex::new(100);
    let a = ix.apply(EP, MODEL, &stored(&[5, 6], Some(4), &t[..32], 16));
    assert_eq!((a.stored, a.skipped), (0, 2));
    // 40 tokens for 3 blocks of 16: the third has too few.
    let b = ix.apply(EP, MODEL, &stored(&[1, 2, 3], None, &t, 16));
    assert_eq!((b.stored, b.skipped), (2, 1));
    let c = ix.apply(EP, MODEL, &stored(&[7], None, &t, 0));
    assert_eq!((c.stored, c.skipped), (0, 1));
    // Removing or clearing an endpoint never seen creates nothing.
    ix.apply("x:1", MODEL, &removed(&[1]));
    ix.apply("x:1", MODEL, &KvEvent::AllBlocksCleared);
    assert_eq!(ix.endpoint_count(), 1);
}

#[test]
fn the_bound_evicts_the_oldest_and_a_restore_refreshes() {
    let mut ix = PreciseIndex::new(3);
    for h in 1..=3u64 {
        ix.apply(EP, MODEL, &stored(&[h], None, &toks(4, h as u32), 4));
    }
    // Re-storing 1 makes it newest; storing 4 then evicts 2 (the oldest).
    ix.apply(EP, MODEL, &stored(&[1], None, &toks(4, 1), 4));
    let a = ix.apply(EP, MODEL, &stored(&[4], None, &toks(4, 4), 4));
    assert_eq!((a.stored, a.evicted), (1, 1));
    assert_eq!(ix.order(EP), vec![4, 1, 3]);
    assert_eq!(ix.stored_blocks(EP), 3);
}

#[test]
fn speculative_entries_count_until_they_expire() {
    let t = toks(48, 9);
    let keys = token_block_keys(kv_seed(MODEL), &t, 16, 100);
    let mut ix = PreciseIndex::new(100);
    ix.record_speculative(EP, &keys[..2], Millis(1_000));
    assert_eq!(ix.matched_blocks(EP, &keys, Millis(999)), 2);
    assert_eq!(ix.matched_blocks(EP, &keys, Millis(1_000)), 0);
    // Confirmed block 0 plus speculative 1..2.
    ix.apply(EP, MODEL, &stored(&[1], None, &t[..16], 16));
    ix.record_speculative(EP, &keys[1..], Millis(2_000));
    assert_eq!(ix.matched_blocks(EP, &keys, Millis(1_500)), 3);
    ix.expire(Millis(2_000));
    assert_eq!(ix.matched_blocks(EP, &keys, Millis(1_500)), 1);
    // The speculative bound drops the oldest records.
    let mut small = PreciseIndex::new(2);
    small.record_speculative(EP, &keys, Millis(5_000));
    assert_eq!(small.matched_blocks(EP, &keys[..1], Millis(0)), 1);
    small.record_speculative(EP, &keys[2..], Millis(5_000));
    small.record_speculative(EP, &keys[1..2], Millis(5_000));
    assert_eq!(small.matched_blocks(EP, &keys[..1], Millis(0)), 0);
    assert_eq!(small.matched_blocks(EP, &keys[1..], Millis(0)), 2);
}

#[test]
fn clear_and_remove_endpoint() {
    let t = toks(16, 0);
    let keys = token_block_keys(kv_seed(MODEL), &t, 16, 100);
    let mut ix = PreciseIndex::new(10);
    ix.apply(EP, MODEL, &stored(&[1], None, &t, 16));
    ix.record_speculative("b:1", &keys, Millis(100));
    ix.clear_endpoint(EP);
    assert_eq!(ix.matched_blocks(EP, &keys, Millis(0)), 0);
    assert_eq!(ix.endpoint_count(), 2);
    ix.remove_endpoint("b:1");
    assert_eq!(ix.endpoint_count(), 1);
}

#[test]
fn memory_per_block_is_bounded() {
    let mut ix = PreciseIndex::new(1 << 20);
    let n = 100_000u64;
    let t = toks(16, 5);
    for h in 0..n {
        ix.apply(EP, MODEL, &stored(&[h], None, &t, 16));
    }
    // Same tokens, one key: every block counted once in by_key.
    assert_eq!(ix.stored_blocks(EP), n as usize);
    let per = ix.memory_bytes() as f64 / n as f64;
    assert!(per <= 80.0, "{per} bytes per block");
}

/// Operations on one endpoint of a small world, for the model-based property.
#[derive(Clone, Debug)]
enum Op {
    /// Store a chain of `len` blocks starting after block `from` of chain `chain` (from 0:
    /// no parent).
    Store {
        chain: u8,
        from: u8,
        len: u8,
    },
    Remove {
        chain: u8,
        block: u8,
    },
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..3, 0u8..6, 1u8..4).prop_map(|(chain, from, len)| Op::Store { chain, from, len }),
        3 => (0u8..3, 0u8..8).prop_map(|(chain, block)| Op::Remove { chain, block }),
        1 => Just(Op::Clear),
    ]
}

const BS: u32 = 2;

fn chain_tokens(chain: u8) -> Vec<u32> {
    // Chains 1 and 2 share their first two blocks (a common system prompt).
    (0..16u32)
        .map(|i| {
            if i < 4 {
                i
            } else {
                u32::from(chain) * 1000 + i
            }
        })
        .collect()
}

/// Engine hash of block `b` of chain `c`: equal where the chains' prefixes are equal.
fn engine_hash(c: u8, b: u8) -> u64 {
    let shared = b < 2 && c > 0;
    let c = if shared { 1 } else { c };
    u64::from(c) << 8 | u64::from(b)
}

proptest! {
    #[test]
    fn index_agrees_with_a_model_and_keeps_its_bound(
        ops in proptest::collection::vec(op(), 1..50),
        cap in 1u32..12,
    ) {
        let mut ix = PreciseIndex::new(cap);
        // Model: engine hash → (key, age), newest = largest age.
        let mut model: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        let mut age = 0u64;
        for op in &ops {
            match *op {
                Op::Store { chain, from, len } => {
                    let t = chain_tokens(chain);
                    let all = token_block_keys(kv_seed(MODEL), &t, BS, 8);
                    let from = from.min(7);
                    let len = len.min(8 - from);
                    let parent = (from > 0).then(|| engine_hash(chain, from - 1));
                    let hashes: Vec<u64> = (from..from + len).map(|b| engine_hash(chain, b)).collect();
                    let lo = usize::from(from) * BS as usize;
                    let hi = usize::from(from + len) * BS as usize;
                    ix.apply(EP, MODEL, &stored(&hashes, parent, &t[lo..hi], BS));
                    let parent_known = parent.is_none_or(|p| model.contains_key(&p));
                    if parent_known {
                        for (i, h) in hashes.iter().enumerate() {
                            age += 1;
                            model.insert(*h, (all[usize::from(from) + i].0, age));
                            if model.len() > cap as usize {
                                let oldest = model.iter().min_by_key(|e| e.1.1).map(|e| *e.0).unwrap();
                                model.remove(&oldest);
                            }
                        }
                    }
                }
                Op::Remove { chain, block } => {
                    ix.apply(EP, MODEL, &removed(&[engine_hash(chain, block)]));
                    model.remove(&engine_hash(chain, block));
                }
                Op::Clear => {
                    ix.apply(EP, MODEL, &KvEvent::AllBlocksCleared);
                    model.clear();
                }
            }
            prop_assert!(ix.stored_blocks(EP) <= cap as usize);
            prop_assert_eq!(ix.stored_blocks(EP), model.len());
            let mut by_age: Vec<(u64, u64)> = model.iter().map(|(h, (_, a))| (*a, *h)).collect();
            by_age.sort_unstable_by(|a, b| b.cmp(a));
            prop_assert_eq!(ix.order(EP), by_age.iter().map(|e| e.1).collect::<Vec<_>>());
            for (h, (k, _)) in &model {
                prop_assert_eq!(ix.key_of(EP, EngineBlockHash(*h)), Some(BlockHash(*k)));
            }
            for chain in 0..3u8 {
                let keys = token_block_keys(kv_seed(MODEL), &chain_tokens(chain), BS, 8);
                let held: Vec<u64> = model.values().map(|v| v.0).collect();
                let want = keys.iter().take_while(|k| held.contains(&k.0)).count();
                prop_assert_eq!(ix.matched_blocks(EP, &keys, Millis(0)), want);
            }
        }
    }

    #[test]
    fn token_keys_share_exactly_the_common_full_blocks(
        shared in proptest::collection::vec(any::<u32>(), 0..64),
        a in proptest::collection::vec(any::<u32>(), 1..40),
        b in proptest::collection::vec(any::<u32>(), 1..40),
        bs in 1u32..9,
    ) {
        prop_assume!(a[0] != b[0]);
        let x: Vec<u32> = shared.iter().chain(a.iter()).copied().collect();
        let y: Vec<u32> = shared.iter().chain(b.iter()).copied().collect();
        let seed = kv_seed(MODEL);
        let kx = token_block_keys(seed, &x, bs, usize::MAX);
        let ky = token_block_keys(seed, &y, bs, usize::MAX);
        prop_assert_eq!(kx.len(), x.len() / bs as usize);
        let common = shared.len() / bs as usize;
        let equal = kx.iter().zip(&ky).take_while(|(p, q)| p == q).count();
        prop_assert_eq!(equal, common.min(kx.len()).min(ky.len()));
        prop_assert_eq!(token_block_keys(seed, &x, bs, 1).len(), kx.len().min(1));
    }
}

fn parse(v: Value) -> Result<PreciseSettings, ConfigError> {
    parse_precise_producer("precise", Some(&v))
}

fn param_of(e: ConfigError) -> String {
    match e {
        ConfigError::BadParameter { parameter, .. } => parameter,
        other => other.to_string(),
    }
}

#[test]
fn producer_parameters() {
    assert_eq!(
        parse_precise_producer("p", None).unwrap(),
        PreciseSettings::default()
    );
    let d = PreciseSettings::default();
    assert_eq!(d.block_size_tokens, None);
    assert_eq!(d.max_blocks_per_server, 262_144);
    assert_eq!(d.events_port, EventsPort::Fixed(5557));
    assert_eq!(d.tokenizer, json!({"type": "sim"}));
    let s = parse(json!({
        "blockSizeTokens": 32,
        "maxPrefixTokensToMatch": 4096,
        "maxBlocksPerServer": 1000,
        "speculativeTtlMs": 0,
        "kvEventsPortOffset": 100,
        "tokenizer": {"type": "huggingface", "path": "/models/x"},
    }))
    .unwrap();
    assert_eq!(s.block_size_tokens, Some(32));
    assert_eq!(s.max_blocks(32), 128);
    assert_eq!(s.max_blocks(0), 0);
    assert_eq!(s.max_blocks_per_server, 1000);
    assert_eq!(s.speculative_ttl_ms, 0);
    assert_eq!(s.events_port, EventsPort::Offset(100));
    assert_eq!(s.events_port.for_endpoint(8000), Some(8100));
    assert_eq!(s.events_port.for_endpoint(65_500), None);
    assert_eq!(s.tokenizer["path"], "/models/x");
    for (v, param) in [
        (json!({"blockSizeTokens": 0}), "blockSizeTokens"),
        (json!({"blockSizeTokens": "16"}), "blockSizeTokens"),
        (json!({"maxBlocksPerServer": 0}), "maxBlocksPerServer"),
        (json!({"speculativeTtlMs": 600_001}), "speculativeTtlMs"),
        (json!({"kvEventsPort": 0}), "kvEventsPort"),
        (json!({"kvEventsPort": 70_000}), "kvEventsPort"),
        (
            json!({"kvEventsPort": 5557, "kvEventsPortOffset": 1}),
            "kvEventsPortOffset",
        ),
        (json!({"tokenizer": "sim"}), "tokenizer"),
        (json!({"tokenizer": {"path": "x"}}), "tokenizer"),
        (json!({"blockSize": 16}), "blockSize"),
        (json!([1]), "parameters"),
    ] {
        assert_eq!(param_of(parse(v.clone()).unwrap_err()), param, "{v}");
    }
}
