//! Compiling the `flowControl` section: gates, defaults, references, errors with paths, and
//! the seed configuration.

use alloc::format;
use alloc::string::ToString;

use super::compile;
use crate::flow::config::{
    ConcurrencyMode, Detector, FairnessPolicy, FlowControlConfig, OrderingPolicy,
    UtilizationThresholds, DEFAULT_BAND_MAX_BYTES, DEFAULT_BAND_MAX_REQUESTS,
};
use crate::scheduling::config::{ConfigError, EndpointPickerConfig};
use crate::scheduling::plugins::{PrefixCacheScorer, Scorer};
use crate::scheduling::Scheduler;
use crate::types::Tokens;

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// The seed's `EndpointPickerConfig` (the JSON twin of `testdata/epp/seed-flow-control.yaml`).
const SEED: &str = include_str!("../../../../testdata/epp/seed-flow-control.json");

/// Declares every flow-control plugin under its type name, plus a scorer.
const PLUGINS: &str = r#""plugins": [
    {"type": "round-robin-fairness-policy"},
    {"type": "global-strict-fairness-policy"},
    {"type": "weighted-fairness-policy"},
    {"type": "fcfs-ordering-policy"},
    {"type": "edf-ordering-policy"},
    {"type": "queue-scorer"},
    {"type": "concurrency-detector", "parameters": {"maxConcurrency": "1k", "headroom": 0.5}},
    {"type": "utilization-detector", "name": "util",
     "parameters": {"queueDepthThreshold": 8, "kvCacheUtilThreshold": 0.9}}
]"#;

fn with_section(section: &str) -> Result<Option<FlowControlConfig>, ConfigError> {
    compile(&format!(
        r#"{{"featureGates": ["flowControl"], {PLUGINS}, "flowControl": {section}}}"#
    ))
}

fn fc(section: &str) -> FlowControlConfig {
    with_section(section)
        .expect("compiles")
        .expect("flow control on")
}

/// The error for `section`, as its Display text.
fn error(section: &str) -> alloc::string::String {
    match with_section(section) {
        Err(e) => e.to_string(),
        Ok(c) => panic!("{section} compiled: {c:?}"),
    }
}

#[test]
fn off_unless_the_feature_gate_names_flow_control() {
    assert_eq!(compile("{}"), Ok(None));
    assert_eq!(compile(r#"{"flowControl": {"maxRequests": 10}}"#), Ok(None));
    assert_eq!(compile(r#"{"featureGates": ["dataLayer"]}"#), Ok(None));
    assert_eq!(
        compile(r#"{"featureGates": ["flowControl=false"]}"#),
        Ok(None)
    );
    assert!(compile(r#"{"featureGates": ["flowControl=true"]}"#)
        .unwrap()
        .is_some());
    assert!(compile(r#"{"featureGates": ["flowControl"]}"#)
        .unwrap()
        .is_some());
    let e = compile(r#"{"featureGates": "flowControl"}"#).unwrap_err();
    assert!(e.to_string().starts_with("featureGates:"), "{e}");
    let e = compile(r#"{"featureGates": ["flowControl=maybe"]}"#).unwrap_err();
    assert!(e.to_string().starts_with("featureGates[0]:"), "{e}");
}

#[test]
fn an_absent_section_compiles_to_the_documented_defaults() {
    let c = compile(r#"{"featureGates": ["flowControl"]}"#)
        .unwrap()
        .unwrap();
    assert_eq!(c, FlowControlConfig::default());
    assert_eq!(c.max_requests, u64::MAX);
    assert_eq!(c.max_bytes, u64::MAX);
    assert_eq!(c.default_ttl_ms, 60_000);
    assert_eq!(c.detector, Detector::DEFAULT);
    assert_eq!(
        c.detector,
        Detector::Concurrency {
            max_concurrency: 100,
            mode: ConcurrencyMode::Requests,
            headroom: 0.0
        }
    );
    assert_eq!(c.bands.len(), 1);
    let b = &c.bands[0];
    assert_eq!(b.priority, 0);
    assert_eq!(b.fairness, FairnessPolicy::RoundRobin);
    assert_eq!(b.ordering, OrderingPolicy::Fcfs);
    assert_eq!(b.max_requests, DEFAULT_BAND_MAX_REQUESTS);
    assert_eq!(b.max_bytes, DEFAULT_BAND_MAX_BYTES);
    assert!(c.weights.is_empty());
    assert!(!c.enable_eviction);
}

#[test]
fn the_seed_compiles_as_scheduler_and_as_flow_control() {
    let cfg = EndpointPickerConfig::from_json_str(SEED).unwrap();
    let c = FlowControlConfig::compile(&cfg).unwrap().unwrap();
    // Verbatim: the platform's objects are accepted as they are, llm-d's match-length
    // parameters of `prefix-cache-scorer` included.
    let s = Scheduler::new(&cfg).expect("the seed compiles as a Scheduler");
    assert_eq!(
        s.profiles()[0].scorers[0].step.plugin,
        Scorer::PrefixCache(PrefixCacheScorer {
            match_length_weight: 0.3,
            match_length_scale: Tokens(8192),
        })
    );
    // The flow-control plugins are inert in profiles: the profile keeps its 2 filters,
    // 4 scorers and the picker.
    let p = &s.profiles()[0];
    assert_eq!(p.filters.len(), 2);
    assert_eq!(p.scorers.len(), 4);
    assert_eq!(c.max_bytes, 10 << 30);
    assert_eq!(c.max_requests, 1000);
    assert_eq!(c.default_ttl_ms, 60_000);
    assert_eq!(
        c.detector,
        Detector::Concurrency {
            max_concurrency: 128,
            mode: ConcurrencyMode::Requests,
            headroom: 0.0
        }
    );
    let bands: alloc::vec::Vec<_> = c
        .bands
        .iter()
        .map(|b| {
            (
                b.priority,
                b.max_requests,
                b.max_bytes,
                b.fairness,
                b.ordering,
            )
        })
        .collect();
    let rr = FairnessPolicy::RoundRobin;
    let fcfs = OrderingPolicy::Fcfs;
    assert_eq!(
        bands,
        [
            (100, 500, 10 << 30, rr, fcfs),
            (0, 200, 10 << 30, rr, fcfs),
            (-10, 50, 10 << 30, rr, fcfs)
        ]
    );
}

#[test]
fn the_seed_yaml_and_its_json_twin_agree() {
    // The YAML is for the harness; the tests read the JSON. Spot-check that they are the
    // same document: every flow-control value of the JSON appears in the YAML.
    let yaml = include_str!("../../../../testdata/epp/seed-flow-control.yaml");
    for needle in [
        "maxBytes: \"10Gi\"",
        "maxRequests: \"1k\"",
        "defaultRequestTTL: \"60s\"",
        "pluginRef: concurrency-detector",
        "- priority: 100",
        "maxRequests: \"500\"",
        "- priority: -10",
        "maxConcurrency: 128",
    ] {
        assert!(yaml.contains(needle), "{needle}");
    }
    assert!(SEED.contains("\"10Gi\"") && SEED.contains("\"1k\""));
}

#[test]
fn limits_parse_quantities_and_zero_means_unset() {
    let c = fc(
        r#"{"maxBytes": "1Gi", "maxRequests": 300, "priorityBands": [
        {"priority": 1, "maxRequests": "2", "maxBytes": "1Mi"},
        {"priority": 0},
        {"priority": -1, "maxRequests": 0, "maxBytes": "0"}]}"#,
    );
    assert_eq!((c.max_bytes, c.max_requests), (1 << 30, 300));
    assert_eq!(
        (c.bands[0].max_requests, c.bands[0].max_bytes),
        (2, 1 << 20)
    );
    // Unset or 0: the global limit.
    assert_eq!(
        (c.bands[1].max_requests, c.bands[1].max_bytes),
        (300, 1 << 30)
    );
    assert_eq!(
        (c.bands[2].max_requests, c.bands[2].max_bytes),
        (300, 1 << 30)
    );
    // No global limit: 0 means none, and the bands get llm-d's defaults.
    let c = fc(r#"{"maxBytes": 0, "maxRequests": "0", "priorityBands": [{"priority": 3}]}"#);
    assert_eq!((c.max_bytes, c.max_requests), (u64::MAX, u64::MAX));
    assert_eq!(
        (c.bands[0].max_requests, c.bands[0].max_bytes),
        (DEFAULT_BAND_MAX_REQUESTS, DEFAULT_BAND_MAX_BYTES)
    );
}

#[test]
fn ttl_accepts_durations_and_seconds_and_zero_means_none() {
    assert_eq!(
        fc(r#"{"defaultRequestTTL": "1m30s"}"#).default_ttl_ms,
        90_000
    );
    assert_eq!(fc(r#"{"defaultRequestTTL": 2}"#).default_ttl_ms, 2_000);
    assert_eq!(fc(r#"{"defaultRequestTTL": "0s"}"#).default_ttl_ms, 0);
    let e = error(r#"{"defaultRequestTTL": "soon"}"#);
    assert!(e.starts_with("flowControl.defaultRequestTTL: "), "{e}");
}

#[test]
fn bands_are_sorted_highest_first_and_resolve_their_policies() {
    let c = fc(r#"{"priorityBands": [
        {"priority": -5, "fairnessPolicyRef": "global-strict-fairness-policy",
         "orderingPolicyRef": "edf-ordering-policy"},
        {"priority": 50, "fairnessPolicyRef": "weighted-fairness-policy"},
        {"priority": 0, "orderingPolicyRef": "fcfs-ordering-policy"}]}"#);
    let got: alloc::vec::Vec<_> = c
        .bands
        .iter()
        .map(|b| (b.priority, b.fairness, b.ordering))
        .collect();
    assert_eq!(
        got,
        [
            (50, FairnessPolicy::Weighted, OrderingPolicy::Fcfs),
            (0, FairnessPolicy::RoundRobin, OrderingPolicy::Fcfs),
            (-5, FairnessPolicy::GlobalStrict, OrderingPolicy::Edf),
        ]
    );
    // An empty list is the same as none: one band of priority 0.
    let c = fc(r#"{"priorityBands": []}"#);
    assert_eq!(c.bands.len(), 1);
    assert_eq!(c.bands[0].priority, 0);
}

#[test]
fn named_plugin_instances_are_referenced_by_name() {
    let c = compile(
        r#"{"featureGates": ["flowControl"], "plugins": [
            {"type": "weighted-fairness-policy", "name": "fair"},
            {"type": "edf-ordering-policy", "name": "deadline"}],
          "flowControl": {"priorityBands": [
            {"priority": 0, "fairnessPolicyRef": "fair", "orderingPolicyRef": "deadline"}]}}"#,
    )
    .unwrap()
    .unwrap();
    assert_eq!(c.bands[0].fairness, FairnessPolicy::Weighted);
    assert_eq!(c.bands[0].ordering, OrderingPolicy::Edf);
    // The type is not a name once the instance is named.
    let e = compile(
        r#"{"featureGates": ["flowControl"], "plugins": [
            {"type": "weighted-fairness-policy", "name": "fair"}],
          "flowControl": {"priorityBands": [
            {"priority": 0, "fairnessPolicyRef": "weighted-fairness-policy"}]}}"#,
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("flowControl.priorityBands[0].fairnessPolicyRef: names no declared"),
        "{e}"
    );
}

#[test]
fn dangling_and_wrong_kind_references_name_their_path() {
    let e = error(
        r#"{"priorityBands": [{"priority": 1}, {"priority": 0, "fairnessPolicyRef": "nope"}]}"#,
    );
    assert_eq!(
        e,
        "flowControl.priorityBands[1].fairnessPolicyRef: names no declared plugin (`nope`)"
    );
    let e = error(
        r#"{"priorityBands": [{"priority": 0, "orderingPolicyRef": "round-robin-fairness-policy"}]}"#,
    );
    assert_eq!(
        e,
        "flowControl.priorityBands[0].orderingPolicyRef: `round-robin-fairness-policy` is a fairness policy, not an ordering policy"
    );
    let e = error(r#"{"priorityBands": [{"priority": 0, "fairnessPolicyRef": "queue-scorer"}]}"#);
    assert!(
        e.contains("`queue-scorer` is a `queue-scorer`, not a fairness policy"),
        "{e}"
    );
    let e = error(r#"{"saturationDetector": {"pluginRef": "fcfs-ordering-policy"}}"#);
    assert!(
        e.starts_with("flowControl.saturationDetector.pluginRef: `fcfs-ordering-policy` is an ordering policy"),
        "{e}"
    );
    let e = error(r#"{"saturationDetector": {"pluginRef": "missing"}}"#);
    assert!(
        e.starts_with("flowControl.saturationDetector.pluginRef: names no declared plugin"),
        "{e}"
    );
    let e = error(r#"{"priorityBands": [{"priority": 0, "fairnessPolicyRef": 3}]}"#);
    assert!(e.contains("must be a plugin name"), "{e}");
}

#[test]
fn unknown_keys_are_errors_naming_the_path() {
    assert_eq!(
        error(r#"{"priorityBands": [{"priority": 1}, {"priority": 0, "burst": 3}]}"#),
        "flowControl.priorityBands[1].burst: unknown field (known: priority, maxRequests, maxBytes, fairnessPolicyRef, orderingPolicyRef)"
    );
    assert!(error(r#"{"maxRequest": 3}"#).starts_with("flowControl.maxRequest: unknown field"));
    assert!(error(r#"{"saturationDetector": {"ref": "x"}}"#)
        .starts_with("flowControl.saturationDetector.ref: unknown field"));
    assert!(error(r#"{"flows": [{"fairnessId": "a", "weigth": 3}]}"#)
        .starts_with("flowControl.flows[0].weigth: unknown field"));
}

#[test]
fn malformed_values_are_errors_naming_the_path() {
    for (section, path) in [
        (r#"{"maxBytes": "lots"}"#, "flowControl.maxBytes: "),
        (r#"{"maxRequests": -1}"#, "flowControl.maxRequests: "),
        (
            r#"{"priorityBands": {"priority": 0}}"#,
            "flowControl.priorityBands: ",
        ),
        (
            r#"{"priorityBands": [3]}"#,
            "flowControl.priorityBands[0]: ",
        ),
        (
            r#"{"priorityBands": [{}]}"#,
            "flowControl.priorityBands[0].priority: ",
        ),
        (
            r#"{"priorityBands": [{"priority": 1.5}]}"#,
            "flowControl.priorityBands[0].priority: ",
        ),
        (
            r#"{"priorityBands": [{"priority": 3000000000}]}"#,
            "flowControl.priorityBands[0].priority: ",
        ),
        (
            r#"{"priorityBands": [{"priority": 0, "maxBytes": "1.5"}]}"#,
            "flowControl.priorityBands[0].maxBytes: ",
        ),
        (
            r#"{"priorityBands": [{"priority": 2}, {"priority": 2}]}"#,
            "flowControl.priorityBands[1].priority: ",
        ),
        (
            r#"{"flows": [{"weight": 2}]}"#,
            "flowControl.flows[0].fairnessId: ",
        ),
        (
            r#"{"flows": [{"fairnessId": ""}]}"#,
            "flowControl.flows[0].fairnessId: ",
        ),
        (
            r#"{"flows": [{"fairnessId": "a", "weight": 0}]}"#,
            "flowControl.flows[0].weight: ",
        ),
        (
            r#"{"flows": [{"fairnessId": "a", "weight": 1.5}]}"#,
            "flowControl.flows[0].weight: ",
        ),
        (
            r#"{"flows": [{"fairnessId": "a", "weight": -2}]}"#,
            "flowControl.flows[0].weight: ",
        ),
        (
            r#"{"flows": [{"fairnessId": "a"}, {"fairnessId": "a"}]}"#,
            "flowControl.flows[1].fairnessId: ",
        ),
        (
            r#"{"enableEviction": "yes"}"#,
            "flowControl.enableEviction: ",
        ),
        (
            r#"{"saturationDetector": "concurrency-detector"}"#,
            "flowControl.saturationDetector: ",
        ),
        ("[]", "flowControl: "),
    ] {
        let e = error(section);
        assert!(e.starts_with(path), "{section}: {e}");
    }
    let e = error(r#"{"priorityBands": [{"priority": 2}, {"priority": 2}]}"#);
    assert!(e.contains("more than one band"), "{e}");
}

#[test]
fn flows_weights_and_eviction() {
    let c = fc(
        r#"{"flows": [{"fairnessId": "a", "weight": 3}, {"fairnessId": "b"}],
                   "enableEviction": true}"#,
    );
    assert_eq!(c.weights, [("a".into(), 3), ("b".into(), 1)]);
    assert_eq!(c.weight_of("a"), 3);
    assert_eq!(c.weight_of("b"), 1);
    assert_eq!(c.weight_of("other"), 1);
    assert!(c.enable_eviction);
}

#[test]
fn the_detector_is_the_referenced_one_else_the_first_declared_else_the_default() {
    let c = fc(r#"{"saturationDetector": {"pluginRef": "util"}}"#);
    assert_eq!(
        c.detector,
        Detector::Utilization(UtilizationThresholds {
            queue_depth: 8.0,
            kv_cache_utilization: 0.9
        })
    );
    // None named: the first detector declared.
    let c = fc("{}");
    assert_eq!(
        c.detector,
        Detector::Concurrency {
            max_concurrency: 1000,
            mode: ConcurrencyMode::Requests,
            headroom: 0.5
        }
    );
    // An empty pluginRef is the same as none.
    assert_eq!(
        fc(r#"{"saturationDetector": {"pluginRef": ""}}"#).detector,
        c.detector
    );
    // llm-d's deprecated top-level field.
    let c = compile(
        r#"{"featureGates": ["flowControl"], "saturationDetector": {"pluginRef": "u"},
            "plugins": [{"type": "concurrency-detector"}, {"type": "utilization-detector", "name": "u"}]}"#,
    )
    .unwrap()
    .unwrap();
    assert!(matches!(c.detector, Detector::Utilization(_)));
    // Nothing declared: the default concurrency detector.
    let c = compile(r#"{"featureGates": ["flowControl"], "flowControl": {}}"#)
        .unwrap()
        .unwrap();
    assert_eq!(c.detector, Detector::DEFAULT);
}

fn plugin_error(plugin: &str) -> ConfigError {
    compile(&format!(
        r#"{{"featureGates": ["flowControl"], "plugins": [{plugin}]}}"#
    ))
    .unwrap_err()
}

fn detector_of(plugin: &str) -> Detector {
    compile(&format!(
        r#"{{"featureGates": ["flowControl"], "plugins": [{plugin}]}}"#
    ))
    .unwrap()
    .unwrap()
    .detector
}

#[test]
fn detector_parameters_are_checked() {
    assert_eq!(
        detector_of(
            r#"{"type": "concurrency-detector", "parameters": {"maxConcurrency": "2k", "concurrencyMode": "requests"}}"#
        ),
        Detector::Concurrency {
            max_concurrency: 2000,
            mode: ConcurrencyMode::Requests,
            headroom: 0.0
        }
    );
    assert_eq!(
        detector_of(
            r#"{"type": "concurrency-detector", "parameters": {"concurrencyMode": "tokens"}}"#
        ),
        Detector::Concurrency {
            max_concurrency: 1_000_000,
            mode: ConcurrencyMode::Tokens,
            headroom: 0.0
        }
    );
    assert_eq!(
        detector_of(
            r#"{"type": "concurrency-detector", "parameters": {"concurrencyMode": "tokens", "maxConcurrency": 5000}}"#
        ),
        Detector::Concurrency {
            max_concurrency: 5000,
            mode: ConcurrencyMode::Tokens,
            headroom: 0.0
        }
    );
    assert_eq!(
        detector_of(
            r#"{"type": "concurrency-detector", "parameters": {"concurrencyMode": "tokens", "maxConcurrency": 64, "maxTokenConcurrency": "80k"}}"#
        ),
        Detector::Concurrency {
            max_concurrency: 80_000,
            mode: ConcurrencyMode::Tokens,
            headroom: 0.0
        }
    );
    assert_eq!(
        detector_of(r#"{"type": "utilization-detector"}"#),
        Detector::Utilization(UtilizationThresholds {
            queue_depth: 5.0,
            kv_cache_utilization: 0.8
        })
    );
    assert!(matches!(
        detector_of(
            r#"{"type": "utilization-detector", "parameters": {"headroom": 0.2, "metricsStalenessThreshold": "200ms"}}"#
        ),
        Detector::Utilization(_)
    ));
    for (plugin, parameter) in [
        (
            r#"{"type": "concurrency-detector", "parameters": {"maxConcurrency": 0}}"#,
            "maxConcurrency",
        ),
        (
            r#"{"type": "concurrency-detector", "parameters": {"maxConcurrency": "x"}}"#,
            "maxConcurrency",
        ),
        (
            r#"{"type": "concurrency-detector", "parameters": {"concurrencyMode": "hybrid"}}"#,
            "concurrencyMode",
        ),
        (
            r#"{"type": "concurrency-detector", "parameters": {"headroom": -0.1}}"#,
            "headroom",
        ),
        (
            r#"{"type": "concurrency-detector", "parameters": {"burst": 1}}"#,
            "burst",
        ),
        (
            r#"{"type": "utilization-detector", "parameters": {"queueDepthThreshold": 0}}"#,
            "queueDepthThreshold",
        ),
        (
            r#"{"type": "utilization-detector", "parameters": {"kvCacheUtilThreshold": 1.5}}"#,
            "kvCacheUtilThreshold",
        ),
        (
            r#"{"type": "utilization-detector", "parameters": {"kvCacheUtilThreshold": 0}}"#,
            "kvCacheUtilThreshold",
        ),
        (
            r#"{"type": "utilization-detector", "parameters": {"metricsStalenessThreshold": "0s"}}"#,
            "metricsStalenessThreshold",
        ),
        (
            r#"{"type": "utilization-detector", "parameters": {"queueDepth": 3}}"#,
            "queueDepth",
        ),
        (
            r#"{"type": "round-robin-fairness-policy", "parameters": {"x": 1}}"#,
            "x",
        ),
        (
            r#"{"type": "weighted-fairness-policy", "parameters": {"weights": {}}}"#,
            "weights",
        ),
        (
            r#"{"type": "edf-ordering-policy", "parameters": {"x": 1}}"#,
            "x",
        ),
    ] {
        match plugin_error(plugin) {
            ConfigError::BadParameter { parameter: p, .. } => assert_eq!(p, parameter, "{plugin}"),
            other => panic!("{plugin}: {other:?}"),
        }
    }
}

#[test]
fn flow_plugins_compile_in_a_scheduler_and_are_inert_in_profiles() {
    let s = Scheduler::from_json_str(&format!(
        r#"{{{PLUGINS}, "schedulingProfiles": [{{"name": "p", "plugins": [
            {{"pluginRef": "round-robin-fairness-policy"}}, {{"pluginRef": "util"}},
            {{"pluginRef": "queue-scorer"}}]}}]}}"#
    ))
    .unwrap();
    assert!(s.profiles()[0].filters.is_empty());
    assert_eq!(s.profiles()[0].scorers.len(), 1);
    // No profiles: the synthesized one ignores them too.
    let s = Scheduler::from_json_str(&format!("{{{PLUGINS}}}")).unwrap();
    assert_eq!(s.profiles()[0].scorers.len(), 1);
    // Their parameters are checked by the Scheduler as well.
    let e = Scheduler::from_json_str(
        r#"{"plugins": [{"type": "fcfs-ordering-policy", "parameters": {"x": 1}}]}"#,
    )
    .unwrap_err();
    assert!(matches!(e, ConfigError::BadParameter { .. }), "{e:?}");
}

#[test]
fn duplicate_plugin_names_are_refused_here_too() {
    let e = compile(
        r#"{"featureGates": ["flowControl"], "plugins": [
            {"type": "fcfs-ordering-policy"}, {"type": "fcfs-ordering-policy"}]}"#,
    )
    .unwrap_err();
    assert_eq!(
        e,
        ConfigError::DuplicatePluginName {
            plugin: "fcfs-ordering-policy".into()
        }
    );
}

#[test]
fn the_config_and_the_queues_place_a_priority_in_the_same_band() {
    let c = fc(r#"{"priorityBands": [{"priority": 100}, {"priority": 0}, {"priority": -10}]}"#);
    let queues: crate::flow::FlowQueues<()> = crate::flow::FlowQueues::new(&c);
    for (priority, band) in [
        (1000, 100),
        (100, 100),
        (99, 0),
        (0, 0),
        (-1, -10),
        (-10, -10),
        (i32::MIN, -10),
    ] {
        assert_eq!(c.band_for(priority), band, "{priority}");
        assert_eq!(queues.band_for(priority), band, "{priority}");
    }
}
