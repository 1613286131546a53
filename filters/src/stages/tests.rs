//! The stages through the driver over the fake host: the router's pipeline leaves the
//! handoff, the picker's picks from it and gives its lease back at the end; the test stages
//! use the waker, the body replacement and the chunk rewrite.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use super::testing::{self, PauseStage, ReplaceBodyStage, RewriteChunksStage};
use super::*;
use crate::fake::FakeHost;
use crate::headers::{BASE_MODEL, DESTINATION_ENDPOINT};
use crate::host::Waker;
use crate::picker::{PickerShared, SharedPicker};
use crate::pipeline::{Pipeline, Run, Stage};
use crate::router::Router;
use crate::FilterStatus;
use scheduler_core::types::Millis;

const BODY: &[u8] = br#"{"model":"llama","messages":[{"role":"user","content":"hello there"}]}"#;

fn router_pipeline() -> Pipeline<FakeHost> {
    let router = Router::from_json(serde_json::json!({
        "bodyLimitBytes": 1024,
        "pools": [{"name": "p", "baseModel": "llama"}]
    }))
    .unwrap();
    Pipeline::new(vec![Box::new(RouteStage::new(Arc::new(router)))])
}

fn pick_stage() -> (Box<dyn Stage<FakeHost>>, Arc<SharedPicker>) {
    let state = PickerShared::from_json(serde_json::json!({
        "pool": "p", "baseModel": "llama", "endpoints": ["10.0.0.1:8000"],
        "failureMode": "FailOpen"
    }))
    .unwrap();
    let shared = Arc::new(SharedPicker::new(state));
    (Box::new(PickStage::new(Arc::clone(&shared))), shared)
}

fn picker_pipeline() -> (Pipeline<FakeHost>, Arc<SharedPicker>) {
    let (stage, shared) = pick_stage();
    (Pipeline::new(vec![stage]), shared)
}

/// Requests the picker state counts in flight on the pool's endpoint.
fn counted(shared: &SharedPicker) -> u32 {
    let state = shared.state();
    state
        .pool_for_base_model("llama")
        .and_then(|p| state.inflight(p, "10.0.0.1:8000"))
        .map_or(u32::MAX, |i| i.requests)
}

fn in_flight(host: &FakeHost) -> u64 {
    host.gauges
        .get("infergate.picker.inflight_requests.pool.p")
        .copied()
        .unwrap_or(0)
}

#[test]
fn the_router_pipeline_hands_off_to_the_picker_pipeline_which_releases_at_the_end() {
    let mut host = FakeHost::new().post("/v1/chat/completions", BODY);
    let router = router_pipeline();
    let mut run = Run::new();
    assert_eq!(
        run.request_headers(&router, &mut host, false),
        FilterStatus::Pause
    );
    assert_eq!(
        host.body_buffer, 1025,
        "the host may buffer past the router's limit"
    );
    let len = host.body.len();
    assert_eq!(
        run.request_body(&router, &mut host, len, true),
        FilterStatus::Continue
    );
    assert_eq!(host.header(BASE_MODEL), Some("llama"));
    assert!(host.route_refreshes >= 1, "the route is matched again");
    run.end(&router, &mut host);

    let (picker, _shared) = picker_pipeline();
    let reads = host.body_reads.get();
    let mut run = Run::new();
    // The handoff is there: the pick happens at the headers, without the body.
    assert_eq!(
        run.request_headers(&picker, &mut host, false),
        FilterStatus::Continue
    );
    assert_eq!(host.body_reads.get(), reads);
    assert_eq!(host.header(DESTINATION_ENDPOINT), Some("10.0.0.1:8000"));
    assert_eq!(in_flight(&host), 1);
    run.response_headers(&picker, &mut host, true);
    run.end(&picker, &mut host);
    assert_eq!(in_flight(&host), 0, "the end gives the lease back");
    assert_eq!(host.gauge_underflows, 0);
}

/// Route and pick in one pipeline: the handoff passes in the request's context, so nothing
/// is written to the stream's filter state, and the pick still comes from it (no second
/// body read, counted as a handoff).
#[test]
fn in_one_pipeline_the_handoff_passes_in_the_context_not_the_stream_state() {
    let mut host = FakeHost::new().post("/v1/chat/completions", BODY);
    let router = Router::from_json(serde_json::json!({
        "bodyLimitBytes": 1024,
        "pools": [{"name": "p", "baseModel": "llama"}]
    }))
    .unwrap();
    let (pick, _shared) = pick_stage();
    let both: Pipeline<FakeHost> = Pipeline::new(vec![
        Box::new(RouteStage::new(Arc::new(router)).before_pick_stage()),
        pick,
    ]);
    let mut run = Run::new();
    assert_eq!(
        run.request_headers(&both, &mut host, false),
        FilterStatus::Pause
    );
    let len = host.body.len();
    assert_eq!(
        run.request_body(&both, &mut host, len, true),
        FilterStatus::Continue
    );
    assert_eq!(host.header(DESTINATION_ENDPOINT), Some("10.0.0.1:8000"));
    assert!(host.stream_state.is_empty(), "{:?}", host.stream_state);
    assert_eq!(
        host.body_reads.get(),
        1,
        "the body is read once, by the router"
    );
    assert_eq!(
        host.counters.get("infergate.picker.handoff.pool.p"),
        Some(&1)
    );
    run.end(&both, &mut host);
    assert_eq!(in_flight(&host), 0);
}

#[test]
fn a_picker_run_dropped_without_its_end_still_gives_the_lease_back() {
    let mut host = FakeHost::new()
        .post("/v1/chat/completions", BODY)
        .request_header(BASE_MODEL, "llama");
    let (picker, shared) = picker_pipeline();
    let mut run = Run::new();
    // No handoff: the picker waits for the body, then picks.
    assert_eq!(
        run.request_headers(&picker, &mut host, false),
        FilterStatus::Pause
    );
    let len = host.body.len();
    assert_eq!(
        run.request_body(&picker, &mut host, len, true),
        FilterStatus::Continue
    );
    assert!(host.header(DESTINATION_ENDPOINT).is_some());
    assert_eq!(counted(&shared), 1);
    drop(run);
    assert_eq!(counted(&shared), 0, "the lease went back with the context");
    // Its gauge decrement is owed to the pool's next request (there was no host at the
    // drop), so the next request's end settles it without going below zero.
    let mut next = Run::new();
    next.request_headers(&picker, &mut host, false);
    next.request_body(&picker, &mut host, len, true);
    next.end(&picker, &mut host);
    assert_eq!(counted(&shared), 0);
    assert_eq!(host.gauge_underflows, 0);
}

#[test]
fn the_router_answers_413_while_buffering() {
    let mut host = FakeHost::new().post("/v1/chat/completions", BODY);
    let router = router_pipeline();
    let mut run = Run::new();
    run.request_headers(&router, &mut host, false);
    assert_eq!(
        run.request_body(&router, &mut host, 600, false),
        FilterStatus::Pause
    );
    assert_eq!(
        run.request_body(&router, &mut host, 2000, false),
        FilterStatus::Replied
    );
    assert_eq!(host.last_reply().map(|r| r.status), Some(413));
    run.end(&router, &mut host);
}

fn wake_on_a_thread(waker: Waker, _delay: Duration) {
    let woke = std::thread::spawn(move || waker.wake());
    assert!(woke.join().is_ok());
}

#[test]
fn the_pause_stage_waits_for_its_waker_and_marks_the_resume() {
    let pipeline: Pipeline<FakeHost> =
        Pipeline::new(vec![Box::new(PauseStage::new(wake_on_a_thread))]);
    let mut host = FakeHost::new()
        .post("/v1/chat/completions", BODY)
        .request_header(testing::PAUSE_HEADER, "5");
    let mut run = Run::new();
    assert_eq!(
        run.request_headers(&pipeline, &mut host, false),
        FilterStatus::Pause
    );
    assert_eq!(host.header(testing::PAUSE_HEADER), None);
    assert_eq!(host.woken(), 1, "woken from the other thread");
    assert_eq!(run.wake(&pipeline, &mut host), Some(FilterStatus::Continue));
    assert_eq!(host.header(testing::RESUMED_HEADER), Some("same-thread"));
}

#[test]
fn the_body_and_chunk_stages_rewrite_through_the_host() {
    let pipeline: Pipeline<FakeHost> = Pipeline::new(vec![
        Box::new(ReplaceBodyStage),
        Box::new(RewriteChunksStage),
    ]);
    let mut host = FakeHost::new()
        .post("/v1/chat/completions", BODY)
        .request_header(testing::REPLACE_BODY_HEADER, "other words")
        .request_header(testing::REWRITE_CHUNKS_HEADER, "1");
    host.response_headers
        .push(("content-type".into(), "text/event-stream".into()));
    let mut run = Run::new();
    assert_eq!(
        run.request_headers(&pipeline, &mut host, false),
        FilterStatus::Pause
    );
    let len = host.body.len();
    assert_eq!(
        run.request_body(&pipeline, &mut host, len, true),
        FilterStatus::Continue
    );
    assert_eq!(host.body, testing::replaced_body("llama", "other words"));
    run.response_headers(&pipeline, &mut host, false);
    host.response_chunk = b"data: x\n\n".to_vec();
    run.response_chunk(&pipeline, &mut host, false);
    assert_eq!(host.response_chunk, b"DATA: X\n\n");
}

/// A remote picker state over an in-memory [`crate::picker::remote::Owner`]: what the Wasm
/// flavour's queues do, without the queues. `silent` keeps the answers back and gives up.
mod remote_store {
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    use super::*;
    use crate::picker::remote::{Owner, StateKey, ToOwner, ToWorker};
    use crate::picker::{PoolId, PreparedPick, ServedElsewhere};
    use crate::stages::{PickerStore, RemoteAnswer, RemotePicks};

    pub(super) const CONFIG: &str = r#"{"pool":"p","baseModel":"llama","endpoints":["10.0.0.1:8000","10.0.0.2:8000"],"failureMode":"FailOpen"}"#;

    pub(super) struct Store {
        pub local: PickerShared,
        pub owner: RefCell<Owner>,
        pub owner_host: RefCell<FakeHost>,
        pub answers: RefCell<BTreeMap<u64, ToWorker>>,
        pub wakers: RefCell<Vec<Waker>>,
        pub silent: bool,
        /// Answers are in as the pick is submitted (an owner in the same VM); otherwise
        /// only after [`Store::deliver`].
        pub at_once: bool,
        delivered: RefCell<u64>,
        next: RefCell<u64>,
    }

    impl Store {
        pub fn new(silent: bool) -> Store {
            let local = PickerShared::from_json(serde_json::from_str(CONFIG).unwrap()).unwrap();
            let mut owner = Owner::new();
            let mut host = FakeHost::new();
            let hello = ToOwner::Hello {
                state: StateKey::of_config(CONFIG.as_bytes()),
                config: CONFIG.as_bytes().to_vec(),
            };
            owner.handle(&mut host, &hello.encode().unwrap());
            Store {
                local,
                owner: RefCell::new(owner),
                owner_host: RefCell::new(host),
                answers: RefCell::new(BTreeMap::new()),
                wakers: RefCell::new(Vec::new()),
                silent,
                at_once: false,
                delivered: RefCell::new(0),
                next: RefCell::new(0),
            }
        }

        /// The answers of every pick submitted so far arrive (the owner's queue message).
        pub fn deliver(&self) {
            *self.delivered.borrow_mut() = *self.next.borrow();
        }

        pub fn release(&self, lease: u64) {
            let release = ToOwner::Release {
                state: StateKey::of_config(CONFIG.as_bytes()),
                reply_queue: 1,
                leases: vec![crate::picker::remote::Released::lease(lease)],
                started: Vec::new(),
            };
            let mut host = self.owner_host.borrow_mut();
            self.owner
                .borrow_mut()
                .handle(&mut *host, &release.encode().unwrap());
        }
    }

    impl PickerStore for Store {
        type Access<'a> = &'a PickerShared;
        fn access(&self) -> Option<&PickerShared> {
            Some(&self.local)
        }
        fn remote(&self) -> Option<&dyn RemotePicks> {
            Some(self)
        }
    }

    impl RemotePicks for Store {
        fn submit(
            &self,
            pool: PoolId,
            prepared: &PreparedPick,
            waker: Waker,
        ) -> Result<u64, String> {
            *self.next.borrow_mut() += 1;
            let ticket = *self.next.borrow();
            let pick = ToOwner::Pick {
                state: StateKey::of_config(CONFIG.as_bytes()),
                reply_queue: 1,
                ticket,
                pool,
                prepared: prepared.clone(),
                releases: Vec::new(),
                started: Vec::new(),
            };
            if !self.silent {
                let mut host = self.owner_host.borrow_mut();
                let (_, answer) = self
                    .owner
                    .borrow_mut()
                    .handle(&mut *host, &pick.encode().unwrap())
                    .pop()
                    .unwrap();
                self.answers.borrow_mut().insert(ticket, answer);
            }
            self.wakers.borrow_mut().push(waker);
            if self.at_once {
                self.deliver();
            }
            Ok(ticket)
        }

        fn take_answer(&self, ticket: u64) -> Option<RemoteAnswer> {
            if ticket > *self.delivered.borrow() {
                return None;
            }
            if self.silent {
                return Some(RemoteAnswer::PickHere("silent owner".into()));
            }
            match self.answers.borrow_mut().remove(&ticket)? {
                ToWorker::Picked {
                    lease,
                    endpoint,
                    fallbacks,
                    prefiller,
                    ..
                } => Some(RemoteAnswer::Picked {
                    endpoint,
                    fallbacks,
                    prefiller,
                    lease: Box::new(lease),
                    queued_ms: None,
                    eviction: None,
                    peer: false,
                }),
                ToWorker::Rejected { rejection, .. } => Some(RemoteAnswer::Rejected(rejection)),
                ToWorker::UnknownState { .. } => Some(RemoteAnswer::PickHere("unknown".into())),
                ToWorker::Dropped {
                    reason, queued_ms, ..
                } => Some(RemoteAnswer::Dropped { reason, queued_ms }),
                // This test owner has no flow control configured.
                ToWorker::Queued { .. } | ToWorker::Evict { .. } => {
                    Some(RemoteAnswer::PickHere("queued".into()))
                }
            }
        }

        fn forget(&self, ticket: u64) {
            if let Some(ToWorker::Picked { lease, .. }) = self.answers.borrow_mut().remove(&ticket)
            {
                self.release(lease);
            }
        }

        fn report_served(&self, lease: &mut dyn std::any::Any, served: &ServedElsewhere) {
            let Some(lease) = lease.downcast_ref::<u64>() else {
                return;
            };
            let message = ToOwner::Served {
                state: StateKey::of_config(CONFIG.as_bytes()),
                lease: *lease,
                endpoint: served.endpoint.clone(),
                block_hashes: served.block_hashes.iter().map(|h| h.0).collect(),
                session: served.session.clone(),
            };
            let mut host = self.owner_host.borrow_mut();
            self.owner
                .borrow_mut()
                .handle(&mut *host, &message.encode().unwrap());
        }
    }
}

use crate::stages::RemotePicks;
use remote_store::Store as RemoteStore;

/// A remote store the test keeps a handle on, to deliver answers and read its owner.
struct SharedStore(std::rc::Rc<RemoteStore>);

impl PickerStore for SharedStore {
    type Access<'a> = &'a PickerShared;
    fn access(&self) -> Option<&PickerShared> {
        self.0.access()
    }
    fn remote(&self) -> Option<&dyn RemotePicks> {
        Some(&*self.0)
    }
}

#[test]
fn a_remote_pick_pauses_the_request_and_the_wake_routes_it_with_the_owners_endpoint() {
    let store = std::rc::Rc::new(RemoteStore::new(false));
    let stage: Box<dyn Stage<FakeHost>> =
        Box::new(PickStage::new(SharedStore(std::rc::Rc::clone(&store))));
    let pipeline = Pipeline::new(vec![stage]);
    let mut host = FakeHost::new()
        .request_header(BASE_MODEL, "llama")
        .post("/v1/chat/completions", BODY);
    let mut run = Run::new();
    assert_eq!(
        run.request_headers(&pipeline, &mut host, false),
        FilterStatus::Pause
    );
    let len = host.body.len();
    assert_eq!(
        run.request_body(&pipeline, &mut host, len, true),
        FilterStatus::Pause,
        "waits for the owner"
    );
    assert!(run.is_paused());
    assert_eq!(host.header(DESTINATION_ENDPOINT), None);
    assert_eq!(store.owner.borrow().leases(), 1, "the owner took the lease");
    // A wake before the answer is in is spurious: the request waits on.
    assert_eq!(run.wake(&pipeline, &mut host), Some(FilterStatus::Pause));
    // The answer came and the waker fired from elsewhere: the adapter wakes the run.
    store.deliver();
    assert_eq!(store.wakers.borrow().len(), 1);
    assert_eq!(run.wake(&pipeline, &mut host), Some(FilterStatus::Continue));
    let endpoint = host.header(DESTINATION_ENDPOINT).map(str::to_owned);
    assert!(endpoint.is_some_and(|e| e.starts_with("10.0.0.")));
    // A second wake is late and does nothing.
    assert_eq!(run.wake(&pipeline, &mut host), None);
    // The lease is in the context until the end; the local state never counted anything.
    assert!(run.context().get::<super::pick::Picking>().is_some());
    run.end(&pipeline, &mut host);
}

#[test]
fn a_remote_state_that_answers_as_the_pick_is_sent_routes_without_a_pause() {
    let mut store = RemoteStore::new(false);
    store.at_once = true;
    let store = std::rc::Rc::new(store);
    let stage: Box<dyn Stage<FakeHost>> =
        Box::new(PickStage::new(SharedStore(std::rc::Rc::clone(&store))));
    let pipeline = Pipeline::new(vec![stage]);
    let mut host = FakeHost::new()
        .request_header(BASE_MODEL, "llama")
        .post("/v1/chat/completions", BODY);
    let mut run = Run::new();
    run.request_headers(&pipeline, &mut host, false);
    let len = host.body.len();
    assert_eq!(
        run.request_body(&pipeline, &mut host, len, true),
        FilterStatus::Continue,
        "the owner in this VM answered: no pause"
    );
    assert!(!run.is_paused());
    assert!(host
        .header(DESTINATION_ENDPOINT)
        .is_some_and(|e| e.starts_with("10.0.0.")));
    assert_eq!(
        store.owner.borrow().leases(),
        1,
        "the owner's lease is held"
    );
    // The waker handed over is never needed: a wake now finds nothing to resume.
    assert_eq!(run.wake(&pipeline, &mut host), None);
    run.end(&pipeline, &mut host);
}

#[test]
fn a_remote_store_that_gives_up_makes_the_stage_pick_locally() {
    let store = std::rc::Rc::new(RemoteStore::new(true));
    let stage: Box<dyn Stage<FakeHost>> =
        Box::new(PickStage::new(SharedStore(std::rc::Rc::clone(&store))));
    let pipeline = Pipeline::new(vec![stage]);
    let mut host = FakeHost::new()
        .request_header(BASE_MODEL, "llama")
        .post("/v1/chat/completions", BODY);
    let mut run = Run::new();
    run.request_headers(&pipeline, &mut host, false);
    let len = host.body.len();
    assert_eq!(
        run.request_body(&pipeline, &mut host, len, true),
        FilterStatus::Pause
    );
    store.deliver();
    assert_eq!(run.wake(&pipeline, &mut host), Some(FilterStatus::Continue));
    assert!(host.header(DESTINATION_ENDPOINT).is_some(), "picked here");
    run.end(&pipeline, &mut host);
}

#[test]
fn a_remote_pick_served_by_its_fallback_moves_the_owners_lease() {
    let store = std::rc::Rc::new(RemoteStore::new(false));
    let stage: Box<dyn Stage<FakeHost>> =
        Box::new(PickStage::new(SharedStore(std::rc::Rc::clone(&store))));
    let pipeline = Pipeline::new(vec![stage]);
    let mut host = FakeHost::new()
        .request_header(BASE_MODEL, "llama")
        .post("/v1/chat/completions", BODY);
    let mut run = Run::new();
    run.request_headers(&pipeline, &mut host, false);
    let len = host.body.len();
    run.request_body(&pipeline, &mut host, len, true);
    store.deliver();
    assert_eq!(run.wake(&pipeline, &mut host), Some(FilterStatus::Continue));
    let list = host
        .header(DESTINATION_ENDPOINT)
        .unwrap_or_default()
        .to_owned();
    let (picked, fallback) = list.split_once(',').expect("a pick and a fallback");
    let (picked, fallback) = (picked.to_owned(), fallback.to_owned());
    let key = crate::picker::remote::StateKey::of_config(remote_store::CONFIG.as_bytes());
    let load = |e: &str| {
        store
            .owner
            .borrow()
            .inflight(key, crate::picker::PoolId(0), e)
            .map_or(u32::MAX, |l| l.requests)
    };
    assert_eq!((load(&picked), load(&fallback)), (1, 0));
    host.served_upstream = Some(fallback.clone());
    run.response_headers(&pipeline, &mut host, false);
    assert_eq!(
        host.response(crate::headers::DESTINATION_SERVED),
        Some(fallback.as_str())
    );
    assert_eq!((load(&picked), load(&fallback)), (0, 1));
    assert_eq!(
        host.counter("infergate.picker.served_by_fallback.pool.p"),
        1
    );
    run.end(&pipeline, &mut host);
}

/// The endpoint gauge `name` of the one-endpoint pool of [`pick_stage`].
fn endpoint_gauge(host: &FakeHost, name: &str) -> Option<u64> {
    host.gauges
        .iter()
        .find(|(k, _)| k.starts_with(name) && k.contains("10_0_0_1_8000"))
        .map(|(_, v)| *v)
}

/// A request for `llama` through the picker pipeline, routed at `at` (picked from its
/// body), its response not begun.
fn routed(picker: &Pipeline<FakeHost>, at: u64) -> (FakeHost, Run) {
    let mut host = FakeHost::new().post("/v1/chat/completions", BODY).now(at);
    host.request_headers
        .push((BASE_MODEL.to_owned(), "llama".to_owned()));
    let mut run = Run::new();
    run.request_headers(picker, &mut host, false);
    let len = host.body.len();
    assert_eq!(
        run.request_body(picker, &mut host, len, true),
        FilterStatus::Continue
    );
    assert_eq!(host.header(DESTINATION_ENDPOINT), Some("10.0.0.1:8000"));
    (host, run)
}

/// One streamed request through the picker pipeline: routed at `at`, its first chunk
/// `ttft` ms later, then `chunks` more `gap` ms apart, and its end.
fn streamed(picker: &Pipeline<FakeHost>, at: u64, ttft: u64, chunks: u64, gap: u64) -> FakeHost {
    let (mut host, mut run) = routed(picker, at);
    host.response_headers
        .push(("content-type".to_owned(), "text/event-stream".to_owned()));
    run.response_headers(picker, &mut host, false);
    host.now = Millis(at + ttft);
    run.response_chunk(picker, &mut host, false);
    for i in 0..chunks {
        host.now = Millis(host.now.0 + gap);
        run.response_chunk(picker, &mut host, i + 1 == chunks);
    }
    run.end(picker, &mut host);
    host
}

#[test]
fn a_streamed_response_feeds_its_endpoints_measured_latency() {
    let (picker, shared) = picker_pipeline();
    let host = streamed(&picker, 1_000, 40, 10, 5);
    assert_eq!(
        endpoint_gauge(&host, "infergate.picker.observed_ttft_us"),
        Some(40_000)
    );
    assert_eq!(
        endpoint_gauge(&host, "infergate.picker.observed_tpot_us"),
        Some(5_000)
    );
    // Two more make the estimate count (`minSamples` 3): the next pick sees it.
    streamed(&picker, 2_000, 40, 1, 5);
    streamed(&picker, 3_000, 40, 1, 5);
    let state = shared.state();
    let pool = state.pool_for_base_model("llama").unwrap();
    let seen = state.observed_latency(pool, "10.0.0.1:8000", Millis(3_100));
    assert_eq!(seen.map(|l| l.ttft_ms), Some(40.0));
    assert_eq!(
        state.observed_latency(pool, "10.0.0.1:8000", Millis(3_100 + 10_001)),
        None,
        "stale after `staleAfterMs`"
    );
}

#[test]
fn a_response_that_is_not_streamed_measures_no_ttft() {
    let (picker, shared) = picker_pipeline();
    for at in [1_000, 2_000, 3_000] {
        let (mut host, mut run) = routed(&picker, at);
        host.response_headers
            .push(("content-type".to_owned(), "application/json".to_owned()));
        run.response_headers(&picker, &mut host, false);
        host.now = Millis(at + 900);
        run.response_chunk(&picker, &mut host, true);
        run.end(&picker, &mut host);
        assert_eq!(
            endpoint_gauge(&host, "infergate.picker.observed_ttft_us"),
            None
        );
    }
    let state = shared.state();
    let pool = state.pool_for_base_model("llama").unwrap();
    assert_eq!(
        state.observed_latency(pool, "10.0.0.1:8000", Millis(3_900)),
        None
    );
}

#[test]
fn a_request_counts_as_prefilling_until_its_response_starts() {
    let (picker, shared) = picker_pipeline();
    let prefilling = |shared: &SharedPicker| {
        let state = shared.state();
        let pool = state.pool_for_base_model("llama").unwrap();
        state.inflight(pool, "10.0.0.1:8000").unwrap().prefilling
    };
    let (mut host, mut run) = routed(&picker, 0);
    assert_eq!(prefilling(&shared), 1);
    run.response_headers(&picker, &mut host, false);
    assert_eq!(
        prefilling(&shared),
        1,
        "headers come before the first token"
    );
    run.response_chunk(&picker, &mut host, false);
    assert_eq!(prefilling(&shared), 0);
    run.response_chunk(&picker, &mut host, true);
    run.end(&picker, &mut host);
    assert_eq!(prefilling(&shared), 0);
    assert_eq!(counted(&shared), 0);
}
