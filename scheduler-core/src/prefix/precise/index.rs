//! [`PreciseIndex`]: which endpoint holds which block, as its engine reports it.

use super::store::BlockStore;
use super::{chain_key, kv_seed};
#[cfg(test)]
use crate::kv_events::EngineBlockHash;
use crate::kv_events::KvEvent;
use crate::scheduling::PrefixMatch;
use crate::types::{BlockHash, Millis};
use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::vec::Vec;
use hashbrown::{HashMap, HashTable};

/// Fixed ahash keys for the endpoint-name map: deterministic, never random.
const KEYS: [u64; 4] = [
    0x4528_21e6_38d0_1377,
    0xbe54_66cf_34e9_0c6c,
    0xc0ac_29b7_c97c_50dd,
    0x3f84_d5b5_b547_0917,
];

fn fixed_state() -> ahash::RandomState {
    ahash::RandomState::with_seeds(KEYS[0], KEYS[1], KEYS[2], KEYS[3])
}

/// What one [`PreciseIndex::apply`] changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Blocks newly stored.
    pub stored: u32,
    /// Blocks forgotten on the engine's `BlockRemoved`.
    pub removed: u32,
    /// Blocks evicted by the per-endpoint bound.
    pub evicted: u32,
    /// Blocks of a `BlockStored` not stored: their parent is unknown here (stored before
    /// this index listened, or evicted), or the event has too few tokens for them, or its
    /// block size is 0.
    pub skipped: u32,
    /// Blocks dropped by `AllBlocksCleared`.
    pub cleared: u32,
}

/// Speculative entries of one endpoint: keys a pick sent there, until they expire.
#[derive(Debug, Default)]
struct Speculative {
    /// Key → expiry (the latest recorded).
    table: HashTable<(u64, Millis)>,
    /// Keys in recording order with the expiry they were recorded with.
    order: VecDeque<(u64, Millis)>,
}

impl Speculative {
    fn holds(&self, key: BlockHash, now: Millis) -> bool {
        self.table
            .find(key.0, |e| e.0 == key.0)
            .is_some_and(|e| e.1 > now)
    }

    fn record(&mut self, key: BlockHash, expires_at: Millis, capacity: usize) {
        if capacity == 0 {
            return;
        }
        while self.order.len() >= capacity {
            self.pop_oldest();
        }
        match self.table.find_mut(key.0, |e| e.0 == key.0) {
            Some(e) => e.1 = e.1.max(expires_at),
            None => {
                self.table
                    .insert_unique(key.0, (key.0, expires_at), |e| e.0);
            }
        }
        self.order.push_back((key.0, expires_at));
    }

    /// Drops the oldest record; its table entry goes too unless a later record extended it.
    fn pop_oldest(&mut self) {
        if let Some((k, at)) = self.order.pop_front() {
            if let Ok(e) = self.table.find_entry(k, |e| e.0 == k) {
                if e.get().1 <= at {
                    e.remove();
                }
            }
        }
    }

    fn expire(&mut self, now: Millis) {
        while self.order.front().is_some_and(|&(_, at)| at <= now) {
            self.pop_oldest();
        }
    }

    fn memory_bytes(&self) -> usize {
        self.table.capacity() * (core::mem::size_of::<(u64, Millis)>() + 1)
            + self.order.capacity() * core::mem::size_of::<(u64, Millis)>()
    }
}

#[derive(Debug)]
struct Endpoint {
    blocks: BlockStore,
    speculative: Speculative,
}

impl Endpoint {
    fn new() -> Self {
        Endpoint {
            blocks: BlockStore::new(),
            speculative: Speculative::default(),
        }
    }

    fn holds(&self, key: BlockHash, now: Millis) -> bool {
        self.blocks.holds_key(key) || self.speculative.holds(key, now)
    }
}

/// Per endpoint, the blocks its engine reported stored (confirmed) and the blocks picks
/// sent there lately (speculative, until they expire). See the module doc.
#[derive(Debug)]
pub struct PreciseIndex {
    endpoints: HashMap<String, Endpoint, ahash::RandomState>,
    max_blocks: u32,
    /// One block's bytes for hashing (`le8(parent key) ‖ le4 tokens`), reused.
    scratch: Vec<u8>,
}

impl PreciseIndex {
    /// An empty index holding at most `max_blocks_per_endpoint` confirmed blocks per
    /// endpoint (and as many speculative ones).
    pub fn new(max_blocks_per_endpoint: u32) -> Self {
        PreciseIndex {
            endpoints: HashMap::with_hasher(fixed_state()),
            max_blocks: max_blocks_per_endpoint,
            scratch: Vec::new(),
        }
    }

    /// The per-endpoint bound in blocks.
    pub fn max_blocks_per_endpoint(&self) -> u32 {
        self.max_blocks
    }

    fn entry(&mut self, endpoint: &str) -> &mut Endpoint {
        self.endpoints
            .entry_ref(endpoint)
            .or_insert_with(Endpoint::new)
    }

    /// Applies one event published by `endpoint`'s engine serving `model` (the topic's
    /// model: the seed of blocks stored without a LoRA name).
    pub fn apply(&mut self, endpoint: &str, model: &str, ev: &KvEvent) -> Applied {
        let mut out = Applied::default();
        match ev {
            KvEvent::BlockStored {
                block_hashes,
                parent,
                token_ids,
                block_size,
                lora_name,
            } => {
                let cap = self.max_blocks;
                let mut scratch = core::mem::take(&mut self.scratch);
                let e = self.entry(endpoint);
                let start = match parent {
                    None => Some(kv_seed(lora_name.as_deref().unwrap_or(model))),
                    Some(p) => e.blocks.key_of(*p).map(|k| k.0),
                };
                let bs = *block_size as usize;
                let mut prev = start;
                for (i, h) in block_hashes.iter().enumerate() {
                    let tokens = i
                        .checked_mul(bs)
                        .and_then(|a| Some(a..a.checked_add(bs)?))
                        .and_then(|r| token_ids.get(r));
                    match (prev, tokens) {
                        (Some(p), Some(t)) if bs > 0 => {
                            let k = chain_key(p, t, &mut scratch);
                            let (new, evicted) = e.blocks.insert(*h, BlockHash(k), cap);
                            out.stored += u32::from(new);
                            out.evicted += evicted;
                            prev = Some(k);
                        }
                        _ => {
                            out.skipped += 1;
                            prev = None;
                        }
                    }
                }
                self.scratch = scratch;
            }
            KvEvent::BlockRemoved { block_hashes } => {
                if let Some(e) = self.endpoints.get_mut(endpoint) {
                    for h in block_hashes {
                        out.removed += u32::from(e.blocks.remove(*h));
                    }
                }
            }
            KvEvent::AllBlocksCleared => {
                if let Some(e) = self.endpoints.get_mut(endpoint) {
                    out.cleared = u32::try_from(e.blocks.len()).unwrap_or(u32::MAX);
                    e.blocks.clear();
                    e.speculative = Speculative::default();
                }
            }
        }
        out
    }

    /// Forgets everything about `endpoint` (confirmed and speculative) but keeps it known:
    /// a restart, or a gap in its event stream.
    pub fn clear_endpoint(&mut self, endpoint: &str) {
        if let Some(e) = self.endpoints.get_mut(endpoint) {
            *e = Endpoint::new();
        }
    }

    /// Drops `endpoint` (left the pool).
    pub fn remove_endpoint(&mut self, endpoint: &str) {
        self.endpoints.remove(endpoint);
    }

    /// Records that a pick sent blocks `keys` to `endpoint`: they count as held until
    /// `expires_at` (or until the engine's own events confirm them). At most
    /// `max_blocks_per_endpoint` speculative keys per endpoint; the oldest go first.
    pub fn record_speculative(&mut self, endpoint: &str, keys: &[BlockHash], expires_at: Millis) {
        let cap = self.max_blocks as usize;
        let e = self.entry(endpoint);
        for k in keys.iter().take(cap) {
            e.speculative.record(*k, expires_at, cap);
        }
    }

    /// Drops speculative entries expired at `now` (they already stop counting at their
    /// expiry; this frees their memory). Cost: the expired entries.
    pub fn expire(&mut self, now: Millis) {
        for e in self.endpoints.values_mut() {
            e.speculative.expire(now);
        }
    }

    /// How many leading blocks of `keys` `endpoint` holds at `now`: the longest run from
    /// block 0 of keys confirmed, or speculative and unexpired. 0 for an unknown endpoint.
    pub fn matched_blocks(&self, endpoint: &str, keys: &[BlockHash], now: Millis) -> usize {
        match self.endpoints.get(endpoint) {
            Some(e) => keys.iter().take_while(|k| e.holds(**k, now)).count(),
            None => 0,
        }
    }

    /// A view for the scheduler at `now` (the prefix-cache scorer reads it).
    pub fn at(&self, now: Millis) -> PreciseAt<'_> {
        PreciseAt { index: self, now }
    }

    /// Confirmed blocks held for `endpoint`.
    pub fn stored_blocks(&self, endpoint: &str) -> usize {
        self.endpoints.get(endpoint).map_or(0, |e| e.blocks.len())
    }

    /// Confirmed blocks over every endpoint.
    pub fn total_blocks(&self) -> usize {
        self.endpoints.values().map(|e| e.blocks.len()).sum()
    }

    /// Endpoints known.
    pub fn endpoint_count(&self) -> usize {
        self.endpoints.len()
    }

    /// Heap bytes held (tables, slots, speculative entries, endpoint names).
    pub fn memory_bytes(&self) -> usize {
        let per = core::mem::size_of::<(String, Endpoint)>() + 1;
        self.endpoints.capacity() * per
            + self
                .endpoints
                .iter()
                .map(|(k, e)| k.capacity() + e.blocks.memory_bytes() + e.speculative.memory_bytes())
                .sum::<usize>()
            + self.scratch.capacity()
    }

    /// Engine hashes of `endpoint` from newest to oldest (tests).
    #[cfg(test)]
    pub(crate) fn order(&self, endpoint: &str) -> Vec<u64> {
        self.endpoints
            .get(endpoint)
            .map_or_else(Vec::new, |e| e.blocks.order())
    }

    /// Our key of an engine block held by `endpoint` (tests).
    #[cfg(test)]
    pub(crate) fn key_of(&self, endpoint: &str, h: EngineBlockHash) -> Option<BlockHash> {
        self.endpoints.get(endpoint)?.blocks.key_of(h)
    }
}

/// [`PreciseIndex`] at one instant, as the scheduler's [`PrefixMatch`].
#[derive(Clone, Copy, Debug)]
pub struct PreciseAt<'a> {
    index: &'a PreciseIndex,
    now: Millis,
}

impl PrefixMatch for PreciseAt<'_> {
    fn matched_blocks(&self, endpoint: &str, hashes: &[BlockHash]) -> usize {
        self.index.matched_blocks(endpoint, hashes, self.now)
    }
}
