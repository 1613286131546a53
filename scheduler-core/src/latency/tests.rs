//! Unit tests of the measured-latency estimates.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use super::*;

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn obs(at: u64, ttft: f64, load: u32) -> Observation {
    Observation {
        at: Millis(at),
        ttft_ms: Some(ttft),
        tpot_ms: Some(2.0),
        inflight_at_dispatch: load,
        prompt_tokens: 100,
    }
}

#[test]
fn counts_only_after_min_samples_and_while_fresh() {
    let s = LatencySettings::default();
    let mut e = LatencyEstimate::default();
    assert_eq!(e.view(&s, Millis(0), 0), None);
    for i in 0..2 {
        e.observe(&s, &obs(1_000 + i, 50.0, 0));
    }
    assert_eq!(e.view(&s, Millis(1_002), 0), None, "2 < minSamples");
    e.observe(&s, &obs(1_002, 50.0, 0));
    let v = e.view(&s, Millis(1_002), 0).unwrap();
    assert!((v.ttft_ms - 50.0).abs() < 1e-9);
    assert_eq!(v.tpot_ms, Some(2.0));
    assert!(e.view(&s, Millis(1_002 + s.stale_after_ms), 0).is_some());
    assert_eq!(
        e.view(&s, Millis(1_003 + s.stale_after_ms), 0),
        None,
        "stale"
    );
}

#[test]
fn moves_by_smoothing_towards_each_observation() {
    let s = LatencySettings::default();
    let mut e = LatencyEstimate::default();
    for i in 0..3 {
        e.observe(&s, &obs(i, 100.0, 1));
    }
    e.observe(&s, &obs(3, 600.0, 1));
    // 100 + 0.2 × 500.
    assert!((e.mean_ttft_ms().unwrap() - 200.0).abs() < 1e-9);
}

#[test]
fn a_stale_estimate_starts_over() {
    let s = LatencySettings::default();
    let mut e = LatencyEstimate::default();
    for i in 0..5 {
        e.observe(&s, &obs(i, 2_000.0, 0));
    }
    e.observe(&s, &obs(5 + s.stale_after_ms + 1, 20.0, 0));
    assert_eq!(e.ttft_samples(), 1);
    assert_eq!(e.mean_ttft_ms(), Some(20.0));
}

#[test]
fn ttft_grows_with_load_when_the_engine_slows_under_it() {
    let s = LatencySettings::default();
    let mut e = LatencyEstimate::default();
    // TTFT = 10 + 20 × load, loads cycling 0..4.
    for i in 0..200u32 {
        let load = i % 5;
        e.observe(&s, &obs(u64::from(i), 10.0 + 20.0 * f64::from(load), load));
    }
    assert!(
        (e.ttft_slope_ms() - 20.0).abs() < 0.5,
        "{}",
        e.ttft_slope_ms()
    );
    let idle = e.view(&s, Millis(200), 0).unwrap().ttft_ms;
    let busy = e.view(&s, Millis(200), 6).unwrap().ttft_ms;
    assert!((idle - 10.0).abs() < 3.0, "{idle}");
    assert!((busy - 130.0).abs() < 5.0, "{busy}");
}

#[test]
fn slope_is_never_negative_and_zero_without_load_variance() {
    let s = LatencySettings::default();
    let mut e = LatencyEstimate::default();
    for i in 0..50u32 {
        e.observe(
            &s,
            &obs(u64::from(i), 100.0 - 10.0 * f64::from(i % 3), i % 3),
        );
    }
    assert_eq!(e.ttft_slope_ms(), 0.0);
    let mut flat = LatencyEstimate::default();
    for i in 0..50u32 {
        flat.observe(&s, &obs(u64::from(i), 10.0 + f64::from(i % 7), 2));
    }
    assert_eq!(flat.ttft_slope_ms(), 0.0);
    assert!(flat.view(&s, Millis(50), 40).unwrap().ttft_ms < 20.0);
}

#[test]
fn non_streamed_responses_do_not_count_towards_ttft() {
    let s = LatencySettings::default();
    let mut e = LatencyEstimate::default();
    for i in 0..5 {
        e.observe(
            &s,
            &Observation {
                ttft_ms: None,
                tpot_ms: None,
                ..obs(i, 0.0, 0)
            },
        );
    }
    assert_eq!(e.view(&s, Millis(5), 0), None);
    assert_eq!(e.mean_ttft_ms(), None);
    assert_eq!(e.mean_prompt_tokens(), Some(100.0));
}

#[test]
fn garbage_observations_are_ignored() {
    let s = LatencySettings::default();
    let mut e = LatencyEstimate::default();
    for (i, bad) in [f64::NAN, f64::INFINITY, -1.0].into_iter().enumerate() {
        e.observe(
            &s,
            &Observation {
                ttft_ms: Some(bad),
                tpot_ms: Some(bad),
                ..obs(i as u64, 0.0, 0)
            },
        );
    }
    assert_eq!(e.mean_ttft_ms(), None);
    assert_eq!(e.mean_tpot_ms(), None);
}
