//! What can be wrong with a set of tenant objects: each error names the object and the
//! field path, so a user can find the line in their YAML.

use core::fmt;

/// A tenant configuration the gateway refuses to start with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TenantsError {
    /// An item of the list is not a JSON object.
    NotAnObject {
        /// Which item (`objects[3]`).
        object: String,
    },
    /// `apiVersion` or `kind` is not one the gateway takes.
    WrongObject {
        /// The object.
        object: String,
        /// `apiVersion` or `kind`.
        path: String,
        /// What was found (empty when absent).
        found: String,
    },
    /// A field the gateway does not implement.
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
    /// A field's value is not one the gateway implements.
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
    /// The same value where it must be unique (key hash, model, tenant or objective name,
    /// JWT claim).
    Duplicate {
        /// The object.
        object: String,
        /// The field's path.
        path: String,
        /// The repeated value.
        value: String,
        /// Where it was first seen (object and path).
        first: String,
    },
    /// `spec.inject.objective` names no given `InferenceObjective`.
    UnknownObjective {
        /// The object.
        object: String,
        /// The field's path.
        path: String,
        /// The objective named.
        objective: String,
    },
    /// A tenant with neither API-key hashes nor JWT claims: no request could reach it.
    NoIdentity {
        /// The object.
        object: String,
        /// `spec.identity`.
        path: String,
    },
}

impl TenantsError {
    /// The object the error is about (`TenantQuota tenant-a`, `objects[2]`).
    pub fn object(&self) -> &str {
        match self {
            TenantsError::NotAnObject { object }
            | TenantsError::WrongObject { object, .. }
            | TenantsError::NotSupported { object, .. }
            | TenantsError::Required { object, .. }
            | TenantsError::WrongType { object, .. }
            | TenantsError::BadValue { object, .. }
            | TenantsError::Duplicate { object, .. }
            | TenantsError::UnknownObjective { object, .. }
            | TenantsError::NoIdentity { object, .. } => object,
        }
    }

    /// The field path the error is about (empty for [`TenantsError::NotAnObject`]).
    pub fn path(&self) -> &str {
        match self {
            TenantsError::NotAnObject { .. } => "",
            TenantsError::WrongObject { path, .. }
            | TenantsError::NotSupported { path, .. }
            | TenantsError::Required { path, .. }
            | TenantsError::WrongType { path, .. }
            | TenantsError::BadValue { path, .. }
            | TenantsError::Duplicate { path, .. }
            | TenantsError::UnknownObjective { path, .. }
            | TenantsError::NoIdentity { path, .. } => path,
        }
    }
}

impl fmt::Display for TenantsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TenantsError::NotAnObject { object } => {
                write!(f, "{object}: not an object (expected a TenantQuota or an InferenceObjective)")
            }
            TenantsError::WrongObject { object, path, found } => write!(
                f,
                "{object}: {path}: `{found}` is not taken here (expected apiVersion \
                 `{}` kind `TenantQuota`, or apiVersion `{}` kind `InferenceObjective`)",
                super::parse::TENANT_QUOTA_API_VERSION,
                super::parse::OBJECTIVE_API_VERSION,
            ),
            TenantsError::NotSupported { object, path } => {
                write!(f, "{object}: {path}: not supported")
            }
            TenantsError::Required { object, path } => write!(f, "{object}: {path}: required"),
            TenantsError::WrongType {
                object,
                path,
                expected,
            } => write!(f, "{object}: {path}: must be {expected}"),
            TenantsError::BadValue {
                object,
                path,
                value,
                expected,
            } => write!(f, "{object}: {path}: `{value}` not supported (expected {expected})"),
            TenantsError::Duplicate {
                object,
                path,
                value,
                first,
            } => write!(f, "{object}: {path}: `{value}` already given at {first}"),
            TenantsError::UnknownObjective {
                object,
                path,
                objective,
            } => write!(
                f,
                "{object}: {path}: no InferenceObjective named `{objective}` among the objects given"
            ),
            TenantsError::NoIdentity { object, path } => write!(
                f,
                "{object}: {path}: neither apiKeyHashes nor jwtClaims: no request can reach this tenant"
            ),
        }
    }
}

impl std::error::Error for TenantsError {}
