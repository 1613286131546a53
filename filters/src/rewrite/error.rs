//! What can be wrong with a set of `InferenceModelRewrite` objects: each error names the
//! object and the field path, so a user can find the line in their YAML.

use core::fmt;

/// A rewrite configuration the router refuses to start with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RewriteError {
    /// An item of the list is not a JSON object.
    NotAnObject {
        /// Which item (`modelRewrites[3]`).
        object: String,
    },
    /// `apiVersion` or `kind` is not one the router takes.
    WrongObject {
        /// The object.
        object: String,
        /// `apiVersion` or `kind`.
        path: String,
        /// What was found (empty when absent).
        found: String,
    },
    /// A field the router does not implement (or does not know).
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
    /// A field's value is not one the router implements.
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
    /// `spec.poolRef.name` names no pool of the router.
    UnknownPool {
        /// The object.
        object: String,
        /// The pool named.
        pool: String,
    },
    /// A target the referenced pool does not serve (neither its base model nor one of its
    /// adapters).
    NotServed {
        /// The object.
        object: String,
        /// The field's path.
        path: String,
        /// The target model.
        model: String,
        /// The pool.
        pool: String,
    },
    /// Every target of a rule has weight 0: the rule could choose nothing.
    AllWeightsZero {
        /// The object.
        object: String,
        /// The rule's path.
        path: String,
    },
    /// A matched name is also a model of another base model (routing would be ambiguous).
    Ambiguous {
        /// The object.
        object: String,
        /// The field's path.
        path: String,
        /// The name.
        model: String,
        /// The base model the name already routes to.
        base_model: String,
    },
    /// Two objects of one name.
    Duplicate {
        /// The object.
        object: String,
        /// The name.
        name: String,
    },
}

impl RewriteError {
    /// The object the error is about (`InferenceModelRewrite canary`, `modelRewrites[2]`).
    pub fn object(&self) -> &str {
        match self {
            RewriteError::NotAnObject { object }
            | RewriteError::WrongObject { object, .. }
            | RewriteError::NotSupported { object, .. }
            | RewriteError::Required { object, .. }
            | RewriteError::WrongType { object, .. }
            | RewriteError::BadValue { object, .. }
            | RewriteError::UnknownPool { object, .. }
            | RewriteError::NotServed { object, .. }
            | RewriteError::AllWeightsZero { object, .. }
            | RewriteError::Ambiguous { object, .. }
            | RewriteError::Duplicate { object, .. } => object,
        }
    }

    /// The field path the error is about (empty when it is about the whole object).
    pub fn path(&self) -> &str {
        match self {
            RewriteError::NotAnObject { .. } | RewriteError::Duplicate { .. } => "",
            RewriteError::UnknownPool { .. } => "spec.poolRef.name",
            RewriteError::WrongObject { path, .. }
            | RewriteError::NotSupported { path, .. }
            | RewriteError::Required { path, .. }
            | RewriteError::WrongType { path, .. }
            | RewriteError::BadValue { path, .. }
            | RewriteError::NotServed { path, .. }
            | RewriteError::AllWeightsZero { path, .. }
            | RewriteError::Ambiguous { path, .. } => path,
        }
    }
}

impl fmt::Display for RewriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RewriteError::NotAnObject { object } => {
                write!(
                    f,
                    "{object}: not an object (expected an InferenceModelRewrite)"
                )
            }
            RewriteError::WrongObject {
                object,
                path,
                found,
            } => write!(
                f,
                "{object}: {path}: `{found}` is not taken here (expected kind \
                 `InferenceModelRewrite`, apiVersion one of {})",
                super::parse::API_VERSIONS.join(", "),
            ),
            RewriteError::NotSupported { object, path } => {
                write!(f, "{object}: {path}: not supported")
            }
            RewriteError::Required { object, path } => write!(f, "{object}: {path}: required"),
            RewriteError::WrongType {
                object,
                path,
                expected,
            } => write!(f, "{object}: {path}: must be {expected}"),
            RewriteError::BadValue {
                object,
                path,
                value,
                expected,
            } => write!(
                f,
                "{object}: {path}: `{value}` not supported (expected {expected})"
            ),
            RewriteError::UnknownPool { object, pool } => write!(
                f,
                "{object}: spec.poolRef.name: no router pool is named `{pool}`"
            ),
            RewriteError::NotServed {
                object,
                path,
                model,
                pool,
            } => write!(
                f,
                "{object}: {path}: pool `{pool}` does not serve `{model}` (neither its base \
                 model nor one of its adapters)"
            ),
            RewriteError::AllWeightsZero { object, path } => write!(
                f,
                "{object}: {path}: every target has weight 0 (at least one must be positive)"
            ),
            RewriteError::Ambiguous {
                object,
                path,
                model,
                base_model,
            } => write!(
                f,
                "{object}: {path}: `{model}` is already a model of base model `{base_model}`"
            ),
            RewriteError::Duplicate { object, name } => write!(
                f,
                "{object}: metadata.name: a second InferenceModelRewrite named `{name}`"
            ),
        }
    }
}

impl std::error::Error for RewriteError {}
