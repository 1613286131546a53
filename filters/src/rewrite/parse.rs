//! Reading one `InferenceModelRewrite` from its JSON form, field by field, so that every
//! field the router does not implement is an error naming its path.
//!
//! Each object is checked on its own here; what needs the router's pools (the pool named,
//! the targets it serves) or the whole list (duplicate names) is checked by the caller.

use serde_json::Value;

use super::error::RewriteError;
use crate::objects::{self, Fields, ObjectError};

/// The `apiVersion`s taken: llm-d's and the Gateway API inference extension's.
pub const API_VERSIONS: &[&str] = &[
    "llm-d.ai/v1alpha2",
    "inference.networking.x-k8s.io/v1alpha2",
    "inference.networking.k8s.io/v1alpha2",
];

/// The only `kind`.
pub const KIND: &str = "InferenceModelRewrite";

/// `spec.poolRef.group` values taken (absent is fine too).
const POOL_GROUPS: &[&str] = &[
    "inference.networking.k8s.io",
    "inference.networking.x-k8s.io",
];

/// What a nested object must be, in errors.
const MAPPING: &str = "an object";

/// Top-level keys; `status` is written by controllers and ignored, `metadata` is read for
/// its `name` only.
const TOP_KEYS: &[&str] = &["apiVersion", "kind", "metadata", "spec", "status"];

/// The largest weight taken (the inference extension's bound).
pub const MAX_WEIGHT: u64 = 1_000_000;

/// One target as written.
#[derive(Clone, Debug)]
pub(super) struct TargetObject {
    pub path: String,
    pub model: String,
    pub weight: u32,
}

/// One rule as written: the models it matches (empty: every model) and its targets.
#[derive(Clone, Debug)]
pub(super) struct RuleObject {
    pub path: String,
    /// Each matched name with the path it was given at.
    pub models: Vec<(String, String)>,
    pub targets: Vec<TargetObject>,
}

/// An `InferenceModelRewrite`, checked on its own.
#[derive(Clone, Debug)]
pub(super) struct RewriteObject {
    /// `InferenceModelRewrite <name>`, for errors.
    pub label: String,
    pub name: String,
    pub pool: String,
    pub rules: Vec<RuleObject>,
}

/// Reads item `index` of the list; `Ok(None)` for `null` (an empty YAML document).
pub(super) fn parse_object(
    index: usize,
    value: &Value,
) -> Result<Option<RewriteObject>, RewriteError> {
    let at = format!("modelRewrites[{index}]");
    let Some(map) = objects::list_item(&at, value, "an InferenceModelRewrite")? else {
        return Ok(None);
    };
    let kind = objects::type_field(map, "kind");
    if kind != KIND {
        return Err(ObjectError::wrong_object(at, "kind", kind, kinds_taken()).into());
    }
    let unnamed = format!("{KIND} {at}");
    let api_version = objects::type_field(map, "apiVersion");
    if !API_VERSIONS.contains(&api_version) {
        return Err(
            ObjectError::wrong_object(unnamed, "apiVersion", api_version, kinds_taken()).into(),
        );
    }
    let f = Fields::new(unnamed, MAPPING);
    let metadata = f.required_map(map, "", "metadata")?;
    let name = f.required_string(metadata, "metadata", "name")?.to_owned();
    let f = Fields::new(format!("{KIND} {name}"), MAPPING);
    f.only(map, "", TOP_KEYS)?;
    let spec = f.required_map(map, "", "spec")?;
    f.only(spec, "spec", &["poolRef", "rules"])?;
    let pool_ref = f.required_map(spec, "spec", "poolRef")?;
    f.only(pool_ref, "spec.poolRef", &["group", "kind", "name"])?;
    if let Some(group) = f.optional_string(pool_ref, "spec.poolRef", "group")? {
        if !POOL_GROUPS.contains(&group) {
            return Err(f
                .bad_value("spec.poolRef.group", group, &POOL_GROUPS.join(" or "))
                .into());
        }
    }
    if let Some(kind) = f.optional_string(pool_ref, "spec.poolRef", "kind")? {
        if kind != "InferencePool" {
            return Err(f
                .bad_value("spec.poolRef.kind", kind, "InferencePool")
                .into());
        }
    }
    let pool = f
        .required_string(pool_ref, "spec.poolRef", "name")?
        .to_owned();
    let mut rules = Vec::new();
    for (i, item) in f.required_array(spec, "spec", "rules")?.iter().enumerate() {
        rules.push(rule(&f, &format!("spec.rules[{i}]"), item)?);
    }
    Ok(Some(RewriteObject {
        label: f.object,
        name,
        pool,
        rules,
    }))
}

fn rule(f: &Fields, at: &str, item: &Value) -> Result<RuleObject, RewriteError> {
    let map = f.map(at, item)?;
    f.only(map, at, &["matches", "targets"])?;
    let mut models = Vec::new();
    // An absent `matches`, like an empty one, matches every model.
    if let Some(list) = f.optional_array(map, at, "matches")? {
        for (j, m) in list.iter().enumerate() {
            let mat = format!("{at}.matches[{j}]");
            let m = f.map(&mat, m)?;
            f.only(m, &mat, &["model"])?;
            let model_at = format!("{mat}.model");
            let model = f.required_map(m, &mat, "model")?;
            f.only(model, &model_at, &["type", "value"])?;
            if let Some(kind) = f.optional_string(model, &model_at, "type")? {
                if kind != "Exact" {
                    return Err(f
                        .bad_value(&format!("{model_at}.type"), kind, "Exact")
                        .into());
                }
            }
            let value = f.required_string(model, &model_at, "value")?;
            models.push((format!("{model_at}.value"), value.to_owned()));
        }
    }
    let list = f.required_array(map, at, "targets")?;
    if list.is_empty() {
        return Err(f
            .bad_value(&format!("{at}.targets"), "[]", "at least one target")
            .into());
    }
    let mut targets = Vec::new();
    for (k, t) in list.iter().enumerate() {
        let path = format!("{at}.targets[{k}]");
        let t = f.map(&path, t)?;
        f.only(t, &path, &["modelRewrite", "weight"])?;
        let model = f.required_string(t, &path, "modelRewrite")?.to_owned();
        let weight = match t.get("weight") {
            None | Some(Value::Null) => 1,
            Some(w) => weight(f, &format!("{path}.weight"), w)?,
        };
        targets.push(TargetObject {
            path,
            model,
            weight,
        });
    }
    if targets.iter().all(|t| t.weight == 0) {
        return Err(RewriteError::AllWeightsZero {
            object: f.object.clone(),
            path: format!("{at}.targets"),
        });
    }
    Ok(RuleObject {
        path: at.to_owned(),
        models,
        targets,
    })
}

/// The kind and versions taken, for a wrong `kind` or `apiVersion`.
fn kinds_taken() -> String {
    format!(
        "kind `{KIND}`, apiVersion one of {}",
        API_VERSIONS.join(", ")
    )
}

/// A weight: an integer in `0..=MAX_WEIGHT` (JSON `90` or `90.0`, as YAML may give it).
fn weight(f: &Fields, path: &str, value: &Value) -> Result<u32, RewriteError> {
    let expected = "a non-negative integer";
    let Some(n) = value.as_number() else {
        return Err(f.wrong_type(path, expected).into());
    };
    let whole = n.as_u64().or_else(|| {
        n.as_f64()
            .filter(|x| x.fract() == 0.0 && *x >= 0.0)
            .map(|x| x as u64)
    });
    match whole {
        Some(w) if w <= MAX_WEIGHT => Ok(u32::try_from(w).unwrap_or(u32::MAX)),
        _ => Err(f
            .bad_value(
                path,
                &n.to_string(),
                &format!("{expected} of at most {MAX_WEIGHT}"),
            )
            .into()),
    }
}
