//! The candidate rules: dead, fresh, unknown and unscraped endpoints; fail open and close.

use alloc::string::ToString;
use alloc::vec::Vec;

use super::super::candidates::{
    classify, pool_candidates, select, CandidateRules, EndpointClass, FailureMode, NoCandidates,
    PoolEndpoint, Selection, SnapshotRecord,
};
use super::m;
use crate::snapshot::EndpointSample;
use crate::types::{InFlight, Millis, Tokens};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const NOW: Millis = Millis(10_000);

fn sample(address: &str, scraped_at: u64, failures: u32, with_metrics: bool) -> EndpointSample {
    EndpointSample {
        address: address.to_string(),
        scraped_at: Millis(scraped_at),
        consecutive_failures: failures,
        metrics: with_metrics.then(|| m(1, 2, 0.5)),
    }
}

fn rules(mode: FailureMode) -> CandidateRules {
    CandidateRules {
        stale_after_ms: 1_000,
        max_consecutive_failures: 3,
        failure_mode: mode,
    }
}

fn class_of(s: &EndpointSample) -> &'static str {
    classify(
        SnapshotRecord::Present(s),
        &rules(FailureMode::FailClose),
        NOW,
    )
    .label()
}

#[test]
fn freshness_is_judged_at_now_with_the_pool_threshold() {
    assert_eq!(class_of(&sample("a", 9_000, 0, true)), "fresh");
    assert_eq!(class_of(&sample("a", 8_999, 0, true)), "unknown");
    // A sample from the future (skewed clocks) is fresh.
    assert_eq!(class_of(&sample("a", 20_000, 0, true)), "fresh");
    // Recent, but never scraped successfully.
    assert_eq!(class_of(&sample("a", 9_500, 0, false)), "unknown");
    // The same sample goes stale as `now` moves on.
    let s = sample("a", 9_000, 0, true);
    let r = rules(FailureMode::FailClose);
    assert_eq!(
        classify(SnapshotRecord::Present(&s), &r, Millis(10_001)).label(),
        "unknown"
    );
}

#[test]
fn failed_scrapes_in_a_row_make_an_endpoint_dead_unless_turned_off() {
    assert_eq!(class_of(&sample("a", 9_900, 2, true)), "fresh");
    assert_eq!(class_of(&sample("a", 9_900, 3, true)), "dead");
    let off = CandidateRules {
        max_consecutive_failures: 0,
        ..rules(FailureMode::FailClose)
    };
    let s = sample("a", 9_900, 50, true);
    assert_eq!(
        classify(SnapshotRecord::Present(&s), &off, NOW).label(),
        "fresh"
    );
}

#[test]
fn missing_records_are_unscraped_only_once_a_snapshot_exists() {
    let r = rules(FailureMode::FailClose);
    assert_eq!(
        classify(SnapshotRecord::NoSnapshot, &r, NOW),
        EndpointClass::Unknown
    );
    assert_eq!(
        classify(SnapshotRecord::Missing, &r, NOW),
        EndpointClass::Unscraped
    );
    let list = [sample("a", 0, 0, true)];
    assert_eq!(SnapshotRecord::find(&list, "b"), SnapshotRecord::Missing);
    assert_eq!(
        SnapshotRecord::find(&list, "a"),
        SnapshotRecord::Present(&list[0])
    );
}

#[test]
fn selection_prefers_fresh_then_fails_open_or_close() {
    let metrics = m(0, 0, 0.1);
    let fresh = EndpointClass::Fresh(&metrics);
    let (dead, unknown, unscraped) = (
        EndpointClass::Dead,
        EndpointClass::Unknown,
        EndpointClass::Unscraped,
    );
    for mode in [FailureMode::FailOpen, FailureMode::FailClose] {
        assert_eq!(select([unknown, fresh, dead], mode), Ok(Selection::Fresh));
        assert_eq!(select([], mode), Err(NoCandidates::NoLiveEndpoints));
    }
    // Every scrape failing means the metrics are unavailable: a pool that fails open then
    // serves on every member, one that fails close answers no endpoints.
    assert_eq!(
        select([dead, dead], FailureMode::FailOpen),
        Ok(Selection::EveryMember)
    );
    assert_eq!(
        select([dead, dead], FailureMode::FailClose),
        Err(NoCandidates::NoLiveEndpoints)
    );
    assert!(Selection::EveryMember.admits(&dead) && Selection::EveryMember.admits(&unknown));
    assert_eq!(
        select([dead, unknown, unscraped], FailureMode::FailOpen),
        Ok(Selection::Degraded)
    );
    assert_eq!(
        select([dead, unknown, unscraped], FailureMode::FailClose),
        Err(NoCandidates::StaleMetrics)
    );
    assert_eq!(
        select([dead, unscraped], FailureMode::FailClose),
        Err(NoCandidates::Unscraped)
    );
    assert!(Selection::Degraded.admits(&unscraped) && Selection::Degraded.admits(&unknown));
    assert!(!Selection::Degraded.admits(&dead) && !Selection::Degraded.admits(&fresh));
    assert!(Selection::Fresh.admits(&fresh) && !Selection::Fresh.admits(&unknown));
}

fn endpoints<'a>(samples: &'a [EndpointSample], addresses: &'a [&'a str]) -> Vec<PoolEndpoint<'a>> {
    addresses
        .iter()
        .enumerate()
        .map(|(i, address)| PoolEndpoint {
            address,
            record: SnapshotRecord::find(samples, address),
            inflight: InFlight {
                requests: i as u32,
                tokens: Tokens(10 * i as u64),
                prefilling: 0,
            },
            latency: None,
        })
        .collect()
}

#[test]
fn pool_candidates_keep_pool_order_indices_metrics_and_load() {
    let samples = [
        sample("a", 9_900, 0, true),
        sample("b", 9_900, 5, true),
        sample("c", 1, 0, true),
        sample("d", 9_950, 0, true),
    ];
    let addresses = ["a", "b", "c", "d", "e"];
    let set = pool_candidates(
        endpoints(&samples, &addresses),
        &rules(FailureMode::FailClose),
        NOW,
    );
    let Ok(set) = set else {
        panic!("fresh endpoints exist")
    };
    assert_eq!(set.selection, Selection::Fresh);
    assert_eq!(set.pool_index, [0, 3]);
    let names: Vec<&str> = set.candidates.iter().map(|c| c.address).collect();
    assert_eq!(names, ["a", "d"]);
    assert!(set.candidates.iter().all(|c| c.metrics.is_some()));
    assert_eq!(set.candidates[1].inflight.requests, 3);
}

#[test]
fn a_degraded_set_is_the_live_endpoints_without_metrics() {
    let samples = [sample("a", 1, 0, true), sample("b", 9_900, 5, true)];
    let addresses = ["a", "b", "c"];
    let open = pool_candidates(
        endpoints(&samples, &addresses),
        &rules(FailureMode::FailOpen),
        NOW,
    );
    let Ok(open) = open else {
        panic!("fail open schedules the live endpoints")
    };
    assert_eq!(open.selection, Selection::Degraded);
    assert_eq!(open.pool_index, [0, 2]);
    assert!(open.candidates.iter().all(|c| c.metrics.is_none()));
    let close = pool_candidates(
        endpoints(&samples, &addresses),
        &rules(FailureMode::FailClose),
        NOW,
    );
    assert_eq!(close, Err(NoCandidates::StaleMetrics));
    // Only the unscraped `c` is live: the FailClose answer says so.
    let only_c = ["b", "c"];
    let close = pool_candidates(
        endpoints(&samples, &only_c),
        &rules(FailureMode::FailClose),
        NOW,
    );
    assert_eq!(close, Err(NoCandidates::Unscraped));
}

#[test]
fn failing_open_with_every_scrape_failing_schedules_every_member_without_metrics() {
    // Both endpoints' last scrapes failed (dead), though they once had metrics.
    let samples = [sample("a", 9_900, 5, true), sample("b", 9_900, 3, true)];
    let addresses = ["a", "b"];
    let open = pool_candidates(
        endpoints(&samples, &addresses),
        &rules(FailureMode::FailOpen),
        NOW,
    );
    let Ok(open) = open else {
        panic!("fail open serves on every member when no metrics are left")
    };
    assert_eq!(open.selection, Selection::EveryMember);
    assert_eq!(open.pool_index, [0, 1]);
    assert!(open.candidates.iter().all(|c| c.metrics.is_none()));
    let close = pool_candidates(
        endpoints(&samples, &addresses),
        &rules(FailureMode::FailClose),
        NOW,
    );
    assert_eq!(close, Err(NoCandidates::NoLiveEndpoints));
}
