//! Session id → the endpoint that last served it, bounded in entries *and* bytes: a session
//! id is stored as its 128-bit XXH3 hash ([`SessionKey`]), never as the id itself, so a
//! table of `maxSessions` entries holds at most `maxSessions` × a constant (about 60 bytes
//! with the map's overhead) whatever the clients send as ids (a 60 KiB id costs what a
//! 6-byte one does). When full, the oldest session (by first insertion) is forgotten. FIFO
//! rather than LRU keeps it two plain collections; an active conversation that gets evicted
//! just loses one turn of affinity.
//!
//! The hash is XXH3-128 with its default secret and seed 0 (`xxh3_128`, as in the reference
//! xxHash library), a fixed function rather than a randomly keyed one, on purpose: every
//! Wasm VM and every restart maps an id to the same key, so tests and traces are
//! reproducible. What an unkeyed hash allows is a client crafting two ids with one key;
//! that only shares an affinity *hint* between the two sessions (a scorer's preference,
//! never a routing constraint or anything outside the pool), and at 128 bits accidental
//! collisions are out of reach.

use std::collections::{HashMap, VecDeque};

use xxhash_rust::xxh3::xxh3_128;

/// A session id as the table stores it: its XXH3-128 hash (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey(pub u128);

impl SessionKey {
    /// The key of session id `session`.
    pub fn of(session: &str) -> SessionKey {
        SessionKey(xxh3_128(session.as_bytes()))
    }
}

/// The bounded session table of one pool (endpoint slots of the pool).
#[derive(Clone, Debug, Default)]
pub struct SessionTable {
    last: HashMap<SessionKey, usize>,
    order: VecDeque<SessionKey>,
    capacity: usize,
}

impl SessionTable {
    /// A table remembering at most `capacity` sessions (0 → remembers nothing).
    pub fn new(capacity: usize) -> Self {
        SessionTable {
            last: HashMap::new(),
            order: VecDeque::new(),
            capacity,
        }
    }

    /// The endpoint that last served `session`.
    pub fn get(&self, session: &str) -> Option<usize> {
        self.last.get(&SessionKey::of(session)).copied()
    }

    /// Remember that `endpoint` served `session`.
    pub fn record(&mut self, session: &str, endpoint: usize) {
        if self.capacity == 0 {
            return;
        }
        let key = SessionKey::of(session);
        if let Some(slot) = self.last.get_mut(&key) {
            *slot = endpoint;
            return;
        }
        while self.last.len() >= self.capacity {
            match self.order.pop_front() {
                Some(oldest) => {
                    self.last.remove(&oldest);
                }
                None => break,
            }
        }
        self.last.insert(key, endpoint);
        self.order.push_back(key);
    }

    /// Forget every session whose last endpoint is `endpoint` (it left the pool).
    pub fn forget_endpoint(&mut self, endpoint: usize) {
        let before = self.last.len();
        self.last.retain(|_, e| *e != endpoint);
        if self.last.len() != before {
            let last = &self.last;
            self.order.retain(|k| last.contains_key(k));
        }
    }

    /// Sessions remembered.
    pub fn len(&self) -> usize {
        self.last.len()
    }

    /// Whether no session is remembered.
    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }

    /// Bytes the table holds for its entries (map and queue capacity), which a session
    /// id's length never changes.
    pub fn entry_bytes(&self) -> usize {
        let map_entry = core::mem::size_of::<(SessionKey, usize)>();
        self.last.capacity() * map_entry
            + self.order.capacity() * core::mem::size_of::<SessionKey>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_and_updates_the_last_endpoint() {
        let mut t = SessionTable::new(10);
        t.record("s", 1);
        t.record("s", 2);
        assert_eq!(t.get("s"), Some(2));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn evicts_the_oldest_when_full() {
        let mut t = SessionTable::new(2);
        t.record("a", 0);
        t.record("b", 1);
        t.record("c", 2);
        assert_eq!(t.get("a"), None);
        assert_eq!(t.get("b"), Some(1));
        assert_eq!(t.get("c"), Some(2));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn zero_capacity_remembers_nothing() {
        let mut t = SessionTable::new(0);
        t.record("a", 0);
        assert!(t.is_empty());
    }

    #[test]
    fn the_key_is_the_fixed_xxh3_128_of_the_id() {
        // Reference value of XXH3-128 (default secret, seed 0) of the empty input.
        assert_eq!(
            SessionKey::of("").0,
            0x99aa_06d3_0147_98d8_6001_c324_468d_497f
        );
        assert_eq!(SessionKey::of("abc"), SessionKey::of("abc"));
        assert_ne!(SessionKey::of("abc"), SessionKey::of("abd"));
    }

    #[test]
    fn memory_is_bounded_by_count_not_by_id_length() {
        let fill = |id_len: usize| {
            let mut t = SessionTable::new(100);
            for i in 0..1_000u32 {
                let mut id = format!("{i:08}");
                id.push_str(&"x".repeat(id_len));
                t.record(&id, (i % 4) as usize);
            }
            t
        };
        let short = fill(0);
        let long = fill(60 * 1024);
        assert_eq!((short.len(), long.len()), (100, 100));
        // 100 entries of 60 KiB ids would be ~6 MB as strings; the hashes stay within the
        // same small bound as short ids (the map's growth may differ by its tombstones).
        for t in [&short, &long] {
            assert!(t.entry_bytes() < 16 * 1024, "{}", t.entry_bytes());
        }
        // The newest ids are still found by their full text.
        let last = format!("{:08}{}", 999, "x".repeat(60 * 1024));
        assert_eq!(long.get(&last), Some(3));
    }

    /// What 100,000 active sessions cost: about 60 bytes each (a 32-byte map entry at the
    /// map's load factor, a 16-byte queue slot), whatever their ids.
    #[test]
    fn a_hundred_thousand_sessions_fit_in_about_six_mib() {
        let mut t = SessionTable::new(100_000);
        for i in 0..100_000u32 {
            t.record(&format!("conversation-{i}"), (i % 100) as usize);
        }
        assert_eq!(t.len(), 100_000);
        let per_session = t.entry_bytes() as f64 / 100_000.0;
        eprintln!(
            "100,000 sessions: {} bytes ({per_session:.1} per session)",
            t.entry_bytes()
        );
        assert!(per_session <= 64.0, "{per_session}");
        assert!(t.entry_bytes() <= 6_400_000, "{}", t.entry_bytes());
    }
}
