//! Two clusters on loopback, each a gateway over its own simulated pool. Cluster B exports
//! its pool; cluster A's pool lists B's gateway as a peer, in Parent Mode (A sends to B's
//! gateway) and in Endpoint Mode (A sends straight to the replicas B's gateway publishes).
//! Through real Envoy, at one and at four workers:
//!
//! 1. **Stickiness.** While A has room, every turn of 64 six-turn conversations is served
//!    in A: zero switches.
//! 2. **Spillover.** With A's replicas queueing past the spillover threshold (long requests
//!    sent straight to them), new conversations go to B; conversations A already holds
//!    stay in A.
//! 3. **Affinity back.** Once A has room again, the spilled conversations' next turns still
//!    go to B: a conversation stays in the cluster that served its first turn. And A,
//!    having seen its replicas queue, knows their batch: running it with nothing waiting,
//!    it spills a new conversation before that one would wait.
//! 4. **Peer failure.** Killing B's gateway drops it from A's candidates within 2 s; from
//!    then on the spilled conversations are served in A, with no client error. (In
//!    Endpoint Mode B's replicas still serve until then: B's gateway is gone, but not they.)

use super::tag;
use crate::clusters::{hog, queueing_pool, turn_body};
use crate::support::gw::{self, billing_records, Plan};
use crate::support::objects::{objective, tenant_quota};
use infergate_cli::config::bootstrap::{PeerMode, Peers};
use infergate_cli::config::tenancy::Tenancy;
use infergate_harness::launch::client::post_json;
use infergate_harness::launch::{Flavor, PoolSpec, Stack};
use infergate_harness::sim::{SimHandle, REPLICA_ADDR_HEADER};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const MODEL: &str = "sim-model";

/// Conversations and turns of the stickiness phase.
const CONVERSATIONS: usize = 64;
const TURNS: usize = 6;

/// Sends one turn through `gateway`; the replica that served it.
async fn send(gateway: &str, label: &str, turn: usize) -> Result<SocketAddr, String> {
    let url = format!("{gateway}/v1/chat/completions");
    let resp = post_json(&url, &turn_body(MODEL, label, turn), &[])
        .await
        .map_err(|e| e.to_string())?;
    if resp.status != 200 {
        return Err(format!("{} {}", resp.status, resp.text()));
    }
    resp.header(REPLICA_ADDR_HEADER)
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| "no replica header".to_owned())
}

/// Which cluster served `addr`.
fn cluster_of(a: &SimHandle, b: &SimHandle, addr: SocketAddr) -> char {
    if a.addrs().contains(&addr) {
        'A'
    } else if b.addrs().contains(&addr) {
        'B'
    } else {
        '?'
    }
}

/// `addr` of a gateway's listener.
fn listener(stack: &Stack) -> SocketAddr {
    let url = stack.picker_url();
    url.trim_start_matches("http://").parse().unwrap()
}

/// Whether `gateway`'s scraper still counts `peer` live: in Parent Mode, fewer failed
/// scrapes of its page in a row than the peers pool's `maxConsecutiveFailures` (3); in
/// Endpoint Mode, the members its page published are still followed.
async fn peer_live(gateway: &Stack, peer: SocketAddr, mode: PeerMode) -> bool {
    let stats = gateway.envoy().stats().await.unwrap();
    if mode == PeerMode::Endpoint {
        let members = stats.containing("infergate.scraper.cluster_members");
        let peers = members.filter(|(k, _)| k.contains("-peers"));
        return peers.map(|(_, v)| v).max().unwrap_or(0) > 0;
    }
    let key = format!(
        "infergate.scraper.consecutive_failures.endpoint.{}",
        peer.to_string().replace(['.', ':'], "_")
    );
    stats.containing(&key).map(|(_, v)| v).max().unwrap_or(0) < 3
}

async fn two_clusters(flavor: Flavor, workers: u32, mode: PeerMode) {
    let (sim_a, sim_b) = (queueing_pool(MODEL).await, queueing_pool(MODEL).await);
    let mut exported = PoolSpec::all(MODEL);
    exported.export = true;
    exported.export_members = mode == PeerMode::Endpoint;
    let mut plan_b = Plan::new(vec![exported]);
    plan_b.concurrency = workers;
    let Some(gateway_b) = gw::start_over(flavor, sim_b.addrs().to_vec(), plan_b).await else {
        return;
    };
    let mut importing = PoolSpec::all(MODEL);
    importing.peers = Some(Peers {
        gateways: vec![listener(&gateway_b)],
        remote_pool: None,
        spillover: json!({"queueDepthThreshold": 2}),
        mode,
        api_key: None,
    });
    let mut plan_a = Plan::new(vec![importing]);
    plan_a.concurrency = workers;
    let Some(gateway_a) = gw::start_over(flavor, sim_a.addrs().to_vec(), plan_a).await else {
        return;
    };
    let a_url = gateway_a.picker_url();
    let label = format!("{} {mode:?} Mode at {workers} worker(s)", tag(flavor));

    // 1. Room everywhere: every turn stays in A.
    let mut switches = 0;
    for turn in 0..TURNS {
        for c in 0..CONVERSATIONS {
            let served = send(&a_url, &format!("calm {c}"), turn)
                .await
                .unwrap_or_else(|e| panic!("{label}: turn {turn} of calm {c}: {e}"));
            if cluster_of(&sim_a, &sim_b, served) != 'A' {
                switches += 1;
            }
        }
    }
    assert_eq!(
        switches, 0,
        "{label}: turns served outside A while it had room"
    );
    println!("{label}: {CONVERSATIONS} × {TURNS} turns, 0 left cluster A");

    // 2. A saturated: new conversations spill to B; held ones stay.
    let hogs = hog(&sim_a, MODEL, 3);
    // A few scrape rounds for the queues to show.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut spilled = Vec::new();
    for c in 0..16 {
        let name = format!("spill {c}");
        let served = send(&a_url, &name, 0).await.unwrap();
        if cluster_of(&sim_a, &sim_b, served) == 'B' {
            spilled.push(name);
        }
    }
    assert!(
        spilled.len() >= 14,
        "{label}: only {} of 16 new conversations spilled to B",
        spilled.len()
    );
    let held = send(&a_url, "calm 0", TURNS).await.unwrap();
    assert_eq!(
        cluster_of(&sim_a, &sim_b, held),
        'A',
        "{label}: a conversation A holds left while A was saturated"
    );
    println!(
        "{label}: A saturated, {} of 16 new conversations served in B",
        spilled.len()
    );

    // 3. A has room again: the spilled conversations stay in B.
    for h in hogs {
        h.abort();
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    for name in &spilled {
        let served = send(&a_url, name, 1).await.unwrap();
        assert_eq!(
            cluster_of(&sim_a, &sim_b, served),
            'B',
            "{label}: {name}'s second turn left B"
        );
    }
    let fresh = send(&a_url, "after the storm", 0).await.unwrap();
    assert_eq!(
        cluster_of(&sim_a, &sim_b, fresh),
        'A',
        "{label}: A has room again"
    );

    // 3b. The queues of step 2 taught A its replicas' batch (one sequence each): running
    // it with nothing waiting (far below the queue threshold), they are full, and a new
    // conversation spills before it would wait.
    let hogs = hog(&sim_a, MODEL, 0);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let before_a_queue = send(&a_url, "full, not queued", 0).await.unwrap();
    assert_eq!(
        cluster_of(&sim_a, &sim_b, before_a_queue),
        'B',
        "{label}: A's replicas ran their batch and a new conversation stayed"
    );
    for h in hogs {
        h.abort();
    }
    tokio::time::sleep(Duration::from_millis(600)).await;

    // Parent Mode sent the spilled turns through B's gateway, which picked them; Endpoint
    // Mode straight to B's replicas, so B's gateway picked nothing.
    let b_stats = gateway_b.envoy().stats().await.unwrap();
    let b_picks = b_stats.sum_containing("infergate.picker.decisions");
    match mode {
        PeerMode::Parent => assert!(b_picks > 0, "{label}: B's gateway picked nothing"),
        PeerMode::Endpoint => assert_eq!(b_picks, 0, "{label}: B's gateway picked"),
    }

    // 4. B's gateway dies: A drops it, and B's conversations are served in A.
    let b_addr = listener(&gateway_b);
    assert!(
        peer_live(&gateway_a, b_addr, mode).await,
        "{label}: B is live before it dies"
    );
    drop(gateway_b);
    let killed = Instant::now();
    let (mut errors, mut requests) = (Vec::new(), 0);
    let mut dropped_after = None;
    while killed.elapsed() < Duration::from_secs(5) {
        for name in &spilled {
            // Parent Mode: served in A from the first request on; before A drops B, a
            // connection B refuses is retried on A's own listener (the peer pick's last
            // fallback). Endpoint Mode: B's replicas serve until A drops B.
            match send(&a_url, name, 2).await {
                Ok(served) => {
                    let expected = match (mode, dropped_after) {
                        (PeerMode::Endpoint, None) => cluster_of(&sim_a, &sim_b, served),
                        _ => 'A',
                    };
                    assert_eq!(
                        cluster_of(&sim_a, &sim_b, served),
                        expected,
                        "{label}: {name}"
                    );
                    requests += 1;
                }
                Err(e) => errors.push(e),
            }
        }
        if dropped_after.is_none() && !peer_live(&gateway_a, b_addr, mode).await {
            dropped_after = Some(killed.elapsed());
        }
        if dropped_after.is_some_and(|at| killed.elapsed() > at + Duration::from_millis(500)) {
            break;
        }
    }
    assert!(
        errors.is_empty(),
        "{label}: client errors after B died: {errors:?}"
    );
    let dropped_after = dropped_after.unwrap_or_else(|| panic!("{label}: B was never dropped"));
    assert!(
        dropped_after < Duration::from_secs(2),
        "{label}: B dropped after {dropped_after:?}"
    );
    println!(
        "{label}: B's gateway killed; dropped after {} ms; {requests} requests, all served \
         in A once it was dropped, 0 errors",
        dropped_after.as_millis()
    );
}

/// A client's key at A, and the key A presents to B.
const CLIENT_KEY: &str = "sk-infergate-e2e-clusters-client";
const PEER_KEY: &str = "sk-infergate-e2e-clusters-from-a";

/// `name`'s tenants: one tenant of key `key`, and a billing log.
fn tenancy(flavor: Flavor, workers: u32, name: &str, key: &str) -> Tenancy {
    let billing = std::env::temp_dir().join(format!(
        "infergate-e2e-clusters-{}-{}-{workers}-{name}.log",
        std::process::id(),
        tag(flavor)
    ));
    let _ = std::fs::remove_file(&billing);
    let limit = json!({"rpm": 100000, "tpm": 100000000, "concurrency": 1000});
    Tenancy {
        objects: vec![
            tenant_quota(name, key, "standard-traffic", limit, None),
            objective("standard-traffic", 0),
        ],
        jwt: None,
        billing_log: Some(billing),
    }
}

/// Both clusters authenticate tenants (Parent Mode). A client of A spills to B: A admits
/// and bills it as the client's tenant, B as tenant `cluster-a`, the key A presents.
async fn tenants_on_both_sides(flavor: Flavor, workers: u32) {
    let (sim_a, sim_b) = (queueing_pool(MODEL).await, queueing_pool(MODEL).await);
    let mut exported = PoolSpec::all(MODEL);
    exported.export = true;
    let mut plan_b = Plan::new(vec![exported]);
    plan_b.concurrency = workers;
    plan_b.tenancy = tenancy(flavor, workers, "cluster-a", PEER_KEY);
    let Some(gateway_b) = gw::start_over(flavor, sim_b.addrs().to_vec(), plan_b).await else {
        return;
    };
    let mut importing = PoolSpec::all(MODEL);
    importing.peers = Some(Peers {
        gateways: vec![listener(&gateway_b)],
        spillover: json!({"queueDepthThreshold": 2}),
        api_key: Some(PEER_KEY.into()),
        ..Peers::default()
    });
    let mut plan_a = Plan::new(vec![importing]);
    plan_a.concurrency = workers;
    plan_a.tenancy = tenancy(flavor, workers, "tenant-client", CLIENT_KEY);
    let Some(gateway_a) = gw::start_over(flavor, sim_a.addrs().to_vec(), plan_a).await else {
        return;
    };
    let label = format!("{} tenants at {workers} worker(s)", tag(flavor));
    let url = format!("{}/v1/chat/completions", gateway_a.picker_url());
    let auth = format!("Bearer {CLIENT_KEY}");
    let hogs = hog(&sim_a, MODEL, 3);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut in_b = 0;
    for c in 0..8 {
        let body = turn_body(MODEL, &format!("tenant {c}"), 0);
        let resp = post_json(&url, &body, &[("authorization", auth.as_str())])
            .await
            .unwrap();
        assert_eq!(resp.status, 200, "{label}: {}", resp.text());
        let served = resp
            .header(REPLICA_ADDR_HEADER)
            .and_then(|a| a.parse().ok());
        if served.is_some_and(|s| cluster_of(&sim_a, &sim_b, s) == 'B') {
            in_b += 1;
        }
    }
    for h in hogs {
        h.abort();
    }
    assert!(in_b >= 7, "{label}: only {in_b} of 8 served in B");
    let at_a = billing_records(&gateway_a, 8, Duration::from_secs(5)).await;
    let at_b = billing_records(&gateway_b, in_b, Duration::from_secs(5)).await;
    let tenants = |records: &[Value]| -> Vec<String> {
        let mut t: Vec<String> = records
            .iter()
            .filter_map(|r| r["tenant"].as_str().map(str::to_owned))
            .collect();
        t.dedup();
        t
    };
    assert_eq!(tenants(&at_a), ["tenant-client"], "{label}: {at_a:?}");
    assert_eq!(tenants(&at_b), ["cluster-a"], "{label}: {at_b:?}");
    assert!(
        at_b.len() >= in_b,
        "{label}: B billed {} of {in_b}",
        at_b.len()
    );
    // A client cannot present A's key to B through A: its own credential is A's business.
    let resp = post_json(&url, &turn_body(MODEL, "no key", 0), &[])
        .await
        .unwrap();
    assert_eq!(resp.status, 401, "{label}: {}", resp.text());
    println!(
        "{label}: {in_b} of 8 spilled requests served in B; billed at A to tenant-client, at B \
         to cluster-a"
    );
}

pub(super) async fn a_peer_gateway_with_tenants_admits_this_clusters_key_at_one_worker(
    flavor: Flavor,
) {
    tenants_on_both_sides(flavor, 1).await;
}

pub(super) async fn a_peer_gateway_with_tenants_admits_this_clusters_key_at_four_workers(
    flavor: Flavor,
) {
    tenants_on_both_sides(flavor, 4).await;
}

pub(super) async fn a_saturated_cluster_spills_and_conversations_stay_at_one_worker(
    flavor: Flavor,
) {
    two_clusters(flavor, 1, PeerMode::Parent).await;
}

pub(super) async fn a_saturated_cluster_spills_and_conversations_stay_at_four_workers(
    flavor: Flavor,
) {
    two_clusters(flavor, 4, PeerMode::Parent).await;
}

pub(super) async fn endpoint_mode_spills_to_the_peers_replicas_at_one_worker(flavor: Flavor) {
    two_clusters(flavor, 1, PeerMode::Endpoint).await;
}

pub(super) async fn endpoint_mode_spills_to_the_peers_replicas_at_four_workers(flavor: Flavor) {
    two_clusters(flavor, 4, PeerMode::Endpoint).await;
}

for_each_flavour!(
    a_saturated_cluster_spills_and_conversations_stay_at_one_worker,
    a_saturated_cluster_spills_and_conversations_stay_at_four_workers,
    endpoint_mode_spills_to_the_peers_replicas_at_one_worker,
    endpoint_mode_spills_to_the_peers_replicas_at_four_workers,
    a_peer_gateway_with_tenants_admits_this_clusters_key_at_one_worker,
    a_peer_gateway_with_tenants_admits_this_clusters_key_at_four_workers,
);
