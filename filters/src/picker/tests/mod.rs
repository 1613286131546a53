//! Picker tests against the fake host. Shared helpers here; [`routing`] covers pool
//! confinement, rejections and failure modes, [`state`] in-flight accounting, prefix and
//! session affinity, snapshot caching and thread safety, [`locking`] what runs inside the
//! shared state and what outside, [`gauges`] the in-flight gauges and the report of
//! endpoints the scraper does not cover, [`pools`] per-pool locks and leases that give
//! themselves back, [`endpoints`] the pool of the routed cluster, data-parallel ports,
//! fallbacks, the subset hint and the served endpoint, [`lora`] the memory of the LoRA
//! adapters sent to each endpoint, [`members`] pools that follow their cluster's
//! membership.

pub(super) use scheduler_core::metrics::EndpointMetrics;
pub(super) use scheduler_core::snapshot::{encode, EndpointSample, Snapshot};
pub(super) use scheduler_core::types::Millis;
pub(super) use serde_json::{json, Value};

pub(super) use std::cell::RefCell;
pub(super) use std::rc::Rc;
pub(super) use std::sync::Arc;

pub(super) use super::*;
pub(super) use crate::fake::FakeHost;
pub(super) use crate::headers::{BASE_MODEL, DESTINATION_ENDPOINT, DROPPED_REASON};
pub(super) use crate::host::SnapshotVersion;
pub(super) use crate::host::{RequestWaker, Waker};
pub(super) use crate::pipeline::{Pipeline, Run, Stage};
pub(super) use crate::reply::Reply;
pub(super) use crate::stages::pick::{Picking, RemoteAnswer};
pub(super) use crate::stages::{PickStage, PickerStore, RemotePicks};
pub(super) use crate::FilterStatus;
pub(super) use scheduler_core::request::Api;

pub(super) const A: &str = "10.0.0.1:8000";
pub(super) const B: &str = "10.0.0.2:8000";
pub(super) const C: &str = "10.0.0.3:8000";
pub(super) const NOW: u64 = 100_000;

pub(super) fn shared(pool: Value) -> PickerShared {
    match PickerShared::from_json(pool) {
        Ok(s) => s,
        Err(e) => unreachable!("test config must build: {e}"),
    }
}

pub(super) fn pool(endpoints: &[&str], extra: Value) -> Value {
    let mut v = json!({"pool": "p", "baseModel": "llama", "endpoints": endpoints});
    if let (Some(obj), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
        for (k, x) in extra {
            obj.insert(k.clone(), x.clone());
        }
    }
    v
}

pub(super) fn metrics(waiting: u32, kv: f64) -> EndpointMetrics {
    EndpointMetrics {
        waiting: Some(waiting),
        running: Some(0),
        kv_cache_usage: Some(kv),
        ..EndpointMetrics::default()
    }
}

/// A snapshot with every listed endpoint scraped at `at`.
pub(super) fn snapshot(at: u64, endpoints: &[(&str, EndpointMetrics)]) -> Vec<u8> {
    encode(&Snapshot {
        taken_at: Millis(at),
        clusters: Vec::new(),
        endpoints: endpoints
            .iter()
            .map(|(address, m)| EndpointSample {
                address: (*address).to_owned(),
                scraped_at: Millis(at),
                consecutive_failures: 0,
                metrics: Some(m.clone()),
            })
            .collect(),
    })
}

pub(super) fn fresh_all(endpoints: &[&str]) -> Vec<u8> {
    let list: Vec<(&str, EndpointMetrics)> =
        endpoints.iter().map(|e| (*e, metrics(0, 0.1))).collect();
    snapshot(NOW, &list)
}

pub(super) fn chat(content: &str) -> Vec<u8> {
    json!({"model": "llama", "messages": [{"role": "user", "content": content}]})
        .to_string()
        .into_bytes()
}

pub(super) fn host_for(body: &[u8], snapshot: Option<Vec<u8>>) -> FakeHost {
    let h = FakeHost::new()
        .request_header(BASE_MODEL, "llama")
        .post("/v1/chat/completions", body)
        .now(NOW);
    match snapshot {
        Some(bytes) => h.snapshot(1, bytes),
        None => h,
    }
}

/// One request through a pipeline of the pick stage alone, the way an adapter drives it.
/// Each call lends the stage the accessor it picks through (the state is a handle: every
/// clone reaches the same state); the run keeps what the stage holds about the request. A
/// deferred run picks through a remote store ([`Outbox`]) that keeps what it is sent and
/// hands back the answer a test gives it.
pub(super) struct PickRun {
    run: Run,
    outbox: Option<Rc<Outbox>>,
    /// The context went without an end event: no event reaches the stage any more.
    dropped: bool,
}

/// The remote state of a deferred [`PickRun`].
#[derive(Default)]
pub(super) struct Outbox {
    sent: RefCell<Option<(PoolId, PreparedPick)>>,
    answer: RefCell<Option<RemoteAnswer>>,
    served: RefCell<Option<ServedElsewhere>>,
}

impl RemotePicks for Outbox {
    fn submit(&self, pool: PoolId, prepared: &PreparedPick, _waker: Waker) -> Result<u64, String> {
        *self.sent.borrow_mut() = Some((pool, prepared.clone()));
        Ok(1)
    }
    fn take_answer(&self, _ticket: u64) -> Option<RemoteAnswer> {
        self.answer.borrow_mut().take()
    }
    fn forget(&self, _ticket: u64) {}
    fn report_served(&self, _lease: &mut dyn std::any::Any, served: &ServedElsewhere) {
        *self.served.borrow_mut() = Some(ServedElsewhere {
            endpoint: served.endpoint.clone(),
            block_hashes: served.block_hashes.clone(),
            session: served.session.clone(),
        });
    }
}

/// The store of one call: the lent accessor (none when the call needs no state), and the
/// remote state of a deferred run.
struct Lent<A> {
    access: Option<RefCell<A>>,
    outbox: Option<Rc<Outbox>>,
}

/// The lent accessor, for one use.
struct LentAccess<'a, A>(std::cell::RefMut<'a, A>);

impl<A: PickerAccess> PickerAccess for LentAccess<'_, A> {
    fn with_state<R>(&mut self, f: impl FnOnce(&mut PickerShared) -> R) -> R {
        self.0.with_state(f)
    }
    fn with_shared<R>(&mut self, f: impl FnOnce(&PickerShared) -> R) -> R {
        self.0.with_shared(f)
    }
    fn plan_for(&mut self, cluster: Option<&str>, base_model: &str) -> Option<Arc<PoolPlan>> {
        self.0.plan_for(cluster, base_model)
    }
}

impl<A: PickerAccess> PickerStore for Lent<A> {
    type Access<'a>
        = LentAccess<'a, A>
    where
        Self: 'a;
    fn access(&self) -> Option<LentAccess<'_, A>> {
        self.access.as_ref()?.try_borrow_mut().ok().map(LentAccess)
    }
    fn remote(&self) -> Option<&dyn RemotePicks> {
        self.outbox.as_deref().map(|o| o as &dyn RemotePicks)
    }
}

impl PickRun {
    /// A request picked in the lent state.
    pub(super) fn new() -> PickRun {
        PickRun {
            run: Run::new(),
            outbox: None,
            dropped: false,
        }
    }

    /// A request picked by a remote state: prepared here, then sent.
    pub(super) fn deferred() -> PickRun {
        PickRun {
            run: Run::new(),
            outbox: Some(Rc::default()),
            dropped: false,
        }
    }

    fn stage<A>(&self, access: Option<A>) -> PickStage<Lent<A>> {
        PickStage::new(Lent {
            access: access.map(RefCell::new),
            outbox: self.outbox.clone(),
        })
    }

    pub(super) fn on_request_headers<
        A: PickerAccess,
        H: PickerHost + RequestWaker + crate::host::RouteRefresh + ?Sized,
    >(
        &mut self,
        access: A,
        host: &mut H,
        end_of_stream: bool,
    ) -> FilterStatus {
        if self.dropped {
            return FilterStatus::Continue;
        }
        let p = pipeline_of(self.stage(Some(access)));
        self.run.request_headers(&p, host, end_of_stream)
    }

    pub(super) fn on_request_body<
        A: PickerAccess,
        H: PickerHost + RequestWaker + crate::host::RouteRefresh + ?Sized,
    >(
        &mut self,
        access: A,
        host: &mut H,
        buffered_len: usize,
        end_of_stream: bool,
    ) -> FilterStatus {
        if self.dropped {
            return FilterStatus::Continue;
        }
        let p = pipeline_of(self.stage(Some(access)));
        self.run.request_body(&p, host, buffered_len, end_of_stream)
    }

    /// The response headers pass; the correction a remote lease's request sends its state.
    pub(super) fn on_response_headers<
        A: PickerAccess,
        H: PickerHost + RequestWaker + crate::host::RouteRefresh + ?Sized,
    >(
        &mut self,
        access: A,
        host: &mut H,
    ) -> Option<ServedElsewhere> {
        let p = pipeline_of(self.stage(Some(access)));
        self.run.response_headers(&p, host, false);
        self.outbox.as_ref()?.served.borrow_mut().take()
    }

    /// The request ends (completed: the response headers were its end).
    pub(super) fn on_end_counted<
        A: PickerAccess,
        H: PickerHost + RequestWaker + crate::host::RouteRefresh + ?Sized,
    >(
        &mut self,
        access: A,
        host: &mut H,
    ) {
        let p = pipeline_of(self.stage(Some(access)));
        self.run.end(&p, host);
    }

    /// The request's context goes without an end event.
    pub(super) fn on_end<A>(&mut self, _access: A) {
        self.run = Run::new();
        self.dropped = true;
    }

    pub(super) fn endpoint(&self) -> Option<&str> {
        self.run.context().get::<Picking>()?.endpoint()
    }

    pub(super) fn holds_lease(&self) -> bool {
        self.run
            .context()
            .get::<Picking>()
            .is_some_and(Picking::holds_lease)
    }

    /// What a deferred run sent the remote state.
    pub(super) fn pending_pick(&self) -> Option<(PoolId, PreparedPick)> {
        self.outbox.as_ref()?.sent.borrow().clone()
    }

    /// The remote state's answer arrives and wakes the request; `None` when the request
    /// was not waiting for one.
    pub(super) fn on_answer<H: PickerHost + RequestWaker + crate::host::RouteRefresh + ?Sized>(
        &mut self,
        host: &mut H,
        answer: Result<(&str, &[String], Option<&str>), Rejection>,
    ) -> Option<FilterStatus> {
        let answer = match answer {
            Ok((endpoint, fallbacks, prefiller)) => RemoteAnswer::Picked {
                endpoint: endpoint.to_owned(),
                fallbacks: fallbacks.to_vec(),
                prefiller: prefiller.map(str::to_owned),
                lease: Box::new(()),
                queued_ms: None,
                eviction: None,
                peer: false,
            },
            Err(rejection) => RemoteAnswer::Rejected(rejection),
        };
        *self.outbox.as_ref()?.answer.borrow_mut() = Some(answer);
        let p = pipeline_of(self.stage(None::<&PickerShared>));
        self.run.wake(&p, host)
    }

    /// The remote state will not answer: the request is picked in the lent state.
    pub(super) fn pick_here<
        A: PickerAccess,
        H: PickerHost + RequestWaker + crate::host::RouteRefresh + ?Sized,
    >(
        &mut self,
        access: A,
        host: &mut H,
    ) -> FilterStatus {
        if let Some(outbox) = &self.outbox {
            *outbox.answer.borrow_mut() = Some(RemoteAnswer::PickHere("test".into()));
        }
        let p = pipeline_of(self.stage(Some(access)));
        self.run.wake(&p, host).unwrap_or(FilterStatus::Continue)
    }
}

/// A pipeline of `stage` alone.
fn pipeline_of<H: ?Sized, S: Stage<H>>(stage: S) -> Pipeline<H, S> {
    Pipeline::new(vec![Box::new(stage)])
}

/// Headers + one complete body callback.
pub(super) fn drive(
    shared: &mut PickerShared,
    host: &mut FakeHost,
    req: &mut PickRun,
) -> FilterStatus {
    let first = req.on_request_headers(&mut *shared, host, false);
    if first != FilterStatus::Pause {
        return first;
    }
    let len = host.body.len();
    req.on_request_body(shared, host, len, true)
}

pub(super) fn pick_one(shared: &mut PickerShared, host: &mut FakeHost) -> (FilterStatus, PickRun) {
    let mut req = PickRun::new();
    let status = drive(shared, host, &mut req);
    (status, req)
}

pub(super) fn requests_in_flight(shared: &PickerShared, address: &str) -> u32 {
    shared
        .inflight(PoolId(0), address)
        .map_or(u32::MAX, |l| l.requests)
}

mod endpoints;
mod gauges;
mod handoff;
mod locking;
mod lora;
mod members;
mod peers;
mod pools;
mod precise;
mod routing;
mod state;
