//! Shared key-value data and shared queues, scoped like Envoy scopes them by `vm_id`.
//!
//! One [`SharedData`] handle is one `vm_id` scope: every root context of a [`crate::Host`]
//! sees it, and several hosts (for example a scraper singleton and per-worker picker VMs)
//! share it when built with the same handle. Compare-and-swap follows the proxy-wasm C++ host:
//! every write gets a fresh non-zero `cas`; a write with `cas != 0` to an existing key fails
//! with `CasMismatch` unless the key's current `cas` matches; a write to a missing key
//! always succeeds.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Why a shared-data write was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CasMismatch;

/// A handle on one `vm_id`'s shared data and queues; clones share the same store.
#[derive(Debug, Clone, Default)]
pub struct SharedData {
    inner: Arc<Mutex<SharedInner>>,
}

#[derive(Debug, Default)]
struct SharedInner {
    entries: BTreeMap<String, Entry>,
    last_cas: u32,
    queues: Vec<Queue>,
    queue_ids: HashMap<String, u32>,
}

/// One shared queue and the root context it notifies.
#[derive(Debug)]
struct Queue {
    items: VecDeque<Vec<u8>>,
    /// The [`QueueOwner`] that registered it last (Envoy notifies the last registrant).
    owner: Option<QueueOwner>,
}

/// Who registered a queue: a host (one VM, see [`crate::Host`]) and its root context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueOwner {
    /// The registering host's id.
    pub host: u64,
    /// The root context `proxy_on_queue_ready` goes to.
    pub root_context_id: u32,
}

#[derive(Debug, Clone)]
struct Entry {
    value: Vec<u8>,
    cas: u32,
}

impl SharedInner {
    fn next_cas(&mut self) -> u32 {
        self.last_cas = self.last_cas.wrapping_add(1);
        if self.last_cas == 0 {
            self.last_cas = 1;
        }
        self.last_cas
    }
}

impl SharedData {
    /// A fresh, empty scope.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, SharedInner> {
        // A panicking test thread must not hide the data from the others.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The value and its `cas` for `key`.
    pub fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.lock()
            .entries
            .get(key)
            .map(|e| (e.value.clone(), e.cas))
    }

    /// The value of `key` as a lossy UTF-8 string.
    pub fn get_string(&self, key: &str) -> Option<String> {
        self.get(key)
            .map(|(v, _)| String::from_utf8_lossy(&v).into_owned())
    }

    /// Writes `key`; `cas == 0` writes unconditionally.
    pub fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<u32, CasMismatch> {
        let mut inner = self.lock();
        if let Some(entry) = inner.entries.get(key) {
            if cas != 0 && cas != entry.cas {
                return Err(CasMismatch);
            }
        }
        let new_cas = inner.next_cas();
        inner.entries.insert(
            key.to_string(),
            Entry {
                value: value.to_vec(),
                cas: new_cas,
            },
        );
        Ok(new_cas)
    }

    /// All keys, sorted.
    pub fn keys(&self) -> Vec<String> {
        self.lock().entries.keys().cloned().collect()
    }

    /// Registers (or opens) the queue `name`; returns its id (never 0). `owner`, when
    /// given, becomes the root that [`crate::Host::deliver_queues`] notifies (as in Envoy,
    /// registering an existing name again takes the queue over).
    pub fn register_queue(&self, name: &str) -> u32 {
        self.register_queue_for(name, None)
    }

    /// [`SharedData::register_queue`] on behalf of `owner`.
    pub fn register_queue_for(&self, name: &str, owner: Option<QueueOwner>) -> u32 {
        let mut inner = self.lock();
        if let Some(id) = inner.queue_ids.get(name).copied() {
            if let Some(q) = queue_index(id).and_then(|i| inner.queues.get_mut(i)) {
                if owner.is_some() {
                    q.owner = owner;
                }
            }
            return id;
        }
        inner.queues.push(Queue {
            items: VecDeque::new(),
            owner,
        });
        let id = u32::try_from(inner.queues.len()).unwrap_or(u32::MAX);
        inner.queue_ids.insert(name.to_string(), id);
        id
    }

    /// Queues registered by `host` that hold data: `(queue id, root context id)`.
    pub fn ready_queues(&self, host: u64) -> Vec<(u32, u32)> {
        let inner = self.lock();
        inner
            .queues
            .iter()
            .enumerate()
            .filter(|(_, q)| !q.items.is_empty())
            .filter_map(|(i, q)| {
                let owner = q.owner.filter(|o| o.host == host)?;
                Some((u32::try_from(i + 1).ok()?, owner.root_context_id))
            })
            .collect()
    }

    /// The id of an existing queue.
    pub fn resolve_queue(&self, name: &str) -> Option<u32> {
        self.lock().queue_ids.get(name).copied()
    }

    /// Appends to queue `id`; `false` when the queue does not exist.
    pub fn enqueue(&self, id: u32, value: &[u8]) -> bool {
        let mut inner = self.lock();
        match queue_index(id).and_then(|i| inner.queues.get_mut(i)) {
            Some(queue) => {
                queue.items.push_back(value.to_vec());
                true
            }
            None => false,
        }
    }

    /// Pops from queue `id`: `None` when the queue does not exist, `Some(None)` when empty.
    pub fn dequeue(&self, id: u32) -> Option<Option<Vec<u8>>> {
        let mut inner = self.lock();
        queue_index(id)
            .and_then(|i| inner.queues.get_mut(i))
            .map(|queue| queue.items.pop_front())
    }
}

fn queue_index(id: u32) -> Option<usize> {
    usize::try_from(id).ok()?.checked_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cas_semantics() {
        let data = SharedData::new();
        assert_eq!(data.get("k"), None);
        // A missing key accepts any cas.
        let first = data.set("k", b"1", 77).ok();
        assert!(first.is_some_and(|c| c != 0));
        let (value, cas) = data.get("k").unwrap_or_default();
        assert_eq!(value, b"1");
        assert_eq!(data.set("k", b"2", cas.wrapping_add(1)), Err(CasMismatch));
        assert!(data.set("k", b"2", cas).is_ok());
        // The old cas is now stale.
        assert_eq!(data.set("k", b"3", cas), Err(CasMismatch));
        assert!(data.set("k", b"3", 0).is_ok());
        assert_eq!(data.get_string("k").as_deref(), Some("3"));
    }

    #[test]
    fn clones_share_and_queues_work() {
        let a = SharedData::new();
        let b = a.clone();
        let _ = a.set("x", b"y", 0);
        assert_eq!(b.keys(), vec!["x".to_string()]);
        let q = a.register_queue("q");
        assert_eq!(b.register_queue("q"), q);
        assert_eq!(b.resolve_queue("q"), Some(q));
        assert_eq!(a.dequeue(q), Some(None));
        assert!(b.enqueue(q, b"m"));
        assert_eq!(a.dequeue(q), Some(Some(b"m".to_vec())));
        assert_eq!(a.dequeue(99), None);
        assert!(!a.enqueue(0, b"m"));
    }
}
