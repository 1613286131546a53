//! The embedding example serves the multi-turn workload through the same picker as the
//! Envoy flavours, with their cache-hit ratio.
//!
//! The workload, the simulator and the gateway config are those of the control-plane
//! tier's `affinity_matches_bare_envoy` short form (`harness/tests/control_plane.rs`): four
//! replicas of `llama-70b`, 16 conversations × 3 turns with 2000-token system prompts, 8 in
//! flight, each request on a new connection; the config is `infergate render --target envoy
//! --flavor native` of the seed objects (`testdata/objects`, tenants left out), the
//! `infergate.gateway` filter's JSON as Envoy gets it. There the Envoy flavours reach a
//! cache-hit ratio of 0.659; this proxy must come within 2 points of it, with no request
//! failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use infergate_cli::config::{Flavor, Membership};
use infergate_cli::render::{render, GatewayInputs, IstioVersion, RenderOptions, Target};
use infergate_example_hyper::{gateway_config, serve, Gateway};
use infergate_load::runner::run_target;
use infergate_load::{Assign, Connections, LoadConfig, Target as LoadTarget, Workload};
use infergate_sim::{EngineConfig, SimConfig};

const POOL: &str = "llama-70b-bf16";
const MODEL: &str = "llama-70b";
/// The picker's name for the pool: its Envoy cluster's.
const PICKER_POOL: &str = "pool-0-llama-70b-bf16";

/// What the Envoy flavours reach on this workload (bare Envoy, Istio and Envoy Gateway,
/// both flavours, 1 and 4 workers: `affinity_matches_bare_envoy`, short form).
const ENVOY_HIT_RATIO: f64 = 0.659;

/// The bootstrap `infergate render` writes for the seed objects over `endpoints`, as text.
fn rendered_bootstrap(endpoints: &[SocketAddr]) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::env::temp_dir().join(format!("infergate-example-hyper-{}", std::process::id()));
    let local = SocketAddr::from(([127, 0, 0, 1], 0));
    let rendered = render(&RenderOptions {
        objects: root.join("testdata/objects"),
        target: Target::Envoy,
        istio_version: IstioVersion::V1_30,
        out: out.clone(),
        listen: local,
        admin: local,
        image: "oci://registry.test/infergate-wasm:test".into(),
        // The pools list their endpoints (this proxy has no EDS to follow).
        membership: Membership::Static,
        eds_dir: None,
        gateway: GatewayInputs {
            flavor: Flavor::Native,
            endpoints: vec![(
                POOL.into(),
                endpoints.iter().map(ToString::to_string).collect(),
            )],
            module: Some(PathBuf::from("/unused/libinfergate_envoy.so")),
            no_tenants: true,
            jwks: None,
            billing_log: None,
            per_request_split: false,
            peers: None,
            cluster: None,
            peer_mode: infergate_cli::config::bootstrap::PeerMode::Parent,
            peer_api_key: None,
            export_members: false,
        },
    })
    .unwrap();
    let text = std::fs::read_to_string(rendered.output).unwrap();
    let _ = std::fs::remove_dir_all(out);
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_turn_workload_keeps_the_envoy_flavours_hit_ratio() {
    let sim = infergate_sim::start(SimConfig {
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
    let config = gateway_config(&rendered_bootstrap(sim.addrs())).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let gateway = serve(Gateway::from_config(config).unwrap(), listener, 2).unwrap();
    // The picker fails closed until the first snapshot: wait for the scraper's first round.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !gateway.stats().contains_key("infergate.scraper.publishes") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no snapshot after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let cfg = LoadConfig {
        workload: Workload {
            model: MODEL.into(),
            conversations: 16,
            turns: 3,
            system_tokens: 2000,
            max_tokens: 48,
            ..Workload::default()
        },
        concurrency: 8,
        ..LoadConfig::default()
    };
    let target = LoadTarget {
        label: "hyper".into(),
        urls: vec![base],
        assign: Assign::Random,
        connections: Connections::PerRequest,
    };
    let s = run_target(&cfg, &target, 1).await.unwrap().summary;
    eprintln!(
        "HYPER EMBEDDING: {} requests, hit ratio {:.3} (Envoy flavours {ENVOY_HIT_RATIO:.3}); \
         TTFT p50 {:.1} ms",
        s.requests,
        s.cache_hit_ratio,
        s.ttft_p50_s * 1e3
    );
    assert_eq!(s.requests, 48);
    assert_eq!(s.ok, s.requests, "{s:?}");
    assert!(
        s.errors.is_empty() && s.other_statuses.is_empty() && s.rejected_429.is_empty(),
        "{s:?}"
    );
    assert!(
        (s.cache_hit_ratio - ENVOY_HIT_RATIO).abs() <= 0.02,
        "hit ratio {:.3}, Envoy flavours {ENVOY_HIT_RATIO:.3}",
        s.cache_hit_ratio
    );
    // Each request was picked once, from the router's handoff (the body parsed once), and
    // every lease was given back at its request's end (a response's end reaches the client
    // a moment before its run ends here).
    let idle = |stats: &BTreeMap<String, i64>| {
        let mut inflight = stats
            .iter()
            .filter(|(k, _)| k.starts_with("infergate.picker.inflight_requests"));
        inflight.all(|(_, v)| *v == 0)
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while !idle(&gateway.stats()) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = gateway.stats();
    assert!(idle(&stats), "{stats:#?}");
    for counter in ["decisions", "handoff"] {
        let name = format!("infergate.picker.{counter}.pool.{PICKER_POOL}");
        assert_eq!(stats.get(&name), Some(&48), "{name}: {stats:#?}");
    }
    sim.shutdown().await;
}
