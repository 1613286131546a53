//! Tests of the tenant configuration: the testdata objects and the invalid ones.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use super::*;
use crate::objects::ObjectError;
use scheduler_core::quota::Limits;
use serde::Deserialize;
use std::path::{Path, PathBuf};

const KEY_A: &str = "sk-infergate-test-tenant-a";
const KEY_B: &str = "sk-infergate-test-tenant-b";
const KEY_B_REVOKED: &str = "sk-infergate-test-tenant-b-revoked";

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/tenants")
}

/// Every YAML document of `text` as JSON, the way the adapters hand objects over.
fn yaml_documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .collect()
}

fn load(name: &str) -> Vec<Value> {
    yaml_documents(&std::fs::read_to_string(testdata().join(name)).unwrap())
}

/// The directory's separate files, as a directory is loaded.
fn load_dir() -> Vec<Value> {
    ["quota-a.yaml", "quota-b.yaml", "objectives.yaml"]
        .iter()
        .flat_map(|f| load(f))
        .collect()
}

fn compiled() -> Tenants {
    Tenants::from_objects(&load_dir()).unwrap()
}

fn id_of(t: &Tenants, name: &str) -> TenantId {
    t.iter().find(|(_, x)| x.name == name).unwrap().0
}

fn err_of(objects: &[Value]) -> TenantsError {
    Tenants::from_objects(objects).unwrap_err()
}

#[test]
fn tenants_are_shareable() {
    fn check<T: Clone + std::fmt::Debug + Send + Sync>() {}
    check::<Tenants>();
    check::<TenantsError>();
}

#[test]
fn every_field_of_tenant_a_arrives() {
    let t = compiled();
    assert_eq!(t.tenant_names(), vec!["tenant-a", "tenant-b"]);
    let a = t.tenant(id_of(&t, "tenant-a")).unwrap();
    assert_eq!(a.fairness_id.as_deref(), Some("tenant-a"));
    assert_eq!(a.objective.as_deref(), Some("premium-traffic"));
    assert_eq!(a.priority, 100);
    assert_eq!(a.limits.len(), 2);
    assert_eq!(a.limits[0].model, "llama-70b");
    assert_eq!(
        a.limits[0].limits,
        Limits {
            rpm: Some(3000),
            tpm: Some(3_000_000),
            concurrency: Some(600)
        }
    );
    assert_eq!(a.limits[0].max_completion_tokens_default, Some(1024));
    assert_eq!(a.limits[0].bucket_key, "tenant-a/llama-70b");
    assert_eq!(a.limits[1].model, "*");
    assert_eq!(
        a.limits[1].limits,
        Limits {
            rpm: Some(300),
            tpm: Some(300_000),
            concurrency: Some(60)
        }
    );
    assert_eq!(a.limits[1].max_completion_tokens_default, None);
    assert_eq!(
        a.accounting,
        Accounting {
            pre_debit: PreDebit::InputPlusMaxOutput,
            settle_on: SettleOn::UsageOrChunkCount,
            stream_disconnect: StreamDisconnect::BillGenerated,
        }
    );
    assert_eq!(
        t.jwt_rules(),
        &[JwtRule {
            issuer: "https://sso.example.internal".into(),
            claim: "org".into(),
            value: "product-team".into(),
            tenant: id_of(&t, "tenant-a"),
        }]
    );
}

#[test]
fn every_field_of_tenant_b_and_the_objectives_arrives() {
    let t = compiled();
    let id = id_of(&t, "tenant-b");
    let b = t.tenant(id).unwrap();
    assert_eq!(b.fairness_id.as_deref(), Some("tenant-b"));
    assert_eq!(b.objective.as_deref(), Some("standard-traffic"));
    assert_eq!(b.priority, 0);
    assert_eq!(b.limits.len(), 1);
    assert_eq!(
        b.limits[0].limits,
        Limits {
            rpm: Some(1000),
            tpm: Some(1_000_000),
            concurrency: Some(200)
        }
    );
    assert_eq!(b.limits[0].max_completion_tokens_default, Some(1024));
    assert_eq!(b.accounting, Accounting::default());
    let names: Vec<(&str, i32, Option<&str>)> = t
        .objectives()
        .iter()
        .map(|o| (o.name.as_str(), o.priority, o.pool.as_deref()))
        .collect();
    assert_eq!(
        names,
        vec![
            ("premium-traffic", 100, Some("llama-70b-bf16")),
            ("standard-traffic", 0, Some("llama-70b-bf16")),
            ("best-effort-traffic", -10, Some("llama-70b-bf16")),
        ]
    );
    assert_eq!(t.priority_of("best-effort-traffic"), -10);
    assert_eq!(t.priority_of("premium-traffic"), 100);
    assert_eq!(t.priority_of("no-such-objective"), 0);
}

#[test]
fn api_keys_map_to_their_tenants_and_the_revoked_key_to_none() {
    let t = compiled();
    assert_eq!(t.by_api_key(KEY_A), Some(id_of(&t, "tenant-a")));
    assert_eq!(t.by_api_key(KEY_B), Some(id_of(&t, "tenant-b")));
    assert_eq!(t.by_api_key(KEY_B_REVOKED), None);
    assert_eq!(t.by_api_key(""), None);
    assert_eq!(t.by_api_key("sk-infergate-test-tenant-A"), None);
}

#[test]
fn sha256_hex_matches_the_digests_in_testdata() {
    // FIPS 180-2 test vector.
    assert_eq!(
        sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    let a = std::fs::read_to_string(testdata().join("quota-a.yaml")).unwrap();
    let b = std::fs::read_to_string(testdata().join("quota-b.yaml")).unwrap();
    assert!(a.contains(&sha256_hex(KEY_A.as_bytes())));
    assert!(b.contains(&sha256_hex(KEY_B.as_bytes())));
    assert!(!b.contains(&sha256_hex(KEY_B_REVOKED.as_bytes())));
}

#[test]
fn the_multi_document_file_equals_the_directory() {
    let dir = compiled();
    let all = Tenants::from_objects(&load("all.yaml")).unwrap();
    assert_eq!(all.tenant_names(), dir.tenant_names());
    for (id, tenant) in dir.iter() {
        assert_eq!(all.tenant(id), Some(tenant));
    }
    assert_eq!(all.jwt_rules(), dir.jwt_rules());
    assert_eq!(all.objectives(), dir.objectives());
    assert_eq!(all.by_api_key(KEY_B), dir.by_api_key(KEY_B));
}

#[test]
fn limit_for_prefers_the_exact_model_then_the_fallback() {
    let t = compiled();
    let a = id_of(&t, "tenant-a");
    let b = id_of(&t, "tenant-b");
    let (i, l) = t.limit_for(a, "llama-70b").unwrap();
    assert_eq!((i, l.model.as_str()), (0, "llama-70b"));
    let (i, l) = t.limit_for(a, "mistral-7b").unwrap();
    assert_eq!((i, l.model.as_str()), (1, "*"));
    assert_eq!(
        t.limit_for(a, "Llama-70b").unwrap().0,
        1,
        "exact means exact"
    );
    assert!(t.limit_for(b, "mistral-7b").is_none());
    assert_eq!(t.bucket_key(a, 1), Some("tenant-a/*"));
    assert_eq!(t.bucket_key(b, 0), Some("tenant-b/llama-70b"));
    assert_eq!(t.bucket_key(b, 1), None);
    assert_eq!(t.tenant(TenantId(7)), None);
    assert!(t.limit_for(TenantId(7), "llama-70b").is_none());
    assert_eq!(t.bucket_key(TenantId(u32::MAX), 0), None);
}

#[test]
fn jwt_payloads_map_by_issuer_and_claim() {
    let t = compiled();
    let a = id_of(&t, "tenant-a");
    let payload = |v: serde_json::Value| v.as_object().unwrap().clone();
    let ok = payload(
        serde_json::json!({"iss": "https://sso.example.internal", "org": "product-team", "sub": "u1"}),
    );
    assert_eq!(t.by_jwt_payload(&ok), Some(a));
    let list = payload(
        serde_json::json!({"iss": "https://sso.example.internal", "org": ["x", "product-team"]}),
    );
    assert_eq!(t.by_jwt_payload(&list), Some(a));
    let other_issuer =
        payload(serde_json::json!({"iss": "https://evil.example", "org": "product-team"}));
    assert_eq!(t.by_jwt_payload(&other_issuer), None);
    let other_value =
        payload(serde_json::json!({"iss": "https://sso.example.internal", "org": "finance"}));
    assert_eq!(t.by_jwt_payload(&other_value), None);
    let no_claim = payload(serde_json::json!({"iss": "https://sso.example.internal"}));
    assert_eq!(t.by_jwt_payload(&no_claim), None);
}

#[test]
fn no_objects_means_no_tenancy_and_empty_documents_are_skipped() {
    let t = Tenants::from_objects(&[]).unwrap();
    assert!(t.is_empty());
    assert_eq!(t.by_api_key(KEY_A), None);
    let with_nulls = yaml_documents("---\n---\n# only a comment\n---\n");
    assert!(with_nulls.iter().all(Value::is_null));
    assert!(Tenants::from_objects(&with_nulls).unwrap().is_empty());
    let mut objects = load_dir();
    objects.insert(1, Value::Null);
    let t = Tenants::from_objects(&objects).unwrap();
    assert!(!t.is_empty());
    assert_eq!(t.tenant_names().len(), 2);
}

#[test]
fn without_objectives_an_unknown_objective_has_priority_0() {
    let objects: Vec<Value> = ["quota-a.yaml", "quota-b.yaml"]
        .iter()
        .flat_map(|f| load(f))
        .collect();
    let t = Tenants::from_objects(&objects).unwrap();
    let a = t.tenant(id_of(&t, "tenant-a")).unwrap();
    assert_eq!(a.objective.as_deref(), Some("premium-traffic"));
    assert_eq!(a.priority, 0);
    assert!(t.objectives().is_empty());
}

#[test]
fn metadata_keys_and_status_are_accepted_and_ignored() {
    let mut objects = load_dir();
    let a = objects[0].as_object_mut().unwrap();
    let meta = a.get_mut("metadata").unwrap().as_object_mut().unwrap();
    meta.insert("namespace".into(), "gateway".into());
    meta.insert("labels".into(), serde_json::json!({"team": "product"}));
    meta.insert(
        "annotations".into(),
        serde_json::json!({"kubectl.kubernetes.io/last-applied-configuration": "{}"}),
    );
    meta.insert("uid".into(), "5b1c".into());
    meta.insert("resourceVersion".into(), "42".into());
    meta.insert("generation".into(), 3.into());
    meta.insert("creationTimestamp".into(), "2026-01-01T00:00:00Z".into());
    meta.insert(
        "managedFields".into(),
        serde_json::json!([{"manager": "kubectl"}]),
    );
    a.insert(
        "status".into(),
        serde_json::json!({"conditions": [{"type": "Ready"}], "anything": 1}),
    );
    let t = Tenants::from_objects(&objects).unwrap();
    assert_eq!(
        t.tenant(id_of(&t, "tenant-a")),
        compiled().tenant(id_of(&t, "tenant-a"))
    );
}

/// Every mapping of `value` (outside metadata and status) and its path.
fn mappings(value: &Value, path: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            out.push(path.clone());
            for (k, v) in map {
                if path.is_empty() && (k == "metadata" || k == "status") {
                    continue;
                }
                let child = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                mappings(v, child, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                mappings(v, format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn at_path<'v>(value: &'v mut Value, path: &str) -> &'v mut Value {
    let mut here = value;
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (key, index) = match part.split_once('[') {
            Some((k, rest)) => (
                k,
                Some(rest.trim_end_matches(']').parse::<usize>().unwrap()),
            ),
            None => (part, None),
        };
        here = here.get_mut(key).unwrap();
        if let Some(i) = index {
            here = here.get_mut(i).unwrap();
        }
    }
    here
}

#[test]
fn an_unknown_key_anywhere_is_named_with_its_path() {
    let base = load_dir();
    let mut checked = 0;
    for (index, object) in base.iter().enumerate() {
        let mut paths = Vec::new();
        mappings(object, String::new(), &mut paths);
        let name = object["metadata"]["name"].as_str().unwrap();
        let kind = object["kind"].as_str().unwrap();
        for path in paths {
            let mut objects = base.clone();
            let target = at_path(&mut objects[index], &path);
            target
                .as_object_mut()
                .unwrap()
                .insert("zzBogus".into(), Value::from(1));
            let e = err_of(&objects);
            let expected = if path.is_empty() {
                "zzBogus".to_string()
            } else {
                format!("{path}.zzBogus")
            };
            assert_eq!(
                e,
                TenantsError::Object(ObjectError::NotSupported {
                    object: format!("{kind} {name}"),
                    path: expected.clone(),
                }),
                "{e}"
            );
            assert_eq!(
                e.to_string(),
                format!("{kind} {name}: {expected}: not supported")
            );
            checked += 1;
        }
    }
    // Top, spec, identity, jwtClaims, inject, 2 limits, accounting of A; 6 of B; 3 of each
    // objective.
    assert_eq!(checked, 8 + 6 + 3 * 3);
}

#[test]
fn a_missing_required_field_is_named() {
    for (index, path, key) in [
        (0usize, "spec.identity.jwtClaims", "issuer"),
        (0, "spec.identity.jwtClaims", "tenantClaim"),
        (0, "spec.identity.jwtClaims", "tenantValue"),
        (0, "spec.limits[1]", "model"),
        (0, "spec", "identity"),
        (0, "", "spec"),
        (2, "spec.poolRef", "name"),
    ] {
        let mut objects = load_dir();
        at_path(&mut objects[index], path)
            .as_object_mut()
            .unwrap()
            .remove(key);
        let e = err_of(&objects);
        let full = if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        };
        assert!(
            matches!(e, TenantsError::Object(ObjectError::Required { .. })),
            "{e}"
        );
        assert_eq!(e.path(), full);
    }
    let mut objects = load_dir();
    objects[1]["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("name");
    let e = err_of(&objects);
    assert_eq!(
        e.to_string(),
        "TenantQuota objects[1]: metadata.name: required"
    );
}

#[test]
fn wrong_types_and_values_are_named() {
    let cases: Vec<(usize, &str, Value, &str)> = vec![
        (
            0,
            "spec.limits[0].tpm",
            Value::from("3000000"),
            "must be a non-negative integer",
        ),
        (
            0,
            "spec.limits[0].concurrency",
            Value::from(1.5),
            "must be a non-negative integer",
        ),
        (
            0,
            "spec.limits",
            serde_json::json!({"model": "x"}),
            "must be a list",
        ),
        (
            0,
            "spec.identity.apiKeyHashes",
            Value::from("abc"),
            "must be a list",
        ),
        (
            0,
            "spec.inject.fairnessId",
            Value::from(""),
            "`` not supported",
        ),
        (
            0,
            "spec.inject",
            Value::from("tenant-a"),
            "must be a mapping",
        ),
        (
            2,
            "spec.priority",
            Value::from(1u64 << 40),
            "must be a 32-bit integer",
        ),
        (
            2,
            "spec.priority",
            Value::from("high"),
            "must be a 32-bit integer",
        ),
        (
            0,
            "metadata.name",
            Value::from("team/a"),
            "`team/a` not supported",
        ),
        (
            0,
            "spec.identity.apiKeyHashes[0]",
            Value::from("g".repeat(64)),
            "64 hex digits",
        ),
        (
            0,
            "spec.identity.apiKeyHashes[0]",
            Value::from("ab".repeat(33)),
            "64 hex digits",
        ),
    ];
    for (index, path, value, message) in cases {
        let mut objects = load_dir();
        *at_path(&mut objects[index], path) = value;
        let e = err_of(&objects);
        assert_eq!(e.path(), path, "{e}");
        assert!(e.to_string().contains(message), "{e} lacks {message}");
    }
}

#[test]
fn a_jwt_rule_may_belong_to_one_tenant_only() {
    let mut objects = load_dir();
    let claims = objects[0]["spec"]["identity"]["jwtClaims"].clone();
    objects[1]["spec"]["identity"]
        .as_object_mut()
        .unwrap()
        .insert("jwtClaims".into(), claims);
    let e = err_of(&objects);
    assert_eq!(e.object(), "TenantQuota tenant-b");
    assert_eq!(e.path(), "spec.identity.jwtClaims");
    assert!(e.to_string().contains("TenantQuota tenant-a"), "{e}");
}

#[test]
fn two_objectives_of_one_name_are_refused() {
    let mut objects = load_dir();
    let again = objects[2].clone();
    objects.push(again);
    let e = err_of(&objects);
    assert_eq!(e.object(), "InferenceObjective premium-traffic");
    assert_eq!(e.path(), "metadata.name");
}

#[test]
fn limits_of_zero_and_huge_numbers_are_kept() {
    let mut objects = load_dir();
    *at_path(&mut objects[0], "spec.limits[0].rpm") = Value::from(0);
    *at_path(&mut objects[0], "spec.limits[0].tpm") = Value::from(u64::MAX);
    *at_path(&mut objects[0], "spec.limits[0].concurrency") = Value::Null;
    let t = Tenants::from_objects(&objects).unwrap();
    let a = t.tenant(id_of(&t, "tenant-a")).unwrap();
    assert_eq!(
        a.limits[0].limits,
        Limits {
            rpm: Some(0),
            tpm: Some(u64::MAX),
            concurrency: None
        }
    );
}

#[test]
fn every_invalid_file_names_its_field() {
    let dir = testdata().join("invalid");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 12, "{files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let expected = text
            .lines()
            .find_map(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{} has no `# expect:` line", file.display()));
        let e = err_of(&yaml_documents(&text));
        eprintln!("{}: {e}", file.file_name().unwrap().to_string_lossy());
        assert!(
            e.to_string().starts_with(expected),
            "{}:\n  got      {e}\n  expected {expected}",
            file.display()
        );
        assert!(!e.path().is_empty(), "{}", file.display());
    }
}

/// A random JSON value, small.
fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        "[a-z0-9*/_.-]{0,70}".prop_map(Value::from),
        Just(Value::from("usage")),
        Just(Value::from(
            "e5379db5c6b14ee0b4b0ebf92d29be89025e16316bbdaf6f678046428a491380"
        )),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-zA-Z]{1,12}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Every node's path in `value` (the form `at_path` reads), the root first.
fn all_paths(value: &Value, path: String, out: &mut Vec<String>) {
    out.push(path.clone());
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let child = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                all_paths(v, child, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                all_paths(v, format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

    /// Replacing any node of the testdata objects by any value never panics; a refusal
    /// always names an object, and a field path unless the item itself is not an object.
    #[test]
    fn any_mutation_is_compiled_or_refused_by_name(
        object in 0usize..5, pick in proptest::prelude::any::<usize>(), value in json_value()
    ) {
        let mut objects = load_dir();
        let mut paths = Vec::new();
        all_paths(&objects[object], String::new(), &mut paths);
        let path = paths[pick % paths.len()].clone();
        // Keys whose name holds `.` or `[` (annotations) cannot be addressed this way.
        proptest::prop_assume!(!path.contains('/'));
        *at_path(&mut objects[object], &path) = value;
        match Tenants::from_objects(&objects) {
            Ok(t) => proptest::prop_assert!(t.tenant_names().len() <= 2),
            Err(e) => {
                proptest::prop_assert!(!e.object().is_empty());
                let item_replaced = path.is_empty();
                proptest::prop_assert!(item_replaced || !e.path().is_empty(), "{}", e);
                proptest::prop_assert!(e.to_string().starts_with(e.object()));
            }
        }
    }
}
