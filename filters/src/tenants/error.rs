//! What can be wrong with a set of tenant objects: each error names the object and the
//! field path, so a user can find the line in their YAML.

use core::fmt;

use crate::objects::ObjectError;

/// A tenant configuration the gateway refuses to start with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TenantsError {
    /// What any object read field by field can get wrong (not an object, wrong kind,
    /// unsupported, missing or mistyped field, value not implemented).
    Object(ObjectError),
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
            TenantsError::Object(e) => e.object(),
            TenantsError::Duplicate { object, .. }
            | TenantsError::UnknownObjective { object, .. }
            | TenantsError::NoIdentity { object, .. } => object,
        }
    }

    /// The field path the error is about (empty when it is about the whole item).
    pub fn path(&self) -> &str {
        match self {
            TenantsError::Object(e) => e.path(),
            TenantsError::Duplicate { path, .. }
            | TenantsError::UnknownObjective { path, .. }
            | TenantsError::NoIdentity { path, .. } => path,
        }
    }
}

impl fmt::Display for TenantsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TenantsError::Object(e) => e.fmt(f),
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

impl From<ObjectError> for TenantsError {
    fn from(e: ObjectError) -> Self {
        TenantsError::Object(e)
    }
}
