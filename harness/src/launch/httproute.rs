//! Gateway API `HTTPRoute` objects as the launcher's routes (`up --routes FILE`), read
//! verbatim by the same typed reader `infergate render` uses
//! ([`infergate_cli::render::objects::http_route::v1`]): each rule's matches must name the model
//! with the header the body router sets (`X-Gateway-Base-Model-Name`, exact); one more
//! exact header match makes it a header-targeted rule; a `PathPrefix` match limits the
//! route to that prefix; its `backendRefs` are `InferencePool`s named like the launcher's
//! pools (`--pool NAME=…`), with their weights. A rule with two backends or more is a
//! weighted split, sticky on `x-gateway-split-key` when asked (the `HTTPRoute` has no word
//! for that). Anything the gateway's routes cannot express (other path match types,
//! queries, methods, filters, host names, other backend kinds) is an error naming its path.

use super::stack::PoolSpec;
use anyhow::{anyhow, bail, Result};
use infergate_cli::config::routes::RouteSpec;
use infergate_cli::render::objects::http_route::v1;
use infergate_cli::render::report::Report;
use serde_json::Value;

/// The routes of `objects` (HTTPRoute objects as JSON) over `pools`.
pub fn routes(objects: &[Value], pools: &[PoolSpec], sticky: bool) -> Result<Vec<RouteSpec>> {
    let mut out = Vec::new();
    for object in objects {
        let name = object["metadata"]["name"].as_str().unwrap_or("?");
        if object["kind"] != v1::KIND {
            bail!(
                "`{name}`: kind {} is not HTTPRoute",
                object["kind"].as_str().unwrap_or("(none)")
            );
        }
        let route = v1::read(object, &mut Report::default())?;
        for rule in &route.rules {
            let mut backends = Vec::new();
            for b in &rule.backends {
                let index = pools
                    .iter()
                    .position(|p| p.name.as_deref() == Some(b.pool.as_str()))
                    .ok_or_else(|| {
                        anyhow!(
                            "{} {}: no pool named `{}` (give it with --pool)",
                            route.label,
                            b.path,
                            b.pool
                        )
                    })?;
                backends.push((index, b.weight));
            }
            for m in &rule.matches {
                let mut spec = if backends.len() == 1 {
                    RouteSpec::to(m.model.clone(), backends[0].0)
                } else if sticky {
                    RouteSpec::split(m.model.clone(), &backends).sticky()
                } else {
                    RouteSpec::split(m.model.clone(), &backends)
                };
                if let Some((h, v)) = &m.header {
                    spec = spec.when_header(h.clone(), v.clone());
                }
                if let Some(prefix) = &m.path_prefix {
                    spec = spec.under_path(prefix.clone());
                }
                out.push(spec);
            }
        }
    }
    Ok(out)
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
        let under_v1 = SEED.replace(
            "        - headers:",
            "        - path: {type: PathPrefix, value: /v1}\n          headers:",
        );
        let r = routes(&[object(&under_v1)], &pools(), false).unwrap();
        assert_eq!(r[0].path_prefix.as_deref(), Some("/v1"));
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
