//! Which pool a request goes to: the gateway's Envoy routes, from a small description.
//!
//! The body router sets `x-gateway-base-model-name`; every route matches it. A route sends
//! its model's requests to one pool, or splits them across pools by weight with Envoy's
//! weighted clusters (drawn per request, or from `x-gateway-split-key` so one conversation
//! stays on one pool), and may also require a header (a targeted canary:
//! `x-canary: fp8` → the canary pool). The picker then works inside the pool whose cluster
//! the route chose, so two pools of one base model keep their own picker state.
//!
//! Routes are rendered in this order, first match winning: the header-targeted rules, then
//! the other given routes, then one route per pool for every model no given route covers
//! (today's one pool per model). A model served by two pools must be given a route.

use super::bootstrap::Pool;
use super::template::{Template, Vars};
use anyhow::{bail, Result};
use serde_yaml_ng::Value;

/// The request header the sticky split draws from (a u64 the body router sets).
pub const SPLIT_KEY_HEADER: &str = "x-gateway-split-key";

/// One route of the gateway.
///
/// `backends` name pools by their index in the pool list (`StackOptions::pools`,
/// `BootstrapParams::pools`), each with its weight; with one backend the weight is
/// ignored. Every backend must serve `model` as its base model. Built with
/// [`RouteSpec::to`] or [`RouteSpec::split`], then [`RouteSpec::sticky`] /
/// [`RouteSpec::when_header`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    /// The base model matched on `x-gateway-base-model-name`.
    pub model: String,
    /// A request header that must also be present with exactly this value (name, value).
    pub header: Option<(String, String)>,
    /// (pool index, weight) pairs.
    pub backends: Vec<(usize, u32)>,
    /// Split by the `x-gateway-split-key` header (one pool per conversation) instead of a
    /// draw per request.
    pub sticky: bool,
    /// Only requests whose path starts with this (an `HTTPRoute`'s `PathPrefix` match);
    /// `None`: every path (the prototypes' prefix `/`).
    pub path_prefix: Option<String>,
}

impl RouteSpec {
    /// Every request for `model` to the pool at index `pool`.
    pub fn to(model: impl Into<String>, pool: usize) -> Self {
        RouteSpec {
            model: model.into(),
            header: None,
            backends: vec![(pool, 1)],
            sticky: false,
            path_prefix: None,
        }
    }

    /// `model`'s requests split across pools by weight, per request.
    pub fn split(model: impl Into<String>, backends: &[(usize, u32)]) -> Self {
        RouteSpec {
            model: model.into(),
            header: None,
            backends: backends.to_vec(),
            sticky: false,
            path_prefix: None,
        }
    }

    /// The split drawn from `x-gateway-split-key` instead of per request.
    pub fn sticky(self) -> Self {
        RouteSpec {
            sticky: true,
            ..self
        }
    }

    /// Only requests that also carry `name: value`.
    pub fn when_header(self, name: impl Into<String>, value: impl Into<String>) -> Self {
        RouteSpec {
            header: Some((name.into().to_ascii_lowercase(), value.into())),
            ..self
        }
    }

    /// Only requests whose path starts with `prefix`.
    pub fn under_path(self, prefix: impl Into<String>) -> Self {
        RouteSpec {
            path_prefix: Some(prefix.into()),
            ..self
        }
    }

    /// The route's name in Envoy's configuration (`pool:MODEL`, `split:MODEL`, with
    /// `:HEADER=VALUE` for a header-targeted rule).
    pub fn name(&self) -> String {
        let kind = if self.backends.len() > 1 {
            "split"
        } else {
            "pool"
        };
        match &self.header {
            Some((h, v)) => format!("{kind}:{}:{h}={v}", self.model),
            None => format!("{kind}:{}", self.model),
        }
    }
}

/// The full route list for `pools`: `given` checked (pool indices, base models, weights),
/// header-targeted rules first, then the other given routes, then one route per pool for
/// each model no given route without a header covers.
pub fn resolve(pools: &[Pool], given: &[RouteSpec]) -> Result<Vec<RouteSpec>> {
    for route in given {
        check(pools, route)?;
    }
    let (mut out, rest): (Vec<RouteSpec>, Vec<RouteSpec>) =
        given.iter().cloned().partition(|r| r.header.is_some());
    out.extend(rest);
    let covered = |model: &str, routes: &[RouteSpec]| {
        routes
            .iter()
            .any(|r| r.header.is_none() && r.model == model)
    };
    let mut defaults = Vec::new();
    for (i, pool) in pools.iter().enumerate() {
        if covered(&pool.base_model, given) || covered(&pool.base_model, &defaults) {
            continue;
        }
        let serving: Vec<usize> = (0..pools.len())
            .filter(|&j| pools[j].base_model == pool.base_model)
            .collect();
        if serving.len() > 1 {
            bail!(
                "pools {serving:?} all serve `{}`: give a route (a split, or one pool) for it",
                pool.base_model
            );
        }
        defaults.push(RouteSpec::to(pool.base_model.clone(), i));
    }
    out.extend(defaults);
    Ok(out)
}

fn check(pools: &[Pool], route: &RouteSpec) -> Result<()> {
    let what = route.name();
    if route.backends.is_empty() {
        bail!("route {what}: no pool to send to");
    }
    for &(i, _) in &route.backends {
        let Some(pool) = pools.get(i) else {
            bail!("route {what}: no pool {i} (there are {})", pools.len());
        };
        if pool.base_model != route.model {
            bail!(
                "route {what}: pool {i} serves `{}`, not `{}`",
                pool.base_model,
                route.model
            );
        }
    }
    if route.backends.len() > 1 {
        let total: u64 = route.backends.iter().map(|&(_, w)| u64::from(w)).sum();
        if total == 0 {
            bail!("route {what}: every weight is 0");
        }
    }
    if let Some((name, _)) = &route.header {
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
            bail!("route {what}: `{name}` is not a header name");
        }
    }
    Ok(())
}

/// Renders `route` with `t`'s prototypes (`pool_route`, `split_route`,
/// `sticky_split_route`, `weighted_cluster`, `header_match`); `clusters[i]` is the
/// cluster name of pool `i`, `retry_policy` what the route prototypes splice as
/// `{{retry_policy}}`.
pub fn render(
    t: &Template,
    route: &RouteSpec,
    clusters: &[String],
    retry_policy: &Value,
) -> Result<Value> {
    let cluster_of = |i: usize| Value::String(clusters.get(i).cloned().unwrap_or_default());
    let mut vars = Vars::new();
    vars.insert("route_name".into(), Value::String(route.name()));
    vars.insert("model".into(), Value::String(route.model.clone()));
    vars.insert("retry_policy".into(), retry_policy.clone());
    let mut headers = Vec::new();
    if let Some((name, value)) = &route.header {
        let mut h = Vars::new();
        h.insert("header".into(), Value::String(name.clone()));
        h.insert("value".into(), Value::String(value.clone()));
        headers.push(t.prototype("header_match", &h)?);
    }
    vars.insert("header_matches".into(), Value::Sequence(headers));
    let mut rendered = match route.backends.as_slice() {
        [(i, _)] => {
            vars.insert("cluster".into(), cluster_of(*i));
            t.prototype("pool_route", &vars)
        }
        backends => {
            let mut weighted = Vec::with_capacity(backends.len());
            for &(i, weight) in backends {
                let mut w = Vars::new();
                w.insert("cluster".into(), cluster_of(i));
                w.insert("weight".into(), Value::from(weight));
                weighted.push(t.prototype("weighted_cluster", &w)?);
            }
            vars.insert("weighted_clusters".into(), Value::Sequence(weighted));
            let proto = if route.sticky {
                "sticky_split_route"
            } else {
                "split_route"
            };
            t.prototype(proto, &vars)
        }
    }?;
    if let Some(prefix) = &route.path_prefix {
        match rendered.get_mut("match").and_then(Value::as_mapping_mut) {
            Some(m) => {
                m.insert(Value::from("prefix"), Value::String(prefix.clone()));
            }
            None => bail!("route {}: the prototype has no `match`", route.name()),
        }
    }
    Ok(rendered)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn pools() -> Vec<Pool> {
        let a = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        vec![
            Pool::new("llama", vec![a(1)]),
            Pool::new("llama", vec![a(2)]),
            Pool::new("qwen", vec![a(3)]),
        ]
    }

    #[test]
    fn header_rules_come_first_and_uncovered_models_get_their_pool() {
        let given = [
            RouteSpec::split("llama", &[(0, 90), (1, 10)]).sticky(),
            RouteSpec::to("llama", 1).when_header("X-Canary", "fp8"),
        ];
        let routes = resolve(&pools(), &given).unwrap();
        let names: Vec<String> = routes.iter().map(RouteSpec::name).collect();
        assert_eq!(
            names,
            ["pool:llama:x-canary=fp8", "split:llama", "pool:qwen"]
        );
        assert_eq!(routes[2].backends, [(2, 1)]);
        assert!(routes[1].sticky);
    }

    #[test]
    fn two_pools_of_one_model_need_a_route_and_bad_routes_are_refused() {
        let err = resolve(&pools(), &[]).unwrap_err().to_string();
        assert!(err.contains("[0, 1]") && err.contains("llama"), "{err}");
        // A header rule alone does not say where the rest goes.
        let only_header = [RouteSpec::to("llama", 1).when_header("x-canary", "fp8")];
        assert!(resolve(&pools(), &only_header).is_err());
        for bad in [
            RouteSpec::to("llama", 7),
            RouteSpec::to("llama", 2),
            RouteSpec::split("llama", &[(0, 0), (1, 0)]),
            RouteSpec::split("llama", &[]),
            RouteSpec::to("llama", 0).when_header("bad name", "x"),
        ] {
            assert!(
                resolve(&pools(), std::slice::from_ref(&bad)).is_err(),
                "{bad:?}"
            );
        }
        // A weight of 0 beside another is a rollback, not an error.
        let rollback = [RouteSpec::split("llama", &[(0, 100), (1, 0)])];
        assert_eq!(resolve(&pools(), &rollback).unwrap().len(), 2);
    }
}
