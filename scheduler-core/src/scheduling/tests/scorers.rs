//! Scorer semantics, one test per scorer, with missing metrics and NaN.

use alloc::vec::Vec;

use super::super::score::clamp_score;
use super::super::{Candidate, RequestView};
use super::{cand, hashes, lora, m, only, req, run, FakePrefix};
use crate::types::{InFlight, Millis, Tokens};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// Raw scores of the only scorer of a one-scorer profile, per candidate.
fn raw(ty: &str, r: &RequestView<'_>, c: &[Candidate<'_>], prefix: &FakePrefix) -> Vec<f64> {
    let s = only(&[ty]);
    let d = s.schedule(r, c, prefix, 0, Millis(0));
    (0..c.len())
        .map(|i| d.profiles()[0].raw_score(0, i).unwrap_or(-1.0))
        .collect()
}

#[test]
fn clamp_handles_nan_and_range() {
    assert_eq!(clamp_score(f64::NAN), 0.0);
    assert_eq!(clamp_score(-3.0), 0.0);
    assert_eq!(clamp_score(7.0), 1.0);
    assert_eq!(clamp_score(f64::INFINITY), 1.0);
    assert_eq!(clamp_score(0.25), 0.25);
}

#[test]
fn prefix_cache_scorer_is_matched_over_full_blocks() {
    let c = [cand("a", None), cand("b", None), cand("c", None)];
    let h = hashes(8);
    let prefix = FakePrefix::with(&[("a", 8), ("b", 2)]);
    assert_eq!(
        raw("prefix-cache-scorer", &req(&h), &c, &prefix),
        [1.0, 0.25, 0.0]
    );
    // No full block: nothing to match, 0 everywhere.
    assert_eq!(
        raw("prefix-cache-scorer", &req(&[]), &c, &prefix),
        [0.0, 0.0, 0.0]
    );
}

#[test]
fn prefix_matching_stops_at_max_prefix_tokens() {
    let s = super::sched(
        r#"{"plugins": [{"type": "approx-prefix-cache-producer", "parameters": {"blockSizeTokens": 64, "maxPrefixTokensToMatch": 256}},
        {"type": "prefix-cache-scorer"}]}"#,
    );
    let c = [cand("a", None), cand("b", None)];
    let h = hashes(10);
    let prefix = FakePrefix::with(&[("a", 10), ("b", 2)]);
    let d = s.schedule(&req(&h), &c, &prefix, 0, Millis(0));
    assert_eq!(d.full_blocks(), 4);
    assert_eq!(d.profiles()[0].raw_score(0, 0), Some(1.0));
    assert_eq!(d.profiles()[0].raw_score(0, 1), Some(0.5));
}

#[test]
fn queue_scorer_is_linear_unknown_is_zero_equal_is_one() {
    let (a, b, c2) = (m(0, 0, 0.0), m(4, 0, 0.0), m(2, 0, 0.0));
    let c = [
        cand("a", Some(&a)),
        cand("b", Some(&b)),
        cand("c", Some(&c2)),
        cand("x", None),
    ];
    let h = hashes(1);
    assert_eq!(
        raw("queue-scorer", &req(&h), &c, &FakePrefix::default()),
        [1.0, 0.0, 0.5, 0.0]
    );
    let same = [cand("a", Some(&b)), cand("b", Some(&b))];
    assert_eq!(
        raw("queue-scorer", &req(&h), &same, &FakePrefix::default()),
        [1.0, 1.0]
    );
}

#[test]
fn kv_cache_scorer_is_one_minus_utilisation() {
    let (a, b, nan, over) = (m(0, 0, 0.25), m(0, 0, 1.0), m(0, 0, f64::NAN), m(0, 0, 1.5));
    let c = [
        cand("a", Some(&a)),
        cand("b", Some(&b)),
        cand("nan", Some(&nan)),
        cand("over", Some(&over)),
        cand("x", None),
    ];
    let h = hashes(1);
    assert_eq!(
        raw(
            "kv-cache-utilization-scorer",
            &req(&h),
            &c,
            &FakePrefix::default()
        ),
        [0.75, 0.0, 0.0, 0.0, 0.0]
    );
}

#[test]
fn lora_affinity_scorer_cases() {
    let running = lora(2, &["ad"], &[]);
    let waiting = lora(2, &["x", "y"], &["ad"]);
    let free = lora(2, &["x"], &[]);
    let full = lora(2, &["x", "y"], &[]);
    let no_lora = m(0, 0, 0.0);
    let c = [
        cand("running", Some(&running)),
        cand("waiting", Some(&waiting)),
        cand("free", Some(&free)),
        cand("full", Some(&full)),
        cand("no-lora", Some(&no_lora)),
        cand("unknown", None),
    ];
    let h = hashes(1);
    let mut r = req(&h);
    r.target_model = "ad";
    assert_eq!(
        raw("lora-affinity-scorer", &r, &c, &FakePrefix::default()),
        [1.0, 0.6, 0.8, 0.0, 0.0, 0.0]
    );
    // The base model is served everywhere.
    r.target_model = "base";
    assert_eq!(
        raw("lora-affinity-scorer", &r, &c, &FakePrefix::default()),
        [1.0; 6]
    );
}

#[test]
fn running_requests_scorer_is_linear() {
    let (a, b) = (m(0, 1, 0.0), m(0, 3, 0.0));
    let c = [cand("a", Some(&a)), cand("b", Some(&b)), cand("x", None)];
    let h = hashes(1);
    assert_eq!(
        raw(
            "running-requests-scorer",
            &req(&h),
            &c,
            &FakePrefix::default()
        ),
        [1.0, 0.0, 0.0]
    );
}

fn loaded(address: &str, requests: u32, tokens: u64) -> Candidate<'_> {
    Candidate {
        address,
        metrics: None,
        inflight: InFlight {
            requests,
            tokens: Tokens(tokens),
            prefilling: 0,
        },
        role: crate::scheduling::Role::Both,
        latency: None,
    }
}

#[test]
fn inflight_and_token_load_scorers_use_the_proxys_own_counts() {
    let c = [loaded("a", 0, 1000), loaded("b", 2, 0), loaded("c", 4, 500)];
    let h = hashes(1);
    assert_eq!(
        raw("inflight-load-scorer", &req(&h), &c, &FakePrefix::default()),
        [1.0, 0.5, 0.0]
    );
    assert_eq!(
        raw("token-load-scorer", &req(&h), &c, &FakePrefix::default()),
        [0.0, 1.0, 0.5]
    );
}

#[test]
fn session_affinity_scorer_prefers_the_last_endpoint() {
    let c = [cand("a", None), cand("b", None)];
    let h = hashes(1);
    let mut r = req(&h);
    assert_eq!(
        raw("session-affinity-scorer", &r, &c, &FakePrefix::default()),
        [0.0, 0.0]
    );
    r.last_endpoint_for_session = Some("b");
    assert_eq!(
        raw("session-affinity-scorer", &r, &c, &FakePrefix::default()),
        [0.0, 1.0]
    );
    let s = only(&["session-affinity-scorer"]);
    for seed in 0..20 {
        assert_eq!(run(&s, &r, &c, seed).picked_address(), Some("b"));
    }
}

#[test]
fn linear_scorers_rank_only_the_remaining_candidates() {
    let s = super::sched(
        r#"{"plugins": [{"type": "utilization-filter", "parameters": {"conditions": [{"metric": "kv-cache-utilization", "maxValue": 0.5}]}},
        {"type": "queue-scorer"}]}"#,
    );
    // The idlest endpoint is filtered out; the remaining two span 2..6.
    let (gone, a, b) = (m(0, 0, 0.9), m(2, 0, 0.1), m(6, 0, 0.1));
    let c = [
        cand("gone", Some(&gone)),
        cand("a", Some(&a)),
        cand("b", Some(&b)),
    ];
    let h = hashes(1);
    let d = run(&s, &req(&h), &c, 0);
    let p = &d.profiles()[0];
    assert_eq!(
        [p.raw_score(0, 0), p.raw_score(0, 1), p.raw_score(0, 2)],
        [None, Some(1.0), Some(0.0)]
    );
}

#[test]
fn latency_observation_scorer_is_the_best_cost_over_each_ones() {
    use crate::latency::ObservedLatency;
    let with = |address, ttft_ms: f64, tpot_ms: Option<f64>| Candidate {
        latency: Some(ObservedLatency { ttft_ms, tpot_ms }),
        ..cand(address, None)
    };
    let c = [
        with("fast", 9.0, Some(1.0)),
        with("slow", 19.0, Some(0.0)),
        cand("unmeasured", None),
    ];
    let h = hashes(2);
    let scores = raw(
        "latency-observation-scorer",
        &req(&h),
        &c,
        &FakePrefix::default(),
    );
    assert_eq!(scores, [1.0, 0.5, 1.0]);
    // `tpotTokens` 20: fast costs 9 + 20 = 29, slow 19.
    let s = super::sched(
        r#"{"plugins": [{"type": "latency-observation-scorer", "parameters": {"tpotTokens": 20}}]}"#,
    );
    let d = s.schedule(&req(&h), &c, &FakePrefix::default(), 0, Millis(0));
    let p = &d.profiles()[0];
    assert_eq!(p.raw_score(0, 0), Some(20.0 / 30.0));
    assert_eq!(p.raw_score(0, 1), Some(1.0));
    // Nothing measured: no opinion.
    let none = [cand("a", None), cand("b", None)];
    assert_eq!(
        raw(
            "latency-observation-scorer",
            &req(&h),
            &none,
            &FakePrefix::default()
        ),
        [1.0, 1.0]
    );
}
