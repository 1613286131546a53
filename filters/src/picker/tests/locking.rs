//! The shared state is entered only for the pick: reading and parsing the body, hashing the
//! prompt, reading the session header, the clock and the RNG happen before; headers, the
//! reply and stats after; the end gives the lease back without entering it. Proved two
//! ways: an accessor and host that log every host call with whether the state was held,
//! and a real [`SharedPicker`] whose pool lock another thread holds while the request
//! prepares.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::host::{
    HostError, ResetStream, ResponseHeaders, SnapshotFetch, SnapshotVersion, StreamState,
};
use crate::stats::StatKey;
use scheduler_core::request::Api;

/// Host calls and state entries, in order, each with whether the state was held.
#[derive(Default)]
struct Probe {
    events: Mutex<Vec<(&'static str, bool)>>,
    held: AtomicBool,
    /// Told when the request draws its random number (the last step before the pick).
    drew: Mutex<Option<mpsc::Sender<()>>>,
}

impl Probe {
    fn note(&self, what: &'static str) {
        let held = self.held.load(Ordering::SeqCst);
        self.events.lock().unwrap().push((what, held));
    }

    fn events(&self) -> Vec<(&'static str, bool)> {
        self.events.lock().unwrap().clone()
    }

    fn clear(&self) {
        self.events.lock().unwrap().clear();
    }
}

/// Logs every entry into the state.
struct ProbeAccess<'a> {
    state: &'a mut PickerShared,
    probe: &'a Probe,
}

impl PickerAccess for ProbeAccess<'_> {
    fn with_state<R>(&mut self, f: impl FnOnce(&mut PickerShared) -> R) -> R {
        assert!(
            !self.probe.held.load(Ordering::SeqCst),
            "state entered twice"
        );
        self.probe.note("enter");
        self.probe.held.store(true, Ordering::SeqCst);
        let out = f(self.state);
        self.probe.held.store(false, Ordering::SeqCst);
        self.probe.note("leave");
        out
    }
}

/// The fake host, logging each call into the probe.
struct ProbeHost<'a> {
    inner: FakeHost,
    probe: &'a Probe,
}

impl RequestHeaders for ProbeHost<'_> {
    fn request_header(&self, name: &str) -> Option<String> {
        self.probe.note("read header");
        RequestHeaders::request_header(&self.inner, name)
    }
    fn request_headers(&self) -> Vec<(String, String)> {
        self.probe.note("read headers");
        self.inner.request_headers()
    }
    fn set_request_header(&mut self, name: &str, value: &str) {
        self.probe.note("set header");
        self.inner.set_request_header(name, value);
    }
    fn add_request_header(&mut self, name: &str, value: &str) {
        self.probe.note("add header");
        self.inner.add_request_header(name, value);
    }
    fn remove_request_header(&mut self, name: &str) {
        self.probe.note("remove header");
        self.inner.remove_request_header(name);
    }
}

impl RequestBody for ProbeHost<'_> {
    fn request_body(&self, start: usize, len: usize) -> Option<Vec<u8>> {
        self.probe.note("read body");
        self.inner.request_body(start, len)
    }
    fn replace_request_body(&mut self, body: &[u8]) -> Result<(), HostError> {
        self.probe.note("replace body");
        self.inner.replace_request_body(body)
    }
}

impl ResetStream for ProbeHost<'_> {
    fn reset_stream(&mut self, details: &str) {
        self.probe.note("reset");
        self.inner.reset_stream(details);
    }
}

impl LocalReply for ProbeHost<'_> {
    fn send_local_reply(&mut self, reply: &Reply) {
        self.probe.note("reply");
        self.inner.send_local_reply(reply);
    }
}

impl StreamState for ProbeHost<'_> {
    fn set_stream_state(&mut self, key: &str, value: &[u8]) -> Result<(), HostError> {
        self.probe.note("set stream state");
        self.inner.set_stream_state(key, value)
    }
    fn stream_state(&self, key: &str) -> Option<Vec<u8>> {
        self.probe.note("read stream state");
        StreamState::stream_state(&self.inner, key)
    }
}

impl RequestWaker for ProbeHost<'_> {
    fn request_waker(&mut self) -> Result<Waker, HostError> {
        self.probe.note("waker");
        self.inner.request_waker()
    }
}

impl SnapshotSource for ProbeHost<'_> {
    fn snapshot_if_changed(&self, known: Option<SnapshotVersion>) -> SnapshotFetch {
        self.probe.note("snapshot");
        self.inner.snapshot_if_changed(known)
    }
}

impl Clock for ProbeHost<'_> {
    fn now(&self) -> Millis {
        self.probe.note("clock");
        Clock::now(&self.inner)
    }
}

impl Random for ProbeHost<'_> {
    fn random_u64(&mut self) -> u64 {
        self.probe.note("random");
        if let Some(tx) = self.probe.drew.lock().unwrap().as_ref() {
            let _ = tx.send(());
        }
        self.inner.random_u64()
    }
}

impl Stats for ProbeHost<'_> {
    fn counter_add(&mut self, key: &StatKey, delta: u64) {
        self.probe.note("counter");
        self.inner.counter_add(key, delta);
    }
    fn gauge_set(&mut self, key: &StatKey, value: u64) {
        self.probe.note("gauge");
        self.inner.gauge_set(key, value);
    }
    fn gauge_add(&mut self, key: &StatKey, delta: i64) {
        self.probe.note("gauge");
        self.inner.gauge_add(key, delta);
    }
    fn histogram_record(&mut self, key: &StatKey, value: u64) {
        self.probe.note("histogram");
        self.inner.histogram_record(key, value);
    }
    fn log_error(&mut self, message: &str) {
        self.probe.note("log");
        self.inner.log_error(message);
    }
}

impl DynamicMetadata for ProbeHost<'_> {
    fn set_metadata_string(
        &mut self,
        namespace: &str,
        key: &str,
        value: &str,
    ) -> Result<(), HostError> {
        self.probe.note("metadata");
        self.inner.set_metadata_string(namespace, key, value)
    }
}

impl ReadMetadata for ProbeHost<'_> {
    fn metadata_strings(&self, namespace: &str, key: &str) -> Option<Vec<String>> {
        self.probe.note("read metadata");
        self.inner.metadata_strings(namespace, key)
    }
}

impl RoutedCluster for ProbeHost<'_> {
    fn routed_cluster(&mut self) -> Option<String> {
        self.probe.note("cluster");
        self.inner.routed_cluster()
    }
}

impl crate::host::RouteRefresh for ProbeHost<'_> {
    fn refresh_route(&mut self) {
        self.probe.note("refresh route");
        self.inner.refresh_route();
    }
}

impl ServedUpstream for ProbeHost<'_> {
    fn served_upstream(&self) -> Option<String> {
        self.probe.note("served");
        self.inner.served_upstream()
    }
}

impl ResponseHeaders for ProbeHost<'_> {
    fn response_header(&self, name: &str) -> Option<String> {
        self.probe.note("response header read");
        self.inner.response_header(name)
    }
}

impl EditResponseHeaders for ProbeHost<'_> {
    fn set_response_header(&mut self, name: &str, value: &str) {
        self.probe.note("response header");
        self.inner.set_response_header(name, value);
    }
}

fn session_pool() -> PickerShared {
    shared(pool(&[A, B], json!({"sessionHeader": "x-session-id"})))
}

/// A prompt of several prefix blocks.
fn long_chat() -> Vec<u8> {
    chat(&"the quick brown fox jumps over the lazy dog. ".repeat(400))
}

#[test]
fn only_the_snapshot_read_and_the_pick_run_inside_the_state() {
    let mut state = session_pool();
    let probe = Probe::default();
    let mut host = ProbeHost {
        inner: host_for(&long_chat(), Some(fresh_all(&[A, B]))).request_header("x-session-id", "s"),
        probe: &probe,
    };
    let mut req = PickRun::new();
    let access = ProbeAccess {
        state: &mut state,
        probe: &probe,
    };
    assert_eq!(
        req.on_request_headers(access, &mut host, false),
        FilterStatus::Pause
    );
    probe.clear();
    let len = host.inner.body.len();
    let access = ProbeAccess {
        state: &mut state,
        probe: &probe,
    };
    assert_eq!(
        req.on_request_body(access, &mut host, len, true),
        FilterStatus::Continue
    );
    let events = probe.events();
    let names: Vec<&str> = events.iter().map(|(e, _)| *e).collect();
    assert_eq!(
        names.iter().filter(|e| **e == "enter").count(),
        1,
        "{names:?}"
    );
    let inside: Vec<&str> = events
        .iter()
        .filter(|(_, held)| *held)
        .map(|(e, _)| *e)
        .collect();
    assert_eq!(inside, vec!["snapshot"], "{names:?}");
    let at = |what: &str| names.iter().position(|e| *e == what);
    let enter = at("enter");
    let leave = at("leave");
    // Prepared before: body read (then parse and hashing), session header, clock, RNG.
    for before in ["read body", "read header", "clock", "random"] {
        assert!(
            at(before) < enter,
            "{before} not before the pick: {names:?}"
        );
    }
    // Written after: stats, destination header, metadata.
    for after in ["counter", "set header", "metadata"] {
        assert!(at(after) > leave, "{after} not after the pick: {names:?}");
    }
    assert!(host.inner.header(DESTINATION_ENDPOINT).is_some());
    assert!(req.holds_lease());

    // The end gives the lease back without entering the state (the lease's own handle).
    probe.clear();
    req.on_end(ProbeAccess {
        state: &mut state,
        probe: &probe,
    });
    req.on_end(ProbeAccess {
        state: &mut state,
        probe: &probe,
    });
    assert_eq!(probe.events(), vec![]);
    assert_eq!(
        requests_in_flight(&state, A) + requests_in_flight(&state, B),
        0
    );
}

#[test]
fn a_malformed_body_is_answered_without_entering_the_state() {
    let mut state = session_pool();
    let probe = Probe::default();
    let mut host = ProbeHost {
        inner: host_for(
            b"{\"model\": \"llama\", \"messages\": [",
            Some(fresh_all(&[A])),
        ),
        probe: &probe,
    };
    let mut req = PickRun::new();
    let access = ProbeAccess {
        state: &mut state,
        probe: &probe,
    };
    req.on_request_headers(access, &mut host, false);
    probe.clear();
    let len = host.inner.body.len();
    let access = ProbeAccess {
        state: &mut state,
        probe: &probe,
    };
    assert_eq!(
        req.on_request_body(access, &mut host, len, true),
        FilterStatus::Replied
    );
    assert_eq!(host.inner.last_reply().map(|r| r.status), Some(400));
    assert!(
        !probe.events().iter().any(|(e, _)| *e == "enter"),
        "parsing took the state: {:?}",
        probe.events()
    );
}

#[test]
fn prepare_parses_and_hashes_with_the_plan_alone() {
    let state = session_pool();
    let Some(plan) = state.pool_plan("llama") else {
        unreachable!("the pool serves llama")
    };
    drop(state); // no shared state exists while preparing
    let body = long_chat();
    let mut host = host_for(&body, None).request_header("x-session-id", "s9");
    let prepared = PreparedPick::new(&plan, Api::ChatCompletions, &body, &mut host);
    let Ok(prepared) = prepared else {
        unreachable!("valid body")
    };
    let parsed = scheduler_core::request::parse(Api::ChatCompletions, &body);
    let Ok(parsed) = parsed else {
        unreachable!("valid body")
    };
    let cfg = scheduler_core::prefix::PrefixConfig::default();
    let expected = scheduler_core::prefix::block_hashes(
        scheduler_core::prefix::seed("llama", None),
        &parsed.prompt,
        &cfg,
    );
    assert!(expected.len() >= 4);
    assert_eq!(prepared.block_hashes(), &expected[..]);
    let req = prepared.request();
    assert_eq!(req.session, Some("s9"));
    assert_eq!(req.target_model, "llama");
    assert_eq!(req.prompt_tokens, parsed.prompt_tokens);
}

#[test]
fn a_shared_picker_prepares_while_another_thread_holds_its_lock() {
    let picker = Arc::new(SharedPicker::new(shared(pool(&[A, B], json!({})))));
    let probe = Arc::new(Probe::default());
    let (tx, drew) = mpsc::channel();
    *probe.drew.lock().unwrap() = Some(tx);
    let body = long_chat();

    let guard = picker.state().hold_pool(PoolId(0));
    assert!(guard.is_some());
    let worker = {
        let picker = Arc::clone(&picker);
        let probe = Arc::clone(&probe);
        std::thread::spawn(move || {
            let mut host = ProbeHost {
                inner: host_for(&body, Some(fresh_all(&[A, B]))),
                probe: &probe,
            };
            let mut req = PickRun::new();
            let first = req.on_request_headers(&*picker, &mut host, false);
            let status = req.on_request_body(&*picker, &mut host, body.len(), true);
            let endpoint = req.endpoint().map(str::to_owned);
            req.on_end(&*picker);
            (first, status, endpoint)
        })
    };
    // Headers, body read, parse and hashing all finish while this thread holds the lock.
    assert!(
        drew.recv_timeout(Duration::from_secs(30)).is_ok(),
        "the request could not prepare while the state was locked"
    );
    assert_eq!(
        requests_in_flight(picker.state(), A) + requests_in_flight(picker.state(), B),
        0
    );
    drop(guard);
    let Ok((first, status, endpoint)) = worker.join() else {
        unreachable!("worker panicked")
    };
    assert_eq!(first, FilterStatus::Pause);
    assert_eq!(status, FilterStatus::Continue);
    assert!(endpoint.as_deref() == Some(A) || endpoint.as_deref() == Some(B));
    let state = picker.state();
    assert_eq!(
        requests_in_flight(state, A) + requests_in_flight(state, B),
        0
    );
}

#[test]
fn a_plan_of_another_state_is_refused() {
    let one = shared(pool(&[A], json!({})));
    let two = shared(pool(&[A], json!({})));
    let Some(foreign) = two.pool_plan("llama") else {
        unreachable!("the pool serves llama")
    };
    let hashes = Vec::new();
    let req = PickRequest {
        target_model: "llama",
        block_hashes: &hashes,
        prompt_tokens: scheduler_core::types::Tokens(1),
        max_output_tokens: None,
        output_sequences: 1,
        session: None,
    };
    let mut host = host_for(b"", Some(fresh_all(&[A])));
    one.refresh_snapshot(&host);
    assert_eq!(
        one.pick(&foreign, &req, Millis(NOW), host.random_u64()),
        Err(Rejection::NoEndpoints)
    );
    assert_eq!(requests_in_flight(&one, A), 0);
}
