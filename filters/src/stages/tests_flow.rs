//! Flow control through the picker stage over the fake host, one host per stream and one
//! process state: admitted at once while the pool has room, queued (paused) when it is
//! saturated, dispatched by a request's end in priority order, dropped by a full band, a
//! TTL or a client that leaves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use super::*;
use crate::fake::FakeHost;
use crate::headers::{BASE_MODEL, DESTINATION_ENDPOINT, DROPPED_REASON, FAIRNESS_ID, OBJECTIVE};
use crate::picker::{PickerShared, SharedPicker};
use crate::pipeline::{Pipeline, Run, Stage};
use crate::FilterStatus;
use scheduler_core::types::Millis;

const BODY: &[u8] = br#"{"model":"llama","messages":[{"role":"user","content":"hello there"}]}"#;

/// A pool of one endpoint whose flow control admits `max` requests at a time.
fn flow_pipeline(max: u32, band_max: u32, ttl: &str) -> (Pipeline<FakeHost>, Arc<SharedPicker>) {
    let mut epp = crate::picker::config::default_epp_config();
    let plugins = epp["plugins"].as_array_mut().unwrap();
    plugins.push(serde_json::json!({"type": "concurrency-detector",
        "parameters": {"maxConcurrency": max}}));
    plugins.push(serde_json::json!({"type": "round-robin-fairness-policy"}));
    plugins.push(serde_json::json!({"type": "fcfs-ordering-policy"}));
    epp["featureGates"] = serde_json::json!(["flowControl"]);
    epp["flowControl"] = serde_json::json!({
        "defaultRequestTTL": ttl,
        "saturationDetector": {"pluginRef": "concurrency-detector"},
        "priorityBands": [
            {"priority": 100, "maxRequests": band_max},
            {"priority": 0, "maxRequests": band_max}
        ]
    });
    let state = PickerShared::from_json(serde_json::json!({
        "pools": [{"pool": "p", "baseModel": "llama", "endpoints": ["10.0.0.1:8000"],
                   "failureMode": "FailOpen", "eppConfig": epp}],
        "objectives": [{"apiVersion": "llm-d.ai/v1alpha2", "kind": "InferenceObjective",
                        "metadata": {"name": "premium"}, "spec": {"priority": 100}}]
    }))
    .unwrap();
    let shared = Arc::new(SharedPicker::new(state));
    let stage: Box<dyn Stage<FakeHost>> = Box::new(PickStage::new(Arc::clone(&shared)));
    (Pipeline::new(vec![stage]), shared)
}

/// A stream of `flow`, with `objective` if any, at time `now`.
fn stream(flow: &str, objective: Option<&str>, now: u64) -> FakeHost {
    let mut host = FakeHost::new()
        .post("/v1/chat/completions", BODY)
        .request_header(BASE_MODEL, "llama")
        .request_header(FAIRNESS_ID, flow);
    if let Some(objective) = objective {
        host = host.request_header(OBJECTIVE, objective);
    }
    host.now = Millis(now);
    host
}

/// Send the whole request; what the picker answered at the body.
fn send(picker: &Pipeline<FakeHost>, host: &mut FakeHost) -> (Run, FilterStatus) {
    let mut run = Run::new();
    assert_eq!(
        run.request_headers(picker, host, false),
        FilterStatus::Pause,
        "waits for the body"
    );
    let len = host.body.len();
    let status = run.request_body(picker, host, len, true);
    (run, status)
}

fn reason(host: &FakeHost) -> Option<String> {
    let reply = host.replies.last()?;
    Some(
        reply
            .headers
            .iter()
            .find(|(k, _)| k == DROPPED_REASON)?
            .1
            .clone(),
    )
}

#[test]
fn a_saturated_pool_queues_and_a_requests_end_dispatches_the_next_in_priority_order() {
    let (picker, _shared) = flow_pipeline(1, 10, "60s");
    let mut first = stream("a", None, 0);
    let (mut first_run, status) = send(&picker, &mut first);
    assert_eq!(status, FilterStatus::Continue, "admitted at once");
    assert_eq!(first.header(DESTINATION_ENDPOINT), Some("10.0.0.1:8000"));

    // Saturated: two standard requests wait, then a premium one arrives last.
    let mut waiting = Vec::new();
    for (i, objective) in [None, None, Some("premium")].into_iter().enumerate() {
        let mut host = stream("b", objective, 10 + i as u64);
        let (run, status) = send(&picker, &mut host);
        assert_eq!(status, FilterStatus::Pause, "request {i} waits");
        assert!(host.header(DESTINATION_ENDPOINT).is_none());
        assert_eq!(
            host.gauges
                .get("infergate.flow.queued.pool.p.band.0.flow.b")
                .or(host
                    .gauges
                    .get("infergate.flow.queued.pool.p.band.100.flow.b")),
            Some(&1)
        );
        waiting.push((host, run));
    }

    // The first ends: exactly one is woken, the premium one.
    first.now = Millis(50);
    first_run.end(&picker, &mut first);
    let woken: Vec<usize> = waiting
        .iter()
        .enumerate()
        .filter(|(_, (h, _))| h.woken() == 1)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        woken,
        vec![2],
        "the higher band goes first, though it came last"
    );
    let (host, run) = &mut waiting[2];
    host.now = Millis(50);
    assert_eq!(run.wake(&picker, host), Some(FilterStatus::Continue));
    assert_eq!(host.header(DESTINATION_ENDPOINT), Some("10.0.0.1:8000"));
    assert_eq!(
        host.counters
            .get("infergate.flow.dispatches.pool.p.band.100.flow.b"),
        Some(&1)
    );
    assert_eq!(
        host.histograms
            .get("infergate.flow.queue_time_ms.pool.p.band.100"),
        Some(&vec![38])
    );
    // Then the standard ones, in arrival order, one per end.
    run.end(&picker, host);
    assert_eq!(waiting[0].0.woken(), 1);
    assert_eq!(waiting[1].0.woken(), 0);
}

#[test]
fn a_full_band_refuses_at_once_and_a_ttl_drops_the_waiting_request() {
    let (picker, shared) = flow_pipeline(1, 1, "2s");
    let mut first = stream("a", None, 0);
    let (_first_run, _) = send(&picker, &mut first);
    let mut queued = stream("a", None, 0);
    let (mut queued_run, status) = send(&picker, &mut queued);
    assert_eq!(status, FilterStatus::Pause);
    let mut refused = stream("a", None, 0);
    let (_, status) = send(&picker, &mut refused);
    assert_eq!(status, FilterStatus::Replied);
    assert_eq!(refused.replies.last().map(|r| r.status), Some(429));
    assert_eq!(reason(&refused).as_deref(), Some("rejected-saturated"));

    // The timer before the TTL does nothing; at the TTL the request is dropped.
    shared.state().run_flow_control(1_999);
    assert_eq!(queued.woken(), 0);
    shared.state().run_flow_control(2_000);
    assert_eq!(queued.woken(), 1);
    assert_eq!(
        queued_run.wake(&picker, &mut queued),
        Some(FilterStatus::Replied)
    );
    assert_eq!(reason(&queued).as_deref(), Some("rejected-ttl-expired"));
    assert_eq!(
        queued
            .counters
            .get("infergate.flow.rejections.pool.p.band.0.flow.a.reason.rejected-ttl-expired"),
        Some(&1)
    );
    assert_eq!(
        queued
            .gauges
            .get("infergate.flow.queued.pool.p.band.0.flow.a"),
        Some(&0)
    );
}

#[test]
fn a_client_that_leaves_the_queue_frees_its_place_and_is_never_routed() {
    let (picker, _shared) = flow_pipeline(1, 1, "60s");
    let mut first = stream("a", None, 0);
    let (mut first_run, _) = send(&picker, &mut first);
    let mut leaving = stream("a", None, 0);
    let (mut leaving_run, status) = send(&picker, &mut leaving);
    assert_eq!(status, FilterStatus::Pause);
    leaving_run.end(&picker, &mut leaving);
    assert!(leaving.header(DESTINATION_ENDPOINT).is_none());
    assert_eq!(
        leaving.counters.get(
            "infergate.flow.rejections.pool.p.band.0.flow.a.reason.rejected-context-cancelled"
        ),
        Some(&1)
    );
    // Its place in the band (of one) is free again.
    let mut next = stream("a", None, 1);
    let (_next_run, status) = send(&picker, &mut next);
    assert_eq!(status, FilterStatus::Pause, "queued, not refused");
    first_run.end(&picker, &mut first);
    assert_eq!(next.woken(), 1, "the first's end dispatches it");
    assert_eq!(leaving.woken(), 0);
}

/// A pool of one endpoint admitting `max` requests, with a sheddable band (`batch`, -1)
/// under the default one, and `enableEviction` as given.
fn eviction_pipeline(max: u32, evict: bool) -> (Pipeline<FakeHost>, Arc<SharedPicker>) {
    let mut epp = crate::picker::config::default_epp_config();
    let plugins = epp["plugins"].as_array_mut().unwrap();
    plugins.push(serde_json::json!({"type": "concurrency-detector",
        "parameters": {"maxConcurrency": max}}));
    epp["featureGates"] = serde_json::json!(["flowControl"]);
    epp["flowControl"] = serde_json::json!({
        "saturationDetector": {"pluginRef": "concurrency-detector"},
        "priorityBands": [{"priority": 0}, {"priority": -1}],
        "enableEviction": evict
    });
    let state = PickerShared::from_json(serde_json::json!({
        "pools": [{"pool": "p", "baseModel": "llama", "endpoints": ["10.0.0.1:8000"],
                   "failureMode": "FailOpen", "eppConfig": epp}],
        "objectives": [{"apiVersion": "llm-d.ai/v1alpha2", "kind": "InferenceObjective",
                        "metadata": {"name": "batch"}, "spec": {"priority": -1}}]
    }))
    .unwrap();
    let shared = Arc::new(SharedPicker::new(state));
    let stage: Box<dyn Stage<FakeHost>> = Box::new(PickStage::new(Arc::clone(&shared)));
    (Pipeline::new(vec![stage]), shared)
}

#[test]
fn a_blocked_request_evicts_the_latest_sheddable_one_429_before_its_response_reset_after() {
    let (picker, _shared) = eviction_pipeline(2, true);
    // Two sheddable requests fill the pool; the older one's response has started.
    let mut older = stream("batch-flow", Some("batch"), 0);
    let (mut older_run, status) = send(&picker, &mut older);
    assert_eq!(status, FilterStatus::Continue);
    older_run.response_headers(&picker, &mut older, false);
    let mut newer = stream("batch-flow", Some("batch"), 1);
    let (mut newer_run, status) = send(&picker, &mut newer);
    assert_eq!(status, FilterStatus::Continue);

    // A default-band request is blocked: it waits, and evicts the most recent one.
    let mut first = stream("std", None, 2);
    let (mut first_run, status) = send(&picker, &mut first);
    assert_eq!(status, FilterStatus::Pause);
    assert_eq!((older.woken(), newer.woken()), (0, 1));
    assert_eq!(
        newer_run.wake(&picker, &mut newer),
        Some(FilterStatus::Replied)
    );
    assert_eq!(newer.replies.last().map(|r| r.status), Some(429));
    assert_eq!(reason(&newer).as_deref(), Some("evicted-by-priority"));
    assert_eq!(
        newer
            .stream_state
            .get(crate::flow::EVICTED_STATE)
            .map(Vec::as_slice),
        Some(&b"evicted-by-priority"[..])
    );
    assert_eq!(
        newer
            .counters
            .get("infergate.flow.evictions.pool.p.band.-1.flow.batch-flow.when.before_response"),
        Some(&1)
    );
    // Its end frees the slot the blocked request waits for.
    newer_run.end(&picker, &mut newer);
    assert_eq!(first.woken(), 1);
    assert_eq!(
        first_run.wake(&picker, &mut first),
        Some(FilterStatus::Continue)
    );
    assert_eq!(first.header(DESTINATION_ENDPOINT), Some("10.0.0.1:8000"));

    // The next blocked request evicts the older one, whose response started: a reset.
    let mut second = stream("std", None, 3);
    let (_second_run, status) = send(&picker, &mut second);
    assert_eq!(status, FilterStatus::Pause);
    assert_eq!(older.woken(), 1);
    assert_eq!(older_run.wake(&picker, &mut older), None);
    assert_eq!(older.resets, ["evicted-by-priority"]);
    assert!(
        older.replies.is_empty(),
        "nothing answered after the response started"
    );
    // A later wake finds nothing to do: the request is evicted once.
    assert_eq!(older_run.wake(&picker, &mut older), None);
    assert_eq!(older.resets.len(), 1);

    // Nothing sheddable is left: a third blocked request only waits.
    let mut third = stream("std", None, 4);
    let (_third_run, status) = send(&picker, &mut third);
    assert_eq!(status, FilterStatus::Pause);
    assert_eq!(first.woken(), 1);
}

#[test]
fn without_enable_eviction_and_for_its_own_band_nothing_is_evicted() {
    let (picker, _shared) = eviction_pipeline(1, false);
    let mut batch = stream("b", Some("batch"), 0);
    let (_batch_run, _) = send(&picker, &mut batch);
    let mut std = stream("std", None, 1);
    let (_std_run, status) = send(&picker, &mut std);
    assert_eq!(status, FilterStatus::Pause);
    assert_eq!(batch.woken(), 0, "eviction is off");

    let (picker, _shared) = eviction_pipeline(1, true);
    let mut batch = stream("b", Some("batch"), 0);
    let (_batch_run, _) = send(&picker, &mut batch);
    let mut same_band = stream("b2", Some("batch"), 1);
    let (_run, status) = send(&picker, &mut same_band);
    assert_eq!(status, FilterStatus::Pause);
    assert_eq!(batch.woken(), 0, "a band never evicts its own requests");
}

#[test]
fn a_queued_request_dropped_without_its_end_leaves_the_queue() {
    let (picker, _shared) = flow_pipeline(1, 1, "60s");
    let mut first = stream("a", None, 0);
    let (_first_run, _) = send(&picker, &mut first);
    let mut gone = stream("a", None, 0);
    let (gone_run, status) = send(&picker, &mut gone);
    assert_eq!(status, FilterStatus::Pause);
    drop(gone_run);
    // The band holds one: had the dropped request kept its place, this would be refused.
    let mut next = stream("a", None, 1);
    let (_next_run, status) = send(&picker, &mut next);
    assert_eq!(status, FilterStatus::Pause, "queued in the freed place");
}

/// A snapshot in which the one endpoint has `waiting` requests queued.
fn snapshot_with_waiting(waiting: u32, at: u64) -> Vec<u8> {
    use scheduler_core::metrics::EndpointMetrics;
    use scheduler_core::snapshot::{encode, EndpointSample, Snapshot};
    encode(&Snapshot {
        taken_at: Millis(at),
        clusters: Vec::new(),
        endpoints: vec![EndpointSample {
            address: "10.0.0.1:8000".into(),
            scraped_at: Millis(at),
            consecutive_failures: 0,
            metrics: Some(EndpointMetrics {
                waiting: Some(waiting),
                running: Some(1),
                kv_cache_usage: Some(0.1),
                ..EndpointMetrics::default()
            }),
        }],
    })
}

#[test]
fn a_utilization_detector_saturates_on_a_snapshot_and_a_later_one_dispatches() {
    let mut epp = crate::picker::config::default_epp_config();
    let plugins = epp["plugins"].as_array_mut().unwrap();
    plugins.push(serde_json::json!({"type": "utilization-detector",
        "parameters": {"queueDepthThreshold": 5}}));
    epp["featureGates"] = serde_json::json!(["flowControl"]);
    epp["flowControl"] = serde_json::json!({
        "saturationDetector": {"pluginRef": "utilization-detector"}});
    let state = PickerShared::from_json(serde_json::json!({
        "pool": "p", "baseModel": "llama", "endpoints": ["10.0.0.1:8000"],
        "failureMode": "FailOpen", "eppConfig": epp
    }))
    .unwrap();
    let shared = Arc::new(SharedPicker::new(state));
    let stage: Box<dyn Stage<FakeHost>> = Box::new(PickStage::new(Arc::clone(&shared)));
    let picker = Pipeline::new(vec![stage]);

    // The snapshot the first pick reads shows the endpoint's queue at the threshold.
    let mut first = stream("a", None, 0).snapshot(1, snapshot_with_waiting(5, 0));
    let (_first_run, status) = send(&picker, &mut first);
    assert_eq!(
        status,
        FilterStatus::Continue,
        "admitted before any verdict"
    );
    let mut second = stream("a", None, 1).snapshot(1, snapshot_with_waiting(5, 0));
    let (mut second_run, status) = send(&picker, &mut second);
    assert_eq!(
        status,
        FilterStatus::Pause,
        "every endpoint saturated: queued"
    );

    // A snapshot with room: the timer's refresh lifts saturation and dispatches.
    let fresh = FakeHost::new().snapshot(2, snapshot_with_waiting(0, 2));
    shared.state().refresh_snapshot(&fresh);
    shared.state().run_flow_control(3);
    assert_eq!(second.woken(), 1);
    second.now = Millis(3);
    assert_eq!(
        second_run.wake(&picker, &mut second),
        Some(FilterStatus::Continue)
    );
    assert_eq!(second.header(DESTINATION_ENDPOINT), Some("10.0.0.1:8000"));
}
