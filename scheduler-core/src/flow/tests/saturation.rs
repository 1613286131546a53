//! The saturation detectors.

use crate::flow::config::{ConcurrencyMode, Detector, UtilizationThresholds};
use crate::flow::saturation::{all_saturated, InFlightLoad};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn load(requests: u64, tokens: u64) -> InFlightLoad {
    InFlightLoad { requests, tokens }
}

#[test]
fn concurrency_detector_saturates_when_the_load_reaches_max_times_one_plus_headroom() {
    let d = Detector::Concurrency {
        max_concurrency: 128,
        mode: ConcurrencyMode::Requests,
        headroom: 0.0,
    };
    assert!(!d.saturated_by_load(load(127, 1 << 40)));
    assert!(d.saturated_by_load(load(128, 0)));
    assert!(d.saturated_by_load(load(500, 0)));
    let d = Detector::Concurrency {
        max_concurrency: 100,
        mode: ConcurrencyMode::Requests,
        headroom: 0.25,
    };
    assert!(!d.saturated_by_load(load(124, 0)));
    assert!(d.saturated_by_load(load(125, 0)));
    let d = Detector::Concurrency {
        max_concurrency: 10_000,
        mode: ConcurrencyMode::Tokens,
        headroom: 0.1,
    };
    assert!(!d.saturated_by_load(load(1_000, 10_999)));
    assert!(d.saturated_by_load(load(0, 11_000)));
    assert!(!d.reads_snapshot());
}

#[test]
fn utilization_detector_is_saturated_only_when_every_endpoint_reaches_a_threshold() {
    let t = UtilizationThresholds {
        queue_depth: 5.0,
        kv_cache_utilization: 0.8,
    };
    assert!(!t.endpoint_saturated(4.0, 0.79));
    assert!(t.endpoint_saturated(5.0, 0.0));
    assert!(t.endpoint_saturated(0.0, 0.8));
    assert!(!t.endpoint_saturated(f64::NAN, f64::NAN));
    assert!(t.endpoint_saturated(f64::NAN, 0.9));
    assert!(!all_saturated(&t, []));
    assert!(all_saturated(&t, [(5.0, 0.1), (0.0, 0.95)]));
    assert!(!all_saturated(&t, [(5.0, 0.1), (0.0, 0.5)]));
    let d = Detector::Utilization(t);
    assert!(d.reads_snapshot());
    assert!(!d.saturated_by_load(load(u64::MAX, u64::MAX)));
}
