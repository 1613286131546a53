//! Scraper-loop tests against the fake host.

use scheduler_core::snapshot::decode;
use serde_json::json;

use super::*;
use crate::fake::FakeHost;
use crate::host::SnapshotVersion;

const A: &str = "10.0.0.1:8000";
const B: &str = "10.0.0.2:8000";

const PAGE: &[u8] = b"# HELP vllm:num_requests_waiting Waiting.\n\
# TYPE vllm:num_requests_waiting gauge\n\
vllm:num_requests_waiting{model_name=\"m\"} 3\n\
vllm:num_requests_running{model_name=\"m\"} 2\n\
vllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n";

fn scraper() -> Scraper {
    match Scraper::from_json(json!({"endpoints": [A, B], "timeoutMs": 100})) {
        Ok(s) => s,
        Err(e) => unreachable!("test config must parse: {e}"),
    }
}

fn ok(body: &[u8]) -> CalloutOutcome {
    CalloutOutcome::Response {
        status: 200,
        body: body.to_vec(),
    }
}

fn last_token_for(host: &FakeHost, endpoint: &str) -> Option<CalloutToken> {
    host.callouts
        .iter()
        .rev()
        .find(|(_, r)| {
            r.headers
                .iter()
                .any(|(k, v)| k == ":authority" && v == endpoint)
        })
        .map(|(t, _)| *t)
}

fn published(host: &FakeHost) -> Option<Snapshot> {
    host.snapshot.as_ref().and_then(|(_, b)| decode(b).ok())
}

#[test]
fn a_tick_sends_one_get_per_endpoint_through_the_cluster() {
    let mut s = scraper();
    let mut host = FakeHost::new().now(1_000);
    s.on_tick(&mut host);
    assert_eq!(host.callouts.len(), 2);
    let (_, first) = &host.callouts[0];
    assert_eq!(first.cluster, "infergate_scrape");
    assert_eq!(first.timeout_ms, 100);
    let header = |name: &str| {
        first
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(header(":method"), Some("GET"));
    assert_eq!(header(":path"), Some("/metrics"));
    assert_eq!(header(":authority"), Some(A));
    assert_eq!(header("x-gateway-destination-endpoint"), Some(A));
    // Nothing new is sent while both are outstanding.
    s.on_tick(&mut host);
    assert_eq!(host.callouts.len(), 2);
    assert_eq!(s.outstanding(), 2);
}

#[test]
fn answers_update_samples_and_publish_when_the_round_completes() {
    let mut s = scraper();
    let mut host = FakeHost::new().now(1_000);
    s.on_tick(&mut host);
    let published_before = host.counter("infergate.scraper.publishes");
    let tokens: Vec<CalloutToken> = host.callouts.iter().map(|(t, _)| *t).collect();
    host.now = Millis(1_010);
    s.on_callout_done(&mut host, tokens[0], ok(PAGE));
    // Round not complete: no publish yet.
    assert_eq!(
        host.counter("infergate.scraper.publishes"),
        published_before
    );
    s.on_callout_done(&mut host, tokens[1], CalloutOutcome::Failed);
    assert_eq!(
        host.counter("infergate.scraper.publishes"),
        published_before + 1
    );

    let snap = published(&host);
    let a = snap
        .as_ref()
        .and_then(|s| s.endpoints.iter().find(|e| e.address == A).cloned());
    let b = snap
        .as_ref()
        .and_then(|s| s.endpoints.iter().find(|e| e.address == B).cloned());
    let a_metrics = a.as_ref().and_then(|a| a.metrics.clone());
    assert_eq!(a_metrics.as_ref().and_then(|m| m.waiting), Some(3));
    assert_eq!(a_metrics.as_ref().and_then(|m| m.running), Some(2));
    assert_eq!(a_metrics.and_then(|m| m.kv_cache_usage), Some(0.25));
    assert_eq!(
        a.map(|a| (a.scraped_at, a.consecutive_failures)),
        Some((Millis(1_010), 0))
    );
    assert_eq!(
        b.map(|b| (b.metrics.is_none(), b.consecutive_failures)),
        Some((true, 1))
    );
    assert_eq!(
        host.counter("infergate.scraper.scrapes.endpoint.10_0_0_1_8000.result.ok"),
        1
    );
    assert_eq!(
        host.counter("infergate.scraper.scrapes.endpoint.10_0_0_2_8000.result.failed"),
        1
    );
}

#[test]
fn failures_accumulate_keep_old_metrics_and_reset_on_success() {
    let mut s = scraper();
    let mut host = FakeHost::new().now(1_000);
    s.on_tick(&mut host);
    let t = host.callouts[0].0;
    s.on_callout_done(&mut host, t, ok(PAGE));
    for (round, outcome) in [
        CalloutOutcome::Response {
            status: 500,
            body: PAGE.to_vec(),
        },
        ok(b"# a page without any known metric\nfoo 1\n"),
        CalloutOutcome::Failed,
    ]
    .into_iter()
    .enumerate()
    {
        host.now = Millis(1_100 + 100 * round as u64);
        s.on_tick(&mut host);
        let Some(t) = last_token_for(&host, A) else {
            unreachable!("a callout to A per round")
        };
        s.on_callout_done(&mut host, t, outcome);
    }
    let a = &s.samples()[0];
    assert_eq!(a.consecutive_failures, 3);
    assert_eq!(a.scraped_at, Millis(1_000));
    assert!(a.metrics.is_some());
    host.now = Millis(2_000);
    s.on_tick(&mut host);
    if let Some(t) = last_token_for(&host, A) {
        s.on_callout_done(&mut host, t, ok(PAGE));
    }
    assert_eq!(s.samples()[0].consecutive_failures, 0);
    assert_eq!(s.samples()[0].scraped_at, Millis(2_000));
    // Every counter and gauge the scraper emitted is listed up front, with its kind (the
    // native host defines them as plain Envoy metrics at config time).
    let listed = s.stat_keys();
    let has = |kind: StatKind, name: &str| {
        listed
            .iter()
            .any(|(k, key)| *k == kind && key.as_str() == name)
    };
    assert!(!host.counters.is_empty() && !host.gauges.is_empty());
    for name in host.counters.keys() {
        assert!(has(StatKind::Counter, name), "counter {name} not listed");
    }
    for name in host.gauges.keys() {
        assert!(has(StatKind::Gauge, name), "gauge {name} not listed");
    }
}

#[test]
fn a_refused_dispatch_counts_as_a_failure() {
    let mut s = scraper();
    let mut host = FakeHost::new().now(5);
    host.fail_dispatch = true;
    s.on_tick(&mut host);
    assert_eq!(s.outstanding(), 0);
    assert!(s.samples().iter().all(|e| e.consecutive_failures == 1));
}

#[test]
fn an_unanswered_callout_expires_after_twice_the_timeout() {
    let mut s = scraper();
    let mut host = FakeHost::new().now(1_000);
    s.on_tick(&mut host);
    let stale_token = host.callouts[0].0;
    host.now = Millis(1_150);
    s.on_tick(&mut host);
    assert_eq!(host.callouts.len(), 2, "still within 2 × timeout");
    host.now = Millis(1_201);
    s.on_tick(&mut host);
    assert_eq!(host.callouts.len(), 4, "expired callouts are re-sent");
    assert!(s.samples().iter().all(|e| e.consecutive_failures == 1));
    // A late answer to the expired callout is ignored.
    s.on_callout_done(&mut host, stale_token, ok(PAGE));
    assert!(s.samples()[0].metrics.is_none());
}

#[test]
fn a_tick_publishes_changes_even_if_a_round_is_incomplete() {
    let mut s = scraper();
    let mut host = FakeHost::new().now(1_000);
    s.on_tick(&mut host);
    // The very first tick publishes the all-unknown snapshot.
    assert_eq!(
        host.snapshot.as_ref().map(|(v, _)| *v),
        Some(SnapshotVersion(1))
    );
    let t = host.callouts[0].0;
    s.on_callout_done(&mut host, t, ok(PAGE));
    assert_eq!(
        host.snapshot.as_ref().map(|(v, _)| *v),
        Some(SnapshotVersion(1))
    );
    host.now = Millis(1_050);
    s.on_tick(&mut host);
    assert_eq!(
        host.snapshot.as_ref().map(|(v, _)| *v),
        Some(SnapshotVersion(2))
    );
    let snap = published(&host);
    assert_eq!(snap.map(|s| s.taken_at), Some(Millis(1_050)));
}

#[test]
fn config_defaults_and_validation() {
    let s = Scraper::from_json(json!({"endpoints": []}));
    assert_eq!(s.map(|s| s.tick_period_ms()).ok(), Some(50));
    assert!(Scraper::from_json(json!({"endpoints": [], "intervalMs": 0})).is_err());
    assert!(Scraper::from_json(json!({"endpoint": []})).is_err());
}

#[test]
fn a_page_over_the_limit_fails_without_being_read_and_is_logged_once_per_streak() {
    let mut s = match Scraper::from_json(json!({"endpoints": [A], "maxMetricsPageBytes": 64})) {
        Ok(s) => s,
        Err(e) => unreachable!("{e}"),
    };
    assert_eq!(s.max_page_bytes(), 64);
    let mut host = FakeHost::new().now(1_000);
    for round in 0..2u64 {
        s.on_tick(&mut host);
        let token = last_token_for(&host, A).unwrap_or(CalloutToken(0));
        let mut read = false;
        let outcome = s.callout_outcome(200, 30 * 1024 * 1024, || {
            read = true;
            Vec::new()
        });
        assert!(!read, "an oversized body is never copied");
        assert_eq!(
            outcome,
            CalloutOutcome::TooLarge {
                status: 200,
                body_bytes: 30 * 1024 * 1024
            }
        );
        s.on_callout_done(&mut host, token, outcome);
        assert_eq!(s.samples()[0].consecutive_failures, round as u32 + 1);
        host.now = Millis(host.now.0 + 50);
    }
    let failed = "infergate.scraper.scrapes.endpoint.10_0_0_1_8000.result.failed";
    assert_eq!(host.counters.get(failed), Some(&2));
    assert_eq!(host.error_logs.len(), 1, "{:?}", host.error_logs);
    assert!(
        host.error_logs[0].contains("maxMetricsPageBytes") && host.error_logs[0].contains(A),
        "{:?}",
        host.error_logs
    );

    // A page within the limit is read and succeeds; one over it, even if an adapter copied
    // it anyway, still fails.
    s.on_tick(&mut host);
    let token = last_token_for(&host, A).unwrap_or(CalloutToken(0));
    let small = b"vllm:num_requests_waiting 1\n";
    let outcome = s.callout_outcome(200, small.len(), || small.to_vec());
    s.on_callout_done(&mut host, token, outcome);
    assert_eq!(s.samples()[0].consecutive_failures, 0);
    host.now = Millis(host.now.0 + 50);
    s.on_tick(&mut host);
    let token = last_token_for(&host, A).unwrap_or(CalloutToken(0));
    let mut big = PAGE.to_vec();
    big.resize(65, b'\n');
    s.on_callout_done(&mut host, token, ok(&big));
    assert_eq!(s.samples()[0].consecutive_failures, 1);
}

#[test]
fn the_default_page_limit_is_4_mib() {
    assert_eq!(scraper().max_page_bytes(), 4 * 1024 * 1024);
}

#[test]
fn config_errors_name_the_field() {
    let err = |v: serde_json::Value| Scraper::from_json(v).err().unwrap_or_default();
    let e = err(json!({"endpoints": [A, "model-0.svc:8000"]}));
    assert!(
        e.contains("endpoints[1]") && e.contains("not ip:port"),
        "{e}"
    );
    let e = err(json!({"endpoints": ["8000"]}));
    assert!(e.contains("endpoints[0]"), "{e}");
    assert!(err(json!({"endpoints": [A], "intervalMs": 0})).contains("intervalMs"));
    assert!(err(json!({"endpoints": [A], "timeoutMs": 0})).contains("timeoutMs"));
    let e = err(json!({"endpoints": [A], "maxMetricsPageBytes": 0}));
    assert!(e.contains("maxMetricsPageBytes"), "{e}");
    // A hostile endpoint string is quoted short.
    let e = err(json!({ "endpoints": ["x".repeat(100_000)] }));
    assert!(e.len() < 300, "{}", e.len());
}

#[test]
fn a_counted_tick_failure_is_a_stat() {
    let s = scraper();
    let mut host = FakeHost::new();
    s.count_tick_failure(&mut host);
    s.count_tick_failure(&mut host);
    assert_eq!(
        host.counters.get("infergate.scraper.tick_failures"),
        Some(&2)
    );
    assert!(s.stat_keys().iter().any(
        |(k, key)| *k == StatKind::Counter && key.as_str() == "infergate.scraper.tick_failures"
    ));
}

#[test]
fn a_scraper_that_took_over_publishes_nothing_until_its_first_round_completes() {
    let mut s = scraper();
    s.hold_first_publish();
    let mut host = FakeHost::new().now(1_000);
    // A fresh scraper publishes its (empty) state at its first tick; a held one does not,
    // so the previous owner's snapshot stays what the pickers read.
    s.on_tick(&mut host);
    assert_eq!(host.counter("infergate.scraper.publishes"), 0);
    assert!(host.snapshot.is_none());
    let tokens: Vec<CalloutToken> = host.callouts.iter().map(|(t, _)| *t).collect();
    s.on_callout_done(&mut host, tokens[0], ok(PAGE));
    assert_eq!(host.counter("infergate.scraper.publishes"), 0);
    s.on_callout_done(&mut host, tokens[1], ok(PAGE));
    assert_eq!(host.counter("infergate.scraper.publishes"), 1);
    let snap = published(&host);
    assert!(snap.is_some_and(|s| s.endpoints.iter().all(|e| e.metrics.is_some())));
}

#[test]
fn a_held_publication_is_released_after_at_most_a_second_of_ticks() {
    let mut s = scraper();
    s.hold_first_publish();
    let mut host = FakeHost::new().now(1_000);
    for _ in 0..MAX_HELD_TICKS {
        s.on_tick(&mut host);
    }
    // Nobody answers: the held state goes out anyway.
    s.on_tick(&mut host);
    assert_eq!(host.counter("infergate.scraper.publishes"), 1);
}

#[test]
fn a_peer_gateway_is_scraped_at_its_pool_page_and_its_means_read_as_one_endpoint() {
    let config = json!({"endpoints": [A, B],
                        "metricsPaths": {B: "/infergate/pools/p/metrics"}});
    let mut s = Scraper::from_json(config).unwrap_or_else(|e| unreachable!("{e}"));
    let mut host = FakeHost::new().now(1_000);
    s.on_tick(&mut host);
    let path_of = |endpoint: &str| {
        let (_, request) = host.callouts.iter().find(|(_, r)| {
            r.headers
                .iter()
                .any(|(k, v)| k == ":authority" && v == endpoint)
        })?;
        let (_, path) = request.headers.iter().find(|(k, _)| k == ":path")?;
        Some(path.clone())
    };
    assert_eq!(path_of(A).as_deref(), Some("/metrics"));
    assert_eq!(path_of(B).as_deref(), Some("/infergate/pools/p/metrics"));
    let page = b"llm_d_epp_average_queue_size 2.4\nllm_d_epp_average_kv_cache_utilization 0.5\n";
    for (endpoint, body) in [(A, PAGE), (B, &page[..])] {
        let token = last_token_for(&host, endpoint).unwrap_or_else(|| unreachable!());
        s.on_callout_done(&mut host, token, ok(body));
    }
    let snap = published(&host).unwrap_or_default();
    let peer = snap.endpoints.iter().find(|e| e.address == B);
    let metrics = peer.and_then(|e| e.metrics.clone()).unwrap_or_default();
    assert_eq!(metrics.waiting, Some(2));
    assert_eq!(metrics.kv_cache_usage, Some(0.5));
    let bad = json!({"endpoints": [A], "metricsPaths": {A: "metrics"}});
    assert!(Scraper::from_json(bad).is_err());
}
