//! Which endpoints a request may reach and where it ended up: the pool of the cluster
//! Envoy's route chose, data-parallel ports, the fallback list, the subset hint, and the
//! served endpoint's correction of the in-flight load and the prefix index.

use super::*;
use crate::headers::{
    DESTINATION_SERVED, DESTINATION_SUBSET, MAX_RETRIES, SUBSET_METADATA_NAMESPACE,
};
use crate::reply::REJECTED_NO_ENDPOINTS;

/// Two pools of one base model (a canary split across pools): `stable` on A, B and
/// `canary` (cluster `canary-cluster`) on C.
fn canary_pools() -> PickerShared {
    shared(json!({"pools": [
        {"pool": "stable", "baseModel": "llama", "endpoints": [A, B]},
        {"pool": "canary", "baseModel": "llama", "cluster": "canary-cluster", "endpoints": [C]}
    ]}))
}

fn in_flight(s: &PickerShared, pool: usize, address: &str) -> u32 {
    s.inflight(PoolId(pool), address)
        .map_or(u32::MAX, |l| l.requests)
}

fn list_of(host: &FakeHost) -> Vec<String> {
    host.header(DESTINATION_ENDPOINT)
        .map(|l| l.split(',').map(str::to_owned).collect())
        .unwrap_or_default()
}

#[test]
fn the_cluster_envoy_routed_to_chooses_the_pool_and_each_pool_keeps_its_own_state() {
    let mut s = canary_pools();
    let all = fresh_all(&[A, B, C]);
    // Routed to the canary's cluster: picked there, counted there only.
    let mut host = host_for(&chat("hello"), Some(all.clone())).routed_to("canary-cluster");
    let (status, canary) = pick_one(&mut s, &mut host);
    assert_eq!(status, FilterStatus::Continue);
    assert_eq!(canary.endpoint(), Some(C));
    assert_eq!(host.cluster_reads, 1);
    assert_eq!(in_flight(&s, 1, C), 1);
    assert_eq!(host.counter("infergate.picker.decisions.pool.canary"), 1);
    assert_eq!(host.counter("infergate.picker.decisions.pool.stable"), 0);
    assert_eq!(host.counter_sum("infergate.picker.pool_by_base_model"), 0);
    // Routed to the stable pool's cluster (its name by default).
    let mut host = host_for(&chat("hello"), Some(all.clone())).routed_to("stable");
    let (_, stable) = pick_one(&mut s, &mut host);
    assert!(matches!(stable.endpoint(), Some(A) | Some(B)));
    assert_eq!(host.counter("infergate.picker.decisions.pool.stable"), 1);
    // No cluster known, or one no pool picks for: the first pool of the base model.
    for cluster in [None, Some("some-other-cluster")] {
        let mut host = host_for(&chat("hello"), Some(all.clone()));
        host.routed_cluster = cluster.map(str::to_owned);
        let (_, req) = pick_one(&mut s, &mut host);
        assert!(
            matches!(req.endpoint(), Some(A) | Some(B)),
            "{cluster:?}: {:?}",
            req.endpoint()
        );
        assert_eq!(
            host.counter("infergate.picker.pool_by_base_model.pool.stable"),
            1,
            "{cluster:?}"
        );
    }
    assert_eq!(in_flight(&s, 1, C), 1, "the canary's load is its own");
}

#[test]
fn a_request_without_a_base_model_is_not_asked_for_its_cluster() {
    let mut s = canary_pools();
    let mut host = FakeHost::new()
        .post("/v1/chat/completions", &chat("hi"))
        .routed_to("canary-cluster");
    let (status, req) = pick_one(&mut s, &mut host);
    assert_eq!(status, FilterStatus::Continue);
    assert_eq!(req.endpoint(), None);
    assert_eq!(host.cluster_reads, 0);
}

#[test]
fn two_pools_of_one_model_are_allowed_but_not_two_of_one_cluster() {
    let ok = PickerShared::from_json(json!({"pools": [
        {"pool": "a", "baseModel": "m", "endpoints": [A]},
        {"pool": "b", "baseModel": "m", "endpoints": [B]}
    ]}));
    assert!(ok.is_ok());
    let clash = PickerShared::from_json(json!({"pools": [
        {"pool": "a", "baseModel": "m", "endpoints": [A]},
        {"pool": "b", "baseModel": "n", "cluster": "a", "endpoints": [B]}
    ]}));
    assert_eq!(
        clash.err(),
        Some(PickerConfigError::DuplicateCluster("a".into()))
    );
}

#[test]
fn target_ports_expand_bare_ips_into_one_endpoint_per_port() {
    let config = PickerConfig::from_json(json!({
        "pool": "p", "baseModel": "m", "targetPorts": [8000, 8001],
        "endpoints": ["10.0.0.1", "10.0.0.2:9000", "[fd00::1]", "fd00::2"]
    }));
    let endpoints = config.map(|c| c.pools[0].endpoints.clone());
    assert_eq!(
        endpoints,
        Ok(vec![
            "10.0.0.1:8000".to_owned(),
            "10.0.0.1:8001".to_owned(),
            "10.0.0.2:9000".to_owned(),
            "[fd00::1]:8000".to_owned(),
            "[fd00::1]:8001".to_owned(),
            "[fd00::2]:8000".to_owned(),
            "[fd00::2]:8001".to_owned(),
        ])
    );
    for (endpoints, ports) in [
        (json!(["10.0.0.1"]), json!([])),
        (json!(["example.com"]), json!([8000])),
    ] {
        let bad = PickerConfig::from_json(json!({
            "pool": "p", "baseModel": "m", "targetPorts": ports, "endpoints": endpoints
        }));
        assert!(
            matches!(bad, Err(PickerConfigError::BadEndpoint { .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn every_rank_of_a_data_parallel_pod_is_picked_on_its_own() {
    let mut s = shared(json!({
        "pool": "p", "baseModel": "llama", "targetPorts": [8000, 8001],
        "endpoints": ["10.0.0.1"], "fallbacks": 0,
        "eppConfig": {"plugins": [{"type": "random-picker"}],
            "schedulingProfiles": [{"name": "d", "plugins": [{"pluginRef": "random-picker"}]}]}
    }));
    let ranks = ["10.0.0.1:8000", "10.0.0.1:8001"];
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..32 {
        let mut host = host_for(&chat("hi"), Some(fresh_all(&ranks))).seed(seed);
        let (_, req) = pick_one(&mut s, &mut host);
        seen.insert(req.endpoint().map(str::to_owned));
    }
    let expected: std::collections::BTreeSet<_> =
        ranks.iter().map(|r| Some((*r).to_owned())).collect();
    assert_eq!(seen, expected);
}

#[test]
fn the_destination_lists_the_pick_then_up_to_fallbacks_other_pool_endpoints() {
    for (fallbacks, expected_len) in [(0, 1), (1, 2), (2, 3), (5, 3)] {
        let mut s = shared(pool(&[A, B, C], json!({ "fallbacks": fallbacks })));
        // A client asking for many retries gets one per fallback, never a retry past the list.
        let mut host = host_for(&chat("hello"), Some(fresh_all(&[A, B, C])))
            .request_header(MAX_RETRIES, "100");
        let (status, req) = pick_one(&mut s, &mut host);
        assert_eq!(status, FilterStatus::Continue);
        let list = list_of(&host);
        assert_eq!(list.len(), expected_len, "fallbacks {fallbacks}: {list:?}");
        let retries = (expected_len - 1).to_string();
        assert_eq!(host.header(MAX_RETRIES), Some(retries.as_str()));
        assert_eq!(list.first().map(String::as_str), req.endpoint());
        let distinct: std::collections::BTreeSet<&String> = list.iter().collect();
        assert_eq!(distinct.len(), list.len(), "{list:?}");
        assert!(list.iter().all(|e| [A, B, C].contains(&e.as_str())));
        // The metadata carries the same list; only the pick holds a lease.
        let md = host.metadata.clone().unwrap_or_default();
        assert_eq!(md.first().map(|m| m.2.clone()), Some(list.join(",")));
        let held: u32 = [A, B, C].iter().map(|e| requests_in_flight(&s, e)).sum();
        assert_eq!(held, 1);
    }
}

#[test]
fn a_fallback_is_never_a_dead_endpoint() {
    let mut s = shared(pool(&[A, B, C], json!({ "fallbacks": 2 })));
    // C is not in the snapshot: unknown metrics, not a candidate for a FailClose pool.
    let mut host = host_for(&chat("hello"), Some(fresh_all(&[A, B])));
    let (_, _req) = pick_one(&mut s, &mut host);
    let list = list_of(&host);
    assert_eq!(list.len(), 2, "{list:?}");
    assert!(!list.iter().any(|e| e == C));
}

#[test]
fn the_subset_hint_keeps_every_pick_inside_the_subset() {
    let ab = format!("{A},{B}");
    let cases: [(&str, FakeHost); 3] = [
        (
            "metadata string",
            FakeHost::new().with_metadata(SUBSET_METADATA_NAMESPACE, DESTINATION_SUBSET, &[&ab]),
        ),
        (
            "metadata list",
            FakeHost::new().with_metadata(SUBSET_METADATA_NAMESPACE, DESTINATION_SUBSET, &[A, B]),
        ),
        (
            "trusted header",
            FakeHost::new().request_header(DESTINATION_SUBSET, &format!(" {A} , {B}")),
        ),
    ];
    for (what, base) in cases {
        let mut s = shared(pool(&[A, B, C], json!({ "fallbacks": 2 })));
        for seed in 0..16 {
            let mut host = base
                .clone()
                .request_header(BASE_MODEL, "llama")
                .post("/v1/chat/completions", &chat(&format!("q{seed}")))
                .now(NOW)
                .seed(seed)
                .snapshot(1, fresh_all(&[A, B, C]));
            let (status, req) = pick_one(&mut s, &mut host);
            assert_eq!(status, FilterStatus::Continue, "{what}");
            assert!(matches!(req.endpoint(), Some(A) | Some(B)), "{what}");
            let list = list_of(&host);
            assert!(!list.iter().any(|e| e == C), "{what}: {list:?}");
            drop(req);
        }
    }
}

#[test]
fn the_metadata_hint_wins_over_the_header_and_entries_outside_the_pool_are_ignored() {
    let mut s = shared(pool(&[A, B, C], json!({})));
    let mut host = host_for(&chat("hello"), Some(fresh_all(&[A, B, C])))
        .with_metadata(
            SUBSET_METADATA_NAMESPACE,
            DESTINATION_SUBSET,
            &[&format!("192.168.7.7:22,{C}")],
        )
        .request_header(DESTINATION_SUBSET, A);
    let (status, req) = pick_one(&mut s, &mut host);
    assert_eq!(status, FilterStatus::Continue);
    assert_eq!(req.endpoint(), Some(C));
    assert_eq!(list_of(&host), vec![C.to_owned()]);
}

#[test]
fn a_subset_with_no_endpoint_of_the_pool_is_answered_503_no_endpoints() {
    let mut s = shared(pool(&[A, B], json!({})));
    let mut host = host_for(&chat("hello"), Some(fresh_all(&[A, B])))
        .request_header(DESTINATION_SUBSET, "192.168.7.7:22");
    let (status, req) = pick_one(&mut s, &mut host);
    assert_eq!(status, FilterStatus::Replied);
    assert!(!req.holds_lease());
    let reply = host.last_reply().cloned();
    assert_eq!(reply.as_ref().map(|r| r.status), Some(503));
    assert_eq!(
        reply.as_ref().and_then(|r| r
            .headers
            .iter()
            .find(|(k, _)| k == DROPPED_REASON)
            .map(|(_, v)| v.clone())),
        Some(REJECTED_NO_ENDPOINTS.to_owned())
    );
    assert_eq!(
        host.counter("infergate.picker.rejects.pool.p.reason.no_endpoints"),
        1
    );
}

/// A request picked on its pool, then answered by `served`.
fn served_by(s: &mut PickerShared, host: &mut FakeHost, served: Option<&str>) -> (PickRun, String) {
    let (status, mut req) = pick_one(s, host);
    assert_eq!(status, FilterStatus::Continue);
    let picked = req.endpoint().unwrap_or_default().to_owned();
    host.served_upstream = served.map(str::to_owned);
    assert_eq!(req.on_response_headers(&mut *s, host), None);
    (req, picked)
}

#[test]
fn the_served_header_names_the_endpoint_that_answered() {
    let mut s = shared(pool(&[A, B], json!({})));
    let mut host = host_for(&chat("hello"), Some(fresh_all(&[A, B])));
    let (_, picked) = served_by(&mut s, &mut host, None);
    assert_eq!(
        host.response(DESTINATION_SERVED),
        None,
        "no upstream: no header"
    );
    let mut host = host_for(&chat("hello"), Some(fresh_all(&[A, B])));
    let (req, _) = {
        let (status, mut req) = pick_one(&mut s, &mut host);
        assert_eq!(status, FilterStatus::Continue);
        let picked = req.endpoint().unwrap_or_default().to_owned();
        host.served_upstream = Some(picked.clone());
        assert_eq!(req.on_response_headers(&mut s, &mut host), None);
        (req, picked)
    };
    assert_eq!(host.response(DESTINATION_SERVED), req.endpoint());
    assert_eq!(
        host.counter("infergate.picker.served_by_fallback.pool.p"),
        0
    );
    assert!(!picked.is_empty());
}

#[test]
fn a_request_served_by_its_fallback_moves_its_load_and_its_prefix_there() {
    let mut s = shared(pool(&[A, B], json!({"sessionHeader": "x-session-id"})));
    let prompt = chat(&"the quick brown fox jumps over the lazy dog. ".repeat(100));
    let mut host = host_for(&prompt, Some(fresh_all(&[A, B]))).request_header("x-session-id", "s1");
    let (status, mut req) = pick_one(&mut s, &mut host);
    assert_eq!(status, FilterStatus::Continue);
    let picked = req.endpoint().unwrap_or_default().to_owned();
    let other = if picked == A { B } else { A };
    assert_eq!(list_of(&host), vec![picked.clone(), other.to_owned()]);
    let gauge = |h: &FakeHost, e: &str| {
        h.gauges
            .get(&format!(
                "infergate.picker.inflight_requests.pool.p.endpoint.{}",
                e.replace(['.', ':'], "_")
            ))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!((gauge(&host, &picked), gauge(&host, other)), (1, 0));

    let hashes = prompt_hashes(&s, &prompt);
    assert_eq!(s.prefix_match(PoolId(0), other, &hashes), 0);
    host.served_upstream = Some(other.to_owned());
    assert_eq!(req.on_response_headers(&mut s, &mut host), None);
    assert_eq!(host.response(DESTINATION_SERVED), Some(other));
    assert_eq!(req.endpoint(), Some(other));
    assert_eq!(
        host.counter("infergate.picker.served_by_fallback.pool.p"),
        1
    );
    assert_eq!(requests_in_flight(&s, &picked), 0);
    assert_eq!(requests_in_flight(&s, other), 1);
    assert_eq!((gauge(&host, &picked), gauge(&host, other)), (0, 1));
    assert_eq!(
        host.gauges.get("infergate.picker.inflight_requests.pool.p"),
        Some(&1)
    );
    // A second response-headers call (a retry's) changes nothing more.
    assert_eq!(req.on_response_headers(&mut s, &mut host), None);
    assert_eq!(
        host.counter("infergate.picker.served_by_fallback.pool.p"),
        1
    );

    req.on_end_counted(&mut s, &mut host);
    assert_eq!(requests_in_flight(&s, other), 0);
    assert_eq!((gauge(&host, &picked), gauge(&host, other)), (0, 0));
    assert_eq!(host.gauge_underflows, 0);

    // The served endpoint now holds the prompt's blocks (the pick's entries are left to
    // age out of its LRU).
    assert!(hashes.len() > 1);
    assert_eq!(s.prefix_match(PoolId(0), other, &hashes), hashes.len());
}

/// The chained block hashes of `body` in pool 0 of `s`.
fn prompt_hashes(s: &PickerShared, body: &[u8]) -> Vec<scheduler_core::types::BlockHash> {
    let plans = s.plans();
    let Some(plan) = plans.get(PoolId(0)) else {
        return Vec::new();
    };
    let parsed = scheduler_core::request::parse_with_limit(
        scheduler_core::request::Api::ChatCompletions,
        body,
        plan.max_prompt_bytes(),
    );
    parsed.map_or(Vec::new(), |p| {
        plan.block_hashes(&p.model, p.cache_salt.as_deref(), &p.prompt)
    })
}

#[test]
fn a_served_endpoint_outside_the_pool_corrects_nothing() {
    let mut s = shared(pool(&[A, B], json!({})));
    let mut host = host_for(&chat("hello"), Some(fresh_all(&[A, B])));
    let (req, picked) = served_by(&mut s, &mut host, Some("192.168.1.1:80"));
    assert_eq!(host.response(DESTINATION_SERVED), Some("192.168.1.1:80"));
    assert_eq!(requests_in_flight(&s, &picked), 1);
    assert_eq!(
        host.counter("infergate.picker.served_by_fallback.pool.p"),
        0
    );
    drop(req);
}
