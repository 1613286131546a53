//! Prompt prefix hashing and the approximate prefix index.
//!
//! # Block hashes (version 1)
//!
//! The canonical prompt byte stream ([`crate::request`]) is cut into blocks of
//! `block_size_tokens` × 4 bytes (4 bytes per estimated token). A trailing partial block is
//! not hashed, and at most `max_prefix_tokens_to_match / block_size_tokens` blocks are.
//! With `H` = XXH3-64 with its default secret and seed 0 (`xxh3_64`, as in the reference
//! xxHash library; Python: `xxhash.xxh3_64_intdigest`), and `le8(x)` the 8 little-endian
//! bytes of a `u64`:
//!
//! ```text
//! seed = H("infergate-prefix-v1" ‖ le8(len(model)) ‖ model ‖ 0x00)                 no cache_salt
//! seed = H("infergate-prefix-v1" ‖ le8(len(model)) ‖ model ‖ 0x01 ‖ le8(len(salt)) ‖ salt)
//! h₀   = H(le8(seed) ‖ block₀)
//! hᵢ   = H(le8(hᵢ₋₁) ‖ blockᵢ)
//! ```
//!
//! `model` is the target model name sent upstream and `salt` vLLM's `cache_salt` (an empty
//! salt differs from none). The length prefixes make the seed input unambiguous. Because each
//! hash covers everything before it, equal hᵢ means an equal prefix through block i, for the
//! same model and salt. The algorithm is pure integer arithmetic on bytes: identical on
//! wasm32 and x86_64, in every process. Test vectors: `testdata/hash-vectors.json`.
//!
//! # Index
//!
//! [`PrefixIndex`] remembers, per endpoint, the block hashes of requests routed there, in an
//! LRU bounded in blocks. See `index.rs` for the structure and its cost.

mod heads;
mod index;
mod lru;
pub mod precise;
#[cfg(test)]
mod tests;

pub use index::PrefixIndex;

use crate::types::BlockHash;
use alloc::vec::Vec;
use xxhash_rust::xxh3::xxh3_64;

/// Bytes of canonical prompt per estimated token.
pub const BYTES_PER_TOKEN: usize = 4;

/// Domain separator of the seed derivation; bump the version if the algorithm changes.
const SEED_DOMAIN: &[u8] = b"infergate-prefix-v1";

/// Parameters of the `approx-prefix-cache-producer` plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixConfig {
    /// Tokens per block (`blockSizeTokens`, default 64).
    pub block_size_tokens: u32,
    /// Hash and match at most this many leading tokens (`maxPrefixTokensToMatch`, default 131072).
    pub max_prefix_tokens_to_match: u64,
    /// Default per-endpoint LRU bound in blocks (`lruCapacityPerServer`, default 31250).
    pub lru_capacity_per_server: u32,
}

impl Default for PrefixConfig {
    fn default() -> Self {
        PrefixConfig {
            block_size_tokens: 64,
            max_prefix_tokens_to_match: 131_072,
            lru_capacity_per_server: 31_250,
        }
    }
}

impl PrefixConfig {
    /// Bytes per block (`block_size_tokens` × 4).
    pub fn block_bytes(&self) -> usize {
        (self.block_size_tokens as usize).saturating_mul(BYTES_PER_TOKEN)
    }

    /// Most blocks hashed for one request.
    pub fn max_blocks(&self) -> usize {
        match self.block_size_tokens {
            0 => 0,
            b => usize::try_from(self.max_prefix_tokens_to_match / u64::from(b))
                .unwrap_or(usize::MAX),
        }
    }

    /// The most leading prompt bytes hashing ever reads (`max_prefix_tokens_to_match` × 4):
    /// what [`crate::request::parse_with_limit`] needs to store.
    pub fn max_prompt_bytes(&self) -> usize {
        usize::try_from(self.max_prefix_tokens_to_match)
            .unwrap_or(usize::MAX)
            .saturating_mul(BYTES_PER_TOKEN)
    }

    /// Full blocks in a prompt of `prompt_len` bytes (before the `max_prefix_tokens_to_match` cap).
    pub fn full_blocks(&self, prompt_len: usize) -> usize {
        prompt_len.checked_div(self.block_bytes()).unwrap_or(0)
    }
}

/// The chain seed for a target model and optional `cache_salt` (module doc).
pub fn seed(model: &str, cache_salt: Option<&str>) -> u64 {
    let salt_len = cache_salt.map_or(0, |s| 8 + s.len());
    let mut input = Vec::with_capacity(SEED_DOMAIN.len() + 8 + model.len() + 1 + salt_len);
    input.extend_from_slice(SEED_DOMAIN);
    input.extend_from_slice(&(model.len() as u64).to_le_bytes());
    input.extend_from_slice(model.as_bytes());
    match cache_salt {
        None => input.push(0),
        Some(salt) => {
            input.push(1);
            input.extend_from_slice(&(salt.len() as u64).to_le_bytes());
            input.extend_from_slice(salt.as_bytes());
        }
    }
    xxh3_64(&input)
}

/// The chained block hashes of `prompt` (module doc).
pub fn block_hashes(seed: u64, prompt: &[u8], cfg: &PrefixConfig) -> Vec<BlockHash> {
    let mut out = Vec::new();
    block_hashes_into(seed, prompt, cfg, &mut out);
    out
}

/// Like [`block_hashes`], reusing `out` (cleared first).
pub fn block_hashes_into(seed: u64, prompt: &[u8], cfg: &PrefixConfig, out: &mut Vec<BlockHash>) {
    out.clear();
    let block = cfg.block_bytes();
    if block == 0 {
        return;
    }
    let blocks = cfg.full_blocks(prompt.len()).min(cfg.max_blocks());
    out.reserve_exact(blocks);
    // One scratch buffer holds le8(previous) ‖ block, so each block is hashed in one call.
    let mut scratch = Vec::with_capacity(8 + block);
    let mut prev = seed;
    for chunk in prompt.chunks_exact(block).take(blocks) {
        scratch.clear();
        scratch.extend_from_slice(&prev.to_le_bytes());
        scratch.extend_from_slice(chunk);
        prev = xxh3_64(&scratch);
        out.push(BlockHash(prev));
    }
}

/// Seed and block hashes for a parsed request routed under `target_model`.
pub fn request_hashes(
    target_model: &str,
    cache_salt: Option<&str>,
    prompt: &[u8],
    cfg: &PrefixConfig,
) -> Vec<BlockHash> {
    block_hashes(seed(target_model, cache_salt), prompt, cfg)
}
