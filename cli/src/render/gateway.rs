//! From the user's objects to the launcher's own description of a gateway
//! ([`BootstrapParams`]): pools from `InferencePool`s (their base model from the
//! `HTTPRoute`s that send a model to them, their adapters from the rewrites' targets),
//! routes from `HTTPRoute`s, each pool's `EndpointPickerConfig`, the objectives, the
//! rewrites and the tenants. The bootstrap is then rendered by `config::bootstrap`, the
//! renderer every harness stack uses.

use super::objects::http_route::v1::HttpRoute;
use super::objects::inference_pool::v1::InferencePool;
use super::objects::inference_pool_import::v1alpha1::InferencePoolImport;
use super::objects::{Object, ObjectSet};
use crate::config::bootstrap::{
    BootstrapParams, Flavor, GatewaySettings, PeerMode, Peers, PluginConfigs, Pool,
};
use crate::config::epp::{apply_objectives, picker_objectives};
use crate::config::peers::PeersFile;
use crate::config::rewrites::apply_rewrites;
use crate::config::routes::RouteSpec;
use crate::config::tenancy::{JwtProvider, Tenancy};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value as Json;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

/// What the objects do not say about a gateway: where it runs and what it is given.
#[derive(Clone, Debug)]
pub struct GatewayInputs {
    /// Which module.
    pub flavor: Flavor,
    /// Endpoints per pool (`--endpoints POOL=IP[:PORT],...`): bare IPs take every
    /// `targetPorts` port.
    pub endpoints: Vec<(String, Vec<String>)>,
    /// The module's path on the Envoy host; `None`: the flavour's built artefact.
    pub module: Option<PathBuf>,
    /// Leave the `TenantQuota` objects out (each is reported).
    pub no_tenants: bool,
    /// The JWKS (JSON text) of the tenants' JWT issuer.
    pub jwks: Option<String>,
    /// Where Envoy writes the billing log.
    pub billing_log: Option<PathBuf>,
    /// Weighted splits drawn per request instead of sticky on `x-gateway-split-key`.
    pub per_request_split: bool,
    /// Where each cluster of the ClusterSet runs its gateway (`--peers`), for the pools an
    /// `InferencePoolImport` names.
    pub peers: Option<PeersFile>,
    /// This cluster's own name in the ClusterSet (`--cluster`): never its own peer.
    pub cluster: Option<String>,
    /// How this cluster reaches the clusters it imports pools from (`--peer-mode`).
    pub peer_mode: PeerMode,
    /// The API key this gateway presents to peer gateways that authenticate tenants
    /// (`--peer-api-key-file`; Parent Mode).
    pub peer_api_key: Option<String>,
    /// Exported pools list their members too, for importers in Endpoint Mode
    /// (`--export-members`).
    pub export_members: bool,
}

/// A gateway described by the objects.
#[derive(Clone, Debug)]
pub struct Gateway {
    /// What `config::bootstrap::render` renders.
    pub params: BootstrapParams,
    /// The InferencePool each pool came from, in pool order.
    pub pools: Vec<InferencePool>,
    /// The `HTTPRoute`s, as read.
    pub routes: Vec<HttpRoute>,
    /// The routes' parent Gateways (`namespace/name`), each once.
    pub parents: Vec<(Option<String>, String)>,
    /// The Gateway listener the routes attach to: the first `sectionName` a parent
    /// reference gives.
    pub section: Option<String>,
    /// The router configuration as the module gets it (tenants and rewrites in it).
    pub router: Json,
    /// The picker configuration as the module gets it (objectives in it).
    pub picker: Json,
}

/// Builds the gateway of `set`, adding to its report.
pub fn build(set: &mut ObjectSet, inputs: &GatewayInputs) -> Result<Gateway> {
    let pools: Vec<InferencePool> = set
        .of(|o| match o {
            Object::InferencePoolV1(p) => Some(p),
            _ => None,
        })
        .into_iter()
        .cloned()
        .collect();
    if pools.is_empty() {
        bail!("no InferencePool among the objects: the gateway has nothing to route to");
    }
    let routes: Vec<HttpRoute> = set
        .of(|o| match o {
            Object::HttpRouteV1(r) => Some(r),
            _ => None,
        })
        .into_iter()
        .cloned()
        .collect();
    let index_of = |route: &HttpRoute, name: &str| {
        pools
            .iter()
            .position(|p| p.meta.name == name && p.meta.namespace == route.meta.namespace)
    };
    // Each pool's base model: the model of the routes that send to it.
    let mut base: Vec<Option<String>> = vec![None; pools.len()];
    let mut specs: Vec<RouteSpec> = Vec::new();
    let mut parents = Vec::new();
    let mut section = None;
    for route in &routes {
        for p in &route.parents {
            if section.is_none() {
                section.clone_from(&p.section_name);
            }
            let ns = p.namespace.clone().or_else(|| route.meta.namespace.clone());
            if !parents.contains(&(ns.clone(), p.name.clone())) {
                parents.push((ns, p.name.clone()));
            }
        }
        for rule in &route.rules {
            let mut backends = Vec::new();
            for b in &rule.backends {
                if b.import {
                    // The import's clusters are peers of the local pool of its name, which
                    // spills to them: no traffic goes there by weight.
                    let local = rule.backends.iter().any(|o| !o.import && o.pool == b.pool);
                    if index_of(route, &b.pool).is_none() {
                        bail!(
                            "{} {}: InferencePoolImport `{}` needs the InferencePool of its \
                             name among the objects: requests reach the exporting clusters \
                             by spillover from the local pool (Parent Mode)",
                            route.label,
                            b.path,
                            b.pool
                        );
                    }
                    set.report.used(
                        &route.label,
                        &b.path,
                        "the local InferencePool of this name, whose peers the import's \
                         exporting clusters are (spillover, not a weighted share)",
                    );
                    if local {
                        continue;
                    }
                }
                let i = index_of(route, &b.pool).ok_or_else(|| {
                    anyhow!(
                        "{} {}: InferencePool `{}` is not among the objects",
                        route.label,
                        b.path,
                        b.pool
                    )
                })?;
                backends.push((i, b.weight));
            }
            for m in &rule.matches {
                for &(i, _) in &backends {
                    match &base[i] {
                        Some(model) if model != &m.model => bail!(
                            "{} {}: InferencePool `{}` is sent `{}` here and `{model}` elsewhere; \
                             a pool serves one base model",
                            route.label,
                            rule.path,
                            pools[i].meta.name,
                            m.model
                        ),
                        _ => base[i] = Some(m.model.clone()),
                    }
                }
                let mut spec = if backends.len() == 1 {
                    RouteSpec::to(m.model.clone(), backends[0].0)
                } else if inputs.per_request_split {
                    RouteSpec::split(m.model.clone(), &backends)
                } else {
                    RouteSpec::split(m.model.clone(), &backends).sticky()
                };
                if let Some((h, v)) = &m.header {
                    spec = spec.when_header(h.clone(), v.clone());
                }
                if let Some(prefix) = &m.path_prefix {
                    spec = spec.under_path(prefix.clone());
                }
                specs.push(spec);
            }
        }
    }
    let imports: Vec<InferencePoolImport> = set
        .of(|o| match o {
            Object::InferencePoolImportV1alpha1(i) => Some(i),
            _ => None,
        })
        .into_iter()
        .cloned()
        .collect();
    for import in &imports {
        let local = pools
            .iter()
            .any(|p| p.meta.name == import.meta.name && p.meta.namespace == import.meta.namespace);
        if !local {
            bail!(
                "{}: no InferencePool of its name among the objects: requests reach the \
                 exporting clusters by spillover from the local pool (Parent Mode)",
                import.label
            );
        }
    }
    // The EndpointPickerConfig of each pool.
    let epps: Vec<_> = set
        .of(|o| match o {
            Object::EndpointPickerConfigV1alpha1(c) => Some(c),
            _ => None,
        })
        .into_iter()
        .cloned()
        .collect();
    // Adapters: the rewrite targets of each pool.
    let rewrites: Vec<_> = set
        .of(|o| match o {
            Object::InferenceModelRewriteV1alpha2(r) => Some(r),
            _ => None,
        })
        .into_iter()
        .cloned()
        .collect();
    let mut out_pools = Vec::new();
    for (i, pool) in pools.iter().enumerate() {
        let Some(model) = base[i].clone() else {
            bail!(
                "{}: no HTTPRoute sends a model to it, so its base model is unknown (a rule \
                 matching X-Gateway-Base-Model-Name with this pool as its backendRef)",
                pool.label
            );
        };
        let mut adapters = Vec::new();
        for r in rewrites
            .iter()
            .filter(|r| r.pool == pool.meta.name && r.meta.namespace == pool.meta.namespace)
        {
            for t in &r.targets {
                if t != &model && !adapters.contains(t) {
                    adapters.push(t.clone());
                }
            }
        }
        let epp = match epps.len() {
            0 => {
                set.report.not_supported(
                    &pool.label,
                    "",
                    "no EndpointPickerConfig among the objects: the picker's default scheduling",
                );
                Json::Null
            }
            1 => epps[0].document.clone(),
            _ => {
                let wanted = pool
                    .endpoint_picker_ref
                    .as_ref()
                    .map(|r| format!("{}-config", r.name));
                let found: Vec<_> = epps
                    .iter()
                    .filter(|e| e.config_map.is_some() && e.config_map == wanted)
                    .collect();
                match found.as_slice() {
                    [one] => one.document.clone(),
                    _ => bail!(
                        "{}: {} EndpointPickerConfigs among the objects and none is the \
                         ConfigMap `<endpointPickerRef.name>-config` ({}): keep one per \
                         directory, or name the ConfigMap so",
                        pool.label,
                        epps.len(),
                        wanted.unwrap_or_else(|| "no endpointPickerRef".into())
                    ),
                }
            }
        };
        let endpoints = pool_endpoints(pool, inputs)?;
        let peers = pool_peers(pool, &imports, inputs)?;
        if pool.exported {
            set.report.used(
                &pool.label,
                "",
                "exported: its load is published on /infergate/pools/<name>/metrics",
            );
        }
        out_pools.push(Pool {
            name: Some(pool.meta.name.clone()),
            base_model: model,
            adapters,
            endpoints,
            target_ports: Vec::new(),
            failure_mode: pool.failure_mode(),
            picker_config: epp,
            export: pool.exported,
            export_members: pool.exported && inputs.export_members,
            peers,
        });
    }
    for (name, _) in &inputs.endpoints {
        if !pools.iter().any(|p| &p.meta.name == name) {
            bail!("--endpoints {name}=...: no InferencePool `{name}` among the objects");
        }
    }
    let clusters: Vec<String> = out_pools
        .iter()
        .enumerate()
        .map(|(i, p)| p.cluster_name(i))
        .collect();

    // Rewrites, with their poolRef naming the router pool (the pool's cluster name).
    let mut rewrite_docs = Vec::new();
    for r in &rewrites {
        let i = pools
            .iter()
            .position(|p| p.meta.name == r.pool && p.meta.namespace == r.meta.namespace)
            .ok_or_else(|| {
                anyhow!(
                    "{} spec.poolRef.name: InferencePool `{}` is not among the objects",
                    r.label,
                    r.pool
                )
            })?;
        let mut doc = r.document.clone();
        doc["spec"]["poolRef"]["name"] = Json::String(clusters[i].clone());
        rewrite_docs.push(doc);
    }

    // Objectives (the picker's priorities; the tenants' too).
    let objectives: Vec<_> = set
        .of(|o| match o {
            Object::InferenceObjectiveV1alpha2(o) => Some(o),
            _ => None,
        })
        .into_iter()
        .cloned()
        .collect();
    let mut objective_docs = Vec::new();
    for o in &objectives {
        if let Some(pool) = &o.pool {
            if !pools
                .iter()
                .any(|p| &p.meta.name == pool && p.meta.namespace == o.meta.namespace)
            {
                bail!(
                    "{} spec.poolRef.name: InferencePool `{pool}` is not among the objects",
                    o.label
                );
            }
            if pools.len() > 1 {
                set.report.not_supported(
                    &o.label,
                    "spec.poolRef",
                    format!(
                        "the priority applies in every pool of the gateway, not only in `{pool}`"
                    ),
                );
            } else {
                set.report
                    .used(&o.label, "spec.poolRef", "the gateway's only pool");
            }
        }
        objective_docs.push(o.document.clone());
    }

    // Tenants.
    let tenants: Vec<_> = set
        .of(|o| match o {
            Object::TenantQuotaV1alpha1(t) => Some(t),
            _ => None,
        })
        .into_iter()
        .cloned()
        .collect();
    let mut tenancy = Tenancy::default();
    if inputs.no_tenants {
        for t in &tenants {
            set.report.not_supported(
                &t.label,
                "",
                "not rendered (--no-tenants): the gateway authenticates nobody and enforces \
                 no quota",
            );
        }
    } else if !tenants.is_empty() {
        tenancy.objects = tenants.iter().map(|t| t.document.clone()).collect();
        tenancy.objects.extend(objective_docs.iter().cloned());
        let mut issuers: Vec<&str> = tenants
            .iter()
            .filter_map(|t| t.jwt_issuer.as_deref())
            .collect();
        issuers.dedup();
        match (issuers.as_slice(), &inputs.jwks) {
            ([], _) => {}
            ([issuer], Some(jwks)) => {
                tenancy.jwt = Some(JwtProvider {
                    issuer: (*issuer).to_owned(),
                    jwks: jwks.clone(),
                });
            }
            ([_], None) => {
                for t in tenants.iter().filter(|t| t.jwt_issuer.is_some()) {
                    set.report.not_supported(
                        &t.label,
                        "spec.identity.jwtClaims",
                        "no --jwks FILE given: Envoy's jwt_authn needs the issuer's keys, so \
                         no token is verified and the tenant is known by API key only",
                    );
                }
            }
            (many, _) => bail!(
                "the tenants name several JWT issuers ({}); the gateway verifies one",
                many.join(", ")
            ),
        }
        tenancy.billing_log = inputs.billing_log.clone();
        if tenancy.billing_log.is_none() {
            for t in &tenants {
                set.report.not_supported(
                    &t.label,
                    "spec.accounting",
                    "settled, but no billing log is written (give --billing-log PATH)",
                );
            }
        }
    }

    let mut params = BootstrapParams::new(inputs.flavor, out_pools.clone());
    params.routes = specs;
    params.baseline = false;
    params.tenancy = tenancy;
    params.objectives = objective_docs;
    if let Some(module) = &inputs.module {
        params.module = Some(module.clone());
    }
    params.plugins = PluginConfigs::for_pools(&out_pools, &GatewaySettings::default());
    apply_rewrites(&mut params.plugins.router, &rewrite_docs, None)?;
    let mut router = params.plugins.router.clone();
    params.tenancy.apply_to_router(&mut router)?;
    let mut picker = params.plugins.picker.clone();
    apply_objectives(
        &mut picker,
        &picker_objectives(&params.objectives, &params.tenancy)?,
    )?;
    check_with_the_modules_parsers(&router, &picker, &params.plugins.scraper)?;
    Ok(Gateway {
        params,
        pools,
        routes,
        parents,
        section,
        router,
        picker,
    })
}

/// The peers of `pool`: the gateways (from the peers file) of the clusters that the
/// `InferencePoolImport` of its name says export it, this cluster excepted; `None` without
/// such an import.
fn pool_peers(
    pool: &InferencePool,
    imports: &[InferencePoolImport],
    inputs: &GatewayInputs,
) -> Result<Option<Peers>> {
    let Some(import) = imports
        .iter()
        .find(|i| i.meta.name == pool.meta.name && i.meta.namespace == pool.meta.namespace)
    else {
        return Ok(None);
    };
    let clusters: Vec<&String> = import
        .exporting_clusters
        .iter()
        .filter(|c| inputs.cluster.as_ref() != Some(*c))
        .collect();
    if clusters.is_empty() {
        return Ok(None);
    }
    let Some(file) = &inputs.peers else {
        bail!(
            "{}: its exporting clusters ({}) need a peers file (--peers) saying where their \
             gateways are",
            import.label,
            import.exporting_clusters.join(", ")
        );
    };
    let mut gateways = Vec::new();
    for cluster in clusters {
        let Some(gateway) = file.gateway(cluster) else {
            bail!(
                "{}: exporting cluster `{cluster}` is not in the peers file",
                import.label
            );
        };
        gateways.push(gateway);
    }
    Ok(Some(Peers {
        gateways,
        remote_pool: Some(pool.meta.name.clone()),
        spillover: Json::Null,
        mode: inputs.peer_mode,
        api_key: inputs.peer_api_key.clone(),
    }))
}

/// The pool's endpoints from `--endpoints`: `ip:port` as given, a bare IP once per target
/// port.
fn pool_endpoints(pool: &InferencePool, inputs: &GatewayInputs) -> Result<Vec<SocketAddr>> {
    let mut out = Vec::new();
    for (_, list) in inputs
        .endpoints
        .iter()
        .filter(|(n, _)| n == &pool.meta.name)
    {
        for e in list {
            if let Ok(addr) = e.parse::<SocketAddr>() {
                out.push(addr);
            } else {
                let ip: IpAddr = e
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse()
                    .with_context(|| {
                        format!(
                            "--endpoints {}: `{e}` is neither ip:port nor an IP",
                            pool.meta.name
                        )
                    })?;
                out.extend(pool.target_ports.iter().map(|&p| SocketAddr::new(ip, p)));
            }
        }
    }
    Ok(out)
}

/// Parses the three configurations with the modules' own parsers (they deny unknown fields
/// and compile tenants, rewrites and scheduling), so a configuration the modules would
/// refuse when Envoy loads them is refused here, with the module's message.
pub(crate) fn check_with_the_modules_parsers(
    router: &Json,
    picker: &Json,
    scraper: &Json,
) -> Result<()> {
    let without_role = |v: &Json| {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            m.remove("role");
        }
        v
    };
    let mut router = without_role(router);
    infergate_filters::stages::tenancy::take_tenants(&mut router)
        .map_err(|e| anyhow!("the router configuration's tenants: {e}"))?;
    infergate_filters::router::Router::from_json(router)
        .map_err(|e| anyhow!("the router configuration: {e}"))?;
    infergate_filters::picker::PickerShared::from_json(without_role(picker))
        .map_err(|e| anyhow!("the picker configuration: {e}"))?;
    infergate_filters::scraper::Scraper::from_json(without_role(scraper))
        .map_err(|e| anyhow!("the scraper configuration: {e}"))?;
    Ok(())
}
