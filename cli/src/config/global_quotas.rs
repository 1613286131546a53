//! Global quotas for several gateway replicas, as a gateway's bootstrap gets them: a
//! tenant's requests and tokens per minute shared by every Envoy through Envoy's global
//! rate-limit protocol. [`GlobalQuotas`] is the router config's `globalQuotas: true`,
//! Envoy's `ratelimit` HTTP filter after the router filter (prototype `global_quota_filter`,
//! spliced at `global_quota_filters`) and the cluster of the rate-limit service (prototype
//! `global_quota_cluster`, spliced at `global_quota_clusters`).
//!
//! The services themselves (Redis, `infergate-ratelimit`) are started by the harness's
//! launcher (`infergate_harness::launch::global_quotas`).

use super::template::{Template, Vars};
use anyhow::{bail, Result};
use serde_json::Value as Json;
use serde_yaml_ng::Value;
use std::net::SocketAddr;

/// The rate-limit domain the gateways send and the service serves.
pub const DOMAIN: &str = "infergate";

/// What one gateway needs to use the global rate-limit service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobalQuotas {
    /// The rate-limit service's gRPC address.
    pub service: SocketAddr,
    /// The rate-limit domain.
    pub domain: String,
}

/// The list items [`GlobalQuotas`] adds to a template.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Splices {
    /// `global_quota_filters`: Envoy's `ratelimit` filter, or nothing.
    pub filters: Vec<Value>,
    /// `global_quota_clusters`: the rate-limit service's cluster, or nothing.
    pub clusters: Vec<Value>,
}

impl GlobalQuotas {
    /// Global quotas through the service at `service`, in [`DOMAIN`].
    pub fn at(service: SocketAddr) -> GlobalQuotas {
        GlobalQuotas {
            service,
            domain: DOMAIN.to_owned(),
        }
    }

    /// The items spliced at `global_quota_filters` and `global_quota_clusters`: none
    /// without global quotas.
    pub fn splices(global: Option<&GlobalQuotas>, template: &Template) -> Result<Splices> {
        let Some(global) = global else {
            return Ok(Splices::default());
        };
        if !template.has_prototype("global_quota_filter") {
            bail!("global quotas need the wasm or native flavour");
        }
        let mut vars = Vars::new();
        vars.insert(
            "rate_limit_domain".into(),
            Value::String(global.domain.clone()),
        );
        vars.insert(
            "rate_limit_address".into(),
            Value::String(global.service.ip().to_string()),
        );
        vars.insert("rate_limit_port".into(), Value::from(global.service.port()));
        Ok(Splices {
            filters: vec![template.prototype("global_quota_filter", &vars)?],
            clusters: vec![template.prototype("global_quota_cluster", &vars)?],
        })
    }

    /// Sets `globalQuotas: true` in the router configuration `router` (a JSON object) with
    /// global quotas; leaves it alone without.
    pub fn apply_to_router(global: Option<&GlobalQuotas>, router: &mut Json) -> Result<()> {
        if global.is_none() {
            return Ok(());
        }
        let Some(map) = router.as_object_mut() else {
            bail!("the router configuration is not a JSON object");
        };
        map.insert(
            infergate_filters::stages::tenancy::GLOBAL_QUOTAS_KEY.into(),
            Json::Bool(true),
        );
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn the_router_gets_the_flag_only_with_global_quotas() {
        let mut router = serde_json::json!({"role": "router"});
        GlobalQuotas::apply_to_router(None, &mut router).unwrap();
        assert!(router.get("globalQuotas").is_none());
        let g = GlobalQuotas::at(SocketAddr::from(([127, 0, 0, 1], 9)));
        GlobalQuotas::apply_to_router(Some(&g), &mut router).unwrap();
        assert_eq!(router["globalQuotas"], true);
    }

    /// Both gateway templates: the rate-limit filter right after the router filter, the
    /// service's cluster, the router's flag; none of it without global quotas; the plain
    /// template refuses them.
    #[test]
    fn the_templates_splice_the_filter_after_the_router_and_the_cluster() {
        use crate::config::bootstrap::{render, BootstrapParams, Flavor, Pool};
        let pools = vec![Pool::new(
            "m",
            vec![SocketAddr::from(([127, 0, 0, 1], 8001))],
        )];
        let service = SocketAddr::from(([127, 0, 0, 1], 4321));
        for flavor in [Flavor::Native, Flavor::Wasm] {
            let mut params = BootstrapParams::new(flavor, pools.clone());
            params.module = Some(PathBuf::from("/nonexistent/module"));
            let hcm = |v: &Json| {
                v["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
                    ["typed_config"]
                    .clone()
            };
            let plain: Json = serde_yaml_ng::from_str(&render(&params).unwrap()).unwrap();
            let filters = hcm(&plain)["http_filters"].clone();
            assert!(
                filters
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|f| f["name"] != "envoy.filters.http.ratelimit"),
                "{flavor}: {filters}"
            );
            params.global_quotas = Some(GlobalQuotas::at(service));
            let v: Json = serde_yaml_ng::from_str(&render(&params).unwrap()).unwrap();
            let filters = hcm(&v)["http_filters"].as_array().unwrap().clone();
            // After the router's header edits are applied (Wasm: the `headers` filter).
            let router = filters
                .iter()
                .position(|f| f["name"] == "infergate.headers")
                .or_else(|| filters.iter().position(|f| f["name"] == "infergate.router"))
                .unwrap();
            let rl = &filters[router + 1];
            assert_eq!(rl["name"], "envoy.filters.http.ratelimit", "{flavor}");
            let config = &rl["typed_config"];
            assert_eq!(config["domain"], DOMAIN, "{flavor}");
            assert_eq!(config["timeout"], "1s", "{flavor}");
            let limits = config["rate_limits"].as_array().unwrap();
            assert_eq!(limits.len(), 3, "{flavor}");
            assert_eq!(limits[2]["apply_on_stream_done"], true, "{flavor}");
            let state = if flavor == Flavor::Wasm {
                "%FILTER_STATE(wasm.infergate.quota.actual:PLAIN)%"
            } else {
                "%FILTER_STATE(infergate.quota.actual:PLAIN)%"
            };
            assert_eq!(limits[2]["hits_addend"]["format"], state, "{flavor}");
            let clusters = v["static_resources"]["clusters"].as_array().unwrap();
            let rls = clusters
                .iter()
                .find(|c| c["name"] == "infergate_ratelimit")
                .unwrap();
            let addr = &rls["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
                ["address"]["socket_address"];
            assert_eq!(addr["port_value"], 4321, "{flavor}");
            let router = filters
                .iter()
                .position(|f| f["name"] == "infergate.router")
                .unwrap();
            let typed = &filters[router]["typed_config"];
            let text = typed["filter_config"]["value"]
                .as_str()
                .or(typed["config"]["configuration"]["value"].as_str())
                .unwrap();
            let router_config: Json = serde_json::from_str(text).unwrap();
            assert_eq!(router_config["globalQuotas"], true, "{flavor}");
        }
        let mut plain = BootstrapParams::new(Flavor::Plain, pools);
        plain.global_quotas = Some(GlobalQuotas::at(service));
        assert!(render(&plain).is_err());
    }
}
