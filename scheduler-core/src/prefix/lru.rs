//! One endpoint's LRU set of block hashes, bounded in blocks.
//!
//! Nodes live in a `Vec` and link to each other by slot index (an intrusive doubly linked
//! list, most recent at `head`); a `hashbrown::HashTable<u32>` maps a hash to its slot. The
//! table stores only the 4-byte slot and is probed with the block hash itself (already an
//! XXH3 output, so well mixed, and never random). Cost per stored block: 16 bytes of node
//! plus 5 bytes per table bucket at a load of 7/16..7/8, i.e. about 22–28 bytes.

use crate::types::BlockHash;
use alloc::vec::Vec;
use hashbrown::HashTable;

/// End-of-list marker for slot links.
const NIL: u32 = u32::MAX;

/// One stored block: its hash and its LRU neighbours.
#[derive(Clone, Copy, Debug)]
struct Node {
    hash: u64,
    /// Slot of the next more recent node, or `NIL`.
    prev: u32,
    /// Slot of the next less recent node, or `NIL`.
    next: u32,
}

/// A bounded LRU set of block hashes.
#[derive(Debug)]
pub(crate) struct EndpointLru {
    table: HashTable<u32>,
    nodes: Vec<Node>,
    head: u32,
    tail: u32,
    capacity: u32,
}

fn node_hash(nodes: &[Node], slot: u32) -> u64 {
    nodes.get(slot as usize).map_or(0, |n| n.hash)
}

impl EndpointLru {
    /// An empty set holding at most `capacity` blocks.
    pub fn new(capacity: u32) -> Self {
        EndpointLru {
            table: HashTable::new(),
            nodes: Vec::new(),
            head: NIL,
            tail: NIL,
            capacity,
        }
    }

    /// Blocks stored.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The bound in blocks.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Whether `hash` is stored.
    #[inline]
    pub fn contains(&self, hash: BlockHash) -> bool {
        let nodes = &self.nodes;
        self.table
            .find(hash.0, |&s| node_hash(nodes, s) == hash.0)
            .is_some()
    }

    /// Heap and inline bytes used by this set.
    pub fn memory_bytes(&self) -> usize {
        core::mem::size_of::<Self>()
            + self.table.allocation_size()
            + self.nodes.capacity() * core::mem::size_of::<Node>()
    }

    /// Marks `hash` most recently used, inserting it (and evicting the least recent block
    /// if full) when absent. Returns the evicted block, if one was.
    pub fn touch(&mut self, hash: BlockHash) -> Option<BlockHash> {
        let h = hash.0;
        let nodes = &self.nodes;
        if let Some(&slot) = self.table.find(h, |&s| node_hash(nodes, s) == h) {
            self.unlink(slot);
            self.push_front(slot);
            return None;
        }
        if self.capacity == 0 {
            return None;
        }
        let mut evicted = None;
        let slot = if self.nodes.len() >= self.capacity as usize {
            let old = self.nodes.get(self.tail as usize)?.hash;
            let slot = self.evict_tail()?;
            evicted = Some(BlockHash(old));
            slot
        } else {
            self.grow_nodes();
            let slot = self.nodes.len() as u32;
            self.nodes.push(Node {
                hash: h,
                prev: NIL,
                next: NIL,
            });
            slot
        };
        if let Some(n) = self.nodes.get_mut(slot as usize) {
            n.hash = h;
        }
        self.push_front(slot);
        let nodes = &self.nodes;
        self.table.insert_unique(h, slot, |&s| node_hash(nodes, s));
        evicted
    }

    /// Marks the stored blocks `run` most recently used, `run[0]` the most recent: the same
    /// order as touching them last first, with one table probe per *segment* of the run
    /// that the list already holds in order (a conversation's previous turn is one segment,
    /// or two when its system prompt was touched by another request since) instead of one
    /// per block. `false`, and nothing changed, if a block of `run` is not stored. (The
    /// index does the same in two steps, adding new blocks in between.)
    #[cfg(test)]
    pub fn touch_stored_run(&mut self, run: &[BlockHash]) -> bool {
        let mut segments = Vec::new();
        if self.stored_segments(run, &mut segments) < run.len() {
            return false;
        }
        self.move_segments_to_front(&segments);
        true
    }

    /// How many leading blocks of `run` are stored, found a segment of the list at a time
    /// (one table probe per segment the list holds in `run`'s order, and one for the first
    /// block missing); `segments` receives them, `(first slot, last slot)` in run order.
    pub fn stored_segments(&self, run: &[BlockHash], segments: &mut Vec<(u32, u32)>) -> usize {
        segments.clear();
        let mut i = 0;
        while let Some(start) = run.get(i) {
            let nodes = &self.nodes;
            let Some(&first) = self
                .table
                .find(start.0, |&s| node_hash(nodes, s) == start.0)
            else {
                break;
            };
            let mut last = first;
            i += 1;
            while let (Some(node), Some(want)) = (self.nodes.get(last as usize), run.get(i)) {
                // The list's end is no block, whatever the hash wanted (0 included).
                if node.next == NIL || node_hash(&self.nodes, node.next) != want.0 {
                    break;
                }
                last = node.next;
                i += 1;
            }
            segments.push((first, last));
        }
        i
    }

    /// Moves `segments` (of [`EndpointLru::stored_segments`], in run order) to the front,
    /// the first segment's first block most recent. Blocks added or touched since must not
    /// be inside a segment (the caller adds only blocks the run does not hold).
    pub fn move_segments_to_front(&mut self, segments: &[(u32, u32)]) {
        for &(first, last) in segments.iter().rev() {
            self.move_to_front(first, last);
        }
    }

    /// Moves the list segment `first..=last` (linked in that order) to the front.
    fn move_to_front(&mut self, first: u32, last: u32) {
        if first == self.head {
            return;
        }
        let (Some(&Node { prev, .. }), Some(&Node { next, .. })) = (
            self.nodes.get(first as usize),
            self.nodes.get(last as usize),
        ) else {
            return;
        };
        // Unlink the segment (`prev` exists: `first` is not the head).
        if let Some(p) = self.nodes.get_mut(prev as usize) {
            p.next = next;
        }
        match self.nodes.get_mut(next as usize) {
            Some(n) => n.prev = prev,
            None => self.tail = prev,
        }
        // Link it in at the head.
        let old_head = self.head;
        if let Some(n) = self.nodes.get_mut(first as usize) {
            n.prev = NIL;
        }
        if let Some(n) = self.nodes.get_mut(last as usize) {
            n.next = old_head;
        }
        if let Some(h) = self.nodes.get_mut(old_head as usize) {
            h.prev = last;
        }
        self.head = first;
    }

    /// Blocks that can be added before the bound evicts one.
    pub fn room(&self) -> usize {
        (self.capacity as usize).saturating_sub(self.nodes.len())
    }

    /// Changes the bound; when shrinking, keeps the most recent blocks and releases memory.
    pub fn set_capacity(&mut self, capacity: u32) {
        self.capacity = capacity;
        if self.nodes.len() <= capacity as usize {
            return;
        }
        // Rebuild compactly from the most recent `capacity` blocks, least recent first so
        // each push_front leaves them in their original order.
        let mut keep = Vec::with_capacity(capacity as usize);
        let mut slot = self.head;
        while keep.len() < capacity as usize {
            match self.nodes.get(slot as usize) {
                Some(n) => {
                    keep.push(n.hash);
                    slot = n.next;
                }
                None => break,
            }
        }
        *self = EndpointLru::new(capacity);
        self.nodes.reserve_exact(keep.len());
        for &h in keep.iter().rev() {
            // Below the bound: nothing is evicted.
            let _ = self.touch(BlockHash(h));
        }
    }

    /// Grows the node vector by half (capped at the bound) so spare capacity stays small.
    fn grow_nodes(&mut self) {
        if self.nodes.len() < self.nodes.capacity() {
            return;
        }
        let len = self.nodes.len();
        let room = (self.capacity as usize).saturating_sub(len);
        self.nodes.reserve_exact((len / 2).max(16).min(room.max(1)));
    }

    /// Removes the least recent block from the list and the table; returns its slot.
    fn evict_tail(&mut self) -> Option<u32> {
        let slot = self.tail;
        let old = self.nodes.get(slot as usize)?.hash;
        self.unlink(slot);
        let nodes = &self.nodes;
        if let Ok(entry) = self
            .table
            .find_entry(old, |&s| s == slot && node_hash(nodes, s) == old)
        {
            entry.remove();
        }
        Some(slot)
    }

    fn unlink(&mut self, slot: u32) {
        let Some(&Node { prev, next, .. }) = self.nodes.get(slot as usize) else {
            return;
        };
        match self.nodes.get_mut(prev as usize) {
            Some(p) => p.next = next,
            None => self.head = next,
        }
        match self.nodes.get_mut(next as usize) {
            Some(n) => n.prev = prev,
            None => self.tail = prev,
        }
    }

    fn push_front(&mut self, slot: u32) {
        let old_head = self.head;
        if let Some(n) = self.nodes.get_mut(slot as usize) {
            n.prev = NIL;
            n.next = old_head;
        }
        match self.nodes.get_mut(old_head as usize) {
            Some(h) => h.prev = slot,
            None => self.tail = slot,
        }
        self.head = slot;
    }

    /// Hashes from most to least recent (for tests and debugging).
    #[cfg(test)]
    pub fn recency_order(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut slot = self.head;
        while let Some(n) = self.nodes.get(slot as usize) {
            out.push(n.hash);
            slot = n.next;
        }
        out
    }
}
