//! The gateway as Istio manifests, for a Gateway that Istio runs (`istio.yaml`).
//!
//! Istio builds the Envoy configuration itself, so the gateway's pieces are patched into it:
//!
//! - **Wasm flavour**: one `WasmPlugin` (`extensions.istio.io/v1alpha1`) per filter role:
//!   `infergate-router` (phase `AUTHZ`) and `infergate-picker` (phase `STATS`), both from the
//!   OCI image (`url: oci://…`), `pluginName` the module's root id, `pluginConfig` the
//!   role's JSON configuration, `failStrategy: FAIL_RELOAD`. What a `WasmPlugin` cannot
//!   express goes into one `EnvoyFilter`: the scraper, which is a singleton service
//!   (`envoy.bootstrap.wasm`, a `BOOTSTRAP` patch: WasmPlugin only makes HTTP and network
//!   filters), the route-resolving filter before the picker and the `header_to_metadata`
//!   filter after it (`HTTP_FILTER` patches around the picker's filter), the scrape cluster
//!   (`CLUSTER` add) and the pool clusters' `override_host` policy (`CLUSTER` merge).
//! - **Native flavour**: one `EnvoyFilter` with the dynamic module's two HTTP filters in
//!   front of Envoy's router, its scraper as a `BOOTSTRAP` patch, and the same clusters.
//!
//! Pool membership: Istio sends endpoints only for Services, so each `InferencePool`
//! becomes a `Service` with the pool's selector and target port (Istio's cluster
//! `outbound|PORT||NAME.NAMESPACE.svc.cluster.local`, fed by EDS from istiod), and each
//! `HTTPRoute` is rendered again under its own name with those Services as backends, so
//! applying it replaces the route to the `InferencePool` (which Istio would send through
//! its own endpoint-picker integration).

use super::gateway::{Gateway, GatewayInputs};
use super::report::Report;
use crate::launch::bootstrap::Flavor;
use crate::launch::template::{Template, Vars};
use anyhow::{Context, Result};
use serde_json::{json, Value as Json};

/// The Service that carries a pool's membership in Istio: `<pool>-infergate`.
pub fn service_name(pool: &str) -> String {
    format!("{pool}-infergate")
}

/// Istio's outbound cluster for `service` in `namespace` on `port`.
pub fn istio_cluster(service: &str, namespace: &str, port: u16) -> String {
    format!("outbound|{port}||{service}.{namespace}.svc.cluster.local")
}

/// Where the proxy finds the module when Istio cannot fetch it (the scraper's Wasm service,
/// the dynamic module): a file mounted into the gateway's pods.
pub const MODULE_DIR: &str = "/var/lib/infergate";

/// The admin port of Istio's proxy, which the Wasm scraper asks for the pool clusters'
/// members (proxy-wasm cannot see a cluster's hosts).
pub const ISTIO_ADMIN_PORT: u16 = 15000;

/// The module's path in the gateway's pods: `--module` when given, else the file in
/// [`MODULE_DIR`].
fn module_path(inputs: &GatewayInputs) -> String {
    match &inputs.module {
        Some(m) => m.to_string_lossy().into_owned(),
        None => format!(
            "{MODULE_DIR}/{}",
            if inputs.flavor == Flavor::Wasm {
                "infergate_wasm.wasm"
            } else {
                "libinfergate_envoy.so"
            }
        ),
    }
}

/// The pool clusters' load-balancing policy, from the flavour's own template (its
/// `pool_lb_policy` prototype), with the module at `module`.
fn pool_lb_policy(flavor: Flavor, module: &str) -> Result<Json> {
    let path = flavor.template_path();
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let t = Template::parse(&text)?;
    let mut vars = Vars::new();
    vars.insert(
        "native_module".into(),
        serde_yaml_ng::Value::String(module.to_owned()),
    );
    let policy = t.prototype("pool_lb_policy", &vars)?;
    serde_json::to_value(policy).context("the pool clusters' policy as JSON")
}

/// `istio.yaml`: every manifest, as YAML documents.
pub fn manifests(
    gw: &Gateway,
    inputs: &GatewayInputs,
    image: &str,
    report: &mut Report,
) -> Result<String> {
    let (gw_ns, gw_name) = match gw.parents.first() {
        Some((ns, name)) => (ns.clone().unwrap_or_else(|| "default".into()), name.clone()),
        None => ("default".to_owned(), "inference-gateway".to_owned()),
    };
    let target_refs =
        json!([{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gw_name}]);
    let mut docs: Vec<Json> = Vec::new();
    let mut picker = gw.picker.clone();
    let mut cluster_patches = Vec::new();
    let module_path = module_path(inputs);
    let lb_policy = pool_lb_policy(inputs.flavor, &module_path)?;
    let mut followed = Vec::new();
    for (i, pool) in gw.pools.iter().enumerate() {
        let ns = pool
            .meta
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let svc = service_name(&pool.meta.name);
        let port = pool.target_ports.first().copied().unwrap_or(8000);
        if pool.target_ports.len() > 1 {
            report.not_supported(
                &pool.label,
                "spec.targetPorts",
                "Istio form: only the first port is a cluster (data-parallel ranks need the bootstrap)",
            );
        }
        let selector = pool
            .selector
            .get("matchLabels")
            .cloned()
            .unwrap_or(Json::Null);
        if pool.selector.get("matchExpressions").is_some() {
            report.not_supported(
                &pool.label,
                "spec.selector.matchExpressions",
                "Istio form: a Service selects by labels only",
            );
        }
        docs.push(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": svc, "namespace": ns,
                         "labels": {"app.kubernetes.io/managed-by": "infergate-render"}},
            "spec": {"selector": selector,
                     "ports": [{"name": format!("http-{port}"), "port": port, "targetPort": port,
                                "appProtocol": "http"}]}
        }));
        let cluster = istio_cluster(&svc, &ns, port);
        if let Some(p) = picker["pools"].get_mut(i).and_then(Json::as_object_mut) {
            p.insert("cluster".into(), Json::String(cluster.clone()));
            p.remove("endpoints");
        }
        followed.push(cluster.clone());
        cluster_patches.push(json!({
            "applyTo": "CLUSTER",
            "match": {"context": "GATEWAY", "cluster": {"name": cluster}},
            "patch": {"operation": "MERGE", "value": {
                "load_balancing_policy": lb_policy,
                "circuit_breakers": {"thresholds": [{"max_connections": 16384, "max_pending_requests": 16384,
                                                     "max_requests": 16384, "max_retries": 16384}]}}}
        }));
    }
    for route in gw_routes(gw) {
        docs.push(route);
    }
    cluster_patches.push(json!({
        "applyTo": "CLUSTER",
        "match": {"context": "GATEWAY"},
        "patch": {"operation": "ADD", "value": {
            "name": "infergate_scrape", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
            "connect_timeout": "1s",
            "original_dst_lb_config": {"use_http_header": true,
                                       "http_header_name": "x-gateway-destination-endpoint"}}}
    }));
    let config_text = |v: &Json| v.to_string();
    let wasm = inputs.flavor == Flavor::Wasm;
    let mut scraper = gw.params.plugins.scraper.clone();
    scraper["endpoints"] = json!([]);
    scraper["clusters"] = json!(followed);
    scraper["membership"] = json!(if wasm { "admin" } else { "host" });
    if wasm {
        cluster_patches.push(json!({
            "applyTo": "CLUSTER",
            "match": {"context": "GATEWAY"},
            "patch": {"operation": "ADD", "value": {
                "name": "infergate_admin", "type": "STATIC", "connect_timeout": "1s",
                "load_assignment": {"cluster_name": "infergate_admin", "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1",
                                                                  "port_value": ISTIO_ADMIN_PORT}}}}]}]}}}
        }));
    }
    super::gateway::check_with_the_modules_parsers(&gw.router, &picker, &scraper)
        .context("the Istio form's configurations")?;
    let mut patches = Vec::new();
    match inputs.flavor {
        Flavor::Wasm => {
            let plugin = |name: &str, root: &str, phase: &str, config: &Json| {
                json!({
                    "apiVersion": "extensions.istio.io/v1alpha1", "kind": "WasmPlugin",
                    "metadata": {"name": name, "namespace": gw_ns},
                    "spec": {"targetRefs": target_refs, "url": image, "imagePullPolicy": "IfNotPresent",
                             "pluginName": root, "phase": phase, "type": "HTTP",
                             "failStrategy": "FAIL_RELOAD", "pluginConfig": config}
                })
            };
            docs.push(plugin("infergate-router", "router", "AUTHZ", &gw.router));
            docs.push(plugin("infergate-picker", "picker", "STATS", &picker));
            let picker_filter = format!("{gw_ns}.infergate-picker");
            patches.push(json!({
                "applyTo": "BOOTSTRAP",
                "patch": {"operation": "MERGE", "value": {"bootstrap_extensions": [{
                    "name": "envoy.bootstrap.wasm",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.wasm.v3.WasmService",
                        "singleton": true,
                        "config": {"name": "infergate.scraper", "root_id": "scraper",
                            "failure_policy": "FAIL_RELOAD",
                            "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                                              "value": config_text(&scraper)},
                            "vm_config": {"runtime": "envoy.wasm.runtime.v8",
                                "code": {"local": {"filename": module_path}}}}}}]}}
            }));
            patches.push(json!({
                "applyTo": "HTTP_FILTER",
                "match": {"context": "GATEWAY", "listener": {"filterChain": {"filter": {
                    "name": "envoy.filters.network.http_connection_manager",
                    "subFilter": {"name": picker_filter}}}}},
                "patch": {"operation": "INSERT_BEFORE", "value": {
                    "name": "infergate.route_refresh",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
                                     "mutations": {}}}}
            }));
            patches.push(json!({
                "applyTo": "HTTP_FILTER",
                "match": {"context": "GATEWAY", "listener": {"filterChain": {"filter": {
                    "name": "envoy.filters.network.http_connection_manager",
                    "subFilter": {"name": picker_filter}}}}},
                "patch": {"operation": "INSERT_AFTER", "value": {
                    "name": "infergate.destination_metadata",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config",
                        "request_rules": [{"header": "x-gateway-destination-endpoint",
                            "on_header_present": {"metadata_namespace": "envoy.lb",
                                "key": "x-gateway-destination-endpoint", "type": "STRING"},
                            "remove": false}]}}}
            }));
        }
        _ => {
            let module = json!({"name": "infergate_envoy", "do_not_close": true,
                                "module": {"local": {"filename": module_path}}});
            patches.push(json!({
                "applyTo": "BOOTSTRAP",
                "patch": {"operation": "MERGE", "value": {"bootstrap_extensions": [{
                    "name": "envoy.bootstrap.dynamic_modules",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.bootstrap.dynamic_modules.v3.DynamicModuleBootstrapExtension",
                        "dynamic_module_config": module, "extension_name": "scraper",
                        "extension_config": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                                             "value": config_text(&scraper)}}}]}}
            }));
            for (name, filter, config) in [
                ("infergate.router", "router", &gw.router),
                ("infergate.picker", "picker", &picker),
            ] {
                patches.push(json!({
                    "applyTo": "HTTP_FILTER",
                    "match": {"context": "GATEWAY", "listener": {"filterChain": {"filter": {
                        "name": "envoy.filters.network.http_connection_manager",
                        "subFilter": {"name": "envoy.filters.http.router"}}}}},
                    "patch": {"operation": "INSERT_BEFORE", "value": {
                        "name": name,
                        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
                            "dynamic_module_config": module, "filter_name": filter,
                            "filter_config": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                                              "value": config_text(config)}}}}
                }));
            }
        }
    }
    // Tenancy: Envoy's jwt_authn right before the router filter, the billing log on the
    // connection manager (the flavour's own prototypes).
    let template = Template::parse(
        &std::fs::read_to_string(inputs.flavor.template_path()).context("reading the template")?,
    )?;
    let splices = gw.params.tenancy.splices(&template)?;
    let router_filter = match inputs.flavor {
        Flavor::Wasm => format!("{gw_ns}.infergate-router"),
        _ => "infergate.router".to_owned(),
    };
    for jwt in splices.jwt_filters {
        patches.push(json!({
            "applyTo": "HTTP_FILTER",
            "match": {"context": "GATEWAY", "listener": {"filterChain": {"filter": {
                "name": "envoy.filters.network.http_connection_manager",
                "subFilter": {"name": router_filter}}}}},
            "patch": {"operation": "INSERT_BEFORE", "value": serde_json::to_value(jwt)?}
        }));
    }
    for log in splices.billing_logs {
        patches.push(json!({
            "applyTo": "NETWORK_FILTER",
            "match": {"context": "GATEWAY", "listener": {"filterChain": {"filter": {
                "name": "envoy.filters.network.http_connection_manager"}}}},
            "patch": {"operation": "MERGE", "value": {
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "access_log": [serde_json::to_value(log)?]}}}
        }));
    }
    for route in &gw.routes {
        for rule in route.rules.iter().filter(|r| r.backends.len() > 1) {
            report.not_supported(
                &route.label,
                &format!("{}.backendRefs", rule.path),
                "Istio form: Istio draws a weighted split per request; the sticky split on \
                 x-gateway-split-key exists only in the bootstrap",
            );
        }
    }
    patches.extend(cluster_patches);
    docs.push(json!({
        "apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter",
        "metadata": {"name": "infergate", "namespace": gw_ns},
        "spec": {"targetRefs": target_refs, "configPatches": patches}
    }));
    let mut out = String::new();
    for d in &docs {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(d).context("serialising a manifest")?);
    }
    Ok(out)
}

/// Each `HTTPRoute` again, its `InferencePool` backends replaced by the pools' Services.
fn gw_routes(gw: &Gateway) -> Vec<Json> {
    let backend = |name: &str| {
        let port = gw
            .pools
            .iter()
            .find(|p| p.meta.name == name)
            .and_then(|p| p.target_ports.first().copied())
            .unwrap_or(8000);
        (service_name(name), port)
    };
    gw.routes
        .iter()
        .map(|route| {
            let parents: Vec<Json> = route
                .parents
                .iter()
                .map(|p| {
                    let mut r = json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": p.name});
                    if let Some(ns) = &p.namespace {
                        r["namespace"] = Json::String(ns.clone());
                    }
                    r
                })
                .collect();
            let rules: Vec<Json> = route
                .rules
                .iter()
                .map(|rule| {
                    let matches: Vec<Json> = rule
                        .matches
                        .iter()
                        .map(|m| {
                            let mut headers = vec![json!({"type": "Exact", "name": "X-Gateway-Base-Model-Name", "value": m.model})];
                            if let Some((h, v)) = &m.header {
                                headers.push(json!({"type": "Exact", "name": h, "value": v}));
                            }
                            let mut out = json!({"headers": headers});
                            if let Some(prefix) = &m.path_prefix {
                                out["path"] = json!({"type": "PathPrefix", "value": prefix});
                            }
                            out
                        })
                        .collect();
                    let backends: Vec<Json> = rule
                        .backends
                        .iter()
                        .map(|b| {
                            let (svc, port) = backend(&b.pool);
                            json!({"kind": "Service", "name": svc, "port": port, "weight": b.weight})
                        })
                        .collect();
                    json!({"matches": matches, "backendRefs": backends, "timeouts": {"request": "0s"}})
                })
                .collect();
            let mut metadata = json!({"name": route.meta.name});
            if let Some(ns) = &route.meta.namespace {
                metadata["namespace"] = Json::String(ns.clone());
            }
            json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                   "metadata": metadata, "spec": {"parentRefs": parents, "rules": rules}})
        })
        .collect()
}
