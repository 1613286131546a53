//! The endpoint picker as a pipeline stage: [`crate::picker::PickerRequest`] kept in the
//! request's context, its in-flight lease given back at the request's end.
//!
//! Where the picker state lives is the adapter's choice, expressed as a [`PickerStore`]:
//! the native flavour's one state per Envoy process is an `Arc<SharedPicker>`; another
//! host implements the trait for its own store.
//!
//! A store may also offer [`RemotePicks`]: a state that lives elsewhere and answers by
//! message (the Wasm flavour, whose workers cannot share memory, sends its picks to one
//! owner per Envoy process, see [`crate::picker::remote`]). Then the stage prepares the
//! request here (parse, hash), submits it with the request's [`Waker`], answers
//! [`Step::Pause`], and on resume takes the answer: route to the endpoint and hold the
//! owner's lease in the context until the request ends, or answer the rejection, or, when
//! the store says no answer will come, pick in the local state after all.

use std::any::Any;
use std::sync::Arc;

use crate::flow::{read_state_number, record_queued_ms, DropReason, SERVICE_STATE};
use crate::handoff::Handoff;
use crate::host::{RequestWaker, Waker};
use crate::picker::{
    PickerAccess, PickerHost, PickerRequest, PoolId, PreparedPick, Rejection, ServedElsewhere,
    SharedPicker,
};
use crate::pipeline::{BodyProgress, EndCause, RequestContext, Stage, Step};
use crate::reply::Reply;
use crate::FilterStatus;

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
    /// in. The ticket to take the answer with, or why it could not be sent (the stage then
    /// picks locally; the store has counted and logged it).
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

/// The ticket of a pick submitted to the remote state, while the request waits for it.
struct Waiting(u64);

/// The remote state's lease of a routed request (dropped with the context).
struct RemoteLease(Box<dyn Any>);

impl PickerStore for Arc<SharedPicker> {
    type Access<'a> = &'a SharedPicker;

    fn access(&self) -> Option<&SharedPicker> {
        Some(self)
    }
}

/// The picker stage over the state in `P`.
#[derive(Clone, Debug)]
pub struct PickStage<P> {
    store: P,
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

fn busy() -> Step {
    Step::Reply(Reply::internal("picker state busy (re-entrant call)"))
}

fn step(cx: &mut RequestContext, status: FilterStatus, waits_for_body: bool) -> Step {
    match status {
        FilterStatus::Continue => Step::Next,
        FilterStatus::Pause => {
            if waits_for_body {
                cx.need_request_body();
            }
            Step::Next
        }
        FilterStatus::Replied => Step::Replied,
    }
}

impl<P: PickerStore> PickStage<P> {
    /// The request's picker state machine (deferred when the picks are remote).
    fn request<'c>(&self, cx: &'c mut RequestContext) -> &'c mut PickerRequest {
        let remote = self.store.remote().is_some();
        cx.get_or_insert_with(|| {
            if remote {
                PickerRequest::deferred()
            } else {
                PickerRequest::new()
            }
        })
    }

    /// After the request's own step: send a pick it left pending to the remote state and
    /// pause, or pick it here if it cannot be sent.
    fn submit_pending<H: PickerHost + RequestWaker + ?Sized>(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        status: FilterStatus,
        waits_for_body: bool,
    ) -> Step {
        if let Some(held) = self.hold_if_queued(cx, host) {
            return held;
        }
        let Some(remote) = self.store.remote() else {
            return step(cx, status, waits_for_body);
        };
        let Some((pool, prepared)) = cx.get::<PickerRequest>().and_then(|r| r.pending_pick())
        else {
            return step(cx, status, waits_for_body);
        };
        let submitted = host
            .request_waker()
            .map_err(|e| format!("no waker for the request: {e:?}"))
            .and_then(|waker| remote.submit(pool, prepared, waker));
        match submitted {
            Ok(ticket) => {
                cx.insert(Waiting(ticket));
                Step::Pause
            }
            Err(_) => self.pick_here(cx, host),
        }
    }

    /// Make the pending pick in the local state.
    fn pick_here<H: PickerHost + RequestWaker + ?Sized>(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
    ) -> Step {
        let Some(access) = self.store.access() else {
            return busy();
        };
        let status = self.request(cx).pick_here(access, host);
        if let Some(held) = self.hold_if_queued(cx, host) {
            return held;
        }
        step(cx, status, false)
    }

    /// When the pool's flow gate queued the request in this process: pause until the
    /// dispatcher wakes it, or go on at once if its verdict is already in. `None` when the
    /// request is not queued.
    fn hold_if_queued<H: PickerHost + RequestWaker + ?Sized>(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
    ) -> Option<Step> {
        let slot = cx.get::<PickerRequest>()?.queued_slot()?;
        match host.request_waker() {
            Ok(waker) => Some(if slot.wait(waker) {
                Step::Pause
            } else {
                self.take_verdict(cx, host)
            }),
            // Left queued, the request's end takes it out of the queue.
            Err(e) => Some(Step::Reply(Reply::internal(&format!(
                "flow control cannot hold the request: no waker ({e:?})"
            )))),
        }
    }

    /// The queued request's verdict: pick for it, or answer its 429; pause again if it is
    /// not in yet (a spurious wake).
    fn take_verdict<H: PickerHost + ?Sized>(&self, cx: &mut RequestContext, host: &mut H) -> Step {
        let Some(access) = self.store.access() else {
            return busy();
        };
        let Some(request) = cx.get_mut::<PickerRequest>() else {
            return Step::Next;
        };
        match request.on_verdict(access, host) {
            Some(status) => step(cx, status, false),
            None => Step::Pause,
        }
    }
}

impl<H: PickerHost + RequestWaker + ?Sized, P: PickerStore> Stage<H> for PickStage<P> {
    fn name(&self) -> &'static str {
        "pick"
    }

    fn on_request_headers(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        end_of_stream: bool,
    ) -> Step {
        let Some(access) = self.store.access() else {
            return busy();
        };
        // Left by a route stage earlier in this pipeline (else the picker looks for one in
        // the stream's filter state).
        let handoff = cx.remove::<Handoff>();
        let status =
            self.request(cx)
                .offered(handoff)
                .on_request_headers(access, host, end_of_stream);
        self.submit_pending(cx, host, status, true)
    }

    fn on_request_body(&self, cx: &mut RequestContext, host: &mut H, body: BodyProgress) -> Step {
        let Some(access) = self.store.access() else {
            return busy();
        };
        let status =
            self.request(cx)
                .on_request_body(access, host, body.buffered_len, body.end_of_stream);
        self.submit_pending(cx, host, status, false)
    }

    fn on_resume(&self, cx: &mut RequestContext, host: &mut H) -> Step {
        if cx
            .get::<PickerRequest>()
            .is_some_and(PickerRequest::is_queued)
        {
            return self.take_verdict(cx, host);
        }
        let (Some(remote), Some(&Waiting(ticket))) = (self.store.remote(), cx.get::<Waiting>())
        else {
            return Step::Next;
        };
        let Some(answer) = remote.take_answer(ticket) else {
            // A spurious wake: the answer is not in yet.
            return Step::Pause;
        };
        cx.remove::<Waiting>();
        let status = match answer {
            RemoteAnswer::Picked {
                endpoint,
                fallbacks,
                prefiller,
                lease,
                queued_ms,
            } => {
                // Held from here on, so the request's end gives it back whatever happens.
                cx.insert(RemoteLease(lease));
                if let Some(queued_ms) = queued_ms.filter(|&ms| ms > 0) {
                    record_queued_ms(host, queued_ms);
                }
                self.request(cx)
                    .on_answer(host, Ok((&endpoint, &fallbacks, prefiller.as_deref())))
            }
            RemoteAnswer::Rejected(rejection) => self.request(cx).on_answer(host, Err(rejection)),
            RemoteAnswer::Dropped { reason, queued_ms } => {
                record_queued_ms(host, queued_ms);
                return Step::Reply(Reply::dropped(reason));
            }
            RemoteAnswer::PickHere(_) => return self.pick_here(cx, host),
        };
        match status {
            Some(status) => step(cx, status, false),
            None => Step::Next,
        }
    }

    fn on_response_headers(&self, cx: &mut RequestContext, host: &mut H, _end_of_stream: bool) {
        let Some(access) = self.store.access() else {
            return;
        };
        let Some(request) = cx.get_mut::<PickerRequest>() else {
            return;
        };
        // Elsewhere: the lease lives in the remote state, which makes the correction.
        let Some(served) = request.on_response_headers(access, host) else {
            return;
        };
        if let (Some(remote), Some(RemoteLease(lease))) =
            (self.store.remote(), cx.get_mut::<RemoteLease>())
        {
            remote.report_served(lease.as_mut(), &served);
        }
    }

    fn on_end(&self, cx: &mut RequestContext, host: &mut H, _cause: EndCause) {
        if let (Some(remote), Some(Waiting(ticket))) = (self.store.remote(), cx.remove::<Waiting>())
        {
            remote.forget(ticket);
        }
        if let (Some(remote), Some(RemoteLease(lease))) =
            (self.store.remote(), cx.get_mut::<RemoteLease>())
        {
            remote.report_service(lease.as_mut(), &mut || {
                read_state_number(&*host, SERVICE_STATE)
            });
        }
        let Some(request) = cx.get_mut::<PickerRequest>() else {
            return;
        };
        if !request.holds_lease() {
            return;
        }
        if let Some(access) = self.store.access() {
            request.on_end_counted(access, host);
        }
    }
}
