//! Model rewrites: `InferenceModelRewrite` objects, compiled against the router's pools.
//!
//! An object names its pool (`spec.poolRef.name`, a router pool's `name`) and lists rules;
//! a rule matches models by exact name (`matches[].model {type: Exact, value}`; an empty or
//! absent `matches` matches every model the pool's base model serves) and lists weighted
//! targets (`targets[{modelRewrite, weight}]`, weight absent = 1). Rules apply in order,
//! first match wins: the Exact rules of every object of a base model's pools first (pools
//! in router order, objects in list order, rules in object order), then the match-all
//! ones. The router does not know which pool of a base model Envoy's route will choose,
//! so the rules of all of them apply.
//!
//! Compiling checks what the router can know: every field is one the gateway implements
//! (else an error naming its path); the pool exists; every target is the pool's base model
//! or one of its adapters; a rule has a positive weight; a matched name is not a model of
//! another base model. A matched name the pool does not serve itself becomes a name the
//! router routes (to the pool's base model) and lists under `/v1/models`. A model no pool
//! serves stays a 404 even with a match-all rule.
//!
//! [`split`] chooses a rule's target, [`body`] rewrites the request body's `model`.

pub mod body;
mod error;
mod parse;
pub mod split;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use serde_json::Value;

use crate::router::PoolModels;

pub use error::RewriteError;
pub use parse::{API_VERSIONS, KIND, MAX_WEIGHT};
pub use split::{choose_by_draw, choose_sticky, split_key, SplitConfig, SplitMode, Weighted};

/// One weighted target of a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The model name sent upstream.
    pub model: String,
    /// Its weight (0: never chosen).
    pub weight: u32,
}

impl Weighted for Target {
    fn name(&self) -> &str {
        &self.model
    }
    fn weight(&self) -> u32 {
        self.weight
    }
}

/// One compiled rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The object it belongs to (`metadata.name`).
    pub object: String,
    /// Its path in the object (`spec.rules[0]`).
    pub path: String,
    /// The names it matches exactly; empty: every model.
    pub models: Vec<String>,
    /// Its targets, in the object's order.
    pub targets: Vec<Target>,
}

impl Rule {
    /// Whether the rule applies to a request for `model`.
    pub fn matches(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == model)
    }

    /// The target for a request with sticky key `key` (`None`: per request, by the
    /// uniform `draw`); `None` only if every weight is 0, which compiling refuses.
    pub fn choose(&self, key: Option<&[u8]>, draw: u64) -> Option<&Target> {
        let i = match key {
            Some(k) => choose_sticky(k, &self.targets),
            None => choose_by_draw(draw, &self.targets),
        };
        self.targets.get(i?)
    }
}

/// Every rewrite rule, by base model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rewrites {
    /// Base model → its rules, Exact ones first.
    by_base: HashMap<String, Vec<Rule>>,
    /// Matched names no pool serves itself, with the base model they route to; sorted.
    aliases: Vec<(String, String)>,
}

impl Rewrites {
    /// Compile `objects` (the router's `modelRewrites`) against `pools`.
    pub fn compile(objects: &[Value], pools: &[PoolModels]) -> Result<Rewrites, RewriteError> {
        let mut served: HashMap<&str, &str> = HashMap::new();
        for pool in pools {
            for name in core::iter::once(&pool.base_model).chain(&pool.adapters) {
                served.entry(name).or_insert(&pool.base_model);
            }
        }
        let mut names: Vec<String> = Vec::new();
        let mut exact: Vec<(PoolKey, Rule)> = Vec::new();
        let mut match_all: Vec<(PoolKey, Rule)> = Vec::new();
        let mut aliases: HashMap<String, String> = HashMap::new();
        for (index, value) in objects.iter().enumerate() {
            let Some(object) = parse::parse_object(index, value)? else {
                continue;
            };
            if names.contains(&object.name) {
                return Err(RewriteError::Duplicate {
                    object: object.label,
                    name: object.name,
                });
            }
            let Some(pool) = pools.iter().find(|p| p.name == object.pool) else {
                return Err(RewriteError::UnknownPool {
                    object: object.label,
                    pool: object.pool,
                });
            };
            let base = &pool.base_model;
            for rule in object.rules {
                for t in &rule.targets {
                    // The router rewrites before Envoy's route chooses among the pools of a
                    // base model (a split across pools), so the rules of one pool apply to
                    // every pool of its base model: each of them must serve every target.
                    let missing = pools
                        .iter()
                        .filter(|p| &p.base_model == base)
                        .find(|p| &t.model != base && !p.adapters.contains(&t.model));
                    if let Some(p) = missing {
                        return Err(RewriteError::NotServed {
                            object: object.label.clone(),
                            path: format!("{}.modelRewrite", t.path),
                            model: t.model.clone(),
                            pool: p.name.clone(),
                        });
                    }
                }
                for (path, model) in &rule.models {
                    let routes_to = served
                        .get(model.as_str())
                        .copied()
                        .or_else(|| aliases.get(model).map(String::as_str));
                    match routes_to {
                        Some(b) if b != base => {
                            return Err(RewriteError::Ambiguous {
                                object: object.label.clone(),
                                path: path.clone(),
                                model: model.clone(),
                                base_model: b.to_owned(),
                            })
                        }
                        Some(_) => {}
                        None => {
                            aliases.insert(model.clone(), base.clone());
                        }
                    }
                }
                let compiled = Rule {
                    object: object.name.clone(),
                    path: rule.path,
                    models: rule.models.into_iter().map(|(_, m)| m).collect(),
                    targets: rule
                        .targets
                        .into_iter()
                        .map(|t| Target {
                            model: t.model,
                            weight: t.weight,
                        })
                        .collect(),
                };
                let key = pool_key(pool_index(pools, &pool.name), base);
                if compiled.models.is_empty() {
                    match_all.push((key, compiled));
                } else {
                    exact.push((key, compiled));
                }
            }
            names.push(object.name);
        }
        // Stable sorts by pool position keep list order within a pool.
        exact.sort_by(|a, b| a.0.cmp(&b.0));
        match_all.sort_by(|a, b| a.0.cmp(&b.0));
        let mut by_base: HashMap<String, Vec<Rule>> = HashMap::new();
        for (key, rule) in exact.into_iter().chain(match_all) {
            by_base.entry(key.base).or_default().push(rule);
        }
        let mut aliases: Vec<(String, String)> = aliases.into_iter().collect();
        aliases.sort();
        Ok(Rewrites { by_base, aliases })
    }

    /// Whether there is no rule at all.
    pub fn is_empty(&self) -> bool {
        self.by_base.is_empty()
    }

    /// The first rule for a request for `model`, routed to `base_model`.
    pub fn rule(&self, base_model: &str, model: &str) -> Option<&Rule> {
        self.by_base
            .get(base_model)?
            .iter()
            .find(|r| r.matches(model))
    }

    /// Names only rules match (no pool serves them itself), each with its base model,
    /// sorted.
    pub fn aliases(&self) -> &[(String, String)] {
        &self.aliases
    }

    /// Every target model of every rule, sorted, each once.
    pub fn targets(&self) -> Vec<&str> {
        let mut all: Vec<&str> = self
            .by_base
            .values()
            .flatten()
            .flat_map(|r| r.targets.iter().map(|t| t.model.as_str()))
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }
}

/// Sort key of a rule: its pool's position in the router config, then its base model
/// (which it is grouped by afterwards).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct PoolKey {
    pool: usize,
    base: String,
}

fn pool_key(pool: usize, base: &str) -> PoolKey {
    PoolKey {
        pool,
        base: base.to_owned(),
    }
}

fn pool_index(pools: &[PoolModels], name: &str) -> usize {
    pools
        .iter()
        .position(|p| p.name == name)
        .unwrap_or(usize::MAX)
}
