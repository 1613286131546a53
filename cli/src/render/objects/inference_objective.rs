//! `InferenceObjective`: an objective name (which a tenant's requests carry) and its
//! priority in flow control.

/// `llm-d.ai/v1alpha2`.
pub mod v1alpha2 {
    use crate::render::objects::meta::{ObjectMeta, Opened};
    use crate::render::objects::reader::ObjectError;
    use crate::render::report::Report;
    use serde_json::Value as Json;

    /// The apiVersion this module reads.
    pub const API_VERSION: &str = "llm-d.ai/v1alpha2";
    /// The kind.
    pub const KIND: &str = "InferenceObjective";

    /// One `InferenceObjective`.
    #[derive(Clone, Debug, PartialEq)]
    pub struct InferenceObjective {
        /// Its name and namespace.
        pub meta: ObjectMeta,
        /// `InferenceObjective <namespace>/<name>`.
        pub label: String,
        /// `spec.priority` (0 when absent).
        pub priority: i32,
        /// `spec.poolRef.name`.
        pub pool: Option<String>,
        /// The document, which the picker (and the tenant stage) take as it is.
        pub document: Json,
    }

    /// Reads an `InferenceObjective` document.
    pub fn read(doc: &Json, report: &mut Report) -> Result<InferenceObjective, ObjectError> {
        let object = Opened::read(doc, KIND, report)?;
        let label = object.label.as_str();
        let spec = object.spec(&["priority", "poolRef"])?;
        let priority = match spec.get("priority")? {
            None => 0,
            Some(p) => {
                let v = p.node().i64()?;
                i32::try_from(v).map_err(|_| p.node().error("must be a 32-bit integer"))?
            }
        };
        report.used(
            label,
            "spec.priority",
            "the priority band of requests carrying this objective (picker `objectives`)",
        );
        let pool = match spec.get("poolRef")? {
            None => None,
            Some(r) => {
                let r = r.node();
                r.only(&["group", "kind", "name"])?;
                Some(r.req_string("name")?.to_owned())
            }
        };
        Ok(InferenceObjective {
            meta: object.meta,
            label: object.label,
            priority,
            pool,
            document: doc.clone(),
        })
    }
}
