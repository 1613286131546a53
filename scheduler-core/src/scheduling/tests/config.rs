//! Config parsing and compilation: defaults, and errors that name the culprit.

use alloc::string::ToString;

use super::super::plugins::{
    Filter, Picker, PickerKind, PrefixCacheScorer, Scorer, UtilizationMetric,
};
use super::super::{ConfigError, EndpointPickerConfig, Scheduler};
use super::sched;
use crate::metrics::{CacheConfig, EndpointMetrics};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn err(json: &str) -> ConfigError {
    match Scheduler::from_json_str(json) {
        Ok(_) => panic!("config accepted: {json}"),
        Err(e) => e,
    }
}

#[test]
fn full_config_compiles_with_defaults_for_name_and_weight() {
    let s = sched(
        r#"{
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "approx-prefix-cache-producer", "parameters": {"blockSizeTokens": 16}},
            {"type": "utilization-filter", "name": "hot",
             "parameters": {"conditions": [{"metric": "kv-cache-utilization", "maxValue": 0.9},
                                           {"metric": "waiting-queue", "maxValue": 20}]}},
            {"type": "prefix-cache-scorer"},
            {"type": "queue-scorer"},
            {"type": "weighted-random-picker", "parameters": {"maxFallbacks": 1}}
        ],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "hot"}, {"pluginRef": "prefix-cache-scorer", "weight": 3},
            {"pluginRef": "queue-scorer"}, {"pluginRef": "weighted-random-picker"}]}],
        "flowControl": {"maxRequests": 10}
    }"#,
    );
    let p = &s.profiles()[0];
    assert_eq!(p.filters[0].name, "hot");
    let Filter::Utilization(u) = &p.filters[0].plugin else {
        panic!("not a utilization filter")
    };
    assert_eq!(u.conditions[1].metric, UtilizationMetric::WaitingQueue);
    assert_eq!(u.conditions[1].max_value, 20.0);
    assert!(!u.fallback_on_empty);
    assert_eq!(
        p.scorers[0].step.plugin,
        Scorer::PrefixCache(PrefixCacheScorer::default())
    );
    assert_eq!(p.scorers[0].weight, 3.0);
    assert_eq!(p.scorers[1].step.name, "queue-scorer");
    assert_eq!(p.scorers[1].weight, 1.0);
    assert_eq!(
        p.picker.plugin,
        Picker {
            kind: PickerKind::WeightedRandom,
            max_fallbacks: 1
        }
    );
    assert_eq!(s.prefix_config().block_size_tokens, 16);
    assert_eq!(s.prefix_config().max_prefix_tokens_to_match, 131_072);
    assert!(s.uses_prefix_index());
    assert_eq!(
        s.flow_control().and_then(|f| f["maxRequests"].as_u64()),
        Some(10)
    );
}

#[test]
fn no_config_means_one_profile_with_max_score_picker() {
    for s in [sched("{}"), Scheduler::default()] {
        assert_eq!(s.profiles().len(), 1);
        assert_eq!(s.profiles()[0].name, "default");
        assert!(s.profiles()[0].scorers.is_empty());
        assert_eq!(s.profiles()[0].picker.plugin, Picker::DEFAULT);
        assert!(!s.uses_prefix_index());
    }
}

#[test]
fn no_profiles_means_every_declared_plugin_in_order() {
    let s = sched(
        r#"{"plugins": [{"type": "kv-cache-utilization-scorer"}, {"type": "queue-scorer"}, {"type": "random-picker"}]}"#,
    );
    let p = &s.profiles()[0];
    assert_eq!(p.scorers.len(), 2);
    assert_eq!(p.scorers[1].step.plugin, Scorer::Queue);
    assert_eq!(p.picker.plugin.kind, PickerKind::Random);
}

#[test]
fn unknown_plugin_type_is_named() {
    let e = err(r#"{"plugins": [{"type": "magic-scorer", "name": "m"}]}"#);
    assert_eq!(
        e,
        ConfigError::UnknownPluginType {
            plugin: "m".into(),
            plugin_type: "magic-scorer".into()
        }
    );
    assert!(e.to_string().contains("magic-scorer"));
}

#[test]
fn dangling_plugin_ref_is_named() {
    let e = err(r#"{"plugins": [{"type": "queue-scorer"}],
        "schedulingProfiles": [{"name": "p1", "plugins": [{"pluginRef": "queue-scorer"}, {"pluginRef": "nope"}]}]}"#);
    assert_eq!(
        e,
        ConfigError::DanglingPluginRef {
            profile: "p1".into(),
            plugin_ref: "nope".into()
        }
    );
}

fn bad_param(json: &str) -> (alloc::string::String, alloc::string::String) {
    match err(json) {
        ConfigError::BadParameter {
            plugin, parameter, ..
        } => (plugin, parameter),
        other => panic!("expected BadParameter, got {other:?}"),
    }
}

#[test]
fn bad_parameters_name_plugin_and_parameter() {
    let cases = [
        (
            r#"{"type": "prefix-cache-affinity-filter", "name": "aff", "parameters": {"threshold": 1.5}}"#,
            "aff",
            "threshold",
        ),
        (
            r#"{"type": "prefix-cache-affinity-filter", "parameters": {"threshold": "high"}}"#,
            "prefix-cache-affinity-filter",
            "threshold",
        ),
        (
            r#"{"type": "prefix-cache-affinity-filter", "parameters": {"prefillTokensPerSecond": 0}}"#,
            "prefix-cache-affinity-filter",
            "prefillTokensPerSecond",
        ),
        (
            r#"{"type": "queue-scorer", "parameters": {"speed": 1}}"#,
            "queue-scorer",
            "speed",
        ),
        (
            r#"{"type": "approx-prefix-cache-producer", "parameters": {"blockSizeTokens": 0}}"#,
            "approx-prefix-cache-producer",
            "blockSizeTokens",
        ),
        (
            r#"{"type": "approx-prefix-cache-producer", "parameters": {"blockSize": 16}}"#,
            "approx-prefix-cache-producer",
            "blockSize",
        ),
        (
            r#"{"type": "utilization-filter", "name": "u", "parameters": {"conditions": [{"metric": "gpu", "maxValue": 1}]}}"#,
            "u",
            "conditions[0].metric",
        ),
        (
            r#"{"type": "utilization-filter", "name": "u", "parameters": {"conditions": [{"metric": "kv-cache-utilization", "maxValue": 0.5}, {"metric": "kv-cache-utilization", "maxValue": 2}]}}"#,
            "u",
            "conditions[1].maxValue",
        ),
        (
            r#"{"type": "utilization-filter", "name": "u", "parameters": {"conditions": [{"metric": "waiting-queue"}]}}"#,
            "u",
            "conditions[0].maxValue",
        ),
        (
            r#"{"type": "utilization-filter", "name": "u", "parameters": {"fallbackOnEmpty": "yes"}}"#,
            "u",
            "fallbackOnEmpty",
        ),
        (
            r#"{"type": "max-score-picker", "parameters": {"maxFallbacks": -1}}"#,
            "max-score-picker",
            "maxFallbacks",
        ),
        (
            r#"{"type": "random-picker", "parameters": [1]}"#,
            "random-picker",
            "parameters",
        ),
    ];
    for (plugin_json, plugin, parameter) in cases {
        let got = bad_param(&alloc::format!(r#"{{"plugins": [{plugin_json}]}}"#));
        assert_eq!(
            got,
            (plugin.to_string(), parameter.to_string()),
            "{plugin_json}"
        );
    }
}

#[test]
fn structural_errors() {
    assert!(matches!(
        err(r#"{"plugins": [{"type": "queue-scorer"}, {"type": "queue-scorer"}]}"#),
        ConfigError::DuplicatePluginName { plugin } if plugin == "queue-scorer"
    ));
    assert!(matches!(
        err(r#"{"plugins": [{"type": "random-picker"}, {"type": "max-score-picker"}]}"#),
        ConfigError::MultiplePickers { profile } if profile == "default"
    ));
    assert!(matches!(
        err(r#"{"plugins": [{"type": "queue-scorer"}], "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "queue-scorer", "weight": -1}]}]}"#),
        ConfigError::BadWeight { profile, plugin_ref } if profile == "p" && plugin_ref == "queue-scorer"
    ));
    assert!(matches!(
        err(r#"{"plugins": [{"type": "approx-prefix-cache-producer"}, {"type": "approx-prefix-cache-producer", "name": "b"}]}"#),
        ConfigError::MultiplePrefixProducers { plugin } if plugin == "b"
    ));
    assert!(matches!(
        err(r#"{"schedulingProfiles": [{"name": "p"}, {"name": "p"}]}"#),
        ConfigError::DuplicateProfile { profile } if profile == "p"
    ));
    assert!(matches!(err(r#"{"plugin": []}"#), ConfigError::Syntax(_)));
    assert!(matches!(err("not json"), ConfigError::Syntax(_)));
}

#[test]
fn from_value_accepts_a_converted_document() {
    let v = serde_json::json!({"plugins": [{"type": "queue-scorer", "name": "q"}],
        "schedulingProfiles": [{"name": "x", "plugins": [{"pluginRef": "q", "weight": 2}]}]});
    let s = match Scheduler::from_value(v.clone()) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(s.profiles()[0].scorers[0].weight, 2.0);
    // The document round-trips through its serde types.
    let cfg = EndpointPickerConfig::from_value(v).ok();
    assert_eq!(
        cfg.map(|c| c.plugins[0].effective_name().to_string()),
        Some("q".into())
    );
}

#[test]
fn lru_capacity_prefers_configured_then_kv_capacity() {
    let with_cache = EndpointMetrics {
        cache: Some(CacheConfig {
            block_size: 16,
            num_blocks: 8_000,
        }),
        ..EndpointMetrics::default()
    };
    let default = sched("{}");
    // 8000 engine blocks × 16 tokens ÷ 64 tokens per index block.
    assert_eq!(default.lru_capacity_for(Some(&with_cache)), 2_000);
    assert_eq!(default.lru_capacity_for(None), 31_250);
    let configured = sched(
        r#"{"plugins": [{"type": "approx-prefix-cache-producer", "parameters": {"lruCapacityPerServer": 77}}]}"#,
    );
    assert_eq!(configured.lru_capacity_for(Some(&with_cache)), 77);
}

#[test]
fn the_all_plugins_reference_declares_every_plugin_type() {
    // `testdata/epp/all-plugins.yaml` claims to list every plugin type (the CLI's explain
    // CLI test compiles and runs it); a type added to the catalogue must be added there too.
    // The disaggregation plugins are in `disagg.yaml` (a config has one profile handler),
    // the precise producer in `precise.yaml` (a config has one prefix producer).
    let yaml = alloc::format!(
        "{}\n{}\n{}",
        include_str!("../../../../testdata/epp/all-plugins.yaml"),
        include_str!("../../../../testdata/epp/disagg.yaml"),
        include_str!("../../../../testdata/epp/precise.yaml")
    );
    let declared: alloc::vec::Vec<&str> = yaml
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- type: "))
        .map(|rest| rest.split_whitespace().next().unwrap_or(""))
        .collect();
    for ty in super::super::PLUGIN_TYPES
        .iter()
        .chain(crate::flow::config::FLOW_PLUGIN_TYPES)
    {
        assert!(
            declared.contains(ty),
            "all-plugins.yaml / disagg.yaml / precise.yaml lack `{ty}`"
        );
    }
    for ty in &declared {
        assert!(
            super::super::PLUGIN_TYPES.contains(ty),
            "all-plugins.yaml declares `{ty}`, which is no plugin type"
        );
    }
}

#[test]
fn one_prefix_producer_approximate_or_precise() {
    let s = sched(
        r#"{"plugins": [{"type": "precise-prefix-cache-producer", "parameters": {"kvEventsPortOffset": 1000, "speculativeTtlMs": 500}},
        {"type": "prefix-cache-scorer"}]}"#,
    );
    let p = s.precise_settings().expect("precise settings");
    assert_eq!(p.speculative_ttl_ms, 500);
    assert_eq!(
        p.events_port,
        crate::prefix::precise::EventsPort::Offset(1000)
    );
    // Blocks of the engine's default size until the host learns the engine's.
    assert_eq!(s.prefix_config().block_size_tokens, 16);
    assert!(s.uses_prefix_index());
    assert!(sched(r#"{"plugins": [{"type": "prefix-cache-scorer"}]}"#)
        .precise_settings()
        .is_none());
    for both in [
        r#"{"plugins": [{"type": "approx-prefix-cache-producer"}, {"type": "precise-prefix-cache-producer"}]}"#,
        r#"{"plugins": [{"type": "precise-prefix-cache-producer"}, {"type": "approx-prefix-cache-producer"}]}"#,
        r#"{"plugins": [{"type": "precise-prefix-cache-producer"}, {"type": "precise-prefix-cache-producer", "name": "again"}]}"#,
    ] {
        assert!(
            matches!(
                Scheduler::from_json_str(both),
                Err(ConfigError::MultiplePrefixProducers { .. })
            ),
            "{both}"
        );
    }
    let err = Scheduler::from_json_str(
        r#"{"plugins": [{"type": "precise-prefix-cache-producer", "parameters": {"kvEventsPort": 1, "kvEventsPortOffset": 2}}]}"#,
    );
    assert!(err.is_err());
}
