//! Reading one object's fields from its JSON form (a YAML document converted), each error
//! naming the object and the field's path, so a user finds the line in their YAML. A `null`
//! value (a key with nothing after it) counts as absent.

use serde_json::{Map, Value as Json};
use std::fmt;

/// A field of an object the renderer refuses: unknown, missing, mistyped or with a value
/// the gateway cannot honour.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectError {
    /// The object (`InferencePool serving/llama-70b-bf16`, or the document before its name
    /// is known).
    pub object: String,
    /// The field's path (`spec.targetPorts[0].number`); empty for the object as a whole.
    pub path: String,
    /// What is wrong.
    pub problem: String,
}

impl fmt::Display for ObjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.object, self.problem)
        } else {
            write!(f, "{} {}: {}", self.object, self.path, self.problem)
        }
    }
}

impl std::error::Error for ObjectError {}

/// One value of an object, with the object's label and the value's path.
#[derive(Clone, Debug)]
pub struct Node<'a> {
    /// The object's label, for errors.
    pub object: &'a str,
    /// The JSON value.
    pub value: &'a Json,
    /// The value's path.
    pub path: String,
}

/// A value found under a node (the same thing, by another name where it reads better).
pub type Field<'a> = Node<'a>;

/// `prefix.key`, or `key` at the top.
pub fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

impl<'a> Node<'a> {
    /// The whole object `value`, labelled `object`.
    pub fn root(object: &'a str, value: &'a Json) -> Self {
        Node {
            object,
            value,
            path: String::new(),
        }
    }

    /// This node, to read further (a copy: nodes are cheap).
    pub fn node(&self) -> Node<'a> {
        self.clone()
    }

    /// This node's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// An error about this node.
    pub fn error(&self, problem: impl Into<String>) -> ObjectError {
        ObjectError {
            object: self.object.to_owned(),
            path: self.path.clone(),
            problem: problem.into(),
        }
    }

    /// An error about the key `key` of this node.
    pub fn error_at(&self, key: &str, problem: impl Into<String>) -> ObjectError {
        ObjectError {
            object: self.object.to_owned(),
            path: join(&self.path, key),
            problem: problem.into(),
        }
    }

    /// This node as a mapping.
    pub fn map(&self) -> Result<&'a Map<String, Json>, ObjectError> {
        self.value
            .as_object()
            .ok_or_else(|| self.error("must be a mapping"))
    }

    /// Refuses the first key not in `known`: a field this version of the kind does not
    /// have (a typo, or a newer version's field), which the renderer cannot have honoured.
    pub fn only(&self, known: &[&str]) -> Result<(), ObjectError> {
        match self.map()?.keys().find(|k| !known.contains(&k.as_str())) {
            None => Ok(()),
            Some(key) => Err(self.error_at(
                key,
                format!(
                    "unknown field (this version knows {})",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            )),
        }
    }

    /// The key `key`, unless absent or `null`.
    pub fn get(&self, key: &str) -> Result<Option<Field<'a>>, ObjectError> {
        Ok(self
            .map()?
            .get(key)
            .filter(|v| !v.is_null())
            .map(|value| Field {
                object: self.object,
                value,
                path: join(&self.path, key),
            }))
    }

    /// The key `key`, which must be present.
    pub fn required(&self, key: &str) -> Result<Field<'a>, ObjectError> {
        self.get(key)?.ok_or_else(|| self.error_at(key, "required"))
    }

    /// This node as a non-empty string.
    pub fn string(&self) -> Result<&'a str, ObjectError> {
        match self.value.as_str() {
            Some("") => Err(self.error("must not be empty")),
            Some(s) => Ok(s),
            None => Err(self.error("must be a string")),
        }
    }

    /// This node as a non-negative integer.
    pub fn u64(&self) -> Result<u64, ObjectError> {
        self.value
            .as_u64()
            .ok_or_else(|| self.error("must be a non-negative integer"))
    }

    /// This node as an integer.
    pub fn i64(&self) -> Result<i64, ObjectError> {
        self.value
            .as_i64()
            .ok_or_else(|| self.error("must be an integer"))
    }

    /// This node as a list, each item with its path.
    pub fn list(&self) -> Result<Vec<Field<'a>>, ObjectError> {
        let items = self
            .value
            .as_array()
            .ok_or_else(|| self.error("must be a list"))?;
        Ok(items
            .iter()
            .enumerate()
            .map(|(i, value)| Field {
                object: self.object,
                value,
                path: format!("{}[{i}]", self.path),
            })
            .collect())
    }

    /// The string at `key`, if present.
    pub fn opt_string(&self, key: &str) -> Result<Option<&'a str>, ObjectError> {
        match self.get(key)? {
            None => Ok(None),
            Some(f) => f.node().string().map(Some),
        }
    }

    /// The string at `key`, which must be present.
    pub fn req_string(&self, key: &str) -> Result<&'a str, ObjectError> {
        self.required(key)?.node().string()
    }

    /// The list at `key`; absent is empty.
    pub fn opt_list(&self, key: &str) -> Result<Vec<Field<'a>>, ObjectError> {
        match self.get(key)? {
            None => Ok(Vec::new()),
            Some(f) => f.node().list(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn errors_name_the_object_and_the_path() {
        let v = json!({"spec": {"ports": [{"number": "x"}], "typo": 1}});
        let root = Node::root("Kind ns/name", &v);
        let spec = root.required("spec").unwrap();
        let err = spec.node().only(&["ports"]).unwrap_err();
        assert_eq!(err.path, "spec.typo");
        assert!(err
            .to_string()
            .starts_with("Kind ns/name spec.typo: unknown field"));
        let ports = spec.node().opt_list("ports").unwrap();
        let number = ports[0].node().required("number").unwrap();
        let err = number.node().u64().unwrap_err();
        assert_eq!(err.path, "spec.ports[0].number");
        assert_eq!(root.required("nope").unwrap_err().path, "nope");
        assert!(root.get("nope").unwrap().is_none());
    }
}
