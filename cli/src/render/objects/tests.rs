//! The versioned types on the seed's objects, and what they refuse.

use super::*;
use infergate_artefacts::workspace_root;
use serde_json::json;

fn seed_dir() -> std::path::PathBuf {
    workspace_root().join("testdata/objects")
}

fn doc(yaml: &str) -> Json {
    serde_yaml_ng::from_str(yaml).unwrap()
}

fn seed(file: &str) -> Vec<Json> {
    parse_documents(&std::fs::read_to_string(seed_dir().join(file)).unwrap()).unwrap()
}

fn read_one(d: &Json) -> Result<Vec<Object>, ObjectError> {
    read_document(d, "test.yaml", &mut Report::default())
}

/// Every seed file parses into its version's type, with the values written there.
#[test]
fn every_seed_object_parses_into_its_versions_type() {
    let pool = match &read_one(&seed("inferencepool.yaml")[0]).unwrap()[..] {
        [Object::InferencePoolV1(p)] => p.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(pool.label, "InferencePool serving/llama-70b-bf16");
    assert_eq!(pool.target_ports, [8000]);
    assert_eq!(pool.selector["matchLabels"]["variant"], "bf16");
    assert_eq!(
        pool.endpoint_picker_ref.as_ref().unwrap().name,
        "llama-70b-epp"
    );
    assert_eq!(pool.failure_mode(), crate::config::FailureMode::FailClose);

    let route = match &read_one(&seed("httproute.yaml")[0]).unwrap()[..] {
        [Object::HttpRouteV1(r)] => r.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(route.parents[0].name, "inference-gateway");
    let m = &route.rules[0].matches[0];
    assert_eq!(
        (m.model.as_str(), m.path_prefix.as_deref()),
        ("llama-70b", Some("/v1"))
    );
    assert_eq!(route.rules[0].backends[0].pool, "llama-70b-bf16");
    assert_eq!(route.rules[0].backends[0].weight, 100);

    let canary = match &read_one(&seed("httproute-canary.yaml")[0]).unwrap()[..] {
        [Object::HttpRouteV1(r)] => r.clone(),
        other => panic!("{other:?}"),
    };
    let weights: Vec<u32> = canary.rules[0].backends.iter().map(|b| b.weight).collect();
    assert_eq!(weights, [90, 10]);

    let epp = match &read_one(&seed("epp-config.yaml")[0]).unwrap()[..] {
        [Object::EndpointPickerConfigV1alpha1(c)] => c.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(epp.config_map.as_deref(), Some("llama-70b-epp-config"));
    assert_eq!(epp.typed.plugins.len(), 13);
    assert!(epp.typed.flow_control.is_some());

    let objectives: Vec<(String, i32)> = seed("objectives.yaml")
        .iter()
        .map(|d| match &read_one(d).unwrap()[..] {
            [Object::InferenceObjectiveV1alpha2(o)] => (o.meta.name.clone(), o.priority),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        objectives,
        [
            ("premium-traffic".to_string(), 100),
            ("standard-traffic".to_string(), 0),
            ("best-effort-traffic".to_string(), -10)
        ]
    );

    match &read_one(&seed("inferencemodelrewrite.yaml")[0]).unwrap()[..] {
        [Object::InferenceModelRewriteV1alpha2(r)] => {
            assert_eq!(r.pool, "llama-70b-bf16");
            assert_eq!(r.targets, ["support-assistant-v1", "support-assistant-v2"]);
        }
        other => panic!("{other:?}"),
    }
    for (file, issuer) in [
        ("quota-a.yaml", Some("https://sso.example.internal")),
        ("quota-b.yaml", None),
    ] {
        match &read_one(&seed(file)[0]).unwrap()[..] {
            [Object::TenantQuotaV1alpha1(t)] => {
                assert_eq!(t.jwt_issuer.as_deref(), issuer, "{file}")
            }
            other => panic!("{file}: {other:?}"),
        }
    }
    // The whole directory: the later HTTPRoute of the same name replaces the earlier.
    let set = load_dir(&seed_dir()).unwrap();
    let routes = set.of(|o| match o {
        Object::HttpRouteV1(r) => Some(r),
        _ => None,
    });
    assert_eq!(routes.len(), 1);
    assert_eq!(
        routes[0].rules[0].backends.len(),
        1,
        "httproute.yaml, not the canary"
    );
    assert_eq!(set.objects.len(), 1 + 1 + 1 + 3 + 1 + 2);
    // The replaced route's fields are gone from the report; the replacement is said.
    let route_names = set
        .report
        .entries()
        .iter()
        .filter(|e| e.object == "HTTPRoute serving/llama-70b" && e.path == "metadata.name")
        .count();
    assert_eq!(route_names, 1);
    assert!(set
        .report
        .not_supported_lines()
        .iter()
        .any(|l| l.contains("httproute-canary.yaml is replaced by the one in httproute.yaml")));
}

/// A known kind in a version no module reads is an error naming the version; an unknown
/// field is an error naming its path; an unknown kind is reported, not read.
#[test]
fn wrong_versions_and_unknown_fields_are_named_by_path() {
    let pool = seed("inferencepool.yaml")[0].clone();
    let mut old = pool.clone();
    old["apiVersion"] = json!("inference.networking.x-k8s.io/v1alpha2");
    let err = read_one(&old).unwrap_err();
    assert_eq!(err.path, "apiVersion");
    assert!(
        err.problem
            .contains("inference.networking.x-k8s.io/v1alpha2"),
        "{err}"
    );
    assert!(
        err.problem.contains("inference.networking.k8s.io/v1"),
        "{err}"
    );

    for (mut d, path) in [
        (pool.clone(), "spec.targetPorts[0].protocol"),
        (
            seed("httproute.yaml")[0].clone(),
            "spec.rules[0].matches[0].headers[0].regex",
        ),
        (seed("objectives.yaml")[1].clone(), "spec.criticality"),
        (
            seed("inferencemodelrewrite.yaml")[0].clone(),
            "spec.rules[0].targets[1].percent",
        ),
        (seed("quota-b.yaml")[0].clone(), "spec.burst"),
    ] {
        let mut at = &mut d;
        let parts: Vec<&str> = path.split('.').collect();
        for part in &parts[..parts.len() - 1] {
            at = match part.split_once('[') {
                Some((key, index)) => {
                    let i: usize = index.trim_end_matches(']').parse().unwrap();
                    &mut at[key][i]
                }
                None => &mut at[*part],
            };
        }
        at[*parts.last().unwrap()] = json!(1);
        let err = read_one(&d).unwrap_err();
        assert_eq!(err.path, path, "{err}");
        assert!(err.problem.starts_with("unknown field"), "{err}");
    }
    // In the ConfigMap's inner document too.
    let mut cm = seed("epp-config.yaml")[0].clone();
    let inner = cm["data"]["epp-config.yaml"]
        .as_str()
        .unwrap()
        .replace("featureGates:", "schedulingProfile: []\nfeatureGates:");
    cm["data"]["epp-config.yaml"] = json!(inner);
    let err = read_one(&cm).unwrap_err();
    assert_eq!(err.path, "schedulingProfile", "{err}");
    assert!(
        err.object
            .contains("ConfigMap serving/llama-70b-epp-config data.epp-config.yaml"),
        "{err}"
    );

    let mut report = Report::default();
    let other = doc("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: llama-70b-epp}\n");
    assert!(read_document(&other, "epp.yaml", &mut report)
        .unwrap()
        .is_empty());
    assert!(
        report.not_supported_lines()[0].starts_with("Deployment llama-70b-epp"),
        "{report:?}"
    );
}

/// Fields the gateway cannot honour without changing what the route means are errors;
/// those it leaves out are reported.
#[test]
fn routes_it_cannot_express_are_refused_and_ignored_fields_reported() {
    let route = seed("httproute.yaml")[0].clone();
    for (edit, path) in [(json!({"hostnames": ["a.example"]}), "spec.hostnames")] {
        let mut d = route.clone();
        for (k, v) in edit.as_object().unwrap() {
            d["spec"][k] = v.clone();
        }
        assert_eq!(read_one(&d).unwrap_err().path, path);
    }
    let mut exact = route.clone();
    exact["spec"]["rules"][0]["matches"][0]["path"]["type"] = json!("Exact");
    assert_eq!(
        read_one(&exact).unwrap_err().path,
        "spec.rules[0].matches[0].path.type"
    );
    let mut service = route.clone();
    service["spec"]["rules"][0]["backendRefs"][0]["kind"] = json!("Service");
    assert_eq!(
        read_one(&service).unwrap_err().path,
        "spec.rules[0].backendRefs[0]"
    );
    let mut timeout = route.clone();
    timeout["spec"]["rules"][0]["timeouts"]["request"] = json!("30s");
    let mut report = Report::default();
    read_document(&timeout, "t.yaml", &mut report).unwrap();
    let lines = report.not_supported_lines().join("\n");
    assert!(
        lines.contains("HTTPRoute serving/llama-70b spec.rules[0].timeouts.request: `30s`"),
        "{lines}"
    );
    let mut h2c = seed("inferencepool.yaml")[0].clone();
    h2c["spec"]["appProtocol"] = json!("kubernetes.io/h2c");
    assert_eq!(read_one(&h2c).unwrap_err().path, "spec.appProtocol");
}

/// The opening every `spec` kind shares: a missing name is labelled by the kind alone; an
/// unknown top-level key and a missing `spec` by the object; a `status` is reported.
#[test]
fn every_spec_kind_opens_its_document_alike() {
    for (file, label) in [
        ("inferencepool.yaml", "InferencePool serving/llama-70b-bf16"),
        ("httproute.yaml", "HTTPRoute serving/llama-70b"),
        ("objectives.yaml", ""),
        ("inferencemodelrewrite.yaml", ""),
        ("quota-b.yaml", ""),
    ] {
        let d = seed(file)[0].clone();
        let kind = d["kind"].as_str().unwrap().to_owned();
        let label = if label.is_empty() {
            let meta = &d["metadata"];
            match meta["namespace"].as_str() {
                Some(ns) => format!("{kind} {ns}/{}", meta["name"].as_str().unwrap()),
                None => format!("{kind} {}", meta["name"].as_str().unwrap()),
            }
        } else {
            label.to_owned()
        };

        let mut unnamed = d.clone();
        unnamed["metadata"].as_object_mut().unwrap().remove("name");
        let err = read_one(&unnamed).unwrap_err();
        assert_eq!(
            (err.object.as_str(), err.path.as_str()),
            (kind.as_str(), "metadata.name")
        );

        let mut extra = d.clone();
        extra["specs"] = json!({});
        let err = read_one(&extra).unwrap_err();
        assert_eq!(
            (err.object.as_str(), err.path.as_str()),
            (label.as_str(), "specs")
        );
        assert_eq!(
            err.problem,
            "unknown field (this version knows apiVersion, kind, metadata, spec, status)"
        );

        let mut bare = d.clone();
        bare.as_object_mut().unwrap().remove("spec");
        let err = read_one(&bare).unwrap_err();
        assert_eq!(err.to_string(), format!("{label} spec: required"));

        let mut status = d.clone();
        status["status"] = json!({"conditions": []});
        let mut report = Report::default();
        read_document(&status, "s.yaml", &mut report).unwrap();
        let lines = report.not_supported_lines().join("\n");
        assert!(
            lines.contains(&format!("{label} status: written by controllers")),
            "{lines}"
        );
    }
}

/// The multi-cluster objects: the export annotation on a pool, and an
/// `InferencePoolImport` (status only) naming the clusters that export it.
#[test]
fn the_export_annotation_and_an_import_are_read() {
    let dir = workspace_root().join("testdata/multicluster");
    let read = |file: &str| {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        read_one(&parse_documents(&text).unwrap()[0]).unwrap()
    };
    match &read("inferencepool.yaml")[..] {
        [Object::InferencePoolV1(p)] => assert!(p.exported),
        other => panic!("{other:?}"),
    }
    match &read_one(&seed("inferencepool.yaml")[0]).unwrap()[..] {
        [Object::InferencePoolV1(p)] => assert!(!p.exported),
        other => panic!("{other:?}"),
    }
    match &read("inferencepoolimport.yaml")[..] {
        [Object::InferencePoolImportV1alpha1(i)] => {
            assert_eq!(i.label, "InferencePoolImport serving/llama-70b-bf16");
            assert_eq!(i.exporting_clusters, ["cluster-a", "cluster-b"]);
        }
        other => panic!("{other:?}"),
    }
    match &read("httproute.yaml")[..] {
        [Object::HttpRouteV1(r)] => {
            let imports: Vec<bool> = r.rules[0].backends.iter().map(|b| b.import).collect();
            assert_eq!(imports, [false, true]);
        }
        other => panic!("{other:?}"),
    }
    let bad = doc(
        "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\n\
                   metadata: {name: p, annotations: {inference.networking.x-k8s.io/export: All}}\n\
                   spec: {selector: {matchLabels: {a: b}}, targetPorts: [{number: 8000}]}\n",
    );
    let err = read_one(&bad).unwrap_err().to_string();
    assert!(err.contains("ClusterSet"), "{err}");
    let spec = doc("apiVersion: inference.networking.x-k8s.io/v1alpha1\n\
                    kind: InferencePoolImport\nmetadata: {name: p}\nspec: {}\n");
    let err = read_one(&spec).unwrap_err().to_string();
    assert!(err.contains("spec"), "{err}");
}
