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
    match gateway_pick(pool, mode, epp, &json!({}), now, seed) {
        Ok((endpoint, _)) => endpoint,
        Err(label) => label,
    }
}

/// The gateway's pick and prefiller with the pool's `endpointRoles` `roles`, or the
/// rejection's stat label.
fn gateway_pick(
    pool: &[Endpoint],
    mode: FailureMode,
    epp: &Value,
    roles: &Value,
    now: u64,
    seed: u64,
) -> Result<(String, Option<String>), String> {
    let addresses: Vec<&str> = pool.iter().map(|e| e.address).collect();
    let state = PickerShared::from_json(json!({
        "pool": "p", "baseModel": "m", "endpoints": addresses,
        "failureMode": mode_name(mode), "staleAfterMs": 1000, "maxConsecutiveFailures": 3,
        "eppConfig": epp, "endpointRoles": roles,
    }))
    .unwrap();
    let snapshot = Snapshot {
        taken_at: Millis(now),
        clusters: Vec::new(),
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
        output_sequences: 1,
        session: None,
    };
    state
        .pick(&plan, &req, Millis(now), seed)
        .map(|picked| (picked.endpoint.clone(), picked.prefiller.clone()))
        .map_err(|rejection| rejection.label().to_owned())
}

/// `explain`'s record for the same pool, written as an operator would write the state.
fn explained(pool: &[Endpoint], mode: FailureMode, epp: &Value, now: u64, seed: u64) -> Value {
    explained_with_roles(pool, mode, epp, &json!({}), now, seed)
}

/// [`explained`] with the state's `endpoint_roles` `roles`.
fn explained_with_roles(
    pool: &[Endpoint],
    mode: FailureMode,
    epp: &Value,
    roles: &Value,
    now: u64,
    seed: u64,
) -> Value {
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
        endpoint_roles: serde_json::from_value(roles.clone()).unwrap(),
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
    serde_yaml_ng::from_str(&text).unwrap()
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
    assert_eq!(
        agree(&all_dead, FailureMode::FailClose, NOW).1,
        set(&["no_endpoints"])
    );
    // Every scrape failing says the metrics are unavailable, not the replicas: a FailOpen
    // pool is scheduled over every member.
    assert_eq!(
        agree(&all_dead, FailureMode::FailOpen, NOW).0,
        set(&["10.0.0.1:8000", "10.0.0.2:8000"])
    );
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

/// Every request disaggregated; the seed breaks the ties of both profiles.
fn always_disaggregate() -> Value {
    json!({
        "plugins": [
            {"type": "always-disagg-pd-decider"},
            {"type": "disagg-profile-handler", "parameters": {
                "profiles": {"decode": "decode", "prefill": "prefill"},
                "deciders": {"prefill": "always-disagg-pd-decider"}}},
            {"type": "max-score-picker"}
        ],
        "schedulingProfiles": [
            {"name": "decode", "plugins": [{"pluginRef": "max-score-picker"}]},
            {"name": "prefill", "plugins": [{"pluginRef": "max-score-picker"}]}
        ]
    })
}

#[test]
fn endpoint_roles_give_the_gateways_decode_pick_and_prefiller() {
    let pool = [
        ep("10.0.0.1:8000", 0.1, NOW),
        ep("10.0.0.2:8000", 0.1, NOW),
        ep("10.0.0.2:8001", 0.1, NOW),
        ep("10.0.0.3:8000", 0.1, NOW),
    ];
    // A bare IP gives both ranks of 10.0.0.2 their role; 10.0.0.3 is unnamed: both.
    let roles = json!({"10.0.0.1:8000": "prefill", "10.0.0.2": {"llm-d.ai/role": "decode"}});
    let epp = always_disaggregate();
    let (mut picks, mut prefillers) = (BTreeSet::new(), BTreeSet::new());
    for seed in 0..SEEDS {
        let record = explained_with_roles(&pool, FailureMode::FailClose, &epp, &roles, NOW, seed);
        let (picked, prefiller) =
            gateway_pick(&pool, FailureMode::FailClose, &epp, &roles, NOW, seed).unwrap();
        assert_eq!(record["picked"], picked.as_str(), "seed {seed}: {record:#}");
        assert_eq!(
            record["prefiller"],
            json!(prefiller),
            "seed {seed}: {record:#}"
        );
        picks.insert(picked);
        prefillers.extend(prefiller);
    }
    // Decode never lands on the prefill-only endpoint, prefill never on a decode-only one.
    assert_eq!(
        picks,
        set(&["10.0.0.2:8000", "10.0.0.2:8001", "10.0.0.3:8000"])
    );
    assert_eq!(prefillers, set(&["10.0.0.1:8000", "10.0.0.3:8000"]));
    let record = explained_with_roles(&pool, FailureMode::FailClose, &epp, &roles, NOW, 0);
    let listed: Vec<&str> = record["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["role"].as_str())
        .collect();
    assert_eq!(listed, ["prefill", "decode", "decode", "both"]);
}

#[test]
fn endpoint_roles_naming_no_endpoint_are_an_error_naming_the_key() {
    let pool = [ep("10.0.0.1:8000", 0.1, NOW)];
    let state = State {
        endpoints: pool
            .iter()
            .map(|e| StateEndpoint {
                address: e.address.to_owned(),
                metrics: e.metrics.clone(),
                scraped_at_ms: Some(e.scraped_at),
                consecutive_failures: 0,
                in_snapshot: true,
                inflight: Default::default(),
            })
            .collect(),
        endpoint_roles: serde_json::from_value(json!({"10.0.0.9:8000": "prefill"})).unwrap(),
        ..State::default()
    };
    let scheduler = Scheduler::from_value(always_disaggregate()).unwrap();
    let err = decide(&scheduler, &state, PATH, &body(), 0, Millis(NOW)).unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("endpoint_roles") && text.contains("10.0.0.9:8000"),
        "{text}"
    );
}
