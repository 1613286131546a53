//! Prompt prefix hashing and the approximate prefix index (DESIGN §6).
//!
//! CONTRACT STUB — owned by the request/prefix work. Agreed interface:
//!
//! ```ignore
//! pub struct PrefixConfig { pub block_size_tokens: u32, pub max_prefix_tokens_to_match: u64,
//!                           pub lru_capacity_per_server: u32 }   // defaults 64 / 131072 / 31250
//! pub fn seed(model: &str, cache_salt: Option<&str>) -> u64;
//! pub fn block_hashes(seed: u64, prompt: &[u8], cfg: &PrefixConfig) -> Vec<BlockHash>;
//! pub struct PrefixIndex;
//! impl PrefixIndex {
//!     pub fn new(cfg: PrefixConfig) -> Self;
//!     /// Leading blocks of `hashes` recorded for each endpoint, in `endpoints` order.
//!     pub fn match_endpoints(&self, endpoints: &[&str], hashes: &[BlockHash], out: &mut Vec<usize>);
//!     pub fn record(&mut self, endpoint: &str, hashes: &[BlockHash]);
//!     pub fn set_capacity(&mut self, endpoint: &str, blocks: u32);
//!     pub fn remove_endpoint(&mut self, endpoint: &str);
//!     pub fn stored_blocks(&self, endpoint: &str) -> usize;
//! }
//! ```
