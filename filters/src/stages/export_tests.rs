//! The export stage over the fake host: the page of an exported pool, static or following
//! its cluster; the answers for other pools and methods; other paths untouched.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use scheduler_core::metrics::{extract, EndpointMetrics, MetricNames};
use scheduler_core::snapshot::aggregate::parse_members;
use scheduler_core::snapshot::{encode, ClusterMembers, EndpointSample, Member};
use scheduler_core::types::Millis;
use serde_json::json;

use super::*;
use crate::fake::FakeHost;
use crate::picker::PickerShared;
use crate::pipeline::{Pipeline, Run};

fn stage(config: serde_json::Value) -> Option<ExportStage> {
    ExportStage::new(PickerShared::from_json(config).unwrap().plans())
}

fn pipeline() -> Pipeline<FakeHost> {
    let stage = stage(json!({"pools": [
        {"pool": "static", "baseModel": "a", "endpoints": ["10.0.0.1:8000", "10.0.0.2:8000"],
         "export": true},
        {"pool": "pool-1-follows", "baseModel": "b", "cluster": "follows-cluster",
         "export": true, "exportName": "follows", "exportMembers": true},
        {"pool": "private", "baseModel": "c", "endpoints": ["10.0.0.9:8000"]},
    ]}))
    .unwrap();
    Pipeline::new(vec![Box::new(stage)])
}

fn sample(address: &str, waiting: u32, kv: f64) -> EndpointSample {
    EndpointSample {
        address: address.to_owned(),
        scraped_at: Millis(9_990),
        consecutive_failures: 0,
        metrics: Some(EndpointMetrics {
            waiting: Some(waiting),
            running: Some(1),
            kv_cache_usage: Some(kv),
            ..EndpointMetrics::default()
        }),
    }
}

fn snapshot() -> Vec<u8> {
    encode(&Snapshot {
        taken_at: Millis(10_000),
        endpoints: vec![
            sample("10.0.0.1:8000", 2, 0.5),
            sample("10.0.0.2:8000", 4, 0.7),
            sample("10.0.1.1:8000", 9, 0.9),
            sample("10.0.1.2:8000", 1, 0.1),
        ],
        clusters: vec![ClusterMembers {
            cluster: "follows-cluster".to_owned(),
            members: vec![
                Member {
                    address: "10.0.1.1:8000".to_owned(),
                    health: Health::Healthy,
                },
                Member {
                    address: "10.0.1.2:8000".to_owned(),
                    health: Health::Unhealthy,
                },
            ],
        }],
    })
}

/// A request for `path` with `method`; its answer, if the stage gave one.
fn get(method: &str, path: &str, snapshot: Option<Vec<u8>>) -> (FilterStatus, Option<Reply>) {
    let mut host = FakeHost::new()
        .request_header(":method", method)
        .request_header(":path", path)
        .now(10_000);
    if let Some(bytes) = snapshot {
        host = host.snapshot(1, bytes);
    }
    let status = Run::new().request_headers(&pipeline(), &mut host, true);
    (status, host.last_reply().cloned())
}

fn page(reply: &Reply) -> String {
    String::from_utf8(reply.body.clone()).unwrap()
}

#[test]
fn a_static_pool_publishes_the_means_of_its_members() {
    let (status, reply) = get("GET", "/infergate/pools/static/metrics", Some(snapshot()));
    assert_eq!(status, FilterStatus::Replied);
    let reply = reply.unwrap();
    assert_eq!(reply.status, 200);
    let text = page(&reply);
    assert!(text.contains("infergate_pool_members 2\n"), "{text}");
    assert!(text.contains("llm_d_epp_average_queue_size 3\n"), "{text}");
    // Without `exportMembers`, no member listing.
    assert_eq!(
        parse_members(text.as_bytes(), 16),
        Err(scheduler_core::snapshot::aggregate::MembersError::NotListed),
        "{text}"
    );
    let metrics = extract(&reply.body, &MetricNames::default());
    assert_eq!(metrics.waiting, Some(3), "{text}");
    assert!(
        (metrics.kv_cache_usage.unwrap() - 0.6).abs() < 1e-9,
        "{text}"
    );
}

#[test]
fn a_pool_that_follows_its_cluster_counts_its_healthy_members_only() {
    let (_, reply) = get(
        "GET",
        "/infergate/pools/follows/metrics?x=1",
        Some(snapshot()),
    );
    let text = page(&reply.unwrap());
    assert!(text.contains("infergate_pool_members 2\n"), "{text}");
    assert!(text.contains("infergate_pool_ready_members 1\n"), "{text}");
    assert!(text.contains("llm_d_epp_average_queue_size 9\n"), "{text}");
    // Endpoint Mode importers learn the candidates from the same page.
    assert_eq!(
        parse_members(text.as_bytes(), 16).unwrap(),
        vec!["10.0.1.1:8000"],
        "{text}"
    );
}

#[test]
fn without_a_snapshot_the_page_carries_no_load() {
    let (_, reply) = get("HEAD", "/infergate/pools/static/metrics", None);
    let reply = reply.unwrap();
    assert_eq!(reply.status, 200);
    assert!(extract(&reply.body, &MetricNames::default()).is_empty());
}

#[test]
fn other_pools_methods_and_paths_get_their_answers() {
    for path in [
        "/infergate/pools/private/metrics",
        "/infergate/pools/nope/metrics",
        // An exported pool is published under its export name only.
        "/infergate/pools/pool-1-follows/metrics",
    ] {
        let (_, reply) = get("GET", path, Some(snapshot()));
        let reply = reply.unwrap();
        assert_eq!(reply.status, 404, "{path}");
        assert!(page(&reply).contains("pool_not_exported"), "{path}");
    }
    let (_, reply) = get("POST", "/infergate/pools/static/metrics", Some(snapshot()));
    assert_eq!(reply.unwrap().status, 405);
    for path in [
        "/v1/chat/completions",
        "/infergate/pools/static",
        "/infergate/pools//metrics",
        "/infergate/pools/a/b/metrics",
    ] {
        assert_eq!(
            get("GET", path, Some(snapshot())),
            (FilterStatus::Continue, None),
            "{path}"
        );
    }
}

#[test]
fn member_listings_need_export_and_no_roles() {
    for (pool, problem) in [
        (
            json!({"pool": "p", "baseModel": "a", "endpoints": ["10.0.0.1:8000"],
                "exportMembers": true}),
            "needs `export`",
        ),
        (
            json!({"pool": "p", "baseModel": "a", "endpoints": ["10.0.0.1:8000"],
                "export": true, "exportMembers": true,
                "endpointRoles": {"10.0.0.1:8000": "prefill"}}),
            "Parent Mode",
        ),
    ] {
        let err = PickerShared::from_json(json!({"pools": [pool]}))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("exportMembers") && err.contains(problem),
            "{err}"
        );
    }
}

#[test]
fn no_exported_pool_means_no_stage() {
    assert!(
        stage(json!({"pool": "p", "baseModel": "a", "endpoints": ["10.0.0.1:8000"]})).is_none()
    );
}

#[test]
fn without_an_export_stage_the_pick_stage_answers_a_page_path() {
    let state = PickerShared::from_json(json!({
        "pool": "p", "baseModel": "a", "endpoints": ["10.0.0.1:8000"]
    }))
    .unwrap();
    let pick =
        crate::stages::PickStage::new(std::sync::Arc::new(crate::picker::SharedPicker::new(state)));
    let pipeline: Pipeline<FakeHost> = Pipeline::new(vec![Box::new(pick)]);
    let mut host = FakeHost::new()
        .request_header(":method", "GET")
        .request_header(":path", "/infergate/pools/p/metrics");
    let status = Run::new().request_headers(&pipeline, &mut host, true);
    assert_eq!(status, FilterStatus::Replied);
    assert_eq!(host.last_reply().map(|r| r.status), Some(404));
}
