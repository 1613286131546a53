//! Body-router configuration: the body limit, per pool the base model, the LoRA adapters
//! it serves and the block size its picker hashes prompts at, the model rewrites
//! (`InferenceModelRewrite` objects) and how their weights split traffic. Compiled once
//! into a model → base-model table (and [`crate::rewrite::Rewrites`]).

use std::collections::{HashMap, HashSet};

use serde::Deserialize;

use crate::rewrite::{RewriteError, SplitConfig};

/// Default request-body limit: 4 MiB.
pub const DEFAULT_BODY_LIMIT_BYTES: usize = 4 * 1024 * 1024;

/// Default [`RouterConfig::max_output_sequences`]: OpenAI's own bound on `n`.
pub const DEFAULT_MAX_OUTPUT_SEQUENCES: u32 = 128;

/// The router's plugin configuration (JSON, camelCase; `role` is removed by the adapter).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouterConfig {
    /// Bodies larger than this are answered 413.
    #[serde(default = "default_body_limit")]
    pub body_limit_bytes: usize,
    /// The most sequences one request may ask the engine to generate: the larger of `n`
    /// and `best_of` (at least 1) times the prompts of a completions batch. More is
    /// answered 400 naming `n`, `best_of` or `prompt`. At least 1.
    #[serde(default = "default_max_output_sequences")]
    pub max_output_sequences: u32,
    /// The pools and the model names each serves.
    #[serde(default)]
    pub pools: Vec<PoolModels>,
    /// `InferenceModelRewrite` objects as JSON (checked field by field when compiled).
    #[serde(default)]
    pub model_rewrites: Vec<serde_json::Value>,
    /// How a rewrite rule's weights split traffic (sticky by default).
    #[serde(default)]
    pub split: SplitConfig,
}

/// One pool: its base model and its adapters (which map to the base model).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolModels {
    /// The pool's name (for diagnostics).
    pub name: String,
    /// The base model the pool's engines serve.
    pub base_model: String,
    /// LoRA adapter names served by the pool's engines.
    #[serde(default)]
    pub adapters: Vec<String>,
    /// Leave unset: the router hashes the prompt for the picker's handoff
    /// (`crate::handoff`) at the block size of the picker pool serving this base model,
    /// which the adapter looks up among the loaded picker configs
    /// ([`super::BlockSizeSource`]), so `blockSizeTokens` is configured once, in the
    /// picker's `EndpointPickerConfig`. Set, it overrides that lookup (a picker configured
    /// otherwise then ignores the handoff and parses the body itself).
    #[serde(default)]
    pub block_size_tokens: Option<u32>,
}

/// Block size used for the handoff when neither the router pool nor a loaded picker pool
/// says (the `approx-prefix-cache-producer` default).
pub const DEFAULT_BLOCK_SIZE_TOKENS: u32 = 64;

fn default_body_limit() -> usize {
    DEFAULT_BODY_LIMIT_BYTES
}

fn default_max_output_sequences() -> u32 {
    DEFAULT_MAX_OUTPUT_SEQUENCES
}

/// A configuration the router cannot run with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouterConfigError {
    /// The JSON does not have the expected shape.
    Json(String),
    /// `model` maps to two different base models.
    AmbiguousModel {
        /// The model or adapter name.
        model: String,
        /// One base model it maps to.
        first: String,
        /// The other.
        second: String,
    },
    /// An empty model or adapter name.
    EmptyName {
        /// The pool it appears in.
        pool: String,
    },
    /// A `modelRewrites` object the router cannot run with.
    Rewrite(RewriteError),
    /// A field whose value is out of its range.
    Invalid {
        /// The field, as in the JSON.
        field: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
}

impl core::fmt::Display for RouterConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RouterConfigError::Json(e) => write!(f, "router config: {e}"),
            RouterConfigError::AmbiguousModel {
                model,
                first,
                second,
            } => write!(
                f,
                "router config: model `{model}` maps to both `{first}` and `{second}`"
            ),
            RouterConfigError::EmptyName { pool } => {
                write!(f, "router config: empty model name in pool `{pool}`")
            }
            RouterConfigError::Rewrite(e) => write!(f, "router config: modelRewrites: {e}"),
            RouterConfigError::Invalid { field, problem } => {
                write!(f, "router config: {field}: {problem}")
            }
        }
    }
}

/// Model (or adapter) name → base model name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelTable {
    base_of: HashMap<String, String>,
    /// Names routed only because a rewrite rule matches them (no engine serves them).
    aliases: HashSet<String>,
    /// Base model → block size its (first) pool sets, if it sets one.
    block_size_of: HashMap<String, Option<u32>>,
}

impl ModelTable {
    /// Build the table, rejecting a name that maps to two base models.
    pub fn build(pools: &[PoolModels]) -> Result<ModelTable, RouterConfigError> {
        let mut base_of: HashMap<String, String> = HashMap::new();
        let mut block_size_of: HashMap<String, Option<u32>> = HashMap::new();
        for pool in pools {
            block_size_of
                .entry(pool.base_model.clone())
                .or_insert(pool.block_size_tokens);
            let names = core::iter::once(&pool.base_model).chain(pool.adapters.iter());
            for name in names {
                if name.is_empty() || pool.base_model.is_empty() {
                    return Err(RouterConfigError::EmptyName {
                        pool: pool.name.clone(),
                    });
                }
                match base_of.get(name) {
                    Some(existing) if existing != &pool.base_model => {
                        return Err(RouterConfigError::AmbiguousModel {
                            model: name.clone(),
                            first: existing.clone(),
                            second: pool.base_model.clone(),
                        });
                    }
                    Some(_) => {}
                    None => {
                        base_of.insert(name.clone(), pool.base_model.clone());
                    }
                }
            }
        }
        Ok(ModelTable {
            base_of,
            aliases: HashSet::new(),
            block_size_of,
        })
    }

    /// Route `name`, which a rewrite rule matches but no pool serves, to `base_model`
    /// (the caller checked that no pool serves it under another base model).
    pub fn add_alias(&mut self, name: &str, base_model: &str) {
        if !self.base_of.contains_key(name) {
            self.base_of.insert(name.to_owned(), base_model.to_owned());
            self.aliases.insert(name.to_owned());
        }
    }

    /// Whether a pool's engines serve `model` itself (its base model or an adapter), not
    /// only a rewrite rule's match.
    pub fn serves(&self, model: &str) -> bool {
        self.base_of.contains_key(model) && !self.aliases.contains(model)
    }

    /// Every name the router routes (base models, adapters, rewrite matches), sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.base_of.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Every base model a pool serves, sorted.
    pub fn base_models(&self) -> Vec<&str> {
        let mut bases: Vec<&str> = self.block_size_of.keys().map(String::as_str).collect();
        bases.sort_unstable();
        bases
    }

    /// The base model serving `model`, if any pool serves it.
    pub fn base_model(&self, model: &str) -> Option<&str> {
        self.base_of.get(model).map(String::as_str)
    }

    /// The block size the router's config sets for `base_model` (its first pool decides,
    /// as in the picker), if it sets one.
    pub fn configured_block_size(&self, base_model: &str) -> Option<u32> {
        self.block_size_of.get(base_model).copied().flatten()
    }

    /// [`ModelTable::configured_block_size`], else the default.
    pub fn block_size_tokens(&self, base_model: &str) -> u32 {
        self.configured_block_size(base_model)
            .unwrap_or(DEFAULT_BLOCK_SIZE_TOKENS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str, base: &str, adapters: &[&str]) -> PoolModels {
        PoolModels {
            name: name.into(),
            base_model: base.into(),
            adapters: adapters.iter().map(|a| (*a).to_owned()).collect(),
            block_size_tokens: None,
        }
    }

    #[test]
    fn adapters_map_to_their_base_model() {
        let t = ModelTable::build(&[pool("a", "llama", &["sql-lora"]), pool("b", "qwen", &[])])
            .unwrap_or_default();
        assert_eq!(t.base_model("llama"), Some("llama"));
        assert_eq!(t.base_model("sql-lora"), Some("llama"));
        assert_eq!(t.base_model("qwen"), Some("qwen"));
        assert_eq!(t.base_model("gpt-4"), None);
        assert_eq!(t.base_models(), vec!["llama", "qwen"]);
    }

    #[test]
    fn an_adapter_in_two_pools_with_different_bases_is_rejected() {
        let e = ModelTable::build(&[pool("a", "llama", &["x"]), pool("b", "qwen", &["x"])]);
        assert!(matches!(e, Err(RouterConfigError::AmbiguousModel { .. })));
    }

    #[test]
    fn two_pools_of_one_base_model_are_fine() {
        let t = ModelTable::build(&[pool("a", "llama", &["x"]), pool("b", "llama", &["x"])]);
        assert!(t.is_ok());
    }

    #[test]
    fn json_defaults_apply() {
        let c: Result<RouterConfig, _> =
            serde_json::from_str(r#"{"pools":[{"name":"a","baseModel":"m"}]}"#);
        let c = c.map_err(|e| e.to_string());
        assert_eq!(
            c.map(|c| (c.body_limit_bytes, c.max_output_sequences)),
            Ok((DEFAULT_BODY_LIMIT_BYTES, DEFAULT_MAX_OUTPUT_SEQUENCES))
        );
    }

    #[test]
    fn block_size_is_per_base_model_with_a_default() {
        let c: Result<RouterConfig, _> = serde_json::from_str(
            r#"{"pools":[{"name":"a","baseModel":"m","blockSizeTokens":16},{"name":"b","baseModel":"q"}]}"#,
        );
        let t = c
            .map_err(|e| e.to_string())
            .and_then(|c| ModelTable::build(&c.pools).map_err(|e| e.to_string()));
        let t = t.unwrap_or_default();
        assert_eq!(t.block_size_tokens("m"), 16);
        assert_eq!(t.block_size_tokens("q"), DEFAULT_BLOCK_SIZE_TOKENS);
    }
}
