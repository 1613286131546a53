//! What can be wrong with a set of `InferenceModelRewrite` objects: each error names the
//! object and the field path, so a user can find the line in their YAML.

use core::fmt;

use crate::objects::ObjectError;

/// A rewrite configuration the router refuses to start with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RewriteError {
    /// What any object read field by field can get wrong (not an object, wrong kind,
    /// unsupported, missing or mistyped field, value not implemented).
    Object(ObjectError),
    /// `spec.poolRef.name` names no pool of the router.
    UnknownPool {
        /// The object.
        object: String,
        /// The pool named.
        pool: String,
    },
    /// A target that the referenced pool, or another pool of its base model, does not serve
    /// (neither its base model nor one of its adapters).
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
            RewriteError::Object(e) => e.object(),
            RewriteError::UnknownPool { object, .. }
            | RewriteError::NotServed { object, .. }
            | RewriteError::AllWeightsZero { object, .. }
            | RewriteError::Ambiguous { object, .. }
            | RewriteError::Duplicate { object, .. } => object,
        }
    }

    /// The field path the error is about (empty when it is about the whole object).
    pub fn path(&self) -> &str {
        match self {
            RewriteError::Object(e) => e.path(),
            RewriteError::Duplicate { .. } => "",
            RewriteError::UnknownPool { .. } => "spec.poolRef.name",
            RewriteError::NotServed { path, .. }
            | RewriteError::AllWeightsZero { path, .. }
            | RewriteError::Ambiguous { path, .. } => path,
        }
    }
}

impl fmt::Display for RewriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RewriteError::Object(e) => e.fmt(f),
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
                 model nor one of its adapters; the rules of a pool apply to every pool of its \
                 base model, because the router rewrites before Envoy chooses the pool)"
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

impl From<ObjectError> for RewriteError {
    fn from(e: ObjectError) -> Self {
        RewriteError::Object(e)
    }
}
