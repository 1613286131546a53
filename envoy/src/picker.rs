//! The `picker` filter's config: the picker role of the filters crate's builder
//! (`infergate_filters::stages::build`) over the process's picker state, run by
//! `crate::pipeline`.
//!
//! **One picker state per Envoy process.** [`PickerShared`] (prefix index, in-flight counts,
//! sessions, decoded snapshot) lives in a process-wide registry keyed by the config text, so
//! every worker thread, and every filter config built from the same JSON (an LDS reload, the
//! same filter on two listeners), shares one instance: turn 2 of a conversation finds turn 1's
//! prefix whichever worker served it. Each pool has its own lock ([`SharedPicker`]): a pick
//! needs a consistent view of the index and the loads of every endpoint of its pool
//! (splitting it per endpoint would let two workers pick the same "least loaded" endpoint at
//! once), and picks in different pools never wait for each other. The critical section is
//! the decision alone: the pool's immutable plan is read without the lock, and the body is
//! copied out of Envoy, parsed and hashed into prefix blocks before it; headers, metadata,
//! the destination and stats are written after it. Requests hold no lock between hooks, no
//! hook holds one while calling into Envoy, and a lease is given back without one.
//!
//! **Endpoint choice: the ordered destination list.** The picker writes
//! `x-gateway-destination-endpoint: pick,fallback,...` and the same value in the `envoy.lb`
//! dynamic metadata, exactly like the Wasm flavour; the pool cluster's `override_host`
//! load-balancing policy reads it, so the first attempt goes to the pick and a retry to the
//! next entry. With the bootstrap's pool clusters listing exactly the pool's endpoints
//! (STATIC), Envoy only ever connects to a member of the cluster, even if the picker or a
//! header were wrong, and every endpoint keeps its own connection pool, health checks,
//! outlier detection and per-host stats. The picker asks the load balancer for no host
//! itself: such an override would pin every retry to the pick.
//!
//! **In-flight gauges.** A lease taken at the pick raises the pool's and the endpoint's
//! `infergate.picker.inflight_requests` gauges; the stream's end lowers them (the pick
//! stage's end, which `crate::pipeline` runs on every end path).
//!
//! Config: the Wasm flavour's picker JSON (`{"pools": [...]}` or one pool; `role` ignored),
//! which may carry the process's scraper (`"scraper": {...}`, see `crate::scraper`): it is
//! taken out before the picker part is read (so it plays no part in the state's key), and
//! the config hosts it.
//! The former native-only `upstreamOverride` is refused by name (see [`REMOVED_KEYS`]), so a
//! config written for it fails loudly instead of meaning something else.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use infergate_filters::consistency::PickerDeclaration;
use infergate_filters::picker::{PickerShared, SharedPicker};
use infergate_filters::stages::{picker_pipeline, PickerRole};

use crate::filter::FilterConfigHandle;
use crate::pipeline::{host_config, take_test_stages, PipelineFactory};
use crate::router::config_json;
use crate::scraper::{take_scraper, Hosting};
use crate::shared::{config_registry, Registration};

/// Process-wide picker states by config text; weak so a state dies with its last config.
static REGISTRY: Mutex<Option<HashMap<String, Weak<SharedPicker>>>> = Mutex::new(None);

/// The process's picker state for `config_text`, created on first use.
fn process_state(
    config_text: String,
    value: serde_json::Value,
) -> Result<Arc<SharedPicker>, String> {
    let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    let map = registry.get_or_insert_with(HashMap::new);
    map.retain(|_, weak| weak.strong_count() > 0);
    if let Some(existing) = map.get(&config_text).and_then(Weak::upgrade) {
        return Ok(existing);
    }
    let shared = PickerShared::from_json(value).map_err(|e| e.to_string())?;
    let shared = Arc::new(SharedPicker::new(shared));
    crate::flow_timer::start(&shared);
    crate::precise::start(&shared);
    map.insert(config_text, Arc::downgrade(&shared));
    Ok(shared)
}

/// Keys this filter once had, each with what replaced it.
const REMOVED_KEYS: &[(&str, &str)] = &[(
    "upstreamOverride",
    "the pool cluster's override_host load-balancing policy now routes from the picker's \
     destination list (header and envoy.lb metadata); remove the key",
)];

/// A config naming a removed key is an error that says so (serde would only call it unknown).
fn refuse_removed_keys(value: &serde_json::Value) -> Result<(), String> {
    for (key, why) in REMOVED_KEYS {
        if value.get(key).is_some() {
            return Err(format!("picker config: `{key}` was removed: {why}"));
        }
    }
    Ok(())
}

/// The builder's picker role over the process's state.
pub type NativePickerRole = PickerRole<Arc<SharedPicker>>;

/// Compiles a picker config (the JSON `value`, its `role` already removed) into the
/// builder's picker role over the process's state for it (found, or made), and registers
/// its pools for as long as the returned registration lives.
pub fn role(mut value: serde_json::Value) -> Result<(NativePickerRole, Registration), String> {
    refuse_removed_keys(&value)?;
    let tests = take_test_stages(&mut value)?;
    let state = process_state(value.to_string(), value)?;
    let declaration = PickerDeclaration::of(state.plans());
    let registration = config_registry().register_picker(declaration)?;
    Ok((PickerRole::new(state, tests), registration))
}

/// The `picker` filter's config from its JSON bytes, and the scraper it hosts when it
/// carries one (`scraper`, taken out before the picker config is read).
pub fn factory(
    config: &[u8],
    envoy: &mut FilterConfigHandle,
) -> Result<(PipelineFactory, Option<Hosting>), String> {
    let mut value = config_json(config)?;
    let scraper = take_scraper(&mut value);
    let (role, registration) = role(value)?;
    let hosting = host_scraper(envoy, scraper)?;
    let host = host_config(envoy, &role.store().plans().stat_keys());
    let factory = PipelineFactory::new(picker_pipeline(role), host, vec![Box::new(registration)]);
    Ok((factory, hosting))
}

/// Hosts the scraper a picker config carried (after its picker part was accepted, so the
/// scraper's endpoints are checked against it too; see `crate::shared`).
pub(crate) fn host_scraper(
    envoy: &mut FilterConfigHandle,
    scraper: Option<serde_json::Value>,
) -> Result<Option<Hosting>, String> {
    scraper
        .map(|value| crate::scraper::host(envoy, value).map_err(|e| format!("scraper: {e}")))
        .transpose()
}

#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    /// The live state for a config value (as the factory would key it).
    pub(crate) fn state_for(value: &serde_json::Value) -> Result<Arc<SharedPicker>, String> {
        process_state(value.to_string(), value.clone())
    }

    /// The process-wide state (it locks per pool inside).
    pub(crate) fn lock(state: &SharedPicker) -> &PickerShared {
        state.state()
    }
}
