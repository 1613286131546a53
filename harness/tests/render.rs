//! `infergate render` on the seed's objects (`testdata/objects/`, verbatim), through a real
//! Envoy: the rendered bootstrap of each flavour passes `envoy --mode validate`, and Envoy
//! started on it serves the basic routing check against simulated replicas (a chat request
//! for the seed route's model answers 200 from a pool replica, with the picker's served
//! header naming it; a model no route serves gets the gateway's 404; the seed's rewrite
//! name reaches the pool as one of its adapters).
//!
//! A flavour whose module is not built is skipped with a note (as the e2e suite does).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infergate_harness::artefacts::workspace_root;
use infergate_harness::launch::binary::envoy_binary;
use infergate_harness::launch::client::post_json;
use infergate_harness::launch::jwt::TestIssuer;
use infergate_harness::launch::process::RunDir;
use infergate_harness::launch::read_billing_log;
use infergate_harness::launch::{EdsDir, Envoy, EnvoyOptions, Flavor, Membership};
use infergate_harness::render::{render, GatewayInputs, RenderOptions};
use infergate_harness::sim::{self, SimConfig};
use serde_json::json;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

const POOL: &str = "llama-70b-bf16";
const MODEL: &str = "llama-70b";

fn seed_objects() -> PathBuf {
    workspace_root().join("testdata/objects")
}

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

/// Both flavours: the bootstrap validates, the Istio manifests and the report are written,
/// and the report names the fields the gateway does not honour.
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
            serde_yaml_ng::from_str(&std::fs::read_to_string(&out.bootstrap).unwrap()).unwrap();
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
        let istio = std::fs::read_to_string(&out.istio).unwrap();
        match flavor {
            Flavor::Wasm => {
                assert!(istio.contains("kind: WasmPlugin"), "{istio}");
                assert!(istio.contains("url: oci://registry.test/infergate-wasm:test"));
            }
            _ => assert!(!istio.contains("kind: WasmPlugin"), "{istio}"),
        }
        assert!(istio.contains("kind: EnvoyFilter"));
        let readme = std::fs::read_to_string(&out.readme).unwrap();
        assert!(readme.contains("kubectl apply -f istio.yaml"), "{readme}");
        if unbuilt(flavor) {
            continue;
        }
        validate(&out.bootstrap);
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
    validate(&out.bootstrap);
    let envoy = start_envoy(&out.bootstrap, flavor).await;
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
    let envoy = start_envoy(&out.bootstrap, flavor).await;
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
    let objects = dir.path().join("objects");
    std::fs::create_dir_all(&objects).unwrap();
    for entry in std::fs::read_dir(seed_objects()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("quota-") {
            std::fs::copy(&path, objects.join(&name)).unwrap();
        }
    }
    for name in ["quota-a.yaml", "quota-b.yaml"] {
        let from = workspace_root().join("testdata/tenants").join(name);
        std::fs::copy(from, objects.join(name)).unwrap();
    }
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
    validate(&out.bootstrap);
    let envoy = start_envoy(&out.bootstrap, flavor).await;
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

/// The command line: what it wrote and every unsupported field on stdout; the seed's
/// placeholder hashes, rendered as they are, fail it with the field's path on stderr.
#[test]
fn the_command_prints_what_it_wrote_and_what_it_does_not_support() {
    let dir = RunDir::new("render-cli").unwrap();
    let run = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(["render", "--objects"])
            .arg(seed_objects())
            .args(["--flavor", "native", "--out"])
            .arg(dir.path())
            .args(extra)
            .output()
            .unwrap()
    };
    let ok = run(&[
        "--no-tenants",
        "--endpoints",
        "llama-70b-bf16=10.0.0.1,10.0.0.2",
    ]);
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    for expected in [
        "envoy.yaml",
        "istio.yaml",
        "fields.md",
        "InferencePool serving/llama-70b-bf16 spec.selector: pods are not watched",
    ] {
        assert!(stdout.contains(expected), "`{expected}` not in:\n{stdout}");
    }
    // The bare IPs took the pool's target port.
    let eds = std::fs::read_to_string(dir.path().join("eds/pool-0-llama-70b-bf16.json")).unwrap();
    assert!(eds.contains("\"port_value\": 8000"), "{eds}");
    let refused = run(&[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("TenantQuota tenant-a: spec.identity.apiKeyHashes[0]"),
        "{stderr}"
    );
}
