//! Property tests: for arbitrary metrics (NaN, missing, out of range), loads, prefix
//! matches, weights, `prefix-cache-scorer` match-length settings and seeds, raw scores stay
//! in [0, 1], totals are Σ weight × score, and the pick and fallbacks are distinct surviving
//! candidates.

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use proptest::prelude::*;

use super::super::{Candidate, RequestView};
use super::{sched, FakePrefix};
use crate::metrics::{EndpointMetrics, LoraState};
use crate::types::{InFlight, Millis, Tokens};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const SCORERS: &[&str] = &[
    "prefix-cache-scorer",
    "queue-scorer",
    "kv-cache-utilization-scorer",
    "lora-affinity-scorer",
    "running-requests-scorer",
    "inflight-load-scorer",
    "token-load-scorer",
    "session-affinity-scorer",
];
const PICKERS: &[&str] = &[
    "max-score-picker",
    "weighted-random-picker",
    "random-picker",
];

fn kv() -> impl Strategy<Value = Option<f64>> {
    prop_oneof![
        Just(None),
        Just(Some(f64::NAN)),
        Just(Some(f64::INFINITY)),
        (-0.5f64..1.5).prop_map(Some),
    ]
}

fn metrics() -> impl Strategy<Value = Option<EndpointMetrics>> {
    let lora = prop_oneof![
        Just(None),
        (
            0u32..3,
            prop::sample::subsequence(vec!["a", "b", "c"], 0..3),
            prop::sample::subsequence(vec!["a", "b"], 0..2)
        )
            .prop_map(|(max, r, w)| Some(LoraState {
                max,
                running: r.into_iter().map(String::from).collect(),
                waiting: w.into_iter().map(String::from).collect(),
            })),
    ];
    prop::option::of(
        (
            prop::option::of(0u32..50),
            prop::option::of(0u32..50),
            kv(),
            lora,
        )
            .prop_map(|(waiting, running, kv_cache_usage, lora)| EndpointMetrics {
                waiting,
                running,
                kv_cache_usage,
                cache: None,
                lora,
            }),
    )
}

fn config(
    scorers: &[(usize, f64)],
    picker: usize,
    util: Option<f64>,
    affinity: Option<f64>,
    match_length: Option<(f64, u64)>,
) -> String {
    let mut plugins: Vec<String> = SCORERS
        .iter()
        .map(|t| match match_length {
            Some((w, s)) if *t == "prefix-cache-scorer" => format!(
                r#"{{"type": "{t}", "parameters": {{"matchLengthWeight": {w}, "matchLengthScaleTokens": {s}}}}}"#
            ),
            _ => format!(r#"{{"type": "{t}"}}"#),
        })
        .collect();
    let mut refs: Vec<String> = Vec::new();
    if let Some(max) = util {
        plugins.push(format!(
            r#"{{"type": "utilization-filter", "parameters": {{"conditions": [{{"metric": "kv-cache-utilization", "maxValue": {max}}}]}}}}"#
        ));
        refs.push(r#"{"pluginRef": "utilization-filter"}"#.into());
    }
    if let Some(t) = affinity {
        plugins.push(format!(
            r#"{{"type": "prefix-cache-affinity-filter", "parameters": {{"threshold": {t}}}}}"#
        ));
        refs.push(r#"{"pluginRef": "prefix-cache-affinity-filter"}"#.into());
    }
    for (s, w) in scorers {
        let name = SCORERS
            .get(*s % SCORERS.len())
            .copied()
            .unwrap_or("queue-scorer");
        if !refs.iter().any(|r| r.contains(name)) {
            refs.push(format!(r#"{{"pluginRef": "{name}", "weight": {w}}}"#));
        }
    }
    let picker = PICKERS
        .get(picker % PICKERS.len())
        .copied()
        .unwrap_or("max-score-picker");
    plugins.push(format!(r#"{{"type": "{picker}"}}"#));
    refs.push(format!(r#"{{"pluginRef": "{picker}"}}"#));
    format!(
        r#"{{"plugins": [{}], "schedulingProfiles": [{{"name": "p", "plugins": [{}]}}]}}"#,
        plugins.join(","),
        refs.join(",")
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn scores_in_range_totals_are_weighted_sums_and_pick_is_a_survivor(
        endpoints in prop::collection::vec((metrics(), 0u32..20, 0u64..100_000, 0usize..12), 0..12),
        scorers in prop::collection::vec((0usize..8, 0.0f64..10.0), 0..8),
        picker in 0usize..3,
        util in prop::option::of(0.0f64..1.0),
        affinity in prop::option::of(0.0f64..1.0),
        match_length in prop::option::of((0.0f64..=1.0, 1u64..2_000)),
        blocks in 0u64..10,
        target in prop::sample::select(vec!["base", "a", "b", "z"]),
        session in prop::option::of(0usize..12),
        seed in any::<u64>(),
    ) {
        let s = sched(&config(&scorers, picker, util, affinity, match_length));
        let addresses: Vec<String> = (0..endpoints.len()).map(|i| format!("10.0.0.{i}:8000")).collect();
        let cands: Vec<Candidate<'_>> = endpoints.iter().zip(&addresses).map(|((m, r, t, _), a)| Candidate {
            address: a,
            metrics: m.as_ref(),
            inflight: InFlight { requests: *r, tokens: Tokens(*t), prefilling: 0 },
            role: crate::scheduling::Role::Both,
            latency: None,
        }).collect();
        let prefix = FakePrefix(endpoints.iter().zip(&addresses).map(|((_, _, _, n), a)| (a.clone(), *n)).collect());
        let hashes: Vec<_> = (0..blocks).map(crate::types::BlockHash).collect();
        let request = RequestView {
            target_model: target,
            base_model: "base",
            block_hashes: &hashes,
            prompt_tokens: Tokens(blocks * 64 + 10),
            last_endpoint_for_session: session.and_then(|i| addresses.get(i)).map(String::as_str),
        };
        let d = s.schedule(&request, &cands, &prefix, seed, Millis(0));
        let profile = &s.profiles()[0];
        let p = &d.profiles()[0];
        for c in 0..cands.len() {
            if !p.alive(c) {
                prop_assert_eq!(p.total(c), None);
                continue;
            }
            let mut sum = 0.0;
            for (si, step) in profile.scorers.iter().enumerate() {
                let raw = p.raw_score(si, c).unwrap_or(f64::NAN);
                prop_assert!((0.0..=1.0).contains(&raw), "raw {} out of range", raw);
                sum += step.weight * raw;
            }
            let total = p.total(c).unwrap_or(f64::NAN);
            prop_assert!((total - sum).abs() <= 1e-9 * sum.abs().max(1.0), "total {} vs {}", total, sum);
        }
        let alive = (0..cands.len()).filter(|c| p.alive(*c)).count();
        match d.picked() {
            None => prop_assert_eq!(alive, 0),
            Some(c) => {
                prop_assert!(c < cands.len() && p.alive(c));
                let mut seen = alloc::vec![c];
                for f in d.fallbacks() {
                    prop_assert!(p.alive(*f) && !seen.contains(f));
                    seen.push(*f);
                }
                prop_assert_eq!(seen.len(), alive.min(1 + 3));
                prop_assert_eq!(d.picked_address(), Some(addresses[c].as_str()));
            }
        }
        if profile.picker.plugin.kind == super::super::plugins::PickerKind::MaxScore {
            if let Some(c) = d.picked() {
                let best = (0..cands.len()).filter_map(|i| p.total(i)).fold(f64::NEG_INFINITY, f64::max);
                prop_assert!(p.total(c).unwrap_or(f64::NAN) >= best - 1e-9 * best.abs().max(1.0));
            }
        }
        prop_assert!(serde_json::to_string(&d).is_ok());
    }
}
