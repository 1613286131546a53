//! The `kv_events` target: the KV event decoder (`scheduler_core::kv_events`) and the
//! precise prefix index on any bytes.
//!
//! Input: the whole input is a payload frame and, too, a topic frame. A payload that
//! decodes is applied to a small [`PreciseIndex`] (bound [`BOUND`] blocks) under two
//! endpoints, and re-encoded by nothing: the assertions are the decoder's bounds (events,
//! hashes and tokens never more than the payload's bytes allow; memory linear in the
//! payload) and the index's (never more than the bound stored; matches never longer than
//! the keys asked; `AllBlocksCleared` empties the endpoint).

use scheduler_core::kv_events::{
    decode_batch, parse_topic, KvEvent, MAX_EVENTS, MAX_HASHES, MAX_TOKENS,
};
use scheduler_core::prefix::precise::{kv_seed, token_block_keys, PreciseIndex};
use scheduler_core::types::Millis;

use crate::meter::peak_during;

/// Blocks held per endpoint by the index the events are applied to.
pub const BOUND: u32 = 64;

/// The most memory decoding may take for `len` payload bytes: hashes and tokens take at
/// most 8 bytes per payload byte, events one struct (under 100 bytes) per 14 bytes, plus
/// growth slack (Vec doubling) and a constant.
pub fn decode_memory_bound(len: usize) -> usize {
    24 * len + 16 * 1024
}

/// Any bytes as a KV event payload and as a topic (module doc).
pub fn kv_events(data: &[u8]) {
    if let Some(t) = parse_topic(data) {
        assert!(!t.pod.is_empty() && !t.model.is_empty() && !t.pod.contains('@'));
        assert_eq!(4 + t.pod.len() + t.model.len(), data.len());
    }
    let (decoded, peak) = peak_during(|| decode_batch(data));
    assert!(
        peak <= decode_memory_bound(data.len()),
        "kv_events: {peak} bytes allocated decoding {} bytes",
        data.len()
    );
    let Ok(batch) = decoded else {
        return;
    };
    assert!(batch.events.len() <= MAX_EVENTS && batch.events.len() <= data.len() / 14);
    let mut index = PreciseIndex::new(BOUND);
    for (i, ev) in batch.events.iter().enumerate() {
        let ep = if i % 2 == 0 { "a:1" } else { "b:1" };
        match ev {
            KvEvent::BlockStored {
                block_hashes,
                token_ids,
                block_size,
                lora_name,
                ..
            } => {
                assert!(block_hashes.len() <= MAX_HASHES && block_hashes.len() <= data.len());
                assert!(token_ids.len() <= MAX_TOKENS && token_ids.len() <= data.len());
                let applied = index.apply(ep, "m", ev);
                assert!(applied.stored as usize + applied.skipped as usize <= block_hashes.len());
                // A prompt of these tokens matches no more blocks than it has.
                let model = lora_name.as_deref().unwrap_or("m");
                let keys = token_block_keys(kv_seed(model), token_ids, *block_size, 64);
                assert!(index.matched_blocks(ep, &keys, Millis(0)) <= keys.len());
            }
            KvEvent::BlockRemoved { block_hashes } => {
                let before = index.stored_blocks(ep);
                let applied = index.apply(ep, "m", ev);
                assert!(applied.removed as usize <= block_hashes.len());
                assert_eq!(index.stored_blocks(ep), before - applied.removed as usize);
            }
            KvEvent::AllBlocksCleared => {
                index.apply(ep, "m", ev);
                assert_eq!(index.stored_blocks(ep), 0);
            }
        }
        assert!(index.stored_blocks(ep) <= BOUND as usize);
    }
}
