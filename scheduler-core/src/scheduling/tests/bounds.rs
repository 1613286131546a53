//! Bounds on what a configuration or an engine can make the scheduler do: weights that
//! would overflow a total, totals that are not numbers, and prefix-index capacities.

use alloc::format;
use alloc::string::String;

use super::super::input::ALIVE;
use super::super::pick::{self, SplitMix64};
use super::super::plugins::{Picker, PickerKind};
use super::super::{ConfigError, Scheduler, DEFAULT_MAX_LRU_CAPACITY, MAX_WEIGHT};
use super::{cand, hashes, m, req, run, sched};
use crate::metrics::{CacheConfig, EndpointMetrics};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn err(json: &str) -> ConfigError {
    match Scheduler::from_json_str(json) {
        Ok(_) => panic!("accepted: {json}"),
        Err(e) => e,
    }
}

fn two_scorers(w1: &str, w2: &str) -> String {
    format!(
        r#"{{"plugins":[{{"type":"queue-scorer"}},{{"type":"kv-cache-utilization-scorer"}}],
        "schedulingProfiles":[{{"name":"p","plugins":[{{"pluginRef":"queue-scorer","weight":{w1}}},
        {{"pluginRef":"kv-cache-utilization-scorer","weight":{w2}}}]}}]}}"#
    )
}

#[test]
fn weights_above_the_bound_are_config_errors_naming_profile_and_plugin() {
    let e = err(&two_scorers("1", "1.7976931348623157e308"));
    assert!(
        matches!(&e, ConfigError::BadWeight { profile, plugin_ref }
            if profile == "p" && plugin_ref == "kv-cache-utilization-scorer"),
        "{e:?}"
    );
    let text = format!("{e}");
    assert!(
        text.contains("kv-cache-utilization-scorer") && text.contains("1000000"),
        "{text}"
    );
    assert!(matches!(
        err(&two_scorers("1000000.5", "1")),
        ConfigError::BadWeight { .. }
    ));
}

#[test]
fn the_largest_weights_still_pick() {
    let w = format!("{MAX_WEIGHT:?}");
    let s = sched(&two_scorers(&w, &w));
    let (a, b) = (m(0, 0, 0.1), m(5, 0, 0.9));
    let cands = [cand("a:1", Some(&a)), cand("b:1", Some(&b))];
    let blocks = hashes(2);
    let d = run(&s, &req(&blocks), &cands, 7);
    assert_eq!(d.picked_address(), Some("a:1"));
}

fn max_score(totals: &[f64]) -> alloc::vec::Vec<usize> {
    let p = Picker {
        kind: PickerKind::MaxScore,
        max_fallbacks: 8,
    };
    let alive = alloc::vec![ALIVE; totals.len()];
    pick::pick(p, totals, &alive, &mut SplitMix64::new(3))
}

#[test]
fn infinite_and_nan_totals_never_leave_the_picker_empty() {
    let inf = f64::INFINITY;
    let ranked = max_score(&[1.0, inf, f64::NAN, inf]);
    assert_eq!(ranked.len(), 4, "{ranked:?}");
    let mut top = [ranked[0], ranked[1]];
    top.sort_unstable();
    assert_eq!(top, [1, 3], "the infinities tie for first: {ranked:?}");
    assert_eq!(ranked[2..], [0, 2], "then 1.0, then NaN last");
    assert_eq!(max_score(&[f64::NAN, f64::NAN]).len(), 2);
    assert_eq!(max_score(&[f64::NEG_INFINITY, 0.0])[0], 1);
}

fn with_cache(num_blocks: u64) -> EndpointMetrics {
    EndpointMetrics {
        cache: Some(CacheConfig {
            block_size: 16,
            num_blocks,
        }),
        ..EndpointMetrics::default()
    }
}

#[test]
fn lru_capacity_is_clamped_whatever_the_engine_reports() {
    let s = sched("{}");
    assert_eq!(
        s.lru_capacity_for(Some(&with_cache(u64::MAX))),
        DEFAULT_MAX_LRU_CAPACITY
    );
    // 8000 blocks × 16 tokens ÷ 64: below the bound, unchanged.
    assert_eq!(s.lru_capacity_for(Some(&with_cache(8_000))), 2_000);
    let s = sched(
        r#"{"plugins":[{"type":"approx-prefix-cache-producer","parameters":{"maxLruCapacityPerServer":1000}}]}"#,
    );
    assert_eq!(s.lru_capacity_for(Some(&with_cache(8_000))), 1_000);
    // The default bound (31,250) gives way to a smaller maximum.
    assert_eq!(s.lru_capacity_for(None), 1_000);
    assert_eq!(s.prefix_config().lru_capacity_per_server, 1_000);
    let s = sched(
        r#"{"plugins":[{"type":"approx-prefix-cache-producer","parameters":{"maxLruCapacityPerServer":4294967295,"lruCapacityPerServer":4294967295}}]}"#,
    );
    assert_eq!(s.lru_capacity_for(None), u32::MAX);
}

#[test]
fn lru_capacity_above_the_maximum_is_a_config_error() {
    let e = err(
        r#"{"plugins":[{"type":"approx-prefix-cache-producer","name":"idx","parameters":{"maxLruCapacityPerServer":100,"lruCapacityPerServer":101}}]}"#,
    );
    assert!(
        matches!(&e, ConfigError::BadParameter { plugin, parameter, .. }
            if plugin == "idx" && parameter == "lruCapacityPerServer"),
        "{e:?}"
    );
    let e = err(
        r#"{"plugins":[{"type":"approx-prefix-cache-producer","parameters":{"maxLruCapacityPerServer":0}}]}"#,
    );
    assert!(
        matches!(&e, ConfigError::BadParameter { parameter, .. } if parameter == "maxLruCapacityPerServer"),
        "{e:?}"
    );
}
