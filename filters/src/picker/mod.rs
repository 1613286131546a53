//! The endpoint picker (DESIGN §2, §6, §10): for a request the body router has tagged
//! with `x-gateway-base-model-name`, choose one endpoint of that model's pool and route
//! the request to it.
//!
//! Per request: `on_request_headers` (drops any `x-gateway-destination-endpoint` already
//! present, finds the pool, pauses for the body) → `on_request_body` (parses the body for
//! the prompt, refreshes the snapshot, picks through [`PickerShared::pick`]) → sets
//! `x-gateway-destination-endpoint`, the `envoy.lb` dynamic metadata and the host's
//! upstream override, or answers 503 with `x-llm-d-request-dropped-reason:
//! rejected-no-endpoints` → `on_end` (complete or reset, whichever the adapter sees first;
//! later calls do nothing) gives the in-flight lease back.
//!
//! Requests this picker does not own pass through untouched: no base-model header, a base
//! model no pool serves, or a non-inference path. A malformed body gets the router's 400
//! (the picker does not trust the router to be in front of it).

pub mod config;
pub mod lease;
mod pool;
pub mod sessions;
pub mod state;

use scheduler_core::request::{self, Api};

use crate::headers::{BASE_MODEL, DESTINATION_ENDPOINT, LB_METADATA_NAMESPACE};
use crate::host::{
    Clock, DynamicMetadata, LocalReply, Random, RequestBody, RequestHeaders, SnapshotSource, Stats,
    UpstreamOverride,
};
use crate::reply::{Reply, REJECTED_NO_ENDPOINTS};
use crate::FilterStatus;

pub use config::{FailureMode, PickerConfig, PickerConfigError, PoolConfig};
pub use lease::InFlightLease;
pub use state::{PickRequest, Picked, PickerShared, PoolId, Rejection};

/// Everything the picker's body callback needs from the host.
pub trait PickerHost:
    RequestHeaders
    + RequestBody
    + LocalReply
    + SnapshotSource
    + Clock
    + Random
    + Stats
    + DynamicMetadata
    + UpstreamOverride
{
}

impl<T> PickerHost for T where
    T: RequestHeaders
        + RequestBody
        + LocalReply
        + SnapshotSource
        + Clock
        + Random
        + Stats
        + DynamicMetadata
        + UpstreamOverride
        + ?Sized
{
}

/// Where one request is in the picker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Start,
    AwaitingBody { pool: PoolId, api: Api },
    Done,
}

/// The picker's state for one request.
#[derive(Debug)]
pub struct PickerRequest {
    stage: Stage,
    lease: Option<InFlightLease>,
    endpoint: Option<String>,
}

impl Default for PickerRequest {
    fn default() -> Self {
        PickerRequest::new()
    }
}

impl PickerRequest {
    /// A request that has seen nothing yet.
    pub fn new() -> Self {
        PickerRequest {
            stage: Stage::Start,
            lease: None,
            endpoint: None,
        }
    }

    /// The endpoint picked for this request, once picked.
    pub fn endpoint(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }

    /// Whether this request currently counts in an endpoint's in-flight load.
    pub fn holds_lease(&self) -> bool {
        self.lease.is_some()
    }

    /// Request headers arrived.
    pub fn on_request_headers<H: PickerHost + ?Sized>(
        &mut self,
        shared: &mut PickerShared,
        host: &mut H,
        end_of_stream: bool,
    ) -> FilterStatus {
        if self.stage != Stage::Start {
            return FilterStatus::Continue;
        }
        // Only the picker may set the destination: drop whatever came in.
        host.remove_request_header(DESTINATION_ENDPOINT);
        let pool = host
            .request_header(BASE_MODEL)
            .and_then(|base| shared.pool_for_base_model(&base));
        let api = host
            .request_header(":path")
            .and_then(|path| Api::from_path(&path));
        let (Some(pool), Some(api)) = (pool, api) else {
            self.stage = Stage::Done;
            return FilterStatus::Continue;
        };
        self.stage = Stage::AwaitingBody { pool, api };
        if end_of_stream {
            return self.finish(shared, host, pool, api, &[]);
        }
        FilterStatus::Pause
    }

    /// Body data arrived (`buffered_len` bytes buffered in total). Adapters call this from
    /// the trailers callback too, with `end_of_stream = true`.
    pub fn on_request_body<H: PickerHost + ?Sized>(
        &mut self,
        shared: &mut PickerShared,
        host: &mut H,
        buffered_len: usize,
        end_of_stream: bool,
    ) -> FilterStatus {
        let Stage::AwaitingBody { pool, api } = self.stage else {
            return FilterStatus::Continue;
        };
        if !end_of_stream {
            return FilterStatus::Pause;
        }
        let body = host.request_body(0, buffered_len).unwrap_or_default();
        self.finish(shared, host, pool, api, &body)
    }

    fn finish<H: PickerHost + ?Sized>(
        &mut self,
        shared: &mut PickerShared,
        host: &mut H,
        pool: PoolId,
        api: Api,
        body: &[u8],
    ) -> FilterStatus {
        self.stage = Stage::Done;
        let parsed = match request::parse(api, body) {
            Ok(parsed) => parsed,
            Err(e) => {
                host.send_local_reply(&Reply::bad_request(&e.message(), e.param(), e.code()));
                return FilterStatus::Replied;
            }
        };
        let session = shared
            .session_header(pool)
            .and_then(|name| host.request_header(name));
        let req = PickRequest {
            target_model: &parsed.model,
            prompt: &parsed.prompt,
            cache_salt: parsed.cache_salt.as_deref(),
            prompt_tokens: parsed.prompt_tokens,
            max_output_tokens: parsed.max_output_tokens,
            session: session.as_deref(),
        };
        shared.refresh_snapshot(host);
        let now = host.now();
        let random = host.random_u64();
        match shared.pick(pool, &req, now, random, host) {
            Ok(picked) => {
                host.set_request_header(DESTINATION_ENDPOINT, &picked.endpoint);
                // Best effort: proxy-wasm cannot set dynamic metadata (the header and the
                // upstream override already route the request).
                let _ = host.set_metadata_string(
                    LB_METADATA_NAMESPACE,
                    DESTINATION_ENDPOINT,
                    &picked.endpoint,
                );
                let _ = host.set_upstream_override(&picked.endpoint);
                self.lease = Some(picked.lease);
                self.endpoint = Some(picked.endpoint);
                FilterStatus::Continue
            }
            Err(rejection) => {
                let message = match rejection {
                    Rejection::NoEndpoints => "no endpoint of the pool can take this request",
                    Rejection::StaleMetrics => "the pool's metrics are stale or missing",
                };
                host.send_local_reply(&Reply::rejected(REJECTED_NO_ENDPOINTS, message));
                FilterStatus::Replied
            }
        }
    }

    /// The request ended (completed, reset, or its context is being dropped). Gives the
    /// in-flight lease back the first time; every later call does nothing.
    pub fn on_end(&mut self, shared: &mut PickerShared) {
        self.stage = Stage::Done;
        if let Some(lease) = self.lease.take() {
            shared.release(lease);
        }
    }
}

#[cfg(test)]
mod tests;
