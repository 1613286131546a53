//! `infergate render` on the seed's objects (`testdata/objects/`, verbatim), through a real
//! Envoy: the rendered bootstrap of each flavour passes `envoy --mode validate`, and Envoy
//! started on it serves the basic routing check against simulated replicas (a chat request
//! for the seed route's model answers 200 from a pool replica, with the picker's served
//! header naming it; a model no route serves gets the gateway's 404; the seed's rewrite
//! name reaches the pool as one of its adapters).
//!
//! A flavour whose module is not built is skipped with a note (as the e2e suite does).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "shared/objects.rs"]
mod shared;
use infergate_artefacts::workspace_root;
use infergate_cli::render::{render, GatewayInputs, IstioVersion, RenderOptions, Target};
use infergate_harness::launch::binary::envoy_binary;
use infergate_harness::launch::client::post_json;
use infergate_harness::launch::jwt::TestIssuer;
use infergate_harness::launch::process::RunDir;
use infergate_harness::launch::read_billing_log;
use infergate_harness::launch::{EdsDir, Envoy, EnvoyOptions, Flavor, Membership};
use infergate_harness::sim::{self, SimConfig};
use serde_json::json;
use shared::seed_objects;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

const POOL: &str = "llama-70b-bf16";
const MODEL: &str = "llama-70b";

fn unbuilt(flavor: Flavor) -> bool {
    match flavor.artefact() {
        Some(m) if m.is_file() => false,
        other => {
            eprintln!("skipping {flavor}: module {other:?} is not built (cargo xtask build)");
            true
        }
    }
}

fn options(
    flavor: Flavor,
    out: &Path,
    endpoints: &[SocketAddr],
    no_tenants: bool,
) -> RenderOptions {
    RenderOptions {
        objects: seed_objects(),
        target: Target::Envoy,
        istio_version: IstioVersion::default(),
        out: out.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        // The Wasm scraper reads the EDS members from admin /clusters through a STATIC
        // cluster, so the admin port must be known before Envoy starts.
        admin: SocketAddr::from(([127, 0, 0, 1], free_port())),
        image: "oci://registry.test/infergate-wasm:test".into(),
        membership: Membership::Eds,
        eds_dir: None,
        gateway: GatewayInputs {
            flavor,
            endpoints: vec![(
                POOL.into(),
                endpoints.iter().map(ToString::to_string).collect(),
            )],
            module: None,
            no_tenants,
            jwks: None,
            billing_log: None,
            per_request_split: false,
            peers: None,
            cluster: None,
            peer_mode: infergate_cli::config::bootstrap::PeerMode::Parent,
            peer_api_key: None,
            export_members: false,
        },
    }
}

/// A port the kernel just handed out (and took back).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `envoy --mode validate -c <bootstrap>`; panics with Envoy's output unless it passes.
fn validate(bootstrap: &Path) {
    let out = std::process::Command::new(envoy_binary().unwrap())
        .args(["--mode", "validate", "--log-level", "warn", "-c"])
        .arg(bootstrap)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "envoy --mode validate -c {} failed:\n{}\n{}",
        bootstrap.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The seed's quota files hold shortened placeholder key hashes: rendered as they are,
/// the tenant stage refuses the first one, naming the object and the field.
#[test]
fn the_seed_quotas_placeholder_hashes_are_refused_by_path() {
    let dir = RunDir::new("render-refused").unwrap();
    let err = render(&options(Flavor::Native, dir.path(), &[], false)).unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("TenantQuota tenant-a") && text.contains("spec.identity.apiKeyHashes[0]"),
        "{text}"
    );
}

/// Both flavours: the bootstrap validates, the report is written and names the fields the
/// gateway does not honour.
#[test]
fn both_flavours_render_a_bootstrap_envoy_validates() {
    for flavor in [Flavor::Wasm, Flavor::Native] {
        let dir = RunDir::new("render-validate").unwrap();
        let endpoints: Vec<SocketAddr> = vec!["10.0.0.1:8000".parse().unwrap()];
        let out = render(&options(flavor, dir.path(), &endpoints, true)).unwrap();
        let lines = out.not_supported.join("\n");
        for expected in [
            "InferencePool serving/llama-70b-bf16 spec.selector: pods are not watched",
            "InferencePool serving/llama-70b-bf16 spec.endpointPickerRef.name:",
            "HTTPRoute serving/llama-70b: the one in httproute-canary.yaml is replaced by the one in httproute.yaml",
            "TenantQuota tenant-a: not rendered (--no-tenants)",
        ] {
            assert!(lines.contains(expected), "{flavor}: `{expected}` not in:\n{lines}");
        }
        // The pool cluster is fed by file-based EDS from the out dir, holding the endpoints.
        let bootstrap: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(&out.output).unwrap()).unwrap();
        let clusters = bootstrap["static_resources"]["clusters"]
            .as_sequence()
            .unwrap();
        let pool = clusters
            .iter()
            .find(|c| c["name"] == "pool-0-llama-70b-bf16")
            .unwrap();
        assert_eq!(pool["type"].as_str(), Some("EDS"), "{flavor}: {pool:?}");
        // The seed route's `PathPrefix /v1` is the route's prefix.
        let routes = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"]
            [0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
            .as_sequence()
            .unwrap();
        assert_eq!(routes.len(), 1, "{flavor}: {routes:?}");
        assert_eq!(
            routes[0]["match"]["prefix"].as_str(),
            Some("/v1"),
            "{flavor}"
        );
        assert_eq!(
            routes[0]["route"]["cluster"].as_str(),
            Some("pool-0-llama-70b-bf16"),
            "{flavor}"
        );
        let eds_file = dir.path().join("eds/pool-0-llama-70b-bf16.json");
        let eds = std::fs::read_to_string(&eds_file).unwrap();
        assert!(eds.contains("10.0.0.1"), "{eds}");
        assert!(dir
            .path()
            .join("eds/pool-0-llama-70b-bf16.example.json")
            .is_file());
        assert!(!dir.path().join("istio.yaml").exists());
        let readme = std::fs::read_to_string(&out.readme).unwrap();
        assert!(
            readme.contains("envoy --mode validate -c envoy.yaml"),
            "{readme}"
        );
        if unbuilt(flavor) {
            continue;
        }
        validate(&out.output);
    }
}

/// The bootstrap of each flavour, started on simulated replicas, serves the basic routing
/// check.
#[test]
fn the_rendered_bootstrap_serves_the_basic_routing_check() {
    let rt = infergate_harness::launch::runtime().unwrap();
    rt.block_on(async {
        for flavor in [Flavor::Native, Flavor::Wasm] {
            if unbuilt(flavor) {
                continue;
            }
            serves(flavor).await;
        }
    });
}

fn chat(model: &str, text: &str) -> serde_json::Value {
    json!({"model": model, "max_tokens": 8,
           "messages": [{"role": "user", "content": text}]})
}

/// Envoy on the rendered bootstrap, once its scraper has published a snapshot.
async fn start_envoy(bootstrap: &Path, flavor: Flavor) -> Envoy {
    let text = std::fs::read_to_string(bootstrap).unwrap();
    let opts = EnvoyOptions {
        extra_args: vec!["--file-flush-interval-msec".into(), "100".into()],
        ..EnvoyOptions::default()
    };
    let envoy = Envoy::start(&text, &opts).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while envoy
        .stats()
        .await
        .unwrap()
        .sum_containing("infergate.scraper.publishes")
        < 1
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{flavor}: no snapshot; {}",
            envoy.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    envoy
}

/// The Wasm scraper learns the EDS members from admin /clusters after its first
/// snapshots: until the pool's members are in one, the pool answers 503 (no endpoint).
async fn warm_up(envoy: &Envoy, url: &str, headers: &[(&str, &str)], flavor: Flavor) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let resp = post_json(url, &chat(MODEL, "warm up"), headers)
            .await
            .unwrap();
        if resp.status == 200 {
            return;
        }
        assert!(
            resp.status == 503 && tokio::time::Instant::now() < deadline,
            "{flavor}: {} {}; {}",
            resp.status,
            resp.text(),
            envoy.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn simulated_pool() -> sim::SimHandle {
    sim::start(SimConfig {
        replicas: 3,
        models: vec![MODEL.into()],
        loras: vec!["support-assistant-v1".into(), "support-assistant-v2".into()],
        ..SimConfig::default()
    })
    .await
    .unwrap()
}

async fn serves(flavor: Flavor) {
    let sim = simulated_pool().await;
    let replicas = sim.addrs()[..2].to_vec();
    let dir = RunDir::new("render-serve").unwrap();
    let out = render(&options(flavor, dir.path(), &replicas, true)).unwrap();
    validate(&out.output);
    let envoy = start_envoy(&out.output, flavor).await;
    let url = format!("{}/v1/chat/completions", envoy.base_url());
    let pool: Vec<String> = replicas.iter().map(ToString::to_string).collect();
    warm_up(&envoy, &url, &[], flavor).await;
    for i in 0..6 {
        let resp = post_json(&url, &chat(MODEL, &format!("question {i}")), &[])
            .await
            .unwrap();
        assert_eq!(resp.status, 200, "{flavor}: {}", resp.text());
        let served = resp
            .header("x-gateway-destination-endpoint-served")
            .unwrap_or_default()
            .to_owned();
        assert!(
            pool.contains(&served),
            "{flavor}: served by `{served}`, pool {pool:?}"
        );
        assert_eq!(
            resp.header("x-infergate-replica-addr"),
            Some(served.as_str()),
            "{flavor}"
        );
    }
    // A client's own gateway headers steer nothing: an address outside the pool, a base
    // model of its choosing.
    for (name, value) in [
        ("x-gateway-destination-endpoint", "127.0.0.1:1"),
        ("x-gateway-base-model-name", "no-such-model"),
    ] {
        let resp = post_json(&url, &chat(MODEL, "steer"), &[(name, value)])
            .await
            .unwrap();
        assert_eq!(resp.status, 200, "{flavor}: {name}: {}", resp.text());
        let served = resp
            .header("x-gateway-destination-endpoint-served")
            .unwrap_or_default()
            .to_owned();
        assert!(
            pool.contains(&served),
            "{flavor}: {name}: served by `{served}`"
        );
    }
    // The rewrite's stable name reaches the pool as one of its adapters.
    let resp = post_json(&url, &chat("support-assistant", "hello"), &[])
        .await
        .unwrap();
    assert_eq!(resp.status, 200, "{flavor}: {}", resp.text());
    let model = resp.json().unwrap()["model"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        model.starts_with("support-assistant-v"),
        "{flavor}: served as `{model}`"
    );
    // A model no route serves: the gateway's 404.
    let resp = post_json(&url, &chat("no-such-model", "hello"), &[])
        .await
        .unwrap();
    assert_eq!(resp.status, 404, "{flavor}: {}", resp.text());
    assert!(
        resp.text().contains("model_not_found"),
        "{flavor}: {}",
        resp.text()
    );
    // Outside the route's path prefix (`/v1`) nothing reaches the pool.
    let resp = post_json(
        &format!("{}/other", envoy.base_url()),
        &chat(MODEL, "x"),
        &[],
    )
    .await
    .unwrap();
    assert_ne!(resp.status, 200, "{flavor}: /other was routed");
}

/// The rendered gateway of each flavour follows its pool's EDS file: rendered with two of
/// three replicas, the third, added to the file the way the operator's tooling would (a new
/// file renamed over the old), is scraped and picked within seconds.
#[test]
fn a_replica_added_to_the_rendered_eds_file_gets_requests() {
    let rt = infergate_harness::launch::runtime().unwrap();
    rt.block_on(async {
        for flavor in [Flavor::Wasm, Flavor::Native] {
            if unbuilt(flavor) {
                continue;
            }
            scales_up(flavor).await;
        }
    });
}

async fn scales_up(flavor: Flavor) {
    let sim = simulated_pool().await;
    let all = sim.addrs().to_vec();
    let dir = RunDir::new("render-scale").unwrap();
    let out = render(&options(flavor, dir.path(), &all[..2], true)).unwrap();
    let envoy = start_envoy(&out.output, flavor).await;
    let url = format!("{}/v1/chat/completions", envoy.base_url());
    warm_up(&envoy, &url, &[], flavor).await;
    let eds = EdsDir::create(dir.path().join("eds")).unwrap();
    let written = std::time::Instant::now();
    eds.write_healthy("pool-0-llama-70b-bf16", &all).unwrap();
    let newcomer = all[2].to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut i = 0;
    loop {
        i += 1;
        let resp = post_json(&url, &chat(MODEL, &format!("after scale-up {i}")), &[])
            .await
            .unwrap();
        assert_eq!(resp.status, 200, "{flavor}: {}", resp.text());
        if resp.header("x-gateway-destination-endpoint-served") == Some(newcomer.as_str()) {
            eprintln!(
                "{flavor}: {newcomer} served request {i} after the EDS write, {:?} later",
                written.elapsed()
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{flavor}: {newcomer} got no request in 5 s ({i} requests)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The seed's objects with the quota files of `testdata/tenants/` (the same objects with
/// the test keys' full digests), rendered with the test issuer's JWKS and a billing log:
/// no credential is refused, tenant A's API key and a JWT for its claim are served, and
/// each admitted request is billed to tenant A.
#[test]
fn tenants_with_real_digests_authenticate_and_bill() {
    let rt = infergate_harness::launch::runtime().unwrap();
    rt.block_on(async {
        for flavor in [Flavor::Native, Flavor::Wasm] {
            if unbuilt(flavor) {
                continue;
            }
            tenants(flavor).await;
        }
    });
}

async fn tenants(flavor: Flavor) {
    let dir = RunDir::new("render-tenants").unwrap();
    let objects = shared::objects_with_tenants(&dir.path().join("objects"));
    let sim = simulated_pool().await;
    let issuer = TestIssuer::new();
    let billing = dir.path().join("billing.log");
    let mut opts = options(flavor, &dir.path().join("out"), sim.addrs(), false);
    opts.objects = objects;
    opts.gateway.jwks = Some(issuer.jwks());
    opts.gateway.billing_log = Some(billing.clone());
    let out = render(&opts).unwrap();
    assert!(
        !out.not_supported
            .iter()
            .any(|l| l.starts_with("TenantQuota")),
        "{flavor}: {:?}",
        out.not_supported
    );
    validate(&out.output);
    let envoy = start_envoy(&out.output, flavor).await;
    let url = format!("{}/v1/chat/completions", envoy.base_url());
    let key = "Bearer sk-infergate-test-tenant-a";
    warm_up(&envoy, &url, &[("authorization", key)], flavor).await;
    let resp = post_json(&url, &chat(MODEL, "who am I"), &[])
        .await
        .unwrap();
    assert_eq!(resp.status, 401, "{flavor}: {}", resp.text());
    let resp = post_json(&url, &chat(MODEL, "tenant a"), &[("authorization", key)])
        .await
        .unwrap();
    assert_eq!(resp.status, 200, "{flavor}: {}", resp.text());
    let token = issuer.mint(&json!({"iss": issuer.issuer(), "org": "product-team"}));
    let bearer = format!("Bearer {token}");
    let resp = post_json(&url, &chat(MODEL, "by jwt"), &[("authorization", &bearer)])
        .await
        .unwrap();
    assert_eq!(resp.status, 200, "{flavor}: {}", resp.text());
    // The warm-up's admitted request, the key's and the JWT's: three records of tenant A
    // (the refused one is billed to nobody).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let records = read_billing_log(&billing).unwrap();
        let a = records
            .iter()
            .filter(|r| r["tenant"] == "tenant-a" && r["status"] == 200)
            .count();
        if a >= 3 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{flavor}: {records:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---- The control planes' forms: `--target istio` and `--target envoy-gateway`. ----

/// Renders the seed's objects (tenants left out) for `target`, and returns the documents.
fn control_plane_docs(
    flavor: Flavor,
    target: Target,
    version: IstioVersion,
    objects: Option<&Path>,
) -> (Vec<serde_json::Value>, String) {
    let dir = RunDir::new("render-cp").unwrap();
    let mut opts = options(flavor, dir.path(), &[], true);
    opts.target = target;
    opts.istio_version = version;
    opts.gateway.endpoints.clear();
    if let Some(o) = objects {
        opts.objects = o.to_path_buf();
    }
    let out = render(&opts).unwrap();
    assert_eq!(out.output, dir.path().join(target.file()));
    assert!(!dir.path().join("envoy.yaml").exists(), "{target}");
    let text = std::fs::read_to_string(&out.output).unwrap();
    let docs = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| {
            let v: serde_yaml_ng::Value = serde::Deserialize::deserialize(d).unwrap();
            serde_json::to_value(v).unwrap()
        })
        .collect();
    (docs, std::fs::read_to_string(&out.readme).unwrap())
}

fn of_kind<'a>(docs: &'a [serde_json::Value], kind: &str) -> Vec<&'a serde_json::Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn json_text(v: &serde_json::Value) -> serde_json::Value {
    serde_json::from_str(v.as_str().unwrap()).unwrap()
}

/// The seed's gateway: `gateway-system/inference-gateway`.
const INSTANCE: &str = "gateway-system.inference-gateway";

/// The router and picker configurations carry the instance; the picker the scraper
/// (without a role), following exactly `clusters`.
fn check_configs(router: &serde_json::Value, picker: &serde_json::Value, clusters: &[String]) {
    // The instance prefixes the Wasm module's shared data; the native module has none and
    // refuses the key.
    let wasm = router.get("instance").is_some();
    for config in [router, picker] {
        match wasm {
            true => assert_eq!(config["instance"], INSTANCE, "{config}"),
            false => assert!(config.get("instance").is_none(), "{config}"),
        }
    }
    let scraper = &picker["scraper"];
    assert!(scraper.is_object(), "{picker}");
    assert!(scraper.get("role").is_none(), "{scraper}");
    assert_eq!(scraper["clusters"], json!(clusters), "{scraper}");
    let pools: Vec<&serde_json::Value> = picker["pools"].as_array().unwrap().iter().collect();
    assert_eq!(
        pools
            .iter()
            .map(|p| p["cluster"].clone())
            .collect::<Vec<_>>(),
        clusters.iter().map(|c| json!(c)).collect::<Vec<_>>()
    );
}

/// Istio, both flavours, every version: no `BOOTSTRAP` patch; every `HTTP_FILTER` patch
/// inserts before `envoy.filters.http.router` (the one name Istio always has: a patch on a
/// missing name inserts nothing, silently), in chain order; the Wasm filters come by ECDS
/// (`config_discovery` + an `EXTENSION_CONFIG` `ADD` with the OCI module, which
/// istio-agent fetches), not `WasmPlugin`; the native module from the deployment overlay.
#[test]
fn istio_manifests_hold_only_what_istiod_installs() {
    for flavor in [Flavor::Wasm, Flavor::Native] {
        for version in [
            IstioVersion::V1_28,
            IstioVersion::V1_29,
            IstioVersion::V1_30,
        ] {
            let (docs, readme) = control_plane_docs(flavor, Target::Istio, version, None);
            let ctx = format!("{flavor} Istio {version}");
            assert!(of_kind(&docs, "WasmPlugin").is_empty(), "{ctx}");
            let filters = of_kind(&docs, "EnvoyFilter");
            assert_eq!(filters.len(), 1, "{ctx}");
            let patches = filters[0]["spec"]["configPatches"].as_array().unwrap();
            assert!(
                !patches.iter().any(|p| p["applyTo"] == "BOOTSTRAP"),
                "{ctx}: a BOOTSTRAP patch"
            );
            let mut chain = Vec::new();
            for p in patches.iter().filter(|p| p["applyTo"] == "HTTP_FILTER") {
                assert_eq!(
                    p["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"],
                    "envoy.filters.http.router",
                    "{ctx}: {p}"
                );
                assert_eq!(p["patch"]["operation"], "INSERT_BEFORE", "{ctx}: {p}");
                chain.push(p["patch"]["value"]["name"].as_str().unwrap().to_owned());
            }
            let svc = "llama-70b-bf16-infergate";
            let cluster = format!("outbound|8000||{svc}.serving.svc.cluster.local");
            let services = of_kind(&docs, "Service");
            assert_eq!(services.len(), 1, "{ctx}");
            assert_eq!(services[0]["metadata"]["name"], svc);
            let adds: Vec<&serde_json::Value> = patches
                .iter()
                .filter(|p| p["applyTo"] == "CLUSTER" && p["patch"]["operation"] == "ADD")
                .map(|p| &p["patch"]["value"]["name"])
                .collect();
            match flavor {
                Flavor::Wasm => {
                    assert_eq!(
                        chain,
                        [
                            "infergate.router",
                            "infergate.buffer",
                            "infergate.headers",
                            "infergate.route_refresh",
                            "infergate.picker",
                            "infergate.destination_metadata"
                        ],
                        "{ctx}"
                    );
                    let ecds: Vec<&serde_json::Value> = patches
                        .iter()
                        .filter(|p| p["applyTo"] == "EXTENSION_CONFIG")
                        .collect();
                    assert_eq!(ecds.len(), 3, "{ctx}");
                    let mut configs = Vec::new();
                    let mut envs = Vec::new();
                    for name in ["infergate.router", "infergate.headers", "infergate.picker"] {
                        let filter = patches
                            .iter()
                            .find(|p| {
                                p["applyTo"] == "HTTP_FILTER" && p["patch"]["value"]["name"] == name
                            })
                            .unwrap();
                        let discovery = &filter["patch"]["value"]["config_discovery"];
                        assert_eq!(
                            discovery["type_urls"][0],
                            "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
                        );
                        assert_eq!(
                            discovery["config_source"]["initial_fetch_timeout"], "0s",
                            "{ctx}"
                        );
                        let ext = ecds
                            .iter()
                            .find(|p| {
                                p["patch"]["operation"] == "ADD"
                                    && p["patch"]["value"]["name"] == name
                            })
                            .unwrap();
                        let config = &ext["patch"]["value"]["typed_config"]["config"];
                        // What a WasmPlugin would produce: vm_id "", Envoy's default for
                        // the headers flag, a VM that reloads.
                        assert_eq!(config["vm_config"]["vm_id"], "", "{ctx}");
                        assert!(
                            config.get("allow_on_headers_stop_iteration").is_none(),
                            "{ctx}: {config}"
                        );
                        assert_eq!(config["failure_policy"], "FAIL_RELOAD", "{ctx}");
                        envs.push(config["vm_config"]["environment_variables"].clone());
                        assert_eq!(
                            config["vm_config"]["code"]["remote"]["http_uri"]["uri"],
                            "oci://registry.test/infergate-wasm:test"
                        );
                        configs.push(json_text(&config["configuration"]["value"]));
                    }
                    // Each plugin a VM of its own: the environments differ.
                    assert_ne!(envs[0], envs[1], "{ctx}");
                    assert_ne!(envs[1], envs[2], "{ctx}");
                    assert_eq!(
                        configs[1],
                        json!({"role": "headers", "instance": INSTANCE}),
                        "{ctx}"
                    );
                    check_configs(&configs[0], &configs[2], std::slice::from_ref(&cluster));
                    assert_eq!(configs[2]["scraper"]["membership"], "admin");
                    // The buffer holds the headers, past the router's body limit (twice it,
                    // as the bare template), so the router answers 413 itself.
                    let buffer = patches
                        .iter()
                        .find(|p| p["patch"]["value"]["name"] == "infergate.buffer")
                        .unwrap();
                    let limit = configs[0]["bodyLimitBytes"].as_u64().unwrap_or(4 << 20);
                    assert_eq!(
                        buffer["patch"]["value"]["typed_config"]["max_request_bytes"].as_u64(),
                        Some(2 * limit),
                        "{ctx}"
                    );
                    assert!(adds.contains(&&json!("infergate_admin")), "{ctx}");
                    assert!(of_kind(&docs, "ConfigMap").is_empty());
                    assert!(readme.contains("not `WasmPlugin`"), "{readme}");
                }
                _ => {
                    assert_eq!(chain, ["infergate.router", "infergate.picker"], "{ctx}");
                    let typed = |name: &str| {
                        patches
                            .iter()
                            .find(|p| p["patch"]["value"]["name"] == name)
                            .map(|p| p["patch"]["value"]["typed_config"].clone())
                            .unwrap()
                    };
                    let (router, picker) = (typed("infergate.router"), typed("infergate.picker"));
                    check_configs(
                        &json_text(&router["filter_config"]["value"]),
                        &json_text(&picker["filter_config"]["value"]),
                        std::slice::from_ref(&cluster),
                    );
                    let module = &picker["dynamic_module_config"];
                    assert_eq!(module["name"], "infergate_envoy");
                    let lb = patches
                        .iter()
                        .find(|p| p["patch"]["operation"] == "MERGE" && p["applyTo"] == "CLUSTER")
                        .unwrap()
                        .to_string();
                    let membership = json_text(&picker["filter_config"]["value"])["scraper"]
                        ["membership"]
                        .clone();
                    if version == IstioVersion::V1_30 {
                        assert!(module.get("module").is_some(), "{ctx}");
                        assert!(lb.contains("DynamicModulesLoadBalancerConfig"), "{ctx}");
                        assert_eq!(membership, "host");
                    } else {
                        assert!(module.get("module").is_none(), "{ctx}");
                        assert!(!lb.contains("dynamic_modules"), "{ctx}");
                        assert_eq!(membership, "admin");
                        assert!(adds.contains(&&json!("infergate_admin")), "{ctx}");
                    }
                    let overlay = of_kind(&docs, "ConfigMap");
                    assert_eq!(overlay.len(), 1, "{ctx}");
                    let deployment: serde_json::Value =
                        serde_yaml_ng::from_str(overlay[0]["data"]["deployment"].as_str().unwrap())
                            .unwrap();
                    let pod = &deployment["spec"]["template"]["spec"];
                    assert_eq!(pod["containers"][0]["name"], "istio-proxy");
                    assert_eq!(
                        pod["containers"][0]["volumeMounts"][0]["mountPath"],
                        "/var/lib/infergate"
                    );
                    assert_eq!(pod["volumes"][0]["name"], "infergate-module");
                    assert!(readme.contains("parametersRef"), "{readme}");
                }
            }
            assert!(adds.contains(&&json!("infergate_scrape")), "{ctx}");
            validate_schemas(&docs, &ctx);
        }
    }
}

/// A billing log on Istio is Envoy's stdout logger (the gateway's root file system is
/// read-only), and `fields.md` says so.
#[test]
fn istio_billing_log_goes_to_stdout() {
    let dir = RunDir::new("render-istio-billing").unwrap();
    let objects = shared::objects_with_tenants(&dir.path().join("objects"));
    let mut opts = options(Flavor::Native, &dir.path().join("out"), &[], false);
    opts.objects = objects;
    opts.target = Target::Istio;
    opts.gateway.billing_log = Some("/var/log/billing.log".into());
    let out = render(&opts).unwrap();
    let text = std::fs::read_to_string(&out.output).unwrap();
    assert!(text.contains("envoy.access_loggers.stdout"), "{text}");
    assert!(!text.contains("envoy.access_loggers.file"), "{text}");
    assert!(!text.contains("/var/log/billing.log"), "{text}");
    let fields = std::fs::read_to_string(&out.fields).unwrap();
    assert!(fields.contains("envoy.access_loggers.stdout"), "{fields}");
}

/// Envoy Gateway, both flavours: an `EnvoyExtensionPolicy` with the router before the
/// picker (Envoy Gateway orders a type's filters by their index in the list), the routes'
/// `endpointOverride`, the scrape and admin clusters by `EnvoyPatchPolicy`, the native
/// module allowed by the `EnvoyProxy`; the picker follows Envoy Gateway's rule cluster.
#[test]
fn envoy_gateway_manifests_express_the_gateway_in_its_api() {
    for flavor in [Flavor::Wasm, Flavor::Native] {
        let (docs, readme) =
            control_plane_docs(flavor, Target::EnvoyGateway, IstioVersion::default(), None);
        let ctx = format!("{flavor} Envoy Gateway");
        let policy = of_kind(&docs, "EnvoyExtensionPolicy");
        assert_eq!(policy.len(), 1, "{ctx}");
        let spec = &policy[0]["spec"];
        let cluster = "httproute/serving/llama-70b/rule/0".to_owned();
        let (router, picker) = match flavor {
            Flavor::Wasm => {
                let wasm = spec["wasm"].as_array().unwrap();
                assert_eq!(wasm[0]["rootID"], "router");
                assert_eq!(wasm[1]["rootID"], "headers");
                assert_eq!(
                    wasm[1]["config"],
                    json!({"role": "headers", "instance": INSTANCE})
                );
                assert_eq!(wasm[2]["rootID"], "picker");
                assert_eq!(
                    wasm[0]["code"]["image"]["url"],
                    "registry.test/infergate-wasm:test"
                );
                assert!(of_kind(&docs, "EnvoyProxy").is_empty());
                (wasm[0]["config"].clone(), wasm[2]["config"].clone())
            }
            _ => {
                let dm = spec["dynamicModule"].as_array().unwrap();
                assert_eq!(dm[0]["filterName"], "router");
                assert_eq!(dm[1]["filterName"], "picker");
                let proxy = of_kind(&docs, "EnvoyProxy");
                assert_eq!(proxy.len(), 1, "{ctx}");
                assert_eq!(proxy[0]["spec"]["dynamicModules"][0]["name"], dm[0]["name"]);
                (dm[0]["config"].clone(), dm[1]["config"].clone())
            }
        };
        check_configs(&router, &picker, &[cluster]);
        let btp = of_kind(&docs, "BackendTrafficPolicy");
        assert_eq!(
            btp[0]["spec"]["loadBalancer"]["endpointOverride"]["extractFrom"][0]["header"],
            "x-gateway-destination-endpoint"
        );
        let patch = of_kind(&docs, "EnvoyPatchPolicy");
        let names: Vec<&serde_json::Value> = patch[0]["spec"]["jsonPatches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| &p["name"])
            .collect();
        let listener = "gateway-system/inference-gateway/http";
        let expected: Vec<&str> = match flavor {
            // The buffer filter before `headers`, the route refresh before the picker.
            Flavor::Wasm => vec!["infergate_scrape", "infergate_admin", listener, listener],
            _ => vec!["infergate_scrape", "infergate_admin"],
        };
        let names: Vec<&str> = names.iter().filter_map(|n| n.as_str()).collect();
        assert_eq!(names, expected, "{ctx}");
        // The entry rule (no model header) that lets Envoy Gateway enable the filters.
        let route = of_kind(&docs, "HTTPRoute")[0];
        let rules = route["spec"]["rules"].as_array().unwrap();
        assert!(
            rules
                .iter()
                .any(|r| r["matches"][0].get("headers").is_none()),
            "{route}"
        );
        assert!(readme.contains("EnvoyExtensionPolicy"), "{readme}");
        validate_schemas(&docs, &ctx);
    }
}

/// A pool named as Kubernetes allows but no Service may be (`70b.llama`: a dot, a leading
/// digit) gets a valid, hashed Service name, and the routes and the picker follow it.
#[test]
fn a_dotted_pool_name_gets_a_valid_service() {
    let dir = RunDir::new("render-dotted").unwrap();
    let objects = dir.path().join("objects");
    std::fs::create_dir_all(&objects).unwrap();
    for entry in std::fs::read_dir(seed_objects()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            std::fs::write(objects.join(&name), text.replace(POOL, "70b.llama")).unwrap();
        }
    }
    for target in [Target::Istio, Target::EnvoyGateway] {
        let (docs, _) = control_plane_docs(
            Flavor::Wasm,
            target,
            IstioVersion::default(),
            Some(&objects),
        );
        let svc = of_kind(&docs, "Service")[0]["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(svc.starts_with("p70b-llama-infergate-"), "{svc}");
        assert!(
            svc.len() <= 63
                && svc
                    .bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        );
        let route = of_kind(&docs, "HTTPRoute")[0];
        assert_eq!(
            route["spec"]["rules"][0]["backendRefs"][0]["name"],
            svc.as_str()
        );
        validate_schemas(&docs, &format!("{target}"));
    }
}

// ---- Schemas: every rendered manifest against its kind's vendored schema. ----

/// The vendored schema (`testdata/schemas/`, see its README for each file's package and
/// version) of each kind the renderer may write, by `apiVersion` and `kind`; `true` for a
/// CRD's schema, checked by the API server's rules for unknown fields ([`structural`]),
/// `false` for a core kind's (kubernetes-validate's strict schemas are closed already).
const SCHEMAS: &[(&str, &str, &str, bool)] = &[
    ("v1", "Service", "service-v1.json", false),
    ("v1", "ConfigMap", "configmap-v1.json", false),
    (
        "networking.istio.io/v1alpha3",
        "EnvoyFilter",
        "envoyfilter-v1alpha3.json",
        true,
    ),
    (
        "extensions.istio.io/v1alpha1",
        "WasmPlugin",
        "wasmplugin-v1alpha1.json",
        true,
    ),
    (
        "gateway.networking.k8s.io/v1",
        "HTTPRoute",
        "httproute-v1.json",
        true,
    ),
];

/// Kinds rendered with no schema to check them against: no package of a registry this
/// project reaches carries their CRDs (see `testdata/schemas/README.md`). A rendered kind
/// neither here nor in [`SCHEMAS`] fails the test, so leaving one unchecked is a
/// decision written down here.
const NO_SCHEMA: &[(&str, &str)] = &[
    ("gateway.envoyproxy.io/v1alpha1", "EnvoyExtensionPolicy"),
    ("gateway.envoyproxy.io/v1alpha1", "EnvoyProxy"),
    ("gateway.envoyproxy.io/v1alpha1", "BackendTrafficPolicy"),
    ("gateway.envoyproxy.io/v1alpha1", "EnvoyPatchPolicy"),
];

/// Fields the renderer writes that are newer than the vendored schema of their kind:
/// taken out of the document before it is checked (so left unchecked), each named here.
/// `EnvoyFilter.spec.targetRefs` came with Istio 1.22; the vendored Istio schema is older.
const NEWER_THAN_SCHEMA: &[(&str, &str)] = &[("EnvoyFilter", "/spec/targetRefs")];

/// A CRD's structural schema as the API server applies it: a field its schema does not
/// name is unknown (dropped, or refused under `kubectl apply`'s strict field validation),
/// unless the object says `x-kubernetes-preserve-unknown-fields` or has
/// `additionalProperties`. JSON Schema allows unknown fields, so each such object is made
/// closed here (`additionalProperties: false`); `apiVersion`, `kind` and `metadata`,
/// which every object may carry, are added at the root where the CRD leaves them out.
/// Combinators (`oneOf`, `anyOf`, `not`) only carry `required` lists in these schemas and
/// are left as they are.
fn structural(mut schema: serde_json::Value) -> serde_json::Value {
    fn close(node: &mut serde_json::Value) {
        let Some(obj) = node.as_object_mut() else {
            return;
        };
        if let Some(props) = obj.get_mut("properties").and_then(|p| p.as_object_mut()) {
            for p in props.values_mut() {
                close(p);
            }
        }
        if let Some(items) = obj.get_mut("items") {
            close(items);
        }
        if let Some(extra) = obj.get_mut("additionalProperties") {
            close(extra);
        }
        if let Some(defs) = obj.get_mut("$defs").and_then(|d| d.as_object_mut()) {
            for d in defs.values_mut() {
                close(d);
            }
        }
        let open = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true))
            || obj.contains_key("additionalProperties");
        if obj.contains_key("properties") && !open {
            obj.insert("additionalProperties".into(), json!(false));
        }
    }
    let props = schema["properties"].as_object_mut().unwrap();
    props
        .entry("apiVersion")
        .or_insert_with(|| json!({"type": "string"}));
    props
        .entry("kind")
        .or_insert_with(|| json!({"type": "string"}));
    props
        .entry("metadata")
        .or_insert_with(|| json!({"type": "object"}));
    close(&mut schema);
    schema
}

/// The validators of [`SCHEMAS`], in its order, built once.
fn validators() -> &'static [jsonschema::Validator] {
    static VALIDATORS: std::sync::OnceLock<Vec<jsonschema::Validator>> = std::sync::OnceLock::new();
    VALIDATORS.get_or_init(|| {
        SCHEMAS
            .iter()
            .map(|(_, _, file, crd)| {
                let path = workspace_root().join("testdata/schemas").join(file);
                let v: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
                let v = if *crd { structural(v) } else { v };
                jsonschema::validator_for(&v)
                    .unwrap_or_else(|e| panic!("{file}: not a schema: {e}"))
            })
            .collect()
    })
}

/// The validator of `doc`'s kind; `None` for a kind of [`NO_SCHEMA`]; panics on a kind
/// that is in neither list.
fn validator_of(doc: &serde_json::Value, ctx: &str) -> Option<&'static jsonschema::Validator> {
    let (api, kind) = (
        doc["apiVersion"].as_str().unwrap_or_default(),
        doc["kind"].as_str().unwrap_or_default(),
    );
    if let Some(i) = SCHEMAS
        .iter()
        .position(|(a, k, _, _)| *a == api && *k == kind)
    {
        return Some(&validators()[i]);
    }
    assert!(
        NO_SCHEMA.contains(&(api, kind)),
        "{ctx}: rendered `{api}` `{kind}` has no schema in testdata/schemas and is not \
         listed in NO_SCHEMA"
    );
    None
}

/// The errors of `doc` against its kind's schema (the fields of [`NEWER_THAN_SCHEMA`]
/// taken out first).
fn schema_errors(validator: &jsonschema::Validator, doc: &serde_json::Value) -> Vec<String> {
    let mut doc = doc.clone();
    for (kind, pointer) in NEWER_THAN_SCHEMA {
        if doc["kind"] == *kind {
            let (parent, field) = pointer.rsplit_once('/').unwrap();
            if let Some(obj) = doc.pointer_mut(parent).and_then(|p| p.as_object_mut()) {
                obj.remove(field);
            }
        }
    }
    validator
        .iter_errors(&doc)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// Validates every rendered document against its kind's vendored schema (see [`SCHEMAS`]
/// and `testdata/schemas/README.md`), under the API server's rules for unknown fields
/// ([`structural`]); a kind with no schema must be in [`NO_SCHEMA`]. Then checks that each
/// schema used refuses what it should, so a schema that accepts anything cannot pass.
fn validate_schemas(docs: &[serde_json::Value], ctx: &str) {
    let mut checked = 0;
    for d in docs {
        let Some(validator) = validator_of(d, ctx) else {
            continue;
        };
        let errors = schema_errors(validator, d);
        assert!(
            errors.is_empty(),
            "{ctx}: {} {} does not match its schema:\n{}",
            d["kind"],
            d["metadata"]["name"],
            errors.join("\n")
        );
        checked += 1;
    }
    assert!(checked > 0, "{ctx}: no document had a schema");
    let refused = |d: &serde_json::Value, what: &str| {
        let validator = validator_of(d, ctx).unwrap();
        assert!(
            !schema_errors(validator, d).is_empty(),
            "{ctx}: {} with {what} passed its schema",
            d["kind"]
        );
    };
    for d in docs {
        if validator_of(d, ctx).is_none() {
            continue;
        }
        // An unknown field at the top of the object.
        let mut bad = d.clone();
        bad["notAField"] = json!(1);
        refused(&bad, "an unknown top-level field");
        match d["kind"].as_str().unwrap_or_default() {
            "Service" => {
                let mut bad = d.clone();
                bad["spec"]["ports"][0]["port"] = json!("http");
                refused(&bad, "a port that is not a number");
                let mut bad = d.clone();
                bad["spec"]["selectr"] = json!({});
                refused(&bad, "`spec.selectr`");
            }
            "EnvoyFilter" => {
                let mut bad = d.clone();
                bad["spec"]["configPatches"][0]["applyTo"] = json!("HTTP_FILTERS");
                refused(&bad, "an `applyTo` Istio does not have");
                let mut bad = d.clone();
                bad["spec"]["configPatches"][0]["patch"]["operaton"] = json!("ADD");
                refused(&bad, "`patch.operaton`");
                // `patch.value` is Envoy's configuration: open to any field.
                let mut open = d.clone();
                open["spec"]["configPatches"][0]["patch"]["value"]["anything"] = json!({});
                let errors = schema_errors(validator_of(&open, ctx).unwrap(), &open);
                assert!(errors.is_empty(), "{ctx}: {errors:?}");
            }
            "HTTPRoute" => {
                let mut bad = d.clone();
                bad["spec"]["rules"][0]["backendRefs"][0]["port"] = json!("http");
                refused(&bad, "a backend port that is not a number");
                let mut bad = d.clone();
                bad["spec"]["rules"][0]["matchs"] = json!([]);
                refused(&bad, "`rules[0].matchs`");
            }
            _ => {}
        }
    }
}
