//! The KV block pool of one replica, modelled on vLLM's prefix-caching block manager.
//!
//! The pool holds `num_blocks` fixed-size blocks. A block is either referenced by one or more
//! running sequences, or free. Free blocks sit in one queue ordered by the time they were freed
//! (least recently freed first): allocation takes the head, and if that block still carries a
//! prefix hash the hash is forgotten (an eviction). A free block whose hash is looked up again
//! is "touched": it leaves the free queue and is shared, so prefix caching costs no extra
//! memory. Sequences free their blocks tail first, so the end of a prompt is evicted before
//! its beginning, as in vLLM.
//!
//! When its [`CacheLog`] is enabled the pool records evictions and resets for the engine's
//! KV events (see [`super::cache_events`]).

use std::collections::{BTreeMap, HashMap};

use super::cache_events::{CacheEvent, CacheLog};

/// A chained hash of one full block of prompt tokens (and every block before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u64);

/// Index of a physical block in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockId(u32);

#[derive(Debug, Default, Clone)]
struct Block {
    ref_count: u32,
    hash: Option<BlockHash>,
    /// Position in the free queue while the block is free.
    free_stamp: Option<u64>,
}

/// The pool of KV blocks with its prefix-hash index and free (LRU) queue.
#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    cached: HashMap<BlockHash, BlockId>,
    free_queue: BTreeMap<u64, BlockId>,
    next_stamp: u64,
    evictions: u64,
    log: CacheLog,
}

impl BlockPool {
    /// A pool of `num_blocks` empty, free blocks.
    pub fn new(num_blocks: u32) -> Self {
        let mut pool = Self {
            blocks: vec![Block::default(); num_blocks as usize],
            cached: HashMap::new(),
            free_queue: BTreeMap::new(),
            next_stamp: 0,
            evictions: 0,
            log: CacheLog::default(),
        };
        for i in 0..num_blocks {
            pool.push_free(BlockId(i));
        }
        pool
    }

    /// Total number of blocks.
    pub fn num_blocks(&self) -> u32 {
        u32::try_from(self.blocks.len()).unwrap_or(u32::MAX)
    }

    /// Blocks not referenced by any sequence (cached or not).
    pub fn num_free(&self) -> u32 {
        u32::try_from(self.free_queue.len()).unwrap_or(u32::MAX)
    }

    /// Blocks whose content is findable by hash (referenced or free).
    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }

    /// Cached blocks dropped to make room so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Fraction of blocks referenced by sequences, as vLLM's `kv_cache_usage_perc` (0..1).
    pub fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            return 0.0;
        }
        1.0 - f64::from(self.num_free()) / self.blocks.len() as f64
    }

    /// The blocks holding the longest cached prefix of `hashes`, without touching them.
    pub fn lookup_prefix(&self, hashes: &[BlockHash]) -> Vec<BlockId> {
        hashes
            .iter()
            .map_while(|h| self.cached.get(h).copied())
            .collect()
    }

    /// How many of `ids` are currently free (touching them removes them from the free count).
    pub fn count_free(&self, ids: &[BlockId]) -> u32 {
        let n = ids
            .iter()
            .filter(|id| self.block(**id).is_some_and(|b| b.ref_count == 0))
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Takes a reference on cached blocks (removing free ones from the free queue).
    pub fn touch(&mut self, ids: &[BlockId]) {
        for id in ids {
            let stamp = match self.block_mut(*id) {
                Some(b) => {
                    b.ref_count += 1;
                    b.free_stamp.take()
                }
                None => None,
            };
            if let Some(stamp) = stamp {
                self.free_queue.remove(&stamp);
            }
        }
    }

    /// Allocates `n` fresh blocks from the head of the free queue, evicting their hashes.
    /// Returns `None` (allocating nothing) when fewer than `n` blocks are free.
    pub fn allocate(&mut self, n: u32) -> Option<Vec<BlockId>> {
        if n > self.num_free() {
            return None;
        }
        let mut out = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let (_, id) = self.free_queue.pop_first()?;
            let old_hash = self.block_mut(id).and_then(|b| {
                b.ref_count = 1;
                b.free_stamp = None;
                b.hash.take()
            });
            if let Some(h) = old_hash {
                if self.cached.get(&h) == Some(&id) {
                    self.cached.remove(&h);
                    self.evictions += 1;
                    self.log.removed(h);
                }
            }
            out.push(id);
        }
        Some(out)
    }

    /// Records that `id` now holds the block with hash `hash`. A hash already held by another
    /// block keeps its first holder (the duplicate stays anonymous). Returns whether the
    /// hash entered the cache (the caller then logs the store with the block's tokens).
    pub fn register(&mut self, id: BlockId, hash: BlockHash) -> bool {
        if self.cached.contains_key(&hash) {
            return false;
        }
        if let Some(b) = self.block_mut(id) {
            if b.hash.is_none() {
                b.hash = Some(hash);
                self.cached.insert(hash, id);
                return true;
            }
        }
        false
    }

    /// Forgets every cached hash at once (vLLM's prefix-cache reset; a restarted engine).
    /// Referenced blocks stay with their sequences, anonymous; nothing counts as an
    /// eviction. Logs one `Cleared`.
    pub fn clear_prefix_cache(&mut self) {
        self.cached.clear();
        for b in &mut self.blocks {
            b.hash = None;
        }
        self.log.cleared();
    }

    /// Turns the change log on or off (off drops what it held).
    pub fn set_event_log(&mut self, enabled: bool) {
        self.log.set_enabled(enabled);
    }

    /// Whether the change log is on.
    pub fn event_log_enabled(&self) -> bool {
        self.log.is_enabled()
    }

    /// Logs that `hash` (after `parent`) entered the cache with `tokens`.
    pub(crate) fn log_stored(
        &mut self,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: impl Iterator<Item = u32>,
        lora: Option<&str>,
    ) {
        self.log.stored(hash, parent, tokens, lora);
    }

    /// Moves the logged changes, oldest first, to `out`.
    pub fn drain_events(&mut self, out: &mut Vec<CacheEvent>) {
        self.log.drain_into(out);
    }

    /// Drops one reference on each block, tail first; unreferenced blocks join the free queue.
    pub fn release(&mut self, ids: &[BlockId]) {
        for id in ids.iter().rev() {
            let now_free = match self.block_mut(*id) {
                Some(b) if b.ref_count > 0 => {
                    b.ref_count -= 1;
                    b.ref_count == 0
                }
                _ => false,
            };
            if now_free {
                self.push_free(*id);
            }
        }
    }

    fn push_free(&mut self, id: BlockId) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        if let Some(b) = self.block_mut(id) {
            b.free_stamp = Some(stamp);
        }
        self.free_queue.insert(stamp, id);
    }

    fn block(&self, id: BlockId) -> Option<&Block> {
        self.blocks.get(id.0 as usize)
    }

    fn block_mut(&mut self, id: BlockId) -> Option<&mut Block> {
        self.blocks.get_mut(id.0 as usize)
    }
}
