//! The user's Kubernetes objects, typed by kind and apiVersion: one module per kind, one
//! sub-module per apiVersion (`inference_pool::v1`, `http_route::v1`, …), so a new version
//! of a kind is a new module beside the old one.
//!
//! [`load_dir`] reads every `*.yaml`, `*.yml` and `*.json` file of a directory (in file-name
//! order; several YAML documents per file) and dispatches each document on its
//! `(apiVersion, kind)`:
//!
//! | kind | apiVersion | module |
//! |---|---|---|
//! | `InferencePool` | `inference.networking.k8s.io/v1` | [`inference_pool::v1`] |
//! | `InferencePoolImport` | `inference.networking.x-k8s.io/v1alpha1` | [`inference_pool_import::v1alpha1`] |
//! | `HTTPRoute` | `gateway.networking.k8s.io/v1` | [`http_route::v1`] |
//! | `ConfigMap` (holding an `EndpointPickerConfig`) | `v1` | [`config_map::v1`] |
//! | `EndpointPickerConfig` | `llm-d.ai/v1alpha1` | [`endpoint_picker_config::v1alpha1`] |
//! | `InferenceObjective` | `llm-d.ai/v1alpha2` | [`inference_objective::v1alpha2`] |
//! | `InferenceModelRewrite` | `llm-d.ai/v1alpha2` | [`inference_model_rewrite::v1alpha2`] |
//! | `TenantQuota` | `mini-platform.local/v1alpha1` | [`tenant_quota::v1alpha1`] |
//!
//! A known kind in an apiVersion no module reads is an error naming both; a kind the gateway
//! does not read (a `Deployment` kept beside the objects) is reported as not used. Within a
//! version, an unknown field is an error naming its path; a known field the gateway does
//! not honour is reported ([`crate::render::report`]). Two objects of one kind, namespace
//! and name: the later file's replaces the earlier's, as `kubectl apply -f DIR` would, and
//! the report says so.

pub mod config_map;
pub mod endpoint_picker_config;
pub mod http_route;
pub mod inference_model_rewrite;
pub mod inference_objective;
pub mod inference_pool;
pub mod inference_pool_import;
pub mod meta;
pub mod reader;
pub mod tenant_quota;

use super::report::Report;
use crate::config::tenancy::parse_documents;
use anyhow::{Context, Result};
use reader::ObjectError;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

/// One object, in the version it was written in.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    /// `InferencePool` v1.
    InferencePoolV1(inference_pool::v1::InferencePool),
    /// `InferencePoolImport` v1alpha1.
    InferencePoolImportV1alpha1(inference_pool_import::v1alpha1::InferencePoolImport),
    /// `HTTPRoute` v1.
    HttpRouteV1(http_route::v1::HttpRoute),
    /// `EndpointPickerConfig` v1alpha1 (alone, or from a `ConfigMap` v1).
    EndpointPickerConfigV1alpha1(endpoint_picker_config::v1alpha1::EndpointPickerConfig),
    /// `InferenceObjective` v1alpha2.
    InferenceObjectiveV1alpha2(inference_objective::v1alpha2::InferenceObjective),
    /// `InferenceModelRewrite` v1alpha2.
    InferenceModelRewriteV1alpha2(inference_model_rewrite::v1alpha2::InferenceModelRewrite),
    /// `TenantQuota` v1alpha1.
    TenantQuotaV1alpha1(tenant_quota::v1alpha1::TenantQuota),
}

impl Object {
    /// How reports name it.
    pub fn label(&self) -> &str {
        match self {
            Object::InferencePoolV1(o) => &o.label,
            Object::InferencePoolImportV1alpha1(o) => &o.label,
            Object::HttpRouteV1(o) => &o.label,
            Object::EndpointPickerConfigV1alpha1(o) => &o.label,
            Object::InferenceObjectiveV1alpha2(o) => &o.label,
            Object::InferenceModelRewriteV1alpha2(o) => &o.label,
            Object::TenantQuotaV1alpha1(o) => &o.label,
        }
    }
}

/// An object and the file it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Sourced {
    /// The object.
    pub object: Object,
    /// Its file.
    pub file: PathBuf,
}

/// Every object of a directory, and what became of each field so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObjectSet {
    /// The objects, in file-name order (a replaced object is gone).
    pub objects: Vec<Sourced>,
    /// The report, to which rendering adds.
    pub report: Report,
}

impl ObjectSet {
    /// The objects of one variant, through `pick`.
    pub fn of<'a, T>(&'a self, pick: impl Fn(&'a Object) -> Option<&'a T>) -> Vec<&'a T> {
        self.objects
            .iter()
            .filter_map(|s| pick(&s.object))
            .collect()
    }
}

/// Dispatches one document on `(apiVersion, kind)`; `Ok(vec![])` for a kind the gateway
/// does not read (reported).
pub fn read_document(
    doc: &Json,
    where_: &str,
    report: &mut Report,
) -> Result<Vec<Object>, ObjectError> {
    let field = |k: &str| doc.get(k).and_then(Json::as_str).unwrap_or("").to_owned();
    let (version, kind) = (field("apiVersion"), field("kind"));
    let known: &[(&str, &[&str])] = &[
        (inference_pool::v1::KIND, &[inference_pool::v1::API_VERSION]),
        (
            inference_pool_import::v1alpha1::KIND,
            &[inference_pool_import::v1alpha1::API_VERSION],
        ),
        (http_route::v1::KIND, &[http_route::v1::API_VERSION]),
        (config_map::v1::KIND, &[config_map::v1::API_VERSION]),
        (
            endpoint_picker_config::v1alpha1::KIND,
            endpoint_picker_config::v1alpha1::API_VERSIONS,
        ),
        (
            inference_objective::v1alpha2::KIND,
            &[inference_objective::v1alpha2::API_VERSION],
        ),
        (
            inference_model_rewrite::v1alpha2::KIND,
            inference_model_rewrite::v1alpha2::API_VERSIONS,
        ),
        (
            tenant_quota::v1alpha1::KIND,
            &[tenant_quota::v1alpha1::API_VERSION],
        ),
    ];
    let Some((_, versions)) = known.iter().find(|(k, _)| *k == kind) else {
        let name = doc["metadata"]["name"].as_str().unwrap_or("(unnamed)");
        report.not_supported(
            &format!("{} {name}", if kind.is_empty() { "(no kind)" } else { &kind }),
            "",
            format!("{where_}: apiVersion `{version}` kind `{kind}` is not an object the gateway reads; not used"),
        );
        return Ok(Vec::new());
    };
    if !versions.contains(&version.as_str()) {
        return Err(ObjectError {
            object: format!("{kind} in {where_}"),
            path: "apiVersion".into(),
            problem: format!(
                "`{version}` is not a version of {kind} this renderer reads (it reads {})",
                versions.join(", ")
            ),
        });
    }
    Ok(match kind.as_str() {
        inference_pool::v1::KIND => vec![Object::InferencePoolV1(inference_pool::v1::read(
            doc, report,
        )?)],
        inference_pool_import::v1alpha1::KIND => vec![Object::InferencePoolImportV1alpha1(
            inference_pool_import::v1alpha1::read(doc, report)?,
        )],
        http_route::v1::KIND => vec![Object::HttpRouteV1(http_route::v1::read(doc, report)?)],
        config_map::v1::KIND => config_map::v1::read(doc, report)?
            .into_iter()
            .map(Object::EndpointPickerConfigV1alpha1)
            .collect(),
        endpoint_picker_config::v1alpha1::KIND => {
            let name = doc["metadata"]["name"].as_str().unwrap_or("");
            let label = format!(
                "EndpointPickerConfig {where_}{}",
                if name.is_empty() {
                    String::new()
                } else {
                    format!(" {name}")
                }
            );
            vec![Object::EndpointPickerConfigV1alpha1(
                endpoint_picker_config::v1alpha1::read(doc, label, None, report)?,
            )]
        }
        inference_objective::v1alpha2::KIND => vec![Object::InferenceObjectiveV1alpha2(
            inference_objective::v1alpha2::read(doc, report)?,
        )],
        inference_model_rewrite::v1alpha2::KIND => vec![Object::InferenceModelRewriteV1alpha2(
            inference_model_rewrite::v1alpha2::read(doc, report)?,
        )],
        _ => vec![Object::TenantQuotaV1alpha1(tenant_quota::v1alpha1::read(
            doc, report,
        )?)],
    })
}

/// Whether `path` is a file [`load_dir`] reads.
fn is_object_file(path: &Path) -> bool {
    path.is_file()
        && matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        )
}

/// Every object in the directory `dir` (see the module doc). Errors name the file.
pub fn load_dir(dir: &Path) -> Result<ObjectSet> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let file = entry
            .with_context(|| format!("listing {}", dir.display()))?
            .path();
        if is_object_file(&file) {
            files.push(file);
        }
    }
    files.sort();
    let mut set = ObjectSet::default();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        let name = file
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let docs = parse_documents(&text).with_context(|| format!("in {}", file.display()))?;
        for (i, doc) in docs.iter().enumerate() {
            let where_ = if docs.len() > 1 {
                format!("{name} document {}", i + 1)
            } else {
                name.clone()
            };
            let mark = set.report.len();
            let objects = read_document(doc, &where_, &mut set.report)
                .with_context(|| format!("in {}", file.display()))?;
            for object in objects {
                add(
                    &mut set,
                    Sourced {
                        object,
                        file: file.clone(),
                    },
                    mark,
                );
            }
        }
    }
    Ok(set)
}

/// Adds `new` (whose report entries start at `mark`), replacing an earlier object of the
/// same label (kind, namespace, name), whose entries are dropped.
fn add(set: &mut ObjectSet, new: Sourced, mark: usize) {
    let label = new.object.label().to_owned();
    if let Some(i) = set.objects.iter().position(|s| s.object.label() == label) {
        let old = set.objects.remove(i);
        set.report.forget(&label, mark);
        let file = |p: &Path| {
            p.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        };
        let text = if old.object == new.object {
            format!(
                "given again in {}, identical; counted once",
                file(&new.file)
            )
        } else {
            format!(
                "the one in {} is replaced by the one in {} (same kind, namespace and name; \
                 `kubectl apply -f DIR` keeps the last file's)",
                file(&old.file),
                file(&new.file)
            )
        };
        set.report.not_supported(&label, "", text);
    }
    set.objects.push(new);
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests;
