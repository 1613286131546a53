//! `ConfigMap`: here, only as the carrier of an `EndpointPickerConfig` file, as llm-d
//! deployments ship their scheduling configuration.

/// `v1`.
pub mod v1 {
    use crate::config::tenancy::parse_documents;
    use crate::render::objects::endpoint_picker_config::v1alpha1::{self, EndpointPickerConfig};
    use crate::render::objects::meta::ObjectMeta;
    use crate::render::objects::reader::{Node, ObjectError};
    use crate::render::report::Report;
    use serde_json::Value as Json;

    /// The apiVersion this module reads.
    pub const API_VERSION: &str = "v1";
    /// The kind.
    pub const KIND: &str = "ConfigMap";

    /// Reads a `ConfigMap` document: the `EndpointPickerConfig`s its `data` holds (each
    /// entry whose text is one); every other entry is reported as not used.
    pub fn read(doc: &Json, report: &mut Report) -> Result<Vec<EndpointPickerConfig>, ObjectError> {
        let unnamed = KIND.to_owned();
        let (meta, label) = ObjectMeta::read(&Node::root(&unnamed, doc), KIND, report)?;
        let root = Node::root(&label, doc);
        root.only(&[
            "apiVersion",
            "kind",
            "metadata",
            "data",
            "binaryData",
            "immutable",
        ])?;
        for key in ["binaryData", "immutable"] {
            if root.get(key)?.is_some() {
                report.not_supported(&label, key, "only `data` can carry an EndpointPickerConfig");
            }
        }
        let mut out = Vec::new();
        let Some(data) = root.get("data")? else {
            report.not_supported(&label, "", "no `data`: the ConfigMap is not used");
            return Ok(out);
        };
        for (key, value) in data.node().map()? {
            let path = format!("data.{key}");
            let text = value
                .as_str()
                .ok_or_else(|| root.error_at(&path, "must be a string"))?;
            let document = match parse_documents(text) {
                Ok(mut docs) if docs.len() == 1 => docs.remove(0),
                _ => {
                    report.not_supported(
                        &label,
                        &path,
                        "not an EndpointPickerConfig document; not used",
                    );
                    continue;
                }
            };
            let kind = document.get("kind").and_then(Json::as_str).unwrap_or("");
            if kind != v1alpha1::KIND {
                report.not_supported(
                    &label,
                    &path,
                    format!("a `{kind}` document, not an EndpointPickerConfig; not used"),
                );
                continue;
            }
            let version = document
                .get("apiVersion")
                .and_then(Json::as_str)
                .unwrap_or("");
            if !v1alpha1::API_VERSIONS.contains(&version) {
                return Err(root.error_at(
                    &format!("{path}: apiVersion"),
                    format!(
                        "`{version}`: EndpointPickerConfig is read in {}",
                        v1alpha1::API_VERSIONS.join(", ")
                    ),
                ));
            }
            report.used(&label, &path, "the EndpointPickerConfig below");
            let inner = format!("EndpointPickerConfig in {label} {path}");
            out.push(v1alpha1::read(
                &document,
                inner,
                Some(meta.name.clone()),
                report,
            )?);
        }
        if out.is_empty() {
            report.not_supported(
                &label,
                "data",
                "no entry holds an EndpointPickerConfig: the ConfigMap is not used",
            );
        }
        Ok(out)
    }
}
