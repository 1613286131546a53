//! Routing by the body's `model` (base model or LoRA adapter), what a client cannot steer,
//! the `envoy.lb` metadata, the `/rr` baseline, and the picker's stats.

use super::{chat, endpoint_label, post_chat, served_by, tag};
use crate::support::gw::{self, gateway_stats, Plan};
use crate::support::{answered_by, TestBackend, QUICK};
use infergate_harness::launch::client::post_json;
use infergate_harness::launch::{Flavor, PoolSpec, Stack};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};

const MODEL_A: &str = "org/model-a";
const ADAPTER_A: &str = "model-a-lora";
const MODEL_B: &str = "model-b";

/// A prompt long enough to fill several prefix blocks, unique per `id`.
fn long_prompt(id: &str) -> String {
    format!(
        "{id}: {}",
        "please summarise the following notes. ".repeat(80)
    )
}

/// Requests the picker routed, by backend index (to compare with the picks stats).
type Tally = BTreeMap<usize, i64>;

pub(super) async fn routes_by_model_and_adapter_and_ignores_client_steering(flavor: Flavor) {
    let backends = TestBackend::many(4, QUICK).await;
    let mut pool_a = PoolSpec::on(MODEL_A, &[0, 1]);
    pool_a.adapters = vec![ADAPTER_A.into()];
    // Pool B hashes prompts in 16-token blocks, set in its picker config only: the router
    // must hash its handoff at the picker's block size (the stats check below counts every
    // pick as made from the handoff).
    let mut pool_b = PoolSpec::on(MODEL_B, &[2, 3]);
    let mut epp = infergate_filters::picker::config::default_epp_config();
    epp["plugins"][0]["parameters"] = json!({"blockSizeTokens": 16});
    pool_b.picker_config = epp;
    let plan = Plan::new(vec![pool_a, pool_b]);
    let Some(stack) = gw::start(flavor, &backends, plan).await else {
        return;
    };
    let mut tally = Tally::new();
    routes_by_model(&stack, &backends, &mut tally).await;
    client_headers_do_not_steer(&stack, &backends, &mut tally).await;
    metadata_names_the_served_endpoint(&stack, &backends, flavor, &mut tally).await;
    baseline_bypasses_the_filters(&stack).await;
    stats_count_decisions_and_picks(&stack, &backends, flavor, &tally).await;
}

async fn routes_by_model(stack: &Stack, backends: &[TestBackend], tally: &mut Tally) {
    let cases = [
        (MODEL_A, MODEL_A, [0, 1]),
        (ADAPTER_A, MODEL_A, [0, 1]),
        (MODEL_B, MODEL_B, [2, 3]),
    ];
    for (model, base, pool) in cases {
        let mut seen = BTreeSet::new();
        for i in 0..12 {
            let body = chat(model, &format!("routing question {i} for {model}"));
            let (b, headers) = served_by(stack, &body, &[]).await;
            *tally.entry(b).or_default() += 1;
            assert!(pool.contains(&b), "{model} served by b{b}, pool {pool:?}");
            assert_eq!(headers["x-gateway-model-name"], model);
            assert_eq!(headers["x-gateway-base-model-name"], base);
            assert_eq!(
                first_destination(&headers),
                backends[b].addr.to_string(),
                "the destination header names the replica that served"
            );
            seen.insert(b);
        }
        assert_eq!(seen.len(), 2, "{model}: 12 requests all on {seen:?}");
    }
}

async fn client_headers_do_not_steer(stack: &Stack, backends: &[TestBackend], tally: &mut Tally) {
    // An address outside every pool, and a replica of the other model's pool.
    for spoof in ["127.0.0.1:1".to_string(), backends[2].addr.to_string()] {
        for i in 0..4 {
            let body = chat(MODEL_A, &format!("spoofed destination {spoof} #{i}"));
            let (b, headers) =
                served_by(stack, &body, &[("x-gateway-destination-endpoint", &spoof)]).await;
            *tally.entry(b).or_default() += 1;
            assert!([0, 1].contains(&b), "spoof {spoof} steered to b{b}");
            assert_eq!(first_destination(&headers), backends[b].addr.to_string());
        }
    }
    // A replica inside the pool, but not the one the picker prefers: a conversation's
    // repeat goes where its prefix is cached, whatever the header says.
    for round in 0..3 {
        let body = chat(MODEL_A, &long_prompt(&format!("affine {round}")));
        let (first, _) = served_by(stack, &body, &[]).await;
        *tally.entry(first).or_default() += 1;
        let other = backends[1 - first].addr.to_string();
        let (again, headers) =
            served_by(stack, &body, &[("x-gateway-destination-endpoint", &other)]).await;
        *tally.entry(again).or_default() += 1;
        assert_eq!(
            again,
            first,
            "round {round}: a header naming b{} moved the request",
            1 - first
        );
        assert_eq!(
            first_destination(&headers),
            backends[first].addr.to_string()
        );
    }
    // Routing, priority and tenancy headers from the client are dropped; a spoofed
    // base-model header does not switch pools.
    let spoofed = [
        ("x-llm-d-inference-objective", "critical"),
        ("x-llm-d-inference-fairness-id", "someone-else"),
        ("x-llm-d-request-dropped-reason", "rejected-saturated"),
        ("x-gateway-base-model-name", MODEL_B),
        ("x-gateway-model-name", MODEL_B),
        ("x-gateway-destination-endpoint-subset", "127.0.0.1:1"),
    ];
    for i in 0..4 {
        let body = chat(MODEL_A, &format!("spoofed gateway headers #{i}"));
        let (b, headers) = served_by(stack, &body, &spoofed).await;
        *tally.entry(b).or_default() += 1;
        assert!([0, 1].contains(&b), "spoofed headers steered to b{b}");
        assert_eq!(headers["x-gateway-base-model-name"], MODEL_A);
        assert_eq!(headers["x-gateway-model-name"], MODEL_A);
        let leaked: Vec<&String> = headers
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| k.starts_with("x-llm-d-") || *k == "x-gateway-destination-endpoint-subset")
            .collect();
        assert!(
            leaked.is_empty(),
            "client headers reached the replica: {leaked:?}"
        );
    }
}

async fn metadata_names_the_served_endpoint(
    stack: &Stack,
    backends: &[TestBackend],
    flavor: Flavor,
    tally: &mut Tally,
) {
    for i in 0..3 {
        let trace = format!("{}-metadata-{i}", tag(flavor));
        let body = chat(MODEL_B, &format!("traced request {i}"));
        let (b, _) = served_by(stack, &body, &[("infergate-trace", &trace)]).await;
        *tally.entry(b).or_default() += 1;
        let line = gw::traced(stack, &trace).await;
        let addr = backends[b].addr.to_string();
        assert_eq!(line["response_code"], 200, "{line}");
        assert_eq!(line["upstream_host"], addr.as_str(), "{line}");
        let listed = line["lb_endpoint"].as_str().unwrap_or_default();
        assert_eq!(
            listed.split(',').next(),
            Some(addr.as_str()),
            "dynamic metadata envoy.lb/x-gateway-destination-endpoint: {line}"
        );
    }
}

async fn baseline_bypasses_the_filters(stack: &Stack) {
    let mut seen = BTreeSet::new();
    for _ in 0..8 {
        let url = format!("{}/v1/chat/completions", stack.baseline_url());
        let resp = post_json(&url, &chat(MODEL_A, "baseline"), &[])
            .await
            .unwrap();
        assert_eq!(resp.status, 200, "{}", resp.text());
        let headers = &resp.json().unwrap()["headers"];
        assert!(
            headers.get("x-gateway-base-model-name").is_none(),
            "the body router ran on /rr: {headers}"
        );
        seen.insert(answered_by(&resp));
    }
    assert_eq!(seen.len(), 4, "round robin over every replica: {seen:?}");
    // A model no pool serves is still the router's 404 on the gateway path.
    let resp = post_chat(stack, &chat("no-such-model", "x"), &[]).await;
    assert_eq!(resp.status, 404, "{}", resp.text());
}

async fn stats_count_decisions_and_picks(
    stack: &Stack,
    backends: &[TestBackend],
    flavor: Flavor,
    tally: &Tally,
) {
    let stats = stack.envoy().stats().await.unwrap();
    let all = gateway_stats(&stats);
    let routed: i64 = tally.values().sum();
    assert_eq!(
        stats.sum_containing("infergate.picker.decisions"),
        routed,
        "{}: decisions\n{all}",
        tag(flavor)
    );
    // The router held each request until its body was complete, parsed it and left the
    // picker a handoff: every decision must have come from it, none from a second parse.
    assert_eq!(
        stats.sum_containing("infergate.picker.handoff"),
        routed,
        "{}: picks from the router's handoff\n{all}",
        tag(flavor)
    );
    for (i, b) in backends.iter().enumerate() {
        let label = endpoint_label(&b.addr);
        let picks: i64 = stats
            .containing("infergate.picker.picks")
            .filter(|(k, _)| k.contains(&label))
            .map(|(_, v)| v)
            .sum();
        assert_eq!(
            picks,
            tally.get(&i).copied().unwrap_or(0),
            "{}: picks of b{i} ({label})\n{all}",
            tag(flavor)
        );
    }
    assert_eq!(
        stats.sum_containing("infergate.picker.rejects"),
        0,
        "{}: no rejects on a healthy pool\n{all}",
        tag(flavor)
    );
    assert!(
        stats.sum_containing("infergate.router.requests") >= routed,
        "{}: router outcomes\n{all}",
        tag(flavor)
    );
}

/// The first entry of the destination header the replica received: the picker's choice
/// (the rest of the comma-separated list are its fallbacks for Envoy's retry).
fn first_destination(headers: &serde_json::Value) -> &str {
    headers["x-gateway-destination-endpoint"]
        .as_str()
        .unwrap_or_default()
        .split(',')
        .next()
        .unwrap_or_default()
}
