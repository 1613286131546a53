//! The gateway suite: every test body here takes a [`Flavor`] and runs once per gateway
//! flavour (`gateway::wasm::…`, `gateway::native::…`), so both builds are held to exactly
//! the same behaviour. Add a body, then add its name to the `for_each_flavour!` list.

use crate::support::{answered_by, stack_over, StreamPace, TestBackend, QUICK};
use infergate_harness::launch::client::{get, post_json, post_json_streamed, HttpResponse};
use infergate_harness::launch::{Flavor, PoolSpec, Stack};
use serde_json::json;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Generates `mod wasm` and `mod native`, each with one `#[tokio::test]` per body.
macro_rules! for_each_flavour {
    ($($test:ident),* $(,)?) => {
        mod wasm {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(infergate_harness::launch::Flavor::Wasm).await
                }
            )*
        }
        mod native {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(infergate_harness::launch::Flavor::Native).await
                }
            )*
        }
    };
}

for_each_flavour!(
    baseline_route_bypasses_the_filters_and_spreads,
    a_chat_request_through_the_picker_reaches_a_pool_replica,
    streams_through_the_picker_are_not_buffered,
);

const MODEL: &str = "test-model";

fn chat(stream: bool) -> serde_json::Value {
    json!({"model": MODEL, "stream": stream,
           "messages": [{"role": "user", "content": "hello from the e2e suite"}]})
}

/// Posts `body` to the picker until it is answered 200 (the scraper needs a first round
/// of metrics before a `FailClose` pool serves), at most 10 s.
async fn first_success(stack: &Stack, body: &serde_json::Value) -> HttpResponse {
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let resp = post_json(&url, body, &[]).await.unwrap();
        if resp.status == 200 || Instant::now() > deadline {
            assert_eq!(
                resp.status,
                200,
                "{}\n--- envoy log:\n{}",
                resp.text(),
                stack.envoy().log_tail(30)
            );
            return resp;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn baseline_route_bypasses_the_filters_and_spreads(flavor: Flavor) {
    let backends = TestBackend::many(2, QUICK).await;
    let Some(stack) = stack_over(flavor, &backends, vec![PoolSpec::all(MODEL)], 2).await else {
        return;
    };
    let mut seen = BTreeSet::new();
    for _ in 0..20 {
        let url = format!("{}/v1/chat/completions", stack.baseline_url());
        let resp = post_json(&url, &chat(false), &[]).await.unwrap();
        assert_eq!(resp.status, 200, "{}", resp.text());
        let headers = &resp.json().unwrap()["headers"];
        assert!(
            headers.get("x-gateway-base-model-name").is_none(),
            "the body router ran on /rr: {headers}"
        );
        seen.insert(answered_by(&resp));
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
}

async fn a_chat_request_through_the_picker_reaches_a_pool_replica(flavor: Flavor) {
    let backends = TestBackend::many(2, QUICK).await;
    let Some(stack) = stack_over(flavor, &backends, vec![PoolSpec::all(MODEL)], 2).await else {
        return;
    };
    let resp = first_success(&stack, &chat(false)).await;
    let json = resp.json().unwrap();
    let served = answered_by(&resp);
    let index: usize = served.trim_start_matches('b').parse().unwrap();
    assert_eq!(json["headers"]["x-gateway-base-model-name"], MODEL);
    assert_eq!(
        json["headers"]["x-gateway-destination-endpoint"],
        backends[index].addr.to_string(),
        "the picker's choice is the replica that served"
    );
    let metrics = get(&format!(
        "http://{}/stats?format=json",
        stack.envoy().admin()
    ))
    .await
    .unwrap();
    assert_eq!(metrics.status, 200);
}

async fn streams_through_the_picker_are_not_buffered(flavor: Flavor) {
    let pace = StreamPace {
        events: 5,
        gap: Duration::from_millis(300),
    };
    let backends = TestBackend::many(2, pace).await;
    let Some(stack) = stack_over(flavor, &backends, vec![PoolSpec::all(MODEL)], 2).await else {
        return;
    };
    first_success(&stack, &chat(false)).await;
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let resp = post_json_streamed(&url, &chat(true), &[]).await.unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.sse_data().last().map(String::as_str), Some("[DONE]"));
    let first = resp.chunks.first().unwrap().at;
    let last = resp.chunks.last().unwrap().at;
    assert!(
        last - first >= Duration::from_millis(900),
        "first chunk at {first:?}, last at {last:?}: buffered"
    );
}
