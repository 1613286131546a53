//! The approximate prefix index: per endpoint, which block hashes were recently sent there.
//!
//! # Recording
//!
//! [`PrefixIndex::record`] touches a request's blocks **last block first**, so block 0 ends
//! up most recent and an endpoint's LRU evicts the tail of a prefix before its head (as vLLM
//! frees a finished request's blocks tail first). Together with chaining (hᵢ occurs only
//! after hᵢ₋₁ in any request), this keeps every endpoint's stored set *prefix-closed*: if it
//! holds hᵢ it holds h₀..hᵢ₋₁. A request longer than the bound stores only its first
//! `capacity` blocks.
//!
//! # Matching
//!
//! [`PrefixIndex::match_endpoints`] reports, per endpoint, how many leading blocks of the
//! request are stored. Because stored sets are prefix-closed it checks block 0 (a miss: 0),
//! then the last block (a hit: all), then binary-searches the boundary: 2 lookups for the
//! common cases, ⌈log₂ n⌉ + 2 at worst, instead of walking every matched block. Cost is
//! O(endpoints × log blocks) hash probes; nothing is allocated. Matching does not touch the LRU.
//!
//! # Memory
//!
//! See `lru.rs`: about 22–28 bytes per stored block per endpoint (bound tested: ≤ 48),
//! plus a small fixed cost per endpoint. [`PrefixIndex::memory_bytes`] measures it.

use super::lru::EndpointLru;
use super::PrefixConfig;
use crate::types::BlockHash;
use alloc::boxed::Box;
use alloc::vec::Vec;
use hashbrown::HashMap;

/// Fixed ahash keys for the endpoint-name map: deterministic across processes, never random.
const KEYS: [u64; 4] = [
    0x243f_6a88_85a3_08d3,
    0x1319_8a2e_0370_7344,
    0xa409_3822_299f_31d0,
    0x082e_fa98_ec4e_6c89,
];

fn fixed_state() -> ahash::RandomState {
    ahash::RandomState::with_seeds(KEYS[0], KEYS[1], KEYS[2], KEYS[3])
}

/// Per-endpoint LRU sets of block hashes, keyed by endpoint address (`ip:port`).
#[derive(Debug)]
pub struct PrefixIndex {
    cfg: PrefixConfig,
    endpoints: HashMap<Box<str>, EndpointLru, ahash::RandomState>,
}

impl PrefixIndex {
    /// An empty index; endpoints start with `cfg.lru_capacity_per_server` blocks.
    pub fn new(cfg: PrefixConfig) -> Self {
        PrefixIndex {
            cfg,
            endpoints: HashMap::with_hasher(fixed_state()),
        }
    }

    /// The configuration this index was built with.
    pub fn config(&self) -> &PrefixConfig {
        &self.cfg
    }

    /// Leading blocks of `hashes` recorded for each endpoint, in `endpoints` order (`out` is
    /// cleared first). Unknown endpoints match 0.
    pub fn match_endpoints(&self, endpoints: &[&str], hashes: &[BlockHash], out: &mut Vec<usize>) {
        out.clear();
        out.reserve(endpoints.len());
        // Endpoints tend to share a boundary (e.g. a system prompt cached everywhere): the
        // previous endpoint's answer is checked first as a hint.
        let mut hint = 0;
        for ep in endpoints {
            let m = match self.endpoints.get(*ep) {
                Some(lru) => leading_matches(lru, hashes, hint),
                None => 0,
            };
            out.push(m);
            hint = m;
        }
    }

    /// Leading blocks of `hashes` recorded for one endpoint.
    pub fn match_endpoint(&self, endpoint: &str, hashes: &[BlockHash]) -> usize {
        match self.endpoints.get(endpoint) {
            Some(lru) => leading_matches(lru, hashes, 0),
            None => 0,
        }
    }

    /// Records that a request with these block hashes was routed to `endpoint`.
    pub fn record(&mut self, endpoint: &str, hashes: &[BlockHash]) {
        let lru = self.entry(endpoint);
        // Blocks past the bound would be evicted by the earlier blocks anyway.
        let keep = hashes.len().min(lru.capacity() as usize);
        for &h in hashes.iter().take(keep).rev() {
            lru.touch(h);
        }
    }

    /// Sets the LRU bound of `endpoint` in blocks (e.g. from its `num_gpu_blocks`),
    /// evicting the least recent blocks if it shrinks.
    pub fn set_capacity(&mut self, endpoint: &str, blocks: u32) {
        self.entry(endpoint).set_capacity(blocks);
    }

    /// The LRU bound of `endpoint`, if it is known to the index.
    pub fn capacity(&self, endpoint: &str) -> Option<u32> {
        self.endpoints.get(endpoint).map(EndpointLru::capacity)
    }

    /// Forgets `endpoint` entirely.
    pub fn remove_endpoint(&mut self, endpoint: &str) {
        self.endpoints.remove(endpoint);
    }

    /// Blocks stored for `endpoint`.
    pub fn stored_blocks(&self, endpoint: &str) -> usize {
        self.endpoints.get(endpoint).map_or(0, EndpointLru::len)
    }

    /// Blocks stored over all endpoints.
    pub fn total_blocks(&self) -> usize {
        self.endpoints.values().map(EndpointLru::len).sum()
    }

    /// Endpoints known to the index.
    pub fn endpoint_count(&self) -> usize {
        self.endpoints.len()
    }

    /// Bytes used by the index: tables, nodes, names and the endpoint map itself.
    pub fn memory_bytes(&self) -> usize {
        let per_endpoint: usize = self
            .endpoints
            .iter()
            .map(|(name, lru)| name.len() + lru.memory_bytes())
            .sum();
        core::mem::size_of::<Self>() + self.endpoints.allocation_size() + per_endpoint
    }

    fn entry(&mut self, endpoint: &str) -> &mut EndpointLru {
        let cap = self.cfg.lru_capacity_per_server;
        self.endpoints
            .entry_ref(endpoint)
            .or_insert_with(|| EndpointLru::new(cap))
    }
}

/// Leading stored blocks, relying on the prefix-closed invariant (module doc). `hint` is a
/// likely answer, confirmed with two probes (block `hint - 1` stored, block `hint` not).
fn leading_matches(lru: &EndpointLru, hashes: &[BlockHash], hint: usize) -> usize {
    let (Some(&first), Some(&last)) = (hashes.first(), hashes.last()) else {
        return 0;
    };
    if !lru.contains(first) {
        return 0;
    }
    if let (Some(&below), Some(&at)) = (hashes.get(hint.wrapping_sub(1)), hashes.get(hint)) {
        if lru.contains(below) && !lru.contains(at) {
            return hint;
        }
    }
    if lru.contains(last) {
        return hashes.len();
    }
    // Invariant: block `present` is stored, block `absent` is not.
    let (mut present, mut absent) = (0usize, hashes.len() - 1);
    while absent - present > 1 {
        let mid = present + (absent - present) / 2;
        match hashes.get(mid) {
            Some(&h) if lru.contains(h) => present = mid,
            _ => absent = mid,
        }
    }
    absent
}
