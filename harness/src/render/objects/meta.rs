//! Kubernetes `ObjectMeta`: the name and namespace every object is known by, and the keys
//! the API server writes, which are accepted and have no effect here.

use super::reader::{Node, ObjectError};
use crate::render::report::Report;

/// `ObjectMeta` keys: `name` and `namespace` are read; `labels` and `annotations` are
/// reported (nothing selects on them here); the rest are written by the API server and
/// carry no configuration.
const KEYS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// An object's identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMeta {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`; `None` when the object does not say (Kubernetes would put it
    /// in the namespace it is applied to).
    pub namespace: Option<String>,
}

impl ObjectMeta {
    /// `namespace/name`, or `name` without a namespace.
    pub fn qualified(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }

    /// `<kind> <namespace>/<name>`: how reports and errors name the object.
    pub fn label(&self, kind: &str) -> String {
        format!("{kind} {}", self.qualified())
    }

    /// Reads `metadata` of `root` (labelled `unnamed` until its name is known); returns the
    /// meta and the object's label.
    pub fn read(
        root: &Node<'_>,
        kind: &str,
        report: &mut Report,
    ) -> Result<(ObjectMeta, String), ObjectError> {
        let metadata = root.required("metadata")?;
        let m = metadata.node();
        m.only(KEYS)?;
        let name = m.req_string("name")?.to_owned();
        let namespace = m.opt_string("namespace")?.map(str::to_owned);
        let meta = ObjectMeta { name, namespace };
        let label = meta.label(kind);
        report.used(
            &label,
            "metadata.name",
            "names the object in the rendered configuration",
        );
        if meta.namespace.is_some() {
            report.used(
                &label,
                "metadata.namespace",
                "qualifies the name; references between objects stay within one namespace",
            );
        }
        for key in ["labels", "annotations"] {
            if m.get(key)?.is_some() {
                report.not_supported(
                    &label,
                    &format!("metadata.{key}"),
                    "nothing in the rendered configuration selects on them",
                );
            }
        }
        Ok((meta, label))
    }
}

/// Reports a `status` (written by controllers) as not used.
pub fn report_status(root: &Node<'_>, label: &str, report: &mut Report) -> Result<(), ObjectError> {
    if root.get("status")?.is_some() {
        report.not_supported(
            label,
            "status",
            "written by controllers; the renderer ignores it",
        );
    }
    Ok(())
}
