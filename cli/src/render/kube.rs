//! What the Istio and Envoy Gateway forms share: the gateway they attach to, a `Service`
//! per `InferencePool` (the control plane sends endpoints only for Services), the
//! `HTTPRoute`s again with those Services as backends, the module configurations with the
//! gateway's `instance` and the scraper inside the picker's, and the check of those
//! configurations by the modules' own parsers.

use super::gateway::Gateway;
use super::names::{instance, service_name};
use super::report::Report;
use crate::config::bootstrap::{Flavor, PeerMode, PeerResources};
use crate::config::template::{Template, Vars};
use anyhow::{anyhow, Context, Result};
use serde_json::{json, Value as Json};

/// The Gateway the manifests attach to: the first parent of the routes
/// (`default/inference-gateway` when no route names one).
#[derive(Clone, Debug)]
pub struct Target {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl Target {
    /// The gateway of `gw`.
    pub fn of(gw: &Gateway) -> Self {
        match gw.parents.first() {
            Some((ns, name)) => Self {
                namespace: ns.clone().unwrap_or_else(|| "default".into()),
                name: name.clone(),
            },
            None => Self {
                namespace: "default".into(),
                name: "inference-gateway".into(),
            },
        }
    }

    /// `<namespace>.<name>`, the modules' `instance`.
    pub fn instance(&self) -> String {
        instance(&self.namespace, &self.name)
    }

    /// A `targetRefs` list naming the Gateway.
    pub fn target_refs(&self) -> Json {
        json!([{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": self.name}])
    }
}

/// One pool's Service.
#[derive(Clone, Debug)]
pub struct PoolService {
    /// The Service's name ([`service_name`]).
    pub name: String,
    /// Its namespace (the pool's).
    pub namespace: String,
    /// Its one port (the pool's first target port).
    pub port: u16,
}

/// The Service of each pool, in pool order, as manifests (and what each is).
pub fn pool_services(
    gw: &Gateway,
    report: &mut Report,
    form: &str,
) -> (Vec<Json>, Vec<PoolService>) {
    let mut docs = Vec::new();
    let mut out = Vec::new();
    for pool in &gw.pools {
        let namespace = pool
            .meta
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = service_name(&pool.meta.name);
        let port = pool.target_ports.first().copied().unwrap_or(8000);
        if pool.target_ports.len() > 1 {
            report.not_supported(
                &pool.label,
                "spec.targetPorts",
                format!("{form}: only the first port is a Service port (data-parallel ranks need the bootstrap)"),
            );
        }
        if pool.selector.get("matchExpressions").is_some() {
            report.not_supported(
                &pool.label,
                "spec.selector.matchExpressions",
                format!("{form}: a Service selects by labels only"),
            );
        }
        let selector = pool
            .selector
            .get("matchLabels")
            .cloned()
            .unwrap_or_else(|| json!({}));
        report.used(
            &pool.label,
            "metadata.name",
            format!("{form}: the Service `{namespace}/{name}` carries its members"),
        );
        docs.push(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "infergate-render"}},
            "spec": {"selector": selector,
                     "ports": [{"name": format!("http-{port}"), "port": port, "targetPort": port,
                                "appProtocol": "http"}]}
        }));
        out.push(PoolService {
            name,
            namespace,
            port,
        });
    }
    (docs, out)
}

/// The router's and the picker's configurations for a control plane: each with the
/// gateway's `instance` when `flavor` is Wasm (the prefix of its shared-data keys; the
/// native module keeps its state in process memory and refuses the key); the picker's pools following `clusters` (one per pool, in order)
/// instead of listing endpoints, and carrying the process's scraper (`scraper`, without
/// its `role`) following the same clusters, its members learned by `membership` (`admin`
/// or `host`).
pub fn module_configs(
    gw: &Gateway,
    target: &Target,
    clusters: &[String],
    membership: &str,
    flavor: Flavor,
) -> (Json, Json) {
    let wasm = flavor == Flavor::Wasm;
    let instance = Json::String(target.instance());
    let mut router = gw.router.clone();
    if let Some(m) = router.as_object_mut().filter(|_| wasm) {
        m.insert("instance".into(), instance.clone());
    }
    let mut picker = gw.picker.clone();
    for (i, cluster) in clusters.iter().enumerate() {
        if let Some(p) = picker["pools"].get_mut(i).and_then(Json::as_object_mut) {
            p.insert("cluster".into(), Json::String(cluster.clone()));
            p.remove("endpoints");
        }
    }
    let mut scraper = gw.params.plugins.scraper.clone();
    // The pools' members come from their clusters; the only static targets left are the
    // peer gateways of Parent Mode (scraped at their export pages, `metricsPaths`).
    let peer_gateways: Vec<String> = gw
        .params
        .pools
        .iter()
        .filter_map(|p| p.peers.as_ref())
        .filter(|p| p.mode == PeerMode::Parent)
        .flat_map(|p| p.gateways.iter().map(ToString::to_string))
        .collect();
    if let Some(m) = scraper.as_object_mut() {
        m.remove("role");
        m.insert("endpoints".into(), json!(peer_gateways));
        m.insert("clusters".into(), json!(clusters));
        m.insert("membership".into(), json!(membership));
    }
    if let Some(m) = picker.as_object_mut() {
        if wasm {
            m.insert("instance".into(), instance);
        }
        m.insert("scraper".into(), scraper);
    }
    (router, picker)
}

/// Checks a router and a picker configuration of [`module_configs`] with the modules' own
/// parsers: the picker's `scraper` as the scraper's configuration, the rest as today's
/// router and picker (`instance` and `scraper` set aside, for a module that does not read
/// them yet).
pub fn check_configs(router: &Json, picker: &Json) -> Result<()> {
    let mut router = router.clone();
    if let Some(m) = router.as_object_mut() {
        m.remove("instance");
    }
    let mut picker = picker.clone();
    let scraper = picker
        .as_object_mut()
        .and_then(|m| {
            m.remove("instance");
            m.remove("scraper")
        })
        .ok_or_else(|| anyhow!("the picker configuration carries no scraper"))?;
    super::gateway::check_with_the_modules_parsers(&router, &picker, &scraper)
}

/// The pool clusters' load-balancing policy, from `flavor`'s own template (its
/// `pool_lb_policy` prototype), with the native module at `module`.
pub fn pool_lb_policy(flavor: Flavor, module: &str) -> Result<Json> {
    let t = Template::parse(flavor.template())
        .with_context(|| format!("parsing {}", flavor.template_file()))?;
    let mut vars = Vars::new();
    vars.insert(
        "native_module".into(),
        serde_yaml_ng::Value::String(module.to_owned()),
    );
    let policy = t.prototype("pool_lb_policy", &vars)?;
    serde_json::to_value(policy).context("the pool clusters' policy as JSON")
}

/// Each pool's peers cluster and the route that reaches it ([`PeerResources::render`]),
/// as JSON, from `flavor`'s own template. The peers cluster of Parent Mode takes the Wasm
/// flavour's policy (override_host, round robin past the list: no module LB policy to
/// install), and has no loopback: where the control plane binds this gateway's listener is
/// not known here.
pub fn peer_resources(gw: &Gateway, flavor: Flavor) -> Result<Vec<(Json, Json)>> {
    if gw.params.pools.iter().all(|p| p.peers.is_none()) {
        return Ok(Vec::new());
    }
    let t = Template::parse(flavor.template())
        .with_context(|| format!("parsing {}", flavor.template_file()))?;
    let lb_policy = serde_yaml_ng::to_value(pool_lb_policy(Flavor::Wasm, "")?)?;
    let retry_policy = t.prototype("pool_retry_policy", &Vars::new())?;
    let resources = PeerResources {
        lb_policy: &lb_policy,
        retry_policy: &retry_policy,
        loopback: None,
    };
    let mut out = Vec::new();
    for (i, pool) in gw.params.pools.iter().enumerate() {
        if pool.peers.is_some() {
            let (cluster, route) = resources.render(&t, pool, i)?;
            out.push((serde_json::to_value(cluster)?, serde_json::to_value(route)?));
        }
    }
    Ok(out)
}

/// Each `HTTPRoute` again, its `InferencePool` backends replaced by the pools' Services.
/// With `entry`, each rule that matches a path prefix is preceded by a rule matching that
/// prefix alone (no model header), to the same backends: a control plane that enables the
/// gateway's filters per route (Envoy Gateway) must find a route before the body router has
/// set the model header.
pub fn routes(gw: &Gateway, services: &[PoolService], entry: bool) -> Vec<Json> {
    let backend = |name: &str| {
        gw.pools
            .iter()
            .position(|p| p.meta.name == name)
            .and_then(|i| services.get(i))
            .map_or_else(|| (service_name(name), 8000), |s| (s.name.clone(), s.port))
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
                    if let Some(section) = &p.section_name {
                        r["sectionName"] = Json::String(section.clone());
                    }
                    r
                })
                .collect();
            let mut rules: Vec<Json> = Vec::new();
            let mut entries: Vec<Json> = Vec::new();
            for rule in &route.rules {
                let backends: Vec<Json> = rule
                    .backends
                    .iter()
                    .map(|b| {
                        let (svc, port) = backend(&b.pool);
                        json!({"kind": "Service", "name": svc, "port": port, "weight": b.weight})
                    })
                    .collect();
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
                if entry {
                    let prefix = rule
                        .matches
                        .iter()
                        .find_map(|m| m.path_prefix.clone())
                        .unwrap_or_else(|| "/".into());
                    let m = json!({"path": {"type": "PathPrefix", "value": prefix}});
                    if !entries.iter().any(|e| e["matches"][0] == m) {
                        entries.push(json!({"matches": [m], "backendRefs": backends.clone(),
                                            "timeouts": {"request": "0s"}}));
                    }
                }
                rules.push(json!({"matches": matches, "backendRefs": backends, "timeouts": {"request": "0s"}}));
            }
            rules.extend(entries);
            let mut metadata = json!({"name": route.meta.name});
            if let Some(ns) = &route.meta.namespace {
                metadata["namespace"] = Json::String(ns.clone());
            }
            json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                   "metadata": metadata, "spec": {"parentRefs": parents, "rules": rules}})
        })
        .collect()
}

/// The manifests as YAML documents.
pub fn to_yaml(docs: &[Json]) -> Result<String> {
    let mut out = String::new();
    for d in docs {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(d).context("serialising a manifest")?);
    }
    Ok(out)
}
