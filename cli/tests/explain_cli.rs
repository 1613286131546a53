//! `infergate explain` end to end: the built binary on the shipped example files.

// A test fails by panicking.
#![allow(clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn testdata(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata")
        .join(rel)
}

fn explain(config: &Path, state: &Path, request: &Path, extra: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .arg("explain")
        .arg("--config")
        .arg(config)
        .arg("--state")
        .arg(state)
        .arg("--request")
        .arg(request)
        .args(extra)
        .output();
    match out {
        Ok(o) => o,
        Err(e) => panic!("running infergate: {e}"),
    }
}

fn decision(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "infergate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    match serde_json::from_slice(&out.stdout) {
        Ok(v) => v,
        Err(e) => panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        ),
    }
}

/// A scratch file unique to this test process.
fn scratch(name: &str, text: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("infergate-explain-{}-{name}", std::process::id()));
    if let Err(e) = std::fs::write(&p, text) {
        panic!("writing {}: {e}", p.display());
    }
    p
}

fn shipped() -> (PathBuf, PathBuf, PathBuf) {
    (
        testdata("epp/default.yaml"),
        testdata("explain/state.json"),
        testdata("explain/request.json"),
    )
}

#[test]
fn shipped_example_is_picked_by_prefix_affinity() {
    let (config, state, request) = shipped();
    let d = decision(&explain(&config, &state, &request, &[]));
    assert_eq!(d["picked"], "10.0.0.2:8000");
    assert_eq!(d["fallbacks"], serde_json::json!(["10.0.0.1:8000"]));
    let p = &d["profiles"][0];
    // 10.0.0.3 is over the KV bound and dropped by the filter.
    assert_eq!(p["filters"][0]["plugin"], "utilization-filter");
    assert_eq!(
        p["filters"][0]["dropped"],
        serde_json::json!(["10.0.0.3:8000"])
    );
    // The earlier turn of the conversation was routed to 10.0.0.2: most of the prompt matches.
    assert_eq!(d["candidates"][1]["address"], "10.0.0.2:8000");
    let matched = d["candidates"][1]["prefix_matched_blocks"]
        .as_u64()
        .unwrap_or(0);
    let full = d["request"]["full_blocks"].as_u64().unwrap_or(0);
    assert!(
        matched >= 8 && matched < full,
        "matched {matched} of {full}"
    );
    let prefix = &p["scorers"][0];
    assert_eq!(prefix["type"], "prefix-cache-scorer");
    assert_eq!(prefix["scores"]["10.0.0.1:8000"]["raw"], 0.0);
    let raw = prefix["scores"]["10.0.0.2:8000"]["raw"]
        .as_f64()
        .unwrap_or(0.0);
    assert!((raw - matched as f64 / full as f64).abs() < 1e-12);
    // The less loaded 10.0.0.1 wins every other scorer.
    assert_eq!(p["scorers"][1]["scores"]["10.0.0.1:8000"]["raw"], 1.0);
    assert_eq!(p["scorers"][1]["scores"]["10.0.0.2:8000"]["raw"], 0.0);
    // Totals are the sums of the weighted scores.
    for addr in ["10.0.0.1:8000", "10.0.0.2:8000"] {
        let sum: f64 = (0..3)
            .map(|s| {
                p["scorers"][s]["scores"][addr]["weighted"]
                    .as_f64()
                    .unwrap_or(f64::NAN)
            })
            .sum();
        let total = p["totals"][addr].as_f64().unwrap_or(f64::NAN);
        assert!((sum - total).abs() < 1e-9, "{addr}: {sum} vs {total}");
    }
    assert!(p["totals"].get("10.0.0.3:8000").is_none());
}

#[test]
fn without_prefix_scorer_the_idle_endpoint_wins() {
    let (config, state, request) = shipped();
    let text = match std::fs::read_to_string(&config) {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    };
    let no_prefix = text.replace(
        "      - pluginRef: prefix-cache-scorer\n        weight: 3\n",
        "",
    );
    assert_ne!(no_prefix, text, "the shipped config changed shape");
    let config = scratch("no-prefix.yaml", &no_prefix);
    let d = decision(&explain(&config, &state, &request, &[]));
    assert_eq!(d["picked"], "10.0.0.1:8000");
}

#[test]
fn json_config_and_history_and_session_are_honoured() {
    let (_, _, request) = shipped();
    let config = scratch(
        "session.json",
        r#"{"plugins": [{"type": "session-affinity-scorer"}, {"type": "queue-scorer"}],
            "schedulingProfiles": [{"name": "s", "plugins": [{"pluginRef": "session-affinity-scorer", "weight": 5}, {"pluginRef": "queue-scorer"}]}]}"#,
    );
    let state = scratch(
        "session-state.json",
        r#"{"endpoints": [{"address": "a:1", "metrics": {"waiting": 0}}, {"address": "b:1", "metrics": {"waiting": 9}}],
            "last_endpoint_for_session": "b:1"}"#,
    );
    let d = decision(&explain(&config, &state, &request, &[]));
    assert_eq!(d["picked"], "b:1");
    assert_eq!(d["profile"], "s");
}

#[test]
fn every_plugin_reference_config_runs() {
    let (_, state, request) = shipped();
    let d = decision(&explain(
        &testdata("epp/all-plugins.yaml"),
        &state,
        &request,
        &["--seed", "7"],
    ));
    assert_eq!(d["picked"], "10.0.0.2:8000");
    assert_eq!(d["profiles"][1]["name"], "spread");
    assert_eq!(d["profiles"][0]["filters"][1]["outcome"]["note"], "sticky");
}

#[test]
fn completions_path_is_parsed_as_completions() {
    let (config, state, _) = shipped();
    let request = scratch("completion.json", r#"{"model": "m", "prompt": "hello"}"#);
    let d = decision(&explain(
        &config,
        &state,
        &request,
        &["--path", "/v1/completions"],
    ));
    assert_eq!(d["request"]["target_model"], "m");
    assert_eq!(d["request"]["full_blocks"], 0);
    // A non-string model is refused, naming the field.
    let bad = scratch("bad-model.json", r#"{"model": 5, "prompt": "hello"}"#);
    let out = explain(&config, &state, &bad, &["--path", "/v1/completions"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("model"));
}

#[test]
fn errors_go_to_stderr_with_a_non_zero_exit() {
    let (config, state, request) = shipped();
    let bad_config = scratch(
        "bad.json",
        r#"{"plugins": [{"type": "prefix-cache-affinity-filter", "name": "aff", "parameters": {"threshold": 3}}]}"#,
    );
    let out = explain(&bad_config, &state, &request, &[]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("aff") && err.contains("threshold"), "{err}");

    let dangling = scratch(
        "dangling.yaml",
        "plugins:\n  - type: queue-scorer\nschedulingProfiles:\n  - name: p\n    plugins:\n      - pluginRef: nope\n",
    );
    let err =
        String::from_utf8_lossy(&explain(&dangling, &state, &request, &[]).stderr).into_owned();
    assert!(err.contains("nope") && err.contains("pluginRef"), "{err}");

    let bad_request = scratch("bad-request.json", "{not json");
    let out = explain(&config, &state, &bad_request, &[]);
    assert!(!out.status.success());
    assert!(!out.stderr.is_empty());

    let missing = explain(
        &config,
        &testdata("explain/does-not-exist.json"),
        &request,
        &[],
    );
    assert!(!missing.status.success());
}

/// A pool of base `llama` with the two adapter versions, one per replica (one slot each):
/// the state file of README's adapter example, plus the pool's name and adapters for the
/// rewrite.
const ADAPTER_STATE: &str = r#"{
  "base_model": "llama",
  "adapters": ["support-assistant-v1", "support-assistant-v2"],
  "pool": "llama-70b-bf16",
  "endpoints": [
    {"address": "10.0.0.1:8000", "metrics": {"waiting": 0, "running": 1,
      "lora": {"max": 1, "running": ["support-assistant-v1"], "waiting": []}}},
    {"address": "10.0.0.2:8000", "metrics": {"waiting": 0, "running": 1,
      "lora": {"max": 1, "running": ["support-assistant-v2"], "waiting": []}}}
  ]
}"#;

const LORA_ONLY: &str = r#"{"plugins": [{"type": "lora-affinity-scorer"}],
  "schedulingProfiles": [{"name": "lora", "plugins": [{"pluginRef": "lora-affinity-scorer"}]}]}"#;

/// A sticky key the seed's 90/10 rule sends to `target`, found as the router finds it.
fn key_for(target: &str) -> String {
    use infergate_filters::rewrite::{choose_sticky, Target};
    let targets = [
        Target {
            model: "support-assistant-v1".into(),
            weight: 90,
        },
        Target {
            model: "support-assistant-v2".into(),
            weight: 10,
        },
    ];
    (0..10_000)
        .map(|i| format!("session-{i}"))
        .find(|k| {
            choose_sticky(k.as_bytes(), &targets).map(|i| targets[i].model.as_str()) == Some(target)
        })
        .unwrap_or_else(|| panic!("no key for {target}"))
}

#[test]
fn a_rewritten_request_is_explained_with_its_target_model() {
    let config = scratch("lora.json", LORA_ONLY);
    let state = scratch("adapter-state.json", ADAPTER_STATE);
    let request = scratch(
        "support.json",
        r#"{"model": "support-assistant", "messages": [{"role": "user", "content": "hi"}]}"#,
    );
    let rewrites = testdata("rewrite/inferencemodelrewrite.yaml");
    let rewrites = rewrites.to_string_lossy().into_owned();
    for (target, endpoint) in [
        ("support-assistant-v1", "10.0.0.1:8000"),
        ("support-assistant-v2", "10.0.0.2:8000"),
    ] {
        let key = key_for(target);
        let d = decision(&explain(
            &config,
            &state,
            &request,
            &["--rewrites", &rewrites, "--sticky-key", &key],
        ));
        assert_eq!(d["rewrite"]["model"], "support-assistant");
        assert_eq!(d["rewrite"]["target_model"], target);
        assert_eq!(d["rewrite"]["object"], "support-assistant");
        assert_eq!(d["rewrite"]["rule"], "spec.rules[0]");
        assert_eq!(d["rewrite"]["split"], "sticky");
        assert_eq!(d["request"]["target_model"], target);
        assert_eq!(d["picked"], endpoint, "{target}: {d}");
    }
    // A request for an adapter directly matches no rule: `rewrite` is null, and the adapter's
    // replica wins.
    let direct = scratch(
        "direct.json",
        r#"{"model": "support-assistant-v2", "messages": [{"role": "user", "content": "hi"}]}"#,
    );
    let d = decision(&explain(
        &config,
        &state,
        &direct,
        &["--rewrites", &rewrites],
    ));
    assert_eq!(d["rewrite"], Value::Null);
    assert_eq!(d["picked"], "10.0.0.2:8000");
    // Without `--rewrites` the key is absent; an invalid object fails naming its path.
    let d = decision(&explain(&config, &state, &direct, &[]));
    assert!(d.get("rewrite").is_none());
    let bad = testdata("rewrite/invalid/target-not-served.yaml");
    let out = explain(
        &config,
        &state,
        &request,
        &["--rewrites", &bad.to_string_lossy()],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("spec.rules[0].targets[1].modelRewrite"),
        "{err}"
    );
}

/// `base_model` tells an adapter request from a base-model one: without it, the adapter
/// name is taken for the base model and LoRA affinity is 1.0 on every replica.
#[test]
fn base_model_is_what_makes_an_adapter_request_one() {
    let config = scratch("lora2.json", LORA_ONLY);
    let request = scratch(
        "v2.json",
        r#"{"model": "support-assistant-v2", "messages": [{"role": "user", "content": "hi"}]}"#,
    );
    let with_base = scratch("with-base.json", ADAPTER_STATE);
    let d = decision(&explain(&config, &with_base, &request, &[]));
    let scores = &d["profiles"][0]["scorers"][0]["scores"];
    assert_eq!(scores["10.0.0.2:8000"]["raw"], 1.0, "{d}");
    assert_ne!(scores["10.0.0.1:8000"]["raw"], 1.0, "{d}");
    let mut state: Value = serde_json::from_str(ADAPTER_STATE).unwrap_or(Value::Null);
    if let Some(o) = state.as_object_mut() {
        o.remove("base_model");
    }
    let without = scratch("without-base.json", &state.to_string());
    let d = decision(&explain(&config, &without, &request, &[]));
    let scores = &d["profiles"][0]["scorers"][0]["scores"];
    assert_eq!(scores["10.0.0.1:8000"]["raw"], 1.0, "{d}");
    assert_eq!(scores["10.0.0.2:8000"]["raw"], 1.0, "{d}");
}

/// The prefill-only endpoint is the least loaded and the shortest queue, so a decision that
/// ignored the roles would send both phases to it.
const ROLES_STATE: &str = r#"{"endpoints": [
    {"address": "10.0.0.1:8000", "metrics": {"waiting": 0, "running": 0}},
    {"address": "10.0.0.2:8000", "metrics": {"waiting": 5, "running": 4}, "inflight": {"requests": 3, "tokens": 3000}},
    {"address": "10.0.0.3:8000", "metrics": {"waiting": 6, "running": 4}, "inflight": {"requests": 4, "tokens": 4000}}],
  "endpoint_roles": {"10.0.0.1:8000": "prefill", "10.0.0.2": "decode", "10.0.0.3:8000": {"llm-d.ai/role": "decode"}}}"#;

fn chat_of(content: &str) -> String {
    serde_json::json!({"model": "m", "messages": [{"role": "user", "content": content}]})
        .to_string()
}

#[test]
fn endpoint_roles_explain_a_disaggregating_config_as_the_gateway_routes_it() {
    let config = testdata("epp/disagg.yaml");
    let state = scratch("roles-state.json", ROLES_STATE);
    // About 1000 prompt tokens, none cached: the decider prefills elsewhere.
    let long = scratch(
        "roles-long.json",
        &chat_of(&"pack a tent, a stove and a map ".repeat(130)),
    );
    for seed in ["0", "1", "2", "3"] {
        let d = decision(&explain(&config, &state, &long, &["--seed", seed]));
        assert_eq!(d["picked"], "10.0.0.2:8000", "seed {seed}: {d}");
        assert_eq!(d["prefiller"], "10.0.0.1:8000", "seed {seed}: {d}");
        assert_eq!(d["disaggregation"]["verdict"], "prefill", "{d}");
    }
    let d = decision(&explain(&config, &state, &long, &[]));
    let roles: Vec<&str> = d["endpoints"]
        .as_array()
        .map(|list| list.iter().filter_map(|e| e["role"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(roles, ["prefill", "decode", "decode"], "{d}");
    // A short prompt is decoded where it lands, with no prefiller, still not on 10.0.0.1.
    let short = scratch("roles-short.json", &chat_of("is this tent waterproof?"));
    let d = decision(&explain(&config, &state, &short, &[]));
    assert_eq!(d["picked"], "10.0.0.2:8000", "{d}");
    assert_eq!(d["prefiller"], serde_json::Value::Null, "{d}");
    // Without the roles every endpoint serves both phases and the idle one takes the
    // request: the roles above are what kept it off 10.0.0.1.
    let text = ROLES_STATE
        .split(
            r#",
  "endpoint_roles""#,
        )
        .next()
        .unwrap_or_default()
        .to_owned()
        + "}";
    let without = scratch("roles-none.json", &text);
    let d = decision(&explain(&config, &without, &long, &[]));
    assert_eq!(d["picked"], "10.0.0.1:8000", "{d}");
    assert!(d["endpoints"][0].get("role").is_none(), "{d}");
}

#[test]
fn endpoint_roles_naming_no_endpoint_fail_with_the_key() {
    let state = scratch(
        "roles-bad.json",
        r#"{"endpoints": [{"address": "10.0.0.1:8000", "metrics": {"waiting": 0}}],
            "endpoint_roles": {"10.0.0.7:8000": "prefill"}}"#,
    );
    let request = scratch("roles-bad-request.json", &chat_of("hello"));
    let out = explain(&testdata("epp/disagg.yaml"), &state, &request, &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("endpoint_roles") && err.contains("10.0.0.7:8000"),
        "{err}"
    );
}
