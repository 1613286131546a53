//! The pool's arrival log over sockets: one entry per completion request, in the order the
//! replicas received them, with the fairness id and request id each carried; `/metrics`
//! and other routes are not logged.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{call, chat, pool};
use infergate_sim::SimConfig;
use serde_json::json;

#[tokio::test]
async fn completion_requests_are_logged_in_arrival_order_across_replicas() {
    let sim = pool(SimConfig {
        replicas: 2,
        ..SimConfig::default()
    })
    .await;
    let body = chat("hello", json!({"max_tokens": 2}));
    for (replica, flow, id) in [(1, "tenant-b", "r1"), (0, "tenant-a", "r2"), (1, "", "r3")] {
        let mut headers = vec![("x-request-id", id)];
        if !flow.is_empty() {
            headers.push(("x-llm-d-inference-fairness-id", flow));
        }
        let addr = sim.addrs()[replica];
        let reply = call(&addr, "POST", "/v1/chat/completions", Some(&body), &headers).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        call(&addr, "GET", "/metrics", None, &[]).await;
    }
    let got: Vec<(usize, String, String)> = sim
        .arrivals()
        .into_iter()
        .map(|a| (a.replica, a.fairness_id, a.request_id))
        .collect();
    assert_eq!(
        got,
        [
            (1, "tenant-b".into(), "r1".into()),
            (0, "tenant-a".into(), "r2".into()),
            (1, String::new(), "r3".into()),
        ]
    );
}
