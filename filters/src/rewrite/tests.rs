//! Compiling rewrite objects (the seed's, and every kind of mistake), rule order, and the
//! split's properties over many keys.

#![allow(clippy::unwrap_used, clippy::panic)]

use serde_json::{json, Value};

use super::*;

fn pools() -> Vec<PoolModels> {
    vec![
        PoolModels {
            name: "llama-70b-bf16".into(),
            base_model: "llama".into(),
            adapters: vec!["support-assistant-v1".into(), "support-assistant-v2".into()],
            block_size_tokens: None,
        },
        PoolModels {
            name: "qwen-pool".into(),
            base_model: "qwen".into(),
            adapters: vec!["sql-lora".into()],
            block_size_tokens: None,
        },
    ]
}

/// The seed's object, read from `testdata/rewrite/` as users write it.
fn seed() -> Value {
    let text = include_str!("../../../testdata/rewrite/inferencemodelrewrite.yaml");
    serde_yaml_ng::from_str(text).unwrap()
}

fn compile(objects: &[Value]) -> Result<Rewrites, RewriteError> {
    Rewrites::compile(objects, &pools())
}

fn error(objects: &[Value]) -> RewriteError {
    match compile(objects) {
        Ok(r) => panic!("compiled: {r:?}"),
        Err(e) => e,
    }
}

#[test]
fn the_seed_object_compiles_to_one_90_10_rule() {
    let r = compile(&[seed()]).unwrap();
    let rule = r.rule("llama", "support-assistant").unwrap();
    assert_eq!(rule.object, "support-assistant");
    assert_eq!(rule.path, "spec.rules[0]");
    assert_eq!(
        rule.targets,
        vec![
            Target {
                model: "support-assistant-v1".into(),
                weight: 90
            },
            Target {
                model: "support-assistant-v2".into(),
                weight: 10
            },
        ]
    );
    assert!(r.rule("llama", "llama").is_none());
    assert!(r.rule("qwen", "support-assistant").is_none());
    assert_eq!(
        r.aliases(),
        &[("support-assistant".to_owned(), "llama".to_owned())]
    );
    assert_eq!(
        r.targets(),
        vec!["support-assistant-v1", "support-assistant-v2"]
    );
}

/// The invalid objects under `testdata/rewrite/invalid/`, each with the path its error
/// must name.
#[test]
fn invalid_testdata_objects_name_their_path() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "unknown-field.yaml",
            include_str!("../../../testdata/rewrite/invalid/unknown-field.yaml"),
            "spec.rules[0].targets[1].percent",
        ),
        (
            "target-not-served.yaml",
            include_str!("../../../testdata/rewrite/invalid/target-not-served.yaml"),
            "spec.rules[0].targets[1].modelRewrite",
        ),
        (
            "all-weights-zero.yaml",
            include_str!("../../../testdata/rewrite/invalid/all-weights-zero.yaml"),
            "spec.rules[0].targets",
        ),
        (
            "unknown-pool.yaml",
            include_str!("../../../testdata/rewrite/invalid/unknown-pool.yaml"),
            "spec.poolRef.name",
        ),
        (
            "prefix-match.yaml",
            include_str!("../../../testdata/rewrite/invalid/prefix-match.yaml"),
            "spec.rules[0].matches[0].model.type",
        ),
    ];
    for (file, text, path) in cases {
        let value: Value = serde_yaml_ng::from_str(text).unwrap();
        let e = error(&[value]);
        assert_eq!(e.path(), *path, "{file}: {e}");
        assert!(e.to_string().contains(path), "{file}: {e}");
        assert!(e.object().contains("InferenceModelRewrite"), "{file}: {e}");
    }
}

fn object(name: &str, pool: &str, rules: Value) -> Value {
    json!({
        "apiVersion": "llm-d.ai/v1alpha2",
        "kind": "InferenceModelRewrite",
        "metadata": {"name": name, "namespace": "x", "labels": {"a": "b"}},
        "spec": {"poolRef": {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": pool},
                 "rules": rules},
        "status": {"conditions": []}
    })
}

#[test]
fn every_field_is_checked() {
    let rules = json!([{"targets": [{"modelRewrite": "support-assistant-v1"}]}]);
    let ok = object("a", "llama-70b-bf16", rules.clone());
    compile(std::slice::from_ref(&ok)).unwrap();
    let mut cases: Vec<(Value, &str)> = Vec::new();
    let mut v = ok.clone();
    v["spec"]["extra"] = json!(1);
    cases.push((v, "spec.extra"));
    let mut v = ok.clone();
    v["spec"]["poolRef"]["kind"] = json!("Service");
    cases.push((v, "spec.poolRef.kind"));
    let mut v = ok.clone();
    v["spec"]["poolRef"]["group"] = json!("apps");
    cases.push((v, "spec.poolRef.group"));
    let mut v = ok.clone();
    v["spec"]["poolRef"]["port"] = json!(80);
    cases.push((v, "spec.poolRef.port"));
    let mut v = ok.clone();
    v["spec"]["rules"][0]["targets"][0]["weight"] = json!(-1);
    cases.push((v, "spec.rules[0].targets[0].weight"));
    let mut v = ok.clone();
    v["spec"]["rules"][0]["targets"][0]["weight"] = json!(2.5);
    cases.push((v, "spec.rules[0].targets[0].weight"));
    let mut v = ok.clone();
    v["spec"]["rules"][0]["targets"][0]["weight"] = json!("10");
    cases.push((v, "spec.rules[0].targets[0].weight"));
    let mut v = ok.clone();
    v["spec"]["rules"][0]["targets"] = json!([]);
    cases.push((v, "spec.rules[0].targets"));
    let mut v = ok.clone();
    v["spec"]["rules"][0]["matches"] = json!([{"headers": []}]);
    cases.push((v, "spec.rules[0].matches[0].headers"));
    let mut v = ok.clone();
    v["spec"]["rules"][0]["matches"] = json!([{"model": {"type": "Exact"}}]);
    cases.push((v, "spec.rules[0].matches[0].model.value"));
    let mut v = ok.clone();
    v["spec"]["rules"][0]["matches"] = json!([{"model": {"value": "sql-lora"}}]);
    cases.push((v, "spec.rules[0].matches[0].model.value"));
    let mut v = ok.clone();
    v["spec"].as_object_mut().unwrap().remove("poolRef");
    cases.push((v, "spec.poolRef"));
    let mut v = ok.clone();
    v["apiVersion"] = json!("v1");
    cases.push((v, "apiVersion"));
    let mut v = ok.clone();
    v["kind"] = json!("InferenceModel");
    cases.push((v, "kind"));
    let mut v = ok.clone();
    v["extra"] = json!({});
    cases.push((v, "extra"));
    for (v, path) in cases {
        let e = error(&[v]);
        assert_eq!(e.path(), path, "{e}");
    }
    // Two objects of one name; an item that is not an object.
    let e = error(&[ok.clone(), ok.clone()]);
    assert!(matches!(e, RewriteError::Duplicate { .. }), "{e}");
    let e = error(&[json!(3)]);
    assert_eq!(e.object(), "modelRewrites[0]");
    // A null item (an empty YAML document) is skipped; other metadata and status ignored.
    compile(&[Value::Null, ok]).unwrap();
}

#[test]
fn a_matched_name_of_another_base_model_is_ambiguous() {
    let rules = json!([{"matches": [{"model": {"type": "Exact", "value": "sql-lora"}}],
                        "targets": [{"modelRewrite": "support-assistant-v1"}]}]);
    let e = error(&[object("a", "llama-70b-bf16", rules)]);
    assert_eq!(e.path(), "spec.rules[0].matches[0].model.value", "{e}");
    // The same alias for two base models is ambiguous too.
    let to_llama = json!([{"matches": [{"model": {"value": "alias"}}],
                           "targets": [{"modelRewrite": "support-assistant-v1"}]}]);
    let to_qwen = json!([{"matches": [{"model": {"value": "alias"}}],
                          "targets": [{"modelRewrite": "sql-lora"}]}]);
    let e = error(&[
        object("a", "llama-70b-bf16", to_llama),
        object("b", "qwen-pool", to_qwen),
    ]);
    assert!(matches!(e, RewriteError::Ambiguous { .. }), "{e}");
}

#[test]
fn exact_rules_of_every_object_come_before_match_all_ones() {
    let catch_all = object(
        "fallback",
        "llama-70b-bf16",
        json!([{"matches": [], "targets": [{"modelRewrite": "support-assistant-v1"}]}]),
    );
    let exact = object(
        "pin",
        "llama-70b-bf16",
        json!([
            {"matches": [{"model": {"value": "llama"}}], "targets": [{"modelRewrite": "support-assistant-v2"}]},
            {"matches": [{"model": {"value": "llama"}}], "targets": [{"modelRewrite": "llama"}]}
        ]),
    );
    // The match-all object is listed first, yet the later object's Exact rule wins.
    let r = compile(&[catch_all, exact]).unwrap();
    let rule = r.rule("llama", "llama").unwrap();
    assert_eq!(
        (rule.object.as_str(), rule.path.as_str()),
        ("pin", "spec.rules[0]")
    );
    // Everything else of the base model falls to the match-all rule; other bases do not.
    let rule = r.rule("llama", "support-assistant-v2").unwrap();
    assert_eq!(rule.object, "fallback");
    assert!(r.rule("qwen", "qwen").is_none());
    assert!(r.aliases().is_empty());
}

#[test]
fn yaml_weights_may_be_whole_floats_and_absent_weights_are_one() {
    let rules = json!([{"targets": [{"modelRewrite": "support-assistant-v1", "weight": 3.0},
                                    {"modelRewrite": "support-assistant-v2"}]}]);
    let r = compile(&[object("a", "llama-70b-bf16", rules)]).unwrap();
    let weights: Vec<u32> = r
        .rule("llama", "x")
        .unwrap()
        .targets
        .iter()
        .map(|t| t.weight)
        .collect();
    assert_eq!(weights, vec![3, 1]);
}

// ---- the split ----

fn targets(weights: &[(&str, u32)]) -> Vec<Target> {
    weights
        .iter()
        .map(|(m, w)| Target {
            model: (*m).to_owned(),
            weight: *w,
        })
        .collect()
}

fn key(i: u32) -> Vec<u8> {
    format!("session-{i}").into_bytes()
}

const KEYS: u32 = 20_000;

#[test]
fn sticky_shares_follow_the_weights() {
    for weights in [
        vec![("v1", 90), ("v2", 10)],
        vec![("a", 1), ("b", 1), ("c", 2)],
        vec![("a", 70), ("b", 30)],
    ] {
        let ts = targets(&weights);
        let total: u32 = weights.iter().map(|w| w.1).sum();
        let mut counts = vec![0u32; ts.len()];
        for i in 0..KEYS {
            counts[choose_sticky(&key(i), &ts).unwrap()] += 1;
        }
        for (j, (_, w)) in weights.iter().enumerate() {
            let want = f64::from(*w) / f64::from(total);
            let got = f64::from(counts[j]) / f64::from(KEYS);
            // 20k keys: one standard deviation is at most 0.35 points.
            assert!((got - want).abs() < 0.015, "{weights:?}: {counts:?}");
        }
    }
}

#[test]
fn a_key_always_gets_the_same_target() {
    let ts = targets(&[("v1", 90), ("v2", 10)]);
    for i in 0..1000 {
        let first = choose_sticky(&key(i), &ts);
        for _ in 0..3 {
            assert_eq!(choose_sticky(&key(i), &ts), first);
        }
        // Target order in the object does not matter either.
        let reversed = targets(&[("v2", 10), ("v1", 90)]);
        let name = |ts: &[Target], j: Option<usize>| j.map(|j| ts[j].model.clone());
        assert_eq!(
            name(&ts, first),
            name(&reversed, choose_sticky(&key(i), &reversed))
        );
    }
}

#[test]
fn raising_the_canary_moves_keys_only_onto_it() {
    let before = targets(&[("stable", 90), ("canary", 10)]);
    let after = targets(&[("stable", 80), ("canary", 20)]);
    let mut moved = 0;
    for i in 0..KEYS {
        let b = choose_sticky(&key(i), &before).unwrap();
        let a = choose_sticky(&key(i), &after).unwrap();
        if b == 1 {
            assert_eq!(a, 1, "key {i} left the canary");
        }
        moved += u32::from(a != b);
    }
    // About 10% of the keys move (from 10% to 20% on the canary).
    let share = f64::from(moved) / f64::from(KEYS);
    assert!((share - 0.10).abs() < 0.015, "{share}");
    // Raising 10 → 20 with the other weight unchanged moves keys only onto it too.
    let after = targets(&[("stable", 90), ("canary", 20)]);
    for i in 0..KEYS {
        if choose_sticky(&key(i), &before) == Some(1) {
            assert_eq!(choose_sticky(&key(i), &after), Some(1));
        }
    }
}

#[test]
fn a_weight_zero_target_is_never_chosen() {
    let ts = targets(&[("stable", 90), ("canary", 0)]);
    let draws = targets(&[("canary", 0), ("stable", 1)]);
    let mut rng = scheduler_core::scheduling::pick::SplitMix64::new(7);
    for i in 0..KEYS {
        assert_eq!(choose_sticky(&key(i), &ts), Some(0));
        assert_eq!(choose_by_draw(rng.next_u64(), &draws), Some(1));
    }
    assert_eq!(choose_sticky(b"k", &targets(&[("a", 0)])), None);
    assert_eq!(choose_by_draw(5, &targets(&[("a", 0)])), None);
    assert_eq!(
        choose_by_draw(u64::MAX, &targets(&[("a", 1), ("b", 1)])),
        Some(1)
    );
    assert_eq!(choose_by_draw(0, &targets(&[("a", 1), ("b", 1)])), Some(0));
}

#[test]
fn per_request_draws_follow_the_weights() {
    let ts = targets(&[("v1", 90), ("v2", 10)]);
    let mut rng = scheduler_core::scheduling::pick::SplitMix64::new(42);
    let n = 20_000u32;
    let v2 = (0..n)
        .filter(|_| choose_by_draw(rng.next_u64(), &ts) == Some(1))
        .count();
    let share = v2 as f64 / f64::from(n);
    assert!((share - 0.10).abs() < 0.015, "{share}");
}

#[test]
fn the_split_key_is_fixed_and_spreads() {
    assert_eq!(split_key(b"abc"), split_key(b"abc"));
    assert_ne!(split_key(b"abc"), split_key(b"abd"));
    // Envoy takes the value modulo the clusters' total weight: 70/30 over many keys.
    let on_first = (0..KEYS).filter(|i| split_key(&key(*i)) % 100 < 70).count();
    let share = on_first as f64 / f64::from(KEYS);
    assert!((share - 0.70).abs() < 0.015, "{share}");
}

proptest::proptest! {
    /// Whatever the weights: raising one target's weight moves keys only onto it, a weight 0
    /// target is never chosen, and a key's choice is the same every time.
    #[test]
    fn raising_a_weight_moves_keys_only_onto_its_target(
        weights in proptest::collection::vec(0u32..50, 2..6),
        raised in 0usize..6,
        by in 1u32..50,
        keys in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..24), 1..200),
    ) {
        let names: Vec<String> = (0..weights.len()).map(|i| format!("t{i}")).collect();
        let before: Vec<Target> = names
            .iter()
            .zip(&weights)
            .map(|(n, w)| Target { model: n.clone(), weight: *w })
            .collect();
        let raised = raised % before.len();
        let mut after = before.clone();
        after[raised].weight += by;
        for key in &keys {
            let b = choose_sticky(key, &before);
            let a = choose_sticky(key, &after);
            proptest::prop_assert_eq!(choose_sticky(key, &before), b);
            if let Some(b) = b {
                proptest::prop_assert!(before[b].weight > 0);
                proptest::prop_assert!(a == Some(b) || a == Some(raised), "{b} -> {a:?}");
            } else {
                proptest::prop_assert!(weights.iter().all(|w| *w == 0));
                proptest::prop_assert_eq!(a, Some(raised));
            }
        }
    }
}

#[test]
fn every_pool_of_the_base_model_must_serve_the_targets() {
    // The router rewrites before Envoy's route chooses between the two llama pools, so a
    // canary pool that lacks the adapters would get requests it cannot serve.
    let mut two = pools();
    two.push(PoolModels {
        name: "llama-70b-fp8".into(),
        base_model: "llama".into(),
        adapters: Vec::new(),
        block_size_tokens: None,
    });
    match Rewrites::compile(&[seed()], &two) {
        Err(RewriteError::NotServed { pool, model, .. }) => {
            assert_eq!(pool, "llama-70b-fp8");
            assert_eq!(model, "support-assistant-v1");
        }
        other => panic!("{other:?}"),
    }
    if let Some(fp8) = two.last_mut() {
        fp8.adapters = vec!["support-assistant-v1".into(), "support-assistant-v2".into()];
    }
    assert!(Rewrites::compile(&[seed()], &two).is_ok());
}
