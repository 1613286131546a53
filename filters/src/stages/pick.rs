//! The endpoint picker as a pipeline stage: for a request the body router tagged with
//! `x-gateway-base-model-name`, choose one endpoint of that model's pool, route the
//! request to it, and hold its in-flight lease until the request ends.
//!
//! Per request, around the picker's decisions ([`crate::picker`]):
//!
//! 1. **Headers.** Any `x-gateway-destination-endpoint` (and prefiller header) already
//!    present is dropped. The pool is the one of the cluster Envoy's route chose, else the
//!    first serving the base model. If the router left a [`Handoff`] that fits the pool (in
//!    the request's context when it ran in this pipeline, else in the stream's filter
//!    state), the pick happens right there without reading the body; otherwise the stage
//!    asks for the body.
//! 2. **Body.** The body is parsed for the prompt and the subset hint ([`PreparedPick`]).
//! 3. **Decision.** With flow control, the pool's gate admits the request first, queues it
//!    (the stage pauses until the dispatcher wakes it) or refuses it (429). The pick
//!    (`crate::picker::pick_counted`) sets `x-gateway-destination-endpoint` and the
//!    `envoy.lb` dynamic metadata to the ordered list `pick,fallback,...` (the pool
//!    cluster's `override_host` policy takes the pick, a retry the next entry), or answers
//!    503 with `x-llm-d-request-dropped-reason: rejected-no-endpoints`.
//! 4. **Response headers.** The endpoint that served is named in
//!    `x-gateway-destination-endpoint-served`; when a retry moved the request to a
//!    fallback, the lease, the prompt's blocks and the session move there.
//! 5. **End.** The lease and the flow ticket are given back, once, whatever ends the
//!    request; a request still queued leaves its queue.
//!
//! **Eviction.** A routed request of a sheddable band, in a pool with `enableEviction`,
//! keeps an [`EvictSignal`] armed with its waker. When a request of a higher band is queued
//! and chooses it, the signal is raised and the request woken while no stage holds it:
//! [`Stage::on_signal`] answers 429 `evicted-by-priority` if no response header passed, or
//! resets the stream, and leaves the reason in the stream's state for the billing record.
//!
//! The pipeline tracks the wait for the body and the pauses; the stage keeps what it knows
//! about the request in the context ([`Picking`]): the pool and API while the body comes,
//! why it is paused, and what it holds once routed.
//!
//! Requests this stage does not own pass through untouched: no base-model header, or a
//! non-inference path. A request whose base model no pool serves is answered 503
//! `rejected-no-endpoints` naming the model (a configuration gap: passing it on would leave
//! the answer to whatever the route's cluster does without a pick). A malformed body gets
//! the router's 400 (the picker does not trust the router to be in front of it).
//!
//! Where the picker state lives is the adapter's choice, expressed as a [`PickerStore`]:
//! the native flavour's one state per Envoy process is an `Arc<SharedPicker>`; a VM's own
//! state is a [`PickerShared`]. A store may also offer [`RemotePicks`]: a state that lives
//! elsewhere and answers by message (the Wasm flavour, whose workers cannot share memory,
//! sends its picks to one owner per Envoy process, see [`crate::picker::remote`]). Then the
//! stage prepares the request here (parse, hash), submits it with the request's
//! [`Waker`], takes the answer at once if it is already in (the owner runs in this same
//! VM), else pauses and takes it on resume: route to the endpoint and hold the
//! owner's lease until the request ends, or answer the rejection, or, when the store says
//! no answer will come, pick in the local state after all.
//!
//! **Locking.** The state is reached through a [`PickerAccess`], entered only for the pick
//! itself and to move a lease. Everything slow happens outside: the pool's immutable
//! [`PoolPlan`] is taken at the headers, the body is read, parsed and hashed with it, and
//! headers, replies and stats are written after the state is released.

use std::any::Any;
use std::sync::Arc;

use scheduler_core::flow::QueueKey;
use scheduler_core::request::Api;
use scheduler_core::types::{BlockHash, Millis};

use crate::flow::{
    read_state_number, record_queued_ms, Admission, DropReason, EvictSignal, Evictee, QueueSlot,
    Verdict, EVICTED_STATE, SERVICE_STATE,
};
use crate::handoff::{Handoff, HANDOFF_KEY};
use crate::headers::{
    ClientHeadersStripped, BASE_MODEL, DESTINATION_ENDPOINT, DESTINATION_SERVED,
    LB_METADATA_NAMESPACE, MAX_RETRIES, PEER_HOP, PEER_ROUTE,
};
use crate::host::{Clock, LocalReply, RequestWaker, RouteRefresh, Stats, StreamState, Waker};
use crate::picker::admit::{Admitted, Waiter};
use crate::picker::disagg::PREFILLER_HEADER;
use crate::picker::peers::PeerPlan;
use crate::picker::timing::{ResponseTimer, ResponseTiming};
use crate::picker::{
    pick_counted, InFlightLease, PickerAccess, PickerHost, PickerShared, PoolId, PoolPlan,
    PreparedPick, Rejection, ServedElsewhere, SharedPicker,
};
use crate::pipeline::{reply, BodyProgress, EndCause, RequestContext, Stage};
use crate::reply::{truncate_for_message, Reply, MAX_QUOTED_BYTES, REJECTED_NO_ENDPOINTS};
use crate::FilterStatus;

use super::export;

/// Where a [`PickStage`] reaches the picker state.
pub trait PickerStore {
    /// The accessor one call uses.
    type Access<'a>: PickerAccess
    where
        Self: 'a;

    /// Access for one call; `None` if the state is busy (a re-entrant call on one thread).
    fn access(&self) -> Option<Self::Access<'_>>;

    /// The state that makes the picks, when it lives elsewhere; `None`: pick in
    /// [`PickerStore::access`].
    fn remote(&self) -> Option<&dyn RemotePicks> {
        None
    }
}

/// A picker state elsewhere, answering picks by message (module doc).
pub trait RemotePicks {
    /// Send `prepared` to be picked in `pool`; `waker` wakes the request once the answer is
    /// in, unless it is in before this returns (the stage asks for it at once, and the
    /// store then drops the waker unused). The ticket to take the answer with, or why it
    /// could not be sent (the stage then picks locally; the store has counted and logged
    /// it).
    fn submit(&self, pool: PoolId, prepared: &PreparedPick, waker: Waker) -> Result<u64, String>;

    /// The answer for `ticket`, once it arrived (taken: a second call answers `None`).
    fn take_answer(&self, ticket: u64) -> Option<RemoteAnswer>;

    /// The request of `ticket` stopped waiting (it ended before the answer).
    fn forget(&self, ticket: u64);

    /// The request holding `lease` (a [`RemoteAnswer::Picked`] lease) ends: `service`
    /// reads what it received (prompt + 2 × completion tokens, when its usage showed it),
    /// for the lease to carry back so the state's flow control corrects its estimate. A
    /// store calls it only for leases of a pool with flow control (it is a host call).
    fn report_service(&self, lease: &mut dyn Any, service: &mut dyn FnMut() -> Option<u64>) {
        let _ = (lease, service);
    }

    /// The response of the request holding `lease` started: tell the state, for which the
    /// request no longer counts among its endpoint's prefills in progress. Best effort.
    fn report_started(&self, lease: &mut dyn Any) {
        let _ = lease;
    }

    /// The request holding `lease` ends having measured `timing` of its endpoint, for the
    /// lease to carry back to the state's latency estimates.
    fn report_timing(&self, lease: &mut dyn Any, timing: ResponseTiming) {
        let _ = (lease, timing);
    }

    /// The request holding `lease` was served by another endpoint of its pool than the
    /// pick (a retry took a fallback): tell the state, which moves the lease there and
    /// records the prompt's blocks for it. Best effort.
    fn report_served(&self, lease: &mut dyn Any, served: &ServedElsewhere) {
        let _ = (lease, served);
    }
}

/// What the remote state answered.
pub enum RemoteAnswer {
    /// Route to `endpoint`; `lease` gives the in-flight load back when dropped.
    Picked {
        /// `ip:port` of the endpoint.
        endpoint: String,
        /// The endpoints to try next, in order.
        fallbacks: Vec<String>,
        /// The endpoint that prefills the prompt, when the pool disaggregates it.
        prefiller: Option<String>,
        /// The owner's lease, held in the request's context until it ends.
        lease: Box<dyn Any>,
        /// How long the request waited in its pool's queue, if the pool has flow control.
        queued_ms: Option<u64>,
        /// The signal the remote state raises to evict the request, when it may be.
        eviction: Option<Arc<EvictSignal>>,
        /// The endpoint is a peer cluster's gateway ([`crate::picker::peers`]).
        peer: bool,
    },
    /// Answer 503 for this reason.
    Rejected(Rejection),
    /// Flow control dropped the request: answer 429 for this reason.
    Dropped {
        /// Why.
        reason: DropReason,
        /// How long it waited.
        queued_ms: u64,
    },
    /// No answer will come (the owner is silent or lost the state): pick here, for this
    /// reason (already counted and logged by the store).
    PickHere(String),
}

impl core::fmt::Debug for RemoteAnswer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RemoteAnswer::Picked { endpoint, .. } => write!(f, "Picked({endpoint})"),
            RemoteAnswer::Rejected(r) => write!(f, "Rejected({r:?})"),
            RemoteAnswer::Dropped { reason, .. } => write!(f, "Dropped({reason:?})"),
            RemoteAnswer::PickHere(why) => write!(f, "PickHere({why})"),
        }
    }
}

impl PickerStore for Arc<SharedPicker> {
    type Access<'a> = &'a SharedPicker;

    fn access(&self) -> Option<&SharedPicker> {
        Some(self)
    }
}

impl PickerStore for PickerShared {
    type Access<'a> = &'a PickerShared;

    fn access(&self) -> Option<&PickerShared> {
        Some(self)
    }
}

/// The picker stage over the state in `P`.
#[derive(Clone, Debug)]
pub struct PickStage<P> {
    store: P,
}

/// What the pick stage knows about one request (in the request's context).
#[derive(Default)]
pub struct Picking {
    /// While the stage waits for the body: the pool and the API to parse it as.
    body: Option<(Arc<PoolPlan>, Api)>,
    /// Why the request is paused, while it is.
    waiting: Option<Waiting>,
    /// The in-flight lease of a pick made in this process's state.
    lease: Option<InFlightLease>,
    /// The lease of a pick the remote state made (it gives the load back when dropped).
    remote_lease: Option<Box<dyn Any>>,
    /// The request's share of its pool's flow-control load once admitted, with the pool
    /// whose queue its end offers the freed capacity to.
    ticket: Option<(Admitted, Arc<PoolPlan>)>,
    /// Set once routed: what a served-elsewhere correction needs.
    memo: Option<PickMemo>,
    /// The endpoint the request was routed to (or, after a retry, served by).
    endpoint: Option<String>,
    /// The destination list given to Envoy: the pick, then its fallbacks.
    destinations: Option<String>,
    /// The router ran in this pipeline (its handoff came in the context), so a stage here
    /// reads the destinations from this context, not from the stream's state.
    router_in_pipeline: bool,
    /// The response's clock, from the moment the request was routed.
    timer: Option<ResponseTimer>,
    /// The response's first chunk passed (its prefill is over).
    started: bool,
    /// The response's headers passed: from here on, stopping the request resets it.
    responding: bool,
    /// Set while the request may be evicted: the signal that says it was, and what its
    /// count needs.
    eviction: Option<Eviction>,
}

/// What an evictable request keeps: the signal, and its pool, band and flow to count it.
struct Eviction {
    signal: Arc<EvictSignal>,
    plan: Arc<PoolPlan>,
    band: i32,
    flow: String,
}

impl Picking {
    /// Offer the request, admitted in its pool's flow gate and just routed, for eviction
    /// when its band is sheddable and the pool evicts: its signal wakes it through a waker
    /// of its own. Best effort: without a waker, the request is simply not offered.
    fn offer_for_eviction<H: RequestWaker + ?Sized>(&mut self, host: &mut H) {
        let Some((admitted, plan)) = &mut self.ticket else {
            return;
        };
        let Some(flow) = plan.flow() else {
            return;
        };
        if !flow.gate().evicts(admitted.band()) {
            return;
        }
        let Ok(waker) = host.request_waker() else {
            return;
        };
        let signal = EvictSignal::new();
        signal.arm(waker);
        if admitted.make_evictable(Evictee::Local(Arc::clone(&signal))) {
            self.eviction = Some(Eviction {
                signal,
                plan: Arc::clone(plan),
                band: admitted.band(),
                flow: admitted.flow().to_owned(),
            });
        }
    }

    /// Keep the remote state's eviction signal of a routed request, armed with a waker (a
    /// signal raised before the request took its answer is acted on by the caller).
    fn keep_remote_eviction<H: RequestWaker + ?Sized>(
        &mut self,
        host: &mut H,
        signal: Arc<EvictSignal>,
        plan: &Arc<PoolPlan>,
        prepared: &PreparedPick,
    ) {
        let Some(flow) = plan.flow() else {
            return;
        };
        if let Ok(waker) = host.request_waker() {
            signal.arm(waker);
        }
        self.eviction = Some(Eviction {
            signal,
            plan: Arc::clone(plan),
            band: flow.gate().band_for(prepared.flow().priority),
            flow: prepared.flow().fairness_id.clone(),
        });
    }

    /// The request was evicted: count it, leave the reason for the billing record, and stop
    /// it: 429 `evicted-by-priority` before its response started, a reset after. `None` when
    /// it was not (a spurious wake).
    fn evict_if_signalled<H: PickerHost + ?Sized>(&mut self, host: &mut H) -> Option<FilterStatus> {
        if !self.eviction.as_ref()?.signal.raised() {
            return None;
        }
        let eviction = self.eviction.take()?;
        if let Some(flow) = eviction.plan.flow() {
            flow.count_evicted(host, eviction.band, &eviction.flow, self.responding);
        }
        let reason = DropReason::Evicted;
        // Best effort: only the record's outcome is lost if the host refuses.
        let _ = host.set_stream_state(EVICTED_STATE, reason.wire().as_bytes());
        if self.responding {
            host.reset_stream(reason.wire());
            return Some(FilterStatus::Continue);
        }
        Some(reply(host, &Reply::dropped(reason)))
    }
}

impl Picking {
    /// The destination list given to Envoy (`pick,fallback,…`), once routed.
    pub fn destinations(&self) -> Option<&str> {
        self.destinations.as_deref()
    }
}

/// Why a request is paused in the pick stage.
#[derive(Debug)]
enum Waiting {
    /// Prepared and sent to the remote state under `ticket`; its answer is due.
    Answer {
        ticket: u64,
        plan: Arc<PoolPlan>,
        prepared: PreparedPick,
    },
    /// Queued in the pool's flow gate (in this process's memory) until its verdict.
    Queued {
        plan: Arc<PoolPlan>,
        prepared: PreparedPick,
        slot: Arc<QueueSlot>,
        key: QueueKey,
    },
}

/// What a routed request keeps to correct the state if another endpoint of its pool
/// serves it: the pool, and the prompt's blocks and session the pick recorded.
#[derive(Debug)]
struct PickMemo {
    plan: Arc<PoolPlan>,
    block_hashes: Vec<BlockHash>,
    session: Option<String>,
}

/// Where a routed request goes: the pick, then the fallbacks in order.
#[derive(Debug)]
struct Destination {
    endpoint: String,
    fallbacks: Vec<String>,
    /// The prefill endpoint of a disaggregated request (see [`crate::picker::disagg`]).
    prefiller: Option<String>,
    /// The pool's peers, when the pick is a peer cluster's ([`crate::picker::peers`]).
    peer_route: Option<PeerPlan>,
}

/// The peers to route through, for a pick of `plan`'s pool that is a peer's.
fn peer_route(plan: &PoolPlan, peer: bool) -> Option<PeerPlan> {
    plan.peers().filter(|_| peer).cloned()
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

impl core::fmt::Debug for Picking {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Picking")
            .field("body", &self.body)
            .field("waiting", &self.waiting)
            .field("lease", &self.lease)
            .field("remote_lease", &self.remote_lease.is_some())
            .field("ticket", &self.ticket)
            .field("memo", &self.memo)
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl Picking {
    /// The endpoint the request was routed to, once picked (after a retry moved it, the
    /// one that served).
    pub fn endpoint(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }

    /// Whether the request counts in an endpoint's in-flight load of this process's state,
    /// or in its pool's flow control (queued or admitted): whether its end has anything to
    /// give back here.
    pub fn holds_lease(&self) -> bool {
        self.lease.is_some()
            || self.ticket.is_some()
            || matches!(self.waiting, Some(Waiting::Queued { .. }))
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

    /// Route to the picked endpoint, or answer the rejection's 503.
    fn settle<H: PickerHost + RouteRefresh + ?Sized>(
        &mut self,
        host: &mut H,
        outcome: Result<Destination, Rejection>,
    ) -> FilterStatus {
        match outcome {
            Ok(destination) => self.route_to(host, destination),
            Err(rejection) => reply(
                host,
                &Reply::rejected(REJECTED_NO_ENDPOINTS, rejection.message()),
            ),
        }
    }

    /// Send the request to its destination: the ordered list `pick,fallback,...` in the
    /// destination header and the `envoy.lb` metadata, which the pool cluster's
    /// `override_host` policy reads (the first attempt takes the pick, a retry the next
    /// entry). No upstream override is set: it would pin every retry to the pick.
    fn route_to<H: PickerHost + RouteRefresh + ?Sized>(
        &mut self,
        host: &mut H,
        destination: Destination,
    ) -> FilterStatus {
        let list = destination.list();
        host.set_request_header(DESTINATION_ENDPOINT, &list);
        if !self.router_in_pipeline {
            // For the router filter's billing record. Best effort: only the record's
            // `destinations` is lost if the host refuses.
            let _ = host.set_stream_state(crate::billing::DESTINATIONS_STATE, list.as_bytes());
        }
        // At most one retry per fallback: a retry past the list would leave the pool's choice.
        host.set_request_header(MAX_RETRIES, &destination.fallbacks.len().to_string());
        self.endpoint = Some(destination.endpoint);
        if let Some(prefiller) = &destination.prefiller {
            host.set_request_header(PREFILLER_HEADER, prefiller);
        }
        if let Some(peers) = &destination.peer_route {
            // The route that matches this header sends the request to the peers' cluster:
            // a peer gateway serves it in its own pool, or a peer's replica serves it.
            host.set_request_header(PEER_ROUTE, &peers.cluster);
            host.set_request_header(PEER_HOP, "1");
            if let Some(authorization) = &peers.authorization {
                // This gateway's own key, for peers that authenticate tenants: the
                // client's credential was removed at the auth stage.
                host.set_request_header("authorization", authorization);
            }
            host.refresh_route();
        }
        // Best effort: proxy-wasm cannot set dynamic metadata (the header already routes
        // the request).
        let _ = host.set_metadata_string(LB_METADATA_NAMESPACE, DESTINATION_ENDPOINT, &list);
        self.destinations = Some(list);
        self.timer = Some(ResponseTimer::dispatched(host.now()));
        FilterStatus::Continue
    }

    /// Give back what the request holds here and lower the in-flight gauges. A request
    /// still queued leaves the queue (counted `rejected-context-cancelled`, or as what its
    /// verdict made it); the capacity its end frees is offered to the pool's queued
    /// requests.
    fn end<H: Stats + Clock + StreamState + ?Sized>(
        &mut self,
        host: &mut H,
        timing: ResponseTiming,
    ) {
        let now = host.now().0;
        if let Some(Waiting::Queued {
            plan,
            prepared,
            slot,
            key,
        }) = self.waiting.take()
        {
            if let Some(flow) = plan.flow() {
                // Still queued: taken out. Expired meanwhile: counted as what it was.
                // Dispatched meanwhile (its verdict in the slot, or on its way there): the
                // ticket is dropped with the verdict, and the capacity goes to the next
                // request at the dispatch here (or the timer's, if the verdict lands later).
                let reason = if flow.gate().cancel(key, now).is_some() {
                    DropReason::ContextCancelled
                } else {
                    match slot.take() {
                        Some(Verdict::Dropped { reason, .. }) => reason,
                        _ => DropReason::ContextCancelled,
                    }
                };
                flow.count_queued(host, prepared.flow(), -1);
                flow.count_rejected(host, prepared.flow(), reason);
                flow.run(now);
            }
        }
        if let Some(lease) = self.lease.take() {
            lease.observe(&timing, Millis(now), host);
            lease.end(host);
        }
        if let Some((admitted, plan)) = self.ticket.take() {
            if let Some(flow) = plan.flow() {
                if let Some(service) = read_state_number(&*host, SERVICE_STATE) {
                    flow.settle(&admitted, service);
                }
                admitted.release();
                flow.run(now);
            }
        }
    }
}

impl Drop for Picking {
    /// A request dropped while queued (its context went without an end event) leaves the
    /// queue, as its lease and ticket give themselves back.
    fn drop(&mut self) {
        if let Some(Waiting::Queued {
            plan,
            prepared,
            key,
            ..
        }) = &self.waiting
        {
            if let Some(flow) = plan.flow() {
                drop(flow.gate().cancel(*key, prepared.now.0));
            }
        }
    }
}

fn busy<H: LocalReply + ?Sized>(host: &mut H) -> FilterStatus {
    reply(
        host,
        &Reply::internal("picker state busy (re-entrant call)"),
    )
}

impl<P> PickStage<P> {
    /// A stage picking from `store`.
    pub fn new(store: P) -> PickStage<P> {
        PickStage { store }
    }

    /// The state it picks from.
    pub fn store(&self) -> &P {
        &self.store
    }
}

impl<P: PickerStore> PickStage<P> {
    /// 503 for an inference request whose base model no pool of this picker serves.
    fn reject_no_pool<H: PickerHost + ?Sized>(
        mut access: P::Access<'_>,
        host: &mut H,
        base_model: &str,
    ) -> FilterStatus {
        let plans = access.with_state(|state| state.plans());
        plans.count_no_pool(host);
        let message = format!(
            "no endpoint pool of the picker serves the model `{}`",
            truncate_for_message(base_model, MAX_QUOTED_BYTES)
        );
        reply(host, &Reply::rejected(REJECTED_NO_ENDPOINTS, &message))
    }

    /// Pick for a prepared request: in the remote state when the store has one (the stage
    /// then pauses for its answer), else here.
    fn decide<H: PickerHost + RequestWaker + RouteRefresh + ?Sized>(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        plan: Arc<PoolPlan>,
        prepared: PreparedPick,
    ) -> FilterStatus {
        if prepared.subset().is_some_and(<[String]>::is_empty) {
            plan.count_decision(&Err(Rejection::NoEndpoints), host);
            return reply(
                host,
                &Reply::rejected(
                    REJECTED_NO_ENDPOINTS,
                    "the subset hint names no endpoint of the pool",
                ),
            );
        }
        if let Some(remote) = self.store.remote() {
            let submitted = host
                .request_waker()
                .map_err(|e| format!("no waker for the request: {e:?}"))
                .and_then(|waker| remote.submit(plan.id(), &prepared, waker));
            // Unsent (the store counted and logged why): picked here after all.
            if let Ok(ticket) = submitted {
                cx.get_or_insert_with(Picking::default).waiting = Some(Waiting::Answer {
                    ticket,
                    plan,
                    prepared,
                });
                // A state in this very VM has answered already; elsewhere, pause for it.
                return self.take_answer(cx, host, remote);
            }
        }
        self.decide_here(cx, host, plan, prepared)
    }

    /// Pick in the local state; write the outcome outside it. With flow control, the pool's
    /// gate admits the request first, or queues it (the stage then pauses until the
    /// dispatcher wakes it), or refuses it.
    fn decide_here<H: PickerHost + RequestWaker + RouteRefresh + ?Sized>(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        plan: Arc<PoolPlan>,
        mut prepared: PreparedPick,
    ) -> FilterStatus {
        let Some(access) = self.store.access() else {
            return busy(host);
        };
        let picking = cx.get_or_insert_with(Picking::default);
        if let (Some(flow), None) = (plan.flow(), &picking.ticket) {
            let slot = QueueSlot::new();
            let (arrival, tokens) = flow.arrival(&prepared);
            match flow
                .gate()
                .admit(arrival, tokens, || Waiter::Local(Arc::clone(&slot)))
            {
                Admission::Admitted(ticket) => {
                    picking.ticket = Some((flow.admitted(ticket, &prepared), Arc::clone(&plan)));
                }
                Admission::Queued { key, evict } => {
                    for evictee in evict {
                        // The local gate only holds this process's requests.
                        if let Evictee::Local(signal) = evictee {
                            signal.raise();
                        }
                    }
                    flow.count_queued(host, prepared.flow(), 1);
                    picking.waiting = Some(Waiting::Queued {
                        plan: Arc::clone(&plan),
                        prepared,
                        slot: Arc::clone(&slot),
                        key,
                    });
                    return self.hold_queued(cx, host, &slot);
                }
                Admission::Refused => {
                    flow.count_rejected(host, prepared.flow(), DropReason::Saturated);
                    return reply(host, &Reply::dropped(DropReason::Saturated));
                }
            }
        }
        let outcome = pick_counted(access, host, &plan, &prepared).map(|picked| {
            // Hold the lease before any host call, so whatever happens next the request's
            // end gives it back (and lowers the gauges `pick_counted` raised).
            picking.lease = Some(picked.lease);
            Destination {
                endpoint: picked.endpoint,
                fallbacks: picked.fallbacks,
                prefiller: picked.prefiller,
                peer_route: peer_route(&plan, picked.peer),
            }
        });
        if outcome.is_ok() {
            picking.keep_memo(&plan, &mut prepared);
            picking.offer_for_eviction(host);
        }
        picking.settle(host, outcome)
    }

    /// The request waits in its pool's flow gate: pause until the dispatcher wakes it, or
    /// go on at once if its verdict is already in.
    fn hold_queued<H: PickerHost + RequestWaker + RouteRefresh + ?Sized>(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        slot: &QueueSlot,
    ) -> FilterStatus {
        match host.request_waker() {
            Ok(waker) => {
                if slot.wait(waker) {
                    FilterStatus::Pause
                } else {
                    self.take_verdict(cx, host)
                }
            }
            // Left queued, the request's end takes it out of the queue.
            Err(e) => reply(
                host,
                &Reply::internal(&format!(
                    "flow control cannot hold the request: no waker ({e:?})"
                )),
            ),
        }
    }

    /// The queued request's verdict: pick for it (holding its ticket), or answer its 429;
    /// pause again if it is not in yet (a spurious wake).
    fn take_verdict<H: PickerHost + RequestWaker + RouteRefresh + ?Sized>(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
    ) -> FilterStatus {
        let Some(picking) = cx.get_mut::<Picking>() else {
            return FilterStatus::Continue;
        };
        let Some(Waiting::Queued { slot, .. }) = &picking.waiting else {
            return FilterStatus::Continue;
        };
        let Some(verdict) = slot.take() else {
            return FilterStatus::Pause;
        };
        let Some(Waiting::Queued { plan, prepared, .. }) = picking.waiting.take() else {
            return FilterStatus::Continue;
        };
        let Some(flow) = plan.flow() else {
            return FilterStatus::Continue;
        };
        flow.count_queued(host, prepared.flow(), -1);
        match verdict {
            Verdict::Dispatched { ticket, queued_ms } => {
                flow.count_dispatched(host, prepared.flow(), queued_ms);
                picking.ticket = Some((flow.admitted(ticket, &prepared), Arc::clone(&plan)));
                record_queued_ms(host, queued_ms);
                self.decide_here(cx, host, plan, prepared)
            }
            Verdict::Dropped { reason, queued_ms } => {
                flow.count_rejected(host, prepared.flow(), reason);
                record_queued_ms(host, queued_ms);
                reply(host, &Reply::dropped(reason))
            }
        }
    }

    /// The remote state's answer for the request's `ticket`: route, reject, or pick here;
    /// pause again if it is not in yet (a spurious wake).
    fn take_answer<H: PickerHost + RequestWaker + RouteRefresh + ?Sized>(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        remote: &dyn RemotePicks,
    ) -> FilterStatus {
        let Some(picking) = cx.get_mut::<Picking>() else {
            return FilterStatus::Continue;
        };
        let Some(Waiting::Answer { ticket, .. }) = &picking.waiting else {
            return FilterStatus::Continue;
        };
        let Some(answer) = remote.take_answer(*ticket) else {
            return FilterStatus::Pause;
        };
        let Some(Waiting::Answer {
            plan, mut prepared, ..
        }) = picking.waiting.take()
        else {
            return FilterStatus::Continue;
        };
        match answer {
            RemoteAnswer::Picked {
                endpoint,
                fallbacks,
                prefiller,
                lease,
                queued_ms,
                eviction,
                peer,
            } => {
                // Held from here on, so the request's end gives it back whatever happens.
                picking.remote_lease = Some(lease);
                if let Some(signal) = eviction {
                    picking.keep_remote_eviction(host, signal, &plan, &prepared);
                }
                if let Some(queued_ms) = queued_ms.filter(|&ms| ms > 0) {
                    record_queued_ms(host, queued_ms);
                }
                picking.keep_memo(&plan, &mut prepared);
                let destination = Destination {
                    endpoint,
                    fallbacks,
                    prefiller,
                    peer_route: peer_route(&plan, peer),
                };
                let status = picking.settle(host, Ok(destination));
                // Evicted before it went on (the eviction came with the answer).
                picking.evict_if_signalled(host).unwrap_or(status)
            }
            RemoteAnswer::Rejected(rejection) => picking.settle(host, Err(rejection)),
            RemoteAnswer::Dropped { reason, queued_ms } => {
                record_queued_ms(host, queued_ms);
                reply(host, &Reply::dropped(reason))
            }
            RemoteAnswer::PickHere(_) => self.decide_here(cx, host, plan, prepared),
        }
    }
}

impl<H, P: PickerStore> Stage<H> for PickStage<P>
where
    H: PickerHost + RequestWaker + RouteRefresh + ?Sized,
{
    fn name(&self) -> &'static str {
        "pick"
    }

    fn on_request_headers(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        _end_of_stream: bool,
    ) -> FilterStatus {
        let Some(mut access) = self.store.access() else {
            return busy(host);
        };
        // Left by a route stage earlier in this pipeline (else the stream's filter state
        // may hold one from a router filter before this one).
        let offered = cx.remove::<Handoff>();
        // Only the picker may set the destination (and the prefiller, and the peer route):
        // drop whatever came in, unless a stage before this one in the pipeline already
        // stripped every reserved header the client sent (these three are reserved).
        if cx.get::<ClientHeadersStripped>().is_none() {
            host.remove_request_header(DESTINATION_ENDPOINT);
            host.remove_request_header(PREFILLER_HEADER);
            host.remove_request_header(PEER_ROUTE);
        }
        let base = host.request_header(BASE_MODEL);
        // The pool is the one of the cluster Envoy's route chose (a weighted split across
        // pools of one model included), else the one serving the base model.
        let plan = base.as_deref().and_then(|base| {
            let cluster = host.routed_cluster();
            let plan = access.plan_for(cluster.as_deref(), base)?;
            if cluster.as_deref() != Some(plan.cluster()) {
                plan.count_by_base_model(host);
            }
            Some(plan)
        });
        let path = host.request_header(":path");
        let api = path.as_deref().and_then(Api::from_path);
        let (Some(plan), Some(api)) = (plan, api) else {
            if let (Some(base), Some(_)) = (base, api) {
                return PickStage::<P>::reject_no_pool(access, host, &base);
            }
            // A pool's load page that no export stage before this one answered.
            if let Some(pool) = path.as_deref().and_then(export::pool_of) {
                return reply(host, &export::not_exported(pool));
            }
            return FilterStatus::Continue;
        };
        drop(access);
        // The router already held the request until its body was complete and parsed it:
        // if it left a handoff that fits this pool, pick now without touching the body.
        if offered.is_some() {
            cx.get_or_insert_with(Picking::default).router_in_pipeline = true;
        }
        let handoff = offered.or_else(|| {
            host.stream_state(HANDOFF_KEY)
                .and_then(|bytes| Handoff::decode(&bytes))
        });
        if let Some(prepared) = handoff.and_then(|h| PreparedPick::from_handoff(&plan, h, host)) {
            plan.count_handoff(host);
            return self.decide(cx, host, plan, prepared);
        }
        // An inference request without a body gets the body's 400: the driver delivers its
        // (empty) end at once.
        cx.get_or_insert_with(Picking::default).body = Some((plan, api));
        cx.need_request_body();
        FilterStatus::Continue
    }

    fn on_request_body(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        body: BodyProgress,
    ) -> FilterStatus {
        if !body.end_of_stream {
            return FilterStatus::Continue;
        }
        let Some((plan, api)) = cx.get_mut::<Picking>().and_then(|p| p.body.take()) else {
            return FilterStatus::Continue;
        };
        let bytes = host.request_body(0, body.buffered_len).unwrap_or_default();
        match PreparedPick::new(&plan, api, &bytes, host) {
            Ok(prepared) => self.decide(cx, host, plan, prepared),
            Err(e) => reply(host, &Reply::bad_request(&e.message(), e.param(), e.code())),
        }
    }

    /// An evicted request stops here: 429 `evicted-by-priority`, or a reset once its
    /// response started (module doc).
    fn on_signal(&self, cx: &mut RequestContext, host: &mut H) -> FilterStatus {
        cx.get_mut::<Picking>()
            .and_then(|p| p.evict_if_signalled(host))
            .unwrap_or(FilterStatus::Continue)
    }

    fn on_resume(&self, cx: &mut RequestContext, host: &mut H) -> FilterStatus {
        match cx.get::<Picking>().and_then(|p| p.waiting.as_ref()) {
            Some(Waiting::Queued { .. }) => self.take_verdict(cx, host),
            Some(Waiting::Answer { .. }) => match self.store.remote() {
                Some(remote) => self.take_answer(cx, host, remote),
                None => FilterStatus::Continue,
            },
            None => FilterStatus::Continue,
        }
    }

    /// Say which endpoint served (response header `x-gateway-destination-endpoint-served`),
    /// and when a retry moved the request off the pick to another endpoint of the pool,
    /// count it and correct the state: the in-flight lease moves there and the prompt's
    /// blocks and session are recorded for it (a lease the remote state holds: the
    /// correction is sent there). Once per request.
    fn on_response_headers(&self, cx: &mut RequestContext, host: &mut H, _end_of_stream: bool) {
        if let Some(picking) = cx.get_mut::<Picking>() {
            picking.responding = true;
        }
        let Some(mut access) = self.store.access() else {
            return;
        };
        let Some(picking) = cx.get_mut::<Picking>() else {
            return;
        };
        if let Some(timer) = &mut picking.timer {
            timer.content_type(host.response_header("content-type").as_deref());
        }
        let Some(picked) = picking.endpoint.as_deref() else {
            return;
        };
        let Some(served) = host.served_upstream() else {
            return;
        };
        host.set_response_header(DESTINATION_SERVED, &served);
        // Taken either way: the response has started, nothing later corrects the pick.
        let memo = picking.memo.take();
        if served == picked {
            return;
        }
        let Some(memo) = memo else {
            return;
        };
        let Some(lease) = picking.lease.as_mut() else {
            memo.plan.count_served_elsewhere(host);
            picking.endpoint = Some(served.clone());
            if let (Some(remote), Some(lease)) = (self.store.remote(), &mut picking.remote_lease) {
                let correction = ServedElsewhere {
                    endpoint: served,
                    block_hashes: memo.block_hashes,
                    session: memo.session,
                };
                remote.report_served(lease.as_mut(), &correction);
            }
            return;
        };
        // Only a current member of the pool takes the lease (a host outside it, or one
        // removed meanwhile, leaves the lease where it was picked).
        if !access.with_shared(|state| state.move_lease(&memo.plan, lease, &served, host)) {
            return;
        }
        memo.plan.count_served_elsewhere(host);
        picking.endpoint = Some(served.clone());
        access.with_shared(|state| {
            state.record_served(
                &memo.plan,
                &served,
                &memo.block_hashes,
                memo.session.as_deref(),
            )
        });
    }

    /// Count a streamed response's chunks; the first one's time is its endpoint's TTFT,
    /// and the first chunk of any response ends the request's prefill in progress.
    fn on_response_chunk(&self, cx: &mut RequestContext, host: &mut H, _end_of_stream: bool) {
        let Some(picking) = cx.get_mut::<Picking>() else {
            return;
        };
        if let Some(timer) = &mut picking.timer {
            timer.chunk(|| host.now());
        }
        if std::mem::replace(&mut picking.started, true) {
            return;
        }
        if let Some(lease) = &mut picking.lease {
            lease.response_started();
        } else if let (Some(remote), Some(lease)) = (self.store.remote(), &mut picking.remote_lease)
        {
            remote.report_started(lease.as_mut());
        }
    }

    /// Give back what the request holds: stop waiting for a remote answer, report the
    /// service a remote lease's request received and the latency it measured, and end what
    /// this process's state holds (lease, flow ticket, a place in a queue). Later calls
    /// find nothing to give back.
    fn on_end(&self, cx: &mut RequestContext, host: &mut H, cause: EndCause) {
        let Some(picking) = cx.get_mut::<Picking>() else {
            return;
        };
        let timing = picking
            .timer
            .take()
            .map_or_else(ResponseTiming::default, |t| {
                t.timing(host.now(), cause == EndCause::Completed)
            });
        if let Some(remote) = self.store.remote() {
            if let Some(Waiting::Answer { ticket, .. }) = &picking.waiting {
                remote.forget(*ticket);
                picking.waiting = None;
            }
            if let Some(lease) = &mut picking.remote_lease {
                remote.report_service(lease.as_mut(), &mut || {
                    read_state_number(&*host, SERVICE_STATE)
                });
                if !timing.is_empty() {
                    remote.report_timing(lease.as_mut(), timing);
                }
            }
        }
        if picking.holds_lease() && self.store.access().is_some() {
            picking.end(host, timing);
        }
    }
}
