//! Tests of the admin-answer parser and the health mapping: a real Envoy 1.40 answer, the
//! flags one by one, the bounds, and properties (never a panic; every member an `ip:port`
//! of a listed cluster, each once).

use proptest::prelude::*;
use serde_json::json;

use super::*;

/// Envoy 1.40.0's real answer (see `testdata/README.md`).
const REAL: &str = include_str!("../../testdata/membership/admin-clusters-envoy-1.40.0.json");

fn member(address: &str, health: Health) -> Member {
    Member {
        address: address.to_owned(),
        health,
    }
}

#[test]
fn a_real_envoy_answer_gives_each_clusters_members_and_health() {
    let clusters = parse_admin_clusters(REAL.as_bytes());
    assert_eq!(
        clusters,
        Ok(vec![
            ClusterMembers {
                cluster: "pool".to_owned(),
                members: vec![
                    member("127.0.0.1:18001", Health::Healthy),
                    member("127.0.0.1:18002", Health::Unhealthy),
                ],
            },
            ClusterMembers {
                cluster: "pool-eds".to_owned(),
                members: vec![
                    member("127.0.0.1:18001", Health::Healthy),
                    member("127.0.0.1:18003", Health::Unhealthy),
                    member("127.0.0.1:18004", Health::Degraded),
                ],
            },
        ])
    );
    let only = parse_admin_clusters_where(REAL.as_bytes(), |c| c == "pool-eds");
    assert_eq!(only.map(|c| c.len()), Ok(1));
}

#[test]
fn each_flag_maps_to_its_health() {
    let of = |flags: serde_json::Value| {
        let flags: HostHealth = serde_json::from_value(flags).unwrap_or_default();
        health_of(&flags)
    };
    assert_eq!(of(json!({})), Some(Health::Healthy));
    assert_eq!(
        of(json!({"eds_health_status": "UNKNOWN"})),
        Some(Health::Healthy)
    );
    for unhealthy in [
        json!({"failed_active_health_check": true}),
        json!({"failed_outlier_check": true}),
        json!({"pending_active_hc": true}),
        json!({"excluded_via_immediate_hc_fail": true}),
        json!({"active_hc_timeout": true}),
        json!({"eds_health_status": "UNHEALTHY"}),
        json!({"eds_health_status": "DRAINING"}),
        json!({"eds_health_status": "TIMEOUT"}),
        json!({"eds_health_status": "DEGRADED", "failed_outlier_check": true}),
    ] {
        assert_eq!(
            of(unhealthy.clone()),
            Some(Health::Unhealthy),
            "{unhealthy}"
        );
    }
    assert_eq!(
        of(json!({"eds_health_status": "DEGRADED"})),
        Some(Health::Degraded)
    );
    assert_eq!(
        of(json!({"failed_active_degraded_check": true})),
        Some(Health::Degraded)
    );
    assert_eq!(of(json!({"pending_dynamic_removal": true})), None);
}

#[test]
fn odd_hosts_are_skipped_and_duplicates_kept_once() {
    let body = json!({"cluster_statuses": [
        {"name": "p", "host_statuses": [
            {"address": {"pipe": {"path": "/tmp/s"}}},
            {"address": {"socket_address": {"address": "host.example", "port_value": 80}}},
            {"address": {"socket_address": {"address": "10.0.0.1", "port_value": 70000}}},
            {"address": {"socket_address": {"address": "fd00::1", "port_value": 8000}},
             "health_status": {"eds_health_status": "HEALTHY"}, "future_field": [1, 2]},
            {"address": {"socket_address": {"address": "fd00::1", "port_value": 8000}},
             "health_status": {"failed_outlier_check": true}},
            {"address": {"socket_address": {"address": "10.0.0.2", "port_value": 8000}},
             "health_status": {"pending_dynamic_removal": true}}
        ]},
        {"name": "p", "host_statuses": []},
        {"name": "no-hosts"}
    ], "unknown": {}})
    .to_string();
    assert_eq!(
        parse_admin_clusters(body.as_bytes()),
        Ok(vec![
            ClusterMembers {
                cluster: "p".to_owned(),
                members: vec![member("[fd00::1]:8000", Health::Healthy)],
            },
            ClusterMembers {
                cluster: "no-hosts".to_owned(),
                members: Vec::new(),
            },
        ])
    );
}

#[test]
fn bounds_and_bad_shapes_are_errors() {
    assert!(matches!(
        parse_admin_clusters(b"not json"),
        Err(MembershipError::Json(_))
    ));
    assert!(matches!(
        parse_admin_clusters(br#"{"cluster_statuses": {"name": "p"}}"#),
        Err(MembershipError::Json(_))
    ));
    assert_eq!(parse_admin_clusters(b"{}"), Ok(Vec::new()));
    let big = vec![b' '; MAX_ADMIN_PAGE_BYTES + 1];
    assert_eq!(
        parse_admin_clusters(&big),
        Err(MembershipError::TooLarge(MAX_ADMIN_PAGE_BYTES + 1))
    );
    let many = format!(
        "{{\"cluster_statuses\": [{}{{}}]}}",
        "{},".repeat(MAX_CLUSTERS)
    );
    assert_eq!(
        parse_admin_clusters(many.as_bytes()),
        Err(MembershipError::TooManyClusters(MAX_CLUSTERS + 1))
    );
    let hosts = format!(
        "{{\"cluster_statuses\": [{{\"name\": \"p\", \"host_statuses\": [{}{{}}]}}]}}",
        "{},".repeat(MAX_HOSTS_PER_CLUSTER)
    );
    let e = parse_admin_clusters(hosts.as_bytes());
    assert_eq!(
        e,
        Err(MembershipError::TooManyHosts {
            cluster: "p".to_owned(),
            hosts: MAX_HOSTS_PER_CLUSTER + 1
        })
    );
    assert!(e
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
        .contains("`p`"));
}

fn arb_host() -> impl Strategy<Value = serde_json::Value> {
    let ip = prop_oneof![
        Just("10.0.0.1".to_owned()),
        Just("fd00::2".to_owned()),
        "[a-z0-9.:]{0,12}",
    ];
    let eds = prop_oneof![
        Just("HEALTHY"),
        Just("UNHEALTHY"),
        Just("DRAINING"),
        Just("TIMEOUT"),
        Just("DEGRADED"),
        Just("UNKNOWN"),
        Just("bogus"),
    ];
    (ip, any::<u32>(), eds, any::<[bool; 4]>()).prop_map(|(ip, port, eds, flags)| {
        json!({
            "address": {"socket_address": {"address": ip, "port_value": port % 70_000}},
            "health_status": {
                "eds_health_status": eds,
                "failed_active_health_check": flags[0],
                "failed_outlier_check": flags[1],
                "failed_active_degraded_check": flags[2],
                "pending_dynamic_removal": flags[3]
            }
        })
    })
}

proptest! {
    /// Any answer of the right shape parses; every member is an `ip:port` listed once per
    /// cluster, and no unhealthy flag ever yields a candidate.
    #[test]
    fn well_shaped_answers_give_valid_members(
        clusters in prop::collection::vec(
            ("[a-z]{1,4}", prop::collection::vec(arb_host(), 0..6)), 0..5)
    ) {
        let body = json!({"cluster_statuses": clusters
            .iter()
            .map(|(name, hosts)| json!({"name": name, "host_statuses": hosts}))
            .collect::<Vec<_>>()})
        .to_string();
        let parsed = parse_admin_clusters(body.as_bytes());
        prop_assert!(parsed.is_ok(), "{:?}", parsed);
        let parsed = parsed.unwrap_or_default();
        let mut names: Vec<&str> = parsed.iter().map(|c| c.cluster.as_str()).collect();
        let n = names.len();
        names.dedup();
        names.sort_unstable();
        names.dedup();
        prop_assert_eq!(names.len(), n, "a cluster is listed once");
        for cluster in &parsed {
            let mut seen = std::collections::HashSet::new();
            for m in &cluster.members {
                prop_assert!(m.address.parse::<std::net::SocketAddr>().is_ok());
                prop_assert!(seen.insert(m.address.clone()));
            }
        }
    }

    /// Arbitrary bytes never panic.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_admin_clusters(&bytes);
    }
}
