//! Process-wide state shared by every worker thread of one Envoy process.
//!
//! A dynamic module is loaded once per process, so statics here are seen by the scraper
//! (main thread, `crate::scraper`) and by every HTTP filter on every worker: one snapshot,
//! one prefix index and one set of in-flight counters per process, instead of one per Wasm
//! VM.
//!
//! **The snapshot slot** ([`SnapshotCell`]) is written by the scraper on the main thread
//! (every ~50 ms) and read by the picker at most once per request. It is an
//! `RwLock<Option<(version, Arc<bytes>)>>`: a reader holds the read lock only to compare a
//! version number (and, when it changed, to clone an `Arc`), a few nanoseconds; readers do
//! not block each other, and the single writer swaps a pointer. A seqlock or an atomic
//! pointer swap would save one uncontended atomic per request, not worth `unsafe` code.
//!
//! **The config registry** ([`ConfigRegistry`]) is where the three configs that must agree
//! meet as they load: the scraper's `endpoints`, each picker's pools and each router's base
//! models. It holds the filters crate's `consistency::LoadedConfigs` (which says what is
//! checked, and why a router is never the one refused) behind a mutex; a config that
//! disagrees with what is loaded is refused with an error naming both fields, and each
//! registration is undone when its config is destroyed ([`Registration`]'s `Drop`).

use std::sync::{Arc, Mutex, PoisonError, RwLock};

use infergate_filters::consistency::{ConfigId, LoadedConfigs, PickerDeclaration};
use infergate_filters::host::{SnapshotFetch, SnapshotVersion};

/// The newest encoded metric snapshot and its version.
pub struct SnapshotCell {
    slot: RwLock<Option<(SnapshotVersion, Arc<Vec<u8>>)>>,
}

/// The process's snapshot slot.
pub static SNAPSHOT: SnapshotCell = SnapshotCell::new();

impl SnapshotCell {
    /// An empty slot.
    pub const fn new() -> SnapshotCell {
        SnapshotCell {
            slot: RwLock::new(None),
        }
    }

    /// Publishes `bytes` as the newest snapshot; returns its version (1, 2, ...).
    pub fn publish(&self, bytes: Vec<u8>) -> SnapshotVersion {
        let bytes = Arc::new(bytes);
        // A panic while holding this lock cannot leave the slot half-written (it is a single
        // assignment), so a poisoned lock is still consistent.
        let mut slot = self.slot.write().unwrap_or_else(PoisonError::into_inner);
        let version = SnapshotVersion(slot.as_ref().map_or(0, |(v, _)| v.0).wrapping_add(1));
        *slot = Some((version, bytes));
        version
    }

    /// The newest snapshot if its version differs from `known`.
    pub fn fetch_if_changed(&self, known: Option<SnapshotVersion>) -> SnapshotFetch {
        let current = {
            let slot = self.slot.read().unwrap_or_else(PoisonError::into_inner);
            match slot.as_ref() {
                None => return SnapshotFetch::Missing,
                Some((version, _)) if Some(*version) == known => return SnapshotFetch::Unchanged,
                Some((version, bytes)) => (*version, Arc::clone(bytes)),
            }
        };
        // Copy outside the lock so the writer never waits for a large memcpy.
        SnapshotFetch::Changed {
            version: current.0,
            bytes: current.1.as_ref().clone(),
        }
    }
}

impl Default for SnapshotCell {
    fn default() -> Self {
        SnapshotCell::new()
    }
}

/// The process's loaded configs, for the consistency checks in the module doc.
#[derive(Debug, Default)]
pub struct ConfigRegistry {
    inner: Mutex<LoadedConfigs>,
}

/// One config's entry in a [`ConfigRegistry`]; dropping it (with the config) removes it.
#[derive(Debug)]
pub struct Registration {
    registry: &'static ConfigRegistry,
    id: ConfigId,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.lock().remove(self.id);
    }
}

impl ConfigRegistry {
    /// An empty registry.
    pub const fn new() -> ConfigRegistry {
        ConfigRegistry {
            inner: Mutex::new(LoadedConfigs::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LoadedConfigs> {
        // Every update is a single push or retain: a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a scraper's `endpoints` (see `LoadedConfigs::add_scraper`).
    pub fn register_scraper(&'static self, endpoints: &[String]) -> Result<Registration, String> {
        let id = self.lock().add_scraper(endpoints)?;
        Ok(Registration { registry: self, id })
    }

    /// Registers a picker (see `LoadedConfigs::add_picker`).
    pub fn register_picker(
        &'static self,
        picker: PickerDeclaration,
    ) -> Result<Registration, String> {
        let id = self.lock().add_picker(picker)?;
        Ok(Registration { registry: self, id })
    }

    /// Registers a router's base models (never refused).
    pub fn register_router(&'static self, base_models: Vec<String>) -> Registration {
        let id = self.lock().add_router(base_models);
        Registration { registry: self, id }
    }
}

/// The block sizes of the process's loaded picker pools, for the routers' handoffs
/// (`blockSizeTokens` is configured once, in the picker). One registry lock per routed
/// request, held for a lookup.
pub struct ProcessBlockSizes;

impl infergate_filters::router::BlockSizeSource for ProcessBlockSizes {
    fn block_size_tokens(&self, base_model: &str) -> Option<u32> {
        config_registry().lock().block_size_tokens(base_model)
    }
}

/// The process's config registry. Unit tests run on many threads at once, each acting as
/// its own Envoy process, so under `cfg(test)` every thread gets its own.
#[cfg(not(test))]
pub fn config_registry() -> &'static ConfigRegistry {
    static REGISTRY: ConfigRegistry = ConfigRegistry::new();
    &REGISTRY
}

/// The process's config registry. Unit tests run on many threads at once, each acting as
/// its own Envoy process, so under `cfg(test)` every thread gets its own.
#[cfg(test)]
pub fn config_registry() -> &'static ConfigRegistry {
    thread_local! {
        static REGISTRY: &'static ConfigRegistry = Box::leak(Box::new(ConfigRegistry::new()));
    }
    REGISTRY.with(|r| *r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_check_and_leave_with_their_config() {
        let registry: &'static ConfigRegistry = Box::leak(Box::new(ConfigRegistry::new()));
        let scraper = registry.register_scraper(&["1.1.1.1:80".to_owned()]);
        assert!(scraper.is_ok());
        let declaration = PickerDeclaration {
            pools: vec![infergate_filters::consistency::PoolDeclaration {
                name: "p".into(),
                base_model: "m".into(),
                endpoints: vec!["2.2.2.2:80".into()],
                block_size_tokens: None,
            }],
        };
        let refused = registry.register_picker(declaration.clone());
        assert!(refused.is_err_and(|e| e.contains("pools[0].endpoints[0]")));
        drop(scraper);
        assert!(registry.register_picker(declaration).is_ok());
    }

    #[test]
    fn versions_advance_and_unchanged_costs_no_copy() {
        let cell = SnapshotCell::new();
        assert_eq!(cell.fetch_if_changed(None), SnapshotFetch::Missing);
        let v1 = cell.publish(vec![1, 2]);
        assert_eq!(
            cell.fetch_if_changed(None),
            SnapshotFetch::Changed {
                version: v1,
                bytes: vec![1, 2]
            }
        );
        assert_eq!(cell.fetch_if_changed(Some(v1)), SnapshotFetch::Unchanged);
        let v2 = cell.publish(vec![3]);
        assert!(v2 > v1);
        assert_eq!(
            cell.fetch_if_changed(Some(v1)),
            SnapshotFetch::Changed {
                version: v2,
                bytes: vec![3]
            }
        );
    }

    #[test]
    fn readers_on_many_threads_always_see_a_whole_published_snapshot() {
        let cell = Arc::new(SnapshotCell::new());
        // Published before the readers start, so each of them sees at least one change.
        cell.publish(vec![7; 64]);
        let writer = {
            let cell = Arc::clone(&cell);
            std::thread::spawn(move || {
                for i in 0..2_000u32 {
                    // Every snapshot is 64 copies of one byte: a torn read would mix bytes.
                    cell.publish(vec![(i % 251) as u8; 64]);
                }
            })
        };
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let cell = Arc::clone(&cell);
                std::thread::spawn(move || {
                    let mut known = None;
                    let mut changes = 0u32;
                    for _ in 0..20_000 {
                        if let SnapshotFetch::Changed { version, bytes } =
                            cell.fetch_if_changed(known)
                        {
                            assert_eq!(bytes.len(), 64);
                            assert!(bytes.iter().all(|b| *b == bytes[0]), "torn snapshot");
                            assert!(known.is_none_or(|k| version > k), "version went back");
                            known = Some(version);
                            changes += 1;
                        }
                    }
                    changes
                })
            })
            .collect();
        assert!(writer.join().is_ok());
        for r in readers {
            assert!(r.join().unwrap_or(0) >= 1);
        }
    }
}
