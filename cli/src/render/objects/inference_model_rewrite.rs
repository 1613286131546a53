//! `InferenceModelRewrite`: a model name rewritten to weighted targets (a version split).

/// `llm-d.ai/v1alpha2` (and the inference extension's names for the same schema).
pub mod v1alpha2 {
    use crate::render::objects::meta::{ObjectMeta, Opened};
    use crate::render::objects::reader::ObjectError;
    use crate::render::report::Report;
    use serde_json::Value as Json;

    /// The apiVersions this module reads: the router's own list.
    pub const API_VERSIONS: &[&str] = infergate_filters::rewrite::API_VERSIONS;
    /// The kind.
    pub const KIND: &str = infergate_filters::rewrite::KIND;

    /// One `InferenceModelRewrite`.
    #[derive(Clone, Debug, PartialEq)]
    pub struct InferenceModelRewrite {
        /// Its name and namespace.
        pub meta: ObjectMeta,
        /// `InferenceModelRewrite <namespace>/<name>`.
        pub label: String,
        /// `spec.poolRef.name`: the `InferencePool` it rewrites for.
        pub pool: String,
        /// Every `spec.rules[].targets[].modelRewrite`, in order, each once.
        pub targets: Vec<String>,
        /// The document, which the router compiles (every field checked there).
        pub document: Json,
    }

    /// Reads an `InferenceModelRewrite` document.
    pub fn read(doc: &Json, report: &mut Report) -> Result<InferenceModelRewrite, ObjectError> {
        let object = Opened::read(doc, KIND, report)?;
        let label = object.label.as_str();
        let spec = object.spec(&["poolRef", "rules"])?;
        let pool_ref = spec.required("poolRef")?;
        pool_ref.node().only(&["group", "kind", "name"])?;
        let pool = pool_ref.node().req_string("name")?.to_owned();
        report.used(
            label,
            "spec.poolRef",
            "the pool whose router entry the rules apply to",
        );
        let mut targets: Vec<String> = Vec::new();
        for rule in spec.required("rules")?.node().list()? {
            let r = rule.node();
            r.only(&["matches", "targets"])?;
            for m in r.opt_list("matches")? {
                m.node().only(&["model"])?;
                if let Some(model) = m.node().get("model")? {
                    model.node().only(&["type", "value"])?;
                }
            }
            for t in r.required("targets")?.node().list()? {
                t.node().only(&["modelRewrite", "weight"])?;
                let model = t.node().req_string("modelRewrite")?.to_owned();
                if !targets.contains(&model) {
                    targets.push(model);
                }
            }
        }
        report.used(
            label,
            "spec.rules",
            "the router's model rewrites (Exact matches, weighted targets; sticky on the \
             session or tenant); the targets are the pool's adapters",
        );
        Ok(InferenceModelRewrite {
            meta: object.meta,
            label: object.label,
            pool,
            targets,
            document: doc.clone(),
        })
    }
}
