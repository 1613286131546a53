//! The gateway as Envoy Gateway manifests (`envoy-gateway.yaml`).
//!
//! What Envoy Gateway's translator does with them (read from envoyproxy/gateway, main of
//! August 2026: `internal/xds/translator/{wasm,dynamicmodule,httpfilters,jsonpatch,utils}.go`,
//! `internal/gatewayapi/{envoyextensionpolicy,helpers}.go`, `api/v1alpha1/{wasm_types,
//! dynamic_module_types,envoyextensionypolicy_types,envoyproxy_types,loadbalancer_types,
//! envoypatchpolicy_types}.go`):
//!
//! - **Filter names.** Each `EnvoyExtensionPolicy` entry becomes one HTTP filter named
//!   `<type>/<ir name>`: `envoy.filters.http.wasm/envoyextensionpolicy/<ns>/<policy>/wasm/<i>`
//!   and `envoy.filters.http.dynamic_modules/envoyextensionpolicy/<ns>/<policy>/dynamic-module/<i>`,
//!   `<i>` the entry's index in the policy's list.
//! - **Enabled per route.** Every such filter is added to the connection manager
//!   `disabled: true` and enabled in `typed_per_filter_config` of the routes the policy
//!   reaches. Envoy decides a stream's filters from the route matched when its headers
//!   arrive, before our body router has set `X-Gateway-Base-Model-Name`: so the rendered
//!   `HTTPRoute`s get an *entry* rule per path prefix (no model header, lower precedence
//!   than the model rules, which match more headers) on which the filters are enabled.
//! - **Order.** Filters are sorted by a fixed rank per type: … `jwt_authn` 10, buffer 12 …
//!   ext_proc 100+i, **Wasm 200+i**, **dynamic modules 250+i**, … router 310; `i` the index
//!   in the policy's list (ties by name). So the policy lists router, `headers`, picker in
//!   that order, and no filter of another type lands between them by rank: the buffer
//!   filter the Wasm chain needs before `headers` and the route refresh before the picker
//!   are inserted by the `EnvoyPatchPolicy` (below).
//! - **Wasm VM.** `vm_id` is the filter's IR name (one VM id per entry: the router and the
//!   picker never share a VM or shared data), runtime V8, code fetched by Envoy Gateway from
//!   the OCI image and served over HTTP (`remote.http_uri`); `root_id` is `rootID`; no field
//!   sets `allow_on_headers_stop_iteration`; `failOpen` false means fail closed.
//! - **Dynamic modules.** An entry names a module of the `EnvoyProxy`'s `dynamicModules`
//!   allowlist (a local path or a remote URL with its sha256) and a `filterName`; its
//!   `config` is passed as JSON text (a StringValue). The same allowlist serves the
//!   `DynamicModule` load-balancer type, which cannot be combined with `endpointOverride`.
//! - **Endpoint override.** `BackendTrafficPolicy.loadBalancer.endpointOverride` makes a
//!   cluster's policy Envoy's `override_host`, the hosts read from a *header* (no metadata
//!   source) with the configured type as fallback.
//! - **Clusters.** One per route rule, `httproute/<ns>/<name>/rule/<i>`; a rule's several
//!   backends are weighted localities of that one cluster.
//! - **`EnvoyPatchPolicy`** (JSONPatch, enabled by `extensionApis.enableEnvoyPatchPolicy`
//!   in the Envoy Gateway configuration) patches a named xDS resource, after every filter is
//!   placed (`processJSONPatches`, internal/xds/translator/jsonpatch.go), on its JSON with
//!   proto field names: `add` with an empty path adds a new resource (the scrape and admin
//!   clusters here); a `jsonPath` (RFC 9535) resolves to JSON pointers, `path` appended, so an
//!   `add` whose `jsonPath` selects a filter by name inserts before it
//!   (internal/utils/jsonpatch/patch.go).
//! - **Listener.** A Gateway listener becomes the xDS listener `<ns>/<gateway>/<section>`
//!   (the `XDSNameSchemeV2` runtime flag is off by default), its plain-HTTP connection
//!   manager in the `default_filter_chain`.
//! - The proxy's admin listens on `127.0.0.1:19000`.
//!
//! What is therefore not expressible (reported in `fields.md`): a pool reached by a split
//! across pools (one cluster per rule), `jwt_authn` with our provider (Envoy Gateway has its
//! own `SecurityPolicy` API, not rendered), the billing log (Envoy Gateway's access logs are
//! `EnvoyProxy.spec.telemetry`, not rendered), and the native `infergate-membership`
//! fallback policy (the scraper reads the members from the admin instead).

use super::gateway::{Gateway, GatewayInputs};
use super::istio::{buffer_filter, oci_url, route_refresh_filter, MODULE_DIR, NATIVE_MODULE_FILE};
use super::kube::{self, Target};
use super::report::Report;
use crate::config::bootstrap::Flavor;
use anyhow::{Context, Result};
use serde_json::{json, Value as Json};

/// Envoy Gateway's proxy admin port.
pub const EG_ADMIN_PORT: u16 = 19000;

/// The name of every object rendered here (policies, `EnvoyProxy`).
pub const NAME: &str = "infergate";

/// The cluster Envoy Gateway makes for rule `rule` of the `HTTPRoute` `<ns>/<name>`.
pub fn rule_cluster(namespace: &str, name: &str, rule: usize) -> String {
    format!("httproute/{namespace}/{name}/rule/{rule}")
}

/// The Gateway listener a route attaches to when no parent reference names one.
pub const DEFAULT_SECTION: &str = "http";

/// The xDS listener Envoy Gateway makes for listener `section` of Gateway `<ns>/<name>`
/// (`irListenerName`, internal/gatewayapi/helpers.go; `xdsListenerName` keeps it while the
/// `XDSNameSchemeV2` runtime flag is off, its default).
pub fn listener_name(namespace: &str, gateway: &str, section: &str) -> String {
    format!("{namespace}/{gateway}/{section}")
}

/// The HTTP filter of entry `index` of this gateway's `EnvoyExtensionPolicy` `wasm` list
/// in namespace `ns` (`perRouteFilterName` of `envoyextensionpolicy/<ns>/<policy>/wasm/<i>`).
pub fn wasm_filter_name(ns: &str, index: usize) -> String {
    format!("envoy.filters.http.wasm/envoyextensionpolicy/{ns}/{NAME}/wasm/{index}")
}

/// The listener patches that complete the Wasm chain: Envoy's buffer filter before the
/// `headers` filter (entry 1), the route refresh before the picker (entry 2). Each `add`
/// names its anchor by a JSONPath filter on the name, so the pointer it resolves to is the
/// anchor's index and the new filter goes in before it, wherever the HCM sits.
fn wasm_chain_patches(listener: &str, ns: &str, router: &Json) -> Vec<Json> {
    let listener_type = "type.googleapis.com/envoy.config.listener.v3.Listener";
    [(1, buffer_filter(router)), (2, route_refresh_filter())]
        .into_iter()
        .map(|(anchor, filter)| {
            json!({"type": listener_type, "name": listener, "operation": {"op": "add",
                "jsonPath": format!("$..http_filters[?(@.name=='{}')]", wasm_filter_name(ns, anchor)),
                "value": filter}})
        })
        .collect()
}

/// `envoy-gateway.yaml`: every manifest, as YAML documents.
pub fn manifests(
    gw: &Gateway,
    inputs: &GatewayInputs,
    image: &str,
    report: &mut Report,
) -> Result<String> {
    let form = "Envoy Gateway";
    let target = Target::of(gw);
    let wasm = inputs.flavor == Flavor::Wasm;
    let (mut docs, services) = kube::pool_services(gw, report, form);
    // Each pool's cluster: the rule that sends to it alone (the first such rule).
    let mut clusters: Vec<Option<String>> = vec![None; gw.pools.len()];
    for route in &gw.routes {
        let ns = route
            .meta
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        for (r, rule) in route.rules.iter().enumerate() {
            if rule.backends.len() > 1 {
                report.not_supported(
                    &route.label,
                    &format!("{}.backendRefs", rule.path),
                    format!(
                        "{form}: one cluster holds every backend of a rule, so the picker \
                             cannot tell the pools apart; split the model by rules instead"
                    ),
                );
                continue;
            }
            for b in &rule.backends {
                if let Some(i) = gw.pools.iter().position(|p| p.meta.name == b.pool) {
                    let cluster = rule_cluster(&ns, &route.meta.name, r);
                    match &clusters[i] {
                        None => clusters[i] = Some(cluster),
                        Some(first) if first != &cluster => report.not_supported(
                            &route.label,
                            &format!("{}.backendRefs", rule.path),
                            format!("{form}: pool `{}` is already followed through cluster \
                                     `{first}`; the members this rule's cluster sees are not scraped",
                                    b.pool),
                        ),
                        Some(_) => {}
                    }
                }
            }
        }
    }
    let clusters: Vec<String> = clusters
        .into_iter()
        .enumerate()
        .map(|(i, c)| c.unwrap_or_else(|| format!("unrouted-{}", gw.pools[i].meta.name)))
        .collect();
    let routes = kube::routes(gw, &services, true);
    let route_refs: Vec<Json> = routes
        .iter()
        .map(|r| {
            json!({"group": "gateway.networking.k8s.io", "kind": "HTTPRoute",
                        "name": r["metadata"]["name"]})
        })
        .collect();
    docs.extend(routes);
    let (router, picker) = kube::module_configs(gw, &target, &clusters, "admin", inputs.flavor);
    kube::check_configs(&router, &picker).context("the Envoy Gateway form's configurations")?;
    let ns = target.namespace.clone();
    let policy_spec = if wasm {
        let image = oci_url(image);
        let image = image.strip_prefix("oci://").unwrap_or(&image).to_owned();
        let entry = |name: &str, root: &str, config: &Json| {
            json!({"name": name, "rootID": root,
                   "code": {"type": "Image", "image": {"url": image}, "pullPolicy": "IfNotPresent"},
                   "config": config, "failOpen": false})
        };
        let headers = json!({"role": "headers", "instance": target.instance()});
        json!({"targetRefs": target.target_refs(), "wasm": [
            entry("infergate.router", "router", &router),
            entry("infergate.headers", "headers", &headers),
            entry("infergate.picker", "picker", &picker)]})
    } else {
        json!({"targetRefs": target.target_refs(), "dynamicModule": [
            {"name": NAME, "filterName": "router", "config": router},
            {"name": NAME, "filterName": "picker", "config": picker}]})
    };
    docs.push(json!({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "EnvoyExtensionPolicy",
        "metadata": {"name": NAME, "namespace": ns}, "spec": policy_spec}));
    if !wasm {
        let reference = image.split_once("://").map_or(image, |(_, rest)| rest);
        docs.push(json!({
            "apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "EnvoyProxy",
            "metadata": {"name": NAME, "namespace": ns},
            "spec": {
                "dynamicModules": [{"name": NAME, "doNotClose": true,
                    "source": {"type": "Local", "local": {"path": format!("{MODULE_DIR}/{NATIVE_MODULE_FILE}")}}}],
                "provider": {"type": "Kubernetes", "kubernetes": {"envoyDeployment": {"patch": {
                    "type": "StrategicMerge",
                    "value": {"spec": {"template": {"spec": {
                        "containers": [{"name": "envoy", "volumeMounts": [
                            {"name": "infergate-module", "mountPath": MODULE_DIR, "readOnly": true}]}],
                        "volumes": [{"name": "infergate-module",
                                     "image": {"reference": reference, "pullPolicy": "IfNotPresent"}}]}}}}}}}}}
        }));
    }
    docs.push(json!({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "BackendTrafficPolicy",
        "metadata": {"name": NAME, "namespace": ns},
        "spec": {"targetRefs": route_refs,
                 "loadBalancer": {"type": "RoundRobin",
                     "endpointOverride": {"extractFrom": [{"header": "x-gateway-destination-endpoint"}]}},
                 "circuitBreaker": {"maxConnections": 16384, "maxPendingRequests": 16384,
                                    "maxParallelRequests": 16384, "maxParallelRetries": 16384}}
    }));
    let cluster_type = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    let mut patches = vec![
        json!({"type": cluster_type, "name": "infergate_scrape",
               "operation": {"op": "add", "path": "", "value": {
                   "name": "infergate_scrape", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
                   "connect_timeout": "1s",
                   "original_dst_lb_config": {"use_http_header": true,
                                              "http_header_name": "x-gateway-destination-endpoint"}}}}),
        json!({"type": cluster_type, "name": "infergate_admin",
               "operation": {"op": "add", "path": "", "value": {
                   "name": "infergate_admin", "type": "STATIC", "connect_timeout": "1s",
                   "load_assignment": {"cluster_name": "infergate_admin", "endpoints": [{"lb_endpoints": [
                       {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1",
                                                                     "port_value": EG_ADMIN_PORT}}}}]}]}}}}),
    ];
    let peers = kube::peer_resources(gw, inputs.flavor)?;
    if wasm || !peers.is_empty() {
        let section = gw.section.clone().unwrap_or_else(|| {
            report.used(
                "gateway",
                "sectionName",
                format!(
                    "{form}: no route names its Gateway listener (`sectionName`); the \
                         listener patched is `{DEFAULT_SECTION}`"
                ),
            );
            DEFAULT_SECTION.to_owned()
        });
        let listener = listener_name(&target.namespace, &target.name, &section);
        // Peer clusters: each pool's peers cluster, and its route first in each virtual
        // host of the listener's route configuration (named as the listener).
        for (cluster, route) in peers {
            let name = cluster["name"].clone();
            patches.push(json!({"type": cluster_type, "name": name,
                                "operation": {"op": "add", "path": "", "value": cluster}}));
            patches.push(json!({"type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
                "name": listener, "operation": {"op": "add", "jsonPath": "$.virtual_hosts[*].routes",
                                                 "path": "/0", "value": route}}));
        }
        if wasm {
            patches.extend(wasm_chain_patches(&listener, &ns, &router));
        }
    }
    docs.push(json!({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "EnvoyPatchPolicy",
        "metadata": {"name": NAME, "namespace": ns},
        "spec": {"targetRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": target.name},
                 "type": "JSONPatch",
                 "jsonPatches": patches}
    }));
    let pool_label = |i: usize| gw.pools.get(i).map(|p| p.label.clone()).unwrap_or_default();
    for i in 0..gw.pools.len() {
        report.used(
            &pool_label(i),
            "",
            format!(
                "{form}: the pool cluster's fallback is round robin, and the scraper reads \
                     the members from the proxy's admin (:{EG_ADMIN_PORT}): Envoy Gateway's \
                     `endpointOverride` takes the cluster's load-balancing policy"
            ),
        );
    }
    if wasm {
        report.used(
            "gateway",
            "",
            format!(
                "{form}: each Wasm filter gets a vm_id of its own (router, `headers` and picker \
                 never share a VM) and allow_on_headers_stop_iteration is Envoy's default; the \
                 EnvoyPatchPolicy inserts Envoy's buffer filter before `headers` and the route \
                 refresh before the picker"
            ),
        );
        report.not_supported(
            "gateway",
            "failStrategy",
            format!(
                "{form}: a Wasm entry has `failOpen` but no failure policy, so Envoy applies \
                 FAIL_CLOSED: a VM that traps is not reloaded and its worker answers 503 until \
                 the next configuration (the native flavour has no VM to lose)"
            ),
        );
    }
    if gw.params.tenancy.jwt.is_some() {
        report.not_supported(
            "gateway",
            "jwt",
            format!("{form}: jwt_authn is not rendered (Envoy Gateway's SecurityPolicy jwt is its own API)"),
        );
    }
    if gw.params.tenancy.billing_log.is_some() {
        report.not_supported(
            "gateway",
            "billing log",
            format!(
                "{form}: the billing log is not rendered (EnvoyProxy.spec.telemetry.accessLog)"
            ),
        );
    }
    kube::to_yaml(&docs)
}
