//! The failure answers through the real Envoy: 400 / 413 / 404 from the body router, 503
//! `rejected-no-endpoints` from the picker (empty pool, every endpoint dead or stale
//! metrics under `FailClose`), and a `FailOpen` pool still served on stale metrics and
//! when every scrape fails. Every error body is OpenAI error JSON.

use super::{chat, post_chat, served_by, tag};
use crate::support::gw::{self, gateway_stats, openai_error, picker_pool, Plan};
use crate::support::{TestBackend, QUICK};
use bytes::Bytes;
use infergate_harness::launch::client::{request, HttpResponse};
use infergate_harness::launch::{FailureMode, Flavor, GatewaySettings, PoolSpec, Stack};
use std::time::Duration;

const HEALTHY: &str = "model-a";
const EMPTY: &str = "model-empty";
const DEAD: &str = "model-dead";
const DEAD_OPEN: &str = "model-dead-open";
const STALE_CLOSE: &str = "model-stale-close";
const STALE_OPEN: &str = "model-stale-open";

/// Staleness bound of this stack: short, so the stale case is quick, yet well above the
/// 50 ms scrape period so a healthy pool never looks stale on a busy machine.
const STALE_AFTER_MS: u64 = 600;

const DROPPED_REASON: &str = "x-llm-d-request-dropped-reason";

pub(super) async fn error_answers_are_openai_json(flavor: Flavor) {
    let backends = TestBackend::many(4, QUICK).await;
    // b1's metrics fail from the start: its pool has no live endpoint.
    backends[1].break_metrics(true);
    let dead = PoolSpec::on(DEAD, &[1]);
    // Every scrape failing means the metrics are unavailable, not the replica: a pool that
    // fails open serves on every member by in-proxy load.
    let mut dead_open = PoolSpec::on(DEAD_OPEN, &[1]);
    dead_open.failure_mode = FailureMode::FailOpen;
    let mut stale_open = PoolSpec::on(STALE_OPEN, &[3]);
    stale_open.failure_mode = FailureMode::FailOpen;
    let mut plan = Plan::new(vec![
        PoolSpec::on(HEALTHY, &[0]),
        PoolSpec::empty(EMPTY),
        dead,
        dead_open,
        PoolSpec::on(STALE_CLOSE, &[2]),
        stale_open,
    ]);
    plan.settings = GatewaySettings {
        stale_after_ms: STALE_AFTER_MS,
        ..GatewaySettings::default()
    };
    // The stale pools never declare their endpoint dead, so failing scrapes only age
    // the metrics: the stale path, not the dead one.
    plan.tweak = Some(Box::new(|plugins| {
        for model in [STALE_CLOSE, STALE_OPEN] {
            picker_pool(plugins, model)["maxConsecutiveFailures"] = 0.into();
        }
    }));
    let Some(stack) = gw::start(flavor, &backends, plan).await else {
        return;
    };
    router_errors(&stack).await;
    body_limit(&stack).await;
    no_endpoints(&stack, &backends).await;
    stale_metrics(&stack, &backends).await;
    let stats = stack.envoy().stats().await.unwrap();
    let all = gateway_stats(&stats);
    for (reason, at_least) in [("no_endpoints", 2), ("stale_metrics", 1)] {
        let n: i64 = stats
            .containing("infergate.picker.rejects")
            .filter(|(k, _)| k.contains(reason))
            .map(|(_, v)| v)
            .sum();
        assert!(
            n >= at_least,
            "{}: rejects `{reason}` = {n}\n{all}",
            tag(flavor)
        );
    }
    assert!(
        stats.sum_containing("infergate.picker.fail_open_picks") >= 1,
        "{}: fail-open picks\n{all}",
        tag(flavor)
    );
}

async fn post_raw(stack: &Stack, body: impl Into<Bytes>) -> HttpResponse {
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    request(
        hyper::Method::POST,
        &url,
        &[("content-type", "application/json")],
        body.into(),
    )
    .await
    .unwrap()
}

async fn router_errors(stack: &Stack) {
    for bad in [
        &br#"{"model": "model-a", "messages": [{"role": "user", "#[..],
        &b"not json at all"[..],
        &br#"{"messages": [{"role": "user", "content": "no model"}]}"#[..],
        &br#"{"model": 5, "messages": [{"role": "user", "content": "x"}]}"#[..],
        &b""[..],
    ] {
        let resp = post_raw(stack, bad).await;
        let error = openai_error(&resp, 400);
        assert_eq!(error["type"], "invalid_request_error", "{error}");
    }
    let resp = post_chat(stack, &chat("gpt-nonexistent", "hello"), &[]).await;
    let error = openai_error(&resp, 404);
    assert_eq!(error["code"], "model_not_found", "{error}");
}

/// Bodies up to the 4 MiB limit reach the router and are served; beyond it the router
/// answers 413 itself, announced (`content-length`) or found while buffering (chunked).
async fn body_limit(stack: &Stack) {
    let limit = GatewaySettings::default().body_limit_bytes as usize;
    let text_of = |total: usize| {
        let envelope = chat(HEALTHY, "").to_string().len();
        "x".repeat(total - envelope)
    };
    let near = chat(HEALTHY, &text_of(limit - 1024));
    let (b, _) = served_by(stack, &near, &[]).await;
    assert_eq!(b, 0, "a {} byte body", near.to_string().len());

    let over = chat(HEALTHY, &text_of(limit + 1)).to_string();
    assert_eq!(over.len(), limit + 1);
    let resp = post_raw(stack, over.clone()).await;
    openai_error(&resp, 413);

    let far_over = chat(HEALTHY, &text_of(6 << 20)).to_string();
    let resp = gw::post_chunked(
        &format!("{}/v1/chat/completions", stack.picker_url()),
        Bytes::from(far_over),
        64 << 10,
    )
    .await;
    openai_error(&resp, 413);
    // And the connection-level limit is not what answered: a body just over the
    // router's limit, chunked, is the router's JSON 413 too.
    let resp = gw::post_chunked(
        &format!("{}/v1/chat/completions", stack.picker_url()),
        Bytes::from(over),
        256 << 10,
    )
    .await;
    let error = openai_error(&resp, 413);
    assert_eq!(error["code"], "request_too_large", "{error}");
}

fn assert_no_endpoints(resp: &HttpResponse, what: &str) {
    openai_error(resp, 503);
    assert_eq!(
        resp.header(DROPPED_REASON),
        Some("rejected-no-endpoints"),
        "{what}: {:?}",
        resp.headers
    );
}

async fn no_endpoints(stack: &Stack, backends: &[TestBackend]) {
    let resp = post_chat(stack, &chat(EMPTY, "anyone?"), &[]).await;
    assert_no_endpoints(&resp, "empty pool");
    // Three failed scrapes in a row make b1 dead (the default `maxConsecutiveFailures`).
    backends[1].wait_scrapes(4).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let resp = post_chat(stack, &chat(DEAD, "anyone alive?"), &[]).await;
    assert_no_endpoints(&resp, "every endpoint dead, FailClose");
    assert_eq!(
        backends[1].served(),
        0,
        "the dead replica was sent a request"
    );
    let (b, _) = served_by(stack, &chat(DEAD_OPEN, "anyone there?"), &[]).await;
    assert_eq!(
        b, 1,
        "FailOpen serves on every member when no scrape succeeds"
    );
}

async fn stale_metrics(stack: &Stack, backends: &[TestBackend]) {
    // Fresh metrics: both served.
    let (b, _) = served_by(stack, &chat(STALE_CLOSE, "fresh"), &[]).await;
    assert_eq!(b, 2);
    let (b, _) = served_by(stack, &chat(STALE_OPEN, "fresh"), &[]).await;
    assert_eq!(b, 3);
    // Scrapes start failing; once the last good sample is older than the bound the
    // metrics are stale.
    backends[2].break_metrics(true);
    backends[3].break_metrics(true);
    backends[2].wait_scrapes(2).await;
    tokio::time::sleep(Duration::from_millis(STALE_AFTER_MS + 300)).await;
    let served_before = backends[2].served();
    for i in 0..3 {
        let resp = post_chat(stack, &chat(STALE_CLOSE, &format!("stale {i}")), &[]).await;
        assert_no_endpoints(&resp, "stale metrics, FailClose");
        let (b, _) = served_by(stack, &chat(STALE_OPEN, &format!("stale {i}")), &[]).await;
        assert_eq!(b, 3, "FailOpen serves on stale metrics");
    }
    assert_eq!(backends[2].served(), served_before);
    // Metrics come back: FailClose serves again.
    backends[2].break_metrics(false);
    backends[2].wait_scrapes(2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (b, _) = served_by(stack, &chat(STALE_CLOSE, "fresh again"), &[]).await;
    assert_eq!(b, 2);
}
