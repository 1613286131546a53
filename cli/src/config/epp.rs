//! An operator's scheduling files for a launched gateway: the `EndpointPickerConfig` every
//! pool runs (flow control included), and the `InferenceObjective` objects that map a
//! request's objective to its priority.
//!
//! - [`load_epp_config`] reads an `EndpointPickerConfig` file (YAML or JSON), or the
//!   Kubernetes `ConfigMap` that carries one as the text of one of its `data` entries, as
//!   llm-d deployments ship it.
//! - [`load_objectives`] reads a file of `InferenceObjective` objects (several YAML
//!   documents allowed).
//! - [`picker_objectives`] and [`apply_objectives`] put the objectives into the picker's
//!   configuration under [`OBJECTIVES_KEY`], together with those a tenancy carries (the
//!   router's tenants name objectives too, and both filters must agree on them).
//!
//! Nothing here interprets the objects: the modules check them when their configuration
//! loads. Errors name the file.

use super::tenancy::{parse_documents, Tenancy};
use anyhow::{bail, Context, Result};
use serde_json::Value as Json;
use std::path::Path;

/// The picker configuration key that holds the `InferenceObjective` objects.
pub const OBJECTIVES_KEY: &str = "objectives";

/// The `kind` of a scheduling configuration document.
const EPP_CONFIG_KIND: &str = "EndpointPickerConfig";

/// The `kind` of an objective.
const OBJECTIVE_KIND: &str = "InferenceObjective";

/// Top-level keys that make a document without `kind` a scheduling configuration.
const EPP_CONFIG_KEYS: [&str; 4] = [
    "plugins",
    "schedulingProfiles",
    "flowControl",
    "featureGates",
];

/// The `EndpointPickerConfig` (as JSON) in the file at `path`: the document itself, or the
/// one value of a `ConfigMap`'s `data` whose text is an `EndpointPickerConfig`.
pub fn load_epp_config(path: &Path) -> Result<Json> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    epp_config_from_text(&text).with_context(|| format!("in {}", path.display()))
}

/// [`load_epp_config`] on the file's text.
pub fn epp_config_from_text(text: &str) -> Result<Json> {
    let document = single_document(text)?;
    match document["kind"].as_str() {
        Some("ConfigMap") => from_config_map(&document),
        _ if is_epp_config(&document) => Ok(document),
        Some(kind) => bail!("a {kind}, not an {EPP_CONFIG_KIND} or a ConfigMap holding one"),
        None => bail!(
            "not an {EPP_CONFIG_KIND}: no `kind` and none of {}",
            EPP_CONFIG_KEYS.join(", ")
        ),
    }
}

/// The one non-empty YAML document of `text`.
fn single_document(text: &str) -> Result<Json> {
    let mut documents = parse_documents(text)?;
    match documents.len() {
        1 => Ok(documents.remove(0)),
        0 => bail!("no document"),
        n => bail!("{n} documents, expected one"),
    }
}

/// Whether `document` is a scheduling configuration: its `kind` says so, or it has none and
/// carries one of its sections.
fn is_epp_config(document: &Json) -> bool {
    match document.get("kind") {
        Some(kind) => kind == EPP_CONFIG_KIND,
        None => EPP_CONFIG_KEYS.iter().any(|k| document.get(*k).is_some()),
    }
}

/// The scheduling configuration a `ConfigMap` carries: exactly one of its `data` values
/// must parse as one (others, such as unrelated files in the same map, are left alone).
fn from_config_map(map: &Json) -> Result<Json> {
    let name = map["metadata"]["name"].as_str().unwrap_or("(unnamed)");
    let Some(data) = map["data"].as_object() else {
        bail!("ConfigMap {name} has no `data` mapping");
    };
    let mut found: Vec<(&str, Json)> = Vec::new();
    for (key, value) in data {
        let Some(text) = value.as_str() else { continue };
        if let Ok(document) = single_document(text) {
            if is_epp_config(&document) {
                found.push((key, document));
            }
        }
    }
    let keys = || {
        data.keys()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    };
    match found.len() {
        1 => Ok(found.remove(0).1),
        0 => bail!(
            "ConfigMap {name}: no `data` value is an {EPP_CONFIG_KIND} (keys: {})",
            keys()
        ),
        _ => {
            let names: Vec<&str> = found.iter().map(|(k, _)| *k).collect();
            bail!(
                "ConfigMap {name}: several `data` values are an {EPP_CONFIG_KIND} ({}); keep one",
                names.join(", ")
            )
        }
    }
}

/// The `InferenceObjective` objects in the file at `path` (one or more YAML documents; JSON
/// is one). Any other kind, or none at all, is an error naming the file.
pub fn load_objectives(path: &Path) -> Result<Vec<Json>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    objectives_from_text(&text).with_context(|| format!("in {}", path.display()))
}

/// [`load_objectives`] on the file's text.
pub fn objectives_from_text(text: &str) -> Result<Vec<Json>> {
    let objects = parse_documents(text)?;
    if objects.is_empty() {
        bail!("no {OBJECTIVE_KIND} object");
    }
    for (i, object) in objects.iter().enumerate() {
        if !is_objective(object) {
            let kind = object["kind"].as_str().unwrap_or("document without `kind`");
            bail!("document {} is a {kind}, not an {OBJECTIVE_KIND}", i + 1);
        }
    }
    Ok(objects)
}

fn is_objective(object: &Json) -> bool {
    object["kind"] == OBJECTIVE_KIND
}

fn name_of(object: &Json) -> &str {
    object["metadata"]["name"].as_str().unwrap_or("")
}

/// The objectives the picker gets: `explicit`, then the `InferenceObjective` objects of
/// `tenancy` that `explicit` does not already hold. The same object given twice counts
/// once; two different objects of one name are an error naming it.
pub fn picker_objectives(explicit: &[Json], tenancy: &Tenancy) -> Result<Vec<Json>> {
    let mut out: Vec<Json> = Vec::new();
    for object in explicit
        .iter()
        .chain(tenancy.objects.iter().filter(|o| is_objective(o)))
    {
        match out.iter().find(|o| name_of(o) == name_of(object)) {
            Some(known) if known == object => {}
            Some(_) => bail!(
                "{OBJECTIVE_KIND} {} is given twice, with different contents",
                name_of(object)
            ),
            None => out.push(object.clone()),
        }
    }
    Ok(out)
}

/// Puts `objectives` into the picker configuration `picker` (a JSON object) under
/// [`OBJECTIVES_KEY`], unless there are none (the key is then left out).
pub fn apply_objectives(picker: &mut Json, objectives: &[Json]) -> Result<()> {
    if objectives.is_empty() {
        return Ok(());
    }
    let Some(map) = picker.as_object_mut() else {
        bail!("the picker configuration is not a JSON object");
    };
    map.insert(OBJECTIVES_KEY.into(), Json::Array(objectives.to_vec()));
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;
    use tempfile::TempDir;

    fn testdata(path: &str) -> std::path::PathBuf {
        infergate_artefacts::workspace_root()
            .join("testdata")
            .join(path)
    }

    /// The seed's ConfigMap: its one `data` entry is the `EndpointPickerConfig`, with the
    /// flow-control section and every plugin, exactly as written there.
    #[test]
    fn the_seed_config_map_yields_its_endpoint_picker_config() {
        let cfg = load_epp_config(&testdata("epp/epp-config-configmap.yaml")).unwrap();
        assert_eq!(cfg["kind"], "EndpointPickerConfig");
        assert_eq!(cfg["featureGates"], json!(["flowControl"]));
        let flow = &cfg["flowControl"];
        assert_eq!(flow["maxBytes"], "10Gi");
        assert_eq!(flow["maxRequests"], "1k");
        assert_eq!(flow["defaultRequestTTL"], "60s");
        assert_eq!(
            flow["saturationDetector"]["pluginRef"],
            "concurrency-detector"
        );
        let bands: Vec<i64> = flow["priorityBands"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["priority"].as_i64().unwrap())
            .collect();
        assert_eq!(bands, [100, 0, -10]);
        let detector = cfg["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["type"] == "concurrency-detector")
            .unwrap();
        assert_eq!(detector["parameters"]["maxConcurrency"], 128);
        // The document keeps the llm-d shape the core's config type reads.
        let typed: scheduler_core::scheduling::config::EndpointPickerConfig =
            serde_json::from_value(cfg.clone()).unwrap();
        assert_eq!(typed.scheduling_profiles.len(), 1);
        assert_eq!(typed.plugins.len(), 13);
        // The inner document alone loads to the same value.
        let map = parse_documents(
            &std::fs::read_to_string(testdata("epp/epp-config-configmap.yaml")).unwrap(),
        )
        .unwrap();
        let inner = map[0]["data"]["epp-config.yaml"].as_str().unwrap();
        assert_eq!(epp_config_from_text(inner).unwrap(), cfg);
    }

    #[test]
    fn a_plain_config_loads_as_it_is_and_other_documents_are_refused() {
        let cfg = load_epp_config(&testdata("epp/default.yaml")).unwrap();
        assert_eq!(cfg["kind"], "EndpointPickerConfig");
        let bare = epp_config_from_text(r#"{"plugins": [{"type": "random-picker"}]}"#).unwrap();
        assert_eq!(bare["plugins"][0]["type"], "random-picker");
        for (text, says) in [
            (
                "kind: InferencePool\nmetadata: {name: p}\n",
                "InferencePool",
            ),
            ("name: x\n", "no `kind`"),
            ("", "no document"),
            ("plugins: []\n---\nplugins: []\n", "2 documents"),
            ("kind: [unclosed\n", "document 1"),
        ] {
            let err = format!("{:#}", epp_config_from_text(text).unwrap_err());
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }

    #[test]
    fn a_config_map_needs_exactly_one_config_in_its_data() {
        let map = |data: Json| {
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m"},
                   "data": data})
            .to_string()
        };
        let other = "kind: Something\n";
        let config = "kind: EndpointPickerConfig\nplugins: [{type: random-picker}]\n";
        let got = epp_config_from_text(&map(json!({"notes.txt": "not: [yaml",
            "other.yaml": other, "epp.yaml": config})))
        .unwrap();
        assert_eq!(got["plugins"][0]["type"], "random-picker");
        let err = format!(
            "{:#}",
            epp_config_from_text(&map(json!({"a.yaml": config, "b.yaml": config}))).unwrap_err()
        );
        assert!(err.contains("a.yaml, b.yaml"), "{err}");
        let err = format!(
            "{:#}",
            epp_config_from_text(&map(json!({"other.yaml": other}))).unwrap_err()
        );
        assert!(
            err.contains("ConfigMap m") && err.contains("other.yaml"),
            "{err}"
        );
        let err = format!(
            "{:#}",
            epp_config_from_text(r#"{"kind": "ConfigMap"}"#).unwrap_err()
        );
        assert!(err.contains("no `data`"), "{err}");
    }

    #[test]
    fn errors_name_the_file() {
        let dir = TempDir::new().unwrap();
        let bad = dir.path().join("bad-epp.yaml");
        std::fs::write(&bad, "kind: Service\n").unwrap();
        let err = format!("{:#}", load_epp_config(&bad).unwrap_err());
        assert!(err.contains("bad-epp.yaml"), "{err}");
        let err = format!("{:#}", load_objectives(&bad).unwrap_err());
        assert!(
            err.contains("bad-epp.yaml") && err.contains("Service"),
            "{err}"
        );
        let missing = dir.path().join("missing.yaml");
        for err in [
            load_epp_config(&missing).unwrap_err(),
            load_objectives(&missing).unwrap_err(),
        ] {
            assert!(format!("{err:#}").contains("missing.yaml"), "{err:#}");
        }
    }

    /// The seed's objectives file, as the platform ships it.
    #[test]
    fn the_seed_objectives_load_with_their_priorities() {
        let objectives = load_objectives(&testdata("tenants/objectives.yaml")).unwrap();
        let got: Vec<(&str, i64)> = objectives
            .iter()
            .map(|o| (name_of(o), o["spec"]["priority"].as_i64().unwrap()))
            .collect();
        assert_eq!(
            got,
            [
                ("premium-traffic", 100),
                ("standard-traffic", 0),
                ("best-effort-traffic", -10)
            ]
        );
        assert!(objectives_from_text("# nothing\n").is_err());
        let err = format!(
            "{:#}",
            objectives_from_text(
                "kind: InferenceObjective\nmetadata: {name: a}\n---\nkind: TenantQuota\n"
            )
            .unwrap_err()
        );
        assert!(err.contains("document 2 is a TenantQuota"), "{err}");
    }

    fn objective(name: &str, priority: i64) -> Json {
        json!({"kind": "InferenceObjective", "metadata": {"name": name},
               "spec": {"priority": priority}})
    }

    #[test]
    fn the_picker_gets_explicit_objectives_and_the_tenancys_once_each() {
        let tenancy = Tenancy {
            objects: vec![
                json!({"kind": "TenantQuota", "metadata": {"name": "tenant-a"}}),
                objective("premium", 100),
                objective("batch", -10),
            ],
            ..Tenancy::default()
        };
        let got = picker_objectives(&[objective("premium", 100)], &tenancy).unwrap();
        let names: Vec<&str> = got.iter().map(name_of).collect();
        assert_eq!(names, ["premium", "batch"]);
        assert!(picker_objectives(&[], &Tenancy::default())
            .unwrap()
            .is_empty());
        let err = picker_objectives(&[objective("premium", 5)], &tenancy).unwrap_err();
        assert!(err.to_string().contains("premium"), "{err}");

        let mut picker = json!({"role": "picker", "pools": []});
        apply_objectives(&mut picker, &[]).unwrap();
        assert!(picker.get(OBJECTIVES_KEY).is_none(), "none: no key");
        apply_objectives(&mut picker, &got).unwrap();
        assert_eq!(picker[OBJECTIVES_KEY][1]["metadata"]["name"], "batch");
        assert!(apply_objectives(&mut Json::Null, &got).is_err());
    }
}
