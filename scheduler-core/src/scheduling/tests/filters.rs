//! Filter semantics: utilization conditions, fallbackOnEmpty, prefix affinity and its
//! TTFT-based break, missing metrics, everything filtered.

use alloc::vec::Vec;

use super::super::Candidate;
use super::super::FilterNote;
use super::{cand, hashes, m, req, run, sched, FakePrefix};
use crate::metrics::EndpointMetrics;
use crate::types::Millis;

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const UTIL: &str = r#"{"plugins": [
    {"type": "utilization-filter", "name": "u", "parameters": {"conditions": [
        {"metric": "kv-cache-utilization", "maxValue": 0.8},
        {"metric": "waiting-queue", "maxValue": 5},
        {"metric": "running-requests", "maxValue": 10}]}},
    {"type": "queue-scorer"}]}"#;

#[test]
fn utilization_drops_any_exceeded_condition_and_keeps_unknown() {
    let s = sched(UTIL);
    let ok = m(5, 10, 0.8); // every value exactly at its bound: kept
    let kv = m(0, 0, 0.81);
    let queue = m(6, 0, 0.1);
    let running = m(0, 11, 0.1);
    let nan = m(0, 0, f64::NAN);
    let c = [
        cand("ok", Some(&ok)),
        cand("kv", Some(&kv)),
        cand("queue", Some(&queue)),
        cand("running", Some(&running)),
        cand("unknown", None),
        cand("nan", Some(&nan)),
    ];
    let h = hashes(2);
    let d = run(&s, &req(&h), &c, 1);
    let p = &d.profiles()[0];
    let dropped: Vec<_> = (0..c.len()).map(|i| p.dropped_by(i)).collect();
    assert_eq!(dropped, [None, Some("u"), Some("u"), Some("u"), None, None]);
    assert_eq!(p.filter_note(0), Some(&FilterNote::Applied));
    assert!(matches!(d.picked_address(), Some("ok" | "unknown" | "nan")));
}

#[test]
fn every_candidate_filtered_means_no_pick() {
    let s = sched(UTIL);
    let hot = m(50, 0, 0.99);
    let c = [cand("a", Some(&hot)), cand("b", Some(&hot))];
    let h = hashes(1);
    let d = run(&s, &req(&h), &c, 7);
    assert_eq!(d.picked(), None);
    assert_eq!(d.fallbacks(), &[] as &[usize]);
    assert!(!d.profiles()[0].alive(0) && !d.profiles()[0].alive(1));
}

#[test]
fn fallback_on_empty_keeps_everyone_only_when_all_would_go() {
    let s = sched(
        r#"{"plugins": [{"type": "utilization-filter", "parameters": {"fallbackOnEmpty": true,
            "conditions": [{"metric": "kv-cache-utilization", "maxValue": 0.5}]}}]}"#,
    );
    let hot = m(0, 0, 0.9);
    let cool = m(0, 0, 0.1);
    let all_hot = [cand("a", Some(&hot)), cand("b", Some(&hot))];
    let h = hashes(1);
    let d = run(&s, &req(&h), &all_hot, 1);
    assert_eq!(
        d.profiles()[0].filter_note(0),
        Some(&FilterNote::FallbackOnEmpty)
    );
    assert!(d.picked().is_some());
    let mixed = [cand("a", Some(&hot)), cand("b", Some(&cool))];
    let d = run(&s, &req(&h), &mixed, 1);
    assert_eq!(d.profiles()[0].filter_note(0), Some(&FilterNote::Applied));
    assert_eq!(d.picked_address(), Some("b"));
}

#[test]
fn zero_endpoints_means_no_pick_for_every_plugin() {
    let s = sched(
        r#"{"plugins": [{"type": "utilization-filter", "parameters": {"fallbackOnEmpty": true}},
        {"type": "prefix-cache-affinity-filter"}, {"type": "prefix-cache-scorer"}, {"type": "queue-scorer"},
        {"type": "kv-cache-utilization-scorer"}, {"type": "lora-affinity-scorer"}, {"type": "running-requests-scorer"},
        {"type": "inflight-load-scorer"}, {"type": "token-load-scorer"}, {"type": "session-affinity-scorer"}]}"#,
    );
    let h = hashes(4);
    let d = run(&s, &req(&h), &[], 3);
    assert_eq!(d.picked(), None);
    assert_eq!(d.picked_address(), None);
}

const AFFINITY: &str = r#"{"plugins": [
    {"type": "approx-prefix-cache-producer", "parameters": {"blockSizeTokens": 64}},
    {"type": "prefix-cache-affinity-filter", "name": "aff", "parameters": {"threshold": 0.5,
        "maxTTFTPenaltyMs": 500, "prefillTokensPerSecond": 1000, "queuedRequestMs": 100,
        "maxWaitingQueue": 10, "maxKVCacheUtilization": 0.9}}]}"#;

#[test]
fn affinity_keeps_only_the_sticky_set() {
    let s = sched(AFFINITY);
    let idle = m(0, 0, 0.1);
    let c = [
        cand("warm", Some(&idle)),
        cand("half", Some(&idle)),
        cand("cold", Some(&idle)),
    ];
    let h = hashes(10);
    let prefix = FakePrefix::with(&[("warm", 9), ("half", 5), ("cold", 4)]);
    let d = s.schedule(&req(&h), &c, &prefix, 1, Millis(0));
    let p = &d.profiles()[0];
    assert_eq!(p.dropped_by(2), Some("aff"));
    assert!(p.alive(0) && p.alive(1));
    // warm: 1 uncached block = 64 tokens at 1000 tok/s = 64 ms; cold: 6 blocks = 384 ms.
    assert_eq!(
        p.filter_note(0),
        Some(&FilterNote::Sticky {
            sticky_ttft_ms: 64.0,
            best_other_ttft_ms: Some(384.0)
        })
    );
}

#[test]
fn affinity_is_broken_when_the_sticky_set_is_too_slow() {
    let s = sched(AFFINITY);
    let queued = m(9, 0, 0.1); // below maxWaitingQueue: not overloaded, but slow
    let idle = m(0, 0, 0.1);
    let c = [cand("warm", Some(&queued)), cand("cold", Some(&idle))];
    let h = hashes(10);
    let prefix = FakePrefix::with(&[("warm", 10)]);
    let d = s.schedule(&req(&h), &c, &prefix, 1, Millis(0));
    let p = &d.profiles()[0];
    // warm: 9 × 100 ms = 900 ms; cold: 640 tokens / 1000 tok/s = 640 ms → 260 ms penalty: kept.
    assert!(matches!(p.filter_note(0), Some(FilterNote::Sticky { .. })));
    assert_eq!(p.dropped_by(1), Some("aff"));

    let very_queued = m(10, 0, 0.1); // 1000 ms vs 640 ms → 360 ms, still within 500
    let c = [cand("warm", Some(&very_queued)), cand("cold", Some(&idle))];
    let d = s.schedule(&req(&h), &c, &prefix, 1, Millis(0));
    assert!(matches!(
        d.profiles()[0].filter_note(0),
        Some(FilterNote::Sticky { .. })
    ));

    let s = sched(&AFFINITY.replace("\"maxTTFTPenaltyMs\": 500", "\"maxTTFTPenaltyMs\": 200"));
    let d = s.schedule(&req(&h), &c, &prefix, 1, Millis(0));
    assert_eq!(
        d.profiles()[0].filter_note(0),
        Some(&FilterNote::AffinityBroken {
            sticky_ttft_ms: 1000.0,
            best_other_ttft_ms: 640.0
        })
    );
    assert!(d.profiles()[0].alive(0) && d.profiles()[0].alive(1));
}

#[test]
fn a_sticky_replica_measured_slow_loses_the_sticky_set_and_wins_it_back() {
    use crate::latency::ObservedLatency;
    let s = sched(AFFINITY);
    let idle = m(0, 0, 0.1); // no queue anywhere: only the measurement shows the slowdown
    let measured = |ttft_ms: f64| {
        Some(ObservedLatency {
            ttft_ms,
            tpot_ms: None,
        })
    };
    let h = hashes(10);
    let prefix = FakePrefix::with(&[("warm", 10)]);
    let at = |warm_ttft: f64| {
        let c = [
            Candidate {
                latency: measured(warm_ttft),
                ..cand("warm", Some(&idle))
            },
            Candidate {
                latency: measured(20.0),
                ..cand("cold", Some(&idle))
            },
        ];
        let d = s.schedule(&req(&h), &c, &prefix, 1, Millis(0));
        d.profiles()[0].filter_note(0).copied()
    };
    // cold: 640 uncached tokens at 1000 tok/s = 640 ms (above its measured 20 ms).
    // Measured 1100 ms on the warm replica: 460 ms worse, within 500: still sticky.
    assert!(matches!(at(1_100.0), Some(FilterNote::Sticky { .. })));
    assert_eq!(
        at(1_200.0),
        Some(FilterNote::AffinityBroken {
            sticky_ttft_ms: 1_200.0,
            best_other_ttft_ms: 640.0
        })
    );
    // Recovered: its formula estimate (0 uncached tokens) and its measurement are small.
    assert!(matches!(at(15.0), Some(FilterNote::Sticky { .. })));
}

#[test]
fn overloaded_sticky_candidates_do_not_count() {
    let s = sched(AFFINITY);
    let full_kv = m(0, 0, 0.95);
    let long_queue = m(11, 0, 0.1);
    let idle = m(0, 0, 0.1);
    let c = [
        cand("kv", Some(&full_kv)),
        cand("queue", Some(&long_queue)),
        cand("cold", Some(&idle)),
    ];
    let h = hashes(10);
    let prefix = FakePrefix::with(&[("kv", 10), ("queue", 10)]);
    let d = s.schedule(&req(&h), &c, &prefix, 1, Millis(0));
    let p = &d.profiles()[0];
    assert_eq!(p.filter_note(0), Some(&FilterNote::NoSticky));
    assert!((0..3).all(|i| p.alive(i)));
}

#[test]
fn affinity_without_matches_or_blocks_keeps_all() {
    let s = sched(AFFINITY);
    let c = [cand("a", None), cand("b", None)];
    let h = hashes(10);
    let below = FakePrefix::with(&[("a", 4)]); // 0.4 < 0.5
    let d = s.schedule(&req(&h), &c, &below, 1, Millis(0));
    assert_eq!(d.profiles()[0].filter_note(0), Some(&FilterNote::NoSticky));
    let d = s.schedule(&req(&[]), &c, &below, 1, Millis(0));
    assert_eq!(d.profiles()[0].filter_note(0), Some(&FilterNote::NoSticky));
    assert_eq!(d.full_blocks(), 0);
}

#[test]
fn affinity_with_unknown_metrics_is_sticky_but_not_overloaded() {
    let s = sched(AFFINITY);
    let unknown = EndpointMetrics::default();
    let c = [cand("warm", Some(&unknown)), cand("cold", None)];
    let h = hashes(4);
    let prefix = FakePrefix::with(&[("warm", 4)]);
    let d = s.schedule(&req(&h), &c, &prefix, 1, Millis(0));
    assert_eq!(d.picked_address(), Some("warm"));
    assert_eq!(d.profiles()[0].dropped_by(1), Some("aff"));
}

#[test]
fn filters_chain_in_profile_order() {
    let s = sched(
        r#"{"plugins": [
        {"type": "utilization-filter", "name": "first", "parameters": {"conditions": [{"metric": "waiting-queue", "maxValue": 3}]}},
        {"type": "utilization-filter", "name": "second", "parameters": {"conditions": [{"metric": "kv-cache-utilization", "maxValue": 0.5}]}}]}"#,
    );
    let both = m(9, 0, 0.9);
    let kv = m(0, 0, 0.9);
    let fine = m(0, 0, 0.1);
    let c = [
        cand("both", Some(&both)),
        cand("kv", Some(&kv)),
        cand("fine", Some(&fine)),
    ];
    let h = hashes(1);
    let d = run(&s, &req(&h), &c, 0);
    let p = &d.profiles()[0];
    assert_eq!(
        [p.dropped_by(0), p.dropped_by(1), p.dropped_by(2)],
        [Some("first"), Some("second"), None]
    );
    assert_eq!(d.picked_address(), Some("fine"));
}
