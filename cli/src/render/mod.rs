//! `infergate render`: the user's own Kubernetes objects (`InferencePool`, `HTTPRoute`,
//! the `ConfigMap` holding the `EndpointPickerConfig`, `InferenceObjective`,
//! `InferenceModelRewrite`, `TenantQuota`) as a gateway's configuration.
//!
//! - [`objects`]: the objects, typed by kind and apiVersion;
//! - [`gateway`]: the objects as the launcher's [`crate::config::BootstrapParams`], so the
//!   bootstrap comes from `config::bootstrap::render`, the renderer every harness stack uses:
//!   what the tests run is what users get;
//! - [`istio`]: the same gateway as Istio manifests (one `EnvoyFilter`, Wasm through ECDS;
//!   no bootstrap patch);
//! - [`envoy_gateway`]: the same gateway as Envoy Gateway manifests;
//! - [`kube`], [`names`]: what those two share (a `Service` per pool, valid names);
//! - [`report`]: what became of every field.
//!
//! [`render`] writes into the output directory, by `--target`: `envoy.yaml` (the bootstrap)
//! and `eds/` with one example `ClusterLoadAssignment` per pool (`envoy`), `istio.yaml`
//! (`istio`) or `envoy-gateway.yaml` (`envoy-gateway`); and always `fields.md` (the report)
//! and `README.md` (what each file is and how to deploy it).

pub mod envoy_gateway;
pub mod gateway;
pub mod istio;
pub mod kube;
pub mod names;
pub mod objects;
mod readme;
pub mod report;

use crate::config::bootstrap::{self, write_eds_files, Flavor};
use crate::config::eds::{load_assignment, EdsDir, EdsHost, Membership};
use anyhow::{bail, Context, Result};
use serde_yaml_ng::Value;
use std::net::SocketAddr;
use std::path::PathBuf;

pub use gateway::GatewayInputs;
pub use istio::IstioVersion;

/// What `render` renders for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Target {
    /// A bare Envoy: the bootstrap (`envoy.yaml`) and its EDS files.
    #[default]
    Envoy,
    /// A Gateway Istio runs: `istio.yaml`.
    Istio,
    /// A Gateway Envoy Gateway runs: `envoy-gateway.yaml`.
    EnvoyGateway,
}

impl Target {
    /// The file the target's output goes to.
    pub fn file(self) -> &'static str {
        match self {
            Target::Envoy => "envoy.yaml",
            Target::Istio => "istio.yaml",
            Target::EnvoyGateway => "envoy-gateway.yaml",
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Target::Envoy => "envoy",
            Target::Istio => "istio",
            Target::EnvoyGateway => "envoy-gateway",
        })
    }
}

impl std::str::FromStr for Target {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "envoy" => Ok(Target::Envoy),
            "istio" => Ok(Target::Istio),
            "envoy-gateway" => Ok(Target::EnvoyGateway),
            other => bail!("--target {other}: expected envoy, istio or envoy-gateway"),
        }
    }
}

/// Everything `infergate render` is given.
#[derive(Clone, Debug)]
pub struct RenderOptions {
    /// The objects' directory.
    pub objects: PathBuf,
    /// What to render for.
    pub target: Target,
    /// The Istio release (target `istio`).
    pub istio_version: IstioVersion,
    /// Where the files go (created if missing).
    pub out: PathBuf,
    /// The gateway's listener (`0.0.0.0:8080`).
    pub listen: SocketAddr,
    /// Envoy's admin interface (`127.0.0.1:9901`).
    pub admin: SocketAddr,
    /// The module's OCI image: the Wasm module istio-agent or Envoy Gateway fetches, or the
    /// image whose root holds `libinfergate_envoy.so` (native: an image volume).
    pub image: String,
    /// Where the pool clusters take their members from: EDS files (the default) or the
    /// `--endpoints` lists as STATIC clusters.
    pub membership: Membership,
    /// The directory Envoy watches for the pools' EDS files, as Envoy will see it (default
    /// `<out>/eds`). The files are always written into `<out>/eds`, holding each pool's
    /// `--endpoints` (none: empty), for the operator's tooling to put there.
    pub eds_dir: Option<PathBuf>,
    /// What the objects do not say.
    pub gateway: GatewayInputs,
}

/// What [`render`] produced.
#[derive(Clone, Debug)]
pub struct Rendered {
    /// The target.
    pub target: Target,
    /// The target's file: the bootstrap, or the control plane's manifests.
    pub output: PathBuf,
    /// The field report's path.
    pub fields: PathBuf,
    /// The README's path.
    pub readme: PathBuf,
    /// The unsupported fields, one line each.
    pub not_supported: Vec<String>,
}

/// Renders the objects of `opts.objects` into `opts.out`.
pub fn render(opts: &RenderOptions) -> Result<Rendered> {
    if opts.gateway.flavor == Flavor::Plain {
        bail!("render needs the wasm or native flavour (plain has no gateway filters)");
    }
    let mut set = objects::load_dir(&opts.objects)?;
    let gw = gateway::build(&mut set, &opts.gateway)?;
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("creating {}", opts.out.display()))?;
    let write = |name: &str, body: &str| -> Result<PathBuf> {
        let path = opts.out.join(name);
        std::fs::write(&path, body).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    };
    let text = match opts.target {
        Target::Envoy => bootstrap_text(opts, &gw, &mut set.report)?,
        Target::Istio => istio::manifests(
            &gw,
            &opts.gateway,
            &opts.image,
            opts.istio_version,
            &mut set.report,
        )?,
        Target::EnvoyGateway => {
            envoy_gateway::manifests(&gw, &opts.gateway, &opts.image, &mut set.report)?
        }
    };
    let output = write(opts.target.file(), &text)?;
    let fields = write("fields.md", &set.report.to_markdown())?;
    let readme = write(
        "README.md",
        &readme::text(&gw, opts, &set.report.not_supported_lines()),
    )?;
    Ok(Rendered {
        target: opts.target,
        output,
        fields,
        readme,
        not_supported: set.report.not_supported_lines(),
    })
}

/// The bootstrap of `gw` (target `envoy`), its EDS files written.
fn bootstrap_text(
    opts: &RenderOptions,
    gw: &gateway::Gateway,
    report: &mut report::Report,
) -> Result<String> {
    let mut params = gw.params.clone();
    params.listener_port = opts.listen.port();
    // The address the gateway reaches its own listener at (a peer pick's last fallback).
    if !opts.listen.ip().is_unspecified() {
        params.listener_address = opts.listen.ip();
    }
    params.admin_port = opts.admin.port();
    let out_dir = std::fs::canonicalize(&opts.out)
        .with_context(|| format!("resolving {}", opts.out.display()))?;
    params.membership = opts.membership;
    if opts.membership == Membership::Eds {
        let dir = out_dir.join("eds");
        let eds = EdsDir::create(&dir)?;
        params.eds = Some(eds.clone());
        write_eds_files(&params)?;
        for (i, pool) in params.pools.iter().enumerate() {
            let cluster = pool.cluster_name(i);
            let example = example_hosts(&gw.pools[i].target_ports);
            let text = serde_json::to_string_pretty(&load_assignment(&cluster, &example))?;
            let path = dir.join(format!("{cluster}.example.json"));
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    for (i, pool) in params.pools.iter().enumerate() {
        let label = &gw.pools[i].label;
        let cluster = pool.cluster_name(i);
        match (opts.membership, pool.endpoints.is_empty()) {
            (Membership::Eds, empty) => {
                let dir = params
                    .eds
                    .as_ref()
                    .map(|e| e.path(&cluster).display().to_string());
                report.used(
                    label,
                    "",
                    format!(
                        "cluster `{cluster}`: EDS from {} ({}); the picker and the scraper \
                         follow its members",
                        dir.unwrap_or_default(),
                        if empty {
                            "empty until your tooling writes it; see the .example.json beside it"
                        } else {
                            "written with the --endpoints given"
                        }
                    ),
                );
            }
            (Membership::Static, true) => report.not_supported(
                label,
                "",
                format!(
                    "cluster `{cluster}` is STATIC and no --endpoints were given: it has no member"
                ),
            ),
            (Membership::Static, false) => report.used(
                label,
                "",
                format!("cluster `{cluster}`: STATIC, the --endpoints given"),
            ),
        }
    }
    let text = bootstrap::render(&params)?;
    let text = with_addresses(&text, opts.listen, opts.admin)?;
    check_rendered(&text)?;
    match (&params.eds, &opts.eds_dir) {
        (Some(local), Some(remote)) => with_eds_dir(&text, local.dir(), remote),
        _ => Ok(text),
    }
}

/// Checks the module configurations as the bootstrap carries them (after the EDS form
/// dropped the pools' endpoint lists) with the modules' own parsers: each is a JSON
/// `value` with a `role`.
fn check_rendered(text: &str) -> Result<()> {
    fn collect(v: &Value, out: &mut Vec<serde_json::Value>) {
        match v {
            Value::Mapping(m) => {
                for (k, x) in m {
                    if k.as_str() == Some("value") {
                        let json = x
                            .as_str()
                            .and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok());
                        // The native `gateway` filter holds the router's and the picker's
                        // configurations as its two parts.
                        let parts = match json {
                            Some(j) if j.get("role").is_some() => vec![j],
                            Some(j) => ["router", "picker"]
                                .iter()
                                .filter_map(|part| j.get(part).cloned())
                                .filter(|p| p.get("role").is_some())
                                .collect(),
                            None => Vec::new(),
                        };
                        out.extend(parts);
                    }
                    collect(x, out);
                }
            }
            Value::Sequence(items) => items.iter().for_each(|x| collect(x, out)),
            Value::Tagged(t) => collect(&t.value, out),
            _ => {}
        }
    }
    let v: Value = serde_yaml_ng::from_str(text).context("re-reading the bootstrap")?;
    let mut configs = Vec::new();
    collect(&v, &mut configs);
    let by_role = |role: &str| {
        let found: Vec<&serde_json::Value> = configs.iter().filter(|c| c["role"] == role).collect();
        match found.as_slice() {
            [one] => Ok((*one).clone()),
            _ => Err(anyhow::anyhow!(
                "the bootstrap holds {} {role} configurations, expected one",
                found.len()
            )),
        }
    };
    // The scraper: inside the picker's configuration (`scraper`, no role) where the
    // bootstrap puts it there, else its own bootstrap extension's configuration.
    let mut picker = by_role("picker")?;
    let mut router = by_role("router")?;
    let embedded = picker.as_object_mut().and_then(|m| {
        m.remove("instance");
        m.remove("scraper")
    });
    if let Some(m) = router.as_object_mut() {
        m.remove("instance");
    }
    let scraper = match embedded {
        Some(s) => s,
        None => by_role("scraper")?,
    };
    gateway::check_with_the_modules_parsers(&router, &picker, &scraper)
        .context("the bootstrap's module configurations")
}

/// The bootstrap with every path under `local` (where the EDS files were written) moved
/// under `remote` (where Envoy will find them).
fn with_eds_dir(text: &str, local: &std::path::Path, remote: &std::path::Path) -> Result<String> {
    fn walk(v: &mut Value, local: &str, remote: &str) {
        match v {
            Value::String(s) => {
                if let Some(rest) = s.strip_prefix(local) {
                    *s = format!("{remote}{rest}");
                }
            }
            Value::Sequence(items) => items.iter_mut().for_each(|i| walk(i, local, remote)),
            Value::Mapping(m) => m.iter_mut().for_each(|(_, i)| walk(i, local, remote)),
            Value::Tagged(t) => walk(&mut t.value, local, remote),
            _ => {}
        }
    }
    let mut v: Value = serde_yaml_ng::from_str(text).context("re-reading the bootstrap")?;
    let remote = remote.to_string_lossy();
    walk(
        &mut v,
        &local.to_string_lossy(),
        remote.trim_end_matches('/'),
    );
    serde_yaml_ng::to_string(&v).context("serialising the bootstrap")
}

/// Two documentation addresses (192.0.2.0/24) on each target port: what an example EDS file
/// holds.
fn example_hosts(ports: &[u16]) -> Vec<EdsHost> {
    let mut out = Vec::new();
    for last in [10u8, 11] {
        for &port in ports {
            out.push(EdsHost::healthy(SocketAddr::from((
                [192, 0, 2, last],
                port,
            ))));
        }
    }
    out
}

/// The bootstrap with the listener and admin bound to the given addresses (the templates
/// bind loopback, where the launcher runs them).
fn with_addresses(text: &str, listen: SocketAddr, admin: SocketAddr) -> Result<String> {
    let mut v: Value = serde_yaml_ng::from_str(text).context("re-reading the bootstrap")?;
    let set_ip = |v: &mut Value, ip: String| -> Result<()> {
        match v.get_mut("socket_address").and_then(Value::as_mapping_mut) {
            Some(m) => {
                m.insert(Value::from("address"), Value::String(ip));
                Ok(())
            }
            None => bail!("the bootstrap has no socket address where expected"),
        }
    };
    let listeners = v["static_resources"]["listeners"]
        .as_sequence_mut()
        .map(|l| l.iter_mut().collect::<Vec<_>>())
        .unwrap_or_default();
    for l in listeners {
        if let Some(addr) = l.get_mut("address") {
            set_ip(addr, listen.ip().to_string())?;
        }
    }
    if let Some(addr) = v.get_mut("admin").and_then(|a| a.get_mut("address")) {
        set_ip(addr, admin.ip().to_string())?;
    }
    serde_yaml_ng::to_string(&v).context("serialising the bootstrap")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn bootstrap(picker: &serde_json::Value) -> String {
        let router = serde_json::json!({"role": "router", "pools": [
            {"name": "p", "baseModel": "m", "adapters": []}]});
        let scraper = serde_json::json!({"role": "scraper", "endpoints": ["10.0.0.1:8000"]});
        let v = serde_json::json!({"a": [
            {"config": {"configuration": {"value": router.to_string()}}},
            {"filter_config": {"value": picker.to_string()}},
            {"extension_config": {"value": scraper.to_string()}}]});
        serde_yaml_ng::to_string(&v).unwrap()
    }

    /// The multi-cluster objects: the export annotation, an `InferencePoolImport` and the
    /// route naming it, with a peers file, render the peers cluster (the other cluster's
    /// gateway and this one's own listener), its route, the picker's `peers` and
    /// `exportName`, and the scraper's path for the peer; in Endpoint Mode, the members'
    /// cluster and the scraper's `published` instead.
    #[test]
    fn an_imported_pool_renders_its_peers_and_an_exported_one_its_page() {
        let out = tempfile::tempdir().unwrap();
        let dir = infergate_artefacts::workspace_root().join("testdata/multicluster");
        let mut opts = RenderOptions {
            objects: dir.clone(),
            target: Target::Envoy,
            istio_version: IstioVersion::V1_30,
            out: out.path().to_path_buf(),
            membership: crate::config::eds::Membership::Eds,
            eds_dir: None,
            listen: "0.0.0.0:8080".parse().unwrap(),
            admin: "127.0.0.1:9901".parse().unwrap(),
            image: "oci://registry.test/infergate:test".into(),
            gateway: gateway::GatewayInputs {
                flavor: Flavor::Native,
                endpoints: Vec::new(),
                module: Some("/lib/libinfergate_envoy.so".into()),
                no_tenants: true,
                jwks: None,
                billing_log: None,
                per_request_split: false,
                peers: Some(
                    crate::config::peers::PeersFile::load(&dir.join("peers/peers.yaml")).unwrap(),
                ),
                cluster: Some("cluster-a".into()),
                peer_mode: crate::config::bootstrap::PeerMode::Parent,
                peer_api_key: None,
                export_members: false,
            },
        };
        let (text, peers, picker) = rendered_peers(&opts);
        let hosts = serde_json::to_string(&peers["load_assignment"]).unwrap();
        assert!(hosts.contains("10.20.0.5"), "{hosts}");
        assert!(
            !hosts.contains("10.10.0.5"),
            "a cluster is no peer of itself: {hosts}"
        );
        assert!(
            hosts.contains("127.0.0.1"),
            "the gateway's own listener: {hosts}"
        );
        assert!(text.contains("x-gateway-peer-route"), "the peers route");
        let pool = &picker["pools"][0];
        assert_eq!(pool["exportName"], "llama-70b-bf16");
        assert_eq!(
            pool["peers"]["endpoints"],
            serde_json::json!(["10.20.0.5:8080"])
        );
        assert_eq!(pool["peers"]["loopback"], "127.0.0.1:8080");
        assert_eq!(
            picker["scraper"]["metricsPaths"]["10.20.0.5:8080"],
            "/infergate/pools/llama-70b-bf16/metrics"
        );
        // Endpoint Mode: an ORIGINAL_DST peers cluster (the members the peer publishes),
        // the scraper follows them from the peer's page, and no loopback.
        opts.gateway.peer_mode = crate::config::bootstrap::PeerMode::Endpoint;
        opts.gateway.export_members = true;
        let (_, peers, picker) = rendered_peers(&opts);
        assert_eq!(peers["type"].as_str(), Some("ORIGINAL_DST"));
        let pool = &picker["pools"][0];
        assert_eq!(pool["peers"]["mode"], "Endpoint");
        // The exported pool lists its members only when asked (`--export-members`).
        assert_eq!(pool["exportMembers"], true);
        assert_eq!(pool["peers"].get("loopback"), None);
        assert_eq!(
            picker["scraper"]["published"],
            serde_json::json!([{"cluster": "pool-0-llama-70b-bf16-peers",
                "gateways": ["10.20.0.5:8080"],
                "path": "/infergate/pools/llama-70b-bf16/metrics"}])
        );
        assert_eq!(picker["scraper"].get("metricsPaths"), None);
        opts.gateway.peer_mode = crate::config::bootstrap::PeerMode::Parent;
        opts.gateway.export_members = false;
        // Istio: the peers cluster as an added cluster, its route inserted first; Envoy
        // Gateway: both as JSON patches. No loopback where the listener is the control
        // plane's.
        for (target, route_patch) in [
            (Target::Istio, "INSERT_FIRST"),
            (Target::EnvoyGateway, "$.virtual_hosts[*].routes"),
        ] {
            opts.target = target;
            let rendered = render(&opts).unwrap();
            let text = std::fs::read_to_string(&rendered.output).unwrap();
            assert!(text.contains("pool-0-llama-70b-bf16-peers"), "{text}");
            assert!(text.contains("x-gateway-peer-route"), "{text}");
            assert!(text.contains(route_patch), "{text}");
            assert!(text.contains("10.20.0.5"), "{text}");
            assert!(!text.contains("loopback"), "{text}");
        }
        // Without the peers file, no render.
        opts.target = Target::Envoy;
        opts.gateway.peers = None;
        let err = format!("{:#}", render(&opts).unwrap_err());
        assert!(err.contains("--peers"), "{err}");
    }

    /// `opts` rendered for a bare Envoy: the bootstrap's text, the peers cluster of its
    /// first pool, and the picker's configuration (which the native `gateway` filter's
    /// holds).
    fn rendered_peers(opts: &RenderOptions) -> (String, Value, serde_json::Value) {
        let rendered = render(opts).unwrap();
        let text = std::fs::read_to_string(&rendered.output).unwrap();
        let yaml: Value = serde_yaml_ng::from_str(&text).unwrap();
        let clusters = yaml["static_resources"]["clusters"].as_sequence().unwrap();
        let peers = clusters
            .iter()
            .find(|c| c["name"].as_str() == Some("pool-0-llama-70b-bf16-peers"))
            .unwrap()
            .clone();
        let mut configs = Vec::new();
        collect_configs(&yaml, &mut configs);
        let picker = configs
            .iter()
            .find_map(|c| c.get("picker").filter(|p| p.is_object()))
            .unwrap()
            .clone();
        (text, peers, picker)
    }

    /// Every module configuration (JSON text) inside a rendered bootstrap.
    fn collect_configs(v: &Value, out: &mut Vec<serde_json::Value>) {
        match v {
            Value::String(s) if s.starts_with('{') => {
                if let Ok(json) = serde_json::from_str::<serde_json::Value>(s) {
                    out.push(json);
                }
            }
            Value::Sequence(items) => items.iter().for_each(|i| collect_configs(i, out)),
            Value::Mapping(m) => m.values().for_each(|i| collect_configs(i, out)),
            _ => {}
        }
    }

    /// The configurations inside a rendered bootstrap go through the modules' parsers: an
    /// unknown picker field, or a missing role, is refused before anything is written.
    #[test]
    fn the_bootstraps_module_configurations_are_parsed_by_the_modules() {
        let picker = serde_json::json!({"role": "picker", "pools": [
            {"pool": "p", "baseModel": "m", "endpoints": ["10.0.0.1:8000"]}]});
        check_rendered(&bootstrap(&picker)).unwrap();
        let mut typo = picker.clone();
        typo["pools"][0]["staleAfter"] = serde_json::json!(5);
        let err = format!("{:#}", check_rendered(&bootstrap(&typo)).unwrap_err());
        assert!(err.contains("staleAfter"), "{err}");
        let mut no_role = picker;
        no_role.as_object_mut().unwrap().remove("role");
        assert!(check_rendered(&bootstrap(&no_role)).is_err());
    }
}
