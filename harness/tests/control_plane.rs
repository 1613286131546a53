//! The control-plane tier: the gateway as a control plane would install it, run on a real
//! Envoy 1.40.
//!
//! `infergate render --target istio|envoy-gateway` writes manifests; [`istio::translate`]
//! turns Istio's into the Envoy configuration istiod and istio-agent would give the
//! Gateway's proxy (listener, routes, `outbound|…` clusters fed by EDS, the `EnvoyFilter`
//! applied as istiod applies it, every Wasm filter by ECDS, the module fetched as the agent
//! would), and [`envoy_gateway::translate`] Envoy Gateway's (its listener and per-rule
//! clusters, the `EnvoyExtensionPolicy` filters enabled per route, the Wasm module served
//! over HTTP with its sha256, the `EnvoyPatchPolicy` JSON patches), both written as files
//! Envoy reads through its filesystem xDS; the Services' endpoints and the admin port map to
//! the test's loopback. Patches the control plane would not apply (`BOOTSTRAP`, a match
//! that finds nothing, a JSON patch that fails) are dropped and printed;
//! [`every_rendered_version_drops_no_patch`] holds the rendered output to none.
//!
//! Each scenario runs in both flavours (a flavour whose module is not built is skipped, as
//! in the e2e suite; `cargo xtask test` names the test-artefact modules through
//! `INFERGATE_WASM` / `INFERGATE_NATIVE`, which `Flavor::artefact` reads): routing and an
//! EDS membership change under both control planes; under Istio the tenants' billing on
//! stdout and another vendor's Wasm plugin in the same `vm_id ""` with shared data of its
//! own (Wasm); the multi-turn affinity workload at 1 and 4 Envoy workers under both,
//! against the bare-Envoy (`--target envoy`) rendering of the same objects; and a pool
//! imported from another cluster spilling there, in both peer modes, under both
//! ([`multicluster`]).
//! `INFERGATE_CP_LONG=1` runs the workload's long form.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "control_plane/envoy_gateway.rs"]
mod envoy_gateway;
#[path = "control_plane/istio.rs"]
mod istio;
#[path = "control_plane/multicluster.rs"]
mod multicluster;
#[path = "control_plane/proxy.rs"]
mod proxy;

#[path = "shared/clusters.rs"]
mod clusters;
#[path = "shared/conversations.rs"]
mod conversations;
#[path = "shared/owner_trap.rs"]
mod owner_trap;
#[path = "shared/objects.rs"]
mod shared;
use infergate_cli::config::bootstrap::PeerMode;
use infergate_cli::render::{render, GatewayInputs, IstioVersion, RenderOptions, Target};
use infergate_harness::launch::client::post_json;
use infergate_harness::launch::process::RunDir;
use infergate_harness::launch::{Envoy, EnvoyOptions, Flavor, Membership};
use infergate_harness::load::runner::run_target;
use infergate_harness::load::{
    Assign, Connections, LoadConfig, Summary, Target as LoadTarget, Workload,
};
use infergate_harness::sim::{self, EngineConfig, SimConfig, SimHandle};
use owner_trap::{has_test_stages, TRAP_HEADER};
use proxy::Proxy;
use serde_json::{json, Value as Json};
use shared::seed_objects;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

const POOL: &str = "llama-70b-bf16";
const SERVICE: &str = "llama-70b-bf16-infergate";
const MODEL: &str = "llama-70b";

/// Whether `flavor`'s module is missing (then the test is skipped, as in the e2e suite;
/// under `cargo xtask test` a named module that is missing fails).
fn unbuilt(flavor: Flavor) -> bool {
    let Some(module) = flavor.artefact() else {
        return true;
    };
    let named = [
        infergate_artefacts::WASM_ENV,
        infergate_artefacts::NATIVE_ENV,
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some_and(|p| module == Path::new(&p)));
    assert!(
        !named || module.is_file(),
        "{} was named but does not exist",
        module.display()
    );
    if !module.is_file() {
        eprintln!("SKIPPED: {flavor} flavour needs {}", module.display());
        return true;
    }
    false
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn options(flavor: Flavor, target: Target, out: &Path, objects: PathBuf) -> RenderOptions {
    RenderOptions {
        objects,
        target,
        istio_version: IstioVersion::V1_30,
        out: out.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        admin: SocketAddr::from(([127, 0, 0, 1], free_port())),
        image: "oci://registry.test/infergate-wasm:test".into(),
        membership: Membership::Eds,
        eds_dir: None,
        gateway: GatewayInputs {
            flavor,
            endpoints: vec![(POOL.into(), Vec::new())],
            module: None,
            no_tenants: true,
            jwks: None,
            billing_log: None,
            per_request_split: false,
            peers: None,
            cluster: None,
            peer_mode: PeerMode::Parent,
            peer_api_key: None,
            export_members: false,
        },
    }
}

fn docs_of(path: &Path) -> Vec<Json> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| {
            let v: serde_yaml_ng::Value = serde::Deserialize::deserialize(d).unwrap();
            serde_json::to_value(v).unwrap()
        })
        .collect()
}

/// A control plane the tier translates for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plane {
    Istio,
    EnvoyGateway,
}

impl std::fmt::Display for Plane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Plane::Istio => "Istio 1.30",
            Plane::EnvoyGateway => "Envoy Gateway",
        })
    }
}

impl Plane {
    fn target(self) -> Target {
        match self {
            Plane::Istio => Target::Istio,
            Plane::EnvoyGateway => Target::EnvoyGateway,
        }
    }
}

/// The manifests `plane` gets for `opts`.
fn plane_docs(plane: Plane, mut opts: RenderOptions) -> Vec<Json> {
    opts.target = plane.target();
    opts.gateway.endpoints.clear();
    let out = render(&opts).unwrap();
    docs_of(&out.output)
}

/// The Istio manifests of `opts` (target forced to Istio).
fn istio_docs(opts: RenderOptions) -> Vec<Json> {
    plane_docs(Plane::Istio, opts)
}

/// The seed's Gateway listener, as Envoy Gateway names it.
const EG_LISTENER: &str = "gateway-system/inference-gateway/http";

/// The gateway on the proxy a control plane would run: translated, started, its pool
/// answering.
struct Installed {
    proxy: Proxy,
    /// `infergate.picker.owner_fallbacks` once warm: a request before the pickers' first
    /// election picks locally; steady state starts after.
    warm_fallbacks: i64,
    translated: istio::Translated,
    module_server: Option<tokio::task::JoinHandle<()>>,
    dir: RunDir,
}

impl Drop for Installed {
    fn drop(&mut self) {
        if let Some(server) = &self.module_server {
            server.abort();
        }
    }
}

/// Serves `bytes` to every HTTP request on a loopback port: Envoy Gateway's Wasm server.
async fn serve_bytes(bytes: Vec<u8>) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let bytes = std::sync::Arc::new(bytes);
    let task = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let bytes = bytes.clone();
            tokio::spawn(async move {
                let mut head = [0u8; 4096];
                let _ = conn.read(&mut head).await;
                let header = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncontent-type: application/wasm\r\nconnection: close\r\n\r\n",
                    bytes.len()
                );
                let _ = conn.write_all(header.as_bytes()).await;
                let _ = conn.write_all(&bytes).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    (addr, task)
}

async fn install(
    plane: Plane,
    flavor: Flavor,
    docs: &[Json],
    endpoints: &[SocketAddr],
    workers: u32,
) -> Installed {
    let dir = RunDir::new("cp-plane").unwrap();
    let endpoints = BTreeMap::from([(SERVICE.to_owned(), endpoints.to_vec())]);
    let mut module_server = None;
    let translated = match plane {
        Plane::Istio => {
            let lo = istio::Loopback {
                dir: dir.path().join("xds"),
                admin_port: free_port(),
                wasm_module: Flavor::Wasm.artefact(),
                native_module: Flavor::Native.artefact(),
                endpoints,
            };
            istio::translate(docs, &lo).unwrap()
        }
        Plane::EnvoyGateway => {
            let (mut wasm_server, mut wasm_sha256) = (None, String::new());
            if flavor == Flavor::Wasm {
                use sha2::Digest;
                let bytes = std::fs::read(Flavor::Wasm.artefact().unwrap()).unwrap();
                wasm_sha256 = sha2::Sha256::digest(&bytes)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                let (addr, task) = serve_bytes(bytes).await;
                wasm_server = Some(addr);
                module_server = Some(task);
            }
            let lo = envoy_gateway::Loopback {
                dir: dir.path().join("xds"),
                admin_port: free_port(),
                wasm_server,
                wasm_sha256,
                native_module: Flavor::Native.artefact(),
                endpoints,
            };
            envoy_gateway::translate(docs, EG_LISTENER, &lo).unwrap()
        }
    };
    for d in &translated.dropped {
        eprintln!("{plane} {flavor}: DROPPED PATCH {d}");
    }
    let proxy = Proxy::start(
        &dir,
        &translated.bootstrap,
        &translated.env,
        workers,
        &translated.listener,
    )
    .await
    .unwrap_or_else(|e| panic!("{plane} {flavor}: {e:#}"));
    let base = proxy.base_url();
    warm_up(&base, flavor, &[], || proxy.log_tail(30)).await;
    if flavor == Flavor::Wasm && workers == 1 {
        // The worker's VM claims the owner's lease once the roster has settled: let it, and
        // have a request make it claim now rather than in the middle of a run.
        let settle = infergate_filters::election::CLAIM_SETTLE_MS;
        tokio::time::sleep(Duration::from_millis(settle + 100)).await;
        warm_up(&base, flavor, &[], || proxy.log_tail(30)).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every resource the translation wrote was accepted: a refused cluster or listener
    // would otherwise show only as a missing member.
    let rejected = proxy.stat("update_rejected").await;
    assert_eq!(
        rejected,
        0,
        "{plane} {flavor}: an xDS update was rejected; {}",
        proxy.log_tail(40)
    );
    let warm_fallbacks = proxy.stat("infergate.picker.owner_fallbacks").await.max(0);
    Installed {
        proxy,
        warm_fallbacks,
        translated,
        module_server,
        dir,
    }
}

fn chat(model: &str, text: &str) -> Json {
    json!({"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": text}]})
}

/// Until the scraper has published the pool's members, the pool answers 503.
async fn warm_up(base: &str, flavor: Flavor, headers: &[(&str, &str)], log: impl Fn() -> String) {
    let url = format!("{base}/v1/chat/completions");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let resp = post_json(&url, &chat(MODEL, "warm up"), headers)
            .await
            .unwrap();
        if resp.status == 200 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{flavor}: still {} {} after 15 s; {}",
            resp.status,
            resp.text(),
            log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn simulated(replicas: u32) -> SimHandle {
    sim::start(SimConfig {
        replicas,
        models: vec![MODEL.into()],
        loras: vec!["support-assistant-v1".into(), "support-assistant-v2".into()],
        ..SimConfig::default()
    })
    .await
    .unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    infergate_harness::launch::runtime().unwrap()
}

// ---- What istiod would apply. ----

/// For 1.28, 1.29 and 1.30, both flavours: the translation of the rendered manifests drops
/// no patch, and puts the gateway's filters before Envoy's router in chain order, each Wasm
/// filter through ECDS with `vm_id ""` and no `allow_on_headers_stop_iteration`. A
/// `BOOTSTRAP` patch and a patch anchored on a filter the listener lacks are dropped (and
/// reported) as istiod would.
#[test]
fn every_rendered_version_drops_no_patch() {
    for flavor in [Flavor::Wasm, Flavor::Native] {
        for version in [
            IstioVersion::V1_28,
            IstioVersion::V1_29,
            IstioVersion::V1_30,
        ] {
            let dir = RunDir::new("cp-drops").unwrap();
            let mut opts = options(
                flavor,
                Target::Istio,
                &dir.path().join("out"),
                seed_objects(),
            );
            opts.istio_version = version;
            let docs = istio_docs(opts);
            let lo = istio::Loopback {
                dir: dir.path().join("xds"),
                admin_port: 1,
                wasm_module: Some("/nonexistent/module.wasm".into()),
                native_module: Some("/nonexistent/libinfergate_envoy.so".into()),
                endpoints: BTreeMap::new(),
            };
            let t = istio::translate(&docs, &lo).unwrap();
            let ctx = format!("{flavor} Istio {version}");
            for d in &t.dropped {
                eprintln!("{ctx}: DROPPED PATCH {d}");
            }
            assert!(t.dropped.is_empty(), "{ctx}: {:?}", t.dropped);
            let lds: Json = serde_json::from_str(
                &std::fs::read_to_string(dir.path().join("xds/lds.json")).unwrap(),
            )
            .unwrap();
            let names: Vec<String> = lds["resources"][0]["filter_chains"][0]["filters"][0]
                ["typed_config"]["http_filters"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["name"].as_str().unwrap().to_owned())
                .collect();
            let ours: Vec<&str> = names
                .iter()
                .map(String::as_str)
                .skip_while(|n| !n.starts_with("infergate."))
                .collect();
            let expected: Vec<&str> = match flavor {
                Flavor::Wasm => infergate_cli::render::istio::WASM_CHAIN.to_vec(),
                _ => vec!["infergate.router", "infergate.picker"],
            };
            assert_eq!(
                &ours[..ours.len() - 1],
                expected.as_slice(),
                "{ctx}: {names:?}"
            );
            assert_eq!(ours.last(), Some(&"envoy.filters.http.router"), "{ctx}");
            for (name, ext) in &t.ecds {
                let config = &ext["typed_config"]["config"];
                assert_eq!(config["vm_config"]["vm_id"], "", "{ctx}: {name}");
                assert!(
                    config.get("allow_on_headers_stop_iteration").is_none(),
                    "{ctx}: {name}"
                );
                assert_eq!(
                    config["vm_config"]["code"]["local"]["filename"], "/nonexistent/module.wasm",
                    "{ctx}: {name}"
                );
            }
            assert_eq!(
                t.ecds.len(),
                if flavor == Flavor::Wasm { 3 } else { 0 },
                "{ctx}"
            );
        }
    }
    // What istiod drops, the translator drops and says so.
    let dir = RunDir::new("cp-drops-neg").unwrap();
    let mut docs = istio_docs(options(
        Flavor::Native,
        Target::Istio,
        &dir.path().join("out"),
        seed_objects(),
    ));
    let ef = docs
        .iter_mut()
        .find(|d| d["kind"] == "EnvoyFilter")
        .unwrap();
    let patches = ef["spec"]["configPatches"].as_array_mut().unwrap();
    patches.push(
        json!({"applyTo": "BOOTSTRAP", "patch": {"operation": "MERGE", "value": {
        "bootstrap_extensions": [{"name": "infergate.scraper"}]}}}),
    );
    patches.push(json!({"applyTo": "HTTP_FILTER", "match": {"context": "GATEWAY", "listener": {"filterChain": {
        "filter": {"name": "envoy.filters.network.http_connection_manager",
                   "subFilter": {"name": "istio.stats.missing"}}}}},
        "patch": {"operation": "INSERT_AFTER", "value": {"name": "lost"}}}));
    let lo = istio::Loopback {
        dir: dir.path().join("xds"),
        admin_port: 1,
        wasm_module: None,
        native_module: Some("/nonexistent/libinfergate_envoy.so".into()),
        endpoints: BTreeMap::new(),
    };
    let t = istio::translate(&docs, &lo).unwrap();
    for d in &t.dropped {
        eprintln!("negative case: DROPPED PATCH {d}");
    }
    assert_eq!(t.dropped.len(), 2, "{:?}", t.dropped);
    assert!(t.dropped[0].starts_with("BOOTSTRAP"));
    assert!(t.dropped[1].contains("lost"));
}

/// Both flavours: Envoy Gateway's translation of the rendered manifests drops no patch;
/// the Wasm chain's buffer filter sits before `headers` and the route refresh before the
/// picker, each policy filter is disabled at the connection manager and enabled on every
/// route, and no Wasm filter sets `allow_on_headers_stop_iteration`.
#[test]
fn envoy_gateway_render_drops_no_patch() {
    for flavor in [Flavor::Wasm, Flavor::Native] {
        let dir = RunDir::new("cp-eg-drops").unwrap();
        let docs = plane_docs(
            Plane::EnvoyGateway,
            options(
                flavor,
                Target::EnvoyGateway,
                &dir.path().join("out"),
                seed_objects(),
            ),
        );
        let lo = envoy_gateway::Loopback {
            dir: dir.path().join("xds"),
            admin_port: 1,
            wasm_server: Some(SocketAddr::from(([127, 0, 0, 1], 1))),
            wasm_sha256: "00".repeat(32),
            native_module: Some("/nonexistent/libinfergate_envoy.so".into()),
            endpoints: BTreeMap::new(),
        };
        let t = envoy_gateway::translate(&docs, EG_LISTENER, &lo).unwrap();
        assert!(t.dropped.is_empty(), "{flavor}: {:?}", t.dropped);
        let lds: Json = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("xds/lds.json")).unwrap(),
        )
        .unwrap();
        let filters = lds["resources"][0]["default_filter_chain"]["filters"][0]["typed_config"]
            ["http_filters"]
            .as_array()
            .unwrap()
            .clone();
        let names: Vec<&str> = filters
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        let policy = |kind: &str, i: usize| {
            format!(
                "envoy.filters.http.{kind}/envoyextensionpolicy/gateway-system/infergate/{}/{i}",
                if kind == "wasm" {
                    "wasm"
                } else {
                    "dynamic-module"
                }
            )
        };
        let expected: Vec<String> = match flavor {
            Flavor::Wasm => vec![
                policy("wasm", 0),
                "infergate.buffer".into(),
                policy("wasm", 1),
                "infergate.route_refresh".into(),
                policy("wasm", 2),
                "envoy.filters.http.router".into(),
            ],
            _ => vec![
                policy("dynamic_modules", 0),
                policy("dynamic_modules", 1),
                "envoy.filters.http.router".into(),
            ],
        };
        assert_eq!(names, expected, "{flavor}");
        for f in &filters {
            let ours = f["name"].as_str().unwrap().contains("envoyextensionpolicy");
            assert_eq!(
                f["disabled"].as_bool().unwrap_or(false),
                ours,
                "{flavor}: {f}"
            );
            assert!(f["typed_config"]["config"]
                .get("allow_on_headers_stop_iteration")
                .is_none());
        }
        let rds: Json = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("xds/rds.json")).unwrap(),
        )
        .unwrap();
        for route in rds["resources"][0]["virtual_hosts"][0]["routes"]
            .as_array()
            .unwrap()
        {
            let enabled = route["typed_per_filter_config"].as_object().unwrap();
            assert_eq!(
                enabled.len(),
                if flavor == Flavor::Wasm { 3 } else { 2 },
                "{flavor}: {route}"
            );
        }
    }
}

// ---- Routing. ----

#[test]
fn istio_routing() {
    runtime().block_on(async {
        for flavor in [Flavor::Wasm, Flavor::Native] {
            if unbuilt(flavor) {
                continue;
            }
            routing(Plane::Istio, flavor).await;
        }
    });
}

#[test]
fn envoy_gateway_routing() {
    runtime().block_on(async {
        for flavor in [Flavor::Wasm, Flavor::Native] {
            if unbuilt(flavor) {
                continue;
            }
            routing(Plane::EnvoyGateway, flavor).await;
        }
    });
}

async fn routing(plane: Plane, flavor: Flavor) {
    let sim = simulated(3).await;
    let replicas = sim.addrs()[..2].to_vec();
    let dir = RunDir::new("cp-route").unwrap();
    let docs = plane_docs(
        plane,
        options(flavor, plane.target(), dir.path(), seed_objects()),
    );
    let gw = install(plane, flavor, &docs, &replicas, 2).await;
    let flavor = format!("{plane} {flavor}");
    let url = format!("{}/v1/chat/completions", gw.proxy.base_url());
    let pool: Vec<String> = replicas.iter().map(ToString::to_string).collect();
    for i in 0..6 {
        let resp = post_json(&url, &chat(MODEL, &format!("question {i}")), &[])
            .await
            .unwrap();
        assert_eq!(resp.status, 200, "{flavor}: {}", resp.text());
        let served = resp
            .header("x-gateway-destination-endpoint-served")
            .unwrap_or_default();
        assert!(
            pool.iter().any(|p| p == served),
            "{flavor}: served by `{served}`"
        );
    }
    // A client's own gateway headers steer nothing.
    for (name, value) in [
        ("x-gateway-destination-endpoint", "127.0.0.1:1"),
        ("x-gateway-base-model-name", "no-such-model"),
    ] {
        let resp = post_json(&url, &chat(MODEL, "steer"), &[(name, value)])
            .await
            .unwrap();
        assert_eq!(resp.status, 200, "{flavor}: {name}: {}", resp.text());
    }
    let resp = post_json(&url, &chat("support-assistant", "hello"), &[])
        .await
        .unwrap();
    assert_eq!(resp.status, 200, "{flavor}: {}", resp.text());
    // A body past the router's limit (4 MiB) gets the router's own 413 (OpenAI JSON), not
    // Envoy's plain text: Istio leaves the listener's buffer limit at Envoy's 1 MiB default.
    let big = chat(MODEL, &"x".repeat((4 << 20) + 4096));
    let resp = post_json(&url, &big, &[]).await.unwrap();
    assert_eq!(resp.status, 413, "{flavor}: {}", resp.text());
    assert!(
        resp.json().is_ok_and(|j| j.get("error").is_some()),
        "{flavor}: {}",
        resp.text()
    );
    // A 2 MiB body, past Envoy's default buffer limit and within the router's, reaches a
    // replica (which refuses its 500k tokens of context: the engine's 400).
    let two = chat(MODEL, &"y".repeat(2 << 20));
    let resp = post_json(&url, &two, &[]).await.unwrap();
    assert!(
        resp.header("x-gateway-destination-endpoint-served")
            .is_some()
            && resp.status != 413,
        "{flavor}: 2 MiB body: {} {}",
        resp.status,
        resp.text()
    );
    let resp = post_json(&url, &chat("no-such-model", "hello"), &[])
        .await
        .unwrap();
    assert_eq!(resp.status, 404, "{flavor}: {}", resp.text());
    // The Envoy the control plane would run has what the tier claims: its listener, its
    // clusters, (Istio) Wasm by ECDS.
    let dump = gw
        .proxy
        .admin_json("/config_dump")
        .await
        .unwrap()
        .to_string();
    assert!(dump.contains(&gw.translated.listener), "{flavor}");
    assert!(dump.contains(&gw.translated.clusters[SERVICE]), "{flavor}");
    if !gw.translated.ecds.is_empty() {
        assert!(
            dump.contains("EcdsConfigDump"),
            "{flavor}: no ECDS in the config dump"
        );
    }
    let stats = gw.proxy.stats().await.unwrap();
    let custom: Vec<&str> = stats
        .iter()
        .map(|(k, _)| k)
        .filter(|k| k.contains("custom.infergate.scraper") || k.contains("custom.infergate.picker"))
        .take(3)
        .collect();
    // The module's own stats reach the admin (under Istio's stats matcher too).
    assert!(
        !custom.is_empty(),
        "{flavor}: no infergate stat in the admin"
    );
    let mut gw = gw;
    assert!(gw.proxy.running(), "{flavor}: Envoy exited");
    eprintln!("ROUTING {flavor}: ok; infergate stats visible: {custom:?}");
}

// ---- Membership by EDS. ----

#[test]
fn istio_eds_membership_change() {
    runtime().block_on(eds_membership_change(Plane::Istio));
}

#[test]
fn envoy_gateway_eds_membership_change() {
    runtime().block_on(eds_membership_change(Plane::EnvoyGateway));
}

async fn eds_membership_change(plane: Plane) {
    for flavor in [Flavor::Wasm, Flavor::Native] {
        if unbuilt(flavor) {
            continue;
        }
        let sim = simulated(3).await;
        let all = sim.addrs().to_vec();
        let dir = RunDir::new("cp-eds").unwrap();
        let docs = plane_docs(
            plane,
            options(flavor, plane.target(), dir.path(), seed_objects()),
        );
        let gw = install(plane, flavor, &docs, &all[..2], 2).await;
        let url = format!("{}/v1/chat/completions", gw.proxy.base_url());
        let written = std::time::Instant::now();
        gw.translated.write_members(SERVICE, &all).unwrap();
        let newcomer = all[2].to_string();
        let mut i = 0;
        loop {
            i += 1;
            let resp = post_json(&url, &chat(MODEL, &format!("after scale-up {i}")), &[])
                .await
                .unwrap();
            assert_eq!(resp.status, 200, "{plane} {flavor}: {}", resp.text());
            if resp.header("x-gateway-destination-endpoint-served") == Some(newcomer.as_str()) {
                break;
            }
            assert!(
                written.elapsed() < Duration::from_secs(5),
                "{plane} {flavor}: newcomer unpicked"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // And a member removed by EDS is never picked again.
        gw.translated.write_members(SERVICE, &all[1..]).unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
        let gone = all[0].to_string();
        for j in 0..12 {
            let resp = post_json(&url, &chat(MODEL, &format!("after scale-down {j}")), &[])
                .await
                .unwrap();
            assert_eq!(resp.status, 200, "{plane} {flavor}: {}", resp.text());
            assert_ne!(
                resp.header("x-gateway-destination-endpoint-served"),
                Some(gone.as_str()),
                "{plane} {flavor}"
            );
        }
        eprintln!(
            "EDS {plane} {flavor}: newcomer picked {:?} after the write (request {i}); the removed member unpicked",
            written.elapsed()
        );
    }
}

// ---- Tenants: billed on stdout. ----

#[test]
fn istio_tenants_bill_on_stdout() {
    runtime().block_on(async {
        for flavor in [Flavor::Wasm, Flavor::Native] {
            if unbuilt(flavor) {
                continue;
            }
            let dir = RunDir::new("cp-tenants").unwrap();
            let objects = shared::objects_with_tenants(&dir.path().join("objects"));
            let mut opts = options(flavor, Target::Istio, &dir.path().join("out"), objects);
            opts.gateway.no_tenants = false;
            opts.gateway.billing_log = Some("/var/log/infergate/billing.log".into());
            let docs = istio_docs(opts);
            let sim = simulated(2).await;
            let key = "Bearer sk-infergate-test-tenant-a";
            let dir2 = RunDir::new("cp-tenants-run").unwrap();
            let lo = istio::Loopback {
                dir: dir2.path().join("xds"),
                admin_port: free_port(),
                wasm_module: Flavor::Wasm.artefact(),
                native_module: Flavor::Native.artefact(),
                endpoints: BTreeMap::from([(SERVICE.to_owned(), sim.addrs().to_vec())]),
            };
            let t = istio::translate(&docs, &lo).unwrap();
            assert!(t.dropped.is_empty(), "{flavor}: {:?}", t.dropped);
            let proxy = Proxy::start(&dir2, &t.bootstrap, &t.env, 2, &t.listener)
                .await
                .unwrap();
            warm_up(&proxy.base_url(), flavor, &[("authorization", key)], || {
                proxy.log_tail(30)
            })
            .await;
            let url = format!("{}/v1/chat/completions", proxy.base_url());
            let resp = post_json(&url, &chat(MODEL, "who am I"), &[])
                .await
                .unwrap();
            assert_eq!(resp.status, 401, "{flavor}: {}", resp.text());
            for i in 0..3 {
                let resp = post_json(
                    &url,
                    &chat(MODEL, &format!("tenant a {i}")),
                    &[("authorization", key)],
                )
                .await
                .unwrap();
                assert_eq!(resp.status, 200, "{flavor}: {}", resp.text());
            }
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            loop {
                let records = proxy.stdout_json();
                let a = records
                    .iter()
                    .filter(|r| r["tenant"] == "tenant-a" && r["status"] == 200)
                    .count();
                if a >= 4 {
                    eprintln!(
                        "ISTIO TENANTS {flavor}: {a} records of tenant-a on stdout, e.g. {}",
                        records[0]
                    );
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{flavor}: stdout records {records:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
}

// ---- Another vendor's plugin in the same vm_id "". ----

/// The neighbour plugin, built like the wasm-host harness builds its test module.
fn neighbour() -> PathBuf {
    let manifest =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/control_plane/neighbour/Cargo.toml");
    let target = infergate_artefacts::workspace_root().join("target/control-plane-neighbour");
    let status = std::process::Command::new(env!("CARGO"))
        .args([
            "build",
            "--quiet",
            "--release",
            "--target",
            "wasm32-wasip1",
            "--manifest-path",
        ])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .status()
        .unwrap();
    assert!(status.success(), "building the neighbour plugin failed");
    target.join("wasm32-wasip1/release/control_plane_neighbour.wasm")
}

#[test]
fn istio_another_wasm_plugin_shares_vm_id_empty() {
    if unbuilt(Flavor::Wasm) {
        return;
    }
    let module = neighbour();
    runtime().block_on(async {
        let sim = simulated(2).await;
        let dir = RunDir::new("cp-neighbour").unwrap();
        let mut docs = istio_docs(options(Flavor::Wasm, Target::Istio, dir.path(), seed_objects()));
        // Another vendor's EnvoyFilter, first in the chain, the module a file istio-agent
        // would have fetched already (`file://`: the translator leaves local code alone).
        let name = "vendor.neighbour";
        docs.push(json!({"apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter",
            "metadata": {"name": "neighbour", "namespace": "gateway-system"},
            "spec": {"configPatches": [
                {"applyTo": "HTTP_FILTER", "match": {"context": "GATEWAY", "listener": {"filterChain": {"filter": {
                    "name": "envoy.filters.network.http_connection_manager"}}}},
                 "patch": {"operation": "INSERT_FIRST", "value": {"name": name, "config_discovery": {
                    "config_source": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"},
                    "type_urls": ["type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"]}}}},
                {"applyTo": "EXTENSION_CONFIG", "patch": {"operation": "ADD", "value": {"name": name,
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                        "config": {"name": name, "root_id": "neighbour",
                            "vm_config": {"vm_id": "", "runtime": "envoy.wasm.runtime.v8",
                                "environment_variables": {"key_values": {"ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION": "7"}},
                                "code": {"local": {"filename": module}}}}}}}}]}}));
        let gw = install(Plane::Istio, Flavor::Wasm, &docs, sim.addrs(), 2).await;
        let url = format!("{}/v1/chat/completions", gw.proxy.base_url());
        let mut counts = Vec::new();
        for i in 0..10 {
            let resp = post_json(&url, &chat(MODEL, &format!("neighbourly {i}")), &[]).await.unwrap();
            assert_eq!(resp.status, 200, "{}", resp.text());
            counts.push(resp.header("x-neighbour-count").unwrap_or("-").parse::<u64>().unwrap_or(0));
        }
        // Its counter is one process-wide count (shared data), moving with every request.
        assert!(counts.windows(2).all(|w| w[1] > w[0]), "{counts:?}");
        let fallbacks =
            gw.proxy.stat("infergate.picker.owner_fallbacks").await - gw.warm_fallbacks;
        eprintln!("ISTIO NEIGHBOUR: counts {counts:?}; owner fallbacks {fallbacks}");
        assert_eq!(fallbacks, 0);
    });
}

// ---- The owner's VM dies or its configuration is replaced, under load. ----

/// How the scenario takes the owner away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Takeaway {
    /// A request with the test build's trap header makes the owner's VM trap at its next
    /// tick; `FAIL_RELOAD` starts a fresh VM on that worker.
    Kill,
    /// The control plane pushes a new picker configuration (ECDS under Istio for Wasm, the
    /// listener otherwise): every old root context ends, the owner's among them.
    Reload,
}

/// Pushes a changed picker configuration: in every xDS file of `dir`, the plugin
/// configuration whose role is `picker` gets its scraper timeout one millisecond longer.
/// Each file is replaced by a rename, as a control plane's push lands at once.
fn push_new_picker_config(dir: &Path) -> usize {
    fn bump(v: &mut Json) -> usize {
        match v {
            Json::String(text) => {
                let Ok(mut config) = serde_json::from_str::<Json>(text) else {
                    return 0;
                };
                if config["role"] != "picker" {
                    return 0;
                }
                let t = config["scraper"]["timeoutMs"].as_u64().unwrap_or(250);
                config["scraper"]["timeoutMs"] = json!(t + 1);
                *text = config.to_string();
                1
            }
            Json::Array(a) => a.iter_mut().map(bump).sum(),
            Json::Object(m) => m.values_mut().map(bump).sum(),
            _ => 0,
        }
    }
    let mut pushed = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let mut doc: Json = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let n = bump(&mut doc);
        if n > 0 {
            doc["version_info"] = json!("2");
            let tmp = path.with_extension("json.next");
            std::fs::write(&tmp, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
            std::fs::rename(&tmp, &path).unwrap();
            pushed += n;
        }
    }
    pushed
}

/// Under 4 workers and multi-turn load, the owner is taken away (`how`). Holds: no request
/// fails, none waits as long as 1.5 s; (Wasm) another VM takes the lease within 1 s and the
/// in-flight gauges read zero within a few ticks of the load's end.
async fn owner_taken_away(plane: Plane, flavor: Flavor, how: Takeaway) {
    let ctx = format!("{plane} {flavor} {how:?}");
    let sim = simulated(4).await;
    let dir = RunDir::new("cp-failover").unwrap();
    let docs = plane_docs(
        plane,
        options(flavor, plane.target(), dir.path(), seed_objects()),
    );
    let gw = install(plane, flavor, &docs, sim.addrs(), 4).await;
    let url = format!("{}/v1/chat/completions", gw.proxy.base_url());
    let wasm = flavor == Flavor::Wasm;
    let takeovers = gw.proxy.stat("infergate.owner.takeovers").await;
    assert!(!wasm || takeovers >= 1, "{ctx}: no owner elected");
    let (clients, outcomes) = conversations::converse(&url, MODEL, 4, Duration::from_secs(4));
    tokio::time::sleep(Duration::from_millis(800)).await;
    let at = std::time::Instant::now();
    match how {
        Takeaway::Kill => {
            let resp = post_json(&url, &chat(MODEL, "die"), &[(TRAP_HEADER, "1")])
                .await
                .unwrap();
            assert_eq!(
                resp.status, 200,
                "{ctx}: the asking request itself is served"
            );
        }
        Takeaway::Reload => {
            let pushed = push_new_picker_config(&gw.dir.path().join("xds"));
            assert!(pushed >= 1, "{ctx}: no picker configuration to push");
        }
    }
    let mut taken_over = None;
    while wasm && at.elapsed() < Duration::from_secs(3) {
        if gw.proxy.stat("infergate.owner.takeovers").await > takeovers {
            taken_over = Some(at.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for c in clients {
        c.await.unwrap();
    }
    let outcomes = outcomes.lock().unwrap().clone();
    let failed: Vec<_> = outcomes.iter().filter(|(s, _, _)| *s != 200).collect();
    let slowest = outcomes
        .iter()
        .map(|(_, d, _)| *d)
        .max()
        .unwrap_or_default();
    let mut inflight = -1;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        inflight = gw.proxy.stat("infergate.picker.inflight_requests").await;
        if inflight <= 0 {
            break;
        }
    }
    let resends = gw.proxy.stat("infergate.picker.owner_resends").await;
    eprintln!(
        "FAILOVER {ctx}: takeover {taken_over:?} after the {how:?}; {} requests under load, {} \
         failed, slowest {slowest:?}; {resends} picks resent; in-flight after the load {inflight}",
        outcomes.len(),
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{ctx}: failed: {failed:?}; {}",
        gw.proxy.log_tail(30)
    );
    assert!(
        slowest < Duration::from_millis(1500),
        "{ctx}: a request took {slowest:?}"
    );
    if wasm {
        let taken_over = taken_over.unwrap_or_else(|| panic!("{ctx}: no VM took the lease over"));
        assert!(
            taken_over <= Duration::from_secs(1),
            "{ctx}: takeover after {taken_over:?}"
        );
        assert_eq!(inflight, 0, "{ctx}: in-flight gauges after the load");
    }
    drop(gw);
    sim.shutdown().await;
}

#[test]
fn istio_owner_failover_under_load() {
    runtime().block_on(async {
        if !unbuilt(Flavor::Wasm) {
            if has_test_stages() {
                owner_taken_away(Plane::Istio, Flavor::Wasm, Takeaway::Kill).await;
            } else {
                eprintln!("SKIPPED the kill: the Wasm module has no test stages");
            }
            owner_taken_away(Plane::Istio, Flavor::Wasm, Takeaway::Reload).await;
        }
        if !unbuilt(Flavor::Native) {
            owner_taken_away(Plane::Istio, Flavor::Native, Takeaway::Reload).await;
        }
    });
}

#[test]
fn envoy_gateway_owner_failover_under_load() {
    runtime().block_on(async {
        for flavor in [Flavor::Wasm, Flavor::Native] {
            if !unbuilt(flavor) {
                owner_taken_away(Plane::EnvoyGateway, flavor, Takeaway::Reload).await;
            }
        }
    });
}

// ---- The multi-turn affinity workload, control plane against bare Envoy. ----

fn long_form() -> bool {
    std::env::var_os("INFERGATE_CP_LONG").is_some()
}

fn affinity_workload() -> Workload {
    let long = long_form();
    Workload {
        model: MODEL.into(),
        conversations: if long { 64 } else { 16 },
        turns: if long { 6 } else { 3 },
        system_tokens: if long { 4000 } else { 2000 },
        max_tokens: if long { 600 } else { 48 },
        ..Workload::default()
    }
}

async fn run_workload(base: &str, label: &str, salt: u64) -> Summary {
    let cfg = LoadConfig {
        workload: affinity_workload(),
        concurrency: if long_form() { 16 } else { 8 },
        ..LoadConfig::default()
    };
    let target = LoadTarget {
        label: label.into(),
        urls: vec![base.to_owned()],
        assign: Assign::Random,
        connections: Connections::PerRequest,
    };
    let report = run_target(&cfg, &target, salt).await.unwrap();
    assert!(
        report.summary.errors.is_empty(),
        "{label}: {:?}",
        report.summary.errors
    );
    report.summary
}

#[test]
fn affinity_matches_bare_envoy() {
    runtime().block_on(async {
        let mut lines = Vec::new();
        for flavor in [Flavor::Wasm, Flavor::Native] {
            if unbuilt(flavor) {
                continue;
            }
            for workers in [1u32, 4] {
                let sim = sim::start(SimConfig {
                    replicas: 4,
                    models: vec![MODEL.into()],
                    time_scale: 2.0,
                    engine: EngineConfig {
                        kv_capacity_tokens: 160_000,
                        prefill_tokens_per_s: 16_000.0,
                        ..EngineConfig::default()
                    },
                    ..SimConfig::default()
                })
                .await
                .unwrap();
                // Bare Envoy: the `--target envoy` rendering of the same objects.
                let dir = RunDir::new("cp-bare").unwrap();
                let mut opts = options(flavor, Target::Envoy, dir.path(), seed_objects());
                opts.gateway.endpoints = vec![(POOL.into(), sim.addrs().iter().map(ToString::to_string).collect())];
                let out = render(&opts).unwrap();
                let text = std::fs::read_to_string(&out.output).unwrap();
                let bare = Envoy::start(&text, &EnvoyOptions { concurrency: workers, ..EnvoyOptions::default() })
                    .await
                    .unwrap();
                warm_up(&bare.base_url(), flavor, &[], || bare.log_tail(20)).await;
                let b = run_workload(&bare.base_url(), "bare", 1).await;
                drop(bare);
                for (plane, salt) in [(Plane::Istio, 2), (Plane::EnvoyGateway, 3)] {
                    let docs = plane_docs(plane, options(flavor, plane.target(), &dir.path().join(format!("{plane:?}")), seed_objects()));
                    let gw = install(plane, flavor, &docs, sim.addrs(), workers).await;
                    let i = run_workload(&gw.proxy.base_url(), &plane.to_string(), salt).await;
                    let fallbacks = gw.proxy.stat("infergate.picker.owner_fallbacks").await - gw.warm_fallbacks;
                    drop(gw);
                    let line = format!(
                        "AFFINITY {plane} {flavor} {workers} worker(s), {} requests: hit ratio bare {:.3} {plane} {:.3}; \
                         TTFT p50 bare {:.1} ms {plane} {:.1} ms ({:+.1}%); owner fallbacks {fallbacks}",
                        i.requests,
                        b.cache_hit_ratio,
                        i.cache_hit_ratio,
                        b.ttft_p50_s * 1e3,
                        i.ttft_p50_s * 1e3,
                        (i.ttft_p50_s / b.ttft_p50_s - 1.0) * 100.0
                    );
                    eprintln!("{line}");
                    lines.push((flavor, b.clone(), i, fallbacks, line));
                }
                sim.shutdown().await;
            }
        }
        for (flavor, b, i, fallbacks, line) in &lines {
            assert!((b.cache_hit_ratio - i.cache_hit_ratio).abs() <= 0.02, "{line}");
            // The short form's TTFT is 48 requests on a shared machine: one run swung
            // +37% and -23% with identical hit ratios, so only the long form holds it.
            if long_form() {
                assert!((i.ttft_p50_s / b.ttft_p50_s - 1.0).abs() <= 0.10, "{line}");
            }
            if *flavor == Flavor::Wasm {
                assert_eq!(*fallbacks, 0, "{line}");
            }
        }
    });
}
