//! Typed access to one object's fields, each error naming the object and the path. A `null`
//! value (a YAML key with nothing after it) counts as absent.

use serde_json::{Map, Value};

use super::ObjectError;

/// The fields of one object: `object` names it in every error (`TenantQuota tenant-a`).
pub(crate) struct Fields {
    /// The object's name for errors.
    pub object: String,
    /// What a nested object must be, as its wrong-type error says (`an object`, `a mapping`):
    /// each reader keeps the word its users already see.
    mapping: &'static str,
}

/// `prefix.key`, or `key` at the top (empty prefix).
fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

fn get<'v>(map: &'v Map<String, Value>, key: &str) -> Option<&'v Value> {
    map.get(key).filter(|v| !v.is_null())
}

impl Fields {
    /// The fields of `object`; `mapping` is what a nested object must be, as the reader's
    /// errors say it.
    pub fn new(object: String, mapping: &'static str) -> Self {
        Fields { object, mapping }
    }

    /// Errors on the first key of `map` (at `prefix`) not in `allowed`.
    pub fn only(
        &self,
        map: &Map<String, Value>,
        prefix: &str,
        allowed: &[&str],
    ) -> Result<(), ObjectError> {
        match map.keys().find(|k| !allowed.contains(&k.as_str())) {
            None => Ok(()),
            Some(key) => Err(ObjectError::NotSupported {
                object: self.object.clone(),
                path: join(prefix, key),
            }),
        }
    }

    pub fn wrong_type(&self, path: &str, expected: &'static str) -> ObjectError {
        ObjectError::WrongType {
            object: self.object.clone(),
            path: path.to_owned(),
            expected,
        }
    }

    pub fn bad_value(&self, path: &str, value: &str, expected: &str) -> ObjectError {
        ObjectError::BadValue {
            object: self.object.clone(),
            path: path.to_owned(),
            value: value.to_owned(),
            expected: expected.to_owned(),
        }
    }

    fn required<'v>(
        &self,
        map: &'v Map<String, Value>,
        prefix: &str,
        key: &str,
    ) -> Result<&'v Value, ObjectError> {
        get(map, key).ok_or_else(|| ObjectError::Required {
            object: self.object.clone(),
            path: join(prefix, key),
        })
    }

    /// `value` (at `path`) as a nested object.
    pub fn map<'v>(
        &self,
        path: &str,
        value: &'v Value,
    ) -> Result<&'v Map<String, Value>, ObjectError> {
        value
            .as_object()
            .ok_or_else(|| self.wrong_type(path, self.mapping))
    }

    pub fn required_map<'v>(
        &self,
        map: &'v Map<String, Value>,
        prefix: &str,
        key: &str,
    ) -> Result<&'v Map<String, Value>, ObjectError> {
        self.map(&join(prefix, key), self.required(map, prefix, key)?)
    }

    pub fn optional_map<'v>(
        &self,
        map: &'v Map<String, Value>,
        prefix: &str,
        key: &str,
    ) -> Result<Option<&'v Map<String, Value>>, ObjectError> {
        get(map, key)
            .map(|v| self.map(&join(prefix, key), v))
            .transpose()
    }

    fn array<'v>(&self, path: &str, value: &'v Value) -> Result<&'v Vec<Value>, ObjectError> {
        value
            .as_array()
            .ok_or_else(|| self.wrong_type(path, "a list"))
    }

    pub fn required_array<'v>(
        &self,
        map: &'v Map<String, Value>,
        prefix: &str,
        key: &str,
    ) -> Result<&'v Vec<Value>, ObjectError> {
        self.array(&join(prefix, key), self.required(map, prefix, key)?)
    }

    pub fn optional_array<'v>(
        &self,
        map: &'v Map<String, Value>,
        prefix: &str,
        key: &str,
    ) -> Result<Option<&'v Vec<Value>>, ObjectError> {
        get(map, key)
            .map(|v| self.array(&join(prefix, key), v))
            .transpose()
    }

    /// `value` (at `path`) as a non-empty string.
    pub fn string<'v>(&self, path: &str, value: &'v Value) -> Result<&'v str, ObjectError> {
        match value.as_str() {
            Some("") => Err(self.bad_value(path, "", "a non-empty string")),
            Some(s) => Ok(s),
            None => Err(self.wrong_type(path, "a string")),
        }
    }

    pub fn required_string<'v>(
        &self,
        map: &'v Map<String, Value>,
        prefix: &str,
        key: &str,
    ) -> Result<&'v str, ObjectError> {
        self.string(&join(prefix, key), self.required(map, prefix, key)?)
    }

    pub fn optional_string<'v>(
        &self,
        map: &'v Map<String, Value>,
        prefix: &str,
        key: &str,
    ) -> Result<Option<&'v str>, ObjectError> {
        get(map, key)
            .map(|v| self.string(&join(prefix, key), v))
            .transpose()
    }

    pub fn optional_u64(
        &self,
        map: &Map<String, Value>,
        prefix: &str,
        key: &str,
    ) -> Result<Option<u64>, ObjectError> {
        get(map, key)
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| self.wrong_type(&join(prefix, key), "a non-negative integer"))
            })
            .transpose()
    }
}
