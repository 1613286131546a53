//! Pools that follow their cluster's membership from the snapshot: members that join and
//! leave, their health, slots reused only when idle, leases held across changes, and the
//! static pools that take only the health.

use proptest::prelude::*;
use scheduler_core::snapshot::{ClusterMembers, Health, Member};

use super::*;

const D: &str = "10.0.0.4:8000";
const INFLIGHT_POOL: &str = "infergate.picker.inflight_requests.pool.p";

/// A pool of cluster `p` with no static endpoints.
fn following(extra: Value) -> PickerShared {
    let mut v = json!({"pool": "p", "baseModel": "llama"});
    if let (Some(obj), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
        obj.extend(extra.clone());
    }
    shared(v)
}

/// A snapshot at `NOW` with every member scraped fresh and cluster `p` holding them.
fn with_members(members: &[(&str, Health)]) -> Vec<u8> {
    encode(&Snapshot {
        taken_at: Millis(NOW),
        endpoints: members
            .iter()
            .map(|(address, _)| EndpointSample {
                address: (*address).to_owned(),
                scraped_at: Millis(NOW),
                consecutive_failures: 0,
                metrics: Some(metrics(0, 0.1)),
            })
            .collect(),
        clusters: vec![ClusterMembers {
            cluster: "p".into(),
            members: members
                .iter()
                .map(|(address, health)| Member {
                    address: (*address).to_owned(),
                    health: *health,
                })
                .collect(),
        }],
    })
}

/// Publish `bytes` as version `version` and let the state see it.
fn publish(s: &PickerShared, host: &mut FakeHost, version: u64, bytes: Vec<u8>) {
    host.snapshot = Some((SnapshotVersion(version), bytes));
    s.refresh_snapshot(&*host);
}

fn request(session: Option<&str>) -> PickRequest<'_> {
    PickRequest {
        target_model: "llama",
        block_hashes: &[],
        prompt_tokens: scheduler_core::types::Tokens(5),
        max_output_tokens: None,
        output_sequences: 1,
        session,
    }
}

fn pick_at(s: &PickerShared, seed: u64) -> Result<Picked, Rejection> {
    let plan = s.pool_plan("llama");
    let Some(plan) = plan else {
        unreachable!("the pool serves llama")
    };
    s.pick(&plan, &request(None), Millis(NOW), seed)
}

fn picked_set(s: &PickerShared) -> std::collections::BTreeSet<String> {
    (0..64)
        .filter_map(|seed| pick_at(s, seed).ok().map(|p| p.endpoint))
        .collect()
}

fn set(items: &[&str]) -> std::collections::BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn a_following_pool_picks_exactly_the_current_members() {
    let s = following(json!({"eppConfig": {"plugins": [{"type": "random-picker"}],
        "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "random-picker"}]}]}}));
    let mut host = host_for(b"", None);
    // Before any membership: nothing to pick.
    assert_eq!(pick_at(&s, 1).err(), Some(Rejection::NoEndpoints));
    publish(
        &s,
        &mut host,
        1,
        with_members(&[(A, Health::Healthy), (B, Health::Healthy)]),
    );
    assert_eq!(s.members(PoolId(0)), [A, B]);
    assert_eq!(picked_set(&s), set(&[A, B]));
    // C joins, B leaves.
    publish(
        &s,
        &mut host,
        2,
        with_members(&[(A, Health::Healthy), (C, Health::Healthy)]),
    );
    assert_eq!(picked_set(&s), set(&[A, C]));
    // A snapshot that does not carry the cluster changes nothing.
    publish(&s, &mut host, 3, fresh_all(&[A, B, C]));
    assert_eq!(picked_set(&s), set(&[A, C]));
    // An empty cluster empties the pool.
    publish(&s, &mut host, 4, with_members(&[]));
    assert_eq!(pick_at(&s, 1).err(), Some(Rejection::NoEndpoints));
    assert!(s.members(PoolId(0)).is_empty());
}

#[test]
fn unhealthy_members_are_never_candidates_nor_fallbacks_and_degraded_ones_are() {
    let s = following(json!({"fallbacks": 3}));
    let mut host = host_for(b"", None);
    publish(
        &s,
        &mut host,
        1,
        with_members(&[
            (A, Health::Healthy),
            (B, Health::Unhealthy),
            (C, Health::Degraded),
        ]),
    );
    for seed in 0..32 {
        let Ok(p) = pick_at(&s, seed) else {
            unreachable!("A and C are candidates")
        };
        assert_ne!(p.endpoint, B);
        assert!(!p.fallbacks.iter().any(|f| f == B), "{:?}", p.fallbacks);
        assert_eq!(p.fallbacks.len(), 1);
    }
    publish(&s, &mut host, 2, with_members(&[(A, Health::Unhealthy)]));
    assert_eq!(pick_at(&s, 1).err(), Some(Rejection::NoEndpoints));
}

#[test]
fn a_static_pool_keeps_its_list_and_honours_its_clusters_health() {
    let s = shared(pool(&[A, B], json!({"fallbacks": 1})));
    let mut host = host_for(b"", None);
    publish(&s, &mut host, 1, fresh_all(&[A, B]));
    assert_eq!(picked_set(&s), set(&[A, B]));
    // The cluster marks B unhealthy and lists D, which is no endpoint of the static pool.
    let mut bytes = with_members(&[(B, Health::Unhealthy), (D, Health::Healthy)]);
    let mut snap = scheduler_core::snapshot::decode(&bytes).unwrap_or_default();
    snap.endpoints = scheduler_core::snapshot::decode(&fresh_all(&[A, B, D]))
        .unwrap_or_default()
        .endpoints;
    bytes = encode(&snap);
    publish(&s, &mut host, 2, bytes);
    assert_eq!(picked_set(&s), set(&[A]));
    assert_eq!(s.members(PoolId(0)), [A, B]);
    publish(
        &s,
        &mut host,
        3,
        with_members(&[(A, Health::Healthy), (B, Health::Healthy)]),
    );
    assert_eq!(picked_set(&s), set(&[A, B]));
}

#[test]
fn a_removed_members_lease_ends_normally_and_its_slot_waits_until_idle() {
    let s = following(json!({}));
    let mut host = host_for(b"", None);
    publish(&s, &mut host, 1, with_members(&[(B, Health::Healthy)]));
    let Ok(mut held) = pick_at(&s, 1) else {
        unreachable!("B is the only member")
    };
    assert_eq!(held.endpoint, B);
    held.lease.raise_gauges(&mut host);
    let slot_of_b = held.lease.endpoint_index();
    // B leaves with its request in flight; D joins and must not take B's slot.
    publish(&s, &mut host, 2, with_members(&[(D, Health::Healthy)]));
    assert_eq!(requests_in_flight(&s, B), 1);
    assert_eq!(requests_in_flight(&s, D), 0);
    let Ok(on_d) = pick_at(&s, 2) else {
        unreachable!("D is a member")
    };
    assert_eq!(on_d.endpoint, D);
    assert_ne!(on_d.lease.endpoint_index(), slot_of_b);
    drop(on_d);
    assert_eq!(
        host.gauges
            .get("infergate.picker.inflight_requests.pool.p.endpoint.10_0_0_2_8000"),
        Some(&1)
    );
    // The request ends normally: gauges back to 0, no underflow.
    held.lease.end(&mut host);
    assert_eq!(requests_in_flight(&s, B), 0);
    assert_eq!(host.gauges.get(INFLIGHT_POOL), Some(&0));
    assert_eq!(
        host.gauges
            .get("infergate.picker.inflight_requests.pool.p.endpoint.10_0_0_2_8000"),
        Some(&0)
    );
    assert_eq!(host.gauge_underflows, 0);
    // Now idle, B's slot is the one the next new member takes.
    publish(
        &s,
        &mut host,
        3,
        with_members(&[(D, Health::Healthy), (C, Health::Healthy)]),
    );
    assert_eq!(s.members(PoolId(0)), [C, D]);
    assert_eq!(s.inflight(PoolId(0), B).map(|l| l.requests), None);
    let picked_c = (0..64)
        .filter_map(|seed| pick_at(&s, seed).ok())
        .find(|p| p.endpoint == C);
    assert_eq!(picked_c.map(|p| p.lease.endpoint_index()), Some(slot_of_b));
}

#[test]
fn a_removed_member_loses_its_prefix_entries_and_sessions() {
    let s = following(json!({"sessionHeader": "x-session-id"}));
    let mut host = host_for(b"", None);
    publish(&s, &mut host, 1, with_members(&[(A, Health::Healthy)]));
    let Some(plan) = s.pool_plan("llama") else {
        unreachable!()
    };
    let hashes = plan.block_hashes("llama", None, &[b'x'; 4096]);
    assert!(!hashes.is_empty());
    let req = PickRequest {
        block_hashes: &hashes,
        ..request(Some("s1"))
    };
    let Ok(p) = s.pick(&plan, &req, Millis(NOW), 1) else {
        unreachable!()
    };
    drop(p);
    assert!(s.prefix_match(PoolId(0), A, &hashes) > 0);
    assert_eq!(s.sessions(PoolId(0)), 1);
    publish(&s, &mut host, 2, with_members(&[(B, Health::Healthy)]));
    assert_eq!(s.prefix_match(PoolId(0), A, &hashes), 0);
    assert_eq!(s.sessions(PoolId(0)), 0);
    // A comes back: a fresh start, not its old entries.
    publish(
        &s,
        &mut host,
        3,
        with_members(&[(A, Health::Healthy), (B, Health::Healthy)]),
    );
    assert_eq!(s.prefix_match(PoolId(0), A, &hashes), 0);
}

#[test]
fn a_subset_hint_and_a_served_report_name_current_members_only() {
    let s = following(json!({}));
    let mut host = host_for(b"", None);
    publish(
        &s,
        &mut host,
        1,
        with_members(&[(A, Health::Healthy), (B, Health::Healthy)]),
    );
    let Some(plan) = s.pool_plan("llama") else {
        unreachable!()
    };
    let only_b = [B.to_owned()];
    for seed in 0..16 {
        let p = s.pick_within(&plan, &request(None), Some(&only_b), Millis(NOW), seed);
        assert_eq!(p.map(|p| p.endpoint).ok().as_deref(), Some(B));
    }
    let gone = [C.to_owned()];
    let p = s.pick_within(&plan, &request(None), Some(&gone), Millis(NOW), 1);
    assert_eq!(p.err(), Some(Rejection::NoEndpoints));
    assert!(s.member_slot(&plan, B).is_some());
    assert!(s.member_slot(&plan, C).is_none());
    assert!(!s.record_served(&plan, C, &[], Some("s")));
    publish(&s, &mut host, 2, with_members(&[(A, Health::Healthy)]));
    assert!(s.member_slot(&plan, B).is_none());
}

#[test]
fn the_member_gauge_and_a_missing_cluster_are_reported() {
    let mut s = following(json!({}));
    let mut host = host_for(&chat("hello"), None);
    publish(
        &s,
        &mut host,
        1,
        with_members(&[(A, Health::Healthy), (B, Health::Healthy)]),
    );
    let _ = pick_one(&mut s, &mut host);
    assert_eq!(
        host.gauges.get("infergate.picker.pool_members.pool.p"),
        Some(&2)
    );
    assert!(host.error_logs.is_empty(), "{:?}", host.error_logs);
    // A snapshot carrying other clusters but not this pool's: the scraper does not follow it.
    let mut other = scheduler_core::snapshot::decode(&with_members(&[(C, Health::Healthy)]))
        .unwrap_or_default();
    if let Some(c) = other.clusters.first_mut() {
        c.cluster = "other".into();
    }
    let s2 = following(json!({}));
    let mut s2 = s2;
    let mut host2 = host_for(&chat("hello"), None);
    publish(&s2, &mut host2, 1, encode(&other));
    let _ = pick_one(&mut s2, &mut host2);
    assert!(
        host2
            .error_logs
            .iter()
            .any(|l| l.contains("follows Envoy cluster `p`") && l.contains("`clusters`")),
        "{:?}",
        host2.error_logs
    );
}

#[test]
fn a_following_pool_accepts_roles_by_ip_and_refuses_a_bad_key() {
    let ok = PickerShared::from_json(json!({"pool": "p", "baseModel": "llama",
        "endpointRoles": {"10.0.0.1": "prefill", "10.0.0.2:8000": "decode"}}));
    assert!(ok.is_ok());
    let bad = PickerShared::from_json(json!({"pool": "p", "baseModel": "llama",
        "endpointRoles": {"host-a": "prefill"}}));
    let e = bad.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("pools[0].endpointRoles"), "{e}");
    let roles = disagg::EndpointRoles(
        [(
            "10.0.0.1".to_owned(),
            disagg::RoleSpec::Name("prefill".into()),
        )]
        .into_iter()
        .chain([(A.to_owned(), disagg::RoleSpec::Name("decode".into()))])
        .collect(),
    );
    use scheduler_core::scheduling::Role;
    assert_eq!(roles.role_of(A), Role::Decode);
    assert_eq!(roles.role_of("10.0.0.1:9000"), Role::Prefill);
    assert_eq!(roles.role_of(B), Role::Both);
}

/// One step of a membership history.
#[derive(Clone, Debug)]
enum Step {
    /// Publish these members (address index, health index).
    Members(Vec<(usize, u8)>),
    /// Pick, and hold the lease (gauges raised).
    Pick(u64),
    /// End the `n`-th held lease (modulo the count).
    End(usize),
    /// Drop the `n`-th held lease without an end.
    Drop(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        prop::collection::vec((0usize..6, 0u8..3), 0..6).prop_map(Step::Members),
        any::<u64>().prop_map(Step::Pick),
        any::<u64>().prop_map(Step::Pick),
        any::<usize>().prop_map(Step::End),
        any::<usize>().prop_map(Step::Drop),
    ]
}

const ADDRESSES: [&str; 6] = [
    "10.0.1.1:8000",
    "10.0.1.2:8000",
    "10.0.1.3:8000",
    "10.0.1.4:8000",
    "[fd00::1]:8000",
    "10.0.1.6:8001",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever joins, leaves or changes health, with leases held across it: every pick is
    /// a current member that is not unhealthy, so are its fallbacks, and once every lease is
    /// given back (ended or dropped) the in-flight counts and gauges are 0, never below.
    #[test]
    fn picks_follow_the_membership_and_in_flight_returns_to_zero(
        steps in prop::collection::vec(step(), 1..40)
    ) {
        let s = following(json!({"fallbacks": 2}));
        let mut host = host_for(b"", None);
        let mut current: Vec<(String, Health)> = Vec::new();
        let mut held: Vec<Picked> = Vec::new();
        let mut version = 0;
        for step in steps {
            match step {
                Step::Members(list) => {
                    let mut members: Vec<(&str, Health)> = Vec::new();
                    for (i, h) in list {
                        let health = [Health::Healthy, Health::Degraded, Health::Unhealthy][h as usize];
                        if !members.iter().any(|(a, _)| *a == ADDRESSES[i]) {
                            members.push((ADDRESSES[i], health));
                        }
                    }
                    version += 1;
                    publish(&s, &mut host, version, with_members(&members));
                    current = members.iter().map(|(a, h)| ((*a).to_owned(), *h)).collect();
                }
                Step::Pick(seed) => {
                    let ok = |a: &str| current.iter().any(|(m, h)| m == a && h.is_candidate());
                    match pick_at(&s, seed) {
                        Ok(mut p) => {
                            prop_assert!(ok(&p.endpoint), "picked {} of {:?}", p.endpoint, current);
                            for f in &p.fallbacks {
                                prop_assert!(ok(f), "fallback {} of {:?}", f, current);
                            }
                            p.lease.raise_gauges(&mut host);
                            held.push(p);
                        }
                        Err(_) => prop_assert!(!current.iter().any(|(_, h)| h.is_candidate())),
                    }
                }
                Step::End(n) if !held.is_empty() => {
                    let p = held.remove(n % held.len());
                    p.lease.end(&mut host);
                }
                Step::Drop(n) if !held.is_empty() => {
                    drop(held.remove(n % held.len()));
                }
                _ => {}
            }
        }
        let total = s.inflight_total(PoolId(0));
        prop_assert_eq!(total, held.len() as u64);
        for p in held.drain(..) {
            p.lease.end(&mut host);
        }
        prop_assert_eq!(s.inflight_total(PoolId(0)), 0);
        prop_assert_eq!(host.gauge_underflows, 0);
        // Leases dropped without an end owe their decrement until the pool's next request
        // end pays it: the gauges read exactly what is owed.
        let owed = s.owed_gauge_decrements(PoolId(0));
        prop_assert_eq!(host.gauges.get(INFLIGHT_POOL).copied().unwrap_or(0), owed);
        let endpoints: u64 = host
            .gauges
            .iter()
            .filter(|(name, _)| name.starts_with("infergate.picker.inflight_requests.pool.p.endpoint"))
            .map(|(_, v)| *v)
            .sum();
        prop_assert_eq!(endpoints, owed);
    }
}

#[test]
fn joining_members_take_their_roles_and_a_removed_prefiller_is_never_named() {
    let epp = json!({
        "plugins": [
            {"type": "approx-prefix-cache-producer"},
            {"type": "prefix-based-pd-decider", "parameters": {"nonCachedTokens": 256}},
            {"type": "disagg-profile-handler",
             "parameters": {"deciders": {"prefill": "prefix-based-pd-decider"}}},
            {"type": "prefix-cache-scorer"}, {"type": "inflight-load-scorer"}],
        "schedulingProfiles": [
            {"name": "decode", "plugins": [{"pluginRef": "prefix-cache-scorer", "weight": 3},
                                           {"pluginRef": "inflight-load-scorer"}]},
            {"name": "prefill", "plugins": [{"pluginRef": "inflight-load-scorer"}]}]
    });
    // A and D prefill (D by its IP), B decodes; the members are not known at load.
    let mut s = following(json!({
        "endpointRoles": {A: "prefill", "10.0.0.4": "prefill", B: "decode"},
        "eppConfig": epp
    }));
    let prompt =
        |i: usize| chat(&format!("{i} the quick brown fox jumps over the lazy dog. ").repeat(100));
    let members = with_members(&[(A, Health::Healthy), (B, Health::Healthy)]);
    let mut host = host_for(&prompt(0), Some(members));
    let (status, req) = pick_one(&mut s, &mut host);
    assert_eq!(status, FilterStatus::Continue);
    assert_eq!(req.endpoint(), Some(B));
    assert_eq!(host.header(disagg::PREFILLER_HEADER), Some(A));
    drop(req);
    // A leaves, D joins: D prefills, A is never named again.
    let members = with_members(&[(B, Health::Healthy), (D, Health::Healthy)]);
    for i in 1..6 {
        let mut host = host_for(&prompt(i), Some(members.clone()));
        host.snapshot = Some((SnapshotVersion(2), members.clone()));
        let (status, req) = pick_one(&mut s, &mut host);
        assert_eq!(status, FilterStatus::Continue);
        assert_eq!(req.endpoint(), Some(B));
        assert_eq!(host.header(disagg::PREFILLER_HEADER), Some(D));
        let list = host.header(DESTINATION_ENDPOINT).unwrap_or_default();
        assert!(!list.contains(A) && !list.contains(D), "{list}");
    }
}
