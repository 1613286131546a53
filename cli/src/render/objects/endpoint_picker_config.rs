//! `EndpointPickerConfig`: llm-d's scheduling configuration (plugins, profiles, flow
//! control), usually carried as a file inside a `ConfigMap`.

/// `llm-d.ai/v1alpha1`.
pub mod v1alpha1 {
    use crate::render::objects::reader::{Node, ObjectError};
    use crate::render::report::Report;
    use serde_json::Value as Json;

    /// The apiVersions this module reads: llm-d's, and the inference extension's older
    /// name for the same schema.
    pub const API_VERSIONS: &[&str] = &[
        "llm-d.ai/v1alpha1",
        "inference.networking.x-k8s.io/v1alpha1",
    ];
    /// The kind.
    pub const KIND: &str = "EndpointPickerConfig";

    /// One `EndpointPickerConfig`: the document, for the picker's `eppConfig`, and its
    /// typed form (the core's), which is what the picker compiles.
    #[derive(Clone, Debug, PartialEq)]
    pub struct EndpointPickerConfig {
        /// Where it was given (`ConfigMap serving/x data[epp.yaml]`, or the file's object).
        pub label: String,
        /// The `ConfigMap`'s name when it came in one.
        pub config_map: Option<String>,
        /// The document as written.
        pub document: Json,
        /// The core's typed reading of it.
        pub typed: scheduler_core::scheduling::config::EndpointPickerConfig,
    }

    /// Reads the document `doc`, labelled `label`.
    pub fn read(
        doc: &Json,
        label: String,
        config_map: Option<String>,
        report: &mut Report,
    ) -> Result<EndpointPickerConfig, ObjectError> {
        let root = Node::root(&label, doc);
        root.only(&[
            "apiVersion",
            "kind",
            "featureGates",
            "plugins",
            "schedulingProfiles",
            "flowControl",
            "saturationDetector",
            "data",
        ])?;
        for (key, how) in [
            (
                "plugins",
                "the picker's plugins, compiled with every parameter checked",
            ),
            (
                "schedulingProfiles",
                "the picker's profiles (filters in order, weighted scorers, the picker)",
            ),
            (
                "flowControl",
                "the picker pool's flow control: bands, limits, TTL, saturation detector, flows",
            ),
        ] {
            if root.get(key)?.is_some() {
                report.used(&label, key, how);
            }
        }
        for gate in root.opt_list("featureGates")? {
            match gate.node().string()? {
                "flowControl" => {
                    report.used(&label, &gate.path, "flowControl: turns flow control on")
                }
                other => report.not_supported(
                    &label,
                    &gate.path,
                    format!("feature gate `{other}` is not implemented; it changes nothing"),
                ),
            }
        }
        for (key, why) in [
            (
                "saturationDetector",
                "the saturation detector is named by flowControl.saturationDetector",
            ),
            ("data", "metrics come from the gateway's own scraper"),
        ] {
            if root.get(key)?.is_some() {
                report.not_supported(&label, key, why);
            }
        }
        let typed = serde_json::from_value(doc.clone())
            .map_err(|e| root.error(format!("not an EndpointPickerConfig: {e}")))?;
        Ok(EndpointPickerConfig {
            label,
            config_map,
            document: doc.clone(),
            typed,
        })
    }
}
