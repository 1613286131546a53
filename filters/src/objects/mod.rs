//! Reading Kubernetes objects given as JSON (a YAML document converted), field by field:
//! every field a reader does not implement, every missing or mistyped field is an error that
//! names the object (`<Kind> <name>`, or the list item before the name is known) and the
//! field's path, so a user can find the line in their YAML.
//!
//! [`ObjectError`] is what any such object can get wrong; `Fields` reads one object's
//! fields and names its errors. The `InferenceModelRewrite` reader
//! ([`crate::rewrite`]) and the tenant objects' reader ([`crate::tenants`]) both use them and
//! add the errors that need more than one object.

mod error;
mod fields;

pub use error::ObjectError;
pub(crate) use fields::Fields;

use serde_json::{Map, Value};

/// Every field of a Kubernetes `ObjectMeta`: what a `metadata` may hold. Readers take
/// `name` (and `namespace`); the rest is either for selectors (`labels`, `annotations`) or
/// written by the API server, and carries no configuration.
pub const OBJECT_META_KEYS: &[&str] = &[
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

/// Item `at` of a list of objects as a JSON object; `Ok(None)` for `null` (an empty YAML
/// document, as a trailing `---` gives). `expected` names the kinds taken, for the error.
pub(crate) fn list_item<'v>(
    at: &str,
    value: &'v Value,
    expected: &'static str,
) -> Result<Option<&'v Map<String, Value>>, ObjectError> {
    if value.is_null() {
        return Ok(None);
    }
    match value.as_object() {
        Some(map) => Ok(Some(map)),
        None => Err(ObjectError::NotAnObject {
            object: at.to_owned(),
            expected,
        }),
    }
}

/// A top-level string such as `kind` or `apiVersion`, empty when absent or not a string (the
/// caller's error then says what was expected).
pub(crate) fn type_field<'v>(map: &'v Map<String, Value>, key: &str) -> &'v str {
    map.get(key).and_then(Value::as_str).unwrap_or("")
}
