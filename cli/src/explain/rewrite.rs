//! Model rewrites in `explain`: the request is rewritten as the gateway's router would
//! before it is scheduled, so the decision is the one the gateway makes for it (target
//! model in the LoRA scorer and the prefix seed).
//!
//! The rewrite objects (`--rewrites FILE`, the `InferenceModelRewrite` objects of the
//! router's `modelRewrites`) are compiled with the router's own compiler against the
//! state's pool: base model `base_model`, adapters `adapters`, name `pool`. With `pool`
//! set, only objects whose `spec.poolRef.name` is `pool` apply (the others are other
//! pools'); without it, every object is taken as this pool's. The target is chosen as the
//! router chooses it: by the sticky key (`--sticky-key`: the session header's value or the
//! fairness id the request would carry) or, without one, by a per-request draw from
//! `--seed`.

use anyhow::{bail, Context, Result};
use infergate_filters::rewrite::{body::rewrite_model, Rewrites};
use infergate_filters::router::PoolModels;
use scheduler_core::scheduling::pick::SplitMix64;
use serde_json::{json, Value};

use super::State;

/// The pool name the objects are compiled against when the state names none.
const UNNAMED_POOL: &str = "state";

/// What the rewrite did to one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Rewritten {
    /// The body as the engine would receive it.
    pub body: Vec<u8>,
    /// The record's `rewrite` member.
    pub record: Value,
}

/// Rewrites `body` (a request for `model`) with `objects`; `None` when no rule matches.
pub fn apply(
    objects: &[Value],
    state: &State,
    model: &str,
    body: &[u8],
    sticky_key: Option<&str>,
    seed: u64,
) -> Result<Option<Rewritten>> {
    let Some(base) = state.base_model.as_deref() else {
        bail!("--rewrites needs the state's `base_model` (the pool's base model)");
    };
    let pool = state.pool.as_deref().unwrap_or(UNNAMED_POOL);
    let mine: Vec<Value> = objects
        .iter()
        .filter(|o| state.pool.is_none() || pool_ref(o) == Some(pool))
        .cloned()
        .map(|mut o| {
            if let Some(pool_ref) = o.pointer_mut("/spec/poolRef/name") {
                *pool_ref = Value::from(pool);
            }
            o
        })
        .collect();
    let pools = [PoolModels {
        name: pool.to_owned(),
        base_model: base.to_owned(),
        adapters: state.adapters.clone(),
        block_size_tokens: None,
    }];
    let rewrites = Rewrites::compile(&mine, &pools).context("--rewrites")?;
    let Some(rule) = rewrites.rule(base, model) else {
        return Ok(None);
    };
    let draw = SplitMix64::new(seed).next_u64();
    let Some(target) = rule.choose(sticky_key.map(str::as_bytes), draw) else {
        bail!("rule {} of {} has no target", rule.path, rule.object);
    };
    let Some(body) = rewrite_model(body, &target.model) else {
        bail!("the request's model could not be rewritten");
    };
    let record = json!({
        "model": model,
        "target_model": target.model,
        "object": rule.object,
        "rule": rule.path,
        "split": if sticky_key.is_some() { "sticky" } else { "per_request" },
        "sticky_key": sticky_key,
    });
    Ok(Some(Rewritten { body, record }))
}

/// An object's `spec.poolRef.name`.
fn pool_ref(object: &Value) -> Option<&str> {
    object.pointer("/spec/poolRef/name").and_then(Value::as_str)
}
