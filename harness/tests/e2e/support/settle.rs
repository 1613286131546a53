//! What every fault scenario ends with: Envoy still serves a normal request, and nothing is
//! left in flight (Envoy's own active-request gauges on the gateway listener and the pool
//! clusters, and the picker's in-flight gauges `infergate.picker.inflight_requests.*`),
//! plus Envoy's resident memory for the scenarios that report it.

use infergate_harness::launch::client::{get, post_json};
use infergate_harness::launch::stats::Stats;
use infergate_harness::launch::Stack;
use serde_json::json;
use std::time::{Duration, Instant};

/// The picker's per-pool in-flight gauges (requests picked and not yet finished).
pub const PICKER_INFLIGHT: &str = "infergate.picker.inflight_requests";

/// The picker's in-flight requests over every pool (the pool-level gauges).
pub fn picker_in_flight(stats: &Stats) -> i64 {
    stats
        .containing(PICKER_INFLIGHT)
        .filter(|(k, _)| !k.contains(".endpoint."))
        .map(|(_, v)| v)
        .sum()
}

/// Requests in flight, by what holds them: `(what, count)` for every non-zero holder.
pub fn in_flight(stats: &Stats) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = stats
        .iter()
        .filter(|(k, _)| {
            *k == "http.gateway.downstream_rq_active"
                || (k.starts_with("cluster.pool-") && k.ends_with(".upstream_rq_active"))
                || k.contains(PICKER_INFLIGHT)
        })
        .filter(|(_, v)| *v != 0)
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    out.sort();
    out
}

/// Waits (at most 10 s) until nothing is in flight; fails naming what still is.
pub async fn nothing_in_flight(stack: &Stack, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = stack.envoy().stats().await.unwrap();
        let held = in_flight(&stats);
        if held.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{}: {what}: still in flight 10 s later: {held:?}\n--- envoy log:\n{}",
            stack.flavor(),
            stack.envoy().log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A normal chat request for `model` is served (200 from a replica), then nothing is left
/// in flight: the two checks after every fault.
pub async fn still_serving(stack: &Stack, model: &str, what: &str) {
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let body =
        json!({"model": model, "messages": [{"role": "user", "content": format!("after {what}")}]});
    let resp = post_json(&url, &body, &[]).await.unwrap_or_else(|e| {
        panic!(
            "{}: after {what}: a normal request failed: {e:#}\n--- envoy log:\n{}",
            stack.flavor(),
            stack.envoy().log_tail(30)
        )
    });
    assert_eq!(
        resp.status,
        200,
        "{}: after {what}: a normal request was answered {}\n--- envoy log:\n{}",
        stack.flavor(),
        resp.text(),
        stack.envoy().log_tail(30)
    );
    assert!(
        resp.json().is_ok_and(|j| j["backend"].is_string()),
        "{}: after {what}: not a replica's answer: {}",
        stack.flavor(),
        resp.text()
    );
    // A served request has moved the picker's gauges, so they exist: the in-flight check
    // below is never vacuous.
    let stats = stack.envoy().stats().await.unwrap();
    assert!(
        stats.containing(PICKER_INFLIGHT).count() > 0,
        "{}: after {what}: no `{PICKER_INFLIGHT}` gauge",
        stack.flavor()
    );
    nothing_in_flight(stack, what).await;
}

/// Envoy's resident set size in KiB (`VmRSS` of `/proc/<pid>/status`).
pub fn envoy_rss_kib(stack: &Stack) -> u64 {
    let pid = stack.envoy().pid().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Envoy's allocated heap now (admin `/memory`, tcmalloc's count), KiB: unlike RSS it
/// falls when memory is freed.
pub async fn envoy_heap_kib(stack: &Stack) -> u64 {
    let url = format!("http://{}/memory", stack.envoy().admin());
    let resp = get(&url).await.unwrap();
    let json = resp.json().unwrap();
    let allocated = &json["allocated"];
    allocated
        .as_str()
        .and_then(|s| s.parse::<u64>().ok())
        .or_else(|| allocated.as_u64())
        .unwrap_or_else(|| panic!("admin /memory: {json}"))
        >> 10
}
