//! The saturation detectors.

use crate::flow::config::{ConcurrencyMode, Detector, UtilizationThresholds};
use crate::flow::saturation::{
    all_saturated, BatchCapacity, InFlightLoad, LEARNED_BATCH_TTL_MS, QUEUE_RUN_MAX_GAP_MS,
};
use crate::types::Millis;

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

/// Scrapes of one endpoint, 50 ms apart from `t0`: each `(waiting, running)`.
fn scrapes(b: &mut BatchCapacity, t0: u64, figures: &[(u32, u32)]) {
    for (i, &(waiting, running)) in figures.iter().enumerate() {
        b.observe(Millis(t0 + 50 * i as u64), Some(waiting), Some(running));
    }
}

#[test]
fn a_batch_capacity_is_learned_from_a_queue_two_scrapes_long() {
    let mut b = BatchCapacity::default();
    // Nothing learned: nothing is ever full.
    assert!(!b.is_full(u32::MAX, u32::MAX, u32::MAX));
    // One scrape with a queue is a request between two engine steps.
    scrapes(&mut b, 0, &[(1, 1), (0, 2)]);
    assert_eq!(b.learned(), None);
    // A queue with nothing running (an engine starting) teaches nothing.
    scrapes(&mut b, 100, &[(3, 0), (3, 0), (0, 1)]);
    assert_eq!(b.learned(), None);
    // Unknown figures end a run.
    b.observe(Millis(300), Some(2), Some(2));
    b.observe(Millis(350), None, None);
    b.observe(Millis(400), Some(2), Some(2));
    assert_eq!(b.learned(), None);
    // The same scrape seen again (republished for another endpoint) is one scrape.
    b.observe(Millis(400), Some(2), Some(2));
    assert_eq!(b.learned(), None);
    // Two queued scrapes too far apart are two queues.
    b.observe(Millis(400 + QUEUE_RUN_MAX_GAP_MS + 1), Some(2), Some(2));
    assert_eq!(b.learned(), None);
    // A queue seen twice: what ran then is the batch.
    b.observe(Millis(1_500), Some(2), Some(2));
    assert_eq!(b.learned(), Some(2));
    // It grows with a queue, or with more running than it, queue or not.
    scrapes(&mut b, 1_550, &[(1, 1), (0, 3)]);
    assert_eq!(b.learned(), Some(3));
    scrapes(&mut b, 1_650, &[(1, 4), (1, 4)]);
    assert_eq!(b.learned(), Some(4));
}

#[test]
fn a_learned_batch_nothing_confirms_is_forgotten() {
    let mut b = BatchCapacity::default();
    scrapes(&mut b, 0, &[(1, 2), (1, 2)]);
    assert_eq!(b.learned(), Some(2));
    // A queue confirms it, with fewer running (a smaller batch for longer prompts).
    let later = LEARNED_BATCH_TTL_MS - 100;
    scrapes(&mut b, later, &[(1, 1), (1, 1)]);
    assert_eq!(b.learned(), Some(2));
    // Nothing confirms it for the TTL: forgotten, learned again at the next queue.
    let quiet = later + 50 + LEARNED_BATCH_TTL_MS + 1;
    scrapes(&mut b, quiet, &[(0, 1)]);
    assert_eq!(b.learned(), None);
    scrapes(&mut b, quiet + 50, &[(1, 3), (1, 3)]);
    assert_eq!(b.learned(), Some(3));
}

#[test]
fn an_endpoint_is_full_when_its_scrape_or_this_proxys_load_reaches_its_capacity() {
    let mut b = BatchCapacity::default();
    scrapes(&mut b, 0, &[(1, 2), (1, 2)]);
    assert!(!b.is_full(1, 0, 0));
    assert!(!b.is_full(0, 0, 1));
    assert!(b.is_full(2, 0, 0));
    assert!(b.is_full(1, 1, 0));
    // This proxy's requests since the scrape count.
    assert!(b.is_full(0, 0, 2));
    assert!(b.is_full(u32::MAX, u32::MAX, 0));
}
