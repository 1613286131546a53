//! In-flight gauges (raised when a lease is taken, lowered when it is given back, or by
//! the pool's next request when it was dropped with no host at hand; back to 0 once every
//! request ended, summed right over several states as in Wasm) and the report
//! of pool endpoints the scraper's snapshot lacks.

use super::*;

const INFLIGHT_POOL: &str = "infergate.picker.inflight_requests.pool.p";

fn inflight_endpoint(address: &str) -> String {
    format!(
        "{INFLIGHT_POOL}.endpoint.{}",
        address.replace(['.', ':'], "_")
    )
}

fn gauge(host: &FakeHost, name: &str) -> Option<u64> {
    host.gauges.get(name).copied()
}

#[test]
fn in_flight_gauges_rise_with_each_pick_and_return_to_zero() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("x"), Some(fresh_all(&[A])));
    let (_, mut first) = pick_one(&mut s, &mut host);
    let (_, mut second) = pick_one(&mut s, &mut host);
    assert_eq!(gauge(&host, INFLIGHT_POOL), Some(2));
    assert_eq!(gauge(&host, &inflight_endpoint(A)), Some(2));
    first.on_end_counted(&mut s, &mut host);
    // A second end event (complete, then the context drop) changes nothing.
    first.on_end_counted(&mut s, &mut host);
    assert_eq!(gauge(&host, INFLIGHT_POOL), Some(1));
    second.on_end_counted(&mut s, &mut host);
    assert_eq!(gauge(&host, INFLIGHT_POOL), Some(0));
    assert_eq!(gauge(&host, &inflight_endpoint(A)), Some(0));
    assert_eq!(host.gauge_underflows, 0);
    assert_eq!(requests_in_flight(&s, A), 0);
}

#[test]
fn rejected_and_passed_through_requests_never_move_the_gauges() {
    let mut s = shared(pool(&[A], json!({})));
    // Stale metrics: a FailClose 503, no lease.
    let mut host = host_for(
        &chat("x"),
        Some(snapshot(NOW - 60_000, &[(A, metrics(0, 0.1))])),
    );
    let (status, mut req) = pick_one(&mut s, &mut host);
    assert_eq!(status, FilterStatus::Replied);
    req.on_end_counted(&mut s, &mut host);
    // A bad body: 400, no lease.
    let mut bad = host_for(b"{", Some(fresh_all(&[A])));
    let (_, mut req) = pick_one(&mut s, &mut bad);
    req.on_end_counted(&mut s, &mut bad);
    for h in [&host, &bad] {
        assert_eq!(gauge(h, INFLIGHT_POOL), None);
        assert_eq!(h.gauge_underflows, 0);
    }
}

#[test]
fn gauges_summed_over_several_states_read_the_total_in_flight() {
    // Two Wasm VMs: two states, one Envoy stat (the same host gauge map here).
    let mut vm1 = shared(pool(&[A, B], json!({})));
    let mut vm2 = shared(pool(&[A, B], json!({})));
    let mut host = host_for(&chat("x"), Some(fresh_all(&[A, B])));
    let (_, mut r1) = pick_one(&mut vm1, &mut host);
    let (_, mut r2) = pick_one(&mut vm2, &mut host);
    let (_, mut r3) = pick_one(&mut vm2, &mut host);
    assert_eq!(gauge(&host, INFLIGHT_POOL), Some(3));
    let per_endpoint: u64 = [A, B]
        .iter()
        .filter_map(|e| gauge(&host, &inflight_endpoint(e)))
        .sum();
    assert_eq!(per_endpoint, 3);
    r2.on_end_counted(&mut vm2, &mut host);
    r1.on_end_counted(&mut vm1, &mut host);
    r3.on_end_counted(&mut vm2, &mut host);
    assert_eq!(gauge(&host, INFLIGHT_POOL), Some(0));
    for e in [A, B] {
        assert_eq!(gauge(&host, &inflight_endpoint(e)).unwrap_or(0), 0);
    }
    assert_eq!(host.gauge_underflows, 0);
}

#[test]
fn the_uncounted_end_gives_the_lease_back_and_the_next_request_lowers_the_gauge() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("x"), Some(fresh_all(&[A])));
    let (_, mut req) = pick_one(&mut s, &mut host);
    req.on_end(&mut s);
    assert_eq!(requests_in_flight(&s, A), 0);
    // No host at hand: the gauge stays until the pool's next request pays the debt.
    assert_eq!(gauge(&host, INFLIGHT_POOL), Some(1));
    let (_, mut next) = pick_one(&mut s, &mut host);
    next.on_end_counted(&mut s, &mut host);
    assert_eq!(gauge(&host, INFLIGHT_POOL), Some(0));
    assert_eq!(gauge(&host, &inflight_endpoint(A)), Some(0));
    assert_eq!(host.gauge_underflows, 0);
}

#[test]
fn pool_endpoints_missing_from_the_snapshot_are_reported_once_per_change() {
    let mut s = shared(pool(&[A, B], json!({})));
    let mut host = host_for(&chat("x"), Some(fresh_all(&[A])));
    assert_eq!(pick_one(&mut s, &mut host).0, FilterStatus::Continue);
    assert_eq!(
        gauge(&host, "infergate.picker.unscraped_endpoints.pool.p"),
        Some(1)
    );
    assert_eq!(host.error_logs.len(), 1, "{:?}", host.error_logs);
    let line = &host.error_logs[0];
    assert!(
        line.contains("pools[0].endpoints") && line.contains("scraper's `endpoints`"),
        "{line}"
    );
    assert!(line.contains(B) && !line.contains(A), "{line}");
    // The same membership in a newer snapshot: nothing new to say.
    host.snapshot = Some((SnapshotVersion(2), fresh_all(&[A])));
    pick_one(&mut s, &mut host);
    assert_eq!(host.error_logs.len(), 1);
    // Once the scraper covers the pool, the gauge goes back to 0 without a log.
    host.snapshot = Some((SnapshotVersion(3), fresh_all(&[A, B])));
    pick_one(&mut s, &mut host);
    assert_eq!(
        gauge(&host, "infergate.picker.unscraped_endpoints.pool.p"),
        Some(0)
    );
    assert_eq!(host.error_logs.len(), 1);
}

#[test]
fn a_fail_close_pool_the_scraper_does_not_cover_says_so_in_its_503() {
    let mut s = shared(pool(&[C], json!({})));
    let mut host = host_for(&chat("x"), Some(fresh_all(&[A, B])));
    assert_eq!(pick_one(&mut s, &mut host).0, FilterStatus::Replied);
    let reply = host.last_reply().cloned().unwrap_or_else(|| unreachable!());
    assert_eq!(reply.status, 503);
    let body = String::from_utf8_lossy(&reply.body).into_owned();
    assert!(body.contains("scraper's `endpoints`"), "{body}");
    assert_eq!(
        host.counter("infergate.picker.rejects.pool.p.reason.unscraped_endpoints"),
        1
    );
    // Before any snapshot exists the endpoint is not "unscraped", only without metrics.
    let mut s = shared(pool(&[C], json!({})));
    let mut host = host_for(&chat("x"), None);
    pick_one(&mut s, &mut host);
    assert_eq!(
        host.counter("infergate.picker.rejects.pool.p.reason.stale_metrics"),
        1
    );
}
