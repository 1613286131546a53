//! One endpoint's confirmed blocks: engine hash → our key, in store order, bounded.
//!
//! Slots live in a `Vec` linked by index into a FIFO (newest at `head`, oldest at `tail`,
//! evicted first). Two `hashbrown::HashTable`s index them: `by_engine` holds the slot of
//! each engine hash (4 bytes per bucket), `by_key` counts the slots holding each of our keys
//! (several engine hashes may carry one key: the same tokens under a cache salt or other
//! extra keys the events do not show). A removed slot is filled with the last one
//! (`swap_remove`), so the `Vec` stays dense. Cost per stored block: a 24-byte slot, plus
//! 5 bytes per `by_engine` bucket and 13 per `by_key` bucket at a load of 7/16..7/8:
//! about 45–65 bytes.

use crate::types::BlockHash;
use alloc::vec::Vec;
use hashbrown::HashTable;

use crate::kv_events::EngineBlockHash;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Slot {
    engine: u64,
    key: u64,
    /// The next newer slot, or `NIL`.
    prev: u32,
    /// The next older slot, or `NIL`.
    next: u32,
}

/// Spreads an engine hash over the table's bits (engine hashes need not be well mixed:
/// older vLLM sends Python's `hash()` of a tuple). A fixed odd multiplier, never random.
fn mix(h: u64) -> u64 {
    let m = h.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    m ^ (m >> 29)
}

#[derive(Debug, Default)]
pub(crate) struct BlockStore {
    by_engine: HashTable<u32>,
    by_key: HashTable<(u64, u32)>,
    slots: Vec<Slot>,
    head: u32,
    tail: u32,
}

impl BlockStore {
    pub(crate) fn new() -> Self {
        BlockStore {
            head: NIL,
            tail: NIL,
            ..Default::default()
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether some stored block carries `key`.
    pub(crate) fn holds_key(&self, key: BlockHash) -> bool {
        self.by_key.find(key.0, |e| e.0 == key.0).is_some()
    }

    /// Our key of a stored engine block.
    pub(crate) fn key_of(&self, engine: EngineBlockHash) -> Option<BlockHash> {
        let slots = &self.slots;
        self.by_engine
            .find(mix(engine.0), |&s| {
                slots.get(s as usize).is_some_and(|x| x.engine == engine.0)
            })
            .and_then(|&s| slots.get(s as usize))
            .map(|s| BlockHash(s.key))
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.slots.capacity() * core::mem::size_of::<Slot>()
            + self.by_engine.capacity() * (core::mem::size_of::<u32>() + 1)
            + self.by_key.capacity() * (core::mem::size_of::<(u64, u32)>() + 1)
    }

    pub(crate) fn clear(&mut self) {
        *self = BlockStore::new();
    }

    /// Stores `engine` → `key` as the newest block, evicting the oldest while more than
    /// `capacity` are held. Returns (newly stored, evicted). A block stored again is
    /// refreshed (made newest, key replaced).
    pub(crate) fn insert(
        &mut self,
        engine: EngineBlockHash,
        key: BlockHash,
        capacity: u32,
    ) -> (bool, u32) {
        if capacity == 0 {
            return (false, 0);
        }
        if let Some(s) = self.find(engine.0) {
            let old = self.slots.get(s as usize).map_or(key.0, |x| x.key);
            if old != key.0 {
                self.key_dec(old);
                self.key_inc(key.0);
                if let Some(x) = self.slots.get_mut(s as usize) {
                    x.key = key.0;
                }
            }
            self.unlink(s);
            self.push_front(s);
            return (false, 0);
        }
        let mut evicted = 0;
        while self.slots.len() >= capacity as usize && self.tail != NIL {
            let t = self.tail;
            self.remove_slot(t);
            evicted += 1;
        }
        let Ok(s) = u32::try_from(self.slots.len()) else {
            return (false, evicted);
        };
        if s == NIL {
            return (false, evicted);
        }
        self.slots.push(Slot {
            engine: engine.0,
            key: key.0,
            prev: NIL,
            next: NIL,
        });
        let slots = &self.slots;
        self.by_engine.insert_unique(mix(engine.0), s, |&x| {
            slots.get(x as usize).map_or(0, |y| mix(y.engine))
        });
        self.key_inc(key.0);
        self.push_front(s);
        (true, evicted)
    }

    /// Forgets an engine block; whether it was stored.
    pub(crate) fn remove(&mut self, engine: EngineBlockHash) -> bool {
        match self.find(engine.0) {
            Some(s) => {
                self.remove_slot(s);
                true
            }
            None => false,
        }
    }

    fn find(&self, engine: u64) -> Option<u32> {
        let slots = &self.slots;
        self.by_engine
            .find(mix(engine), |&s| {
                slots.get(s as usize).is_some_and(|x| x.engine == engine)
            })
            .copied()
    }

    fn key_inc(&mut self, key: u64) {
        match self.by_key.find_mut(key, |e| e.0 == key) {
            Some(e) => e.1 = e.1.saturating_add(1),
            None => {
                self.by_key.insert_unique(key, (key, 1), |e| e.0);
            }
        }
    }

    fn key_dec(&mut self, key: u64) {
        if let Ok(mut e) = self.by_key.find_entry(key, |e| e.0 == key) {
            if e.get().1 <= 1 {
                e.remove();
            } else {
                e.get_mut().1 -= 1;
            }
        }
    }

    /// Unlinks and deletes slot `s`, moving the last slot into its place.
    fn remove_slot(&mut self, s: u32) {
        let Some(&gone) = self.slots.get(s as usize) else {
            return;
        };
        self.unlink(s);
        if let Ok(e) = self.by_engine.find_entry(mix(gone.engine), |&x| x == s) {
            e.remove();
        }
        self.key_dec(gone.key);
        let last = (self.slots.len() - 1) as u32;
        if s != last {
            // Re-point everything that refers to `last` at `s`.
            if let Some(&moved) = self.slots.get(last as usize) {
                if let Some(e) = self.by_engine.find_mut(mix(moved.engine), |&x| x == last) {
                    *e = s;
                }
                self.relink(moved.prev, moved.next, last, s);
                if let Some(x) = self.slots.get_mut(s as usize) {
                    *x = moved;
                }
            }
        }
        self.slots.pop();
    }

    /// The neighbours `prev`/`next` of a slot moving from `from` to `to` point at `to`.
    fn relink(&mut self, prev: u32, next: u32, from: u32, to: u32) {
        match self.slots.get_mut(prev as usize) {
            Some(p) => p.next = to,
            None if self.head == from => self.head = to,
            None => {}
        }
        match self.slots.get_mut(next as usize) {
            Some(n) => n.prev = to,
            None if self.tail == from => self.tail = to,
            None => {}
        }
    }

    fn unlink(&mut self, s: u32) {
        let Some(&x) = self.slots.get(s as usize) else {
            return;
        };
        match self.slots.get_mut(x.prev as usize) {
            Some(p) => p.next = x.next,
            None => self.head = x.next,
        }
        match self.slots.get_mut(x.next as usize) {
            Some(n) => n.prev = x.prev,
            None => self.tail = x.prev,
        }
        if let Some(y) = self.slots.get_mut(s as usize) {
            y.prev = NIL;
            y.next = NIL;
        }
    }

    fn push_front(&mut self, s: u32) {
        let old = self.head;
        if let Some(x) = self.slots.get_mut(s as usize) {
            x.prev = NIL;
            x.next = old;
        }
        match self.slots.get_mut(old as usize) {
            Some(h) => h.prev = s,
            None => self.tail = s,
        }
        self.head = s;
    }

    /// Engine hashes from newest to oldest (tests).
    #[cfg(test)]
    pub(crate) fn order(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut s = self.head;
        while let Some(x) = self.slots.get(s as usize) {
            out.push(x.engine);
            s = x.next;
            if out.len() > self.slots.len() {
                break;
            }
        }
        out
    }
}
