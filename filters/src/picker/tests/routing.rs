//! Pool confinement, rejections, failure modes and pass-through.

use super::*;
use crate::stats::StatKind;

#[test]
fn picks_a_pool_endpoint_and_sets_the_destination_list_in_header_and_metadata() {
    let mut s = shared(pool(&[A, B], json!({})));
    let mut host = host_for(&chat("hello"), Some(fresh_all(&[A, B])));
    let (status, req) = pick_one(&mut s, &mut host);
    assert_eq!(status, FilterStatus::Continue);
    // The pick, then the one fallback a pool has by default: the other endpoint.
    let list = host.header(DESTINATION_ENDPOINT).map(str::to_owned);
    let picked = req.endpoint().map(str::to_owned);
    let expected = match picked.as_deref() {
        Some(A) => format!("{A},{B}"),
        Some(B) => format!("{B},{A}"),
        other => unreachable!("picked {other:?} outside the pool"),
    };
    assert_eq!(list.as_deref(), Some(expected.as_str()));
    let md = host.metadata.clone().unwrap_or_default();
    assert_eq!(
        md,
        vec![(
            "envoy.lb".to_owned(),
            DESTINATION_ENDPOINT.to_owned(),
            expected.clone()
        )]
    );
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
    assert!(matches!(req.endpoint(), Some(A) | Some(B)));
    assert_eq!(
        host.header(DESTINATION_ENDPOINT)
            .map(|l| l.split(',').count()),
        Some(2)
    );
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
        clusters: Vec::new(),
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
fn garbage_snapshot_bytes_count_an_error_and_fail_closed() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("x"), Some(b"not a snapshot".to_vec()));
    assert_eq!(pick_one(&mut s, &mut host).0, FilterStatus::Replied);
    assert_eq!(host.counter("infergate.picker.snapshot_errors"), 1);
}

#[test]
fn an_inference_request_for_a_base_model_without_a_pool_is_503_naming_the_model() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = FakeHost::new()
        .request_header(BASE_MODEL, "qwen")
        .post("/v1/chat/completions", &chat("x"));
    let mut req = PickRun::new();
    assert_eq!(
        req.on_request_headers(&mut s, &mut host, false),
        FilterStatus::Replied
    );
    let reply = host.last_reply().cloned().unwrap_or_else(|| unreachable!());
    assert_eq!(reply.status, 503);
    assert!(reply
        .headers
        .iter()
        .any(|(k, v)| k == DROPPED_REASON && v == "rejected-no-endpoints"));
    let body: Value = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
    assert_eq!(body["error"]["code"], "rejected-no-endpoints");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("`qwen`")),
        "{body}"
    );
    assert_eq!(host.counter("infergate.picker.no_pool_rejects"), 1);
    assert!(host.header(DESTINATION_ENDPOINT).is_none());
    // Later callbacks of the answered request do nothing.
    assert_eq!(
        req.on_request_body(&mut s, &mut host, 10, true),
        FilterStatus::Replied
    );
    assert_eq!(host.replies.len(), 1);

    // A huge base model is quoted short.
    let mut host = FakeHost::new()
        .request_header(BASE_MODEL, &"m".repeat(1 << 20))
        .post("/v1/completions", b"{}");
    assert_eq!(
        PickRun::new().on_request_headers(&mut s, &mut host, false),
        FilterStatus::Replied
    );
    assert!(host.last_reply().is_some_and(|r| r.body.len() < 1024));
}

#[test]
fn requests_without_a_base_model_or_off_the_inference_paths_pass_through_untouched() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = FakeHost::new().post("/v1/chat/completions", &chat("x"));
    let mut req = PickRun::new();
    assert_eq!(
        req.on_request_headers(&mut s, &mut host, false),
        FilterStatus::Continue
    );
    assert_eq!(
        req.on_request_body(&mut s, &mut host, 10, true),
        FilterStatus::Continue
    );
    let mut host = FakeHost::new()
        .request_header(BASE_MODEL, "qwen")
        .request_header(":path", "/v1/models");
    let mut req = PickRun::new();
    assert_eq!(
        req.on_request_headers(&mut s, &mut host, true),
        FilterStatus::Continue
    );
    let mut host = FakeHost::new()
        .request_header(BASE_MODEL, "llama")
        .request_header(":path", "/v1/models");
    let mut req = PickRun::new();
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
    let mut req = PickRun::new();
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

/// Hosts define `stat_keys()` up front (the native flavour as label-less metrics, one atomic
/// add each); a key emitted but not listed would fall back to a slow path. Picks, rejects,
/// fail-open picks, the prefix counters and the gauges must all be listed, with their kind.
#[test]
fn every_emitted_stat_is_listed_in_stat_keys() {
    let cases = [
        (pool(&[A, B], json!({})), Some(fresh_all(&[A, B]))),
        (pool(&[], json!({})), Some(fresh_all(&[A]))),
        (
            pool(&[A, B], json!({})),
            Some(snapshot(NOW - 5_000, &[(A, metrics(0, 0.1))])),
        ),
        (pool(&[A, B], json!({"failureMode": "FailOpen"})), None),
    ];
    for (config, snap) in cases {
        let mut s = shared(config);
        let plans = s.plans();
        let listed = |kind: StatKind| -> Vec<String> {
            plans
                .stat_keys()
                .iter()
                .filter(|(k, _)| *k == kind)
                .map(|(_, key)| key.as_str().to_owned())
                .collect()
        };
        let (counters, gauges) = (listed(StatKind::Counter), listed(StatKind::Gauge));
        let mut host = host_for(&chat("hello"), snap);
        let (_, mut req) = pick_one(&mut s, &mut host);
        req.on_end_counted(&mut s, &mut host);
        let mut other = host_for(&chat("x"), None);
        other.request_headers.retain(|(k, _)| k != BASE_MODEL);
        other
            .request_headers
            .push((BASE_MODEL.to_owned(), "qwen".to_owned()));
        pick_one(&mut s, &mut other);
        assert!(!host.counters.is_empty());
        for name in host.counters.keys().chain(other.counters.keys()) {
            assert!(counters.contains(name), "{name} not in {counters:?}");
        }
        for name in host.gauges.keys() {
            assert!(gauges.contains(name), "{name} not in {gauges:?}");
        }
    }
}
