//! Picker semantics: ties, weighted and uniform draws, fallbacks, determinism.

use alloc::vec::Vec;

use super::super::pick::SplitMix64;
use super::{cand, hashes, m, req, run, sched};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const KV_MAX: &str = r#"{"plugins": [{"type": "kv-cache-utilization-scorer"}, {"type": "max-score-picker", "parameters": {"maxFallbacks": 2}}]}"#;

fn counts(picks: impl Iterator<Item = Option<usize>>, n: usize) -> Vec<usize> {
    let mut out = alloc::vec![0; n];
    for p in picks.flatten() {
        if let Some(slot) = out.get_mut(p) {
            *slot += 1;
        }
    }
    out
}

#[test]
fn splitmix_matches_reference_vector() {
    // First outputs for seed 1234567 (the published SplitMix64 reference sequence).
    let mut r = SplitMix64::new(1_234_567);
    assert_eq!(r.next_u64(), 6_457_827_717_110_365_317);
    assert_eq!(r.next_u64(), 3_203_168_211_198_807_973);
    let mut r = SplitMix64::new(5);
    assert!((0..1000).all(|_| r.below(7) < 7));
    assert_eq!(r.below(0), 0);
    assert!((0..1000).all(|_| (0.0..1.0).contains(&r.unit())));
}

#[test]
fn max_score_picks_the_highest_and_ranks_fallbacks() {
    let s = sched(KV_MAX);
    let (a, b, c2, d2) = (m(0, 0, 0.5), m(0, 0, 0.1), m(0, 0, 0.9), m(0, 0, 0.3));
    let c = [
        cand("a", Some(&a)),
        cand("b", Some(&b)),
        cand("c", Some(&c2)),
        cand("d", Some(&d2)),
    ];
    let h = hashes(1);
    for seed in 0..10 {
        let d = run(&s, &req(&h), &c, seed);
        assert_eq!(d.picked_address(), Some("b"));
        assert_eq!(d.fallback_addresses().collect::<Vec<_>>(), ["d", "a"]);
    }
}

#[test]
fn max_score_breaks_ties_uniformly_at_random() {
    let s = sched(KV_MAX);
    let (hi, lo) = (m(0, 0, 0.2), m(0, 0, 0.6));
    let c = [
        cand("a", Some(&hi)),
        cand("low", Some(&lo)),
        cand("b", Some(&hi)),
        cand("c", Some(&hi)),
    ];
    let h = hashes(1);
    let got = counts(
        (0..3000).map(|seed| run(&s, &req(&h), &c, seed).picked()),
        4,
    );
    assert_eq!(got[1], 0, "the lower total is never picked");
    for i in [0, 2, 3] {
        assert!((850..1150).contains(&got[i]), "tie share {got:?}");
    }
}

#[test]
fn same_seed_same_decision() {
    let s = sched(
        r#"{"plugins": [{"type": "weighted-random-picker"}, {"type": "kv-cache-utilization-scorer"}]}"#,
    );
    let (a, b) = (m(0, 0, 0.2), m(0, 0, 0.6));
    let c = [cand("a", Some(&a)), cand("b", Some(&b))];
    let h = hashes(1);
    for seed in 0..50 {
        assert_eq!(
            run(&s, &req(&h), &c, seed).picked(),
            run(&s, &req(&h), &c, seed).picked()
        );
    }
}

#[test]
fn weighted_random_is_proportional_to_totals() {
    let s = sched(
        r#"{"plugins": [{"type": "weighted-random-picker"}, {"type": "kv-cache-utilization-scorer"}]}"#,
    );
    let (a, b, z) = (m(0, 0, 0.25), m(0, 0, 0.75), m(0, 0, 1.0));
    let c = [
        cand("a", Some(&a)),
        cand("b", Some(&b)),
        cand("zero", Some(&z)),
    ];
    let h = hashes(1);
    let got = counts(
        (0..4000).map(|seed| run(&s, &req(&h), &c, seed).picked()),
        3,
    );
    // Expected 3000 : 1000 : 0.
    assert!((2800..3200).contains(&got[0]), "{got:?}");
    assert_eq!(got[2], 0, "{got:?}");
    // All-zero totals fall back to uniform.
    let zeros = [cand("x", Some(&z)), cand("y", Some(&z))];
    let got = counts(
        (0..2000).map(|seed| run(&s, &req(&h), &zeros, seed).picked()),
        2,
    );
    assert!((850..1150).contains(&got[0]), "{got:?}");
}

#[test]
fn weighted_random_fallbacks_are_distinct() {
    let s = sched(
        r#"{"plugins": [{"type": "weighted-random-picker", "parameters": {"maxFallbacks": 5}}, {"type": "kv-cache-utilization-scorer"}]}"#,
    );
    let (a, b, z) = (m(0, 0, 0.25), m(0, 0, 0.75), m(0, 0, 1.0));
    let c = [
        cand("a", Some(&a)),
        cand("b", Some(&b)),
        cand("z", Some(&z)),
    ];
    let h = hashes(1);
    for seed in 0..50 {
        let d = run(&s, &req(&h), &c, seed);
        let mut all: Vec<usize> = d
            .picked()
            .into_iter()
            .chain(d.fallbacks().iter().copied())
            .collect();
        assert_eq!(all.len(), 3);
        all.sort_unstable();
        assert_eq!(all, [0, 1, 2]);
    }
}

#[test]
fn random_picker_is_uniform_and_ignores_scores() {
    let s = sched(
        r#"{"plugins": [{"type": "random-picker", "parameters": {"maxFallbacks": 0}}, {"type": "kv-cache-utilization-scorer"}]}"#,
    );
    let (a, b) = (m(0, 0, 0.0), m(0, 0, 1.0));
    let c = [cand("a", Some(&a)), cand("b", Some(&b)), cand("c", None)];
    let h = hashes(1);
    let got = counts(
        (0..3000).map(|seed| run(&s, &req(&h), &c, seed).picked()),
        3,
    );
    assert!(got.iter().all(|n| (850..1150).contains(n)), "{got:?}");
    assert!(run(&s, &req(&h), &c, 1).fallbacks().is_empty());
}

#[test]
fn no_scorers_is_a_uniform_choice() {
    let s = sched("{}");
    let c = [cand("a", None), cand("b", None)];
    let h = hashes(1);
    let got = counts(
        (0..2000).map(|seed| run(&s, &req(&h), &c, seed).picked()),
        2,
    );
    assert!((850..1150).contains(&got[0]), "{got:?}");
}

#[test]
fn weights_change_the_winner() {
    let cfg = |w_kv: u32, w_q: u32| {
        alloc::format!(
            r#"{{"plugins": [{{"type": "kv-cache-utilization-scorer"}}, {{"type": "queue-scorer"}}],
            "schedulingProfiles": [{{"name": "p", "plugins": [{{"pluginRef": "kv-cache-utilization-scorer", "weight": {w_kv}}},
            {{"pluginRef": "queue-scorer", "weight": {w_q}}}]}}]}}"#
        )
    };
    // "kv" has free cache but a queue; "q" has an empty queue but a full cache.
    let (kv, q) = (m(10, 0, 0.1), m(0, 0, 0.8));
    let c = [cand("kv", Some(&kv)), cand("q", Some(&q))];
    let h = hashes(1);
    let s = sched(&cfg(3, 1));
    assert_eq!(run(&s, &req(&h), &c, 0).picked_address(), Some("kv"));
    let s = sched(&cfg(1, 3));
    assert_eq!(run(&s, &req(&h), &c, 0).picked_address(), Some("q"));
    let d = run(&s, &req(&h), &c, 0);
    let p = &d.profiles()[0];
    assert_eq!(p.weighted_score(1, 1), Some(3.0));
    assert!(p.total(1).is_some_and(|t| (t - 3.2).abs() < 1e-12));
}
