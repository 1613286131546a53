//! The endpoint picker (DESIGN §2, §6, §10): for a request the body router has tagged
//! with `x-gateway-base-model-name`, choose one endpoint of that model's pool and route
//! the request to it.
//!
//! Per request: `on_request_headers` (drops any `x-gateway-destination-endpoint` already
//! present, finds the pool; if the body router left a [`crate::handoff::Handoff`] that fits
//! the pool, picks right there without reading the body; otherwise pauses for the body) →
//! `on_request_body` (parses the body for
//! the prompt, refreshes the snapshot, picks through [`PickerShared::pick`]) → sets
//! `x-gateway-destination-endpoint`, the `envoy.lb` dynamic metadata and the host's
//! upstream override, or answers 503 with `x-llm-d-request-dropped-reason:
//! rejected-no-endpoints` → `on_end` (complete or reset, whichever the adapter sees first;
//! later calls do nothing) gives the in-flight lease back.
//!
//! Requests this picker does not own pass through untouched: no base-model header, a base
//! model no pool serves, or a non-inference path. A malformed body gets the router's 400
//! (the picker does not trust the router to be in front of it).
//!
//! **Locking.** The shared state is reached through a [`PickerAccess`], entered only for
//! the pick itself and to give a lease back. Everything slow happens outside: the pool's
//! immutable [`PoolPlan`] is taken at headers time, the body is read, parsed and hashed
//! into prefix blocks with it ([`PreparedPick`]), and headers, replies and stats are written
//! after the state is released.

pub mod access;
pub mod config;
pub mod lease;
pub mod plan;
mod pool;
pub mod prepare;
pub mod sessions;
pub mod state;

use std::sync::Arc;

use scheduler_core::request::Api;

use crate::handoff::{Handoff, HANDOFF_KEY};
use crate::headers::{BASE_MODEL, DESTINATION_ENDPOINT, LB_METADATA_NAMESPACE};
use crate::host::{
    Clock, DynamicMetadata, LocalReply, Random, RequestBody, RequestHeaders, SnapshotSource, Stats,
    StreamState, UpstreamOverride,
};
use crate::reply::{Reply, REJECTED_NO_ENDPOINTS};
use crate::FilterStatus;

pub use access::{PickerAccess, SharedPicker};
pub use config::{FailureMode, PickerConfig, PickerConfigError, PoolConfig};
pub use lease::InFlightLease;
pub use plan::{PickerPlans, PoolPlan};
pub use prepare::PreparedPick;
pub use state::{PickRequest, Picked, PickerShared, PoolId, Rejection, SnapshotRefresh};

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
    + StreamState
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
        + StreamState
        + ?Sized
{
}

/// Where one request is in the picker.
#[derive(Clone, Debug)]
enum Stage {
    Start,
    AwaitingBody { plan: Arc<PoolPlan>, api: Api },
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
    pub fn on_request_headers<S: PickerAccess, H: PickerHost + ?Sized>(
        &mut self,
        mut shared: S,
        host: &mut H,
        end_of_stream: bool,
    ) -> FilterStatus {
        if !matches!(self.stage, Stage::Start) {
            return FilterStatus::Continue;
        }
        // Only the picker may set the destination: drop whatever came in.
        host.remove_request_header(DESTINATION_ENDPOINT);
        let plan = host
            .request_header(BASE_MODEL)
            .and_then(|base| shared.plan_for(&base));
        let api = host
            .request_header(":path")
            .and_then(|path| Api::from_path(&path));
        let (Some(plan), Some(api)) = (plan, api) else {
            self.stage = Stage::Done;
            return FilterStatus::Continue;
        };
        // The router already held the request until its body was complete and parsed it:
        // if it left a handoff that fits this pool, pick now without touching the body.
        let handoff = host
            .stream_state(HANDOFF_KEY)
            .and_then(|bytes| Handoff::decode(&bytes));
        if let Some(prepared) = handoff.and_then(|h| PreparedPick::from_handoff(&plan, h, host)) {
            plan.count_handoff(host);
            self.stage = Stage::Done;
            return self.decide(shared, host, &plan, prepared);
        }
        self.stage = Stage::AwaitingBody {
            plan: Arc::clone(&plan),
            api,
        };
        if end_of_stream {
            return self.finish(shared, host, &plan, api, &[]);
        }
        FilterStatus::Pause
    }

    /// Body data arrived (`buffered_len` bytes buffered in total). Adapters call this from
    /// the trailers callback too, with `end_of_stream = true`.
    pub fn on_request_body<S: PickerAccess, H: PickerHost + ?Sized>(
        &mut self,
        shared: S,
        host: &mut H,
        buffered_len: usize,
        end_of_stream: bool,
    ) -> FilterStatus {
        let Stage::AwaitingBody { plan, api } = &self.stage else {
            return FilterStatus::Continue;
        };
        if !end_of_stream {
            return FilterStatus::Pause;
        }
        let (plan, api) = (Arc::clone(plan), *api);
        let body = host.request_body(0, buffered_len).unwrap_or_default();
        self.finish(shared, host, &plan, api, &body)
    }

    /// Prepare outside the state, pick inside it, write the outcome outside again.
    fn finish<S: PickerAccess, H: PickerHost + ?Sized>(
        &mut self,
        shared: S,
        host: &mut H,
        plan: &PoolPlan,
        api: Api,
        body: &[u8],
    ) -> FilterStatus {
        self.stage = Stage::Done;
        let prepared = match PreparedPick::new(plan, api, body, host) {
            Ok(prepared) => prepared,
            Err(e) => {
                host.send_local_reply(&Reply::bad_request(&e.message(), e.param(), e.code()));
                return FilterStatus::Replied;
            }
        };
        self.decide(shared, host, plan, prepared)
    }

    /// Pick for a prepared request inside the state; write the outcome outside it.
    fn decide<S: PickerAccess, H: PickerHost + ?Sized>(
        &mut self,
        mut shared: S,
        host: &mut H,
        plan: &PoolPlan,
        prepared: PreparedPick,
    ) -> FilterStatus {
        let req = prepared.request();
        let (refresh, outcome) = shared.with_state(|state| {
            let refresh = state.refresh_snapshot(&*host);
            let outcome = state.pick(plan, &req, prepared.now, prepared.random);
            (refresh, outcome)
        });
        if refresh == SnapshotRefresh::Undecodable {
            plan.count_snapshot_error(host);
        }
        plan.count_decision(&outcome, host);
        match outcome {
            Ok(picked) => {
                // Hold the lease before any host call, so whatever happens next the request's
                // end gives it back.
                self.lease = Some(picked.lease);
                let endpoint: &str = self.endpoint.insert(picked.endpoint);
                host.set_request_header(DESTINATION_ENDPOINT, endpoint);
                // Best effort: proxy-wasm cannot set dynamic metadata (the header and the
                // upstream override already route the request).
                let _ =
                    host.set_metadata_string(LB_METADATA_NAMESPACE, DESTINATION_ENDPOINT, endpoint);
                let _ = host.set_upstream_override(endpoint);
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
    /// in-flight lease back the first time; every later call does nothing (and does not
    /// enter the state).
    pub fn on_end<S: PickerAccess>(&mut self, mut shared: S) {
        self.stage = Stage::Done;
        if let Some(lease) = self.lease.take() {
            shared.with_state(|state| state.release(lease));
        }
    }
}

#[cfg(test)]
mod tests;
