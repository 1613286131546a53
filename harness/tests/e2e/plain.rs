//! The `plain` flavour: Envoy with no gateway filter, routing only on headers the client
//! sets. It proves the routes and clusters the gateway flavours build on.

use crate::support::{answered_by, stack_over, workers, StreamPace, TestBackend, QUICK};
use infergate_harness::launch::client::{get, post_json, post_json_streamed};
use infergate_harness::launch::{Flavor, PoolSpec, Stack};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

async fn plain(backends: &[TestBackend], pools: Vec<PoolSpec>) -> Stack {
    stack_over(Flavor::Plain, backends, pools, workers())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rr_strips_the_prefix_and_spreads_requests_over_every_replica() {
    let backends = TestBackend::many(3, QUICK).await;
    // Pinned to one worker: every Envoy worker runs its own round robin (from its own
    // starting point), so an even spread is a property of one worker's sequence.
    let stack = stack_over(Flavor::Plain, &backends, vec![PoolSpec::all("m")], 1)
        .await
        .unwrap();
    let mut per_backend = BTreeMap::<String, usize>::new();
    for _ in 0..30 {
        let resp = get(&format!("{}/v1/models", stack.baseline_url()))
            .await
            .unwrap();
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(resp.json().unwrap()["path"], "/v1/models");
        *per_backend.entry(answered_by(&resp)).or_default() += 1;
    }
    assert_eq!(per_backend.len(), 3, "{per_backend:?}");
    for (b, n) in &per_backend {
        assert!(
            (9..=11).contains(n),
            "round robin uneven: {b} got {n}: {per_backend:?}"
        );
    }
    let stats = stack.envoy().stats().await.unwrap();
    assert_eq!(stats.cluster_requests("rr"), 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destination_header_reaches_exactly_the_chosen_replica() {
    let backends = TestBackend::many(3, QUICK).await;
    let stack = plain(&backends, vec![PoolSpec::all("m")]).await;
    for round in 0..2 {
        for (i, b) in backends.iter().enumerate() {
            let addr = b.addr.to_string();
            let resp = post_json(
                &format!("{}/v1/chat/completions", stack.picker_url()),
                &json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
                &[("x-gateway-destination-endpoint", &addr)],
            )
            .await
            .unwrap();
            assert_eq!(resp.status, 200, "round {round}: {}", resp.text());
            assert_eq!(answered_by(&resp), format!("b{i}"));
            assert_eq!(resp.json().unwrap()["path"], "/v1/chat/completions");
        }
    }
    // Without the header there is no route on this template: Envoy answers 404 itself.
    let resp = get(&format!("{}/v1/models", stack.picker_url()))
        .await
        .unwrap();
    assert_eq!(resp.status, 404);
    assert_eq!(
        stack
            .envoy()
            .stats()
            .await
            .unwrap()
            .cluster_requests("destination"),
        6
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn base_model_header_selects_the_pool_cluster_and_destination_the_replica() {
    let backends = TestBackend::many(3, QUICK).await;
    let pools = vec![
        PoolSpec::on("org/model-a", &[0, 1]),
        PoolSpec::on("model-b", &[2]),
    ];
    let stack = plain(&backends, pools).await;
    let url = format!("{}/v1/completions", stack.picker_url());
    let send = |model: &'static str, dest: usize| {
        let addr = backends[dest].addr.to_string();
        let url = url.clone();
        async move {
            post_json(
                &url,
                &json!({"model": model, "prompt": "x"}),
                &[
                    ("x-gateway-base-model-name", model),
                    ("x-gateway-destination-endpoint", &addr),
                ],
            )
            .await
            .unwrap()
        }
    };
    assert_eq!(answered_by(&send("org/model-a", 1).await), "b1");
    assert_eq!(answered_by(&send("org/model-a", 0).await), "b0");
    assert_eq!(answered_by(&send("model-b", 2).await), "b2");
    let stats = stack.envoy().stats().await.unwrap();
    assert_eq!(stats.cluster_requests("pool-0-org_model-a"), 2);
    assert_eq!(stats.cluster_requests("pool-1-model-b"), 1);
    assert_eq!(stats.cluster_requests("destination"), 0);
    // A pool route without a destination has no host to go to: 503, never a loop.
    let resp = post_json(
        &url,
        &json!({"model": "model-b"}),
        &[("x-gateway-base-model-name", "model-b")],
    )
    .await
    .unwrap();
    assert_eq!(resp.status, 503, "{}", resp.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_pass_through_unbuffered_on_both_routes() {
    let pace = StreamPace {
        events: 5,
        gap: Duration::from_millis(300),
    };
    let backends = TestBackend::many(2, pace).await;
    let stack = plain(&backends, vec![PoolSpec::all("m")]).await;
    let body =
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let dest = backends[1].addr.to_string();
    let routes = [
        (
            format!("{}/v1/chat/completions", stack.baseline_url()),
            vec![],
        ),
        (
            format!("{}/v1/chat/completions", stack.picker_url()),
            vec![("x-gateway-destination-endpoint", dest.as_str())],
        ),
    ];
    for (url, headers) in routes {
        let resp = post_json_streamed(&url, &body, &headers).await.unwrap();
        assert_eq!(resp.status, 200);
        let events = resp.sse_data();
        assert_eq!(events.len(), 6, "{events:?}");
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        let first = resp.chunks.first().unwrap().at;
        let last = resp.chunks.last().unwrap().at;
        // The backend needs 4 × 300 ms between its first and last event; a buffering proxy
        // would deliver everything at once, after the last one.
        assert!(
            resp.chunks.len() >= 4,
            "{url}: {} chunks",
            resp.chunks.len()
        );
        assert!(
            last - first >= Duration::from_millis(900),
            "{url}: first chunk at {first:?}, last at {last:?}: buffered"
        );
        assert!(
            resp.headers_at + Duration::from_millis(900) <= last,
            "{url}: headers at {:?}, last chunk at {last:?}: headers held back",
            resp.headers_at
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulator_replicas_answer_through_plain_envoy() {
    use infergate_harness::launch::{Backends, StackOptions, DEFAULT_MODEL};
    use infergate_harness::sim::{SimConfig, REPLICA_HEADER};
    let sim = SimConfig {
        replicas: 2,
        ..SimConfig::default()
    };
    let mut opts = StackOptions::new(Flavor::Plain, Backends::InProcess(Box::new(sim)));
    // Pinned to one worker: four round-robin requests reach both replicas only within one
    // worker's sequence (each worker has its own).
    opts.envoy.concurrency = 1;
    let stack = Stack::start(opts).await.unwrap();
    let body = json!({"model": DEFAULT_MODEL, "max_tokens": 4,
                      "messages": [{"role": "user", "content": "hello"}]});
    let mut replicas = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let url = format!("{}/v1/chat/completions", stack.baseline_url());
        let resp = post_json(&url, &body, &[]).await.unwrap();
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(resp.json().unwrap()["usage"]["completion_tokens"], 4);
        replicas.insert(resp.header(REPLICA_HEADER).unwrap().to_string());
    }
    assert_eq!(replicas.len(), 2, "{replicas:?}");
    let dest = stack.replicas()[1].to_string();
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let resp = post_json_streamed(
        &url,
        &stream_body,
        &[("x-gateway-destination-endpoint", &dest)],
    )
    .await
    .unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.headers.get(REPLICA_HEADER).unwrap(), "1");
    assert_eq!(resp.sse_data().last().map(String::as_str), Some("[DONE]"));
}
