//! The cluster-level step: a pool with peers picks here until it is saturated, then spills
//! to the cheapest open peer; a conversation a peer holds goes back there; a request from
//! a peer, or with no open peer, stays here.

use super::*;
use crate::headers::{MAX_RETRIES, PEER_HOP, PEER_ROUTE};
use scheduler_core::metrics::EndpointMetrics;
use scheduler_core::snapshot::{decode, ClusterMembers, Health, Member, Snapshot};

/// Two peer gateways.
const P1: &str = "10.1.0.1:9000";
const P2: &str = "10.2.0.1:9000";

fn with_peers() -> PickerShared {
    shared(pool(
        &[A, B],
        json!({"peers": {"cluster": "peers-p", "endpoints": [P1, P2]}}),
    ))
}

/// A snapshot (version `version`) with the local endpoints at `local` requests waiting
/// and the peers at `peers` (waiting each).
fn figures(version: u64, local: u32, peers: [u32; 2]) -> FakeHost {
    let list = [
        (A, metrics(local, 0.3)),
        (B, metrics(local, 0.3)),
        (P1, metrics(peers[0], 0.2)),
        (P2, metrics(peers[1], 0.4)),
    ];
    FakeHost::new().snapshot(version, snapshot(NOW, &list))
}

/// One request for `content` with the snapshot of `base`; where it went and whether it
/// was routed through the peers cluster.
fn send(s: &mut PickerShared, base: &FakeHost, content: &str) -> (String, FakeHost, PickRun) {
    let mut host = host_for(&chat(content), None);
    host.snapshot = base.snapshot.clone();
    let (status, req) = pick_one(s, &mut host);
    assert_eq!(status, FilterStatus::Continue, "{:?}", host.last_reply());
    let to = host
        .header(DESTINATION_ENDPOINT)
        .and_then(|list| list.split(',').next())
        .unwrap_or_default()
        .to_owned();
    (to, host, req)
}

fn conversation(n: u32) -> String {
    format!("conversation {n}: a long shared system prompt. ").repeat(40)
}

/// Two replicas of the peer cluster, as its gateway publishes them (Endpoint Mode).
const E1: &str = "10.1.5.1:8000";
const E2: &str = "10.1.5.2:8000";

/// A pool whose peer (gateway P1) is reached in Endpoint Mode.
fn endpoint_mode() -> PickerShared {
    shared(pool(
        &[A, B],
        json!({"peers": {"cluster": "peers-p", "endpoints": [P1], "mode": "Endpoint"}}),
    ))
}

/// A snapshot of `list` scraped at `at`, with E1 and E2 the members of the peers cluster.
fn published(at: u64, list: &[(&str, EndpointMetrics)]) -> Snapshot {
    let mut snap = decode(&snapshot(at, list)).unwrap();
    snap.clusters = vec![ClusterMembers {
        cluster: "peers-p".into(),
        members: [E1, E2]
            .map(|address| Member {
                address: address.to_owned(),
                health: Health::Healthy,
            })
            .to_vec(),
    }];
    snap
}

/// An endpoint's figures: `waiting` and `running` requests, `kv` of its KV cache in use.
fn busy(waiting: u32, running: u32, kv: f64) -> EndpointMetrics {
    EndpointMetrics {
        running: Some(running),
        ..metrics(waiting, kv)
    }
}

#[test]
fn an_unsaturated_pool_picks_here() {
    let mut s = with_peers();
    let (to, host, _req) = send(&mut s, &figures(1, 1, [0, 0]), &conversation(0));
    assert!(to == A || to == B, "{to}");
    assert_eq!(host.header(PEER_ROUTE), None);
    assert_eq!(host.header(PEER_HOP), None);
    assert_eq!(host.route_refreshes, 0);
}

#[test]
fn a_saturated_pool_spills_to_the_cheapest_open_peer_through_the_peers_cluster() {
    let mut s = with_peers();
    let (to, host, mut req) = send(&mut s, &figures(1, 6, [1, 3]), &conversation(0));
    assert_eq!(to, P1);
    assert_eq!(host.header(PEER_ROUTE), Some("peers-p"));
    assert_eq!(host.header(PEER_HOP), Some("1"));
    assert_eq!(host.route_refreshes, 1);
    // The fallback is the other peer, never a local endpoint.
    assert_eq!(
        host.header(DESTINATION_ENDPOINT),
        Some("10.1.0.1:9000,10.2.0.1:9000")
    );
    // The lease is the peers pool's.
    assert_eq!(s.inflight(PoolId(1), P1).map(|l| l.requests), Some(1));
    req.on_end(&mut s);
    assert_eq!(s.inflight(PoolId(1), P1).map(|l| l.requests), Some(0));
}

#[test]
fn a_peer_pick_falls_back_to_this_gateways_own_listener_last() {
    let mut s = shared(pool(
        &[A, B],
        json!({"peers": {"cluster": "peers-p", "endpoints": [P1, P2],
                         "loopback": "127.0.0.1:10000"}}),
    ));
    let (_, host, _req) = send(&mut s, &figures(1, 6, [1, 3]), &conversation(0));
    assert_eq!(
        host.header(DESTINATION_ENDPOINT),
        Some("10.1.0.1:9000,10.2.0.1:9000,127.0.0.1:10000")
    );
    let err = PickerShared::from_json(pool(
        &[A],
        json!({"peers": {"cluster": "c", "endpoints": [P1], "loopback": P1}}),
    ))
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(err.contains("peers.loopback"), "{err}");
}

/// With `apiKey`, a peer pick presents this gateway's key to the peer gateway (which
/// authenticates it as one of its tenants); a local pick carries no credential.
#[test]
fn a_peer_pick_carries_this_gateways_key() {
    let mut s = shared(pool(
        &[A, B],
        json!({"peers": {"cluster": "peers-p", "endpoints": [P1], "apiKey": "sk-cluster-a"}}),
    ));
    let (to, host, _req) = send(&mut s, &figures(1, 6, [1, 3]), &conversation(0));
    assert_eq!(to, P1);
    assert_eq!(host.header("authorization"), Some("Bearer sk-cluster-a"));
    let (to, host, _req) = send(&mut s, &figures(2, 0, [1, 3]), &conversation(5));
    assert!(to == A || to == B, "{to}");
    assert_eq!(host.header("authorization"), None);
    for (peers, problem) in [
        (
            json!({"cluster": "c", "endpoints": [P1], "mode": "Endpoint", "apiKey": "k"}),
            "Parent Mode",
        ),
        (
            json!({"cluster": "c", "endpoints": [P1], "apiKey": "two words"}),
            "visible ASCII",
        ),
        (
            json!({"cluster": "c", "endpoints": [P1], "mode": "Endpoint", "loopback": "127.0.0.1:1"}),
            "Parent Mode",
        ),
    ] {
        let err = PickerShared::from_json(pool(&[A], json!({ "peers": peers })))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            (err.contains("peers.apiKey") || err.contains("peers.loopback"))
                && err.contains(problem),
            "{err}"
        );
    }
}

/// Endpoint Mode: the peers pool is the members the peer gateways publish (the snapshot's
/// cluster `peers-p`), each scraped here; a spill picks one of them, with no fallback (the
/// peers cluster routes on one address) and no loopback.
#[test]
fn endpoint_mode_spills_straight_to_a_published_member() {
    let mut s = endpoint_mode();
    let mut snap = published(
        NOW,
        &[
            (A, metrics(6, 0.3)),
            (B, metrics(6, 0.3)),
            (E1, metrics(3, 0.2)),
            (E2, metrics(0, 0.2)),
        ],
    );
    let base = FakeHost::new().snapshot(1, encode(&snap));
    let (to, host, _req) = send(&mut s, &base, &conversation(0));
    assert_eq!(to, E2);
    assert_eq!(host.header(DESTINATION_ENDPOINT), Some(E2));
    assert_eq!(host.header(PEER_ROUTE), Some("peers-p"));
    assert_eq!(host.header(MAX_RETRIES), Some("0"));
    // Its next turn goes back to the member that holds it, A having room or not.
    let calm = {
        let mut calm = snap.clone();
        for e in calm
            .endpoints
            .iter_mut()
            .filter(|e| e.address == A || e.address == B)
        {
            e.metrics = Some(metrics(0, 0.1));
        }
        FakeHost::new().snapshot(2, encode(&calm))
    };
    let turn_two = format!("{} And a second question.", conversation(0));
    let (to, _, _) = send(&mut s, &calm, &turn_two);
    assert_eq!(to, E2);
    // Without published members there is no peer to spill to: the request stays here.
    snap.clusters[0].members.clear();
    let (to, host, _) = send(
        &mut s,
        &FakeHost::new().snapshot(3, encode(&snap)),
        &conversation(7),
    );
    assert!(to == A || to == B, "{to}");
    assert_eq!(host.header(PEER_ROUTE), None);
}

/// Endpoint Mode: the requests of one scrape interval spread over the peers' replicas by
/// this gateway's in-flight count, rather than all going to the emptiest by the scrape.
#[test]
fn endpoint_mode_spreads_spills_by_this_gateways_requests_in_flight() {
    let mut s = endpoint_mode();
    let snap = published(
        NOW,
        &[
            (A, metrics(6, 0.3)),
            (B, metrics(6, 0.3)),
            (E1, metrics(0, 0.1)),
            (E2, metrics(0, 0.2)),
        ],
    );
    let base = FakeHost::new().snapshot(1, encode(&snap));
    let (first, _, _one) = send(&mut s, &base, &conversation(0));
    let (second, _, _two) = send(&mut s, &base, &conversation(1));
    assert_eq!(first, E1, "the emptier cache first");
    assert_eq!(
        second, E2,
        "then the replica with none of this gateway's requests"
    );
}

/// A snapshot with the local endpoints at `local` (waiting, running) and the peers at
/// `peers`, taken `version` ms after a first one (every scrape round is new content).
fn loads(version: u64, local: (u32, u32), peers: (u32, u32)) -> FakeHost {
    let list = [
        (A, busy(local.0, local.1, 0.3)),
        (B, busy(local.0, local.1, 0.3)),
        (P1, busy(peers.0, peers.1, 0.3)),
        (P2, busy(peers.0, peers.1, 0.3)),
    ];
    FakeHost::new().snapshot(version, snapshot(NOW - 100 + version, &list))
}

/// A replica seen running 2 while requests waited (two snapshots in a row) is full at 2:
/// the pool spills once both are, well before the queue threshold (5), counting the
/// requests this gateway has in flight there since the last scrape.
#[test]
fn a_pool_whose_replicas_run_all_they_can_spills_before_anything_waits() {
    let mut s = with_peers();
    // One snapshot with a queue teaches nothing: a request below the threshold stays here.
    let (to, _, _) = send(&mut s, &loads(1, (1, 2), (0, 0)), &conversation(0));
    assert!(to == A || to == B, "{to}");
    // The queue again: the capacity is 2, and 3 is over it.
    let (to, host, _) = send(&mut s, &loads(2, (1, 2), (0, 0)), &conversation(1));
    assert!(to == P1 || to == P2, "{to}");
    assert_eq!(host.header(PEER_ROUTE), Some("peers-p"));
    // One running on each: room, until this gateway's own requests fill both.
    let calm = loads(3, (0, 1), (0, 0));
    let mut held = Vec::new();
    let spilled = loop {
        let (to, _, req) = send(&mut s, &calm, &conversation(10 + held.len() as u32));
        held.push(req);
        if to == P1 || to == P2 {
            break held.len();
        }
        assert!(held.len() < 8, "never spilled");
    };
    let in_flight = |e: &str| s.inflight(PoolId(0), e).map_or(0, |l| l.requests);
    // Each replica (1 running by the scrape) takes 2 of this gateway's requests first.
    assert!(spilled >= 5, "spilled as request {spilled}");
    assert!(
        in_flight(A) >= 2 && in_flight(B) >= 2,
        "{} {}",
        in_flight(A),
        in_flight(B)
    );
    // Once they finish, the pool has room again.
    for req in held.iter_mut() {
        req.on_end(&mut s);
    }
    let (to, _, _) = send(&mut s, &calm, &conversation(30));
    assert!(to == A || to == B, "{to}");
}

/// Endpoint Mode: a peer replica running its learned batch is not open, however good its
/// other figures look; the spill goes to one with room.
#[test]
fn endpoint_mode_spills_to_no_full_replica() {
    let mut s = endpoint_mode();
    // E1: the emptier cache, and seen queueing at 2 running; E2: nothing learned.
    let round = |version: u64, local_waiting: u32, e1: (u32, u32)| {
        let snap = published(
            NOW - 100 + version,
            &[
                (A, metrics(local_waiting, 0.3)),
                (B, metrics(local_waiting, 0.3)),
                (E1, busy(e1.0, e1.1, 0.1)),
                (E2, busy(0, 0, 0.5)),
            ],
        );
        FakeHost::new().snapshot(version, encode(&snap))
    };
    for version in [1, 2] {
        let (to, _, _) = send(&mut s, &round(version, 0, (1, 2)), &conversation(0));
        assert!(to == A || to == B, "{to}");
    }
    // A saturated; E1 runs its batch with nothing waiting: the spill goes to E2.
    let (to, _, _) = send(&mut s, &round(3, 6, (0, 2)), &conversation(1));
    assert_eq!(to, E2);
    // With room on E1 again, it is the better replica.
    let (to, _, _) = send(&mut s, &round(4, 6, (0, 1)), &conversation(2));
    assert_eq!(to, E1);
}

/// A Parent Mode peer is a gateway publishing means over its cluster: what this gateway
/// has in flight there is spread over many replicas, so no batch is learned from it.
#[test]
fn a_peer_gateway_is_never_full_by_a_learned_batch() {
    let mut s = with_peers();
    let mut held = Vec::new();
    for (n, version) in [1, 2, 3, 4, 5, 6].into_iter().enumerate() {
        let (to, _, req) = send(
            &mut s,
            &loads(version, (6, 2), (1, 2)),
            &conversation(n as u32),
        );
        assert!(to == P1 || to == P2, "request {n} went to {to}");
        held.push(req);
    }
}

#[test]
fn a_conversation_a_peer_holds_goes_back_there_and_others_stay_here() {
    let mut s = with_peers();
    let (to, _, _first) = send(&mut s, &figures(1, 6, [1, 3]), &conversation(1));
    assert_eq!(to, P1);
    // The pool has room again: the spilled conversation's next turn still goes to P1 ...
    let calm = figures(2, 0, [1, 3]);
    let turn_two = format!("{} And a second question.", conversation(1));
    let (to, host, _) = send(&mut s, &calm, &turn_two);
    assert_eq!(to, P1);
    assert_eq!(host.header(PEER_ROUTE), Some("peers-p"));
    // ... while a new one, and a conversation served here, stay here.
    let (to, _, _) = send(&mut s, &calm, &conversation(2));
    assert!(to == A || to == B, "{to}");
    let turn_two = format!("{} Again.", conversation(2));
    let (again, _, _) = send(&mut s, &figures(3, 6, [1, 3]), &turn_two);
    assert_eq!(
        again, to,
        "a conversation held here stays here, saturated or not"
    );
}

#[test]
fn with_no_open_peer_the_request_stays_here() {
    let mut s = with_peers();
    // Both peers at the queue threshold.
    let (to, host, _) = send(&mut s, &figures(1, 6, [5, 9]), &conversation(0));
    assert!(to == A || to == B, "{to}");
    assert_eq!(host.header(PEER_ROUTE), None);
    // Peers with stale figures are no candidates either.
    let stale = snapshot(NOW - 5_000, &[(P1, metrics(0, 0.1)), (P2, metrics(0, 0.1))]);
    let mut both = scheduler_core::snapshot::decode(&snapshot(
        NOW,
        &[(A, metrics(6, 0.3)), (B, metrics(6, 0.3))],
    ))
    .unwrap_or_default();
    both.endpoints.extend(
        scheduler_core::snapshot::decode(&stale)
            .unwrap_or_default()
            .endpoints,
    );
    let base = FakeHost::new().snapshot(2, encode(&both));
    let (to, _, _) = send(&mut s, &base, &conversation(3));
    assert!(to == A || to == B, "{to}");
}

#[test]
fn a_pool_that_would_refuse_sends_to_an_open_peer_and_answers_only_without_one() {
    let mut s = with_peers();
    // The local replicas' metrics are missing (FailClose: 503), the peers are open.
    let peers_only = snapshot(NOW, &[(P1, metrics(0, 0.1)), (P2, metrics(3, 0.4))]);
    let base = FakeHost::new().snapshot(1, peers_only);
    let (to, host, _) = send(&mut s, &base, &conversation(0));
    assert_eq!(to, P1);
    assert_eq!(host.header(PEER_ROUTE), Some("peers-p"));
    // No open peer either: the pool's own answer.
    let mut host = host_for(&chat(&conversation(1)), None);
    host.snapshot = Some((
        crate::host::SnapshotVersion(2),
        snapshot(NOW, &[(P1, metrics(9, 0.1)), (P2, metrics(9, 0.4))]),
    ));
    let (status, _req) = pick_one(&mut s, &mut host);
    assert_eq!(status, FilterStatus::Replied);
    assert_eq!(host.last_reply().map(|r| r.status), Some(503));
}

#[test]
fn a_dead_peer_is_skipped() {
    let mut s = with_peers();
    let mut snap = scheduler_core::snapshot::decode(&snapshot(
        NOW,
        &[
            (A, metrics(6, 0.3)),
            (B, metrics(6, 0.3)),
            (P1, metrics(0, 0.1)),
            (P2, metrics(2, 0.4)),
        ],
    ))
    .unwrap_or_default();
    if let Some(p1) = snap.endpoints.iter_mut().find(|e| e.address == P1) {
        p1.consecutive_failures = 3;
    }
    let base = FakeHost::new().snapshot(1, encode(&snap));
    let (to, host, _) = send(&mut s, &base, &conversation(0));
    assert_eq!(to, P2);
    assert_eq!(host.header(DESTINATION_ENDPOINT), Some(P2));
}

#[test]
fn a_request_from_a_peer_is_served_here() {
    let mut s = with_peers();
    let mut host = host_for(&chat(&conversation(0)), None).request_header(PEER_HOP, "1");
    host.snapshot = figures(1, 6, [0, 0]).snapshot;
    let (status, _req) = pick_one(&mut s, &mut host);
    assert_eq!(status, FilterStatus::Continue);
    let to = host.header(DESTINATION_ENDPOINT).unwrap_or_default();
    assert!(to.starts_with(A) || to.starts_with(B), "{to}");
    assert_eq!(host.header(PEER_ROUTE), None);
}

#[test]
fn a_client_cannot_choose_the_peer_route() {
    let mut s = with_peers();
    let mut host = host_for(&chat(&conversation(0)), None).request_header(PEER_ROUTE, "peers-p");
    host.snapshot = figures(1, 1, [0, 0]).snapshot;
    let (status, _req) = pick_one(&mut s, &mut host);
    assert_eq!(status, FilterStatus::Continue);
    assert_eq!(host.header(PEER_ROUTE), None);
}

#[test]
fn the_peers_pool_is_never_chosen_by_cluster_or_model() {
    let s = with_peers();
    let plans = s.plans();
    assert_eq!(plans.pools().len(), 2);
    assert!(plans.for_cluster("peers-p").is_none());
    assert_eq!(
        plans.for_base_model("llama").map(|p| p.id()),
        Some(PoolId(0))
    );
    let peers = plans
        .get(PoolId(1))
        .map(|p| (p.name().to_owned(), p.is_peer_pool()));
    assert_eq!(peers, Some(("p-peers".to_owned(), true)));
}

#[test]
fn peers_sections_the_picker_cannot_run_are_refused() {
    for (peers, field) in [
        (
            json!({"cluster": "c", "endpoints": [], }),
            "peers.endpoints",
        ),
        (
            json!({"cluster": "c", "endpoints": [P1], "mode": "Elsewhere"}),
            "unknown variant",
        ),
        (
            json!({"cluster": "c", "endpoints": [P1], "spillover": {"kvCacheUtilThreshold": 1.5}}),
            "peers.spillover.kvCacheUtilThreshold",
        ),
        (
            json!({"cluster": "c", "endpoints": ["not-an-address"]}),
            "not ip:port",
        ),
        (
            json!({"cluster": "p", "endpoints": [P1]}),
            "two pools pick for Envoy cluster",
        ),
    ] {
        let err = PickerShared::from_json(pool(&[A], json!({"peers": peers})))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(field), "{field}: {err}");
    }
}
