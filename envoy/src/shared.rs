//! Process-wide state shared by every worker thread of one Envoy process.
//!
//! A dynamic module is loaded once per process, so statics here are seen by the bootstrap
//! extension (main thread) and by every HTTP filter on every worker: one snapshot, one prefix
//! index and one set of in-flight counters per process, instead of one per Wasm VM.
//!
//! **The snapshot slot** ([`SnapshotCell`]) is written by the scraper on the main thread
//! (every ~50 ms) and read by the picker at most once per request. It is an
//! `RwLock<Option<(version, Arc<bytes>)>>`: a reader holds the read lock only to compare a
//! version number (and, when it changed, to clone an `Arc`), a few nanoseconds; readers do
//! not block each other, and the single writer swaps a pointer. A seqlock or an atomic
//! pointer swap would save one uncontended atomic per request, not worth `unsafe` code.
//!
//! **The config registry** ([`ConfigRegistry`]) is where the three configs that must agree
//! meet: the scraper's `endpoints`, each picker's pools and each router's base models. In
//! the Wasm flavour they live in different VMs and can only be compared at the first
//! snapshot (the picker's own check, in the filters crate); one native process sees them
//! all as they load, so a mismatch refuses the config that loads second, with an error
//! naming both fields:
//! - a picker pool endpoint the scraper does not list (it would never get metrics, and a
//!   `FailClose` pool could never pick it) — checked by the picker against a loaded
//!   scraper, or by the scraper against loaded pickers;
//! - a router base model no loaded picker serves (its requests would get the picker's
//!   503) — checked by the picker, against every loaded router and with every loaded
//!   picker's pools counted, so a listener update that adds a pool to both (Envoy builds
//!   the new router config before the new picker config, while the old ones still live)
//!   or removes one passes. A router never checks: created first in its filter chain, it
//!   would refuse the very update that adds a pool.
//!
//! Each registration is undone when its config is destroyed ([`Registration`]'s `Drop`).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

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

/// What one loaded picker config declares: per pool, its name, base model and endpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PickerDeclaration {
    /// `(pool name, base model, endpoints)` in pool order.
    pub pools: Vec<(String, String, Vec<String>)>,
}

/// Everything registered, by registration id.
#[derive(Debug, Default)]
struct Registered {
    next_id: u64,
    scrapers: Vec<(u64, Vec<String>)>,
    pickers: Vec<(u64, PickerDeclaration)>,
    routers: Vec<(u64, Vec<String>)>,
}

impl Registered {
    fn id(&mut self) -> u64 {
        self.next_id = self.next_id.wrapping_add(1);
        self.next_id
    }

    /// The first pool endpoint of `picker` that no scraper in `scrapers` lists.
    fn unscraped<'a>(
        picker: &'a PickerDeclaration,
        scraped: &BTreeSet<&str>,
    ) -> Option<(usize, &'a str, usize, &'a str)> {
        picker
            .pools
            .iter()
            .enumerate()
            .find_map(|(i, (name, _, endpoints))| {
                endpoints
                    .iter()
                    .enumerate()
                    .find(|(_, e)| !scraped.contains(e.as_str()))
                    .map(|(j, e)| (i, name.as_str(), j, e.as_str()))
            })
    }
}

/// The process's loaded configs, for the consistency checks in the module doc.
#[derive(Debug, Default)]
pub struct ConfigRegistry {
    inner: Mutex<Registered>,
}

/// One config's entry in a [`ConfigRegistry`]; dropping it (with the config) removes it.
#[derive(Debug)]
pub struct Registration {
    registry: &'static ConfigRegistry,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut r = self.registry.lock();
        let id = self.id;
        r.scrapers.retain(|(i, _)| *i != id);
        r.pickers.retain(|(i, _)| *i != id);
        r.routers.retain(|(i, _)| *i != id);
    }
}

impl ConfigRegistry {
    /// An empty registry.
    pub const fn new() -> ConfigRegistry {
        ConfigRegistry {
            inner: Mutex::new(Registered {
                next_id: 0,
                scrapers: Vec::new(),
                pickers: Vec::new(),
                routers: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registered> {
        // Every update is a single push or retain: a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a scraper's `endpoints`, unless a loaded picker has a pool endpoint that
    /// they lack.
    pub fn register_scraper(&'static self, endpoints: &[String]) -> Result<Registration, String> {
        let mut r = self.lock();
        let scraped: BTreeSet<&str> = endpoints.iter().map(String::as_str).collect();
        for (_, picker) in &r.pickers {
            if let Some((i, pool, j, endpoint)) = Registered::unscraped(picker, &scraped) {
                return Err(format!(
                    "scraper config: endpoints: a loaded picker's pools[{i}].endpoints[{j}] \
                     `{endpoint}` (pool `{pool}`) is not listed, so it would never be scraped"
                ));
            }
        }
        let id = r.id();
        r.scrapers.push((id, endpoints.to_vec()));
        Ok(Registration { registry: self, id })
    }

    /// Registers a picker, unless a loaded scraper lacks one of its pool endpoints or a
    /// loaded router routes a base model that no loaded picker (this one included) serves.
    pub fn register_picker(
        &'static self,
        picker: PickerDeclaration,
    ) -> Result<Registration, String> {
        let mut r = self.lock();
        if !r.scrapers.is_empty() {
            let scraped: BTreeSet<&str> = r
                .scrapers
                .iter()
                .flat_map(|(_, e)| e.iter().map(String::as_str))
                .collect();
            if let Some((i, pool, j, endpoint)) = Registered::unscraped(&picker, &scraped) {
                return Err(format!(
                    "picker config: pools[{i}].endpoints[{j}]: `{endpoint}` (pool `{pool}`) is \
                     not in the scraper's `endpoints`, so it would never have metrics"
                ));
            }
        }
        let served: BTreeSet<&str> = r
            .pickers
            .iter()
            .map(|(_, p)| p)
            .chain([&picker])
            .flat_map(|p| p.pools.iter().map(|(_, base, _)| base.as_str()))
            .collect();
        for (_, bases) in &r.routers {
            if let Some(base) = bases.iter().find(|b| !served.contains(b.as_str())) {
                return Err(format!(
                    "picker config: pools: no pool serves base model `{base}`, which a loaded \
                     router's pools[].baseModel routes here (its requests would be answered \
                     503 rejected-no-endpoints)"
                ));
            }
        }
        let id = r.id();
        r.pickers.push((id, picker));
        Ok(Registration { registry: self, id })
    }

    /// Registers a router's base models (never refused: see the module doc).
    pub fn register_router(&'static self, base_models: Vec<String>) -> Registration {
        let mut r = self.lock();
        let id = r.id();
        r.routers.push((id, base_models));
        Registration { registry: self, id }
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

    fn leaked() -> &'static ConfigRegistry {
        Box::leak(Box::new(ConfigRegistry::new()))
    }

    fn picker(pools: &[(&str, &str, &[&str])]) -> PickerDeclaration {
        PickerDeclaration {
            pools: pools
                .iter()
                .map(|(n, b, e)| {
                    let e = e.iter().map(|s| (*s).to_owned()).collect();
                    ((*n).to_owned(), (*b).to_owned(), e)
                })
                .collect(),
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_picker_endpoint_the_scraper_lacks_is_refused_whichever_loads_second() {
        let r = leaked();
        let scraper = r.register_scraper(&strings(&["1.1.1.1:80"]));
        assert!(scraper.is_ok());
        let e = r
            .register_picker(picker(&[("p", "m", &["1.1.1.1:80", "2.2.2.2:80"])]))
            .err()
            .unwrap_or_default();
        assert!(
            e.contains("pools[0].endpoints[1]") && e.contains("scraper's `endpoints`"),
            "{e}"
        );
        assert!(r
            .register_picker(picker(&[("p", "m", &["1.1.1.1:80"])]))
            .is_ok());

        // Picker first, scraper second.
        let r = leaked();
        let _picker = r.register_picker(picker(&[("p", "m", &["2.2.2.2:80"])]));
        let e = r
            .register_scraper(&strings(&["1.1.1.1:80"]))
            .err()
            .unwrap_or_default();
        assert!(
            e.contains("scraper config: endpoints") && e.contains("2.2.2.2:80"),
            "{e}"
        );
        // Without any scraper, pickers load (a FailOpen deployment may run without one).
        let r = leaked();
        assert!(r
            .register_picker(picker(&[("p", "m", &["9.9.9.9:1"])]))
            .is_ok());
    }

    #[test]
    fn a_router_base_model_without_a_picker_pool_is_refused_at_the_picker() {
        let r = leaked();
        let _router = r.register_router(strings(&["llama", "qwen"]));
        let e = r
            .register_picker(picker(&[("p", "llama", &[])]))
            .err()
            .unwrap_or_default();
        assert!(
            e.contains("`qwen`") && e.contains("pools[].baseModel"),
            "{e}"
        );
        assert!(r
            .register_picker(picker(&[("p", "llama", &[]), ("q", "qwen", &[])]))
            .is_ok());
    }

    #[test]
    fn listener_updates_that_add_or_remove_a_pool_pass() {
        let r = leaked();
        let old_router = r.register_router(strings(&["llama"]));
        let old_picker = r.register_picker(picker(&[("p", "llama", &[])]));
        assert!(old_picker.is_ok());
        // Adding qwen: the new router loads first, then the new picker.
        let new_router = r.register_router(strings(&["llama", "qwen"]));
        let new_picker = r.register_picker(picker(&[("p", "llama", &[]), ("q", "qwen", &[])]));
        assert!(new_picker.is_ok());
        drop((old_router, old_picker));
        // Removing llama again.
        let newer_router = r.register_router(strings(&["qwen"]));
        assert!(r.register_picker(picker(&[("q", "qwen", &[])])).is_ok());
        drop((new_router, new_picker, newer_router));
    }

    #[test]
    fn destroyed_configs_leave_the_registry() {
        let r = leaked();
        let router = r.register_router(strings(&["qwen"]));
        drop(router);
        assert!(r.register_picker(picker(&[("p", "llama", &[])])).is_ok());
        let scraper = r.register_scraper(&strings(&[]));
        drop(scraper);
        assert!(r
            .register_picker(picker(&[("p", "llama", &["1.1.1.1:1"])]))
            .is_ok());
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
