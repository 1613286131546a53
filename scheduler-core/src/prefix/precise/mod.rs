//! The precise prefix index: which endpoint holds which KV block, as its engine's KV events
//! ([`crate::kv_events`]) report it, keyed so that a request's tokens find it.
//!
//! # Keys (version 1)
//!
//! Engine block hashes cannot be computed here (vLLM's depend on its hash function, its
//! `PYTHONHASHSEED` and extra keys), so the index keys blocks by its own chained hash of
//! the *tokens*, which both sides know: the request side tokenizes the prompt like the
//! engine and calls [`token_block_keys`]; the event side hashes the `token_ids` each
//! `BlockStored` carries. With `H` = XXH3-64 (seed 0, default secret), `le8`/`le4` the
//! little-endian bytes of a `u64`/`u32`:
//!
//! ```text
//! seed = H("infergate-kv-v1" ‖ le8(len(model)) ‖ model)
//! k₀   = H(le8(seed) ‖ le4(t) for each token t of block 0)
//! kᵢ   = H(le8(kᵢ₋₁) ‖ le4(t) for each token t of block i)
//! ```
//!
//! `model` is the LoRA adapter's name when the blocks were computed with one, else the
//! served model (the event's topic; the request's target model). The domain string differs
//! from the approximate index's (`crate::prefix`), so the two key spaces never meet. Test
//! vectors: `testdata/kv_events/key-vectors.json` (computed by the Python script beside it).
//!
//! Requests with a `cache_salt` get no precise match: vLLM salts the hash of their first
//! block, and the events do not say which blocks were salted, so equal tokens do not mean a
//! reusable block. (The caller skips the precise index for them.)
//!
//! # Applying events
//!
//! [`PreciseIndex::apply`], per endpoint:
//! - `BlockStored`: block i's key chains from the key of the block before it — the event's
//!   parent (looked up by engine hash in this endpoint's map), or the seed when there is no
//!   parent — over tokens `i × block_size .. (i + 1) × block_size`. A parent not held here
//!   (stored before the index listened, or evicted) leaves the blocks unkeyed: skipped.
//!   Each stored block becomes the endpoint's newest; at `max_blocks_per_endpoint` the
//!   oldest is evicted first (engines free least recently used blocks; an index that keeps
//!   the newest stays close to that).
//! - `BlockRemoved`: forgets those engine hashes.
//! - `AllBlocksCleared`: forgets the endpoint's blocks and speculative entries.
//!
//! # Speculative entries
//!
//! At pick time the picker records the request's keys for the chosen endpoint with a short
//! expiry ([`PreciseIndex::record_speculative`]), so the next request of a conversation
//! finds them before the engine's event arrives. [`PreciseIndex::matched_blocks`] counts a
//! key as held when confirmed, or speculative and unexpired.
//!
//! # Cost
//!
//! Apply: one XXH3 over each block's tokens and two hash-table operations per block.
//! Match: up to two probes per matched block. Memory: about 45–65 bytes per confirmed block
//! (`store.rs`), 24–40 per speculative key; [`PreciseIndex::memory_bytes`] measures it.

mod index;
pub mod settings;
mod store;
#[cfg(test)]
mod tests;

pub use index::{Applied, PreciseAt, PreciseIndex};
pub use settings::{parse_precise_producer, EventsPort, PreciseSettings};

use crate::types::BlockHash;
use alloc::vec::Vec;
use xxhash_rust::xxh3::xxh3_64;

/// Domain separator of the key seed; bump the version if the algorithm changes.
const KV_DOMAIN: &[u8] = b"infergate-kv-v1";

/// The chain seed of blocks computed for `model` (a served model or a LoRA adapter name).
pub fn kv_seed(model: &str) -> u64 {
    let mut input = Vec::with_capacity(KV_DOMAIN.len() + 8 + model.len());
    input.extend_from_slice(KV_DOMAIN);
    input.extend_from_slice(&(model.len() as u64).to_le_bytes());
    input.extend_from_slice(model.as_bytes());
    xxh3_64(&input)
}

/// The key of a block of `tokens` whose predecessor's key (or the seed) is `prev`;
/// `scratch` is reused for the hashed bytes.
pub(crate) fn chain_key(prev: u64, tokens: &[u32], scratch: &mut Vec<u8>) -> u64 {
    scratch.clear();
    scratch.reserve(8 + 4 * tokens.len());
    scratch.extend_from_slice(&prev.to_le_bytes());
    for t in tokens {
        scratch.extend_from_slice(&t.to_le_bytes());
    }
    xxh3_64(scratch)
}

/// The chained keys of the full blocks of `tokens` (at most `max_blocks`; a trailing
/// partial block is not keyed; none when `block_size` is 0). Module doc for the algorithm.
pub fn token_block_keys(
    seed: u64,
    tokens: &[u32],
    block_size: u32,
    max_blocks: usize,
) -> Vec<BlockHash> {
    let bs = block_size as usize;
    if bs == 0 {
        return Vec::new();
    }
    let n = (tokens.len() / bs).min(max_blocks);
    let mut out = Vec::with_capacity(n);
    let mut scratch = Vec::with_capacity(8 + 4 * bs);
    let mut prev = seed;
    for block in tokens.chunks_exact(bs).take(n) {
        prev = chain_key(prev, block, &mut scratch);
        out.push(BlockHash(prev));
    }
    out
}
