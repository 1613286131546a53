//! The translator: `istio.yaml` (what `infergate render --target istio` writes) to the Envoy
//! configuration istiod and istio-agent (1.30; the 1.28 and 1.29 forms differ only in what
//! render writes) would give a Gateway's proxy, as files Envoy reads through its
//! filesystem xDS: a bootstrap with LDS and CDS from files, RDS, EDS and ECDS from files.
//!
//! Every rule names the Istio source it follows (read at tag 1.30.3 of istio/istio). What
//! is generated before the `EnvoyFilter` is applied is the part of a Gateway's config the
//! gateway's behaviour depends on; istio-proxy's own extensions (`istio.alpn`,
//! `istio.stats`, `istio.metadata_exchange`), TLS, tracing and the agent's own listeners
//! are left out (they are not in upstream Envoy 1.40).

use anyhow::{anyhow, bail, Context, Result};
use infergate_harness::launch::EdsDir;
use serde_json::{json, Map, Value as Json};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The Gateway listener's port (the Gateway's `listeners[].port`; the seed's Gateway listens
/// on 80). Its name follows `getListenerName` (pilot/pkg/networking/core/gateway.go):
/// `<bind>_<port>`, bind `0.0.0.0`; its routes are RDS `http.<port>` (`gatewayRDSRouteName`,
/// pilot/pkg/model/gateway.go).
pub const GATEWAY_PORT: u16 = 80;

const HCM: &str = "envoy.filters.network.http_connection_manager";
const HCM_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const WASM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";

/// Istio's admin port (`ISTIO_ADMIN_PORT` of render): a STATIC endpoint there is the proxy's
/// own admin, mapped to the test Envoy's.
const ISTIO_ADMIN: u16 = 15000;

/// Where the test's loopback world differs from a cluster's.
#[derive(Clone, Debug)]
pub struct Loopback {
    /// Where the xDS files are written.
    pub dir: PathBuf,
    /// The test Envoy's admin port (Istio's is 15000).
    pub admin_port: u16,
    /// The module istio-agent would have fetched for any `oci://` / `http(s)://` Wasm code.
    pub wasm_module: Option<PathBuf>,
    /// The native module the deployment overlay's image volume would have mounted.
    pub native_module: Option<PathBuf>,
    /// Each Service's endpoints (by Service name), which istiod would send by EDS.
    pub endpoints: BTreeMap<String, Vec<SocketAddr>>,
}

/// The result: the bootstrap, and what the translation did besides generating.
#[derive(Debug)]
pub struct Translated {
    /// The bootstrap (JSON text; Envoy reads YAML, a superset).
    pub bootstrap: String,
    /// Patches istiod would not apply: `BOOTSTRAP` ones, and those whose match found nothing.
    pub dropped: Vec<String>,
    /// The listener's name (`0.0.0.0_80`).
    pub listener: String,
    /// The EDS files: one per Service cluster.
    pub eds: EdsDir,
    /// The Service clusters, by Service name (the one the picker follows).
    pub clusters: BTreeMap<String, String>,
    /// Every EDS cluster holding a Service's endpoints, by Service name.
    pub eds_clusters: BTreeMap<String, Vec<String>>,
    /// Environment variables the proxy's pod gets (the deployment overlay's).
    pub env: Vec<(String, String)>,
    /// The ECDS resources, by name, as the proxy receives them (after istio-agent).
    pub ecds: BTreeMap<String, Json>,
}

impl Translated {
    /// Gives Service `service` the endpoints `addrs`, as the control plane's EDS would.
    pub fn write_members(&self, service: &str, addrs: &[SocketAddr]) -> Result<()> {
        for cluster in self.eds_clusters.get(service).into_iter().flatten() {
            self.eds.write_healthy(cluster, addrs)?;
        }
        Ok(())
    }
}

/// `outbound|PORT||<svc>.<ns>.svc.cluster.local` (`BuildSubsetKey`,
/// pilot/pkg/model/service.go).
pub fn cluster_name(service: &str, namespace: &str, port: u64) -> String {
    format!("outbound|{port}||{service}.{namespace}.svc.cluster.local")
}

/// Proto `MergeFrom` on JSON: messages merge field by field, repeated fields APPEND, scalars
/// replace (istio's `pkg/proto/merge/merge.go`, `mergeList` appends; used by every
/// `MERGE` patch in pilot/pkg/networking/core/envoyfilter/{cluster,listener}_patch.go).
fn proto_merge(dst: &mut Json, src: &Json) {
    match (dst, src) {
        (Json::Object(d), Json::Object(s)) => {
            for (k, v) in s {
                match d.get_mut(k) {
                    Some(existing) => proto_merge(existing, v),
                    None => {
                        d.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Json::Array(d), Json::Array(s)) => d.extend(s.iter().cloned()),
        (d, s) => *d = s.clone(),
    }
}

/// A patch's short description, for the dropped list.
fn describe(p: &Json) -> String {
    let name = p["patch"]["value"]["name"]
        .as_str()
        .or_else(|| p["match"]["cluster"]["name"].as_str())
        .unwrap_or("");
    format!(
        "{} {} {} (match {})",
        p["applyTo"].as_str().unwrap_or("?"),
        p["patch"]["operation"].as_str().unwrap_or("?"),
        name,
        p["match"]
    )
}

/// Whether a patch's `match.context` admits a gateway proxy (`commonConditionMatch`,
/// envoyfilter/util.go: ANY, unset or GATEWAY).
fn gateway_context(p: &Json) -> bool {
    matches!(
        p["match"]["context"].as_str(),
        None | Some("ANY") | Some("GATEWAY")
    )
}

/// The Istio HCM of the Gateway's listener, before any patch
/// (`buildHTTPConnectionManager`, pilot/pkg/networking/core/listener_builder.go):
/// `codec_type AUTO`, `stream_idle_timeout: 0s`, path normalisation on (mesh default),
/// `path_with_escaped_slashes_action KEEP_UNCHANGED`, `use_remote_address` (a gateway),
/// websocket upgrades, RDS over ADS with `initial_fetch_timeout: 0s` (here: the file), the
/// filters `grpc_stats`, `fault`, `cors`, then the router.
fn hcm(rds_path: &Path, listener: &str) -> Json {
    let typed = |t: &str| json!({"@type": format!("type.googleapis.com/{t}")});
    json!({
        "name": HCM,
        "typed_config": {
            "@type": HCM_TYPE,
            "stat_prefix": format!("outbound_{listener}"),
            "codec_type": "AUTO",
            "stream_idle_timeout": "0s",
            "normalize_path": true,
            "path_with_escaped_slashes_action": "KEEP_UNCHANGED",
            "use_remote_address": true,
            "upgrade_configs": [{"upgrade_type": "websocket"}],
            "access_log": [],
            "rds": {"route_config_name": format!("http.{GATEWAY_PORT}"),
                    "config_source": {"path_config_source": {"path": rds_path},
                                      "initial_fetch_timeout": "0s",
                                      "resource_api_version": "V3"}},
            "http_filters": [
                // xdsfilters.GrpcStats, .Fault, .Cors (pilot/pkg/xds/filters/filters.go).
                {"name": "envoy.filters.http.grpc_stats", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.grpc_stats.v3.FilterConfig",
                    "emit_filter_state": true, "stats_for_all_methods": false}},
                {"name": "envoy.filters.http.fault", "typed_config": typed("envoy.extensions.filters.http.fault.v3.HTTPFault")},
                {"name": "envoy.filters.http.cors", "typed_config": typed("envoy.extensions.filters.http.cors.v3.Cors")},
                {"name": "envoy.filters.http.router", "typed_config": typed("envoy.extensions.filters.http.router.v3.Router")}
            ]
        }
    })
}

/// An outbound cluster of a Service port as istiod builds it (cluster_builder.go,
/// cluster_traffic_policy.go): EDS over ADS (here: the file, watched), `connect_timeout`
/// the mesh's 10 s, `LEAST_REQUEST` (`defaultLBAlgorithm`), the default circuit breakers at
/// `MaxUint32` with `track_remaining` (`getDefaultCircuitBreakerThresholds`).
fn service_cluster(name: &str, eds: &EdsDir) -> Json {
    let max = u64::from(u32::MAX);
    json!({
        "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
        "name": name,
        "type": "EDS",
        "eds_cluster_config": {"service_name": name, "eds_config": {
            "path_config_source": {"path": eds.path(name), "watched_directory": {"path": eds.dir()}},
            "initial_fetch_timeout": "0s", "resource_api_version": "V3"}},
        "connect_timeout": "10s",
        "lb_policy": "LEAST_REQUEST",
        "circuit_breakers": {"thresholds": [{"max_connections": max, "max_pending_requests": max,
            "max_requests": max, "max_retries": max, "track_remaining": true}]},
        "common_lb_config": {}
    })
}

/// Istio's default retry policy (`DefaultPolicy`, pilot/pkg/networking/core/route/retry/retry.go).
fn default_retry() -> Json {
    json!({
        "retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
        "num_retries": 2,
        "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}}],
        "host_selection_retry_max_attempts": 5
    })
}

/// The routes of every `HTTPRoute` (route.go `TranslateRoute` / `TranslateRouteMatch`): a
/// `PathPrefix` other than `/` becomes `path_separated_prefix` (gateway semantics), headers
/// sorted by name, `timeout: 0s` and `max_stream_duration` 0 (`Notimeout`) unless the route
/// says otherwise, the default retry policy; several backends a weighted split.
fn routes(docs: &[Json], clusters: &BTreeMap<String, String>) -> Result<Vec<Json>> {
    let mut out = Vec::new();
    for r in docs.iter().filter(|d| d["kind"] == "HTTPRoute") {
        let rname = r["metadata"]["name"].as_str().unwrap_or("route");
        let rns = r["metadata"]["namespace"].as_str().unwrap_or("default");
        for (ri, rule) in r["spec"]["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let backends: Vec<(String, u64)> = rule["backendRefs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|b| {
                    let svc = b["name"].as_str().unwrap_or_default();
                    let cluster = clusters
                        .get(svc)
                        .cloned()
                        .ok_or_else(|| anyhow!("HTTPRoute {rname}: no Service {svc}"))?;
                    Ok((cluster, b["weight"].as_u64().unwrap_or(1)))
                })
                .collect::<Result<_>>()?;
            let timeout = rule["timeouts"]["request"].as_str().unwrap_or("0s");
            let mut action = json!({"timeout": timeout, "retry_policy": default_retry(),
                "max_stream_duration": {"max_stream_duration": timeout, "grpc_timeout_header_max": timeout}});
            match backends.as_slice() {
                [(one, _)] => action["cluster"] = json!(one),
                many => {
                    action["weighted_clusters"] = json!({"clusters": many.iter()
                        .map(|(c, w)| json!({"name": c, "weight": w})).collect::<Vec<_>>()})
                }
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
                let mut headers: Vec<(String, String)> = m["headers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|h| {
                        (
                            h["name"].as_str().unwrap_or_default().to_ascii_lowercase(),
                            h["value"].as_str().unwrap_or_default().to_owned(),
                        )
                    })
                    .collect();
                headers.sort();
                matcher.insert(
                    "headers".into(),
                    headers
                        .iter()
                        .map(|(n, v)| json!({"name": n, "string_match": {"exact": v}}))
                        .collect(),
                );
                out.push(json!({"name": format!("{rns}.{rname}.{ri}.{mi}"),
                                "match": matcher, "route": action.clone()}));
            }
        }
    }
    // Istio sorts a gateway's Gateway API routes most specific first; here: more headers
    // first, then the order given.
    out.sort_by_key(|r| std::cmp::Reverse(r["match"]["headers"].as_array().map_or(0, Vec::len)));
    Ok(out)
}

/// istio-agent's module fetch (`MaybeConvertWasmExtensionConfig`, pkg/wasm/convert.go):
/// a Wasm config whose code is `remote` is rewritten to `local.filename`, the fetched file.
fn agent_fetch(ext: &mut Json, module: Option<&Path>) -> Result<()> {
    if ext["typed_config"]["@type"] != WASM_TYPE {
        return Ok(());
    }
    let code = &mut ext["typed_config"]["config"]["vm_config"]["code"];
    if code.get("remote").is_some() {
        let file = module.ok_or_else(|| anyhow!("a Wasm module to fetch, none given"))?;
        *code = json!({"local": {"filename": file}});
    }
    Ok(())
}

/// Replaces every string equal to `from` by `to`.
fn replace_strings(v: &mut Json, from: &str, to: &str) {
    match v {
        Json::String(s) if s == from => *s = to.to_owned(),
        Json::Array(a) => a.iter_mut().for_each(|x| replace_strings(x, from, to)),
        Json::Object(m) => m.values_mut().for_each(|x| replace_strings(x, from, to)),
        _ => {}
    }
}

/// Points every STATIC endpoint on `127.0.0.1:<admin>` (the proxy's own admin, as the
/// control plane's cluster names it) at the test Envoy's admin port `to`.
pub fn loopback_admin(cds: &mut [Json], admin: u16, to: u16) {
    for c in cds.iter_mut() {
        let Some(eps) = c.pointer_mut("/load_assignment/endpoints") else {
            continue;
        };
        for ep in eps.as_array_mut().into_iter().flatten() {
            for lb in ep["lb_endpoints"].as_array_mut().into_iter().flatten() {
                let sa = &mut lb["endpoint"]["address"]["socket_address"];
                if sa["port_value"] == admin && sa["address"] == "127.0.0.1" {
                    sa["port_value"] = json!(to);
                }
            }
        }
    }
}

/// Writes `resources` as one xDS discovery file.
pub fn write_resources(path: &Path, resources: &[Json]) -> Result<()> {
    let text = serde_json::to_string_pretty(&json!({"version_info": "1", "resources": resources}))?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Translates the documents of `istio.yaml`.
pub fn translate(docs: &[Json], lo: &Loopback) -> Result<Translated> {
    std::fs::create_dir_all(&lo.dir)?;
    let eds = EdsDir::create(lo.dir.join("eds"))?;
    let listener_name = format!("0.0.0.0_{GATEWAY_PORT}");
    // Service clusters, and their EDS files (the Services' endpoints as istiod sends them).
    let mut clusters = BTreeMap::new();
    let mut cds = Vec::new();
    for svc in docs.iter().filter(|d| d["kind"] == "Service") {
        let name = svc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let ns = svc["metadata"]["namespace"].as_str().unwrap_or("default");
        let port = svc["spec"]["ports"][0]["port"].as_u64().unwrap_or(80);
        let cluster = cluster_name(&name, ns, port);
        let addrs = lo.endpoints.get(&name).cloned().unwrap_or_default();
        eds.write_healthy(&cluster, &addrs)?;
        cds.push(service_cluster(&cluster, &eds));
        clusters.insert(name, cluster);
    }
    let eds_clusters = clusters
        .iter()
        .map(|(s, c)| (s.clone(), vec![c.clone()]))
        .collect();
    // The gateway's own `BlackHoleCluster` (cluster.go `buildBlackHoleCluster`).
    cds.push(
        json!({"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
        "name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}),
    );
    let rds_path = lo.dir.join("rds.json");
    let mut listener = json!({
        "@type": "type.googleapis.com/envoy.config.listener.v3.Listener",
        "name": listener_name,
        // Loopback: Istio binds 0.0.0.0:80; the test binds a port the kernel chooses.
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
        "filter_chains": [{"filters": [hcm(&rds_path, &listener_name)]}]
    });
    let mut route_config = json!({
        "@type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
        "name": format!("http.{GATEWAY_PORT}"),
        // httproute.go: validate_clusters false, ignore_port_in_host_matching.
        "validate_clusters": false,
        "ignore_port_in_host_matching": true,
        // gateway.go: one virtual host per hostname, named `util.DomainName` (`*:80`).
        "virtual_hosts": [{"name": format!("*:{GATEWAY_PORT}"), "domains": ["*"],
                           "routes": routes(docs, &clusters)?}]
    });

    // The EnvoyFilters (pilot/pkg/networking/core/envoyfilter/*).
    let mut dropped = Vec::new();
    let mut ecds = BTreeMap::new();
    let mut env = Vec::new();
    for ef in docs.iter().filter(|d| d["kind"] == "EnvoyFilter") {
        for p in ef["spec"]["configPatches"].as_array().into_iter().flatten() {
            if !gateway_context(p) {
                dropped.push(format!("{} (context)", describe(p)));
                continue;
            }
            let op = p["patch"]["operation"].as_str().unwrap_or_default();
            let value = &p["patch"]["value"];
            match (p["applyTo"].as_str().unwrap_or_default(), op) {
                // Accepted by validation, never applied since 1.21 ("agent: remove BDS",
                // istio#48693): no code in pilot/ applies `EnvoyFilter_BOOTSTRAP`.
                ("BOOTSTRAP", _) => dropped.push(format!("{} (never applied)", describe(p))),
                // extension_configuration_patch.go `InsertedExtensionConfigurations`: ADD
                // only; istiod serves them by ECDS, istio-agent fetches the module.
                ("EXTENSION_CONFIG", "ADD") => {
                    let mut ext = value.clone();
                    agent_fetch(&mut ext, lo.wasm_module.as_deref())?;
                    let name = ext["name"].as_str().unwrap_or_default().to_owned();
                    ecds.insert(name, ext);
                }
                // cluster_patch.go: ADD appends; MERGE proto-merges into every cluster the
                // match names (none: nothing happens).
                ("CLUSTER", "ADD") => {
                    let mut c = value.clone();
                    c["@type"] = json!("type.googleapis.com/envoy.config.cluster.v3.Cluster");
                    cds.push(c);
                }
                ("CLUSTER", "MERGE") => {
                    let want = p["match"]["cluster"]["name"].as_str();
                    let mut hit = false;
                    for c in cds.iter_mut() {
                        if want.is_none_or(|w| c["name"] == w) {
                            proto_merge(c, value);
                            hit = true;
                        }
                    }
                    if !hit {
                        dropped.push(format!("{} (no such cluster)", describe(p)));
                    }
                }
                // listener_patch.go `patchNetworkFilter`: MERGE of the HCM merges the typed
                // configs (`MergeAnyWithAny`, proto merge).
                ("NETWORK_FILTER", "MERGE") => {
                    let want = p["match"]["listener"]["filterChain"]["filter"]["name"].as_str();
                    let f = &mut listener["filter_chains"][0]["filters"][0];
                    if want.is_some_and(|w| f["name"] != w) {
                        dropped.push(format!("{} (no such network filter)", describe(p)));
                    } else {
                        proto_merge(&mut f["typed_config"], &value["typed_config"]);
                    }
                }
                // listener_patch.go `patchHTTPFilters`: the sub-filter matched by exact name
                // (`httpFilterMatch`); INSERT_BEFORE/AFTER with no match insert nothing,
                // INSERT_BEFORE with no sub-filter given inserts first.
                ("HTTP_FILTER", op) => {
                    let sub = p["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"]
                        .as_str();
                    let filters = listener["filter_chains"][0]["filters"][0]["typed_config"]
                        ["http_filters"]
                        .as_array_mut()
                        .ok_or_else(|| anyhow!("the HCM has no http_filters"))?;
                    let at = sub.and_then(|s| filters.iter().position(|f| f["name"] == s));
                    match (op, sub, at) {
                        ("INSERT_BEFORE", None, _) | ("INSERT_FIRST", _, _) => {
                            filters.insert(0, value.clone())
                        }
                        ("INSERT_BEFORE", Some(_), Some(i)) => filters.insert(i, value.clone()),
                        ("INSERT_AFTER", Some(_), Some(i)) => filters.insert(i + 1, value.clone()),
                        ("ADD", _, _) => filters.push(value.clone()),
                        ("REMOVE", Some(_), Some(i)) => {
                            filters.remove(i);
                        }
                        ("REPLACE", Some(_), Some(i)) => filters[i] = value.clone(),
                        ("MERGE", Some(_), Some(i)) => proto_merge(&mut filters[i], value),
                        _ => dropped.push(format!("{} (no such HTTP filter)", describe(p))),
                    }
                }
                // rc_patch.go `patchHTTPRoutes`: with no route match, ADD (and INSERT_AFTER)
                // append to every virtual host the match admits, INSERT_BEFORE and
                // INSERT_FIRST prepend.
                (
                    "HTTP_ROUTE",
                    op @ ("ADD" | "INSERT_FIRST" | "INSERT_BEFORE" | "INSERT_AFTER"),
                ) if p["match"]["routeConfiguration"]["vhost"]["route"].is_null() => {
                    let vhost = p["match"]["routeConfiguration"]["vhost"]["name"].as_str();
                    let hosts = route_config["virtual_hosts"].as_array_mut();
                    for vh in hosts.into_iter().flatten() {
                        if vhost.is_some_and(|v| vh["name"] != v) {
                            continue;
                        }
                        let Some(routes) = vh["routes"].as_array_mut() else {
                            continue;
                        };
                        if matches!(op, "ADD" | "INSERT_AFTER") {
                            routes.push(value.clone());
                        } else {
                            routes.insert(0, value.clone());
                        }
                    }
                }
                _ => dropped.push(format!("{} (not translated)", describe(p))),
            }
        }
    }
    // The native module: the deployment overlay mounts the image at its MODULE_DIR and sets
    // ENVOY_DYNAMIC_MODULES_SEARCH_PATH there; here a directory holding the built module
    // under the name Envoy looks for.
    let mut stat_prefixes: Vec<String> = Vec::new();
    for cm in docs.iter().filter(|d| d["kind"] == "ConfigMap") {
        let Some(overlay) = cm["data"]["deployment"].as_str() else {
            continue;
        };
        let overlay: Json = serde_yaml_ng::from_str(overlay)?;
        // pkg/bootstrap/config.go `getStatsOptions`: the annotation's prefixes, then the
        // required ones, are the stats matcher's inclusion prefixes.
        let annotation = &overlay["spec"]["template"]["metadata"]["annotations"]
            ["sidecar.istio.io/statsInclusionPrefixes"];
        stat_prefixes.extend(
            annotation
                .as_str()
                .into_iter()
                .flat_map(|a| a.split(','))
                .map(str::to_owned),
        );
        let container = &overlay["spec"]["template"]["spec"]["containers"][0];
        let mount = container["volumeMounts"][0]["mountPath"]
            .as_str()
            .ok_or_else(|| anyhow!("the overlay mounts nothing"))?;
        let module = lo
            .native_module
            .as_deref()
            .ok_or_else(|| anyhow!("the overlay mounts a native module, none given"))?;
        let local = lo.dir.join("module");
        std::fs::create_dir_all(&local)?;
        let file = local.join("libinfergate_envoy.so");
        let _ = std::fs::remove_file(&file);
        std::os::unix::fs::symlink(module, &file)?;
        for e in container["env"].as_array().into_iter().flatten() {
            let value = e["value"]
                .as_str()
                .unwrap_or_default()
                .replace(mount, &local.to_string_lossy());
            env.push((e["name"].as_str().unwrap_or_default().to_owned(), value));
        }
        let from = format!("{mount}/libinfergate_envoy.so");
        let to = file.to_string_lossy().into_owned();
        for c in cds.iter_mut() {
            replace_strings(c, &from, &to);
        }
        replace_strings(&mut listener, &from, &to);
    }
    // Loopback: the proxy's own admin (a STATIC endpoint on 127.0.0.1:15000) is the test's.
    loopback_admin(&mut cds, ISTIO_ADMIN, lo.admin_port);
    // ECDS: each filter that discovers its config over ADS reads it from its file instead,
    // `initial_fetch_timeout` kept (istiod's is 0s: extensionfilter.go / the EnvoyFilter's).
    let filters = listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
        .as_array_mut()
        .ok_or_else(|| anyhow!("the HCM has no http_filters"))?;
    for f in filters.iter_mut() {
        if f.get("config_discovery").is_none() {
            continue;
        }
        let name = f["name"].as_str().unwrap_or_default().to_owned();
        let Some(ext) = ecds.get(&name) else {
            bail!("HTTP filter {name} discovers a configuration no EXTENSION_CONFIG holds");
        };
        let path = lo.dir.join(format!("ecds-{name}.json"));
        let mut resource = ext.clone();
        resource["@type"] = json!("type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig");
        write_resources(&path, &[resource])?;
        let source = &mut f["config_discovery"]["config_source"];
        if let Some(m) = source.as_object_mut() {
            m.remove("ads");
            m.insert("path_config_source".into(), json!({"path": path}));
        }
    }
    let lds = lo.dir.join("lds.json");
    let cds_path = lo.dir.join("cds.json");
    write_resources(&lds, &[listener])?;
    write_resources(&cds_path, &cds)?;
    route_config["@type"] = json!("type.googleapis.com/envoy.config.route.v3.RouteConfiguration");
    write_resources(&rds_path, &[route_config])?;
    let mut patterns: Vec<Json> = stat_prefixes.iter().map(|p| json!({"prefix": p})).collect();
    patterns.extend([
        json!({"prefix": "reporter="}),
        json!({"prefix": "cluster_manager"}),
        json!({"prefix": "listener_manager"}),
        json!({"prefix": "server"}),
        json!({"prefix": "cluster.xds-grpc"}),
        json!({"prefix": "wasm"}),
        json!({"suffix": "rbac.allowed"}),
        json!({"suffix": "rbac.denied"}),
        json!({"suffix": "shadow_allowed"}),
        json!({"suffix": "shadow_denied"}),
        json!({"suffix": "downstream_cx_active"}),
        json!({"safe_regex": {"regex": "vhost\\..*\\.route\\..*"}}),
        json!({"prefix": "component"}),
        json!({"prefix": "istio"}),
    ]);
    let bootstrap = json!({
        // istio-agent's node: `router~<ip>~<pod>.<ns>~<ns>.svc.cluster.local`.
        "node": {"id": "router~10.0.0.1~inference-gateway-istio-0.gateway-system~gateway-system.svc.cluster.local",
                 "cluster": "inference-gateway-istio.gateway-system"},
        // Loopback: Istio's admin is 127.0.0.1:15000.
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": lo.admin_port}}},
        // tools/packaging/common/envoy_bootstrap.json + pkg/bootstrap/config.go: only the
        // required prefixes (and `reporter=`, `component`, `istio`), suffixes and the
        // vhost route regex are kept as stats, after the pod annotation's prefixes.
        "stats_config": {"stats_matcher": {"inclusion_list": {"patterns": patterns}}},
        "dynamic_resources": {
            "lds_config": {"path_config_source": {"path": lds}, "resource_api_version": "V3"},
            "cds_config": {"path_config_source": {"path": cds_path}, "resource_api_version": "V3"}
        }
    });
    Ok(Translated {
        bootstrap: serde_json::to_string_pretty(&bootstrap)?,
        dropped,
        listener: listener_name,
        eds,
        clusters,
        eds_clusters,
        env,
        ecds,
    })
}
