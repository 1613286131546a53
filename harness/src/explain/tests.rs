//! `explain` and the gateway's picker agree: the same pool, snapshot, config, `now` and
//! seed through both give the same candidate set and the same pick or rejection. Stale,
//! dead and unscraped endpoints, both failure modes, and a clock that moves past the
//! staleness bound are covered, so an `explain` that judged candidates by its own rules
//! (e.g. "metrics present" instead of "fresh at now") fails here.

// A test fails by panicking.
#![allow(clippy::panic, clippy::unwrap_used)]

use std::collections::BTreeSet;

use infergate_filters::host::{SnapshotFetch, SnapshotSource, SnapshotVersion};
use infergate_filters::picker::{PickRequest, PickerShared};
use scheduler_core::metrics::EndpointMetrics;
use scheduler_core::scheduling::candidates::FailureMode;
use scheduler_core::scheduling::Scheduler;
use scheduler_core::snapshot::{encode, EndpointSample, Snapshot};
use scheduler_core::types::Millis;
use serde_json::{json, Value};

use super::{decide, parse_request, State, StateEndpoint};

const PATH: &str = "/v1/chat/completions";
const SEEDS: u64 = 24;

/// One endpoint as the scraper last saw it.
#[derive(Clone)]
struct Endpoint {
    address: &'static str,
    metrics: Option<EndpointMetrics>,
    scraped_at: u64,
    failures: u32,
    in_snapshot: bool,
}

fn ep(address: &'static str, kv: f64, scraped_at: u64) -> Endpoint {
    Endpoint {
        address,
        metrics: Some(EndpointMetrics {
            waiting: Some(1),
            running: Some(2),
            kv_cache_usage: Some(kv),
            ..EndpointMetrics::default()
        }),
        scraped_at,
        failures: 0,
        in_snapshot: true,
    }
}

fn dead(mut e: Endpoint) -> Endpoint {
    e.failures = 5;
    e
}

fn unscraped(mut e: Endpoint) -> Endpoint {
    e.in_snapshot = false;
    e
}

/// The snapshot the scraper would have published.
struct Published(Vec<u8>);

impl SnapshotSource for Published {
    fn snapshot_if_changed(&self, known: Option<SnapshotVersion>) -> SnapshotFetch {
        if known == Some(SnapshotVersion(1)) {
            return SnapshotFetch::Unchanged;
        }
        SnapshotFetch::Changed {
            version: SnapshotVersion(1),
            bytes: self.0.clone(),
        }
    }
}

fn mode_name(mode: FailureMode) -> &'static str {
    match mode {
        FailureMode::FailClose => "FailClose",
        FailureMode::FailOpen => "FailOpen",
    }
}

fn body() -> Vec<u8> {
    json!({"model": "m", "messages": [{"role": "user", "content": "tell me about tents ".repeat(60)}]})
        .to_string()
        .into_bytes()
}

/// The gateway's outcome: the picked endpoint, or the rejection's stat label.
fn gateway(pool: &[Endpoint], mode: FailureMode, epp: &Value, now: u64, seed: u64) -> String {
    let addresses: Vec<&str> = pool.iter().map(|e| e.address).collect();
    let state = PickerShared::from_json(json!({
        "pool": "p", "baseModel": "m", "endpoints": addresses,
        "failureMode": mode_name(mode), "staleAfterMs": 1000, "maxConsecutiveFailures": 3,
        "eppConfig": epp,
    }))
    .unwrap();
    let snapshot = Snapshot {
        taken_at: Millis(now),
        endpoints: pool
            .iter()
            .filter(|e| e.in_snapshot)
            .map(|e| EndpointSample {
                address: e.address.to_owned(),
                scraped_at: Millis(e.scraped_at),
                consecutive_failures: e.failures,
                metrics: e.metrics.clone(),
            })
            .collect(),
    };
    state.refresh_snapshot(&Published(encode(&snapshot)));
    let plan = state.pool_plan("m").unwrap();
    let body = body();
    let parsed = parse_request(PATH, &body).unwrap();
    let hashes = plan.block_hashes(&parsed.model, parsed.cache_salt.as_deref(), &parsed.prompt);
    let req = PickRequest {
        target_model: &parsed.model,
        block_hashes: &hashes,
        prompt_tokens: parsed.prompt_tokens,
        max_output_tokens: None,
        session: None,
    };
    match state.pick(&plan, &req, Millis(now), seed) {
        Ok(picked) => picked.endpoint,
        Err(rejection) => rejection.label().to_owned(),
    }
}

/// `explain`'s record for the same pool, written as an operator would write the state.
fn explained(pool: &[Endpoint], mode: FailureMode, epp: &Value, now: u64, seed: u64) -> Value {
    let state = State {
        endpoints: pool
            .iter()
            .map(|e| StateEndpoint {
                address: e.address.to_owned(),
                metrics: e.metrics.clone(),
                scraped_at_ms: Some(e.scraped_at),
                consecutive_failures: e.failures,
                in_snapshot: e.in_snapshot,
                inflight: Default::default(),
            })
            .collect(),
        failure_mode: mode,
        stale_after_ms: 1000,
        max_consecutive_failures: 3,
        ..State::default()
    };
    let scheduler = Scheduler::from_value(epp.clone()).unwrap();
    decide(&scheduler, &state, PATH, &body(), seed, Millis(now)).unwrap()
}

fn outcome(record: &Value) -> String {
    match (&record["picked"], &record["rejected"]) {
        (Value::String(endpoint), _) => endpoint.clone(),
        (_, Value::String(label)) => label.clone(),
        _ => panic!("neither a pick nor a rejection: {record}"),
    }
}

/// Every endpoint a profile without scorers (all tied, the seed decides) may pick.
fn tied() -> Value {
    json!({"plugins": [{"type": "max-score-picker"}]})
}

fn production() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/epp/default.yaml"
    ))
    .unwrap();
    serde_yaml::from_str(&text).unwrap()
}

/// Asserts agreement for every seed; returns the candidate set and the outcomes seen.
fn agree(pool: &[Endpoint], mode: FailureMode, now: u64) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut candidates = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for epp in [tied(), production()] {
        for seed in 0..SEEDS {
            let record = explained(pool, mode, &epp, now, seed);
            let explained = outcome(&record);
            assert_eq!(
                gateway(pool, mode, &epp, now, seed),
                explained,
                "{mode:?} at {now}, seed {seed}: {record:#}"
            );
            if let Some(list) = record["candidates"].as_array() {
                candidates.extend(
                    list.iter()
                        .filter_map(|c| c["address"].as_str())
                        .map(String::from),
                );
            }
            seen.insert(explained);
        }
    }
    // With every candidate tied, the seeds reach all of them: the gateway's picks span
    // exactly the candidate set `explain` reports.
    if !candidates.is_empty() {
        let picks: BTreeSet<String> = (0..SEEDS)
            .map(|seed| gateway(pool, mode, &tied(), now, seed))
            .collect();
        assert_eq!(picks, candidates, "{mode:?} at {now}");
    }
    (candidates, seen)
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

const NOW: u64 = 100_000;

#[test]
fn fresh_endpoints_only_are_candidates_when_some_are_fresh() {
    let pool = [
        ep("10.0.0.1:8000", 0.2, NOW - 100),
        ep("10.0.0.2:8000", 0.1, NOW - 5_000), // stale
        dead(ep("10.0.0.3:8000", 0.1, NOW)),
        unscraped(ep("10.0.0.4:8000", 0.1, NOW)),
        ep("10.0.0.5:8000", 0.5, NOW + 50), // from a skewed clock: fresh
    ];
    for mode in [FailureMode::FailClose, FailureMode::FailOpen] {
        let (candidates, _) = agree(&pool, mode, NOW);
        assert_eq!(candidates, set(&["10.0.0.1:8000", "10.0.0.5:8000"]));
    }
}

#[test]
fn none_fresh_fails_open_over_the_live_ones_or_closes() {
    let pool = [
        ep("10.0.0.1:8000", 0.2, NOW - 5_000),
        dead(ep("10.0.0.2:8000", 0.1, NOW)),
        unscraped(ep("10.0.0.3:8000", 0.1, NOW)),
    ];
    let (candidates, _) = agree(&pool, FailureMode::FailOpen, NOW);
    assert_eq!(candidates, set(&["10.0.0.1:8000", "10.0.0.3:8000"]));
    let (candidates, seen) = agree(&pool, FailureMode::FailClose, NOW);
    assert!(candidates.is_empty());
    assert_eq!(seen, set(&["stale_metrics"]));
}

#[test]
fn unscraped_and_dead_pools_are_rejected_for_the_gateways_reasons() {
    let unscraped_only = [
        dead(ep("10.0.0.1:8000", 0.1, NOW)),
        unscraped(ep("10.0.0.2:8000", 0.1, NOW)),
    ];
    assert_eq!(
        agree(&unscraped_only, FailureMode::FailClose, NOW).1,
        set(&["unscraped_endpoints"])
    );
    assert_eq!(
        agree(&unscraped_only, FailureMode::FailOpen, NOW).0,
        set(&["10.0.0.2:8000"])
    );
    let all_dead = [
        dead(ep("10.0.0.1:8000", 0.1, NOW)),
        dead(ep("10.0.0.2:8000", 0.1, NOW)),
    ];
    for mode in [FailureMode::FailClose, FailureMode::FailOpen] {
        assert_eq!(agree(&all_dead, mode, NOW).1, set(&["no_endpoints"]));
    }
}

#[test]
fn the_same_snapshot_is_judged_at_the_given_now() {
    let pool = [
        ep("10.0.0.1:8000", 0.2, NOW),
        ep("10.0.0.2:8000", 0.1, NOW - 800),
    ];
    assert_eq!(
        agree(&pool, FailureMode::FailClose, NOW).0,
        set(&["10.0.0.1:8000", "10.0.0.2:8000"])
    );
    // 300 ms later b is past the 1 s bound; 1.1 s later both are.
    assert_eq!(
        agree(&pool, FailureMode::FailClose, NOW + 300).0,
        set(&["10.0.0.1:8000"])
    );
    assert_eq!(
        agree(&pool, FailureMode::FailClose, NOW + 1_100).1,
        set(&["stale_metrics"])
    );
    assert_eq!(
        agree(&pool, FailureMode::FailOpen, NOW + 1_100).0,
        set(&["10.0.0.1:8000", "10.0.0.2:8000"])
    );
}

#[test]
fn the_record_names_each_endpoints_class_and_the_selection() {
    let pool = [
        ep("10.0.0.1:8000", 0.2, NOW - 5_000),
        dead(ep("10.0.0.2:8000", 0.1, NOW)),
        unscraped(ep("10.0.0.3:8000", 0.1, NOW)),
    ];
    let record = explained(&pool, FailureMode::FailOpen, &tied(), NOW, 0);
    assert_eq!(record["selection"], "degraded");
    let classes: Vec<&str> = record["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["class"].as_str())
        .collect();
    assert_eq!(classes, ["unknown", "dead", "unscraped"]);
    let rejected = explained(&pool, FailureMode::FailClose, &tied(), NOW, 0);
    assert_eq!(rejected["picked"], Value::Null);
    assert_eq!(rejected["rejected"], "stale_metrics");
    assert!(rejected["message"]
        .as_str()
        .is_some_and(|m| m.contains("stale")));
}
