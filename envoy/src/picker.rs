//! The `picker` filter's config: a pipeline of the endpoint picker stage
//! ([`infergate_filters::stages::PickStage`]) over the process's picker state, run by
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
//! the override and stats are written after it. Requests hold no lock between hooks, no
//! hook holds one while calling into Envoy, and a lease is given back without one.
//!
//! **Endpoint choice: `http_set_upstream_override_host`.** The picker sets
//! `x-gateway-destination-endpoint` and the `envoy.lb` metadata exactly like the Wasm flavour,
//! and also asks Envoy's load balancer for that host. With the native bootstrap's pool
//! clusters listing the pool's endpoints (STATIC or EDS), Envoy only ever connects to a member
//! of the cluster, even if the picker or a header were wrong, and every endpoint keeps its
//! own connection pool, health checks, outlier detection and per-host stats, which
//! `ORIGINAL_DST` clusters (hosts made up on demand from a header) do not have. `strict`
//! (the default) turns "not a member" into a 503 instead of a silent round-robin fallback;
//! `"upstreamOverride": "fallback"` keeps the header-driven `ORIGINAL_DST` setup working
//! (its hosts only join the cluster once the header has created them).
//!
//! **In-flight gauges.** A lease taken at the pick raises the pool's and the endpoint's
//! `infergate.picker.inflight_requests` gauges; the stream's end lowers them (the pick
//! stage's end, which `crate::pipeline` runs on every end path).
//!
//! Config: the Wasm flavour's picker JSON (`{"pools": [...]}` or one pool; `role` ignored),
//! plus the native-only `"upstreamOverride": "strict" | "fallback"`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use infergate_filters::consistency::PickerDeclaration;
use infergate_filters::picker::{PickerShared, SharedPicker};
use infergate_filters::stages::PickStage;

use crate::adapter::HostConfig;
use crate::filter::FilterConfigHandle;
use crate::pipeline::{take_test_stages, NativeStage, PipelineFactory};
use crate::router::config_json;
use crate::stats::StatsRegistry;

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
    map.insert(config_text, Arc::downgrade(&shared));
    Ok(shared)
}

/// Parses the config, attaches to (or creates) the process-wide state, defines stats.
pub fn factory(config: &[u8], envoy: &mut FilterConfigHandle) -> Result<PipelineFactory, String> {
    let mut value = config_json(config)?;
    let strict_override = match value
        .as_object_mut()
        .and_then(|m| m.remove("upstreamOverride"))
    {
        None => true,
        Some(v) if v == "strict" => true,
        Some(v) if v == "fallback" => false,
        Some(other) => {
            return Err(format!(
                "upstreamOverride must be \"strict\" or \"fallback\", got {other}"
            ))
        }
    };
    let mut stages = take_test_stages(&mut value)?;
    let state = process_state(value.to_string(), value)?;
    let declaration = PickerDeclaration::of(state.plans());
    let registration = crate::shared::config_registry().register_picker(declaration)?;
    let host = HostConfig {
        stats: StatsRegistry::define(envoy, &state.plans().stat_keys()),
        strict_override,
    };
    stages.push(Box::new(PickStage::new(state)) as NativeStage);
    Ok(PipelineFactory::new(
        stages,
        host,
        vec![Box::new(registration)],
    ))
}

/// Test access to the process-wide registry.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    /// The live state for a config value (as the factory would key it).
    pub(crate) fn state_for(value: &serde_json::Value) -> Result<Arc<SharedPicker>, String> {
        let mut value = value.clone();
        if let Some(m) = value.as_object_mut() {
            m.remove("upstreamOverride");
        }
        process_state(value.to_string(), value)
    }

    /// The process-wide state (it locks per pool inside).
    pub(crate) fn lock(state: &SharedPicker) -> &PickerShared {
        state.state()
    }
}
