//! From a flavour and a description of the pools to the bootstrap YAML Envoy loads.
//!
//! The templates (`envoy/config/{plain,wasm,native}.yaml`, compiled in) hold every Envoy
//! shape; this module only computes values: ports, endpoint lists, per-pool cluster names,
//! artefact paths and the plugin configurations (JSON text handed to the Wasm or native
//! module).

use super::eds::{EdsDir, Membership};
use super::epp::{apply_objectives, picker_objectives};
use super::routes::{self, RouteSpec};
use super::template::{Template, Vars};
use super::tenancy::Tenancy;
use anyhow::{bail, Context, Result};
use infergate_artefacts::Artefacts;
use serde_json::json;
use serde_yaml_ng::Value;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

/// Which gateway build Envoy runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flavor {
    /// No gateway filters: the round-robin baseline and header-driven routing only.
    Plain,
    /// The proxy-wasm module (V8 runtime).
    Wasm,
    /// The Envoy dynamic module (`libinfergate_envoy.so`).
    Native,
}

impl Flavor {
    /// Every flavour, in the order suites report them.
    pub const ALL: [Flavor; 3] = [Flavor::Plain, Flavor::Wasm, Flavor::Native];

    /// The lower-case name used on the command line and in template file names.
    pub fn name(self) -> &'static str {
        match self {
            Flavor::Plain => "plain",
            Flavor::Wasm => "wasm",
            Flavor::Native => "native",
        }
    }

    /// The template's file in the workspace, `envoy/config/<name>.yaml` (for messages).
    pub fn template_file(self) -> &'static str {
        match self {
            Flavor::Plain => "envoy/config/plain.yaml",
            Flavor::Wasm => "envoy/config/wasm.yaml",
            Flavor::Native => "envoy/config/native.yaml",
        }
    }

    /// The flavour's template (`envoy/config/<name>.yaml`), compiled in: an installed
    /// `infergate` renders without the repository, and a template edit rebuilds what uses it.
    pub fn template(self) -> &'static str {
        match self {
            Flavor::Plain => include_str!("../../../envoy/config/plain.yaml"),
            Flavor::Wasm => include_str!("../../../envoy/config/wasm.yaml"),
            Flavor::Native => include_str!("../../../envoy/config/native.yaml"),
        }
    }

    /// The built module this flavour loads: `INFERGATE_WASM` / `INFERGATE_NATIVE`, else
    /// where `cargo xtask build` puts it ([`infergate_artefacts`]). `None` for `plain`.
    pub fn artefact(self) -> Option<PathBuf> {
        match self {
            Flavor::Plain => None,
            Flavor::Wasm => Some(Artefacts::wasm_module()),
            Flavor::Native => Some(Artefacts::native_module()),
        }
    }
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Flavor {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "plain" => Ok(Flavor::Plain),
            "wasm" => Ok(Flavor::Wasm),
            "native" => Ok(Flavor::Native),
            other => bail!("unknown flavour `{other}` (expected plain, wasm or native)"),
        }
    }
}

/// What a pool does when its metrics are stale or missing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailureMode {
    /// Answer 503.
    #[default]
    FailClose,
    /// Pick by in-proxy load only.
    FailOpen,
}

impl FailureMode {
    fn wire(self) -> &'static str {
        match self {
            FailureMode::FailClose => "FailClose",
            FailureMode::FailOpen => "FailOpen",
        }
    }
}

/// One model pool: the replicas serving one base model (and its LoRA adapters).
#[derive(Clone, Debug)]
pub struct Pool {
    /// The pool's own name, which its cluster name carries instead of the base model's
    /// (two pools of one base model: `bf16`, `fp8`); `None`: named after the base model.
    pub name: Option<String>,
    /// The base model; routes match it on `x-gateway-base-model-name`.
    pub base_model: String,
    /// Adapter names served by this pool, routed here as their base model.
    pub adapters: Vec<String>,
    /// The pool's replicas: every `ip:port` (with data parallelism, every rank of every
    /// pod), which Envoy's cluster and the scraper list one by one.
    pub endpoints: Vec<SocketAddr>,
    /// Data parallelism: the ports every pod serves a rank on. Non-empty, the picker's
    /// pool lists each pod once as a bare IP with these `targetPorts` (it expands them
    /// back to every `ip:port`); `endpoints` must then be exactly every pod IP with every
    /// one of these ports. Empty: the picker lists `endpoints` as they are.
    pub target_ports: Vec<u16>,
    /// Stale-metrics behaviour.
    pub failure_mode: FailureMode,
    /// The llm-d `EndpointPickerConfig` (JSON); `null` means the picker's defaults.
    pub picker_config: serde_json::Value,
    /// Publish the pool's load for the gateways of other clusters (the InferencePool's
    /// export annotation): the picker answers `GET /infergate/pools/<pool>/metrics`.
    pub export: bool,
    /// With `export`: list the pool's members on that page too, for importers in Endpoint
    /// Mode (the picker's `exportMembers`).
    pub export_members: bool,
    /// The gateways of other clusters that serve this pool too; `None`: the pool is served
    /// here only.
    pub peers: Option<Peers>,
}

/// How requests reach a peer cluster (the picker's `peers.mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PeerMode {
    /// To the peer cluster's gateway, which picks in its own pool.
    #[default]
    Parent,
    /// Straight to a member of the peer's pool, as its gateway's export page lists them.
    Endpoint,
}

impl std::str::FromStr for PeerMode {
    type Err = String;

    /// The command lines' spelling: `parent` or `endpoint`.
    fn from_str(value: &str) -> std::result::Result<PeerMode, String> {
        match value {
            "parent" => Ok(PeerMode::Parent),
            "endpoint" => Ok(PeerMode::Endpoint),
            other => Err(format!("`{other}` is neither `parent` nor `endpoint`")),
        }
    }
}

impl PeerMode {
    /// The picker's spelling.
    pub fn wire(self) -> &'static str {
        match self {
            PeerMode::Parent => "Parent",
            PeerMode::Endpoint => "Endpoint",
        }
    }
}

/// A pool's peer clusters: their gateways, and how requests reach them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Peers {
    /// Each peer cluster's gateway listener.
    pub gateways: Vec<SocketAddr>,
    /// The pool's name on the peers, whose export page they serve
    /// (`/infergate/pools/<name>/metrics`); `None`: this pool's own `name`, else its cluster
    /// name (what an exported pool of the same layout publishes under).
    pub remote_pool: Option<String>,
    /// The picker's `peers.spillover` thresholds (JSON); `null`: its defaults.
    pub spillover: serde_json::Value,
    /// Parent Mode (through the peer gateways) or Endpoint Mode (to their members).
    pub mode: PeerMode,
    /// Parent Mode: the API key this gateway presents to peer gateways that authenticate
    /// tenants (the picker's `peers.apiKey`).
    pub api_key: Option<String>,
}

impl Pool {
    /// A pool for `base_model` on `endpoints`, no adapters, default picker, `FailClose`.
    pub fn new(base_model: impl Into<String>, endpoints: Vec<SocketAddr>) -> Self {
        Pool {
            name: None,
            base_model: base_model.into(),
            adapters: Vec::new(),
            endpoints,
            target_ports: Vec::new(),
            failure_mode: FailureMode::default(),
            picker_config: serde_json::Value::Null,
            export: false,
            export_members: false,
            peers: None,
        }
    }

    /// The Envoy cluster of this pool's peer gateways, for the pool at `index`.
    pub fn peers_cluster_name(&self, index: usize) -> String {
        format!("{}-peers", self.cluster_name(index))
    }

    /// The pod IPs of a data-parallel pool (each once, in the order of `endpoints`), when
    /// `target_ports` is set and `endpoints` is exactly every pod with every port; `None`
    /// otherwise.
    pub fn pods(&self) -> Option<Vec<std::net::IpAddr>> {
        if self.target_ports.is_empty() {
            return None;
        }
        let mut pods: Vec<std::net::IpAddr> = Vec::new();
        for e in &self.endpoints {
            if !pods.contains(&e.ip()) {
                pods.push(e.ip());
            }
        }
        let mut expected: Vec<SocketAddr> = pods
            .iter()
            .flat_map(|ip| self.target_ports.iter().map(|&p| SocketAddr::new(*ip, p)))
            .collect();
        let mut actual = self.endpoints.clone();
        expected.sort();
        actual.sort();
        (expected == actual).then_some(pods)
    }

    /// The endpoints as the picker's pool lists them: bare pod IPs for a data-parallel
    /// pool ([`Pool::pods`]), else every `ip:port`.
    fn picker_endpoints(&self) -> Vec<String> {
        match self.pods() {
            Some(pods) => pods.iter().map(ToString::to_string).collect(),
            None => self.endpoints.iter().map(ToString::to_string).collect(),
        }
    }

    /// The Envoy cluster (and picker and router pool) name of this pool at `index` of its
    /// list: [`pool_cluster_name`] of its name, else of its base model.
    pub fn cluster_name(&self, index: usize) -> String {
        pool_cluster_name(index, self.name.as_deref().unwrap_or(&self.base_model))
    }
}

/// The cluster name of every pool of `pools`, in order.
pub fn cluster_names(pools: &[Pool]) -> Vec<String> {
    pools
        .iter()
        .enumerate()
        .map(|(i, p)| p.cluster_name(i))
        .collect()
}

/// The Envoy cluster name of the `index`-th pool, named `name` (its own name, else its base
/// model): stable, and safe in stat names.
pub fn pool_cluster_name(index: usize, name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("pool-{index}-{clean}")
}

/// Gateway-wide settings that end up in the plugin configurations.
#[derive(Clone, Debug)]
pub struct GatewaySettings {
    /// Request bodies above this are answered 413 (router `bodyLimitBytes`).
    pub body_limit_bytes: u64,
    /// Scrape period (scraper `intervalMs`).
    pub scrape_interval_ms: u64,
    /// Per-scrape timeout (scraper `timeoutMs`).
    pub scrape_timeout_ms: u64,
    /// Sample age beyond which metrics count as unknown (picker pool `staleAfterMs`).
    pub stale_after_ms: u64,
}

impl Default for GatewaySettings {
    fn default() -> Self {
        GatewaySettings {
            body_limit_bytes: 4 << 20,
            scrape_interval_ms: 50,
            scrape_timeout_ms: 250,
            stale_after_ms: 1000,
        }
    }
}

/// The three JSON configurations the gateway module receives, one per role.
#[derive(Clone, Debug, PartialEq)]
pub struct PluginConfigs {
    /// Body router (`filters::router::RouterConfig` plus `role`).
    pub router: serde_json::Value,
    /// Picker (`filters::picker::PickerConfig` plus `role`).
    pub picker: serde_json::Value,
    /// Scraper (`filters::scraper::ScraperConfig` plus `role`).
    pub scraper: serde_json::Value,
}

/// The header whose value is a pool's peers cluster when the picker sends a request to a
/// peer cluster's gateway (the filters' `PEER_ROUTE`).
pub const PEER_ROUTE_HEADER: &str = "x-gateway-peer-route";

/// The cluster through which the scraper reaches `ip:port` (ORIGINAL_DST on the
/// `x-gateway-destination-endpoint` header of the call); also the scraper's default.
pub const SCRAPE_CLUSTER: &str = "infergate_scrape";

impl PluginConfigs {
    /// The configurations for `pools`, in the shapes the `filters/` configs parse (they
    /// deny unknown fields, so nothing else may be added here).
    pub fn for_pools(pools: &[Pool], settings: &GatewaySettings) -> Self {
        let endpoints_of =
            |p: &Pool| -> Vec<String> { p.endpoints.iter().map(ToString::to_string).collect() };
        let router_pools: Vec<_> = pools
            .iter()
            .enumerate()
            .map(|(i, p)| {
                json!({
                    "name": p.cluster_name(i),
                    "baseModel": p.base_model,
                    "adapters": p.adapters,
                })
            })
            .collect();
        let picker_pools: Vec<_> = pools
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut pool = json!({
                    "pool": p.cluster_name(i),
                    "baseModel": p.base_model,
                    "endpoints": p.picker_endpoints(),
                    "failureMode": p.failure_mode.wire(),
                    "staleAfterMs": settings.stale_after_ms,
                });
                if !p.picker_config.is_null() {
                    pool["eppConfig"] = p.picker_config.clone();
                }
                if p.pods().is_some() {
                    pool["targetPorts"] = json!(p.target_ports);
                }
                if p.export {
                    pool["export"] = json!(true);
                    if p.export_members {
                        pool["exportMembers"] = json!(true);
                    }
                    // Published under the pool's own name, which the importing clusters
                    // know it by (its InferencePool's), when it has one.
                    if let Some(name) = &p.name {
                        pool["exportName"] = json!(name);
                    }
                }
                if let Some(peers) = &p.peers {
                    let gateways: Vec<String> =
                        peers.gateways.iter().map(ToString::to_string).collect();
                    pool["peers"] = json!({
                        "cluster": p.peers_cluster_name(i),
                        "endpoints": gateways,
                        "mode": peers.mode.wire(),
                    });
                    if !peers.spillover.is_null() {
                        pool["peers"]["spillover"] = peers.spillover.clone();
                    }
                    if let Some(key) = &peers.api_key {
                        pool["peers"]["apiKey"] = json!(key);
                    }
                }
                pool
            })
            .collect();
        let mut endpoints: Vec<String> = pools.iter().flat_map(endpoints_of).collect();
        // Parent Mode: the peer gateways are scraped at their export page of the pool.
        // Endpoint Mode: that page lists the members, which are followed and scraped.
        let mut metrics_paths = serde_json::Map::new();
        let mut published = Vec::new();
        for (i, p) in pools.iter().enumerate() {
            let Some(peers) = &p.peers else {
                continue;
            };
            let remote = peers
                .remote_pool
                .clone()
                .or_else(|| p.name.clone())
                .unwrap_or_else(|| p.cluster_name(i));
            if peers.mode == PeerMode::Endpoint {
                let gateways: Vec<String> =
                    peers.gateways.iter().map(ToString::to_string).collect();
                published.push(json!({
                    "cluster": p.peers_cluster_name(i),
                    "gateways": gateways,
                    "path": format!("/infergate/pools/{remote}/metrics"),
                }));
                continue;
            }
            for gateway in &peers.gateways {
                endpoints.push(gateway.to_string());
                metrics_paths.insert(
                    gateway.to_string(),
                    json!(format!("/infergate/pools/{remote}/metrics")),
                );
            }
        }
        endpoints.sort();
        endpoints.dedup();
        PluginConfigs {
            router: json!({
                "role": "router",
                "bodyLimitBytes": settings.body_limit_bytes,
                "pools": router_pools,
            }),
            picker: json!({
                "role": "picker",
                "pools": picker_pools,
            }),
            scraper: {
                let mut scraper = json!({
                    "role": "scraper",
                    "cluster": SCRAPE_CLUSTER,
                    "intervalMs": settings.scrape_interval_ms,
                    "timeoutMs": settings.scrape_timeout_ms,
                    "endpoints": endpoints,
                });
                if !metrics_paths.is_empty() {
                    scraper["metricsPaths"] = serde_json::Value::Object(metrics_paths);
                }
                if !published.is_empty() {
                    scraper["published"] = json!(published);
                }
                scraper
            },
        }
    }
}

impl PluginConfigs {
    /// Turns configurations made for STATIC pool clusters into those of EDS ones: each
    /// picker pool whose list is exactly its pool's endpoints drops the list and follows
    /// its cluster's members (a data-parallel pool, or a list a caller edited, stays as
    /// it is); the scraper follows those clusters (`clusters`, members from the host's LB
    /// policy, or from Envoy's admin `/clusters` when `admin`) and keeps only the static
    /// endpoints some pool still lists. Returns the clusters followed.
    pub fn follow_clusters(&mut self, pools: &[Pool], admin: bool) -> Vec<String> {
        let names = cluster_names(pools);
        let mut following: Vec<&str> = Vec::new();
        let mut followed_endpoints: Vec<String> = Vec::new();
        let mut static_endpoints: Vec<String> = Vec::new();
        for (pool, name) in pools.iter().zip(&names) {
            let listed: Vec<String> = pool.endpoints.iter().map(ToString::to_string).collect();
            let entry = self.picker["pools"].as_array_mut().and_then(|ps| {
                ps.iter_mut()
                    .find(|p| p["pool"].as_str() == Some(name.as_str()))
            });
            let follows = pool.pods().is_none()
                && entry
                    .as_ref()
                    .is_some_and(|e| e["endpoints"] == json!(pool.picker_endpoints()));
            if follows {
                if let Some(obj) = entry.and_then(|e| e.as_object_mut()) {
                    obj.remove("endpoints");
                }
                following.push(name);
                followed_endpoints.extend(listed);
            } else {
                static_endpoints.extend(listed);
            }
        }
        let followed: Vec<String> = following.iter().map(|n| (*n).to_owned()).collect();
        let Some(scraper) = self.scraper.as_object_mut() else {
            return followed;
        };
        if let Some(list) = scraper.get_mut("endpoints").and_then(|v| v.as_array_mut()) {
            list.retain(|e| {
                let e = e.as_str().unwrap_or_default().to_owned();
                !followed_endpoints.contains(&e) || static_endpoints.contains(&e)
            });
        }
        scraper.insert("clusters".into(), json!(following));
        scraper.insert(
            "membership".into(),
            json!(if admin { "admin" } else { "host" }),
        );
        followed
    }
}

/// The picker's configuration carrying the process's scraper (`scraper`: the scraper's
/// configuration without its `role`). No bootstrap extension hosts the scraper: the native
/// module starts it from the first filter configuration that carries one, and the Wasm
/// module runs it in the worker VM elected owner (what Istio and Envoy Gateway can install).
pub fn picker_with_scraper(
    mut picker: serde_json::Value,
    scraper: &serde_json::Value,
) -> serde_json::Value {
    let mut scraper = scraper.clone();
    if let Some(obj) = scraper.as_object_mut() {
        obj.remove("role");
    }
    if let Some(obj) = picker.as_object_mut() {
        obj.insert("scraper".into(), scraper);
    }
    picker
}

/// Writes each pool's EDS file (its endpoints, every one healthy) into `params.eds`, as
/// Envoy must find them when it starts (membership `Eds`; nothing otherwise).
pub fn write_eds_files(params: &BootstrapParams) -> Result<()> {
    if params.membership != Membership::Eds {
        return Ok(());
    }
    let Some(eds) = &params.eds else {
        bail!("membership Eds needs an EDS directory");
    };
    for (pool, name) in params.pools.iter().zip(cluster_names(&params.pools)) {
        eds.write_healthy(&name, &pool.endpoints)?;
    }
    Ok(())
}

/// The connection manager's client-side timeouts (`HttpConnectionManager` fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientTimeouts {
    /// `request_timeout`: the whole request (headers and body) must arrive within this;
    /// Envoy answers 408 otherwise. Disarmed once the request is complete or the response
    /// starts, so it never cuts a stream; it stops a client trickling its body from holding
    /// a buffer of up to the body limit.
    pub request: Duration,
    /// `request_headers_timeout`: the headers alone must arrive within this.
    pub request_headers: Duration,
    /// `stream_idle_timeout`: a stream that sends nothing for this long is reset.
    pub stream_idle: Duration,
}

impl Default for ClientTimeouts {
    fn default() -> Self {
        ClientTimeouts {
            request: Duration::from_secs(60),
            request_headers: Duration::from_secs(10),
            stream_idle: Duration::from_secs(300),
        }
    }
}

/// A duration in Envoy's (protobuf JSON) text form, millisecond precision: `2.500s`.
fn envoy_duration(d: Duration) -> Value {
    text(format!("{}.{:03}s", d.as_secs(), d.subsec_millis()))
}

/// Everything a bootstrap is rendered from.
#[derive(Clone, Debug)]
pub struct BootstrapParams {
    /// Which template.
    pub flavor: Flavor,
    /// Admin port; 0 lets the kernel choose (the launcher reads it back).
    pub admin_port: u16,
    /// Gateway listener port; 0 lets the kernel choose.
    pub listener_port: u16,
    /// The address the gateway listener binds (127.0.0.1 by default; a loopback address of
    /// its own per simulated cluster).
    pub listener_address: std::net::IpAddr,
    /// The `/rr` baseline's replicas (rendered only with `baseline`).
    pub rr_endpoints: Vec<SocketAddr>,
    /// Model pools.
    pub pools: Vec<Pool>,
    /// Routes to the pools (splits, header-targeted rules); the models none of them covers
    /// get one route per pool ([`routes::resolve`]).
    pub routes: Vec<RouteSpec>,
    /// The gateway's subset hint (gateway flavours only): Envoy's `set_metadata` filter, in
    /// front of the gateway filters, writes these endpoints as `ip:port,ip:port` into
    /// `envoy.lb.subset_hint` / `x-gateway-destination-endpoint-subset`, and the picker
    /// keeps every pick inside them. Empty: no such filter.
    pub subset_hint: Vec<SocketAddr>,
    /// Module configurations (ignored by `plain`).
    pub plugins: PluginConfigs,
    /// Module path for `wasm` / `native`.
    pub module: Option<PathBuf>,
    /// The connection manager's timeouts on the client side of each stream.
    pub timeouts: ClientTimeouts,
    /// Splice the `/rr` round-robin baseline (route and cluster) in. Off renders the
    /// deployment form; the demo, the benchmarks and the tests turn it on.
    pub baseline: bool,
    /// `plain` only: put the `probe` filter of this flavour's module (`module`) in front of
    /// Envoy's router, the floor `bench overhead` measures.
    pub probe: Option<Flavor>,
    /// Tenants, JWT verification and the billing log (gateway flavours only); the default
    /// (nothing set) renders the gateway without them.
    pub tenancy: Tenancy,
    /// `InferenceObjective` objects (JSON) for the picker's `objectives`, with those of
    /// `tenancy` added (each once); none leaves the key out.
    pub objectives: Vec<serde_json::Value>,
    /// Where the pool clusters take their members from: STATIC lists (the default), or
    /// EDS files in `eds` (then the picker's pools and the scraper follow the clusters, see
    /// [`PluginConfigs::follow_clusters`]; the Wasm flavour also needs a fixed
    /// `admin_port`, which the scraper asks for the members).
    pub membership: Membership,
    /// The EDS files' directory (membership `Eds` only; [`write_eds_files`] fills it).
    pub eds: Option<EdsDir>,
    /// Envoy's active health check of every pool member (`GET /health` at this period);
    /// `None`: no health check.
    pub health_check: Option<Duration>,
    /// Keep the tenants' RPM and TPM in this global rate-limit service (gateway flavours,
    /// with tenants); `None`: in the gateway process ([`super::global_quotas`]).
    pub global_quotas: Option<super::global_quotas::GlobalQuotas>,
    /// Native only: the router and the picker as two filters even with nothing between
    /// them; `false`: one `gateway` filter unless the global rate-limit filter sits between.
    pub two_filters: bool,
}

impl BootstrapParams {
    /// Defaults for `flavor` over `pools`: kernel-chosen ports, `/rr` over every pool
    /// endpoint, plugin configs from [`PluginConfigs::for_pools`], the flavour's artefact.
    pub fn new(flavor: Flavor, pools: Vec<Pool>) -> Self {
        let mut rr: Vec<SocketAddr> = pools.iter().flat_map(|p| p.endpoints.clone()).collect();
        rr.sort();
        rr.dedup();
        BootstrapParams {
            flavor,
            admin_port: 0,
            listener_port: 0,
            listener_address: std::net::IpAddr::from([127, 0, 0, 1]),
            rr_endpoints: rr,
            plugins: PluginConfigs::for_pools(&pools, &GatewaySettings::default()),
            pools,
            routes: Vec::new(),
            subset_hint: Vec::new(),
            module: flavor.artefact(),
            timeouts: ClientTimeouts::default(),
            baseline: false,
            probe: None,
            tenancy: Tenancy::default(),
            objectives: Vec::new(),
            membership: Membership::Static,
            eds: None,
            health_check: None,
            global_quotas: None,
            two_filters: false,
        }
    }
}

fn lb_endpoints(addrs: &[SocketAddr]) -> Value {
    Value::Sequence(
        addrs
            .iter()
            .map(|a| {
                to_yaml(&json!({"endpoint": {"address": {"socket_address": {
                    "address": a.ip().to_string(), "port_value": a.port()}}}}))
            })
            .collect(),
    )
}

fn to_yaml(v: &serde_json::Value) -> Value {
    serde_yaml_ng::to_value(v).unwrap_or(Value::Null)
}

fn text(s: impl Into<String>) -> Value {
    Value::String(s.into())
}

/// This gateway's own listener as its peers cluster lists it.
fn loopback(params: &BootstrapParams) -> SocketAddr {
    SocketAddr::new(params.listener_address, params.listener_port)
}

/// Every picker pool with peers gets this gateway's own listener as its `loopback` (the
/// port is known only when the bootstrap is rendered).
fn set_loopback(picker: &mut serde_json::Value, listener: SocketAddr) {
    let Some(pools) = picker["pools"].as_array_mut() else {
        return;
    };
    for pool in pools {
        let peers = pool.get_mut("peers").and_then(|p| p.as_object_mut());
        // Endpoint Mode picks have no fallback: no loopback.
        if let Some(peers) = peers.filter(|p| p.get("mode") != Some(&json!("Endpoint"))) {
            peers.insert("loopback".into(), json!(listener.to_string()));
        }
    }
}

/// What the peers cluster and route of a pool are made of, beside the template.
pub struct PeerResources<'a> {
    /// The pool clusters' policy (Parent Mode's peers cluster takes it).
    pub lb_policy: &'a Value,
    /// The pool routes' retry policy.
    pub retry_policy: &'a Value,
    /// This gateway's own listener, the last host of Parent Mode's peers cluster (`None`:
    /// not known where the gateway is rendered).
    pub loopback: Option<SocketAddr>,
}

impl PeerResources<'_> {
    /// The Envoy cluster of pool `index`'s peers and the route the picker re-matches on
    /// [`PEER_ROUTE_HEADER`] to reach it (to be placed ahead of the pool routes). Parent
    /// Mode: the peer gateways (and the loopback) in a STATIC cluster on the pools' policy,
    /// no health check (the picker drops a peer whose export page stops answering).
    /// Endpoint Mode: an ORIGINAL_DST cluster for the members the peers publish.
    pub fn render(&self, t: &Template, pool: &Pool, index: usize) -> Result<(Value, Value)> {
        let Some(peers) = &pool.peers else {
            bail!("pool {index} has no peers");
        };
        let name = pool.peers_cluster_name(index);
        let mut vars = Vars::new();
        vars.insert("cluster".into(), text(name.clone()));
        let cluster = if peers.mode == PeerMode::Endpoint {
            t.prototype("peer_members_cluster", &vars)?
        } else {
            let mut hosts = peers.gateways.clone();
            hosts.extend(self.loopback);
            vars.insert("lb_endpoints".into(), lb_endpoints(&hosts));
            vars.insert("lb_policy".into(), self.lb_policy.clone());
            vars.insert("health_checks".into(), Value::Sequence(Vec::new()));
            t.prototype("pool_cluster", &vars)?
        };
        let mut header = Vars::new();
        header.insert("header".into(), text(PEER_ROUTE_HEADER));
        header.insert("value".into(), text(name.clone()));
        let mut rvars = Vars::new();
        rvars.insert("route_name".into(), text(name.clone()));
        rvars.insert("model".into(), text(pool.base_model.clone()));
        rvars.insert("retry_policy".into(), self.retry_policy.clone());
        rvars.insert("cluster".into(), text(name));
        rvars.insert(
            "header_matches".into(),
            Value::Sequence(vec![t.prototype("header_match", &header)?]),
        );
        Ok((cluster, t.prototype("pool_route", &rvars)?))
    }
}

/// Renders `params` with the template text `template` into bootstrap YAML.
pub fn render_with(template: &str, params: &BootstrapParams) -> Result<String> {
    let t = Template::parse(template)?;
    if params.pools.is_empty() {
        bail!("at least one pool is needed");
    }
    for (i, pool) in params.pools.iter().enumerate() {
        if !pool.target_ports.is_empty() && pool.pods().is_none() {
            bail!(
                "pool {i} ({}): targetPorts {:?} need every endpoint to be a pod IP with \
                 each of those ports",
                pool.base_model,
                pool.target_ports
            );
        }
    }
    let mut routes = Vec::new();
    let mut clusters = Vec::new();
    // The gateway templates retry a reset on the next endpoint of the picker's list; plain
    // (clusters on the client's own header) has no retry policy to give.
    let retry_policy = if t.has_prototype("pool_retry_policy") {
        t.prototype("pool_retry_policy", &Vars::new())?
    } else {
        Value::Null
    };
    let names = cluster_names(&params.pools);
    let module = params
        .module
        .as_deref()
        .map(Path::to_string_lossy)
        .unwrap_or_default();
    // The pool clusters' policy (gateway templates; plain's clusters carry their own).
    let lb_policy = if t.has_prototype("pool_lb_policy") {
        let mut lvars = Vars::new();
        lvars.insert("native_module".into(), text(module.clone()));
        t.prototype("pool_lb_policy", &lvars)?
    } else {
        Value::Null
    };
    let mut health_checks = Vec::new();
    if let Some(period) = params.health_check {
        if !t.has_prototype("pool_health_check") {
            bail!("an active health check needs the wasm or native flavour");
        }
        let mut hvars = Vars::new();
        hvars.insert("interval".into(), envoy_duration(period));
        health_checks.push(t.prototype("pool_health_check", &hvars)?);
    }
    let eds = match params.membership {
        Membership::Static => None,
        Membership::Eds => {
            if !t.has_prototype("pool_cluster_eds") {
                bail!("EDS membership needs the wasm or native flavour");
            }
            let Some(eds) = &params.eds else {
                bail!("EDS membership needs an EDS directory (BootstrapParams::eds)");
            };
            Some(eds)
        }
    };
    for (pool, name) in params.pools.iter().zip(&names) {
        let mut vars = Vars::new();
        vars.insert("cluster".into(), text(name.clone()));
        vars.insert("lb_endpoints".into(), lb_endpoints(&pool.endpoints));
        vars.insert("lb_policy".into(), lb_policy.clone());
        vars.insert(
            "health_checks".into(),
            Value::Sequence(health_checks.clone()),
        );
        let proto = match eds {
            None => "pool_cluster",
            Some(eds) => {
                vars.insert(
                    "eds_path".into(),
                    text(eds.path(name).to_string_lossy().into_owned()),
                );
                vars.insert(
                    "eds_dir".into(),
                    text(eds.dir().to_string_lossy().into_owned()),
                );
                "pool_cluster_eds"
            }
        };
        clusters.push(t.prototype(proto, &vars)?);
    }
    // Each pool's peers: their cluster, and the route the picker re-matches on
    // `x-gateway-peer-route` to reach it, ahead of the pools' routes.
    let mut peer_routes = Vec::new();
    for (i, pool) in params.pools.iter().enumerate() {
        let Some(peers) = &pool.peers else {
            continue;
        };
        if !t.has_prototype("pool_lb_policy") {
            bail!("peer clusters need the wasm or native flavour");
        }
        if peers.mode == PeerMode::Parent && params.listener_port == 0 {
            bail!(
                "pool {i} ({}): peer clusters need a fixed listener port (a peer that \
                 refuses a request leaves it to this gateway's own listener)",
                pool.base_model
            );
        }
        let resources = PeerResources {
            lb_policy: &lb_policy,
            retry_policy: &retry_policy,
            loopback: Some(loopback(params)),
        };
        let (cluster, route) = resources.render(&t, pool, i)?;
        clusters.push(cluster);
        peer_routes.push(route);
    }
    routes.extend(peer_routes);
    // Wasm with EDS: the scraper reads the members from admin `/clusters` through this.
    let mut admin_clusters = Vec::new();
    if eds.is_some() && t.has_prototype("admin_cluster") {
        if params.admin_port == 0 {
            bail!(
                "the wasm flavour with EDS membership needs a fixed admin port (its scraper \
                 reads the members from admin /clusters)"
            );
        }
        let mut avars = Vars::new();
        avars.insert("admin_port".into(), Value::from(params.admin_port));
        admin_clusters.push(t.prototype("admin_cluster", &avars)?);
    }
    for route in routes::resolve(&params.pools, &params.routes)? {
        routes.push(routes::render(&t, &route, &names, &retry_policy)?);
    }
    let json_text = |v: &serde_json::Value| text(v.to_string());
    let mut vars = Vars::new();
    vars.insert("admin_port".into(), Value::from(params.admin_port));
    vars.insert("listener_port".into(), Value::from(params.listener_port));
    vars.insert(
        "listener_address".into(),
        text(params.listener_address.to_string()),
    );
    vars.insert("pool_routes".into(), Value::Sequence(routes));
    vars.insert("pool_clusters".into(), Value::Sequence(clusters));
    vars.insert("admin_clusters".into(), Value::Sequence(admin_clusters));
    vars.insert(
        "stream_idle_timeout".into(),
        envoy_duration(params.timeouts.stream_idle),
    );
    vars.insert(
        "request_timeout".into(),
        envoy_duration(params.timeouts.request),
    );
    vars.insert(
        "request_headers_timeout".into(),
        envoy_duration(params.timeouts.request_headers),
    );
    let (mut baseline_routes, mut baseline_clusters) = (Vec::new(), Vec::new());
    if params.baseline {
        let mut bvars = Vars::new();
        bvars.insert("rr_lb_endpoints".into(), lb_endpoints(&params.rr_endpoints));
        baseline_routes.push(t.prototype("baseline_route", &bvars)?);
        baseline_clusters.push(t.prototype("baseline_cluster", &bvars)?);
    }
    vars.insert("baseline_routes".into(), Value::Sequence(baseline_routes));
    vars.insert(
        "baseline_clusters".into(),
        Value::Sequence(baseline_clusters),
    );
    if params.flavor == Flavor::Plain && !params.tenancy.is_empty() {
        bail!("tenants, JWT verification and the billing log need the wasm or native flavour");
    }
    let mut subset_filters = Vec::new();
    if !params.subset_hint.is_empty() {
        if !t.has_prototype("subset_hint_filter") {
            bail!("a subset hint needs the wasm or native flavour");
        }
        let list: Vec<String> = params.subset_hint.iter().map(ToString::to_string).collect();
        let mut svars = Vars::new();
        svars.insert("subset".into(), text(list.join(",")));
        subset_filters.push(t.prototype("subset_hint_filter", &svars)?);
    }
    vars.insert(
        "subset_hint_filters".into(),
        Value::Sequence(subset_filters),
    );
    let splices = params.tenancy.splices(&t)?;
    vars.insert("jwt_filters".into(), Value::Sequence(splices.jwt_filters));
    vars.insert("billing_logs".into(), Value::Sequence(splices.billing_logs));
    let global = super::global_quotas::GlobalQuotas::splices(params.global_quotas.as_ref(), &t)?;
    vars.insert(
        "global_quota_filters".into(),
        Value::Sequence(global.filters.clone()),
    );
    vars.insert(
        "global_quota_clusters".into(),
        Value::Sequence(global.clusters),
    );
    let mut router = params.plugins.router.clone();
    params.tenancy.apply_to_router(&mut router)?;
    super::global_quotas::GlobalQuotas::apply_to_router(
        params.global_quotas.as_ref(),
        &mut router,
    )?;
    vars.insert("router_config".into(), json_text(&router));
    // Wasm: the filter applying the router's header edits after the buffer filter.
    vars.insert(
        "headers_config".into(),
        json_text(&json!({"role": "headers"})),
    );
    let mut plugins = params.plugins.clone();
    if eds.is_some() {
        let _ = plugins.follow_clusters(&params.pools, params.flavor == Flavor::Wasm);
    }
    let mut picker = plugins.picker.clone();
    set_loopback(&mut picker, loopback(params));
    apply_objectives(
        &mut picker,
        &picker_objectives(&params.objectives, &params.tenancy)?,
    )?;
    let picker = picker_with_scraper(picker, &plugins.scraper);
    vars.insert("picker_config".into(), json_text(&picker));
    // Native: the gateway's filters (see the template's `gateway_filter`).
    let mut gateway_filters = Vec::new();
    if t.has_prototype("gateway_filter") {
        let mut gvars = Vars::new();
        gvars.insert("native_module".into(), text(module.clone()));
        gvars.insert("router_config".into(), json_text(&router));
        gvars.insert("picker_config".into(), json_text(&picker));
        gvars.insert(
            "gateway_config".into(),
            json_text(&serde_json::json!({"router": router, "picker": picker})),
        );
        if global.filters.is_empty() && !params.two_filters {
            gateway_filters.push(t.prototype("gateway_filter", &gvars)?);
        } else {
            gateway_filters.push(t.prototype("router_filter", &gvars)?);
            gateway_filters.extend(global.filters.iter().cloned());
            gateway_filters.push(t.prototype("picker_filter", &gvars)?);
        }
    }
    vars.insert("gateway_filters".into(), Value::Sequence(gateway_filters));
    vars.insert("scraper_config".into(), json_text(&plugins.scraper));
    let mut probes = Vec::new();
    if let Some(probe) = params.probe {
        if params.flavor != Flavor::Plain || probe == Flavor::Plain {
            bail!("a probe is a wasm or native filter on the plain flavour");
        }
        let mut pvars = Vars::new();
        pvars.insert("module".into(), text(module.clone()));
        probes.push(t.prototype(&format!("probe_{}", probe.name()), &pvars)?);
    }
    vars.insert("probe_filters".into(), Value::Sequence(probes));
    vars.insert("wasm_module".into(), text(module.clone()));
    vars.insert("native_module".into(), text(module));
    let body = t.render(&vars)?;
    serde_yaml_ng::to_string(&body).context("serialising the bootstrap")
}

/// Renders `params` with its flavour's template ([`Flavor::template`]).
pub fn render(params: &BootstrapParams) -> Result<String> {
    render_with(params.flavor.template(), params)
        .with_context(|| format!("rendering {}", params.flavor.template_file()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn two_pools() -> Vec<Pool> {
        vec![
            Pool::new("meta/llama-3", vec![addr(8001), addr(8002)]),
            Pool::new("qwen", vec![addr(8003)]),
        ]
    }

    fn with_baseline(flavor: Flavor) -> BootstrapParams {
        BootstrapParams {
            baseline: true,
            ..BootstrapParams::new(flavor, two_pools())
        }
    }

    fn hcm(v: &Value) -> &Value {
        &v["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    }

    #[test]
    fn every_template_renders_with_all_pools_and_no_placeholder_left() {
        for flavor in Flavor::ALL {
            let yaml = render(&with_baseline(flavor)).unwrap();
            assert!(!yaml.contains("{{"), "{flavor}: placeholder left");
            assert!(!yaml.contains("x-infergate"), "{flavor}: prototypes leaked");
            let v: Value = serde_yaml_ng::from_str(&yaml).unwrap();
            let clusters = v["static_resources"]["clusters"].as_sequence().unwrap();
            let names: Vec<&str> = clusters.iter().filter_map(|c| c["name"].as_str()).collect();
            assert!(
                names.contains(&"pool-0-meta_llama-3"),
                "{flavor}: {names:?}"
            );
            assert!(names.contains(&"pool-1-qwen"), "{flavor}: {names:?}");
            let rr = &clusters.iter().find(|c| c["name"] == "rr").unwrap()["load_assignment"];
            assert_eq!(
                rr["endpoints"][0]["lb_endpoints"]
                    .as_sequence()
                    .unwrap()
                    .len(),
                3
            );
            assert!(yaml.contains("x-gateway-base-model-name"));
        }
    }

    /// Routes never time a stream out; the connection manager bounds only how long the
    /// request may take to arrive (the default, and what a caller sets).
    #[test]
    fn streams_run_unbounded_and_requests_must_arrive_in_bounded_time() {
        for flavor in Flavor::ALL {
            let yaml = render(&with_baseline(flavor)).unwrap();
            let v: Value = serde_yaml_ng::from_str(&yaml).unwrap();
            let hcm = hcm(&v);
            assert_eq!(hcm["request_timeout"].as_str(), Some("60.000s"), "{flavor}");
            assert_eq!(
                hcm["request_headers_timeout"].as_str(),
                Some("10.000s"),
                "{flavor}"
            );
            assert_eq!(
                hcm["stream_idle_timeout"].as_str(),
                Some("300.000s"),
                "{flavor}"
            );
            let mut short = with_baseline(flavor);
            short.timeouts.request = Duration::from_millis(1500);
            let short = serde_yaml_ng::from_str::<Value>(&render(&short).unwrap()).unwrap();
            assert_eq!(
                self::hcm(&short)["request_timeout"].as_str(),
                Some("1.500s")
            );
            let routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
                .as_sequence()
                .unwrap();
            assert!(routes.len() >= 3, "{flavor}: baseline + one route per pool");
            for r in routes {
                assert_eq!(
                    r["route"]["timeout"].as_str(),
                    Some("0s"),
                    "{flavor}: {r:?}"
                );
            }
        }
    }

    #[test]
    fn plugin_configs_arrive_as_json_text_with_their_role() {
        let yaml = render(&BootstrapParams::new(Flavor::Wasm, two_pools())).unwrap();
        let v: Value = serde_yaml_ng::from_str(&yaml).unwrap();
        let picker = picker_config(&v);
        assert_eq!(picker["role"], "picker");
        assert_eq!(picker["pools"][1]["endpoints"][0], "127.0.0.1:8003");
        assert_eq!(picker["pools"][1]["pool"], "pool-1-qwen");
        // No bootstrap extension (Istio installs none): the picker carries the scraper, and
        // the pickers' VMs elect the one that runs it.
        assert!(v.get("bootstrap_extensions").is_none());
        assert_eq!(picker["scraper"]["cluster"], "infergate_scrape");
        assert!(picker["scraper"].get("role").is_none());
    }

    /// Native: no bootstrap extension (Istio installs none); the scraper's configuration,
    /// without its `role`, travels in the picker's: the `gateway` filter's picker part, or
    /// the `picker` filter of the two-filter form.
    #[test]
    fn native_has_no_bootstrap_extension_and_the_picker_carries_the_scraper() {
        for two_filters in [false, true] {
            let params = BootstrapParams {
                two_filters,
                ..with_baseline(Flavor::Native)
            };
            let yaml = render(&params).unwrap();
            let v: Value = serde_yaml_ng::from_str(&yaml).unwrap();
            assert!(v.get("bootstrap_extensions").is_none(), "{yaml}");
            assert!(!yaml.contains("envoy.bootstrap"), "{yaml}");
            let picker = picker_config(&v);
            let scraper = &picker["scraper"];
            assert!(scraper.get("role").is_none(), "{scraper}");
            assert_eq!(scraper["cluster"], SCRAPE_CLUSTER);
            assert_eq!(
                scraper["endpoints"],
                json!(["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"])
            );
            infergate_filters::scraper::Scraper::from_json(scraper.clone()).unwrap();
            if !two_filters {
                let gateway = filter_config(&v, "infergate.gateway");
                assert!(
                    gateway.get("scraper").is_none(),
                    "only the picker part has it"
                );
            }
        }
    }

    /// The contract with the modules: what the launcher generates is what `filters/`
    /// parses (its configs deny unknown fields, so any drift fails here).
    #[test]
    fn plugin_configs_parse_with_the_filters_config_types() {
        use infergate_filters::picker::PickerConfig;
        use infergate_filters::router::{ModelTable, RouterConfig};
        use infergate_filters::scraper::Scraper;
        let mut pools = two_pools();
        pools[1].adapters = vec!["qwen-lora".into()];
        pools[1].failure_mode = FailureMode::FailOpen;
        let c = PluginConfigs::for_pools(&pools, &GatewaySettings::default());
        let without_role = |v: &serde_json::Value| {
            let mut v = v.clone();
            assert!(v.as_object_mut().unwrap().remove("role").is_some());
            v
        };
        let router: RouterConfig = serde_json::from_value(without_role(&c.router)).unwrap();
        assert_eq!(router.body_limit_bytes, 4 << 20);
        ModelTable::build(&router.pools).unwrap();
        let picker = PickerConfig::from_json(without_role(&c.picker)).unwrap();
        picker.validate().unwrap();
        assert_eq!(picker.pools.len(), 2);
        assert_eq!(
            picker.pools[0].endpoints,
            ["127.0.0.1:8001", "127.0.0.1:8002"]
        );
        assert_eq!(
            picker.pools[1].failure_mode,
            infergate_filters::picker::FailureMode::FailOpen
        );
        let scraper = Scraper::from_json(without_role(&c.scraper)).unwrap();
        assert_eq!(scraper.tick_period_ms(), 50);
    }

    /// Both gateway templates route to a pool the same way: a STATIC cluster of exactly the
    /// pool's endpoints on Envoy's override_host policy (the `envoy.lb` metadata first, then
    /// the header; round robin past the list), and a pool route that retries a reset once.
    #[test]
    fn gateway_pool_clusters_take_the_pickers_list_and_routes_retry_once() {
        for flavor in [Flavor::Wasm, Flavor::Native] {
            let v: Value =
                serde_yaml_ng::from_str(&render(&with_baseline(flavor)).unwrap()).unwrap();
            let clusters = v["static_resources"]["clusters"].as_sequence().unwrap();
            let pool = clusters
                .iter()
                .find(|c| c["name"] == "pool-0-meta_llama-3")
                .unwrap();
            assert_eq!(pool["type"].as_str(), Some("STATIC"), "{flavor}");
            assert!(pool.get("original_dst_lb_config").is_none(), "{flavor}");
            assert!(pool.get("lb_policy").is_none(), "{flavor}");
            let hosts: Vec<u64> = pool["load_assignment"]["endpoints"][0]["lb_endpoints"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|e| {
                    e["endpoint"]["address"]["socket_address"]["port_value"]
                        .as_u64()
                        .unwrap()
                })
                .collect();
            assert_eq!(hosts, [8001, 8002], "{flavor}");
            let policy = &pool["load_balancing_policy"]["policies"][0]["typed_extension_config"];
            assert_eq!(
                policy["name"].as_str(),
                Some("envoy.load_balancing_policies.override_host")
            );
            let config = &policy["typed_config"];
            let sources = config["override_host_sources"].as_sequence().unwrap();
            assert_eq!(sources.len(), 2, "{flavor}");
            assert_eq!(sources[0]["metadata"]["key"].as_str(), Some("envoy.lb"));
            assert_eq!(
                sources[0]["metadata"]["path"][0]["key"].as_str(),
                Some("x-gateway-destination-endpoint")
            );
            assert_eq!(
                sources[1]["header"].as_str(),
                Some("x-gateway-destination-endpoint")
            );
            // Past the list: round robin (wasm), this module's round robin over the healthy
            // members, which also reports the cluster's members to the scraper (native).
            let fallback = &config["fallback_policy"]["policies"][0]["typed_extension_config"];
            match flavor {
                Flavor::Native => {
                    assert_eq!(fallback["name"].as_str(), Some("infergate.membership"));
                    let t = &fallback["typed_config"];
                    assert_eq!(t["lb_policy_name"].as_str(), Some("infergate-membership"));
                    assert_eq!(
                        t["dynamic_module_config"]["module"]["local"]["filename"].as_str(),
                        with_baseline(flavor)
                            .module
                            .as_deref()
                            .and_then(Path::to_str),
                    );
                }
                _ => assert_eq!(
                    fallback["name"].as_str(),
                    Some("envoy.load_balancing_policies.round_robin"),
                    "{flavor}"
                ),
            }
            assert!(
                pool["health_checks"].as_sequence().unwrap().is_empty(),
                "{flavor}: no health check unless asked"
            );
            let routes = hcm(&v)["route_config"]["virtual_hosts"][0]["routes"]
                .as_sequence()
                .unwrap();
            for r in routes {
                let retry = &r["route"]["retry_policy"];
                if r["name"] == "baseline" {
                    assert!(retry.is_null(), "{flavor}: the baseline never retries");
                    continue;
                }
                assert_eq!(
                    retry["retry_on"].as_str(),
                    Some("reset,connect-failure,refused-stream"),
                    "{flavor}"
                );
                assert_eq!(retry["num_retries"].as_u64(), Some(1), "{flavor}");
                assert_eq!(
                    retry["retry_host_predicate"][0]["name"].as_str(),
                    Some("envoy.retry_host_predicates.previous_hosts")
                );
            }
            let scrape = clusters
                .iter()
                .find(|c| c["name"] == SCRAPE_CLUSTER)
                .unwrap();
            assert_eq!(scrape["type"].as_str(), Some("ORIGINAL_DST"), "{flavor}");
        }
    }

    /// Two pools of one base model (a canary), split 90/10 on the sticky key, with a
    /// header-targeted rule: the header rule comes first, the split names both clusters with
    /// their weights and `header_name: x-gateway-split-key`; the picker's and the router's
    /// pool names are the cluster names; the other model keeps its one route. A
    /// per-request split has no `header_name`.
    #[test]
    fn splits_and_header_rules_render_as_weighted_clusters_in_front_of_one_picker_pool_each() {
        let a = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        let mut canary = Pool::new("llama", vec![a(8002)]);
        canary.name = Some("llama-fp8".into());
        let pools = vec![
            Pool::new("llama", vec![a(8001)]),
            canary,
            Pool::new("qwen", vec![a(8003)]),
        ];
        for flavor in Flavor::ALL {
            let mut params = BootstrapParams::new(flavor, pools.clone());
            params.routes = vec![
                RouteSpec::split("llama", &[(0, 90), (1, 10)]).sticky(),
                RouteSpec::to("llama", 1).when_header("x-canary", "fp8"),
            ];
            let v: Value = serde_yaml_ng::from_str(&render(&params).unwrap()).unwrap();
            let routes = hcm(&v)["route_config"]["virtual_hosts"][0]["routes"]
                .as_sequence()
                .unwrap();
            let names: Vec<&str> = routes.iter().filter_map(|r| r["name"].as_str()).collect();
            assert_eq!(
                names[..3],
                ["pool:llama:x-canary=fp8", "split:llama", "pool:qwen"],
                "{flavor}"
            );
            let header = routes[0]["match"]["headers"].as_sequence().unwrap();
            assert_eq!(header.len(), 2, "{flavor}: the model and the canary header");
            assert_eq!(header[1]["name"].as_str(), Some("x-canary"));
            assert_eq!(header[1]["string_match"]["exact"].as_str(), Some("fp8"));
            assert_eq!(
                routes[0]["route"]["cluster"].as_str(),
                Some("pool-1-llama-fp8")
            );
            let split = &routes[1]["route"]["weighted_clusters"];
            assert_eq!(split["header_name"].as_str(), Some("x-gateway-split-key"));
            let weighted: Vec<(String, u64)> = split["clusters"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|c| {
                    (
                        c["name"].as_str().unwrap().to_owned(),
                        c["weight"].as_u64().unwrap(),
                    )
                })
                .collect();
            assert_eq!(
                weighted,
                [
                    ("pool-0-llama".to_owned(), 90),
                    ("pool-1-llama-fp8".to_owned(), 10)
                ]
            );
            assert_eq!(routes[1]["route"]["timeout"].as_str(), Some("0s"));
            if flavor != Flavor::Plain {
                assert_eq!(
                    routes[1]["route"]["retry_policy"]["num_retries"].as_u64(),
                    Some(1)
                );
                let picker = picker_config(&v);
                let router = router_config(&v);
                for (i, cluster) in ["pool-0-llama", "pool-1-llama-fp8", "pool-2-qwen"]
                    .iter()
                    .enumerate()
                {
                    assert_eq!(picker["pools"][i]["pool"], *cluster, "{flavor}");
                    assert_eq!(router["pools"][i]["name"], *cluster, "{flavor}");
                }
                assert_eq!(picker["pools"][1]["baseModel"], "llama");
            }
            let clusters: Vec<&str> = v["static_resources"]["clusters"]
                .as_sequence()
                .unwrap()
                .iter()
                .filter_map(|c| c["name"].as_str())
                .collect();
            assert!(clusters.contains(&"pool-1-llama-fp8"), "{flavor}");

            params.routes = vec![RouteSpec::split("llama", &[(0, 1), (1, 1)])];
            let v: Value = serde_yaml_ng::from_str(&render(&params).unwrap()).unwrap();
            let split = &hcm(&v)["route_config"]["virtual_hosts"][0]["routes"][0]["route"];
            assert!(split["weighted_clusters"].get("header_name").is_none());
            params.routes.clear();
            assert!(render(&params).is_err(), "{flavor}: llama needs a route");
        }
    }

    /// A subset hint renders Envoy's `set_metadata` in front of every gateway filter (the
    /// JWT filter included), writing the list into `envoy.lb.subset_hint`; without one there
    /// is no such filter; plain refuses it.
    #[test]
    fn a_subset_hint_is_set_metadata_in_front_of_the_gateway_filters() {
        for flavor in [Flavor::Wasm, Flavor::Native] {
            let v: Value =
                serde_yaml_ng::from_str(&render(&with_baseline(flavor)).unwrap()).unwrap();
            assert!(!filter_names(&v).contains(&"infergate.subset_hint".to_string()));
            let mut params = with_baseline(flavor);
            params.subset_hint = vec![addr(8001), addr(8003)];
            params.tenancy = tenancy();
            let v: Value = serde_yaml_ng::from_str(&render(&params).unwrap()).unwrap();
            let names = filter_names(&v);
            assert_eq!(names[0], "infergate.subset_hint", "{flavor}: {names:?}");
            let c = &hcm(&v)["http_filters"][0]["typed_config"];
            assert_eq!(
                c["@type"].as_str(),
                Some("type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config")
            );
            let m = &c["metadata"][0];
            assert_eq!(
                m["metadata_namespace"].as_str(),
                Some("envoy.lb.subset_hint")
            );
            assert_eq!(
                m["value"]["x-gateway-destination-endpoint-subset"].as_str(),
                Some("127.0.0.1:8001,127.0.0.1:8003"),
                "{flavor}"
            );
        }
        let mut plain = with_baseline(Flavor::Plain);
        plain.subset_hint = vec![addr(8001)];
        assert!(render(&plain).is_err());
    }

    /// Data parallelism: two pods with two ranks each. The picker's pool lists each pod
    /// once (bare IP) with `targetPorts`, which the picker's own expansion turns back into
    /// the four endpoints; Envoy's cluster and the scraper list all four. Endpoints that
    /// are not every pod with every port are refused.
    #[test]
    fn a_data_parallel_pool_gives_the_picker_pods_and_ports_and_envoy_every_rank() {
        let ep = |ip: [u8; 4], port: u16| SocketAddr::from((ip, port));
        let mut pool = Pool::new(
            "m",
            vec![
                ep([127, 0, 0, 2], 9000),
                ep([127, 0, 0, 2], 9001),
                ep([127, 0, 0, 3], 9000),
                ep([127, 0, 0, 3], 9001),
            ],
        );
        pool.target_ports = vec![9000, 9001];
        let c = PluginConfigs::for_pools(std::slice::from_ref(&pool), &GatewaySettings::default());
        let picker = &c.picker["pools"][0];
        assert_eq!(picker["endpoints"], json!(["127.0.0.2", "127.0.0.3"]));
        assert_eq!(picker["targetPorts"], json!([9000, 9001]));
        let expanded = infergate_filters::picker::config::expand_target_ports(
            &["127.0.0.2".into(), "127.0.0.3".into()],
            &[9000, 9001],
        )
        .unwrap();
        let mut all: Vec<String> = pool.endpoints.iter().map(ToString::to_string).collect();
        assert_eq!(expanded, all);
        all.sort();
        assert_eq!(c.scraper["endpoints"], json!(all));
        let v: Value = serde_yaml_ng::from_str(
            &render(&BootstrapParams::new(Flavor::Native, vec![pool.clone()])).unwrap(),
        )
        .unwrap();
        let cluster = v["static_resources"]["clusters"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "pool-0-m")
            .unwrap();
        let hosts = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
            .as_sequence()
            .unwrap();
        assert_eq!(hosts.len(), 4);
        pool.endpoints.pop();
        assert!(pool.pods().is_none());
        assert!(render(&BootstrapParams::new(Flavor::Native, vec![pool])).is_err());
    }

    /// Two config gaps the end-to-end suite found: bodies up to the router's limit must get
    /// past Envoy's stream buffer, and the Wasm flavour needs Envoy to copy the picked
    /// endpoint into `envoy.lb` metadata (proxy-wasm cannot set metadata).
    #[test]
    fn gateway_templates_buffer_past_the_body_limit_and_wasm_copies_the_pick_to_metadata() {
        let limit = GatewaySettings::default().body_limit_bytes;
        for flavor in [Flavor::Wasm, Flavor::Native] {
            let yaml = render(&BootstrapParams::new(flavor, two_pools())).unwrap();
            let v: Value = serde_yaml_ng::from_str(&yaml).unwrap();
            let listener = &v["static_resources"]["listeners"][0];
            let buffer = listener["per_connection_buffer_limit_bytes"]
                .as_u64()
                .unwrap();
            assert!(
                buffer > limit,
                "{flavor}: buffer {buffer} <= body limit {limit}"
            );
        }
        let yaml = render(&BootstrapParams::new(Flavor::Wasm, two_pools())).unwrap();
        let v: Value = serde_yaml_ng::from_str(&yaml).unwrap();
        let filters = v["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
            ["typed_config"]["http_filters"]
            .as_sequence()
            .unwrap();
        let names: Vec<&str> = filters.iter().filter_map(|f| f["name"].as_str()).collect();
        let at = |n: &str| names.iter().position(|x| *x == n).unwrap();
        let copy = at("infergate.destination_metadata");
        assert!(at("infergate.picker") < copy && copy < at("envoy.filters.http.router"));
        // The route is resolved again between the body router and the picker, so the
        // picker's `xds.cluster_name` is the cluster the request's route chose.
        // Envoy's buffer filter holds the headers while the router reads the body, and the
        // `headers` filter applies the router's edits before the route is resolved again.
        assert_eq!(at("infergate.buffer"), at("infergate.router") + 1);
        assert_eq!(at("infergate.headers"), at("infergate.buffer") + 1);
        assert_eq!(at("infergate.route_refresh"), at("infergate.headers") + 1);
        assert_eq!(at("infergate.route_refresh") + 1, at("infergate.picker"));
        let rule = &filters[copy]["typed_config"]["request_rules"][0];
        assert_eq!(rule["header"], "x-gateway-destination-endpoint");
        assert_eq!(rule["on_header_present"]["metadata_namespace"], "envoy.lb");
        assert_eq!(
            rule["on_header_present"]["key"],
            "x-gateway-destination-endpoint"
        );
    }

    /// `plain` has no gateway filter; with a probe it has exactly that module's probe filter
    /// in front of Envoy's router (the floor of `bench overhead`).
    #[test]
    fn plain_renders_a_probe_filter_only_when_asked() {
        let names = |params: &BootstrapParams| -> Vec<String> {
            let v: Value = serde_yaml_ng::from_str(&render(params).unwrap()).unwrap();
            v["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
                ["http_filters"]
                .as_sequence()
                .unwrap()
                .iter()
                .filter_map(|f| f["name"].as_str().map(str::to_owned))
                .collect()
        };
        let mut params = BootstrapParams::new(Flavor::Plain, two_pools());
        assert_eq!(names(&params), ["envoy.filters.http.router"]);
        for probe in [Flavor::Wasm, Flavor::Native] {
            params.probe = Some(probe);
            params.module = Some(PathBuf::from("/m/module"));
            assert_eq!(
                names(&params),
                ["infergate.probe", "envoy.filters.http.router"]
            );
            let yaml = render(&params).unwrap();
            assert!(yaml.contains("/m/module"), "{yaml}");
        }
        let mut wrong = BootstrapParams::new(Flavor::Wasm, two_pools());
        wrong.probe = Some(Flavor::Wasm);
        assert!(render(&wrong).is_err());
    }

    /// Every upstream an LLM stream can take (each pool cluster, the baseline) holds
    /// thousands of concurrent streams: Envoy's default circuit breakers (1024) would queue
    /// the rest unanswered.
    #[test]
    fn pool_clusters_hold_thousands_of_streams() {
        for flavor in Flavor::ALL {
            let v: Value =
                serde_yaml_ng::from_str(&render(&with_baseline(flavor)).unwrap()).unwrap();
            for c in v["static_resources"]["clusters"].as_sequence().unwrap() {
                let name = c["name"].as_str().unwrap();
                if !(name.starts_with("pool-") || name == "rr") {
                    continue;
                }
                let t = &c["circuit_breakers"]["thresholds"][0];
                for field in ["max_connections", "max_pending_requests", "max_requests"] {
                    let n = t[field].as_u64().unwrap_or(0);
                    assert!(n >= 4096, "{flavor}: {name}.{field} = {n}");
                }
            }
        }
    }

    /// Native: the router and the picker are one `gateway` filter holding both configs,
    /// unless the global rate-limit filter must run between them; the baseline route turns
    /// every form off.
    #[test]
    fn native_runs_one_gateway_filter_unless_the_rate_limit_filter_sits_between() {
        let params = with_baseline(Flavor::Native);
        let v: Value = serde_yaml_ng::from_str(&render(&params).unwrap()).unwrap();
        let names = filter_names(&v);
        let ours: Vec<&String> = names
            .iter()
            .filter(|n| n.starts_with("infergate."))
            .collect();
        assert_eq!(ours, ["infergate.gateway"], "{names:?}");
        let gateway = filter_config(&v, "infergate.gateway");
        assert_eq!(gateway["router"]["role"], "router");
        assert_eq!(gateway["picker"]["role"], "picker");
        let rr = serde_json::to_value(&hcm(&v)["route_config"]["virtual_hosts"][0]["routes"][0])
            .unwrap();
        for filter in ["infergate.gateway", "infergate.router", "infergate.picker"] {
            assert_eq!(
                rr["typed_per_filter_config"][filter]["disabled"], true,
                "{filter}"
            );
        }

        let mut params = with_baseline(Flavor::Native);
        params.global_quotas = Some(super::super::global_quotas::GlobalQuotas::at(addr(9)));
        let v: Value = serde_yaml_ng::from_str(&render(&params).unwrap()).unwrap();
        let names = filter_names(&v);
        let at = |n: &str| names.iter().position(|x| x == n);
        assert_eq!(at("infergate.gateway"), None, "{names:?}");
        let router = at("infergate.router").unwrap();
        assert_eq!(
            at("envoy.filters.http.ratelimit"),
            Some(router + 1),
            "{names:?}"
        );
        assert_eq!(at("infergate.picker"), Some(router + 2), "{names:?}");

        let mut params = with_baseline(Flavor::Native);
        params.two_filters = true;
        let v: Value = serde_yaml_ng::from_str(&render(&params).unwrap()).unwrap();
        let names = filter_names(&v);
        let at = |n: &str| names.iter().position(|x| x == n);
        assert_eq!(at("infergate.gateway"), None, "{names:?}");
        assert_eq!(
            at("infergate.picker"),
            at("infergate.router").map(|r| r + 1)
        );
    }

    /// The deployment form (no baseline asked for) has no `/rr` route and no `rr`
    /// cluster in any template; asking for it adds exactly those.
    #[test]
    fn the_baseline_is_spliced_only_when_asked_for() {
        for flavor in Flavor::ALL {
            let names = |params: &BootstrapParams| {
                let v: Value = serde_yaml_ng::from_str(&render(params).unwrap()).unwrap();
                let routes: Vec<String> = hcm(&v)["route_config"]["virtual_hosts"][0]["routes"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .filter_map(|r| r["name"].as_str().map(str::to_owned))
                    .collect();
                let clusters: Vec<String> = v["static_resources"]["clusters"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .filter_map(|c| c["name"].as_str().map(str::to_owned))
                    .collect();
                (routes, clusters)
            };
            let deploy = BootstrapParams::new(flavor, two_pools());
            let text = render(&deploy).unwrap();
            assert!(!text.contains("/rr/"), "{flavor}: {text}");
            let (routes, clusters) = names(&deploy);
            assert!(!routes.contains(&"baseline".to_string()), "{flavor}");
            assert!(!clusters.contains(&"rr".to_string()), "{flavor}");
            let (with_routes, with_clusters) = names(&with_baseline(flavor));
            assert_eq!(with_routes[0], "baseline", "{flavor}: first match wins");
            assert_eq!(&with_routes[1..], &routes[..], "{flavor}");
            assert_eq!(with_clusters.len(), clusters.len() + 1, "{flavor}");
            assert!(with_clusters.contains(&"rr".to_string()), "{flavor}");
        }
    }

    /// Every Wasm plugin (router, headers, picker; the probe of `plain`) pins
    /// `FAIL_RELOAD`: a failed VM comes back, and never fails open onto an ORIGINAL_DST
    /// cluster steered by the client's own header.
    #[test]
    fn every_wasm_plugin_reloads_a_failed_vm() {
        fn plugin_configs(v: &Value, out: &mut Vec<Value>) {
            match v {
                Value::Mapping(m) => {
                    if m.contains_key("vm_config") {
                        out.push(v.clone());
                    }
                    m.values().for_each(|x| plugin_configs(x, out));
                }
                Value::Sequence(s) => s.iter().for_each(|x| plugin_configs(x, out)),
                _ => {}
            }
        }
        let mut probe = BootstrapParams::new(Flavor::Plain, two_pools());
        probe.probe = Some(Flavor::Wasm);
        probe.module = Some(PathBuf::from("/m/module.wasm"));
        for (params, expected) in [(with_baseline(Flavor::Wasm), 3), (probe, 1)] {
            let v: Value = serde_yaml_ng::from_str(&render(&params).unwrap()).unwrap();
            let mut found = Vec::new();
            plugin_configs(&v, &mut found);
            assert_eq!(found.len(), expected, "{found:?}");
            for c in found {
                assert_eq!(c["failure_policy"].as_str(), Some("FAIL_RELOAD"), "{c:?}");
            }
        }
    }

    fn filter_names(v: &Value) -> Vec<String> {
        hcm(v)["http_filters"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(|f| f["name"].as_str().map(str::to_owned))
            .collect()
    }

    fn access_log_paths(v: &Value) -> Vec<String> {
        hcm(v)["access_log"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(|l| l["typed_config"]["path"].as_str().map(str::to_owned))
            .collect()
    }

    /// The JSON configuration of the HTTP filter `name` in `v`'s connection manager.
    fn filter_config(v: &Value, name: &str) -> serde_json::Value {
        let text = hcm(v)["http_filters"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .map(|f| {
                let c = &f["typed_config"];
                // Wasm: config.configuration.value; native: filter_config.value.
                c["config"]["configuration"]["value"]
                    .as_str()
                    .or(c["filter_config"]["value"].as_str())
                    .unwrap()
                    .to_owned()
            })
            .unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// The router's config: its own filter's, or the `router` part of the native
    /// `gateway` filter's.
    fn router_config(v: &Value) -> serde_json::Value {
        gateway_part(v, "router")
    }

    /// The config of the gateway's `part` (`router` or `picker`), from its own filter or
    /// from the one `gateway` filter holding both.
    fn gateway_part(v: &Value, part: &str) -> serde_json::Value {
        if filter_names(v).iter().any(|n| n == "infergate.gateway") {
            filter_config(v, "infergate.gateway")[part].clone()
        } else {
            filter_config(v, &format!("infergate.{part}"))
        }
    }

    fn tenancy() -> Tenancy {
        Tenancy {
            objects: vec![
                json!({"kind": "TenantQuota", "metadata": {"name": "tenant-a"}}),
                json!({"kind": "InferenceObjective", "metadata": {"name": "premium"}}),
            ],
            jwt: Some(crate::config::tenancy::JwtProvider {
                issuer: "https://issuer.test".into(),
                jwks: r#"{"keys":[{"kty":"oct","alg":"HS256","kid":"k","k":"c2VjcmV0"}]}"#.into(),
            }),
            billing_log: Some(PathBuf::from("/var/log/billing.log")),
        }
    }

    /// Without tenancy a gateway template renders as before: no JWT filter, no billing
    /// log, no `tenantQuotas`. With it: `jwt_authn` right before the body router (with the
    /// provider's issuer and JWKS), the billing logger, and the objects in the router's
    /// configuration, in both flavours; `/rr` keeps `jwt_authn` off.
    #[test]
    fn tenancy_adds_the_jwt_filter_the_billing_log_and_the_objects() {
        for flavor in [Flavor::Wasm, Flavor::Native] {
            let plain =
                serde_yaml_ng::from_str::<Value>(&render(&with_baseline(flavor)).unwrap()).unwrap();
            assert!(
                !filter_names(&plain).iter().any(|n| n.contains("jwt")),
                "{flavor}"
            );
            assert!(access_log_paths(&plain).is_empty(), "{flavor}");
            assert!(
                router_config(&plain).get("tenantQuotas").is_none(),
                "{flavor}"
            );

            let mut params = with_baseline(flavor);
            params.tenancy = tenancy();
            let v: Value = serde_yaml_ng::from_str(&render(&params).unwrap()).unwrap();
            let names = filter_names(&v);
            let at = |n: &str| names.iter().position(|x| x == n).unwrap();
            let first = match flavor {
                Flavor::Native => "infergate.gateway",
                _ => "infergate.router",
            };
            assert_eq!(
                at("envoy.filters.http.jwt_authn") + 1,
                at(first),
                "{flavor}: {names:?}"
            );
            let jwt = &hcm(&v)["http_filters"][at("envoy.filters.http.jwt_authn")]["typed_config"];
            let provider = &jwt["providers"]["infergate"];
            assert_eq!(provider["issuer"].as_str(), Some("https://issuer.test"));
            assert_eq!(
                provider["local_jwks"]["inline_string"].as_str(),
                tenancy().jwt.map(|j| j.jwks).as_deref()
            );
            assert_eq!(provider["forward"].as_bool(), Some(true));
            assert_eq!(
                provider["payload_in_metadata"].as_str(),
                Some("jwt_payload")
            );
            let rules = jwt["rules"].as_sequence().unwrap();
            assert_eq!(rules.len(), 1, "{flavor}: only JWT-shaped bearer tokens");
            let header = &rules[0]["match"]["headers"][0];
            assert_eq!(header["name"].as_str(), Some("authorization"));
            assert!(header["string_match"]["safe_regex"]["regex"]
                .as_str()
                .unwrap()
                .starts_with("^Bearer "));
            assert_eq!(access_log_paths(&v), ["/var/log/billing.log"], "{flavor}");
            let format = hcm(&v)["access_log"]
                .as_sequence()
                .unwrap()
                .iter()
                .find(|l| l["typed_config"]["path"].is_string())
                .map(|l| {
                    l["typed_config"]["log_format"]["text_format_source"]["inline_string"].clone()
                })
                .unwrap();
            let expected = match flavor {
                Flavor::Native => "%DYNAMIC_METADATA(infergate.usage:record)%\n",
                _ => "%FILTER_STATE(wasm.infergate.usage:PLAIN)%\n",
            };
            assert_eq!(format.as_str(), Some(expected), "{flavor}");
            let quotas = &router_config(&v)["tenantQuotas"];
            assert_eq!(quotas, &json!(tenancy().objects), "{flavor}");
            let baseline = &hcm(&v)["route_config"]["virtual_hosts"][0]["routes"][0];
            assert_eq!(baseline["name"].as_str(), Some("baseline"));
            assert_eq!(
                baseline["typed_per_filter_config"]["envoy.filters.http.jwt_authn"]["disabled"]
                    .as_bool(),
                Some(true),
                "{flavor}"
            );

            // Each piece alone.
            let mut only_log = with_baseline(flavor);
            only_log.tenancy.billing_log = tenancy().billing_log;
            let v: Value = serde_yaml_ng::from_str(&render(&only_log).unwrap()).unwrap();
            assert!(!filter_names(&v).iter().any(|n| n.contains("jwt")));
            assert_eq!(access_log_paths(&v).len(), 1);
            assert!(router_config(&v).get("tenantQuotas").is_none());
        }
        let mut plain = with_baseline(Flavor::Plain);
        plain.tenancy = tenancy();
        assert!(render(&plain).is_err(), "plain has no gateway filters");
    }

    fn picker_config(v: &Value) -> serde_json::Value {
        gateway_part(v, "picker")
    }

    /// The picker's `objectives`: left out when there are none; otherwise the explicit ones
    /// and the tenancy's `InferenceObjective` objects, each once, in both flavours (the
    /// router keeps only the tenancy's objects).
    #[test]
    fn objectives_reach_the_picker_with_the_tenancys_own() {
        let premium = json!({"kind": "InferenceObjective", "metadata": {"name": "premium"}});
        let batch = json!({"kind": "InferenceObjective", "metadata": {"name": "batch"},
                           "spec": {"priority": -10}});
        for flavor in [Flavor::Wasm, Flavor::Native] {
            let plain =
                serde_yaml_ng::from_str::<Value>(&render(&with_baseline(flavor)).unwrap()).unwrap();
            assert!(
                picker_config(&plain).get("objectives").is_none(),
                "{flavor}"
            );

            let mut params = with_baseline(flavor);
            params.objectives = vec![batch.clone(), premium.clone()];
            params.tenancy = tenancy();
            let v: Value = serde_yaml_ng::from_str(&render(&params).unwrap()).unwrap();
            let picker = picker_config(&v);
            assert_eq!(picker["objectives"], json!([batch, premium]), "{flavor}");
            assert_eq!(picker["role"], "picker");
            assert_eq!(
                router_config(&v)["tenantQuotas"],
                json!(tenancy().objects),
                "{flavor}"
            );

            let mut only_tenancy = with_baseline(flavor);
            only_tenancy.tenancy = tenancy();
            let v: Value = serde_yaml_ng::from_str(&render(&only_tenancy).unwrap()).unwrap();
            assert_eq!(
                picker_config(&v)["objectives"],
                json!([premium]),
                "{flavor}"
            );

            let mut clash = with_baseline(flavor);
            clash.tenancy = tenancy();
            clash.objectives = vec![json!({"kind": "InferenceObjective",
                "metadata": {"name": "premium"}, "spec": {"priority": 1}})];
            let err = format!("{:#}", render(&clash).unwrap_err());
            assert!(err.contains("premium"), "{flavor}: {err}");
        }
    }

    fn eds_params(flavor: Flavor) -> BootstrapParams {
        BootstrapParams {
            membership: Membership::Eds,
            eds: Some(EdsDir::create(std::env::temp_dir().join("infergate-eds-unit")).unwrap()),
            admin_port: 19901,
            ..with_baseline(flavor)
        }
    }

    /// The scraper's configuration: native (no bootstrap extension), the one the picker
    /// carries; otherwise the bootstrap extension's.
    fn scraper_config(v: &Value) -> serde_json::Value {
        if v.get("bootstrap_extensions").is_none() {
            return picker_config(v)["scraper"].clone();
        }
        let ext = &v["bootstrap_extensions"][0]["typed_config"];
        let text = ext["config"]["configuration"]["value"]
            .as_str()
            .or(ext["extension_config"]["value"].as_str())
            .unwrap();
        serde_json::from_str(text).unwrap()
    }

    /// With EDS membership each pool cluster is `type: EDS` from its own file in the
    /// watched directory, with the same policy as the STATIC form; the node has an id and a
    /// cluster; the picker's pools drop their lists and follow their clusters, and so does
    /// the scraper (from the host in native, from admin `/clusters` through the STATIC
    /// `infergate_admin` cluster to Envoy's own admin port in wasm).
    #[test]
    fn eds_membership_makes_eds_pool_clusters_the_pickers_and_the_scrapers_follow() {
        for flavor in [Flavor::Wasm, Flavor::Native] {
            let params = eds_params(flavor);
            let eds = params.eds.clone().unwrap();
            let v: Value = serde_yaml_ng::from_str(&render(&params).unwrap()).unwrap();
            assert_eq!(v["node"]["id"].as_str(), Some("infergate-gateway"));
            assert!(v["node"]["cluster"].as_str().is_some());
            let clusters = v["static_resources"]["clusters"].as_sequence().unwrap();
            let static_form: Value =
                serde_yaml_ng::from_str(&render(&with_baseline(flavor)).unwrap()).unwrap();
            for name in ["pool-0-meta_llama-3", "pool-1-qwen"] {
                let pool = clusters.iter().find(|c| c["name"] == name).unwrap();
                assert_eq!(pool["type"].as_str(), Some("EDS"), "{flavor}");
                assert!(pool.get("load_assignment").is_none(), "{flavor}");
                let source = &pool["eds_cluster_config"]["eds_config"]["path_config_source"];
                assert_eq!(
                    source["path"].as_str().map(PathBuf::from),
                    Some(eds.path(name))
                );
                assert_eq!(
                    source["watched_directory"]["path"]
                        .as_str()
                        .map(PathBuf::from),
                    Some(eds.dir().to_path_buf())
                );
                let same = static_form["static_resources"]["clusters"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .find(|c| c["name"] == name)
                    .unwrap();
                for field in ["load_balancing_policy", "circuit_breakers"] {
                    assert_eq!(pool[field], same[field], "{flavor}: {field}");
                }
            }
            let picker = picker_config(&v);
            for p in picker["pools"].as_array().unwrap() {
                assert!(p.get("endpoints").is_none(), "{flavor}: {p}");
            }
            let scraper = scraper_config(&v);
            assert_eq!(
                scraper["clusters"],
                json!(["pool-0-meta_llama-3", "pool-1-qwen"]),
                "{flavor}"
            );
            assert_eq!(scraper["endpoints"], json!([]), "{flavor}");
            let admin = clusters.iter().find(|c| c["name"] == "infergate_admin");
            match flavor {
                Flavor::Wasm => {
                    assert_eq!(scraper["membership"], "admin");
                    let a = admin.unwrap();
                    assert_eq!(a["type"].as_str(), Some("STATIC"));
                    let addr = &a["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
                        ["address"]["socket_address"];
                    assert_eq!(addr["port_value"].as_u64(), Some(19901));
                    assert_eq!(v["admin"]["address"]["socket_address"]["port_value"], 19901);
                }
                _ => {
                    assert_eq!(scraper["membership"], "host");
                    assert!(admin.is_none());
                }
            }
            // What the launcher generates is what the filters parse.
            let without_role = |mut v: serde_json::Value| {
                v.as_object_mut().unwrap().remove("role");
                v
            };
            infergate_filters::scraper::Scraper::from_json(without_role(scraper)).unwrap();
            let mut picker = without_role(picker);
            // The scraper the picker carries is taken out by the module before it parses.
            picker.as_object_mut().unwrap().remove("scraper");
            infergate_filters::picker::PickerConfig::from_json(picker)
                .unwrap()
                .validate()
                .unwrap();
        }
        let mut wasm = eds_params(Flavor::Wasm);
        wasm.admin_port = 0;
        assert!(format!("{:#}", render(&wasm).unwrap_err()).contains("admin port"));
        let mut no_dir = eds_params(Flavor::Native);
        no_dir.eds = None;
        assert!(render(&no_dir).is_err());
        assert!(render(&eds_params(Flavor::Plain)).is_err());
    }

    /// A picker list a caller edited, or a data-parallel pool, stays static under EDS; the
    /// scraper keeps scraping what some static list still holds.
    #[test]
    fn follow_clusters_leaves_edited_lists_static() {
        let pools = two_pools();
        let mut c = PluginConfigs::for_pools(&pools, &GatewaySettings::default());
        c.picker["pools"][1]["endpoints"] = json!(["127.0.0.1:8003", "127.0.0.1:8009"]);
        c.follow_clusters(&pools, false);
        assert!(c.picker["pools"][0].get("endpoints").is_none());
        assert_eq!(
            c.picker["pools"][1]["endpoints"],
            json!(["127.0.0.1:8003", "127.0.0.1:8009"])
        );
        assert_eq!(c.scraper["clusters"], json!(["pool-0-meta_llama-3"]));
        assert_eq!(c.scraper["endpoints"], json!(["127.0.0.1:8003"]));
    }

    /// An active health check is spliced into every pool cluster only when asked for.
    #[test]
    fn a_health_check_reaches_every_pool_cluster_when_asked() {
        for flavor in [Flavor::Wasm, Flavor::Native] {
            for mut params in [with_baseline(flavor), eds_params(flavor)] {
                params.health_check = Some(Duration::from_millis(200));
                let v: Value = serde_yaml_ng::from_str(&render(&params).unwrap()).unwrap();
                for c in v["static_resources"]["clusters"].as_sequence().unwrap() {
                    if !c["name"].as_str().unwrap().starts_with("pool-") {
                        continue;
                    }
                    let hc = c["health_checks"].as_sequence().unwrap();
                    assert_eq!(hc.len(), 1, "{flavor}");
                    assert_eq!(hc[0]["interval"].as_str(), Some("0.200s"));
                    assert_eq!(hc[0]["no_traffic_interval"].as_str(), Some("0.200s"));
                    assert_eq!(hc[0]["http_health_check"]["path"].as_str(), Some("/health"));
                }
            }
        }
        let mut plain = with_baseline(Flavor::Plain);
        plain.health_check = Some(Duration::from_secs(1));
        assert!(render(&plain).is_err());
    }

    #[test]
    fn no_pool_is_an_error_and_flavours_parse() {
        assert!(render(&BootstrapParams::new(Flavor::Plain, vec![])).is_err());
        for f in Flavor::ALL {
            assert_eq!(f.name().parse::<Flavor>().unwrap(), f);
        }
        assert!("grpc".parse::<Flavor>().is_err());
    }
}
