//! Gateway API `HTTPRoute` objects as the launcher's routes (`up --routes FILE`), read
//! verbatim: each rule's matches must name the model with the header the body router sets
//! (`X-Gateway-Base-Model-Name`, exact); one more exact header match makes it a
//! header-targeted rule; its `backendRefs` are `InferencePool`s named like the launcher's
//! pools (`--pool NAME=…`), with their weights. A rule with two backends or more is a
//! weighted split, sticky on `x-gateway-split-key` when asked (the `HTTPRoute` has no word
//! for that). Anything the gateway's routes cannot express (path or query matches other
//! than the prefix `/`, methods, filters, other backend kinds) is an error naming it.

use super::routes::RouteSpec;
use super::stack::PoolSpec;
use anyhow::{bail, Context, Result};
use serde_json::Value;

/// The request header every route matches on (set by the body router).
const MODEL_HEADER: &str = "x-gateway-base-model-name";

/// The routes of `objects` (HTTPRoute objects as JSON) over `pools`.
pub fn routes(objects: &[Value], pools: &[PoolSpec], sticky: bool) -> Result<Vec<RouteSpec>> {
    let mut out = Vec::new();
    for object in objects {
        let name = object["metadata"]["name"].as_str().unwrap_or("?");
        if object["kind"] != "HTTPRoute" {
            bail!(
                "`{name}`: kind {} is not HTTPRoute",
                object["kind"].as_str().unwrap_or("(none)")
            );
        }
        let rules = object["spec"]["rules"].as_array().map_or(&[][..], |r| r);
        for (i, rule) in rules.iter().enumerate() {
            let rule_routes = rule_routes(rule, pools, sticky)
                .with_context(|| format!("HTTPRoute `{name}`, rule {i}"))?;
            out.extend(rule_routes);
        }
    }
    Ok(out)
}

fn rule_routes(rule: &Value, pools: &[PoolSpec], sticky: bool) -> Result<Vec<RouteSpec>> {
    if rule.get("filters").is_some_and(|f| !f.is_null()) {
        bail!("filters are not supported");
    }
    let backends = backends(rule, pools)?;
    let matches = rule["matches"].as_array().map_or(&[][..], |m| m);
    if matches.is_empty() {
        bail!("no match naming the model with {MODEL_HEADER}");
    }
    let mut out = Vec::new();
    for m in matches {
        let (model, header) = read_match(m)?;
        let mut route = if backends.len() == 1 {
            RouteSpec::to(model, backends[0].0)
        } else {
            let route = RouteSpec::split(model, &backends);
            if sticky {
                route.sticky()
            } else {
                route
            }
        };
        if let Some((name, value)) = header {
            route = route.when_header(name, value);
        }
        out.push(route);
    }
    Ok(out)
}

/// The rule's `backendRefs` as (pool index, weight).
fn backends(rule: &Value, pools: &[PoolSpec]) -> Result<Vec<(usize, u32)>> {
    let refs = rule["backendRefs"].as_array().map_or(&[][..], |r| r);
    if refs.is_empty() {
        bail!("no backendRefs");
    }
    refs.iter()
        .map(|r| {
            let kind = r["kind"].as_str().unwrap_or("Service");
            if kind != "InferencePool" {
                bail!("backendRef kind {kind}: only InferencePool");
            }
            let name = r["name"].as_str().unwrap_or_default();
            let index = pools
                .iter()
                .position(|p| p.name.as_deref() == Some(name))
                .with_context(|| format!("no pool named `{name}` (give it with --pool)"))?;
            let weight = match &r["weight"] {
                Value::Null => 1,
                w => w
                    .as_u64()
                    .and_then(|w| u32::try_from(w).ok())
                    .with_context(|| format!("backendRef `{name}`: weight {w}"))?,
            };
            Ok((index, weight))
        })
        .collect()
}

/// One `HTTPRouteMatch`: the model (from the model header) and at most one other header.
fn read_match(m: &Value) -> Result<(String, Option<(String, String)>)> {
    if let Some(path) = m.get("path") {
        let prefix_root = path["type"].as_str().unwrap_or("PathPrefix") == "PathPrefix"
            && path["value"].as_str().unwrap_or("/") == "/";
        if !prefix_root {
            bail!("path match {path}: only the prefix /");
        }
    }
    for unsupported in ["queryParams", "method"] {
        if m.get(unsupported).is_some_and(|v| !v.is_null()) {
            bail!("{unsupported} matches are not supported");
        }
    }
    let mut model = None;
    let mut other = Vec::new();
    for h in m["headers"].as_array().map_or(&[][..], |h| h) {
        if h["type"].as_str().unwrap_or("Exact") != "Exact" {
            bail!("header match {h}: only Exact");
        }
        let name = h["name"].as_str().unwrap_or_default().to_ascii_lowercase();
        let value = h["value"].as_str().unwrap_or_default().to_owned();
        if name == MODEL_HEADER {
            model = Some(value);
        } else {
            other.push((name, value));
        }
    }
    let Some(model) = model else {
        bail!("a match without {MODEL_HEADER} (every route matches the model)");
    };
    if other.len() > 1 {
        bail!("more than one header beside the model: {other:?}");
    }
    Ok((model, other.pop()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The seed's canary route, verbatim.
    const SEED: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: llama-70b
  namespace: serving
spec:
  parentRefs:
    - name: inference-gateway
      namespace: gateway-system
  rules:
    - matches:
        - headers:
            - name: X-Gateway-Base-Model-Name
              value: llama-70b
      backendRefs:
        - group: inference.networking.k8s.io
          kind: InferencePool
          name: llama-70b-bf16
          weight: 90
        - group: inference.networking.k8s.io
          kind: InferencePool
          name: llama-70b-fp8
          weight: 10
";

    fn pools() -> Vec<PoolSpec> {
        vec![
            PoolSpec::on("llama-70b", &[0, 1, 2]).named("llama-70b-bf16"),
            PoolSpec::on("llama-70b", &[3]).named("llama-70b-fp8"),
        ]
    }

    fn object(yaml: &str) -> Value {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn the_seed_route_is_a_90_10_split_of_the_named_pools() {
        let r = routes(&[object(SEED)], &pools(), true).unwrap();
        assert_eq!(
            r,
            [RouteSpec::split("llama-70b", &[(0, 90), (1, 10)]).sticky()]
        );
        let r = routes(&[object(SEED)], &pools(), false).unwrap();
        assert!(!r[0].sticky);
    }

    #[test]
    fn a_header_rule_targets_one_pool_and_unsupported_shapes_are_refused() {
        let canary = SEED.replace(
            "              value: llama-70b\n",
            "              value: llama-70b\n            - name: X-Canary\n              value: fp8\n",
        );
        let canary = canary.replace("          weight: 90\n", "          weight: 0\n");
        let r = routes(&[object(&canary)], &pools(), false).unwrap();
        assert_eq!(r[0].header, Some(("x-canary".into(), "fp8".into())));
        assert_eq!(r[0].backends, [(0, 0), (1, 10)]);
        for (from, to) in [
            ("kind: HTTPRoute", "kind: GRPCRoute"),
            (
                "kind: InferencePool\n          name: llama-70b-fp8",
                "kind: Service\n          name: x",
            ),
            ("name: llama-70b-fp8", "name: llama-70b-int4"),
            ("X-Gateway-Base-Model-Name", "X-Model"),
            (
                "        - headers:",
                "        - path: {type: Exact, value: /v1}\n          headers:",
            ),
            ("weight: 10", "weight: -1"),
        ] {
            let bad = object(&SEED.replace(from, to));
            assert!(routes(&[bad], &pools(), false).is_err(), "{to}");
        }
    }
}
