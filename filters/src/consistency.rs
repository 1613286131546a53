//! Consistency between configs that are loaded separately but must agree: the scraper's
//! `endpoints`, each picker's pools and each body router's base models.
//!
//! [`LoadedConfigs`] holds what every loaded config declares; an adapter that sees several
//! configs load in one place (the native module: one process; a Wasm VM shared by the
//! router and the picker) adds each as it loads, and the one that loads second is refused
//! with an error naming both fields:
//! - a picker pool endpoint the scraper does not list (it would never get metrics, and a
//!   `FailClose` pool could never pick it): checked when the picker is added against the
//!   loaded scrapers, or when the scraper is added against the loaded pickers;
//! - a router base model no loaded picker serves (its requests would get the picker's
//!   503): checked when a picker is added, against every loaded router and with every
//!   loaded picker's pools counted. So a listener update that adds a pool to both (Envoy
//!   builds the new router config before the new picker config, while the old ones still
//!   live) or removes one passes. A router is never refused: created first in its filter
//!   chain, it would refuse the very update that adds a pool.
//!
//! Where configs never meet (the Wasm scraper runs in the main thread's VM, the pickers in
//! the workers'), the picker compares its pools with the first snapshot instead
//! (`crate::picker::state`).

use std::collections::BTreeSet;

use crate::picker::PickerPlans;

/// One picker pool as the checks see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolDeclaration {
    /// The pool's name.
    pub name: String,
    /// The base model it serves.
    pub base_model: String,
    /// Its endpoints, `ip:port`.
    pub endpoints: Vec<String>,
    /// The block size it hashes prompts at (`None`: it reads no prefix index).
    pub block_size_tokens: Option<u32>,
}

/// What one loaded picker config declares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PickerDeclaration {
    /// Its pools, in configuration order.
    pub pools: Vec<PoolDeclaration>,
}

impl PickerDeclaration {
    /// The declaration of a built picker.
    pub fn of(plans: &PickerPlans) -> PickerDeclaration {
        PickerDeclaration {
            pools: plans
                .pools()
                .iter()
                .map(|p| PoolDeclaration {
                    name: p.name().to_owned(),
                    base_model: p.base_model().to_owned(),
                    endpoints: p.endpoints().to_vec(),
                    block_size_tokens: p.block_size_tokens(),
                })
                .collect(),
        }
    }

    /// The first pool endpoint that `scraped` lacks: `(pool index, pool, endpoint index,
    /// endpoint)`.
    fn unscraped(&self, scraped: &BTreeSet<&str>) -> Option<(usize, &str, usize, &str)> {
        self.pools.iter().enumerate().find_map(|(i, pool)| {
            pool.endpoints
                .iter()
                .enumerate()
                .find(|(_, e)| !scraped.contains(e.as_str()))
                .map(|(j, e)| (i, pool.name.as_str(), j, e.as_str()))
        })
    }
}

/// A loaded config's handle in [`LoadedConfigs`], to remove it when the config goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConfigId(u64);

/// The loaded configs (see the module doc).
#[derive(Debug, Default)]
pub struct LoadedConfigs {
    next_id: u64,
    scrapers: Vec<(ConfigId, Vec<String>)>,
    pickers: Vec<(ConfigId, PickerDeclaration)>,
    routers: Vec<(ConfigId, Vec<String>)>,
}

impl LoadedConfigs {
    /// Nothing loaded.
    pub const fn new() -> LoadedConfigs {
        LoadedConfigs {
            next_id: 0,
            scrapers: Vec::new(),
            pickers: Vec::new(),
            routers: Vec::new(),
        }
    }

    fn id(&mut self) -> ConfigId {
        self.next_id = self.next_id.wrapping_add(1);
        ConfigId(self.next_id)
    }

    /// Adds a scraper's `endpoints`, unless a loaded picker has a pool endpoint they lack.
    pub fn add_scraper(&mut self, endpoints: &[String]) -> Result<ConfigId, String> {
        let scraped: BTreeSet<&str> = endpoints.iter().map(String::as_str).collect();
        for (_, picker) in &self.pickers {
            if let Some((i, pool, j, endpoint)) = picker.unscraped(&scraped) {
                return Err(format!(
                    "scraper config: endpoints: a loaded picker's pools[{i}].endpoints[{j}] \
                     `{endpoint}` (pool `{pool}`) is not listed, so it would never be scraped"
                ));
            }
        }
        let id = self.id();
        self.scrapers.push((id, endpoints.to_vec()));
        Ok(id)
    }

    /// Adds a picker, unless a loaded scraper lacks one of its pool endpoints or a loaded
    /// router routes a base model that no loaded picker (this one included) serves.
    pub fn add_picker(&mut self, picker: PickerDeclaration) -> Result<ConfigId, String> {
        if !self.scrapers.is_empty() {
            let scraped: BTreeSet<&str> = self
                .scrapers
                .iter()
                .flat_map(|(_, e)| e.iter().map(String::as_str))
                .collect();
            if let Some((i, pool, j, endpoint)) = picker.unscraped(&scraped) {
                return Err(format!(
                    "picker config: pools[{i}].endpoints[{j}]: `{endpoint}` (pool `{pool}`) is \
                     not in the scraper's `endpoints`, so it would never have metrics"
                ));
            }
        }
        let served: BTreeSet<&str> = self
            .pickers
            .iter()
            .map(|(_, p)| p)
            .chain([&picker])
            .flat_map(|p| p.pools.iter().map(|pool| pool.base_model.as_str()))
            .collect();
        for (_, bases) in &self.routers {
            if let Some(base) = bases.iter().find(|b| !served.contains(b.as_str())) {
                return Err(format!(
                    "picker config: pools: no pool serves base model `{base}`, which a loaded \
                     router's pools[].baseModel routes here (its requests would be answered \
                     503 rejected-no-endpoints)"
                ));
            }
        }
        let id = self.id();
        self.pickers.push((id, picker));
        Ok(id)
    }

    /// Adds a router's base models (never refused: see the module doc).
    pub fn add_router(&mut self, base_models: Vec<String>) -> ConfigId {
        let id = self.id();
        self.routers.push((id, base_models));
        id
    }

    /// The block size the first loaded picker pool serving `base_model` hashes at: what a
    /// router hashes its handoff at, so `blockSizeTokens` is configured once, in the
    /// picker's `EndpointPickerConfig`. `None` if no loaded pool serves it or the pool reads
    /// no prefix index.
    pub fn block_size_tokens(&self, base_model: &str) -> Option<u32> {
        self.pickers
            .iter()
            .flat_map(|(_, picker)| &picker.pools)
            .find(|pool| pool.base_model == base_model)
            .and_then(|pool| pool.block_size_tokens)
    }

    /// Removes a config (it was destroyed); unknown ids are ignored.
    pub fn remove(&mut self, id: ConfigId) {
        self.scrapers.retain(|(i, _)| *i != id);
        self.pickers.retain(|(i, _)| *i != id);
        self.routers.retain(|(i, _)| *i != id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picker(pools: &[(&str, &str, &[&str])]) -> PickerDeclaration {
        PickerDeclaration {
            pools: pools
                .iter()
                .map(|(n, b, e)| PoolDeclaration {
                    name: (*n).to_owned(),
                    base_model: (*b).to_owned(),
                    endpoints: e.iter().map(|s| (*s).to_owned()).collect(),
                    block_size_tokens: Some(64),
                })
                .collect(),
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_picker_endpoint_the_scraper_lacks_is_refused_whichever_loads_second() {
        let mut c = LoadedConfigs::new();
        assert!(c.add_scraper(&strings(&["1.1.1.1:80"])).is_ok());
        let e = c
            .add_picker(picker(&[("p", "m", &["1.1.1.1:80", "2.2.2.2:80"])]))
            .err()
            .unwrap_or_default();
        assert!(
            e.contains("pools[0].endpoints[1]") && e.contains("scraper's `endpoints`"),
            "{e}"
        );
        assert!(c.add_picker(picker(&[("p", "m", &["1.1.1.1:80"])])).is_ok());

        // Picker first, scraper second.
        let mut c = LoadedConfigs::new();
        assert!(c.add_picker(picker(&[("p", "m", &["2.2.2.2:80"])])).is_ok());
        let e = c
            .add_scraper(&strings(&["1.1.1.1:80"]))
            .err()
            .unwrap_or_default();
        assert!(
            e.contains("scraper config: endpoints") && e.contains("2.2.2.2:80"),
            "{e}"
        );
        // Without any scraper, pickers load (a FailOpen deployment may run without one).
        let mut c = LoadedConfigs::new();
        assert!(c.add_picker(picker(&[("p", "m", &["9.9.9.9:1"])])).is_ok());
    }

    #[test]
    fn a_router_base_model_without_a_picker_pool_is_refused_at_the_picker() {
        let mut c = LoadedConfigs::new();
        c.add_router(strings(&["llama", "qwen"]));
        let e = c
            .add_picker(picker(&[("p", "llama", &[])]))
            .err()
            .unwrap_or_default();
        assert!(
            e.contains("`qwen`") && e.contains("pools[].baseModel"),
            "{e}"
        );
        assert!(c
            .add_picker(picker(&[("p", "llama", &[]), ("q", "qwen", &[])]))
            .is_ok());
    }

    #[test]
    fn listener_updates_that_add_or_remove_a_pool_pass() {
        let mut c = LoadedConfigs::new();
        let old_router = c.add_router(strings(&["llama"]));
        let old_picker = c.add_picker(picker(&[("p", "llama", &[])]));
        // Adding qwen: the new router loads first, then the new picker.
        let new_router = c.add_router(strings(&["llama", "qwen"]));
        let new_picker = c.add_picker(picker(&[("p", "llama", &[]), ("q", "qwen", &[])]));
        assert!(old_picker.is_ok() && new_picker.is_ok());
        c.remove(old_router);
        if let Ok(id) = old_picker {
            c.remove(id);
        }
        // Removing llama again.
        c.add_router(strings(&["qwen"]));
        assert!(c.add_picker(picker(&[("q", "qwen", &[])])).is_ok());
        c.remove(new_router);
    }

    #[test]
    fn removed_configs_no_longer_count() {
        let mut c = LoadedConfigs::new();
        let router = c.add_router(strings(&["qwen"]));
        c.remove(router);
        assert!(c.add_picker(picker(&[("p", "llama", &[])])).is_ok());
        let scraper = c.add_scraper(&strings(&[]));
        if let Ok(id) = scraper {
            c.remove(id);
        }
        assert!(c
            .add_picker(picker(&[("p", "llama", &["1.1.1.1:1"])]))
            .is_ok());
    }

    #[test]
    fn routers_learn_the_block_size_of_the_first_loaded_pool_of_their_base_model() {
        let mut loaded = LoadedConfigs::new();
        assert_eq!(loaded.block_size_tokens("m"), None);
        let mut first = picker(&[("p", "m", &["1.1.1.1:80"])]);
        first.pools[0].block_size_tokens = Some(16);
        let id = loaded.add_picker(first).map_err(|e| e.to_string());
        let mut second = picker(&[("q", "m", &["2.2.2.2:80"]), ("r", "n", &["3.3.3.3:80"])]);
        second.pools[1].block_size_tokens = None;
        assert!(loaded.add_picker(second).is_ok());
        assert_eq!(loaded.block_size_tokens("m"), Some(16));
        assert_eq!(loaded.block_size_tokens("n"), None, "reads no prefix index");
        if let Ok(id) = id {
            loaded.remove(id);
        }
        assert_eq!(
            loaded.block_size_tokens("m"),
            Some(64),
            "the next pool of m"
        );
    }
}
