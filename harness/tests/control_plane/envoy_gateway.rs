//! The translator: `envoy-gateway.yaml` (what `infergate render --target envoy-gateway`
//! writes) to the Envoy configuration Envoy Gateway would give the Gateway's proxy, as files
//! Envoy reads through its filesystem xDS: LDS and CDS, RDS and EDS.
//!
//! Every rule names the Envoy Gateway source it follows (envoyproxy/gateway, main of
//! August 2026). What is generated is the part the gateway's behaviour depends on: the
//! Gateway listener and its routes, one EDS cluster per route rule, the
//! `EnvoyExtensionPolicy` filters, the `BackendTrafficPolicy` load balancing and circuit
//! breakers, the `EnvoyProxy` module allowlist and the `EnvoyPatchPolicy` JSON patches.
//! Envoy Gateway's own listeners (ready, stats), tracing and the xDS client are left out.

use super::istio::{loopback_admin, write_resources, Translated};
use anyhow::{anyhow, bail, Context, Result};
use infergate_harness::launch::EdsDir;
use serde_json::{json, Map, Value as Json};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

const HCM: &str = "envoy.filters.network.http_connection_manager";
const HCM_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const WASM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
const MODULE_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter";
const STRING_VALUE: &str = "type.googleapis.com/google.protobuf.StringValue";
const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const ROUTE_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";

/// Envoy Gateway's proxy admin port (`EnvoyGatewayAdminPort` of the bootstrap,
/// internal/xds/bootstrap/bootstrap.go): a STATIC endpoint there is the proxy's own admin.
const EG_ADMIN: u16 = 19000;

/// The cluster the proxy fetches Wasm code from: Envoy Gateway's own HTTP server, which
/// serves the modules it pulled from OCI images (`wasmHTTPServiceClusterName`,
/// internal/xds/translator/wasm.go).
const WASM_CLUSTER: &str = "wasm_cluster";

/// Where the test's loopback world differs from a cluster's.
#[derive(Clone, Debug)]
pub struct Loopback {
    /// Where the xDS files are written.
    pub dir: PathBuf,
    /// The test Envoy's admin port (Envoy Gateway's is 19000).
    pub admin_port: u16,
    /// The loopback server standing in for Envoy Gateway's Wasm HTTP server.
    pub wasm_server: Option<SocketAddr>,
    /// The sha256 (hex) of the module it serves.
    pub wasm_sha256: String,
    /// The native module the `EnvoyProxy` deployment patch's image volume would mount.
    pub native_module: Option<PathBuf>,
    /// Each Service's endpoints (by Service name), which Envoy Gateway sends by EDS.
    pub endpoints: BTreeMap<String, Vec<SocketAddr>>,
}

/// Ranks of the filter types the rendered policies use (`newOrderedHTTPFilter`,
/// internal/xds/translator/httpfilters.go): Wasm `200 + i`, dynamic modules `250 + i`, `i`
/// the entry's index in its policy's list; Envoy's router last at 310. Filters the
/// translator does not rank keep 50.
fn rank(name: &str) -> u32 {
    let index = || {
        name.rsplit('/')
            .next()
            .and_then(|i| i.parse::<u32>().ok())
            .unwrap_or(0)
    };
    if name.starts_with("envoy.filters.http.wasm/") {
        200 + index()
    } else if name.starts_with("envoy.filters.http.dynamic_modules/") {
        250 + index()
    } else if name == "envoy.filters.http.router" {
        310
    } else {
        50
    }
}

/// A policy's targets reach a route: a `Gateway` target reaches every route of the
/// gateway, an `HTTPRoute` target the route of that name.
fn targets(policy: &Json, route: &Json) -> bool {
    let refs = policy["spec"]["targetRefs"]
        .as_array()
        .cloned()
        .or_else(|| {
            policy["spec"]["targetRef"]
                .as_object()
                .map(|o| vec![Json::Object(o.clone())])
        })
        .unwrap_or_default();
    refs.iter().any(|t| match t["kind"].as_str() {
        Some("Gateway") => true,
        Some("HTTPRoute") => t["name"] == route["metadata"]["name"],
        _ => false,
    })
}

/// The HTTP filters of an `EnvoyExtensionPolicy` (`buildHCMWasmFilter`, wasm.go;
/// `buildHCMDynamicModuleFilter`, dynamicmodule.go): named `<type>/envoyextensionpolicy/
/// <ns>/<policy>/<kind>/<i>` (`perRouteFilterName`; the IR name from
/// internal/gatewayapi/envoyextensionpolicy.go), `disabled: true` at the connection manager
/// (enabled per route). A Wasm entry's VM is its own (`vm_id` the IR name), V8, its code
/// fetched from Envoy Gateway's server with the module's sha256 and the plugin
/// configuration a StringValue of the entry's `config`; a dynamic-module entry names a
/// module of the `EnvoyProxy`'s allowlist, its `config` passed as JSON text.
fn policy_filters(
    policy: &Json,
    modules: &BTreeMap<String, Json>,
    lo: &Loopback,
) -> Result<Vec<Json>> {
    let ns = policy["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default");
    let name = policy["metadata"]["name"].as_str().unwrap_or_default();
    let mut out = Vec::new();
    for (i, w) in policy["spec"]["wasm"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let ir = format!("envoyextensionpolicy/{ns}/{name}/wasm/{i}");
        let server = lo
            .wasm_server
            .ok_or_else(|| anyhow!("a Wasm entry, and no Wasm server"))?;
        let mut config = json!({
            "name": w["name"],
            "vm_config": {"vm_id": ir, "runtime": "envoy.wasm.runtime.v8",
                "code": {"remote": {
                    "http_uri": {"uri": format!("http://{server}/{}.wasm", lo.wasm_sha256),
                                 "cluster": WASM_CLUSTER, "timeout": "10s"},
                    "sha256": lo.wasm_sha256,
                    "retry_policy": {"num_retries": 3,
                        "retry_back_off": {"base_interval": "1s", "max_interval": "10s"}}}}},
            "configuration": {"@type": STRING_VALUE, "value": w["config"].to_string()},
            "fail_open": w["failOpen"].as_bool().unwrap_or(false)
        });
        if let Some(root) = w["rootID"].as_str() {
            config["root_id"] = json!(root);
        }
        out.push(
            json!({"name": format!("envoy.filters.http.wasm/{ir}"), "disabled": true,
                        "typed_config": {"@type": WASM_TYPE, "config": config}}),
        );
    }
    for (i, m) in policy["spec"]["dynamicModule"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let ir = format!("envoyextensionpolicy/{ns}/{name}/dynamic-module/{i}");
        let module = m["name"].as_str().unwrap_or_default();
        let allowed = modules
            .get(module)
            .ok_or_else(|| anyhow!("module `{module}` is not in the EnvoyProxy's allowlist"))?;
        let path = allowed["source"]["local"]["path"]
            .as_str()
            .ok_or_else(|| anyhow!("module `{module}`: only a local source is translated"))?;
        let file = lo
            .native_module
            .as_deref()
            .ok_or_else(|| anyhow!("a native module mounted at {path}, none given"))?;
        out.push(
            json!({"name": format!("envoy.filters.http.dynamic_modules/{ir}"), "disabled": true,
            "typed_config": {"@type": MODULE_TYPE,
                "dynamic_module_config": {"module": {"local": {"filename": file}},
                    "do_not_close": allowed["doNotClose"].as_bool().unwrap_or(false)},
                "filter_name": m["filterName"],
                "filter_config": {"@type": STRING_VALUE, "value": m["config"].to_string()}}}),
        );
    }
    Ok(out)
}

/// The connection manager of a plain-HTTP Gateway listener (`buildXdsTCPListener` and
/// `addHCMToXDSListener`, internal/xds/translator/listener.go): RDS named as the listener,
/// path normalisation on, `use_remote_address`, the server header passed through, headers
/// with underscores rejected (`buildHeadersWithUnderscoresAction`), no stream or request
/// timeout unless a ClientTrafficPolicy sets one.
fn hcm(listener: &str, rds_path: &Path, filters: Vec<Json>) -> Json {
    json!({
        "name": HCM,
        "typed_config": {
            "@type": HCM_TYPE,
            "stat_prefix": "http-80",
            "rds": {"route_config_name": listener,
                    "config_source": {"path_config_source": {"path": rds_path},
                                      "resource_api_version": "V3"}},
            "normalize_path": true,
            "use_remote_address": true,
            "server_header_transformation": "PASS_THROUGH",
            "common_http_protocol_options": {"headers_with_underscores_action": "REJECT_REQUEST"},
            "http2_protocol_options": {"initial_stream_window_size": 65536,
                                       "initial_connection_window_size": 1048576},
            "http_filters": filters
        }
    })
}

/// A route rule's cluster (`processXdsCluster` / `buildXdsCluster`, cluster.go): EDS,
/// `connect_timeout` 10 s, the policy's load balancing, its circuit breakers, the
/// `per_connection_buffer_limit_bytes` of 32 KiB Envoy Gateway sets on clusters.
fn rule_cluster(name: &str, eds: &EdsDir, btp: Option<&Json>) -> Json {
    let mut c = json!({
        "@type": CLUSTER_TYPE,
        "name": name,
        "type": "EDS",
        "eds_cluster_config": {"service_name": name, "eds_config": {
            "path_config_source": {"path": eds.path(name), "watched_directory": {"path": eds.dir()}},
            "resource_api_version": "V3"}},
        "connect_timeout": "10s",
        "per_connection_buffer_limit_bytes": 32768,
        "lb_policy": "LEAST_REQUEST",
        "ignore_health_on_host_removal": true,
        "common_lb_config": {"locality_weighted_lb_config": {}}
    });
    let Some(spec) = btp.map(|b| &b["spec"]) else {
        return c;
    };
    // `buildEndpointOverrideLoadBalancingPolicy` (cluster.go): override_host from the
    // headers named, the policy's type as fallback.
    let lb = &spec["loadBalancer"];
    if let Some(from) = lb["endpointOverride"]["extractFrom"].as_array() {
        let fallback = match lb["type"].as_str() {
            Some("RoundRobin") => ("round_robin", "round_robin.v3.RoundRobin"),
            Some("Random") => ("random", "random.v3.Random"),
            _ => ("least_request", "least_request.v3.LeastRequest"),
        };
        let sources: Vec<Json> = from
            .iter()
            .map(|s| json!({"header": s["header"]}))
            .collect();
        // A cluster with a `load_balancing_policy` takes no `lb_policy` and no partial
        // `common_lb_config` (Envoy refuses the cluster otherwise).
        if let Some(m) = c.as_object_mut() {
            m.remove("lb_policy");
            m.remove("common_lb_config");
        }
        c["load_balancing_policy"] = json!({"policies": [{"typed_extension_config": {
            "name": "envoy.load_balancing_policies.override_host",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
                "override_host_sources": sources,
                "fallback_policy": {"policies": [{"typed_extension_config": {
                    "name": format!("envoy.load_balancing_policies.{}", fallback.0),
                    "typed_config": {"@type": format!("type.googleapis.com/envoy.extensions.load_balancing_policies.{}", fallback.1)}}}]}}}}]});
    } else if lb["type"] == "RoundRobin" {
        c["lb_policy"] = json!("ROUND_ROBIN");
    }
    // `buildXdsClusterCircuitBreaker` (cluster.go).
    let cb = &spec["circuitBreaker"];
    if cb.is_object() {
        c["circuit_breakers"] = json!({"thresholds": [{
            "max_connections": cb["maxConnections"], "max_pending_requests": cb["maxPendingRequests"],
            "max_requests": cb["maxParallelRequests"], "max_retries": cb["maxParallelRetries"]}]});
    }
    c
}

/// An `EnvoyPatchPolicy`'s JSON patch on `doc` (`ApplyJSONPatches`,
/// internal/utils/jsonpatch/patch.go): a `jsonPath` is resolved to the JSON pointers of
/// the nodes it selects (`ConvertPathToPointers`, jsonpathtopointer.go), `path` appended;
/// without one, `path` is the pointer. `add` creates missing parents
/// (`EnsurePathExistsOnAdd`).
fn apply_patch(doc: &mut Json, op: &Json) -> Result<()> {
    let path = op["path"].as_str().unwrap_or_default();
    let pointers: Vec<String> = match op["jsonPath"].as_str() {
        Some(query) => {
            let query = serde_json_path::JsonPath::parse(query)
                .with_context(|| format!("jsonPath `{query}`"))?;
            let found: Vec<String> = query
                .query_located(doc)
                .locations()
                .map(|l| format!("{}{path}", l.to_json_pointer()))
                .collect();
            if found.is_empty() {
                bail!("no jsonPointers were found while evaluating the jsonPath");
            }
            found
        }
        None => vec![path.to_owned()],
    };
    for pointer in pointers {
        let mut one = Map::new();
        one.insert("op".into(), op["op"].clone());
        one.insert("path".into(), json!(pointer));
        for key in ["from", "value"] {
            if let Some(v) = op.get(key) {
                one.insert(key.into(), v.clone());
            }
        }
        let patch: json_patch::Patch = serde_json::from_value(json!([one]))?;
        json_patch::patch(doc, &patch).with_context(|| format!("at {pointer}"))?;
    }
    Ok(())
}

/// Every route of every `HTTPRoute` (`buildXdsRoute` / `buildXdsRouteMatch`, route.go): a
/// `PathPrefix` other than `/` becomes `path_separated_prefix`, each header an exact match;
/// the rule's cluster; `timeout` the rule's `timeouts.request` (none: Envoy's default);
/// every `EnvoyExtensionPolicy` filter reaching the route enabled in
/// `typed_per_filter_config` (`enableFilterOnRoute`, httpfilters.go). Routes are sorted most
/// specific first as Gateway API orders them (`sortXdsIRRoutes`, internal/xds/translator/
/// translator.go): longer path first, then more headers.
fn routes(
    docs: &[Json],
    policies: &[(Json, Vec<Json>)],
    clusters: &mut Vec<(String, String, Json)>,
) -> Vec<Json> {
    let mut out: Vec<(usize, usize, Json)> = Vec::new();
    for r in docs.iter().filter(|d| d["kind"] == "HTTPRoute") {
        let rname = r["metadata"]["name"].as_str().unwrap_or("route");
        let rns = r["metadata"]["namespace"].as_str().unwrap_or("default");
        let mut enabled = Map::new();
        for (policy, filters) in policies {
            if targets(policy, r) {
                for f in filters {
                    enabled.insert(
                        f["name"].as_str().unwrap_or_default().to_owned(),
                        json!({"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
                               "config": {}}),
                    );
                }
            }
        }
        for (ri, rule) in r["spec"]["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let cluster = format!("httproute/{rns}/{rname}/rule/{ri}");
            let service = rule["backendRefs"][0]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            clusters.push((cluster.clone(), service, r.clone()));
            let mut action = json!({"cluster": cluster});
            if let Some(t) = rule["timeouts"]["request"].as_str() {
                action["timeout"] = json!(t);
            }
            for (mi, m) in rule["matches"].as_array().into_iter().flatten().enumerate() {
                let mut matcher = Map::new();
                let prefix = m["path"]["value"].as_str().unwrap_or("/");
                if prefix == "/" {
                    matcher.insert("prefix".into(), json!("/"));
                } else {
                    matcher.insert(
                        "path_separated_prefix".into(),
                        json!(prefix.trim_end_matches('/')),
                    );
                }
                let headers: Vec<Json> = m["headers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|h| json!({"name": h["name"], "string_match": {"exact": h["value"]}}))
                    .collect();
                let n_headers = headers.len();
                matcher.insert("headers".into(), json!(headers));
                out.push((
                    prefix.len(),
                    n_headers,
                    json!({"name": format!("httproute/{rns}/{rname}/rule/{ri}/match/{mi}/*"),
                           "match": matcher, "route": action,
                           "typed_per_filter_config": enabled}),
                ));
            }
        }
    }
    out.sort_by_key(|(path, headers, _)| std::cmp::Reverse((*path, *headers)));
    out.into_iter().map(|(_, _, r)| r).collect()
}

/// Translates the documents of `envoy-gateway.yaml` for the Gateway listener `listener`
/// (`<ns>/<gateway>/<section>`).
pub fn translate(docs: &[Json], listener: &str, lo: &Loopback) -> Result<Translated> {
    std::fs::create_dir_all(&lo.dir)?;
    let eds = EdsDir::create(lo.dir.join("eds"))?;
    let of_kind = |k: &'static str| docs.iter().filter(move |d| d["kind"] == k);
    // The EnvoyProxy's module allowlist.
    let modules: BTreeMap<String, Json> = of_kind("EnvoyProxy")
        .flat_map(|p| {
            p["spec"]["dynamicModules"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|m| (m["name"].as_str().unwrap_or_default().to_owned(), m))
        .collect();
    let mut policies = Vec::new();
    for p in of_kind("EnvoyExtensionPolicy") {
        policies.push((p.clone(), policy_filters(p, &modules, lo)?));
    }
    let mut filters: Vec<Json> = policies.iter().flat_map(|(_, f)| f.clone()).collect();
    filters.push(json!({"name": "envoy.filters.http.router", "typed_config":
        {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}));
    filters.sort_by_key(|f| rank(f["name"].as_str().unwrap_or_default()));

    let mut rule_clusters = Vec::new();
    let route_list = routes(docs, &policies, &mut rule_clusters);
    let mut cds = Vec::new();
    let mut clusters = BTreeMap::new();
    let mut eds_clusters: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (cluster, service, route) in &rule_clusters {
        let btp = of_kind("BackendTrafficPolicy").find(|b| targets(b, route));
        let addrs = lo.endpoints.get(service).cloned().unwrap_or_default();
        eds.write_healthy(cluster, &addrs)?;
        cds.push(rule_cluster(cluster, &eds, btp));
        clusters
            .entry(service.clone())
            .or_insert_with(|| cluster.clone());
        eds_clusters
            .entry(service.clone())
            .or_default()
            .push(cluster.clone());
    }
    if let Some(server) = lo.wasm_server {
        cds.push(
            json!({"@type": CLUSTER_TYPE, "name": WASM_CLUSTER, "type": "STATIC",
            "connect_timeout": "10s",
            "load_assignment": {"cluster_name": WASM_CLUSTER, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {
                    "address": server.ip().to_string(), "port_value": server.port()}}}}]}]}}),
        );
    }
    let rds_path = lo.dir.join("rds.json");
    let mut lds = vec![json!({
        "@type": LISTENER_TYPE,
        "name": listener,
        // Loopback: Envoy Gateway binds 0.0.0.0:10080 for port 80; the test a free port.
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
        "per_connection_buffer_limit_bytes": 32768,
        "default_filter_chain": {"name": listener, "filters": [hcm(listener, &rds_path, filters)]}
    })];
    let mut route_config = json!({
        "@type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
        "name": listener,
        "ignore_port_in_host_matching": true,
        "virtual_hosts": [{"name": format!("{listener}/*"), "domains": ["*"], "routes": route_list}]
    });

    // The EnvoyPatchPolicies, after everything is generated (`processJSONPatches`,
    // jsonpatch.go): `add` with an empty path adds a resource; otherwise the resource of
    // that type and name is patched. A patch that fails is reported in the policy's status
    // and the resource is left as it was.
    let mut dropped = Vec::new();
    for epp in of_kind("EnvoyPatchPolicy") {
        for p in epp["spec"]["jsonPatches"].as_array().into_iter().flatten() {
            let (ty, name, op) = (
                p["type"].as_str().unwrap_or_default(),
                &p["name"],
                &p["operation"],
            );
            let describe = || format!("{ty} {name} {}", op["op"]);
            if op["op"] == "add"
                && op["path"].as_str().is_none_or(str::is_empty)
                && op.get("jsonPath").is_none()
            {
                let mut value = op["value"].clone();
                value["@type"] = json!(ty);
                match ty {
                    CLUSTER_TYPE => cds.push(value),
                    LISTENER_TYPE => lds.push(value),
                    _ => dropped.push(format!("{} (type not translated)", describe())),
                }
                continue;
            }
            let target = match ty {
                CLUSTER_TYPE => cds.iter_mut().find(|c| c["name"] == *name),
                LISTENER_TYPE => lds.iter_mut().find(|l| l["name"] == *name),
                ROUTE_TYPE => Some(&mut route_config).filter(|r| r["name"] == *name),
                _ => None,
            };
            let Some(target) = target else {
                dropped.push(format!("{} (resource not found)", describe()));
                continue;
            };
            let mut patched = target.clone();
            match apply_patch(&mut patched, op) {
                Ok(()) => *target = patched,
                Err(e) => dropped.push(format!("{}: {e:#}", describe())),
            }
        }
    }
    // Loopback: the proxy's own admin (a STATIC endpoint on 127.0.0.1:19000) is the test's.
    loopback_admin(&mut cds, EG_ADMIN, lo.admin_port);
    let lds_path = lo.dir.join("lds.json");
    let cds_path = lo.dir.join("cds.json");
    write_resources(&lds_path, &lds)?;
    write_resources(&cds_path, &cds)?;
    route_config["@type"] = json!("type.googleapis.com/envoy.config.route.v3.RouteConfiguration");
    write_resources(&rds_path, &[route_config])?;
    let bootstrap = json!({
        // The node Envoy Gateway's bootstrap gives the proxy: its cluster is the Gateway's
        // infra name, its id the pod's (internal/xds/bootstrap/bootstrap.go).
        "node": {"id": "envoy-gateway-system-inference-gateway-0", "cluster": "gateway-system/inference-gateway"},
        // Loopback: Envoy Gateway's admin is 127.0.0.1:19000.
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": lo.admin_port}}},
        "dynamic_resources": {
            "lds_config": {"path_config_source": {"path": lds_path}, "resource_api_version": "V3"},
            "cds_config": {"path_config_source": {"path": cds_path}, "resource_api_version": "V3"}
        }
    });
    Ok(Translated {
        bootstrap: serde_json::to_string_pretty(&bootstrap)?,
        dropped,
        listener: listener.to_owned(),
        eds,
        clusters,
        eds_clusters,
        env: Vec::new(),
        ecds: BTreeMap::new(),
    })
}
