//! Kubernetes `ObjectMeta`: the name and namespace every object is known by, and the keys
//! the API server writes, which are accepted and have no effect here.

use super::reader::{Node, ObjectError};
use crate::render::report::Report;
use serde_json::Value as Json;

/// `ObjectMeta` keys: `name` and `namespace` are read; `labels` and `annotations` are
/// reported (nothing selects on them here); the rest are written by the API server and
/// carry no configuration.
const KEYS: &[&str] = infergate_filters::objects::OBJECT_META_KEYS;

/// An object's identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMeta {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`; `None` when the object does not say (Kubernetes would put it
    /// in the namespace it is applied to).
    pub namespace: Option<String>,
    /// `metadata.annotations` whose keys the object's kind reads (see [`Opened::annotated`]),
    /// as written; every other annotation is reported as not used.
    pub annotations: Vec<(String, String)>,
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
        ObjectMeta::read_annotated(root, kind, &[], report)
    }

    /// [`ObjectMeta::read`], keeping the annotations of `known` keys (string values).
    pub fn read_annotated(
        root: &Node<'_>,
        kind: &str,
        known: &[&str],
        report: &mut Report,
    ) -> Result<(ObjectMeta, String), ObjectError> {
        let metadata = root.required("metadata")?;
        let m = metadata.node();
        m.only(KEYS)?;
        let name = m.req_string("name")?.to_owned();
        let namespace = m.opt_string("namespace")?.map(str::to_owned);
        let given_annotations = m.get("annotations")?;
        let mut annotations = Vec::new();
        if let Some(given) = &given_annotations {
            for key in known {
                if let Some(value) = given.node().opt_string(key)? {
                    annotations.push(((*key).to_owned(), value.to_owned()));
                }
            }
        }
        let meta = ObjectMeta {
            name,
            namespace,
            annotations,
        };
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
        if m.get("labels")?.is_some() {
            report.not_supported(
                &label,
                "metadata.labels",
                "nothing in the rendered configuration selects on them",
            );
        }
        let others = match given_annotations {
            Some(given) => given
                .node()
                .map()?
                .keys()
                .any(|k| !known.contains(&k.as_str())),
            None => false,
        };
        if others {
            report.not_supported(
                &label,
                "metadata.annotations",
                "nothing in the rendered configuration reads them (but the keys the kind \
                 names)",
            );
        }
        Ok((meta, label))
    }

    /// The annotation `key`, if the object has it and its kind reads it.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The top-level keys of an object with a `spec` and a `status`.
const TOP_KEYS: &[&str] = &["apiVersion", "kind", "metadata", "spec", "status"];

/// The opening every reader of a `spec`-and-`status` kind shares: `metadata` read (and
/// reported), any top-level key but `apiVersion`, `kind`, `metadata`, `spec` and `status`
/// refused, a `status` reported as not used. [`Opened::spec`] then gives the `spec` node.
///
/// It keeps the label and the document rather than the `spec` node itself, because a
/// [`Node`] borrows the label it names errors with.
#[derive(Clone, Debug)]
pub struct Opened<'d> {
    /// The object's name and namespace.
    pub meta: ObjectMeta,
    /// `<kind> <namespace>/<name>`.
    pub label: String,
    /// The whole document.
    doc: &'d Json,
}

impl<'d> Opened<'d> {
    /// Opens the document `doc` of kind `kind` (errors before its name is known are
    /// labelled by the kind alone).
    pub fn read(doc: &'d Json, kind: &str, report: &mut Report) -> Result<Self, ObjectError> {
        Opened::annotated(doc, kind, &[], report)
    }

    /// [`Opened::read`], keeping the annotations of `known` keys in the meta.
    pub fn annotated(
        doc: &'d Json,
        kind: &str,
        known: &[&str],
        report: &mut Report,
    ) -> Result<Self, ObjectError> {
        let (meta, label) =
            ObjectMeta::read_annotated(&Node::root(kind, doc), kind, known, report)?;
        let root = Node::root(&label, doc);
        root.only(TOP_KEYS)?;
        report_status(&root, &label, report)?;
        Ok(Opened { meta, label, doc })
    }

    /// `spec`, which must be present and hold no key but `keys`.
    pub fn spec(&self, keys: &[&str]) -> Result<Node<'_>, ObjectError> {
        let spec = Node::root(&self.label, self.doc).required("spec")?;
        spec.only(keys)?;
        Ok(spec)
    }
}

/// Reports a `status` (written by controllers) as not used.
fn report_status(root: &Node<'_>, label: &str, report: &mut Report) -> Result<(), ObjectError> {
    if root.get("status")?.is_some() {
        report.not_supported(
            label,
            "status",
            "written by controllers; the renderer ignores it",
        );
    }
    Ok(())
}
