//! The approximate prefix index: per endpoint, which block hashes were recently sent there.
//!
//! # Recording
//!
//! [`PrefixIndex::record`] touches a request's blocks **last block first**, so block 0 ends
//! up most recent and an endpoint's LRU evicts the tail of a prefix before its head (as vLLM
//! frees a finished request's blocks tail first). Together with chaining (hᵢ occurs only
//! after hᵢ₋₁ in any request), this keeps every endpoint's stored set *prefix-closed*: if it
//! holds hᵢ it holds h₀..hᵢ₋₁. A request longer than the bound stores only its first
//! `capacity` blocks. The blocks an endpoint already holds (a conversation's previous
//! turn) are moved to the front a segment of its list at a time, with the same result as
//! touching them one by one: one table probe per segment instead of one per block. The new
//! blocks go in first, and only when they evict nothing (otherwise every block is touched
//! one by one: the held ones could be the ones evicted).
//!
//! # Matching
//!
//! [`PrefixIndex::match_endpoints`] reports, per endpoint, how many leading blocks of the
//! request are stored. Because stored sets are prefix-closed, an endpoint holds some of the
//! request exactly when it holds block 0 as the first block of a recorded request (a *head*,
//! see `heads.rs`), so one probe of the head table yields the endpoints holding anything;
//! every other endpoint matches 0 without a probe of its own. For each holder, a likely
//! answer is confirmed with two probes (block `m - 1` stored, block `m` not): the length
//! of the last request recorded there with this head (one probe when the endpoint has
//! evicted nothing since and the prompt has that request's last block at that depth: the
//! block is then known to be stored; none when that is the whole prompt), then the previous
//! holder's answer
//! (endpoints tend to share a boundary, e.g. a system prompt cached everywhere); failing
//! both, the last block (a hit: all), then a binary search of the boundary,
//! ⌈log₂ n⌉ + 5 probes at worst. [`PrefixIndex::holders`] costs O(holders × log blocks)
//! whatever the number of endpoints; [`PrefixIndex::match_endpoints`] adds one name lookup
//! per endpoint asked about, only when some endpoint holds the head. Matching does not
//! touch the LRU.
//!
//! # Memory
//!
//! See `lru.rs`: about 22–28 bytes per stored block per endpoint (bound tested: ≤ 32 with
//! 128-block requests), plus about 50 bytes per head per endpoint (`heads.rs` and the
//! endpoint's own head table: a fraction of a byte per block for long requests, more for
//! requests of a few blocks) and a small fixed cost per endpoint.
//! [`PrefixIndex::memory_bytes`] measures it.

use super::heads::{Heads, Hint};
use super::lru::EndpointLru;
use super::PrefixConfig;
use crate::types::BlockHash;
use alloc::boxed::Box;
use alloc::vec::Vec;
use hashbrown::{HashMap, HashTable};

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

/// Largest endpoint list [`PrefixIndex::match_names`] may ask endpoint by endpoint (beyond
/// it, walking the holders and filling a scratch table by slot is cheaper even when most
/// endpoints hold the head: the holder list is walked in memory order).
const DIRECT_MAX: usize = 128;

/// One endpoint: its LRU and the heads it holds (head hash, holder index in [`Heads`]).
#[derive(Debug)]
struct Endpoint {
    name: Box<str>,
    lru: EndpointLru,
    heads: HashTable<(u64, u32)>,
    /// Blocks evicted from `lru` so far (saturating; `u32::MAX` means "too many to tell"):
    /// while it has not moved since a request was recorded, all of its blocks are stored.
    evictions: u32,
}

impl Endpoint {
    /// The holder index of `head` on this endpoint, if it holds it as a head.
    fn holder(&self, head: BlockHash) -> Option<u32> {
        self.heads
            .find(head.0, |e| e.0 == head.0)
            .map(|&(_, holder)| holder)
    }

    /// The matched blocks of `hashes` on this endpoint, which holds `hashes[0]` as a head
    /// with `hint`; `previous` is another likely answer.
    fn leading(&self, hint: Hint, hashes: &[BlockHash], previous: usize) -> usize {
        let depth = hint.depth as usize;
        let unmoved = hint.epoch == self.evictions && self.evictions != u32::MAX;
        let known = unmoved && depth > 0 && hashes.get(depth - 1).is_some_and(|h| h.0 == hint.last);
        leading_matches(&self.lru, hashes, [depth, previous], known)
    }

    fn memory_bytes(&self) -> usize {
        self.name.len() + self.lru.memory_bytes() + self.heads.allocation_size()
    }
}

/// Per-endpoint LRU sets of block hashes, keyed by endpoint address (`ip:port`).
#[derive(Debug)]
pub struct PrefixIndex {
    cfg: PrefixConfig,
    /// Endpoint name → slot in `slots`.
    names: HashMap<Box<str>, u32, ahash::RandomState>,
    slots: Vec<Option<Endpoint>>,
    /// Slots freed by [`PrefixIndex::remove_endpoint`], reused first.
    free_slots: Vec<u32>,
    heads: Heads,
    /// Scratch of [`PrefixIndex::record`]: the list segments of the blocks it holds.
    segments: Vec<(u32, u32)>,
}

impl PrefixIndex {
    /// An empty index; endpoints start with `cfg.lru_capacity_per_server` blocks.
    pub fn new(cfg: PrefixConfig) -> Self {
        PrefixIndex {
            cfg,
            names: HashMap::with_hasher(fixed_state()),
            slots: Vec::new(),
            free_slots: Vec::new(),
            heads: Heads::new(),
            segments: Vec::new(),
        }
    }

    /// The configuration this index was built with.
    pub fn config(&self) -> &PrefixConfig {
        &self.cfg
    }

    /// Leading blocks of `hashes` recorded for each endpoint, in `endpoints` order (`out` is
    /// cleared first). Unknown endpoints match 0.
    pub fn match_endpoints(&self, endpoints: &[&str], hashes: &[BlockHash], out: &mut Vec<usize>) {
        self.match_names(endpoints.iter().copied(), hashes, out);
    }

    /// Like [`PrefixIndex::match_endpoints`], for any sequence of names (walked at most once,
    /// and not at all when no endpoint holds the request's first block). The holders are
    /// walked and the names looked up once each, except for a short list (at most 128) of
    /// which a quarter or more hold the head: then each endpoint is asked directly (its head
    /// table, then its LRU).
    pub fn match_names<'n>(
        &self,
        endpoints: impl ExactSizeIterator<Item = &'n str>,
        hashes: &[BlockHash],
        out: &mut Vec<usize>,
    ) {
        out.clear();
        out.resize(endpoints.len(), 0);
        let Some(&first) = hashes.first() else {
            return;
        };
        let holding = self.heads.holder_count(first);
        if holding == 0 {
            return;
        }
        if out.len() <= DIRECT_MAX && holding.saturating_mul(4) >= out.len() {
            // A few endpoints, most holding the head: ask each one directly (no scratch).
            let (mut previous, mut guess) = (0, 0);
            for (o, name) in out.iter_mut().zip(endpoints) {
                let Some(slot) = self.slot_of(name, guess) else {
                    continue;
                };
                guess = slot.wrapping_add(1);
                let Some(Some(ep)) = self.slots.get(slot as usize) else {
                    continue;
                };
                if let Some(holder) = ep.holder(first) {
                    *o = ep.leading(self.heads.hint(holder), hashes, previous);
                    previous = *o;
                }
            }
            return;
        }
        // Holder slot → matched blocks, for the name lookups below.
        let mut matched = alloc::vec![0usize; self.slots.len()];
        self.for_each_holder(hashes, |slot, m| {
            if let Some(x) = matched.get_mut(slot as usize) {
                *x = m;
            }
        });
        let mut guess = 0;
        for (o, name) in out.iter_mut().zip(endpoints) {
            if let Some(slot) = self.slot_of(name, guess) {
                *o = matched.get(slot as usize).copied().unwrap_or(0);
                guess = slot.wrapping_add(1);
            }
        }
    }

    /// Every endpoint holding some of `hashes`, with its leading blocks recorded (`out` is
    /// cleared first; most recently added holder first). Endpoints holding nothing of the
    /// request are not visited: the cost is O(holders × log blocks).
    pub fn holders<'s>(&'s self, hashes: &[BlockHash], out: &mut Vec<(&'s str, usize)>) {
        out.clear();
        let slots = &self.slots;
        self.for_each_holder(hashes, |slot, m| {
            if let Some(Some(ep)) = slots.get(slot as usize) {
                out.push((&ep.name, m));
            }
        });
    }

    /// Calls `f(slot, matched)` for every endpoint holding `hashes[0]` as a head.
    fn for_each_holder(&self, hashes: &[BlockHash], mut f: impl FnMut(u32, usize)) {
        let Some(&first) = hashes.first() else {
            return;
        };
        let mut previous = 0;
        for holder in self.heads.holders_of(first) {
            let Some(Some(ep)) = self.slots.get(holder.endpoint as usize) else {
                continue;
            };
            let m = ep.leading(holder.hint(), hashes, previous);
            f(holder.endpoint, m);
            previous = m;
        }
    }

    /// Leading blocks of `hashes` recorded for one endpoint.
    pub fn match_endpoint(&self, endpoint: &str, hashes: &[BlockHash]) -> usize {
        let (Some(ep), Some(&first)) = (self.endpoint(endpoint), hashes.first()) else {
            return 0;
        };
        match ep.holder(first) {
            Some(holder) => ep.leading(self.heads.hint(holder), hashes, 0),
            None => 0,
        }
    }

    /// Records that a request with these block hashes was routed to `endpoint`.
    pub fn record(&mut self, endpoint: &str, hashes: &[BlockHash]) {
        let slot = self.slot_for(endpoint);
        let Some(Some(ep)) = self.slots.get_mut(slot as usize) else {
            return;
        };
        // Blocks past the bound would be evicted by the earlier blocks anyway.
        let keep = hashes.len().min(ep.lru.capacity() as usize);
        // The blocks it already holds move to the front by segments of the list (a
        // conversation's previous turn: one or two); only new ones are touched one by one.
        // New blocks go in first, which must not evict: the held ones could be the victims.
        let request = hashes.get(..keep).unwrap_or(&[]);
        let held = ep.lru.stored_segments(request, &mut self.segments);
        let fresh = match request.get(held..) {
            Some(fresh) if held > 0 && fresh.len() <= ep.lru.room() => fresh,
            _ => {
                self.segments.clear();
                request
            }
        };
        for &h in fresh.iter().rev() {
            if let Some(evicted) = ep.lru.touch(h) {
                ep.evictions = ep.evictions.saturating_add(1);
                drop_head(ep, &mut self.heads, evicted);
            }
        }
        ep.lru.move_segments_to_front(&self.segments);
        let (Some(&first), Some(&last)) = (
            hashes.first().filter(|_| keep > 0),
            hashes.get(keep.wrapping_sub(1)),
        ) else {
            return;
        };
        let hint = Hint {
            depth: u32::try_from(keep).unwrap_or(u32::MAX),
            last: last.0,
            epoch: ep.evictions,
        };
        match ep.holder(first) {
            Some(holder) => self.heads.set_hint(holder, hint),
            None => {
                let holder = self.heads.add(first, slot, hint);
                ep.heads.insert_unique(first.0, (first.0, holder), |e| e.0);
            }
        }
    }

    /// Sets the LRU bound of `endpoint` in blocks (e.g. from its `num_gpu_blocks`),
    /// evicting the least recent blocks if it shrinks.
    pub fn set_capacity(&mut self, endpoint: &str, blocks: u32) {
        let slot = self.slot_for(endpoint);
        let Some(Some(ep)) = self.slots.get_mut(slot as usize) else {
            return;
        };
        if blocks < ep.lru.capacity() {
            ep.evictions = ep.evictions.saturating_add(1);
        }
        ep.lru.set_capacity(blocks);
        let (lru, heads) = (&ep.lru, &mut self.heads);
        ep.heads.retain(|&mut (h, holder)| {
            let kept = lru.contains(BlockHash(h));
            if !kept {
                heads.remove(BlockHash(h), holder);
            }
            kept
        });
    }

    /// The LRU bound of `endpoint`, if it is known to the index.
    pub fn capacity(&self, endpoint: &str) -> Option<u32> {
        self.endpoint(endpoint).map(|ep| ep.lru.capacity())
    }

    /// Forgets `endpoint` entirely.
    pub fn remove_endpoint(&mut self, endpoint: &str) {
        let Some(slot) = self.names.remove(endpoint) else {
            return;
        };
        if let Some(Some(ep)) = self.slots.get_mut(slot as usize).map(Option::take) {
            for &(h, holder) in ep.heads.iter() {
                self.heads.remove(BlockHash(h), holder);
            }
            self.free_slots.push(slot);
        }
    }

    /// Blocks stored for `endpoint`.
    pub fn stored_blocks(&self, endpoint: &str) -> usize {
        self.endpoint(endpoint).map_or(0, |ep| ep.lru.len())
    }

    /// Blocks stored over all endpoints.
    pub fn total_blocks(&self) -> usize {
        self.endpoints().map(|ep| ep.lru.len()).sum()
    }

    /// Endpoints known to the index.
    pub fn endpoint_count(&self) -> usize {
        self.names.len()
    }

    /// Heads stored over all endpoints (one per endpoint per distinct first block).
    pub fn total_heads(&self) -> usize {
        self.heads.len()
    }

    /// Bytes used by the index: tables, nodes, names, heads and the endpoint map itself.
    pub fn memory_bytes(&self) -> usize {
        let names: usize = self.names.keys().map(|n| n.len()).sum();
        let per_endpoint: usize = self.endpoints().map(Endpoint::memory_bytes).sum();
        core::mem::size_of::<Self>()
            + self.names.allocation_size()
            + names
            + self.slots.capacity() * core::mem::size_of::<Option<Endpoint>>()
            + self.free_slots.capacity() * core::mem::size_of::<u32>()
            + per_endpoint
            + self.heads.memory_bytes()
    }

    /// Panics unless the head lists and every endpoint's head table agree, and every head
    /// is stored in its endpoint's LRU.
    #[cfg(test)]
    #[allow(clippy::panic)]
    pub(crate) fn check_heads(&self) {
        let mut count = 0;
        for (slot, ep) in self.slots.iter().enumerate() {
            let Some(ep) = ep else { continue };
            for &(h, holder) in ep.heads.iter() {
                count += 1;
                assert!(ep.lru.contains(BlockHash(h)), "head not stored");
                let listed = self
                    .heads
                    .holders_of(BlockHash(h))
                    .filter(|x| x.endpoint as usize == slot)
                    .count();
                assert_eq!(listed, 1, "holder {holder} listed {listed} times");
                let all = self.heads.holders_of(BlockHash(h)).count();
                assert_eq!(all, self.heads.holder_count(BlockHash(h)), "head count");
            }
        }
        assert_eq!(count, self.heads.len());
    }

    fn endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        self.slots.iter().flatten()
    }

    /// The slot of `name`, trying slot `guess` first (names are unique among live slots, so
    /// a live slot of that name is its slot): callers asking in the order endpoints were
    /// added find each one without hashing its name.
    fn slot_of(&self, name: &str, guess: u32) -> Option<u32> {
        match self.slots.get(guess as usize) {
            Some(Some(ep)) if *ep.name == *name => Some(guess),
            _ => self.names.get(name).copied(),
        }
    }

    fn endpoint(&self, endpoint: &str) -> Option<&Endpoint> {
        let slot = *self.names.get(endpoint)?;
        self.slots.get(slot as usize)?.as_ref()
    }

    /// The slot of `endpoint`, created with the default bound if it is new.
    fn slot_for(&mut self, endpoint: &str) -> u32 {
        if let Some(&slot) = self.names.get(endpoint) {
            return slot;
        }
        let ep = Endpoint {
            name: endpoint.into(),
            lru: EndpointLru::new(self.cfg.lru_capacity_per_server),
            heads: HashTable::new(),
            evictions: 0,
        };
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                if let Some(s) = self.slots.get_mut(slot as usize) {
                    *s = Some(ep);
                }
                slot
            }
            None => {
                self.slots.push(Some(ep));
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        self.names.insert(endpoint.into(), slot);
        slot
    }
}

/// Forgets `evicted` as a head of `ep`, if it was one.
fn drop_head(ep: &mut Endpoint, heads: &mut Heads, evicted: BlockHash) {
    if ep.heads.is_empty() {
        return;
    }
    if let Ok(entry) = ep.heads.find_entry(evicted.0, |e| e.0 == evicted.0) {
        let ((_, holder), _) = entry.remove();
        heads.remove(evicted, holder);
    }
}

/// Leading stored blocks of an endpoint known to hold `hashes[0]`, relying on the
/// prefix-closed invariant (module doc). Each of `hints` is a likely answer, confirmed with
/// two probes (block `hint - 1` stored, block `hint` not). `known`: block `hints[0] - 1` is
/// known to be stored (nothing was evicted since a request ending with it was recorded), so
/// the first hint needs one probe (none when it covers all of `hashes`).
fn leading_matches(
    lru: &EndpointLru,
    hashes: &[BlockHash],
    hints: [usize; 2],
    known: bool,
) -> usize {
    let Some(&last) = hashes.last() else {
        return 0;
    };
    let n = hashes.len();
    if known {
        let [hint, _] = hints;
        match hashes.get(hint) {
            None if hint == n => return n,
            Some(&at) if !lru.contains(at) => return hint,
            _ => {}
        }
    }
    for hint in hints {
        if hint == n {
            if lru.contains(last) {
                return n;
            }
            continue;
        }
        if let (Some(&below), Some(&at)) = (hashes.get(hint.wrapping_sub(1)), hashes.get(hint)) {
            if lru.contains(below) && !lru.contains(at) {
                return hint;
            }
        }
    }
    if lru.contains(last) {
        return n;
    }
    // Invariant: block `present` is stored, block `absent` is not.
    let (mut present, mut absent) = (0usize, n - 1);
    while absent - present > 1 {
        let mid = present + (absent - present) / 2;
        match hashes.get(mid) {
            Some(&h) if lru.contains(h) => present = mid,
            _ => absent = mid,
        }
    }
    absent
}
