//! Which endpoints hold a prompt's first block: the index's way to skip, in one probe, every
//! endpoint that holds nothing of a prompt.
//!
//! Every endpoint's stored set is prefix-closed (see `index.rs`), so an endpoint holds some
//! of a prompt exactly when it holds its first block, and that block was the first of a
//! request recorded there (a chained hash at position 0 covers the seed, so it never occurs
//! at another position). [`Heads`] maps each such first block (a *head*) to the list of
//! endpoints holding it; matching a prompt walks that list only.
//!
//! Each list entry ([`Holder`]) also keeps the length of the last request recorded with that
//! head on that endpoint: a likely answer for the next match, confirmed with two probes. With
//! it, the hash of that request's last block and the endpoint's eviction count at the time:
//! when the count has not moved and the prompt has that hash at that depth, the block is
//! known to be stored without a probe (see `index.rs`).
//!
//! Structure: a `hashbrown::HashTable` of heads (hash, first holder), probed with the head
//! hash itself (an XXH3 output), and one `Vec` of holders doubly linked by index, with a
//! free list. Cost: 32 bytes per holder plus 17 bytes per table bucket per distinct head;
//! with 128-block requests, a fraction of a byte per stored block.

use crate::types::BlockHash;
use alloc::vec::Vec;
use hashbrown::HashTable;

/// End-of-list marker for holder links.
const NIL: u32 = u32::MAX;

/// One head: its hash, the first endpoint of its holder list and the list's length.
#[derive(Clone, Copy, Debug)]
struct Head {
    hash: u64,
    first: u32,
    count: u32,
}

/// One endpoint holding one head.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Holder {
    /// The endpoint's slot in the index.
    pub endpoint: u32,
    /// Blocks of the last request recorded with this head on this endpoint (a hint).
    pub depth: u32,
    prev: u32,
    next: u32,
    /// The hash of that request's block `depth - 1`.
    pub last: u64,
    /// The endpoint's eviction count just after that request was recorded.
    pub epoch: u32,
}

/// What a holder remembers of the last request recorded with its head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hint {
    /// Blocks of that request (as stored).
    pub depth: u32,
    /// The hash of its block `depth - 1`.
    pub last: u64,
    /// The endpoint's eviction count just after it was recorded.
    pub epoch: u32,
}

impl Holder {
    /// What this holder remembers of its last request.
    pub fn hint(&self) -> Hint {
        Hint {
            depth: self.depth,
            last: self.last,
            epoch: self.epoch,
        }
    }
}

/// Heads and their holder lists.
#[derive(Debug, Default)]
pub(crate) struct Heads {
    table: HashTable<Head>,
    holders: Vec<Holder>,
    /// First free holder (linked through `next`), or `NIL`.
    free: u32,
    /// Holders in use.
    live: usize,
}

impl Heads {
    /// No heads.
    pub fn new() -> Self {
        Heads {
            table: HashTable::new(),
            holders: Vec::new(),
            free: NIL,
            live: 0,
        }
    }

    /// Adds `endpoint` as a holder of `head` (the caller knows it is not one yet) and
    /// returns the holder's index.
    pub fn add(&mut self, head: BlockHash, endpoint: u32, hint: Hint) -> u32 {
        let Hint { depth, last, epoch } = hint;
        let idx = match self.holders.get(self.free as usize).copied() {
            Some(free) => {
                let idx = self.free;
                self.free = free.next;
                idx
            }
            None => {
                self.holders.push(Holder {
                    endpoint,
                    depth,
                    prev: NIL,
                    next: NIL,
                    last,
                    epoch,
                });
                (self.holders.len() - 1) as u32
            }
        };
        self.live += 1;
        let h = head.0;
        let old_first = match self.table.find_mut(h, |e| e.hash == h) {
            Some(e) => {
                e.count = e.count.saturating_add(1);
                core::mem::replace(&mut e.first, idx)
            }
            None => {
                let head = Head {
                    hash: h,
                    first: idx,
                    count: 1,
                };
                self.table.insert_unique(h, head, |e| e.hash);
                NIL
            }
        };
        if let Some(holder) = self.holders.get_mut(idx as usize) {
            *holder = Holder {
                endpoint,
                depth,
                prev: NIL,
                next: old_first,
                last,
                epoch,
            };
        }
        if let Some(next) = self.holders.get_mut(old_first as usize) {
            next.prev = idx;
        }
        idx
    }

    /// Removes holder `idx` from the list of `head`, forgetting the head with its last holder.
    pub fn remove(&mut self, head: BlockHash, idx: u32) {
        let Some(&Holder { prev, next, .. }) = self.holders.get(idx as usize) else {
            return;
        };
        if let Some(p) = self.holders.get_mut(prev as usize) {
            p.next = next;
        }
        if let Ok(entry) = self.table.find_entry(head.0, |e| e.hash == head.0) {
            if entry.get().count <= 1 {
                entry.remove();
            } else {
                let e = entry.into_mut();
                e.count -= 1;
                if prev == NIL {
                    e.first = next;
                }
            }
        }
        if let Some(n) = self.holders.get_mut(next as usize) {
            n.prev = prev;
        }
        if let Some(h) = self.holders.get_mut(idx as usize) {
            *h = Holder {
                endpoint: NIL,
                depth: 0,
                prev: NIL,
                next: self.free,
                last: 0,
                epoch: 0,
            };
            self.free = idx;
        }
        self.live -= 1;
    }

    /// Sets the hint of holder `idx`.
    pub fn set_hint(&mut self, idx: u32, hint: Hint) {
        if let Some(h) = self.holders.get_mut(idx as usize) {
            h.depth = hint.depth;
            h.last = hint.last;
            h.epoch = hint.epoch;
        }
    }

    /// The hint of holder `idx`.
    pub fn hint(&self, idx: u32) -> Hint {
        self.holders.get(idx as usize).map_or(
            Hint {
                depth: 0,
                last: 0,
                epoch: 0,
            },
            Holder::hint,
        )
    }

    /// The holders of `head`, most recently added first.
    pub fn holders_of(&self, head: BlockHash) -> HolderIter<'_> {
        let first = self
            .table
            .find(head.0, |e| e.hash == head.0)
            .map_or(NIL, |e| e.first);
        HolderIter {
            holders: &self.holders,
            next: first,
        }
    }

    /// Endpoints holding `head`.
    pub fn holder_count(&self, head: BlockHash) -> usize {
        self.table
            .find(head.0, |e| e.hash == head.0)
            .map_or(0, |e| e.count as usize)
    }

    /// Holders in use (one per endpoint per head).
    pub fn len(&self) -> usize {
        self.live
    }

    /// Heap bytes used.
    pub fn memory_bytes(&self) -> usize {
        self.table.allocation_size() + self.holders.capacity() * core::mem::size_of::<Holder>()
    }
}

/// Walks one head's holder list.
pub(crate) struct HolderIter<'h> {
    holders: &'h [Holder],
    next: u32,
}

impl<'h> Iterator for HolderIter<'h> {
    type Item = &'h Holder;

    fn next(&mut self) -> Option<&'h Holder> {
        let h = self.holders.get(self.next as usize)?;
        self.next = h.next;
        Some(h)
    }
}
