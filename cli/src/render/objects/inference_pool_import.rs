//! `InferencePoolImport`: a pool exported from other clusters of a ClusterSet (the pool's
//! `inference.networking.x-k8s.io/export: ClusterSet` annotation there), as the inference
//! extension's multi-cluster controller writes it in the importing cluster. It has no
//! `spec`: the controller fills `status.controllers[]`, each naming the clusters that export
//! the pool (`exportingClusters[].name`). It has the exported pool's namespace and name.

/// `inference.networking.x-k8s.io/v1alpha1`.
pub mod v1alpha1 {
    use crate::render::objects::meta::ObjectMeta;
    use crate::render::objects::reader::{Node, ObjectError};
    use crate::render::report::Report;
    use serde_json::Value as Json;

    /// The apiVersion this module reads.
    pub const API_VERSION: &str = "inference.networking.x-k8s.io/v1alpha1";
    /// The kind.
    pub const KIND: &str = "InferencePoolImport";

    /// One `InferencePoolImport`.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct InferencePoolImport {
        /// Its name and namespace: the exported pool's.
        pub meta: ObjectMeta,
        /// `InferencePoolImport <namespace>/<name>`.
        pub label: String,
        /// Every `status.controllers[].exportingClusters[].name`, each once, in order.
        pub exporting_clusters: Vec<String>,
    }

    /// Reads an `InferencePoolImport` document.
    pub fn read(doc: &Json, report: &mut Report) -> Result<InferencePoolImport, ObjectError> {
        let (meta, label) = ObjectMeta::read(&Node::root(KIND, doc), KIND, report)?;
        let root = Node::root(&label, doc);
        root.only(&["apiVersion", "kind", "metadata", "status"])?;
        let mut exporting_clusters: Vec<String> = Vec::new();
        let Some(status) = root.get("status")? else {
            report.not_supported(
                &label,
                "status",
                "absent: no cluster exports the pool yet, so it has no peer",
            );
            return Ok(InferencePoolImport {
                meta,
                label,
                exporting_clusters,
            });
        };
        let status = status.node();
        status.only(&["controllers"])?;
        for controller in status.opt_list("controllers")? {
            let c = controller.node();
            c.only(&["name", "exportingClusters", "parents", "conditions"])?;
            c.req_string("name")?;
            for cluster in c.opt_list("exportingClusters")? {
                let n = cluster.node();
                n.only(&["name"])?;
                let name = n.req_string("name")?.to_owned();
                if !exporting_clusters.contains(&name) {
                    exporting_clusters.push(name);
                }
            }
            for key in ["parents", "conditions"] {
                if c.get(key)?.is_some() {
                    report.not_supported(
                        &label,
                        &format!("{}.{key}", c.path()),
                        "written for the controllers; the renderer ignores it",
                    );
                }
            }
        }
        report.used(
            &label,
            "status.controllers[].exportingClusters",
            "the peer clusters of the local pool of the same name; their gateways come from \
             the peers file (--peers)",
        );
        Ok(InferencePoolImport {
            meta,
            label,
            exporting_clusters,
        })
    }
}
