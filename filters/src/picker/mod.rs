//! The endpoint picker: for a request the body router has tagged
//! with `x-gateway-base-model-name`, choose one endpoint of that model's pool and route
//! the request to it.
//!
//! Per request: `on_request_headers` (drops any `x-gateway-destination-endpoint` already
//! present, finds the pool: the one of the cluster Envoy's route chose, else the first
//! serving the base model; if the body router left a [`crate::handoff::Handoff`] that fits
//! the pool, picks right there without reading the body; otherwise pauses for the body) →
//! `on_request_body` (parses the body for the prompt, reads the subset hint, refreshes the
//! snapshot, picks through [`PickerShared::pick_within`]) → sets
//! `x-gateway-destination-endpoint` and the `envoy.lb` dynamic metadata to the ordered list
//! `pick,fallback,...` (the pool cluster's `override_host` policy takes the pick, a retry
//! the next entry), or answers 503 with `x-llm-d-request-dropped-reason:
//! rejected-no-endpoints` → [`PickerRequest::on_response_headers`] (names the endpoint
//! that served in `x-gateway-destination-endpoint-served`; when a retry moved the request
//! to a fallback, the lease, the prompt's blocks and the session move there) →
//! [`PickerRequest::on_end_counted`] (complete or reset, whichever the adapter sees first;
//! later calls do nothing) gives the in-flight lease back.
//! The gauges `infergate.picker.inflight_requests.pool.<p>` and
//! `….pool.<p>.endpoint.<e>` move by +1 when a lease is taken and −1 when it is given back,
//! so they read 0 whenever no request is in flight, in both flavours (in Wasm every VM's
//! deltas add up in the one Envoy stat).
//!
//! Requests this picker does not own pass through untouched: no base-model header, or a
//! non-inference path. A request whose base model (set by the body router) no pool of this
//! picker serves is answered 503 `rejected-no-endpoints` naming the model: the router
//! routed it to a pool the picker does not know, which is a configuration gap, and passing
//! it on would leave the answer to whatever the route's cluster does without a pick (an
//! `ORIGINAL_DST` cluster with no destination: 503; a static cluster: round robin past
//! the picker). A malformed body gets the router's 400 (the picker does not trust the
//! router to be in front of it).
//!
//! **Locking.** The shared state is reached through a [`PickerAccess`], entered only for
//! the pick itself and to give a lease back. Everything slow happens outside: the pool's
//! immutable [`PoolPlan`] is taken at headers time, the body is read, parsed and hashed
//! into prefix blocks with it ([`PreparedPick`]), and headers, replies and stats are written
//! after the state is released.

pub mod access;
pub mod admit;
pub mod config;
pub mod disagg;
pub mod lease;
pub mod plan;
mod pool;
pub mod prepare;
pub mod remote;
pub mod sessions;
pub mod state;

use std::sync::Arc;

use scheduler_core::request::Api;

use crate::flow::{
    read_state_number, record_queued_ms, Admission, DropReason, QueueSlot, Verdict, SERVICE_STATE,
};
use crate::handoff::{Handoff, HANDOFF_KEY};
use crate::headers::{
    BASE_MODEL, DESTINATION_ENDPOINT, DESTINATION_SERVED, LB_METADATA_NAMESPACE, MAX_RETRIES,
};
use crate::host::{
    Clock, DynamicMetadata, EditResponseHeaders, LocalReply, Random, ReadMetadata, RequestBody,
    RequestHeaders, RoutedCluster, ServedUpstream, SnapshotSource, Stats, StreamState,
};
use crate::reply::{truncate_for_message, Reply, MAX_QUOTED_BYTES, REJECTED_NO_ENDPOINTS};
use crate::FilterStatus;
use admit::{Admitted, Waiter};
use scheduler_core::flow::QueueKey;
use scheduler_core::types::BlockHash;

pub use access::{PickerAccess, SharedPicker};
pub use config::{FailureMode, PickerConfig, PickerConfigError, PoolConfig};
pub use lease::InFlightLease;
pub use plan::{PickerPlans, PoolPlan, UnscrapedReport};
pub use prepare::PreparedPick;
pub use state::{
    PickRequest, Picked, PickerShared, PoolId, PreciseTarget, Rejection, SnapshotRefresh,
};

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
    + ReadMetadata
    + RoutedCluster
    + ServedUpstream
    + EditResponseHeaders
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
        + ReadMetadata
        + RoutedCluster
        + ServedUpstream
        + EditResponseHeaders
        + StreamState
        + ?Sized
{
}

/// Where one request is in the picker.
#[derive(Clone, Debug)]
enum Stage {
    Start,
    AwaitingBody {
        plan: Arc<PoolPlan>,
        api: Api,
    },
    /// Prepared and handed to a state that lives elsewhere; waiting for its answer.
    AwaitingAnswer {
        plan: Arc<PoolPlan>,
        prepared: PreparedPick,
    },
    /// Waiting in the pool's flow gate (in this process's memory) for its verdict.
    Queued {
        plan: Arc<PoolPlan>,
        prepared: PreparedPick,
        slot: Arc<QueueSlot>,
        key: QueueKey,
    },
    Done,
}

/// What a routed request keeps to correct the state if another endpoint of its pool
/// serves it: the pool, and the prompt's blocks and session the pick recorded.
#[derive(Debug)]
struct PickMemo {
    plan: Arc<PoolPlan>,
    block_hashes: Vec<BlockHash>,
    session: Option<String>,
}

/// Where the response says the request went, when it was not the pick.
#[derive(Debug, PartialEq, Eq)]
pub struct ServedElsewhere {
    /// `ip:port` of the endpoint that served (the state that holds the lease checks that
    /// it is a current member of the pool).
    pub endpoint: String,
    /// The prompt's blocks, to record for it.
    pub block_hashes: Vec<BlockHash>,
    /// The request's session, to remember it there.
    pub session: Option<String>,
}

/// The picker's state for one request.
#[derive(Debug)]
pub struct PickerRequest {
    stage: Stage,
    lease: Option<InFlightLease>,
    /// Set once routed: what a served-elsewhere correction needs.
    memo: Option<PickMemo>,
    /// The request's share of its pool's flow-control load once admitted, with the pool
    /// whose queue its end offers the freed capacity to.
    ticket: Option<(Admitted, Arc<PoolPlan>)>,
    endpoint: Option<String>,
    /// Whether the pick is made by a state elsewhere ([`PickerRequest::deferred`]).
    deferred: bool,
    /// A handoff passed in by a stage of the same pipeline ([`PickerRequest::offered`]).
    offered: Option<Handoff>,
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
            memo: None,
            ticket: None,
            endpoint: None,
            deferred: false,
            offered: None,
        }
    }

    /// Gives the request the router's handoff directly (a route stage of the same
    /// pipeline); without one, the headers callback reads the stream's filter state.
    pub fn offered(&mut self, handoff: Option<Handoff>) -> &mut Self {
        if handoff.is_some() {
            self.offered = handoff;
        }
        self
    }

    /// A request whose pick a state elsewhere makes (the Wasm flavour's state owner, see
    /// [`remote`]): once the request is prepared it pauses, the adapter sends
    /// [`PickerRequest::pending_pick`] to the owner and hands the answer to
    /// [`PickerRequest::on_answer`]. The lease then lives with the owner.
    pub fn deferred() -> Self {
        let mut request = PickerRequest::new();
        request.deferred = true;
        request
    }

    /// The prepared pick waiting for the owner's answer, with its pool.
    pub fn pending_pick(&self) -> Option<(PoolId, &PreparedPick)> {
        match &self.stage {
            Stage::AwaitingAnswer { plan, prepared } => Some((plan.id(), prepared)),
            _ => None,
        }
    }

    /// Make the pending pick in `shared` after all (the owner cannot be reached).
    pub fn pick_here<S: PickerAccess, H: PickerHost + ?Sized>(
        &mut self,
        shared: S,
        host: &mut H,
    ) -> FilterStatus {
        match std::mem::replace(&mut self.stage, Stage::Done) {
            Stage::AwaitingAnswer { plan, prepared } => {
                self.decide_here(shared, host, &plan, prepared)
            }
            other => {
                self.stage = other;
                FilterStatus::Continue
            }
        }
    }

    /// The owner's answer to the pending pick: the endpoint, its fallbacks and the
    /// prefiller (when disaggregated), or why there is none. `None` if this request is not
    /// waiting for one (the adapter then leaves it alone).
    pub fn on_answer<H: PickerHost + ?Sized>(
        &mut self,
        host: &mut H,
        answer: Result<(&str, &[String], Option<&str>), Rejection>,
    ) -> Option<FilterStatus> {
        let Stage::AwaitingAnswer { plan, mut prepared } =
            std::mem::replace(&mut self.stage, Stage::Done)
        else {
            return None;
        };
        if answer.is_ok() {
            self.keep_memo(&plan, &mut prepared);
        }
        let outcome = answer.map(|(endpoint, fallbacks, prefiller)| Destination {
            endpoint: endpoint.to_owned(),
            fallbacks: fallbacks.to_vec(),
            prefiller: prefiller.map(str::to_owned),
        });
        Some(self.settle(host, outcome))
    }

    /// Keep what a served-elsewhere correction needs from a routed request's preparation.
    fn keep_memo(&mut self, plan: &Arc<PoolPlan>, prepared: &mut PreparedPick) {
        let (block_hashes, session) = prepared.take_served_memo();
        self.memo = Some(PickMemo {
            plan: Arc::clone(plan),
            block_hashes,
            session,
        });
    }

    /// The slot this request waits in, while its pool's flow gate holds it: the caller
    /// [`QueueSlot::wait`]s on it with the request's waker and calls
    /// [`PickerRequest::on_verdict`] when woken.
    pub fn queued_slot(&self) -> Option<Arc<QueueSlot>> {
        match &self.stage {
            Stage::Queued { slot, .. } => Some(Arc::clone(slot)),
            _ => None,
        }
    }

    /// Whether the request waits in its pool's flow gate (in this process's memory).
    pub fn is_queued(&self) -> bool {
        matches!(self.stage, Stage::Queued { .. })
    }

    /// The queued request's verdict, if it is in: dispatched (pick now, holding the
    /// ticket) or dropped (answer 429). `None` while it still waits.
    pub fn on_verdict<S: PickerAccess, H: PickerHost + ?Sized>(
        &mut self,
        shared: S,
        host: &mut H,
    ) -> Option<FilterStatus> {
        let Stage::Queued { slot, .. } = &self.stage else {
            return None;
        };
        let verdict = slot.take()?;
        let Stage::Queued { plan, prepared, .. } = std::mem::replace(&mut self.stage, Stage::Done)
        else {
            return None;
        };
        let flow = plan.flow()?;
        flow.count_queued(host, prepared.flow(), -1);
        match verdict {
            Verdict::Dispatched { ticket, queued_ms } => {
                flow.count_dispatched(host, prepared.flow(), queued_ms);
                self.ticket = Some((flow.admitted(ticket, &prepared), Arc::clone(&plan)));
                record_queued_ms(host, queued_ms);
                Some(self.decide_here(shared, host, &plan, prepared))
            }
            Verdict::Dropped { reason, queued_ms } => {
                flow.count_rejected(host, prepared.flow(), reason);
                record_queued_ms(host, queued_ms);
                host.send_local_reply(&Reply::dropped(reason));
                Some(FilterStatus::Replied)
            }
        }
    }

    /// The endpoint picked for this request, once picked.
    pub fn endpoint(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }

    /// Whether this request currently counts in an endpoint's in-flight load, or in its
    /// pool's flow control (queued or admitted): whether its end has anything to give back.
    pub fn holds_lease(&self) -> bool {
        self.lease.is_some() || self.ticket.is_some() || self.is_queued()
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
        // Only the picker may set the destination (and the prefiller): drop whatever came in.
        host.remove_request_header(DESTINATION_ENDPOINT);
        host.remove_request_header(disagg::PREFILLER_HEADER);
        let base = host.request_header(BASE_MODEL);
        // The pool is the one of the cluster Envoy's route chose (a weighted split across
        // pools of one model included), else the one serving the base model.
        let plan = base.as_deref().and_then(|base| {
            let cluster = host.routed_cluster();
            let plan = shared.plan_for(cluster.as_deref(), base)?;
            if cluster.as_deref() != Some(plan.cluster()) {
                plan.count_by_base_model(host);
            }
            Some(plan)
        });
        let api = host
            .request_header(":path")
            .and_then(|path| Api::from_path(&path));
        let (Some(plan), Some(api)) = (plan, api) else {
            self.stage = Stage::Done;
            if let (Some(base), Some(_)) = (base, api) {
                return self.reject_no_pool(shared, host, &base);
            }
            return FilterStatus::Continue;
        };
        // The router already held the request until its body was complete and parsed it:
        // if it left a handoff that fits this pool, pick now without touching the body.
        let handoff = self.offered.take().or_else(|| {
            host.stream_state(HANDOFF_KEY)
                .and_then(|bytes| Handoff::decode(&bytes))
        });
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

    /// 503 for an inference request whose base model no pool of this picker serves.
    fn reject_no_pool<S: PickerAccess, H: PickerHost + ?Sized>(
        &mut self,
        mut shared: S,
        host: &mut H,
        base_model: &str,
    ) -> FilterStatus {
        let plans = shared.with_state(|state| state.plans());
        plans.count_no_pool(host);
        let message = format!(
            "no endpoint pool of the picker serves the model `{}`",
            truncate_for_message(base_model, MAX_QUOTED_BYTES)
        );
        host.send_local_reply(&Reply::rejected(REJECTED_NO_ENDPOINTS, &message));
        FilterStatus::Replied
    }

    /// Prepare outside the state, pick inside it, write the outcome outside again.
    fn finish<S: PickerAccess, H: PickerHost + ?Sized>(
        &mut self,
        shared: S,
        host: &mut H,
        plan: &Arc<PoolPlan>,
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

    /// Pick for a prepared request (or, deferred, wait for the owner's pick).
    fn decide<S: PickerAccess, H: PickerHost + ?Sized>(
        &mut self,
        shared: S,
        host: &mut H,
        plan: &Arc<PoolPlan>,
        prepared: PreparedPick,
    ) -> FilterStatus {
        if prepared.subset().is_some_and(<[String]>::is_empty) {
            plan.count_decision(&Err(Rejection::NoEndpoints), host);
            host.send_local_reply(&Reply::rejected(
                REJECTED_NO_ENDPOINTS,
                "the subset hint names no endpoint of the pool",
            ));
            return FilterStatus::Replied;
        }
        if self.deferred {
            self.stage = Stage::AwaitingAnswer {
                plan: Arc::clone(plan),
                prepared,
            };
            return FilterStatus::Pause;
        }
        self.decide_here(shared, host, plan, prepared)
    }

    /// Pick inside the state; write the outcome outside it. With flow control, the pool's
    /// gate admits the request first, or queues it ([`PickerRequest::queued_slot`]), or
    /// refuses it.
    fn decide_here<S: PickerAccess, H: PickerHost + ?Sized>(
        &mut self,
        shared: S,
        host: &mut H,
        plan: &Arc<PoolPlan>,
        prepared: PreparedPick,
    ) -> FilterStatus {
        if let (Some(flow), None) = (plan.flow(), &self.ticket) {
            let slot = QueueSlot::new();
            let (arrival, tokens) = flow.arrival(&prepared);
            match flow
                .gate()
                .admit(arrival, tokens, || Waiter::Local(Arc::clone(&slot)))
            {
                Admission::Admitted(ticket) => {
                    self.ticket = Some((flow.admitted(ticket, &prepared), Arc::clone(plan)));
                }
                Admission::Queued(key) => {
                    flow.count_queued(host, prepared.flow(), 1);
                    self.stage = Stage::Queued {
                        plan: Arc::clone(plan),
                        prepared,
                        slot,
                        key,
                    };
                    return FilterStatus::Pause;
                }
                Admission::Refused => {
                    flow.count_rejected(host, prepared.flow(), DropReason::Saturated);
                    host.send_local_reply(&Reply::dropped(DropReason::Saturated));
                    return FilterStatus::Replied;
                }
            }
        }
        let mut prepared = prepared;
        let outcome = pick_counted(shared, host, plan, &prepared).map(|picked| {
            // Hold the lease before any host call, so whatever happens next the request's
            // end gives it back (and lowers the gauges `pick_counted` raised).
            self.lease = Some(picked.lease);
            Destination {
                endpoint: picked.endpoint,
                fallbacks: picked.fallbacks,
                prefiller: picked.prefiller,
            }
        });
        if outcome.is_ok() {
            self.keep_memo(plan, &mut prepared);
        }
        self.settle(host, outcome)
    }

    /// Route to the picked endpoint, or answer the rejection's 503.
    fn settle<H: PickerHost + ?Sized>(
        &mut self,
        host: &mut H,
        outcome: Result<Destination, Rejection>,
    ) -> FilterStatus {
        match outcome {
            Ok(destination) => self.route_to(host, destination),
            Err(rejection) => {
                host.send_local_reply(&Reply::rejected(REJECTED_NO_ENDPOINTS, rejection.message()));
                FilterStatus::Replied
            }
        }
    }

    /// Send the request to its destination: the ordered list `pick,fallback,...` in the
    /// destination header and the `envoy.lb` metadata, which the pool cluster's
    /// `override_host` policy reads (the first attempt takes the pick, a retry the next
    /// entry). No upstream override is set: it would pin every retry to the pick.
    fn route_to<H: PickerHost + ?Sized>(
        &mut self,
        host: &mut H,
        destination: Destination,
    ) -> FilterStatus {
        let list = destination.list();
        host.set_request_header(DESTINATION_ENDPOINT, &list);
        // At most one retry per fallback: a retry past the list would leave the pool's choice.
        host.set_request_header(MAX_RETRIES, &destination.fallbacks.len().to_string());
        self.endpoint = Some(destination.endpoint);
        if let Some(prefiller) = &destination.prefiller {
            host.set_request_header(disagg::PREFILLER_HEADER, prefiller);
        }
        // Best effort: proxy-wasm cannot set dynamic metadata (the header already routes
        // the request).
        let _ = host.set_metadata_string(LB_METADATA_NAMESPACE, DESTINATION_ENDPOINT, &list);
        FilterStatus::Continue
    }

    /// The response headers pass: say which endpoint served (response header
    /// `x-gateway-destination-endpoint-served`), and when a retry moved the request off the
    /// pick to another endpoint of the pool, count it and correct the state: the in-flight
    /// lease moves there and the prompt's blocks and session are recorded for it. A request
    /// whose lease lives elsewhere (the Wasm owner's) gets the correction to send there
    /// instead. Runs once; `None` when there is nothing (more) to correct here.
    pub fn on_response_headers<S: PickerAccess, H: PickerHost + ?Sized>(
        &mut self,
        mut shared: S,
        host: &mut H,
    ) -> Option<ServedElsewhere> {
        let picked = self.endpoint.as_deref()?;
        let served = host.served_upstream()?;
        host.set_response_header(DESTINATION_SERVED, &served);
        // Taken either way: the response has started, nothing later corrects the pick.
        let memo = self.memo.take();
        if served == picked {
            return None;
        }
        let memo = memo?;
        let Some(lease) = self.lease.as_mut() else {
            memo.plan.count_served_elsewhere(host);
            self.endpoint = Some(served.clone());
            return Some(ServedElsewhere {
                endpoint: served,
                block_hashes: memo.block_hashes,
                session: memo.session,
            });
        };
        // Only a current member of the pool takes the lease (a host outside it, or one
        // removed meanwhile, leaves the lease where it was picked).
        if !shared.with_shared(|state| state.move_lease(&memo.plan, lease, &served, host)) {
            return None;
        }
        memo.plan.count_served_elsewhere(host);
        self.endpoint = Some(served.clone());
        shared.with_shared(|state| {
            state.record_served(
                &memo.plan,
                &served,
                &memo.block_hashes,
                memo.session.as_deref(),
            )
        });
        None
    }

    /// The request ended (completed, reset, aborted, answered locally, or its context is
    /// being dropped). Gives the in-flight lease back and lowers the in-flight gauges the
    /// first time; every later call does nothing (and does not enter the state).
    /// A request still queued leaves the queue (counted `rejected-context-cancelled`); the
    /// capacity its end frees is offered to the pool's queued requests.
    pub fn on_end_counted<S: PickerAccess, H: Stats + Clock + StreamState + ?Sized>(
        &mut self,
        _shared: S,
        stats: &mut H,
    ) {
        let stage = std::mem::replace(&mut self.stage, Stage::Done);
        let now = stats.now().0;
        if let Stage::Queued {
            plan,
            prepared,
            slot,
            key,
        } = &stage
        {
            if let Some(flow) = plan.flow() {
                // Still queued: taken out. Expired meanwhile: counted as what it was.
                // Dispatched meanwhile (its verdict in the slot, or on its way there): the
                // ticket is dropped with the verdict, and the capacity goes to the next
                // request at the dispatch here (or the timer's, if the verdict lands later).
                let reason = if flow.gate().cancel(*key, now).is_some() {
                    DropReason::ContextCancelled
                } else {
                    match slot.take() {
                        Some(Verdict::Dropped { reason, .. }) => reason,
                        _ => DropReason::ContextCancelled,
                    }
                };
                flow.count_queued(stats, prepared.flow(), -1);
                flow.count_rejected(stats, prepared.flow(), reason);
                flow.run(now);
            }
        }
        if let Some(lease) = self.lease.take() {
            lease.end(stats);
        }
        if let Some((admitted, plan)) = self.ticket.take() {
            if let Some(flow) = plan.flow() {
                if let Some(service) = read_state_number(&*stats, SERVICE_STATE) {
                    flow.settle(&admitted, service);
                }
                admitted.release();
                flow.run(now);
            }
        }
    }

    /// [`PickerRequest::on_end_counted`] for an end with no stats host at hand (the native
    /// adapter's unreachable destroy without a hook pointer): gives the lease back; the
    /// gauge decrement is owed and paid by the pool's next request (see [`lease`]).
    /// Dropping the request does the same. Adapters call `on_end_counted`.
    /// A request still queued leaves its pool's queue (uncounted: there is no host).
    pub fn on_end<S: PickerAccess>(&mut self, _shared: S) {
        self.leave_queue();
        self.stage = Stage::Done;
        drop(self.lease.take());
        drop(self.ticket.take());
    }

    /// Take a request still queued out of its pool's queue, without a host.
    fn leave_queue(&self) {
        if let Stage::Queued {
            plan,
            prepared,
            key,
            ..
        } = &self.stage
        {
            if let Some(flow) = plan.flow() {
                drop(flow.gate().cancel(*key, prepared.now.0));
            }
        }
    }
}

impl Drop for PickerRequest {
    /// A request dropped while queued (its context went without an end event) leaves the
    /// queue, as its lease and ticket give themselves back.
    fn drop(&mut self) {
        self.leave_queue();
    }
}

/// Where a routed request goes: the pick, then the fallbacks in order.
#[derive(Debug)]
struct Destination {
    endpoint: String,
    fallbacks: Vec<String>,
    /// The prefill endpoint of a disaggregated request (see [`disagg`]).
    prefiller: Option<String>,
}

impl Destination {
    /// The destination list: `pick,fallback,...`.
    fn list(&self) -> String {
        let mut list = self.endpoint.clone();
        for fallback in &self.fallbacks {
            list.push(',');
            list.push_str(fallback);
        }
        list
    }
}

/// The part of a pick that needs the state, and its stats: refresh the snapshot, pick,
/// report endpoints the snapshot lacks, count the decision, and raise the in-flight gauges
/// for a lease taken. The picker's own requests and the Wasm flavour's state owner
/// ([`remote::Owner`]) both pick through here.
pub(crate) fn pick_counted<S: PickerAccess, H: SnapshotSource + Stats + ?Sized>(
    mut shared: S,
    host: &mut H,
    plan: &PoolPlan,
    prepared: &PreparedPick,
) -> Result<Picked, Rejection> {
    let req = prepared.request();
    let (refresh, outcome, reports, plans) = shared.with_shared(|state| {
        let refresh = state.refresh_snapshot(&*host);
        let outcome =
            state.pick_within(plan, &req, prepared.subset(), prepared.now, prepared.random);
        let reports = state.take_unscraped_reports();
        // Only when there is something to report: the plans' `Arc` costs an atomic.
        let plans = (!reports.is_empty()).then(|| state.plans());
        (refresh, outcome, reports, plans)
    });
    if refresh == SnapshotRefresh::Undecodable {
        plan.count_snapshot_error(host);
    }
    if let Some(plans) = plans {
        for report in &reports {
            if let Some(p) = plans.get(report.pool) {
                p.report_unscraped(report, host);
            }
        }
    }
    plan.count_decision(&outcome, host);
    let mut outcome = outcome;
    if let Ok(picked) = &mut outcome {
        picked.lease.raise_gauges(host);
    }
    outcome
}

#[cfg(test)]
mod tests;
