//! Multi-cluster under a control plane: cluster A's gateway installed by Istio or Envoy
//! Gateway from the seed objects plus an `InferencePoolImport` (its peers file names B's
//! gateway), cluster B's the bare-Envoy rendering of the exported pool. In both modes
//! (Parent: A sends to B's gateway; Endpoint: to the replicas B's gateway publishes), at
//! four Envoy workers:
//!
//! 1. while A has room, every turn of its conversations stays in A;
//! 2. with A's replicas queueing past the spillover threshold (long requests sent straight
//!    to them), new conversations are served in B: through B's gateway in Parent Mode
//!    (which picks them), around it in Endpoint Mode (which picks none).

use super::*;
use crate::clusters::{hog, queueing_pool, turn_body};
use infergate_harness::sim::REPLICA_ADDR_HEADER;

/// Turn `turn` of conversation `label`, through `base`; the replica that served it.
async fn send(base: &str, label: &str, turn: usize) -> SocketAddr {
    let body = turn_body(MODEL, label, turn);
    let resp = post_json(&format!("{base}/v1/chat/completions"), &body, &[])
        .await
        .unwrap();
    assert_eq!(resp.status, 200, "{label} turn {turn}: {}", resp.text());
    let replica = resp
        .header(REPLICA_ADDR_HEADER)
        .and_then(|a| a.parse().ok());
    replica.unwrap_or_else(|| panic!("{label} turn {turn}: no {REPLICA_ADDR_HEADER} header"))
}

/// Cluster B's gateway: the seed's pool, exported, rendered for a bare Envoy.
async fn exporting_gateway(flavor: Flavor, mode: PeerMode, pool: &SimHandle, dir: &Path) -> Envoy {
    let objects = dir.join("objects-b");
    std::fs::create_dir_all(&objects).unwrap();
    let root = infergate_artefacts::workspace_root();
    for (from, name) in [
        (
            "testdata/multicluster/inferencepool.yaml",
            "inferencepool.yaml",
        ),
        ("testdata/objects/httproute.yaml", "httproute.yaml"),
    ] {
        std::fs::copy(root.join(from), objects.join(name)).unwrap();
    }
    let mut opts = options(flavor, Target::Envoy, &dir.join("render-b"), objects);
    let addrs = pool.addrs().iter().map(ToString::to_string).collect();
    opts.gateway.endpoints = vec![(POOL.into(), addrs)];
    opts.gateway.export_members = mode == PeerMode::Endpoint;
    let out = render(&opts).unwrap();
    let text = std::fs::read_to_string(&out.output).unwrap();
    let envoy = Envoy::start(&text, &EnvoyOptions::default()).await.unwrap();
    warm_up(&envoy.base_url(), flavor, &[], || envoy.log_tail(20)).await;
    envoy
}

/// Cluster A's manifests for `plane`: the seed objects, the import, and a peers file
/// naming B's gateway at `b`.
fn importing_docs(plane: Plane, flavor: Flavor, mode: PeerMode, b: &str, dir: &Path) -> Vec<Json> {
    let objects = dir.join("objects-a");
    std::fs::create_dir_all(&objects).unwrap();
    for entry in std::fs::read_dir(seed_objects()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, objects.join(path.file_name().unwrap())).unwrap();
    }
    let root = infergate_artefacts::workspace_root();
    std::fs::copy(
        root.join("testdata/multicluster/inferencepoolimport.yaml"),
        objects.join("inferencepoolimport.yaml"),
    )
    .unwrap();
    let (host, port) = b.rsplit_once(':').unwrap();
    let peers = format!(
        "endpoints:\n  - name: cluster-a\n    address: 127.0.0.1\n    port: \"1\"\n  \
         - name: cluster-b\n    address: {host}\n    port: \"{port}\"\n"
    );
    let mut opts = options(flavor, plane.target(), &dir.join("render-a"), objects);
    opts.gateway.peers = Some(infergate_cli::config::peers::PeersFile::parse(&peers).unwrap());
    opts.gateway.cluster = Some("cluster-a".into());
    opts.gateway.peer_mode = mode;
    plane_docs(plane, opts)
}

async fn spills(plane: Plane, flavor: Flavor, mode: PeerMode) {
    let label = format!("{plane} {flavor} {mode:?} Mode");
    let (sim_a, sim_b) = (queueing_pool(MODEL).await, queueing_pool(MODEL).await);
    let dir = RunDir::new("cp-clusters").unwrap();
    let gateway_b = exporting_gateway(flavor, mode, &sim_b, dir.path()).await;
    let b = gateway_b.base_url();
    // B's own warm-up requests are picks of B's.
    let b_picks = || async {
        let stats = gateway_b.stats().await.unwrap();
        stats.sum_containing("infergate.picker.decisions")
    };
    let b_warm = b_picks().await;
    let docs = importing_docs(
        plane,
        flavor,
        mode,
        b.trim_start_matches("http://"),
        dir.path(),
    );
    let a = install(plane, flavor, &docs, sim_a.addrs(), 4).await;
    assert!(
        a.translated.dropped.is_empty(),
        "{label}: the control plane would not apply {:?}",
        a.translated.dropped
    );
    let base = a.proxy.base_url();
    let in_a = |addr: SocketAddr| sim_a.addrs().contains(&addr);
    let in_b = |addr: SocketAddr| sim_b.addrs().contains(&addr);

    // A pool without fresh metrics yet sends its requests to the peer: wait for A's own.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut k = 0;
    while !in_a(send(&base, &format!("warm {k}"), 0).await) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{label}: A never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        k += 1;
    }
    // 1. Room in A: every turn stays there.
    for turn in 0..3 {
        for c in 0..8 {
            let served = send(&base, &format!("calm {c}"), turn).await;
            assert!(
                in_a(served),
                "{label}: calm {c} turn {turn} served by {served}"
            );
        }
    }
    // 2. A saturated (5 waiting per replica, the default threshold): new conversations
    // are served in B.
    let hogs = hog(&sim_a, MODEL, 5);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut spilled = 0;
    for c in 0..16 {
        if in_b(send(&base, &format!("spill {c}"), 0).await) {
            spilled += 1;
        }
    }
    for h in hogs {
        h.abort();
    }
    assert!(spilled >= 14, "{label}: {spilled} of 16 served in B");
    let b_picks = b_picks().await - b_warm;
    match mode {
        PeerMode::Parent => assert!(b_picks > 0, "{label}: B's gateway picked nothing"),
        PeerMode::Endpoint => assert_eq!(b_picks, 0, "{label}: B's gateway picked"),
    }
    eprintln!(
        "CLUSTERS {label}: 8 × 3 turns stayed in A; A saturated, {spilled} of 16 served in B"
    );
}

fn every_flavour_and_mode(plane: Plane) {
    runtime().block_on(async {
        for flavor in [Flavor::Wasm, Flavor::Native] {
            if unbuilt(flavor) {
                continue;
            }
            for mode in [PeerMode::Parent, PeerMode::Endpoint] {
                spills(plane, flavor, mode).await;
            }
        }
    });
}

#[test]
fn istio_imported_pool_spills_to_the_peer_cluster() {
    every_flavour_and_mode(Plane::Istio);
}

#[test]
fn envoy_gateway_imported_pool_spills_to_the_peer_cluster() {
    every_flavour_and_mode(Plane::EnvoyGateway);
}
