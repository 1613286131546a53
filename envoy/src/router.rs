//! The body router as a dynamic-module HTTP filter (`filter_name: router`), driven by
//! `infergate_filters::router`.
//!
//! Config: the Wasm flavour's router JSON (`{"bodyLimitBytes": ..., "pools": [...]}`; a
//! `role` field, which the Wasm module uses to pick its part, is accepted and ignored).
//!
//! Because Envoy matched the route before this filter set `x-gateway-base-model-name`, the
//! adapter clears the route cache whenever it lets a request continue, so the route on the
//! router's headers is the one used (proxy-wasm does this implicitly on header edits).

use std::sync::Arc;

use infergate_filters::router::{Router, RouterRequest};
use infergate_filters::FilterStatus;

use crate::abi::{BodyStatus, HeadersStatus, TrailersStatus};
use crate::adapter::HostConfig;
use crate::filter::{FilterConfigHandle, StreamFactory, StreamLogic};
use crate::host::EnvoyStream;
use crate::stats::StatsRegistry;

/// Parses a filter config, dropping the Wasm-only `role` field.
pub fn config_json(config: &[u8]) -> Result<serde_json::Value, String> {
    let text = if config.is_empty() {
        b"{}".as_slice()
    } else {
        config
    };
    let mut value: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| format!("config is not JSON: {e}"))?;
    if let Some(map) = value.as_object_mut() {
        map.remove("role");
    }
    Ok(value)
}

struct Shared {
    router: Router,
    host: HostConfig,
}

/// One router filter config: the compiled router, shared by all workers.
pub struct RouterFactory {
    shared: Arc<Shared>,
    /// This config's entry in the process's config registry (see `crate::shared`).
    _registration: crate::shared::Registration,
}

impl RouterFactory {
    /// Compiles the router config and defines its stats.
    pub fn new(config: &[u8], envoy: &mut FilterConfigHandle) -> Result<RouterFactory, String> {
        let router = Router::from_json(config_json(config)?).map_err(|e| e.to_string())?;
        let host = HostConfig {
            stats: StatsRegistry::define(envoy, &router.stat_keys()),
            strict_override: false,
        };
        let bases = router
            .base_models()
            .into_iter()
            .map(str::to_owned)
            .collect();
        let registration = crate::shared::config_registry().register_router(bases);
        Ok(RouterFactory {
            shared: Arc::new(Shared { router, host }),
            _registration: registration,
        })
    }
}

impl StreamFactory for RouterFactory {
    fn new_stream(&self) -> Box<dyn StreamLogic> {
        Box::new(RouterStream {
            shared: Arc::clone(&self.shared),
            request: RouterRequest::new(),
        })
    }
}

struct RouterStream {
    shared: Arc<Shared>,
    request: RouterRequest,
}

impl RouterStream {
    /// Runs the body step with the complete body assembled from Envoy's slices.
    fn finish_body(&mut self, envoy: &mut EnvoyStream, end_of_stream: bool) -> FilterStatus {
        let shared = Arc::clone(&self.shared);
        let status = shared.host.body_step(envoy, end_of_stream, |host, len| {
            self.request
                .on_request_body(&shared.router, host, len, end_of_stream)
        });
        if status == FilterStatus::Continue {
            envoy.clear_route_cache();
        }
        status
    }
}

impl StreamLogic for RouterStream {
    fn on_request_headers(
        &mut self,
        envoy: &mut EnvoyStream,
        end_of_stream: bool,
    ) -> HeadersStatus {
        let shared = Arc::clone(&self.shared);
        // Envoy answers a plain-text 413 once a buffered body passes the stream's buffer limit
        // (the listener's, 1 MiB by default); lift it one byte past the router's own limit so
        // the router decides, with its OpenAI-style 413.
        let limit = u64::try_from(shared.router.body_limit()).unwrap_or(u64::MAX);
        envoy.ensure_buffer_limit(limit.saturating_add(1));
        let status = shared.host.headers_step(envoy, |host| {
            self.request
                .on_request_headers(&shared.router, host, end_of_stream)
        });
        if status == FilterStatus::Continue {
            envoy.clear_route_cache();
        }
        status.into()
    }

    fn on_request_body(&mut self, envoy: &mut EnvoyStream, end_of_stream: bool) -> BodyStatus {
        self.finish_body(envoy, end_of_stream).into()
    }

    fn on_request_trailers(&mut self, envoy: &mut EnvoyStream) -> TrailersStatus {
        // Trailers end the request: whatever was buffered is the whole body.
        self.finish_body(envoy, true).into()
    }
}
