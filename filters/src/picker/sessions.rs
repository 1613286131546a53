//! Session id → the endpoint that last served it, bounded: when full, the oldest session
//! (by first insertion) is forgotten. FIFO rather than LRU keeps it two plain collections;
//! an active conversation that gets evicted just loses one turn of affinity.

use std::collections::{HashMap, VecDeque};

/// The bounded session table of one pool (endpoint indices into the pool's list).
#[derive(Clone, Debug, Default)]
pub struct SessionTable {
    last: HashMap<String, usize>,
    order: VecDeque<String>,
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
        self.last.get(session).copied()
    }

    /// Remember that `endpoint` served `session`.
    pub fn record(&mut self, session: &str, endpoint: usize) {
        if self.capacity == 0 {
            return;
        }
        if let Some(slot) = self.last.get_mut(session) {
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
        self.last.insert(session.to_owned(), endpoint);
        self.order.push_back(session.to_owned());
    }

    /// Sessions remembered.
    pub fn len(&self) -> usize {
        self.last.len()
    }

    /// Whether no session is remembered.
    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
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
}
