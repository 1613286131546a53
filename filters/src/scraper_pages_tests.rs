//! Scraper tests of `published` clusters: members learned from peer gateways' export
//! pages, scraped like any member, dropped when a gateway's page fails too often.

use scheduler_core::snapshot::{decode, Health, Member};
use serde_json::json;

use super::pages::acceptable;
use super::*;
use crate::fake::FakeHost;

const GW1: &str = "10.9.0.1:8080";
const GW2: &str = "10.9.0.2:8080";
const PATH: &str = "/infergate/pools/p/metrics";

fn scraper() -> Scraper {
    let config = json!({"published": [{
        "cluster": "p-peers", "gateways": [GW1, GW2], "path": PATH}]});
    match Scraper::from_json(config) {
        Ok(s) => s,
        Err(e) => unreachable!("test config must parse: {e}"),
    }
}

fn page(members: &[&str]) -> Vec<u8> {
    let mut text = String::from("llm_d_epp_average_queue_size 1\n");
    scheduler_core::snapshot::aggregate::members_to_prometheus(&mut text, members.iter().copied());
    text.into_bytes()
}

/// The outstanding callouts to `authority` at `path`, oldest first.
fn sent_to(host: &FakeHost, authority: &str, path: &str) -> Vec<CalloutToken> {
    let has =
        |r: &CalloutRequest, k: &str, v: &str| r.headers.iter().any(|(a, b)| a == k && b == v);
    host.callouts
        .iter()
        .filter(|(_, r)| has(r, ":authority", authority) && has(r, ":path", path))
        .map(|(t, _)| *t)
        .collect()
}

fn members_of(host: &FakeHost) -> Option<Vec<String>> {
    let snapshot = host.snapshot.as_ref().and_then(|(_, b)| decode(b).ok())?;
    let cluster = snapshot.cluster("p-peers")?;
    Some(cluster.members.iter().map(|m| m.address.clone()).collect())
}

fn ok(body: Vec<u8>) -> CalloutOutcome {
    CalloutOutcome::Response { status: 200, body }
}

#[test]
fn members_come_from_every_gateways_page_and_are_scraped() {
    let mut s = scraper();
    let mut host = FakeHost::new().now(1_000);
    s.on_tick(&mut host);
    let (t1, t2) = (sent_to(&host, GW1, PATH)[0], sent_to(&host, GW2, PATH)[0]);
    s.on_callout_done(&mut host, t1, ok(page(&["10.1.0.1:8000", "10.1.0.2:8000"])));
    // Not known until every gateway answered (or failed) once.
    assert_eq!(members_of(&host), None);
    s.on_callout_done(&mut host, t2, ok(page(&["10.2.0.1:8000", "10.1.0.2:8000"])));
    assert_eq!(
        members_of(&host).unwrap(),
        ["10.1.0.1:8000", "10.1.0.2:8000", "10.2.0.1:8000"]
    );
    assert_eq!(
        s.clusters()[0].members[0],
        Member {
            address: "10.1.0.1:8000".into(),
            health: Health::Healthy
        }
    );
    // The members are scraped at their own /metrics at the next tick; the pages again
    // after `membershipIntervalMs`.
    host.now = Millis(1_050);
    s.on_tick(&mut host);
    assert_eq!(sent_to(&host, "10.2.0.1:8000", "/metrics").len(), 1);
    assert_eq!(sent_to(&host, GW1, PATH).len(), 1);
    host.now = Millis(1_100);
    s.on_tick(&mut host);
    assert_eq!(sent_to(&host, GW1, PATH).len(), 2);
    assert_eq!(
        host.counters
            .get("infergate.scraper.membership_updates.result.ok"),
        Some(&2)
    );
}

#[test]
fn a_gateway_that_fails_keeps_its_members_then_loses_them() {
    let mut s = scraper();
    let mut host = FakeHost::new().now(1_000);
    s.on_tick(&mut host);
    let (t1, t2) = (sent_to(&host, GW1, PATH)[0], sent_to(&host, GW2, PATH)[0]);
    s.on_callout_done(&mut host, t1, ok(page(&["10.1.0.1:8000"])));
    s.on_callout_done(&mut host, t2, ok(page(&["10.2.0.1:8000"])));
    for round in 1..=3u64 {
        host.now = Millis(1_000 + 100 * round);
        s.on_tick(&mut host);
        let t1 = *sent_to(&host, GW1, PATH).last().unwrap();
        let t2 = *sent_to(&host, GW2, PATH).last().unwrap();
        s.on_callout_done(&mut host, t1, ok(page(&["10.1.0.1:8000"])));
        s.on_callout_done(&mut host, t2, CalloutOutcome::Failed);
        let expected: &[&str] = if round < 3 {
            &["10.1.0.1:8000", "10.2.0.1:8000"]
        } else {
            &["10.1.0.1:8000"]
        };
        assert_eq!(members_of(&host).unwrap(), expected, "round {round}");
    }
    assert_eq!(
        host.gauges
            .get("infergate.scraper.cluster_members.cluster.p-peers"),
        Some(&1)
    );
    // A non-2xx page and an oversized list count as failures too; a good page brings the
    // members back at once.
    host.now = Millis(1_400);
    s.on_tick(&mut host);
    let t2 = *sent_to(&host, GW2, PATH).last().unwrap();
    s.on_callout_done(&mut host, t2, ok(page(&["10.2.0.1:8000"])));
    assert_eq!(
        members_of(&host).unwrap(),
        ["10.1.0.1:8000", "10.2.0.1:8000"]
    );
    host.now = Millis(1_500);
    s.on_tick(&mut host);
    let t1 = *sent_to(&host, GW1, PATH).last().unwrap();
    let status = CalloutOutcome::Response {
        status: 404,
        body: Vec::new(),
    };
    s.on_callout_done(&mut host, t1, status);
    assert_eq!(host.error_logs.len(), 2, "{:?}", host.error_logs);
}

#[test]
fn a_gateway_that_never_answers_leaves_the_cluster_known_and_empty() {
    let mut s = scraper();
    let mut host = FakeHost::new().now(1_000);
    for t in 0..=3u64 {
        // Lost after twice the timeout (500 ms); failed dispatches count too.
        host.now = Millis(1_000 + 600 * t);
        s.on_tick(&mut host);
    }
    assert_eq!(members_of(&host).unwrap(), Vec::<String>::new());
}

#[test]
fn bad_published_config_is_refused() {
    for (config, expected) in [
        (
            json!({"published": [{"cluster": "", "gateways": [GW1], "path": "/x"}]}),
            "empty cluster name",
        ),
        (
            json!({"clusters": ["c"], "published": [{"cluster": "c", "gateways": [GW1], "path": "/x"}]}),
            "also in `clusters`",
        ),
        (
            json!({"published": [{"cluster": "c", "gateways": ["gw:1"], "path": "/x"}]}),
            "not ip:port",
        ),
        (
            json!({"published": [{"cluster": "c", "gateways": [GW1], "path": "x"}]}),
            "does not start with `/`",
        ),
        (
            json!({"published": [{"cluster": "c", "gateways": [GW1], "path": "/x", "maxConsecutiveFailures": 0}]}),
            "must be positive",
        ),
        (
            json!({"published": [{"cluster": "c", "gateways": [GW1], "path": "/x"}, {"cluster": "c", "gateways": [GW1], "path": "/y"}]}),
            "listed twice",
        ),
        (
            json!({"published": [{"cluster": "c", "gateways": [], "path": "/x"}]}),
            "at least one gateway",
        ),
        (
            json!({"published": [{"cluster": "c", "gateways": [GW1, GW2, GW1], "path": "/x"}]}),
            "listed twice",
        ),
    ] {
        let error = Scraper::from_json(config).err().unwrap_or_default();
        assert!(error.contains(expected), "{error} (wanted {expected})");
    }
}

#[test]
fn only_addresses_a_replica_can_have_are_members() {
    let mut s = scraper();
    let mut host = FakeHost::new().now(1_000);
    s.on_tick(&mut host);
    let (t1, t2) = (sent_to(&host, GW1, PATH)[0], sent_to(&host, GW2, PATH)[0]);
    let hostile = [
        "10.1.0.1:8000",
        "169.254.169.254:80",
        "127.0.0.1:15000",
        "0.0.0.0:8000",
        "10.1.0.2:0",
        "224.0.0.1:8000",
        "[fe80::1]:8000",
    ];
    s.on_callout_done(&mut host, t1, ok(page(&hostile)));
    // A page with the load but no listing: a failure, not an empty membership.
    let load_only = b"llm_d_epp_average_queue_size 1\n".to_vec();
    s.on_callout_done(&mut host, t2, ok(load_only));
    assert_eq!(members_of(&host).unwrap(), ["10.1.0.1:8000"]);
    assert!(
        host.error_logs
            .iter()
            .any(|l| l.contains("lists no members")),
        "{:?}",
        host.error_logs
    );
    // Loopback members only from a gateway on loopback (clusters simulated on one host).
    assert!(acceptable("127.0.1.2:9000", "127.0.1.2:8080"));
    assert!(!acceptable("127.0.1.2:9000", "10.9.0.1:8080"));
}
