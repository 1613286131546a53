//! The endpoint picker as a dynamic-module HTTP filter (`filter_name: picker`), driven by
//! `infergate_filters::picker`.
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
//! `infergate.picker.inflight_requests` gauges; the stream's end lowers them, from
//! `stream_complete` or, when Envoy skipped that (a completion re-entered from inside a
//! hook, a panic), from the destroy hook. Envoy runs `on_http_filter_destroy` from a member
//! function of its live filter object, whose config holds the gauges, so the stream's
//! `filter_envoy_ptr`, kept from its last hook, still reaches them there.
//!
//! Config: the Wasm flavour's picker JSON (`{"pools": [...]}` or one pool; `role` ignored),
//! plus the native-only `"upstreamOverride": "strict" | "fallback"`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use infergate_filters::consistency::PickerDeclaration;
use infergate_filters::picker::{PickerRequest, PickerShared, SharedPicker};
use infergate_filters::FilterStatus;

use crate::abi::{BodyStatus, HeadersStatus, HttpFilterEnvoyPtr, TrailersStatus};
use crate::adapter::HostConfig;
use crate::filter::{FilterConfigHandle, StreamFactory, StreamLogic};
use crate::host::EnvoyStream;
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
    map.insert(config_text, Arc::downgrade(&shared));
    Ok(shared)
}

struct Shared {
    state: Arc<SharedPicker>,
    host: HostConfig,
}

/// One picker filter config.
pub struct PickerFactory {
    shared: Arc<Shared>,
    /// This config's entry in the process's config registry (see `crate::shared`).
    _registration: crate::shared::Registration,
}

impl PickerFactory {
    /// Parses the config, attaches to (or creates) the process-wide state, defines stats.
    pub fn new(config: &[u8], envoy: &mut FilterConfigHandle) -> Result<PickerFactory, String> {
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
        let state = process_state(value.to_string(), value)?;
        let declaration = PickerDeclaration::of(state.plans());
        let registration = crate::shared::config_registry().register_picker(declaration)?;
        let host = HostConfig {
            stats: StatsRegistry::define(envoy, &state.plans().stat_keys()),
            strict_override,
        };
        Ok(PickerFactory {
            shared: Arc::new(Shared { state, host }),
            _registration: registration,
        })
    }
}

impl StreamFactory for PickerFactory {
    fn new_stream(&self) -> Box<dyn StreamLogic> {
        Box::new(PickerStream {
            shared: Arc::clone(&self.shared),
            request: PickerRequest::new(),
            envoy: core::ptr::null_mut(),
        })
    }
}

struct PickerStream {
    shared: Arc<Shared>,
    request: PickerRequest,
    /// The stream's `filter_envoy_ptr` as of its last hook (NULL before the first), for the
    /// destroy hook to lower the in-flight gauges (see the module doc).
    envoy: HttpFilterEnvoyPtr,
}

impl PickerStream {
    fn body_step(&mut self, envoy: &mut EnvoyStream, end_of_stream: bool) -> FilterStatus {
        self.envoy = envoy.raw();
        let shared = Arc::clone(&self.shared);
        // The filter locks `state` for the pick alone (see the module doc).
        shared.host.body_step(envoy, end_of_stream, |host, len| {
            self.request
                .on_request_body(&*shared.state, host, len, end_of_stream)
        })
    }
}

impl StreamLogic for PickerStream {
    fn on_request_headers(
        &mut self,
        envoy: &mut EnvoyStream,
        end_of_stream: bool,
    ) -> HeadersStatus {
        self.envoy = envoy.raw();
        let shared = Arc::clone(&self.shared);
        // Reads the pool's plan without locking `state`.
        shared
            .host
            .headers_step(envoy, |host| {
                self.request
                    .on_request_headers(&*shared.state, host, end_of_stream)
            })
            .into()
    }

    fn on_request_body(&mut self, envoy: &mut EnvoyStream, end_of_stream: bool) -> BodyStatus {
        self.body_step(envoy, end_of_stream).into()
    }

    fn on_request_trailers(&mut self, envoy: &mut EnvoyStream) -> TrailersStatus {
        self.body_step(envoy, true).into()
    }

    fn on_stream_complete(&mut self, envoy: &mut EnvoyStream) {
        let shared = Arc::clone(&self.shared);
        shared.host.headers_step(envoy, |host| {
            self.request.on_end_counted(&*shared.state, host);
        });
    }
}

impl Drop for PickerStream {
    /// A stream destroyed without `stream_complete` (or after a panic) still gives its
    /// in-flight lease back and lowers the gauges; a no-op when the end already ran.
    fn drop(&mut self) {
        if !self.request.holds_lease() {
            return;
        }
        let shared = Arc::clone(&self.shared);
        if self.envoy.is_null() {
            // Unreachable (a lease is taken inside a hook, which records the pointer).
            self.request.on_end(&*shared.state);
            return;
        }
        // SAFETY: the picker's streams are dropped only from `on_http_filter_destroy`,
        // which Envoy runs from its live filter object (see the module doc): the pointer of
        // the stream's last hook still designates it, and the handle dies within this call.
        let mut envoy = unsafe { EnvoyStream::from_hook(self.envoy) };
        shared.host.headers_step(&mut envoy, |host| {
            self.request.on_end_counted(&*shared.state, host);
        });
    }
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
