//! Scraper tests of cluster membership: mode `host` (the host's answer each tick), mode
//! `admin` (the admin callout), the targets that follow the members, and the snapshot's
//! `clusters`.

use scheduler_core::snapshot::{decode, Health, Member};
use serde_json::json;

use super::*;
use crate::fake::FakeHost;

const A: &str = "10.0.0.1:8000";
const B: &str = "10.0.0.2:8000";
const C: &str = "10.0.0.3:8000";

const PAGE: &[u8] = b"vllm:num_requests_waiting{model_name=\"m\"} 3\n";

fn scraper(config: serde_json::Value) -> Scraper {
    match Scraper::from_json(config) {
        Ok(s) => s,
        Err(e) => unreachable!("test config must parse: {e}"),
    }
}

fn member(address: &str, health: Health) -> Member {
    Member {
        address: address.to_owned(),
        health,
    }
}

fn published(host: &FakeHost) -> Snapshot {
    host.snapshot
        .as_ref()
        .and_then(|(_, b)| decode(b).ok())
        .unwrap_or_default()
}

fn addresses(samples: &[EndpointSample]) -> Vec<&str> {
    samples.iter().map(|s| s.address.as_str()).collect()
}

/// The authorities of the metrics callouts sent since callout `from`.
fn scraped_since(host: &FakeHost, from: usize) -> Vec<String> {
    host.callouts
        .iter()
        .skip(from)
        .filter(|(_, r)| r.cluster == "infergate_scrape")
        .filter_map(|(_, r)| {
            r.headers
                .iter()
                .find(|(k, _)| k == ":authority")
                .map(|(_, v)| v.clone())
        })
        .collect()
}

fn answer_all(s: &mut Scraper, host: &mut FakeHost, from: usize) {
    let tokens: Vec<CalloutToken> = host
        .callouts
        .iter()
        .skip(from)
        .filter(|(_, r)| r.cluster == "infergate_scrape")
        .map(|(t, _)| *t)
        .collect();
    for t in tokens {
        s.on_callout_done(
            host,
            t,
            CalloutOutcome::Response {
                status: 200,
                body: PAGE.to_vec(),
            },
        );
    }
}

#[test]
fn host_mode_scrapes_static_and_members_and_follows_changes_at_the_next_tick() {
    let mut s = scraper(json!({"endpoints": [A], "clusters": ["pool"]}));
    let mut host = FakeHost::new().now(1_000);
    host.cluster_members.insert(
        "pool".into(),
        vec![member(A, Health::Healthy), member(B, Health::Degraded)],
    );
    s.on_tick(&mut host);
    // A is static and a member: scraped once.
    assert_eq!(scraped_since(&host, 0), [A, B]);
    answer_all(&mut s, &mut host, 0);
    let snap = published(&host);
    assert_eq!(addresses(&snap.endpoints), [A, B]);
    assert_eq!(
        snap.clusters,
        [ClusterMembers {
            cluster: "pool".into(),
            members: vec![member(A, Health::Healthy), member(B, Health::Degraded)],
        }]
    );
    assert_eq!(
        host.gauges
            .get("infergate.scraper.cluster_members.cluster.pool"),
        Some(&2)
    );

    // C appears, B goes: C is scraped at the very next tick, B is out of the snapshot.
    host.cluster_members.insert(
        "pool".into(),
        vec![member(A, Health::Healthy), member(C, Health::Unhealthy)],
    );
    host.now = Millis(1_050);
    let before = host.callouts.len();
    s.on_tick(&mut host);
    assert_eq!(scraped_since(&host, before), [A, C]);
    let snap = published(&host);
    assert_eq!(addresses(&snap.endpoints), [A, C]);
    assert_eq!(
        snap.cluster("pool").map(|c| c.members.clone()),
        Some(vec![
            member(A, Health::Healthy),
            member(C, Health::Unhealthy)
        ])
    );
    // A kept its sample (scraped at 1 000); C starts unknown.
    assert!(snap.endpoints[0].metrics.is_some());
    assert!(snap.endpoints[1].metrics.is_none());

    // A host that cannot tell any more keeps the last membership.
    host.cluster_members.clear();
    host.now = Millis(1_100);
    s.on_tick(&mut host);
    assert_eq!(addresses(s.samples()), [A, C]);
    assert_eq!(s.clusters().len(), 1);
}

#[test]
fn a_removed_members_late_answer_is_ignored() {
    let mut s = scraper(json!({"clusters": ["pool"]}));
    let mut host = FakeHost::new().now(1_000);
    host.cluster_members.insert(
        "pool".into(),
        vec![member(A, Health::Healthy), member(B, Health::Healthy)],
    );
    s.on_tick(&mut host);
    let b_token = host.callouts[1].0;
    host.cluster_members
        .insert("pool".into(), vec![member(A, Health::Healthy)]);
    host.now = Millis(1_050);
    s.on_tick(&mut host);
    assert_eq!(s.outstanding(), 1);
    s.on_callout_done(
        &mut host,
        b_token,
        CalloutOutcome::Response {
            status: 200,
            body: PAGE.to_vec(),
        },
    );
    assert_eq!(addresses(s.samples()), [A]);
    assert!(s.samples()[0].metrics.is_none());
    assert_eq!(
        host.counter("infergate.scraper.scrapes.endpoint.10_0_0_2_8000.result.ok"),
        0
    );
}

#[test]
fn an_unknown_cluster_is_not_published_and_endpoints_may_be_absent() {
    let mut s = scraper(json!({"clusters": ["pool", "other"]}));
    let mut host = FakeHost::new().now(1_000);
    host.cluster_members
        .insert("other".into(), vec![member(C, Health::Healthy)]);
    s.on_tick(&mut host);
    let snap = published(&host);
    assert_eq!(snap.clusters.len(), 1);
    assert_eq!(snap.clusters[0].cluster, "other");
    // "pool" becomes known later: the configuration's order is kept.
    host.cluster_members
        .insert("pool".into(), vec![member(A, Health::Healthy)]);
    s.on_tick(&mut host);
    let names: Vec<&str> = s.clusters().iter().map(|c| c.cluster.as_str()).collect();
    assert_eq!(names, ["pool", "other"]);
    assert_eq!(addresses(s.samples()), [A, C]);
}

fn admin_body(members: &[(&str, u16, &str)]) -> Vec<u8> {
    let hosts: Vec<serde_json::Value> = members
        .iter()
        .map(|(ip, port, eds)| {
            json!({
                "address": {"socket_address": {"address": ip, "port_value": port}},
                "stats": [{"name": "cx_active", "value": "1"}],
                "health_status": {"eds_health_status": eds},
                "weight": 1
            })
        })
        .collect();
    json!({"cluster_statuses": [
        {"name": "infergate_scrape", "host_statuses": []},
        {"name": "pool", "added_via_api": false, "host_statuses": hosts}
    ]})
    .to_string()
    .into_bytes()
}

fn admin_token(host: &FakeHost) -> Option<CalloutToken> {
    host.callouts
        .iter()
        .rev()
        .find(|(_, r)| r.cluster == "infergate_admin")
        .map(|(t, _)| *t)
}

fn admin_calls(host: &FakeHost) -> usize {
    host.callouts
        .iter()
        .filter(|(_, r)| r.cluster == "infergate_admin")
        .count()
}

#[test]
fn admin_mode_polls_the_admin_cluster_and_publishes_a_change_at_once() {
    let mut s = scraper(json!({"clusters": ["pool"], "membership": "admin"}));
    let mut host = FakeHost::new().now(1_000);
    s.on_tick(&mut host);
    let (_, request) = host
        .callouts
        .last()
        .cloned()
        .unwrap_or_else(|| unreachable!());
    assert_eq!(request.cluster, "infergate_admin");
    let header = |name: &str| {
        request
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(header(":path").as_deref(), Some("/clusters?format=json"));
    assert_eq!(header(":method").as_deref(), Some("GET"));
    // Not before the interval, and never two at once.
    host.now = Millis(1_050);
    s.on_tick(&mut host);
    assert_eq!(admin_calls(&host), 1);

    let publishes = host.counter("infergate.scraper.publishes");
    let token = admin_token(&host).unwrap_or(CalloutToken(0));
    s.on_callout_done(
        &mut host,
        token,
        CalloutOutcome::Response {
            status: 200,
            body: admin_body(&[
                ("10.0.0.1", 8000, "HEALTHY"),
                ("10.0.0.2", 8000, "DRAINING"),
            ]),
        },
    );
    assert_eq!(
        host.counter("infergate.scraper.membership_updates.result.ok"),
        1
    );
    assert_eq!(host.counter("infergate.scraper.publishes"), publishes + 1);
    let snap = published(&host);
    assert_eq!(
        snap.cluster("pool").map(|c| c.members.clone()),
        Some(vec![
            member(A, Health::Healthy),
            member(B, Health::Unhealthy)
        ])
    );
    // Only followed clusters are kept.
    assert_eq!(snap.clusters.len(), 1);
    // The members are scraped at the next tick.
    let before = host.callouts.len();
    host.now = Millis(1_100);
    s.on_tick(&mut host);
    assert_eq!(scraped_since(&host, before), [A, B]);
    assert_eq!(admin_calls(&host), 2);
}

#[test]
fn a_bad_admin_answer_keeps_the_last_membership_and_is_counted_and_logged_once() {
    let mut s = scraper(json!({"clusters": ["pool"], "membership": "admin",
                               "membershipIntervalMs": 10}));
    let mut host = FakeHost::new().now(1_000);
    s.on_tick(&mut host);
    let token = admin_token(&host).unwrap_or(CalloutToken(0));
    let good = admin_body(&[("10.0.0.1", 8000, "HEALTHY")]);
    s.on_callout_done(
        &mut host,
        token,
        CalloutOutcome::Response {
            status: 200,
            body: good,
        },
    );
    let outcomes = [
        CalloutOutcome::Response {
            status: 503,
            body: Vec::new(),
        },
        CalloutOutcome::Response {
            status: 200,
            body: b"{\"cluster_statuses\": 7}".to_vec(),
        },
        CalloutOutcome::Response {
            status: 200,
            body: b"not json".to_vec(),
        },
        CalloutOutcome::Failed,
        CalloutOutcome::TooLarge {
            status: 200,
            body_bytes: usize::MAX,
        },
    ];
    let n = outcomes.len() as u64;
    for (i, outcome) in outcomes.into_iter().enumerate() {
        host.now = Millis(1_100 + 100 * i as u64);
        s.on_tick(&mut host);
        let token = admin_token(&host).unwrap_or(CalloutToken(0));
        s.on_callout_done(&mut host, token, outcome);
        assert_eq!(addresses(s.samples()), [A], "after bad answer {i}");
    }
    assert_eq!(
        host.counter("infergate.scraper.membership_updates.result.failed"),
        n
    );
    let logged = host
        .error_logs
        .iter()
        .filter(|l| l.contains("membership from"))
        .count();
    assert_eq!(logged, 1, "{:?}", host.error_logs);
    // A good answer ends the streak; the next failure is logged again.
    host.now = Millis(2_000);
    s.on_tick(&mut host);
    let token = admin_token(&host).unwrap_or(CalloutToken(0));
    s.on_callout_done(
        &mut host,
        token,
        CalloutOutcome::Response {
            status: 200,
            body: admin_body(&[("10.0.0.1", 8000, "HEALTHY"), ("10.0.0.3", 8000, "HEALTHY")]),
        },
    );
    assert_eq!(addresses(s.samples()), [A, C]);
    host.now = Millis(2_100);
    s.on_tick(&mut host);
    let token = admin_token(&host).unwrap_or(CalloutToken(0));
    s.on_callout_done(&mut host, token, CalloutOutcome::Failed);
    let logged = host
        .error_logs
        .iter()
        .filter(|l| l.contains("membership from"))
        .count();
    assert_eq!(logged, 2);
}

#[test]
fn a_lost_admin_callout_expires_and_is_sent_again() {
    let mut s = scraper(json!({"clusters": ["pool"], "membership": "admin", "timeoutMs": 100}));
    let mut host = FakeHost::new().now(1_000);
    s.on_tick(&mut host);
    host.now = Millis(1_150);
    s.on_tick(&mut host);
    assert_eq!(admin_calls(&host), 1);
    host.now = Millis(1_201);
    s.on_tick(&mut host);
    assert_eq!(admin_calls(&host), 2);
    assert_eq!(
        host.counter("infergate.scraper.membership_updates.result.failed"),
        1
    );
}

#[test]
fn admin_mode_accepts_pages_above_the_metrics_limit() {
    let s = scraper(json!({"clusters": ["pool"], "membership": "admin",
                           "maxMetricsPageBytes": 1000}));
    assert_eq!(s.max_page_bytes(), crate::membership::MAX_ADMIN_PAGE_BYTES);
    let s = scraper(json!({"clusters": ["pool"], "maxMetricsPageBytes": 1000}));
    assert_eq!(s.max_page_bytes(), 1000);
    // Per callout: the admin answer may be large, a metrics page may not.
    let mut s = scraper(
        json!({"endpoints": [A], "clusters": ["pool"], "membership": "admin",
                               "maxMetricsPageBytes": 1000}),
    );
    let mut host = FakeHost::new().now(1_000);
    s.on_tick(&mut host);
    let admin = admin_token(&host).unwrap_or(CalloutToken(0));
    let scrape = host
        .callouts
        .iter()
        .find(|(_, r)| r.cluster == "infergate_scrape")
        .map(|(t, _)| *t)
        .unwrap_or(CalloutToken(0));
    let copied = std::cell::Cell::new(0);
    let read = || {
        copied.set(copied.get() + 1);
        Vec::new()
    };
    assert!(matches!(
        s.callout_outcome_for(admin, 200, 5_000, read),
        CalloutOutcome::Response { .. }
    ));
    assert!(matches!(
        s.callout_outcome_for(scrape, 200, 5_000, read),
        CalloutOutcome::TooLarge { .. }
    ));
    assert_eq!(copied.get(), 1);
}

#[test]
fn membership_config_is_checked_by_field() {
    let err = |v: serde_json::Value| Scraper::from_json(v).err().unwrap_or_default();
    assert!(err(json!({"clusters": ["a", "a"]})).contains("clusters[1]"));
    assert!(err(json!({"clusters": [""]})).contains("clusters[0]"));
    assert!(err(json!({"clusters": ["a"], "adminPath": "clusters"})).contains("adminPath"));
    assert!(err(json!({"clusters": ["a"], "adminCluster": ""})).contains("adminCluster"));
    assert!(
        err(json!({"clusters": ["a"], "membershipIntervalMs": 0})).contains("membershipIntervalMs")
    );
    assert!(err(json!({"clusters": ["a"], "membership": "eds"})).contains("`eds`"));
    let s = scraper(json!({"clusters": ["a"]}));
    assert!(s.endpoints().is_empty());
    assert_eq!(s.followed_clusters(), ["a"]);
}

#[test]
fn a_held_scraper_with_a_static_peer_publishes_once_the_members_are_known() {
    // A peer gateway (static) beside a cluster learned from admin: its round completes
    // before the admin answer, and a snapshot without the cluster's members would empty
    // the pool that follows it.
    let mut s = scraper(json!({"endpoints": [C], "clusters": ["pool"], "membership": "admin"}));
    s.hold_first_publish();
    let mut host = FakeHost::new().now(1_000);
    s.on_tick(&mut host);
    // The members are learned while the peer's scrape is out ...
    let token = admin_token(&host).unwrap_or(CalloutToken(0));
    s.on_callout_done(
        &mut host,
        token,
        CalloutOutcome::Response {
            status: 200,
            body: admin_body(&[("10.0.0.1", 8000, "HEALTHY")]),
        },
    );
    // ... and the peer's answer completes the round before the member's first scrape.
    answer_all(&mut s, &mut host, 0);
    assert_eq!(host.counter("infergate.scraper.publishes"), 0);
    host.now = Millis(1_050);
    let before = host.callouts.len();
    s.on_tick(&mut host);
    assert_eq!(scraped_since(&host, before), [C, A]);
    answer_all(&mut s, &mut host, before);
    assert_eq!(host.counter("infergate.scraper.publishes"), 1);
    let snap = published(&host);
    assert_eq!(snap.cluster("pool").map(|c| c.members.len()), Some(1));
}

#[test]
fn a_held_scraper_waits_for_the_members_of_its_clusters() {
    let mut s = scraper(json!({"endpoints": [C], "clusters": ["pool"], "membership": "admin"}));
    s.hold_first_publish();
    let mut host = FakeHost::new().now(1_000);
    s.on_tick(&mut host);
    // The peer answers before the admin: its round is complete, the members unknown.
    answer_all(&mut s, &mut host, 0);
    assert_eq!(host.counter("infergate.scraper.publishes"), 0);
}
