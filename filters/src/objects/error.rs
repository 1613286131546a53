//! What can be wrong with one object read field by field, whatever its kind.

use core::fmt;

/// An object (or one of its fields) a reader refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectError {
    /// An item of the list is not a JSON object.
    NotAnObject {
        /// Which item (`objects[3]`).
        object: String,
        /// The kinds taken (`an InferenceModelRewrite`).
        expected: &'static str,
    },
    /// `apiVersion` or `kind` is not one the reader takes.
    WrongObject {
        /// The object.
        object: String,
        /// `apiVersion` or `kind`.
        path: String,
        /// What was found (empty when absent).
        found: String,
        /// The kinds and versions taken.
        expected: String,
    },
    /// A field the reader does not implement (or does not know).
    NotSupported {
        /// The object.
        object: String,
        /// The field's path.
        path: String,
    },
    /// A required field is absent.
    Required {
        /// The object.
        object: String,
        /// The field's path.
        path: String,
    },
    /// A field of the wrong JSON type.
    WrongType {
        /// The object.
        object: String,
        /// The field's path.
        path: String,
        /// What the field must be.
        expected: &'static str,
    },
    /// A field's value is not one the reader implements.
    BadValue {
        /// The object.
        object: String,
        /// The field's path.
        path: String,
        /// The value found.
        value: String,
        /// What it may be.
        expected: String,
    },
}

impl ObjectError {
    /// `apiVersion` or `kind` (`path`) of `object` is `found`, not one of `expected`.
    pub fn wrong_object(object: String, path: &str, found: &str, expected: String) -> Self {
        ObjectError::WrongObject {
            object,
            path: path.into(),
            found: found.into(),
            expected,
        }
    }

    /// The object the error is about (`TenantQuota tenant-a`, `objects[2]`).
    pub fn object(&self) -> &str {
        match self {
            ObjectError::NotAnObject { object, .. }
            | ObjectError::WrongObject { object, .. }
            | ObjectError::NotSupported { object, .. }
            | ObjectError::Required { object, .. }
            | ObjectError::WrongType { object, .. }
            | ObjectError::BadValue { object, .. } => object,
        }
    }

    /// The field path the error is about (empty for [`ObjectError::NotAnObject`]).
    pub fn path(&self) -> &str {
        match self {
            ObjectError::NotAnObject { .. } => "",
            ObjectError::WrongObject { path, .. }
            | ObjectError::NotSupported { path, .. }
            | ObjectError::Required { path, .. }
            | ObjectError::WrongType { path, .. }
            | ObjectError::BadValue { path, .. } => path,
        }
    }
}

impl fmt::Display for ObjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObjectError::NotAnObject { object, expected } => {
                write!(f, "{object}: not an object (expected {expected})")
            }
            ObjectError::WrongObject {
                object,
                path,
                found,
                expected,
            } => write!(
                f,
                "{object}: {path}: `{found}` is not taken here (expected {expected})"
            ),
            ObjectError::NotSupported { object, path } => {
                write!(f, "{object}: {path}: not supported")
            }
            ObjectError::Required { object, path } => write!(f, "{object}: {path}: required"),
            ObjectError::WrongType {
                object,
                path,
                expected,
            } => write!(f, "{object}: {path}: must be {expected}"),
            ObjectError::BadValue {
                object,
                path,
                value,
                expected,
            } => write!(
                f,
                "{object}: {path}: `{value}` not supported (expected {expected})"
            ),
        }
    }
}

impl std::error::Error for ObjectError {}
