//! The gateway as Istio manifests, for a Gateway that Istio (1.28, 1.29, 1.30) runs
//! (`istio.yaml`). Everything here is something istiod installs:
//!
//! - **No bootstrap.** Istio ≥ 1.21 accepts an `EnvoyFilter` `applyTo: BOOTSTRAP` and never
//!   applies it, so nothing is a bootstrap extension: the scraper's configuration travels
//!   inside the picker's (`"scraper": {…}`); the Wasm module elects an owner among its
//!   worker VMs, the native module starts the scraper from its filter configuration.
//! - **Filters before `envoy.filters.http.router` only.** An `HTTP_FILTER` patch matches a
//!   filter by its exact name and inserts nothing, silently, when that name is absent;
//!   Envoy's router is the one filter every listener has. Each of our filters is an
//!   `INSERT_BEFORE` on it, in chain order (each lands just before the router, so after the
//!   previous one): `jwt_authn` (tenants with `--jwks`), then (native) the body router and
//!   the picker, or (Wasm) [`WASM_CHAIN`]: the body router, Envoy's `buffer` filter `infergate.buffer` (holds
//!   the headers until the body is complete; `max_request_bytes` twice the router's
//!   `bodyLimitBytes`, so the router answers a body past its limit itself),
//!   the `headers` role (applies the header edits the router left in filter state, which
//!   clears the route cache), the route-refresh `header_mutation`, the picker, and the
//!   `header_to_metadata` copying the picker's choice into `envoy.lb`.
//! - **Wasm through ECDS, as a `WasmPlugin` would be.** Each Wasm filter is an `HTTP_FILTER`
//!   patch whose filter has `config_discovery` (ADS, `initial_fetch_timeout: 0s`, as istiod
//!   writes it), plus an `EXTENSION_CONFIG` `ADD` holding its `Wasm` configuration with
//!   `code.remote.http_uri.uri` the OCI image: istiod serves it over ECDS and istio-agent
//!   fetches the `oci://` module to a local file, as it does for a `WasmPlugin`. Each
//!   plugin's configuration is what a `WasmPlugin` would produce: `vm_id: ""` (the proxy's
//!   one shared-data namespace: every key starts with the `instance`,
//!   `<gateway-namespace>.<gateway-name>`), no `allow_on_headers_stop_iteration` (Envoy's
//!   default, `false`, applies), `failure_policy: FAIL_RELOAD`, and an environment variable
//!   of its own (`INFERGATE_PLUGIN: <role>`), so each plugin runs in a VM of its own as two
//!   `WasmPlugin`s do. Unlike a `WasmPlugin` (named per version,
//!   `extensions.istio.io/wasmplugin/<ns>.<name>` up to 1.29 and
//!   `extensions.istio.io/trafficextension/<ns>.<name>~istio-translated-wasmplugin` in 1.30,
//!   and ordered by phase), this places the native helper filters between ours.
//! - **Native module from a volume.** The `.so` is too large for a ConfigMap: a `ConfigMap`
//!   `deployment` overlay (the Gateway's `spec.infrastructure.parametersRef`) mounts an
//!   image volume holding it at [`MODULE_DIR`] and sets `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`
//!   there. The filters name the module `infergate_envoy` (found as
//!   `libinfergate_envoy.so` on that path); on 1.30 they also give its file
//!   (`DynamicModuleConfig.module`, which istiod ≤ 1.29 drops). The pool clusters' fallback
//!   LB policy is the module's `infergate-membership` only on 1.30 (istiod ≤ 1.29 does not
//!   know the dynamic-modules LB type and refuses the `EnvoyFilter`); before, round robin,
//!   and the scraper reads the members from the admin `/clusters` like the Wasm flavour's.
//! - **Files are read-only.** The billing log goes to stdout (`envoy.access_loggers.stdout`).
//!
//! Pool membership: Istio sends endpoints only for Services, so each `InferencePool`
//! becomes a `Service` with the pool's selector and target port (Istio's cluster
//! `outbound|PORT||NAME.NAMESPACE.svc.cluster.local`, fed by EDS from istiod), and each
//! `HTTPRoute` is rendered again under its own name with those Services as backends, so
//! applying it replaces the route to the `InferencePool` (which Istio would send through
//! its own endpoint-picker integration).

use super::gateway::{Gateway, GatewayInputs};
use super::kube::{self, Target};
use super::report::Report;
use crate::config::bootstrap::Flavor;
use crate::config::template::Template;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value as Json};
use std::fmt;
use std::str::FromStr;

pub use super::names::service_name;

/// The Istio release the manifests are for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum IstioVersion {
    /// 1.28.
    V1_28,
    /// 1.29.
    V1_29,
    /// 1.30 (the default).
    #[default]
    V1_30,
}

impl IstioVersion {
    /// Whether istiod links the dynamic-modules load-balancer type and keeps
    /// `DynamicModuleConfig.module` (1.30 on).
    pub fn has_dynamic_module_lb(self) -> bool {
        self >= IstioVersion::V1_30
    }

    /// The name istiod gives the HTTP filter of the `WasmPlugin` `<namespace>/<name>`.
    pub fn wasm_plugin_filter(self, namespace: &str, name: &str) -> String {
        match self {
            IstioVersion::V1_28 | IstioVersion::V1_29 => {
                format!("extensions.istio.io/wasmplugin/{namespace}.{name}")
            }
            IstioVersion::V1_30 => format!(
                "extensions.istio.io/trafficextension/{namespace}.{name}~istio-translated-wasmplugin"
            ),
        }
    }
}

impl fmt::Display for IstioVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IstioVersion::V1_28 => "1.28",
            IstioVersion::V1_29 => "1.29",
            IstioVersion::V1_30 => "1.30",
        })
    }
}

impl FromStr for IstioVersion {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "1.28" => Ok(IstioVersion::V1_28),
            "1.29" => Ok(IstioVersion::V1_29),
            "1.30" => Ok(IstioVersion::V1_30),
            other => bail!("Istio {other}: expected 1.28, 1.29 or 1.30"),
        }
    }
}

/// Istio's outbound cluster for `service` in `namespace` on `port`.
pub fn istio_cluster(service: &str, namespace: &str, port: u16) -> String {
    format!("outbound|{port}||{service}.{namespace}.svc.cluster.local")
}

/// Where the gateway's pods find the native module: the image volume the deployment
/// overlay mounts.
pub const MODULE_DIR: &str = "/var/lib/infergate";

/// The native module's file in [`MODULE_DIR`] (Envoy's search-path name for
/// `infergate_envoy`).
pub const NATIVE_MODULE_FILE: &str = infergate_artefacts::NATIVE_FILE;

/// The admin port of Istio's proxy, which the scraper asks for the pool clusters' members
/// when the host cannot tell them (Wasm; native before 1.30).
pub const ISTIO_ADMIN_PORT: u16 = 15000;

/// The pod annotation naming extra stat prefixes istio-agent keeps.
pub const STATS_ANNOTATION: &str = "sidecar.istio.io/statsInclusionPrefixes";

/// The prefix of the native module's stats in Envoy's store.
pub const NATIVE_STATS_PREFIX: &str = "dynamicmodulescustom.infergate";

/// The `ConfigMap` holding the deployment overlay (native flavour).
pub const OVERLAY_CONFIGMAP: &str = "infergate-gateway-options";

/// The Wasm flavour's filters, in chain order, each inserted before Envoy's router.
pub const WASM_CHAIN: [&str; 6] = [
    "infergate.router",
    "infergate.buffer",
    "infergate.headers",
    "infergate.route_refresh",
    "infergate.picker",
    "infergate.destination_metadata",
];

/// The router's body limit when its configuration does not say (`bodyLimitBytes`).
const DEFAULT_BODY_LIMIT_BYTES: u64 = 4 << 20;

const HCM: &str = "envoy.filters.network.http_connection_manager";
const ENVOY_ROUTER: &str = "envoy.filters.http.router";
const WASM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
const STRING_VALUE: &str = "type.googleapis.com/google.protobuf.StringValue";

/// An `HTTP_FILTER` patch inserting `filter` just before Envoy's router.
fn before_router(filter: Json) -> Json {
    json!({
        "applyTo": "HTTP_FILTER",
        "match": {"context": "GATEWAY", "listener": {"filterChain": {"filter": {
            "name": HCM, "subFilter": {"name": ENVOY_ROUTER}}}}},
        "patch": {"operation": "INSERT_BEFORE", "value": filter}
    })
}

/// The two patches of one Wasm filter delivered by ECDS: the filter (its configuration
/// discovered) before the router, and the `EXTENSION_CONFIG` holding its configuration,
/// the module the OCI image istio-agent fetches. `vm_id` `""` and no
/// `allow_on_headers_stop_iteration`, as a `WasmPlugin`'s; a VM of its own per plugin
/// (the environment variable `INFERGATE_PLUGIN`, part of Envoy 1.40's VM key).
fn wasm_filter(name: &str, root_id: &str, config: &Json, image: &str) -> [Json; 2] {
    let filter = before_router(json!({
        "name": name,
        "config_discovery": {
            "config_source": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"},
            "type_urls": [WASM_TYPE]}
    }));
    let extension = json!({
        "applyTo": "EXTENSION_CONFIG",
        "patch": {"operation": "ADD", "value": {
            "name": name,
            "typed_config": {"@type": WASM_TYPE, "config": {
                "name": name, "root_id": root_id, "failure_policy": "FAIL_RELOAD",
                "configuration": {"@type": STRING_VALUE, "value": config.to_string()},
                "vm_config": {"vm_id": "", "runtime": "envoy.wasm.runtime.v8",
                    "environment_variables": {"key_values": {
                        "ISTIO_META_WASM_IMAGE_PULL_POLICY": "IfNotPresent",
                        "INFERGATE_PLUGIN": root_id}},
                    // istio-agent fetches the module and rewrites this to a local file
                    // (istiod's own WasmPlugin conversion names the cluster "_" too).
                    "code": {"remote": {"http_uri": {"uri": image, "cluster": "_", "timeout": "30s"}}}}}}}}
    });
    [filter, extension]
}

/// The buffer filter that holds the request headers until the body is complete (Wasm
/// flavour: the router lets them go at once and reads the body), named and sized as the
/// bare template's `infergate.buffer`: twice the router's body limit, so a body past the
/// limit reaches the router whole and gets its 413 (OpenAI JSON), not the buffer's.
pub(super) fn buffer_filter(router: &Json) -> Json {
    let limit = router["bodyLimitBytes"]
        .as_u64()
        .unwrap_or(DEFAULT_BODY_LIMIT_BYTES);
    json!({
        "name": "infergate.buffer",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
                         "max_request_bytes": limit.saturating_mul(2)}})
}

/// The route refresh between the `headers` filter and the picker: a `header_mutation`
/// with no mutations resolves the route again (it looks up its per-route config in
/// `decodeHeaders`), so the picker's `xds.cluster_name` is the route the model header chose.
pub(super) fn route_refresh_filter() -> Json {
    json!({
        "name": "infergate.route_refresh",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
                         "mutations": {}}})
}

/// `--image` as an OCI address (`oci://` added when no scheme is given).
pub fn oci_url(image: &str) -> String {
    if image.contains("://") {
        image.to_owned()
    } else {
        format!("oci://{image}")
    }
}

/// `istio.yaml`: every manifest, as YAML documents.
pub fn manifests(
    gw: &Gateway,
    inputs: &GatewayInputs,
    image: &str,
    version: IstioVersion,
    report: &mut Report,
) -> Result<String> {
    let target = Target::of(gw);
    let form = format!("Istio {version}");
    let wasm = inputs.flavor == Flavor::Wasm;
    let (mut docs, services) = kube::pool_services(gw, report, &form);
    let clusters: Vec<String> = services
        .iter()
        .map(|s| istio_cluster(&s.name, &s.namespace, s.port))
        .collect();
    docs.extend(kube::routes(gw, &services, false));
    let module_file = format!("{MODULE_DIR}/{NATIVE_MODULE_FILE}");
    let host_membership = !wasm && version.has_dynamic_module_lb();
    let (router, picker) = kube::module_configs(
        gw,
        &target,
        &clusters,
        if host_membership { "host" } else { "admin" },
        inputs.flavor,
    );
    kube::check_configs(&router, &picker).context("the Istio form's configurations")?;

    let mut patches = Vec::new();
    // Tenancy: Envoy's jwt_authn first, the billing log on the connection manager (the
    // flavour's own prototypes).
    let template = Template::parse(inputs.flavor.template())
        .with_context(|| format!("parsing {}", inputs.flavor.template_file()))?;
    let splices = gw.params.tenancy.splices(&template)?;
    for jwt in splices.jwt_filters {
        patches.push(before_router(serde_json::to_value(jwt)?));
    }
    if wasm {
        let image = oci_url(image);
        let headers = json!({"role": "headers", "instance": target.instance()});
        patches.extend(wasm_filter("infergate.router", "router", &router, &image));
        patches.push(before_router(buffer_filter(&router)));
        patches.extend(wasm_filter(
            "infergate.headers",
            "headers",
            &headers,
            &image,
        ));
        patches.push(before_router(route_refresh_filter()));
        patches.extend(wasm_filter("infergate.picker", "picker", &picker, &image));
        patches.push(before_router(json!({
            "name": "infergate.destination_metadata",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config",
                "request_rules": [{"header": "x-gateway-destination-endpoint",
                    "on_header_present": {"metadata_namespace": "envoy.lb",
                        "key": "x-gateway-destination-endpoint", "type": "STRING"},
                    "remove": false}]}})));
    } else {
        let mut module = json!({"name": "infergate_envoy", "do_not_close": true});
        if version.has_dynamic_module_lb() {
            module["module"] = json!({"local": {"filename": module_file}});
        }
        for (name, filter, config) in [
            ("infergate.router", "router", &router),
            ("infergate.picker", "picker", &picker),
        ] {
            patches.push(before_router(json!({
                "name": name,
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
                    "dynamic_module_config": module, "filter_name": filter,
                    "filter_config": {"@type": STRING_VALUE, "value": config.to_string()}}})));
        }
    }
    for log in splices.billing_logs {
        let log = to_stdout(serde_json::to_value(log)?);
        for t in gw
            .params
            .tenancy
            .objects
            .iter()
            .filter(|o| o["kind"] == "TenantQuota")
        {
            let name = t["metadata"]["name"].as_str().unwrap_or_default();
            report.used(
                &format!("TenantQuota {name}"),
                "spec.accounting",
                format!(
                    "{form}: the billing log goes to the proxy's stdout \
                         (envoy.access_loggers.stdout), one JSON record per line, not to \
                         --billing-log: the gateway's root file system is read-only"
                ),
            );
        }
        patches.push(json!({
            "applyTo": "NETWORK_FILTER",
            "match": {"context": "GATEWAY", "listener": {"filterChain": {"filter": {"name": HCM}}}},
            "patch": {"operation": "MERGE", "value": {
                "name": HCM,
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "access_log": [log]}}}
        }));
    }
    for route in &gw.routes {
        for rule in route.rules.iter().filter(|r| r.backends.len() > 1) {
            report.not_supported(
                &route.label,
                &format!("{}.backendRefs", rule.path),
                format!(
                    "{form}: Istio draws a weighted split per request; the sticky split on \
                     x-gateway-split-key exists only in the bootstrap"
                ),
            );
        }
    }
    // Clusters: each pool's on Envoy's override_host policy, the scrape cluster, and (when
    // the scraper reads the members from the admin) the admin.
    let lb_policy = kube::pool_lb_policy(
        if host_membership {
            Flavor::Native
        } else {
            Flavor::Wasm
        },
        &module_file,
    )?;
    for cluster in &clusters {
        patches.push(json!({
            "applyTo": "CLUSTER",
            "match": {"context": "GATEWAY", "cluster": {"name": cluster}},
            "patch": {"operation": "MERGE", "value": {
                "load_balancing_policy": lb_policy,
                "circuit_breakers": {"thresholds": [{"max_connections": 16384, "max_pending_requests": 16384,
                                                     "max_requests": 16384, "max_retries": 16384}]}}}
        }));
    }
    patches.push(json!({
        "applyTo": "CLUSTER",
        "match": {"context": "GATEWAY"},
        "patch": {"operation": "ADD", "value": {
            "name": "infergate_scrape", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
            "connect_timeout": "1s",
            "original_dst_lb_config": {"use_http_header": true,
                                       "http_header_name": "x-gateway-destination-endpoint"}}}
    }));
    // Peer clusters: each pool's peers cluster, and its route first in every virtual host
    // of the Gateway (rc_patch.go: `INSERT_FIRST` with no route match prepends).
    for (cluster, route) in kube::peer_resources(gw, inputs.flavor)? {
        patches.push(json!({
            "applyTo": "CLUSTER",
            "match": {"context": "GATEWAY"},
            "patch": {"operation": "ADD", "value": cluster}
        }));
        patches.push(json!({
            "applyTo": "HTTP_ROUTE",
            "match": {"context": "GATEWAY"},
            "patch": {"operation": "INSERT_FIRST", "value": route}
        }));
    }
    if !host_membership {
        patches.push(json!({
            "applyTo": "CLUSTER",
            "match": {"context": "GATEWAY"},
            "patch": {"operation": "ADD", "value": {
                "name": "infergate_admin", "type": "STATIC", "connect_timeout": "1s",
                "load_assignment": {"cluster_name": "infergate_admin", "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1",
                                                                  "port_value": ISTIO_ADMIN_PORT}}}}]}]}}}
        }));
    }
    if !wasm {
        docs.push(deployment_overlay(&target, image));
    }
    docs.push(json!({
        "apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter",
        "metadata": {"name": "infergate", "namespace": target.namespace},
        "spec": {"targetRefs": target.target_refs(), "configPatches": patches}
    }));
    kube::to_yaml(&docs)
}

/// A billing logger writing to a file, as the same logger on stdout.
fn to_stdout(mut log: Json) -> Json {
    let format = log["typed_config"]["log_format"].clone();
    log["name"] = json!("envoy.access_loggers.stdout");
    log["typed_config"] = json!({
        "@type": "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog",
        "log_format": format});
    log
}

/// The native flavour's deployment overlay: a `ConfigMap` for the Gateway's
/// `spec.infrastructure.parametersRef`, whose `deployment` key Istio merges into the
/// gateway's Deployment: the module image mounted read-only at [`MODULE_DIR`] in the
/// `istio-proxy` container, and Envoy's dynamic-module search path set there; the pod
/// annotation `sidecar.istio.io/statsInclusionPrefixes` keeps the module's stats, which
/// Istio's stats matcher would drop (its required prefixes cover `wasm…`, not
/// `dynamicmodulescustom…`; pkg/bootstrap/config.go `getStatsOptions`).
fn deployment_overlay(target: &Target, image: &str) -> Json {
    let reference = image.split_once("://").map_or(image, |(_, rest)| rest);
    let overlay = json!({"spec": {"template": {
        "metadata": {"annotations": {STATS_ANNOTATION: NATIVE_STATS_PREFIX}},
        "spec": {
        "containers": [{"name": "istio-proxy",
            "env": [{"name": "ENVOY_DYNAMIC_MODULES_SEARCH_PATH", "value": MODULE_DIR}],
            "volumeMounts": [{"name": "infergate-module", "mountPath": MODULE_DIR, "readOnly": true}]}],
        "volumes": [{"name": "infergate-module",
                     "image": {"reference": reference, "pullPolicy": "IfNotPresent"}}]}}}});
    let text = serde_yaml_ng::to_string(&overlay).unwrap_or_default();
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": OVERLAY_CONFIGMAP, "namespace": target.namespace,
                     "labels": {"app.kubernetes.io/managed-by": "infergate-render"}},
        "data": {"deployment": text}
    })
}
