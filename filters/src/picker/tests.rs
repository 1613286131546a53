//! Picker tests against the fake host: pool confinement, rejections, failure modes,
//! in-flight accounting, prefix and session affinity, snapshot caching, stats.

use scheduler_core::metrics::EndpointMetrics;
use scheduler_core::snapshot::{encode, EndpointSample, Snapshot};
use scheduler_core::types::Millis;
use serde_json::{json, Value};

use super::*;
use crate::fake::FakeHost;
use crate::headers::{DESTINATION_ENDPOINT, DROPPED_REASON};

const A: &str = "10.0.0.1:8000";
const B: &str = "10.0.0.2:8000";
const C: &str = "10.0.0.3:8000";
const NOW: u64 = 100_000;

fn shared(pool: Value) -> PickerShared {
    match PickerShared::from_json(pool) {
        Ok(s) => s,
        Err(e) => unreachable!("test config must build: {e}"),
    }
}

fn pool(endpoints: &[&str], extra: Value) -> Value {
    let mut v = json!({"pool": "p", "baseModel": "llama", "endpoints": endpoints});
    if let (Some(obj), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
        for (k, x) in extra {
            obj.insert(k.clone(), x.clone());
        }
    }
    v
}

fn metrics(waiting: u32, kv: f64) -> EndpointMetrics {
    EndpointMetrics {
        waiting: Some(waiting),
        running: Some(0),
        kv_cache_usage: Some(kv),
        ..EndpointMetrics::default()
    }
}

/// A snapshot with every listed endpoint scraped at `at`.
fn snapshot(at: u64, endpoints: &[(&str, EndpointMetrics)]) -> Vec<u8> {
    encode(&Snapshot {
        taken_at: Millis(at),
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

fn fresh_all(endpoints: &[&str]) -> Vec<u8> {
    let list: Vec<(&str, EndpointMetrics)> =
        endpoints.iter().map(|e| (*e, metrics(0, 0.1))).collect();
    snapshot(NOW, &list)
}

fn chat(content: &str) -> Vec<u8> {
    json!({"model": "llama", "messages": [{"role": "user", "content": content}]})
        .to_string()
        .into_bytes()
}

fn host_for(body: &[u8], snapshot: Option<Vec<u8>>) -> FakeHost {
    let h = FakeHost::new()
        .request_header(BASE_MODEL, "llama")
        .post("/v1/chat/completions", body)
        .now(NOW);
    match snapshot {
        Some(bytes) => h.snapshot(1, bytes),
        None => h,
    }
}

/// Headers + one complete body callback.
fn drive(shared: &mut PickerShared, host: &mut FakeHost, req: &mut PickerRequest) -> FilterStatus {
    let first = req.on_request_headers(shared, host, false);
    if first != FilterStatus::Pause {
        return first;
    }
    let len = host.body.len();
    req.on_request_body(shared, host, len, true)
}

fn pick_one(shared: &mut PickerShared, host: &mut FakeHost) -> (FilterStatus, PickerRequest) {
    let mut req = PickerRequest::new();
    let status = drive(shared, host, &mut req);
    (status, req)
}

fn requests_in_flight(shared: &PickerShared, address: &str) -> u32 {
    shared
        .inflight(PoolId(0), address)
        .map_or(u32::MAX, |l| l.requests)
}

#[test]
fn picks_a_pool_endpoint_and_sets_header_metadata_and_override() {
    let mut s = shared(pool(&[A, B], json!({})));
    let mut host = host_for(&chat("hello"), Some(fresh_all(&[A, B])));
    let (status, req) = pick_one(&mut s, &mut host);
    assert_eq!(status, FilterStatus::Continue);
    let picked = host.header(DESTINATION_ENDPOINT).map(str::to_owned);
    assert!(picked.as_deref() == Some(A) || picked.as_deref() == Some(B));
    assert_eq!(req.endpoint(), picked.as_deref());
    let md = host.metadata.clone().unwrap_or_default();
    assert_eq!(
        md,
        vec![(
            "envoy.lb".to_owned(),
            DESTINATION_ENDPOINT.to_owned(),
            picked.clone().unwrap_or_default()
        )]
    );
    assert_eq!(host.upstream_override, picked);
    assert_eq!(host.counter("infergate.picker.decisions.pool.p"), 1);
    assert_eq!(
        host.counter_sum("infergate.picker.picks.pool.p.endpoint."),
        1
    );
}

#[test]
fn a_client_destination_outside_the_pool_has_no_effect() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("hello"), Some(fresh_all(&[A])))
        .request_header(DESTINATION_ENDPOINT, "192.168.1.1:22");
    let (status, _) = pick_one(&mut s, &mut host);
    assert_eq!(status, FilterStatus::Continue);
    let values: Vec<&str> = host
        .request_headers
        .iter()
        .filter(|(k, _)| k == DESTINATION_ENDPOINT)
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(values, vec![A]);
}

#[test]
fn a_snapshot_endpoint_outside_the_pool_is_never_a_candidate() {
    let mut s = shared(pool(&[A], json!({})));
    // C is scraped (another pool) and idle; A is busy. Only A may be picked.
    let bytes = snapshot(NOW, &[(A, metrics(50, 0.9)), (C, metrics(0, 0.0))]);
    for _ in 0..20 {
        let mut host = host_for(&chat("x"), Some(bytes.clone()));
        pick_one(&mut s, &mut host);
        assert_eq!(host.header(DESTINATION_ENDPOINT), Some(A));
    }
}

#[test]
fn an_empty_pool_is_503_rejected_no_endpoints() {
    let mut s = shared(pool(&[], json!({})));
    let mut host = host_for(&chat("hello"), Some(fresh_all(&[A])));
    let (status, req) = pick_one(&mut s, &mut host);
    assert_eq!(status, FilterStatus::Replied);
    let reply = host.last_reply().cloned();
    assert_eq!(reply.as_ref().map(|r| r.status), Some(503));
    assert!(reply.is_some_and(|r| r
        .headers
        .iter()
        .any(|(k, v)| k == DROPPED_REASON && v == "rejected-no-endpoints")));
    assert!(!req.holds_lease());
    assert_eq!(
        host.counter("infergate.picker.rejects.pool.p.reason.no_endpoints"),
        1
    );
    assert_eq!(host.header(DESTINATION_ENDPOINT), None);
}

#[test]
fn stale_metrics_fail_closed_by_default() {
    let mut s = shared(pool(&[A, B], json!({})));
    // Scraped 5 s before now: older than the 1 s bound.
    let bytes = snapshot(NOW - 5_000, &[(A, metrics(0, 0.1)), (B, metrics(0, 0.1))]);
    let mut host = host_for(&chat("hello"), Some(bytes));
    let (status, _) = pick_one(&mut s, &mut host);
    assert_eq!(status, FilterStatus::Replied);
    assert_eq!(host.last_reply().map(|r| r.status), Some(503));
    assert_eq!(
        host.counter("infergate.picker.rejects.pool.p.reason.stale_metrics"),
        1
    );
}

#[test]
fn missing_snapshot_fails_closed_and_fail_open_still_serves() {
    let mut closed = shared(pool(&[A, B], json!({})));
    let mut host = host_for(&chat("hello"), None);
    assert_eq!(pick_one(&mut closed, &mut host).0, FilterStatus::Replied);

    let mut open = shared(pool(&[A, B], json!({"failureMode": "FailOpen"})));
    let mut host = host_for(&chat("hello"), None);
    let (status, req) = pick_one(&mut open, &mut host);
    assert_eq!(status, FilterStatus::Continue);
    assert!(req.holds_lease());
    assert!(matches!(
        host.header(DESTINATION_ENDPOINT),
        Some(A) | Some(B)
    ));
    assert_eq!(host.counter("infergate.picker.fail_open_picks.pool.p"), 1);
}

#[test]
fn fail_open_spreads_by_in_proxy_load() {
    let mut s = shared(pool(&[A, B], json!({"failureMode": "FailOpen"})));
    let bytes = snapshot(NOW - 5_000, &[(A, metrics(0, 0.1)), (B, metrics(0, 0.1))]);
    let mut held = Vec::new();
    for i in 0..4 {
        let mut host = host_for(&chat(&format!("different prompt {i}")), Some(bytes.clone()));
        let (status, req) = pick_one(&mut s, &mut host);
        assert_eq!(status, FilterStatus::Continue);
        held.push(req);
    }
    assert_eq!(requests_in_flight(&s, A), 2);
    assert_eq!(requests_in_flight(&s, B), 2);
    for mut r in held {
        r.on_end(&mut s);
    }
}

#[test]
fn an_endpoint_over_the_kv_threshold_gets_no_new_requests() {
    let epp = json!({
        "plugins": [
            {"type": "utilization-filter", "parameters": {
                "conditions": [{"metric": "kv-cache-utilization", "maxValue": 0.8}]}},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "max-score-picker"}
        ]
    });
    let mut s = shared(pool(&[A, B], json!({"eppConfig": epp})));
    let bytes = snapshot(NOW, &[(A, metrics(0, 0.95)), (B, metrics(0, 0.5))]);
    for i in 0..10 {
        let mut host = host_for(&chat(&format!("p{i}")), Some(bytes.clone()));
        assert_eq!(pick_one(&mut s, &mut host).0, FilterStatus::Continue);
        assert_eq!(host.header(DESTINATION_ENDPOINT), Some(B));
    }
}

#[test]
fn a_dead_endpoint_is_dropped_after_max_consecutive_failures() {
    let mut s = shared(pool(&[A, B], json!({"maxConsecutiveFailures": 2})));
    let bytes = encode(&Snapshot {
        taken_at: Millis(NOW),
        endpoints: vec![
            EndpointSample {
                address: A.to_owned(),
                scraped_at: Millis(NOW),
                consecutive_failures: 2,
                metrics: Some(metrics(0, 0.0)),
            },
            EndpointSample {
                address: B.to_owned(),
                scraped_at: Millis(NOW),
                consecutive_failures: 1,
                metrics: Some(metrics(9, 0.9)),
            },
        ],
    });
    for i in 0..10 {
        let mut host = host_for(&chat(&format!("p{i}")), Some(bytes.clone()));
        pick_one(&mut s, &mut host);
        assert_eq!(host.header(DESTINATION_ENDPOINT), Some(B));
    }
}

#[test]
fn in_flight_counts_rise_at_pick_and_fall_exactly_once_at_the_end() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("hello"), Some(fresh_all(&[A])));
    let (_, mut first) = pick_one(&mut s, &mut host);
    let mut host = host_for(&chat("hello again"), Some(fresh_all(&[A])));
    let (_, mut second) = pick_one(&mut s, &mut host);
    assert_eq!(requests_in_flight(&s, A), 2);
    assert!(s.inflight(PoolId(0), A).is_some_and(|l| l.tokens.0 > 0));

    // Complete (on_log), then the context drop calls on_end again: one decrement.
    first.on_end(&mut s);
    assert_eq!(requests_in_flight(&s, A), 1);
    first.on_end(&mut s);
    assert_eq!(requests_in_flight(&s, A), 1);
    assert!(!first.holds_lease());

    // Reset first, then complete: still one decrement.
    second.on_end(&mut s);
    second.on_end(&mut s);
    assert_eq!(requests_in_flight(&s, A), 0);
    assert!(s.inflight(PoolId(0), A).is_some_and(|l| l.tokens.0 == 0));
}

#[test]
fn rejected_and_passthrough_requests_hold_nothing() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("x"), None);
    let (_, mut rejected) = pick_one(&mut s, &mut host);
    rejected.on_end(&mut s);
    assert_eq!(requests_in_flight(&s, A), 0);
}

#[test]
fn a_lease_from_a_replaced_state_is_ignored() {
    let mut old = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("x"), Some(fresh_all(&[A])));
    let (_, mut req) = pick_one(&mut old, &mut host);
    let mut new = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("y"), Some(fresh_all(&[A])));
    let (_, _held) = pick_one(&mut new, &mut host);
    req.on_end(&mut new);
    assert_eq!(requests_in_flight(&new, A), 1);
}

#[test]
fn turn_two_lands_where_turn_one_was_served_while_load_spreads() {
    let mut s = shared(pool(&[A, B, C], json!({})));
    let snap = fresh_all(&[A, B, C]);
    let mut turn_one = Vec::new();
    let mut held = Vec::new();
    for conv in 0..6 {
        // Distinct conversations, each several prefix blocks long.
        let first = format!("conversation {conv}: ").repeat(80);
        let mut host = host_for(&chat(&first), Some(snap.clone()));
        let (_, req) = pick_one(&mut s, &mut host);
        turn_one.push((first, req.endpoint().map(str::to_owned)));
        held.push(req);
    }
    // Load spread: the in-flight scorer kept every endpoint in use.
    for e in [A, B, C] {
        assert!(requests_in_flight(&s, e) >= 1, "{e} got no conversation");
    }
    for mut r in held {
        r.on_end(&mut s);
    }
    for (first, endpoint) in &turn_one {
        let body = json!({"model": "llama", "messages": [
            {"role": "user", "content": first},
            {"role": "assistant", "content": "Here is what I know."},
            {"role": "user", "content": "Tell me more."}
        ]})
        .to_string();
        let mut host = host_for(body.as_bytes(), Some(snap.clone()));
        let (_, mut req) = pick_one(&mut s, &mut host);
        assert_eq!(req.endpoint().map(str::to_owned), *endpoint);
        req.on_end(&mut s);
    }
    assert!(s.prefix_hit_ratio(PoolId(0)) > 0.3);
    assert!(s.prefix_hit_ratio(PoolId(0)) <= 1.0);
}

#[test]
fn prefix_block_stats_count_matched_and_total_blocks() {
    let mut s = shared(pool(&[A], json!({})));
    let prompt = "a".repeat(64 * 4 * 3 + 10); // three full 64-token blocks of prompt text
    let mut host = host_for(&chat(&prompt), Some(fresh_all(&[A])));
    let (_, mut r1) = pick_one(&mut s, &mut host);
    let total = host.counter("infergate.picker.prefix_total_blocks.pool.p");
    assert!(total >= 3);
    assert_eq!(
        host.counter("infergate.picker.prefix_matched_blocks.pool.p"),
        0
    );
    r1.on_end(&mut s);
    let mut host = host_for(&chat(&prompt), Some(fresh_all(&[A])));
    let (_, mut r2) = pick_one(&mut s, &mut host);
    assert_eq!(
        host.counter("infergate.picker.prefix_matched_blocks.pool.p"),
        total
    );
    r2.on_end(&mut s);
    assert!((s.prefix_hit_ratio(PoolId(0)) - 0.5).abs() < 1e-9);
}

#[test]
fn session_header_steers_to_the_last_endpoint() {
    let epp = json!({
        "plugins": [{"type": "session-affinity-scorer"}, {"type": "max-score-picker"}]
    });
    let mut s = shared(pool(
        &[A, B, C],
        json!({"eppConfig": epp, "sessionHeader": "X-Session-Id"}),
    ));
    let mut host =
        host_for(&chat("one"), Some(fresh_all(&[A, B, C]))).request_header("x-session-id", "s1");
    let (_, mut r) = pick_one(&mut s, &mut host);
    let first = r.endpoint().map(str::to_owned);
    r.on_end(&mut s);
    for i in 0..10 {
        let mut host = host_for(
            &chat(&format!("unrelated {i}")),
            Some(fresh_all(&[A, B, C])),
        )
        .request_header("x-session-id", "s1");
        let (_, mut r) = pick_one(&mut s, &mut host);
        assert_eq!(r.endpoint().map(str::to_owned), first);
        r.on_end(&mut s);
    }
    assert_eq!(s.sessions(PoolId(0)), 1);
}

#[test]
fn the_snapshot_is_copied_and_decoded_only_when_its_version_changes() {
    let mut s = shared(pool(&[A], json!({})));
    let bytes = fresh_all(&[A]);
    let mut host = host_for(&chat("x"), Some(bytes.clone()));
    for _ in 0..5 {
        let mut req = PickerRequest::new();
        drive(&mut s, &mut host, &mut req);
        req.on_end(&mut s);
        host.request_headers
            .retain(|(k, _)| k != DESTINATION_ENDPOINT);
    }
    assert_eq!(host.snapshot_reads.get(), 1);
    host.snapshot = Some((crate::host::SnapshotVersion(2), bytes));
    let mut req = PickerRequest::new();
    drive(&mut s, &mut host, &mut req);
    assert_eq!(host.snapshot_reads.get(), 2);
    req.on_end(&mut s);
}

#[test]
fn garbage_snapshot_bytes_count_an_error_and_fail_closed() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("x"), Some(b"not a snapshot".to_vec()));
    assert_eq!(pick_one(&mut s, &mut host).0, FilterStatus::Replied);
    assert_eq!(host.counter("infergate.picker.snapshot_errors"), 1);
}

#[test]
fn requests_for_other_models_or_paths_pass_through_untouched() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = FakeHost::new()
        .request_header(BASE_MODEL, "qwen")
        .post("/v1/chat/completions", &chat("x"));
    let mut req = PickerRequest::new();
    assert_eq!(
        req.on_request_headers(&mut s, &mut host, false),
        FilterStatus::Continue
    );
    assert_eq!(
        req.on_request_body(&mut s, &mut host, 10, true),
        FilterStatus::Continue
    );
    let mut host = FakeHost::new()
        .request_header(BASE_MODEL, "llama")
        .request_header(":path", "/v1/models");
    let mut req = PickerRequest::new();
    assert_eq!(
        req.on_request_headers(&mut s, &mut host, true),
        FilterStatus::Continue
    );
    assert!(host.replies.is_empty());
}

#[test]
fn a_bad_body_is_400_even_without_the_router() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = host_for(b"{oops", Some(fresh_all(&[A])));
    assert_eq!(pick_one(&mut s, &mut host).0, FilterStatus::Replied);
    assert_eq!(host.last_reply().map(|r| r.status), Some(400));
}

#[test]
fn the_picker_keeps_buffering_until_end_of_stream() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("x"), Some(fresh_all(&[A])));
    let mut req = PickerRequest::new();
    assert_eq!(
        req.on_request_headers(&mut s, &mut host, false),
        FilterStatus::Pause
    );
    assert_eq!(
        req.on_request_body(&mut s, &mut host, 3, false),
        FilterStatus::Pause
    );
    assert!(!req.holds_lease());
    let len = host.body.len();
    assert_eq!(
        req.on_request_body(&mut s, &mut host, len, true),
        FilterStatus::Continue
    );
    assert!(req.holds_lease());
    req.on_end(&mut s);
}

#[test]
fn a_host_without_metadata_still_routes() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("x"), Some(fresh_all(&[A]))).without_metadata();
    assert_eq!(pick_one(&mut s, &mut host).0, FilterStatus::Continue);
    assert_eq!(host.header(DESTINATION_ENDPOINT), Some(A));
}

#[test]
fn a_request_reset_while_buffering_never_takes_a_lease() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("x"), Some(fresh_all(&[A])));
    let mut req = PickerRequest::new();
    assert_eq!(
        req.on_request_headers(&mut s, &mut host, false),
        FilterStatus::Pause
    );
    req.on_end(&mut s);
    let len = host.body.len();
    assert_eq!(
        req.on_request_body(&mut s, &mut host, len, true),
        FilterStatus::Continue
    );
    assert!(!req.holds_lease());
    assert_eq!(requests_in_flight(&s, A), 0);
    assert_eq!(host.header(DESTINATION_ENDPOINT), None);
}

#[test]
fn shared_state_can_live_behind_a_mutex_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<PickerShared>();
    assert_send_sync::<crate::router::Router>();
    assert_send_sync::<crate::scraper::Scraper>();
    assert_send_sync::<PickerRequest>();

    let s = std::sync::Arc::new(std::sync::Mutex::new(shared(pool(&[A, B], json!({})))));
    let snap = fresh_all(&[A, B]);
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let s = std::sync::Arc::clone(&s);
            let snap = snap.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    let mut host = host_for(&chat(&format!("w{w} r{i}")), Some(snap.clone()));
                    let mut req = PickerRequest::new();
                    if let Ok(mut guard) = s.lock() {
                        drive(&mut guard, &mut host, &mut req);
                    }
                    if let Ok(mut guard) = s.lock() {
                        req.on_end(&mut guard);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        assert!(w.join().is_ok());
    }
    let guard = s.lock();
    assert!(guard.is_ok_and(|g| requests_in_flight(&g, A) == 0 && requests_in_flight(&g, B) == 0));
}
