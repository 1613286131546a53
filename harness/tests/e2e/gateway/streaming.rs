//! Streamed responses pass through the gateway unbuffered: the first SSE chunk reaches the
//! client long before the backend has produced the last one.

use super::{chat, tag};
use crate::support::gw::{self, Plan};
use crate::support::{StreamPace, TestBackend};
use infergate_harness::launch::client::post_json_streamed;
use infergate_harness::launch::{Flavor, PoolSpec};
use std::time::Duration;

const MODEL: &str = "model-a";

pub(super) async fn streams_through_the_picker_are_not_buffered(flavor: Flavor) {
    let pace = StreamPace {
        events: 5,
        gap: Duration::from_millis(300),
    };
    let backends = TestBackend::many(2, pace).await;
    let Some(stack) = gw::start(flavor, &backends, Plan::new(vec![PoolSpec::all(MODEL)])).await
    else {
        return;
    };
    let mut body = chat(MODEL, "stream to me");
    body["stream"] = true.into();
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let resp = post_json_streamed(&url, &body, &[]).await.unwrap();
    assert_eq!(
        resp.status,
        200,
        "{}",
        String::from_utf8_lossy(&resp.body())
    );
    let events = resp.sse_data();
    assert_eq!(events.len(), 6, "{}: {events:?}", tag(flavor));
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    // The backend sends event k at about k × 300 ms; the last one (and `[DONE]`) at
    // ~1.2 s. A buffering proxy would deliver everything together at the end.
    let first = resp.chunks.first().unwrap().at;
    let last = resp.chunks.last().unwrap().at;
    assert!(
        first < Duration::from_millis(900) && last - first >= Duration::from_millis(900),
        "{}: first chunk at {first:?}, last at {last:?}: buffered",
        tag(flavor)
    );
    assert!(
        resp.chunks.len() >= 5,
        "{}: {} chunks",
        tag(flavor),
        resp.chunks.len()
    );
}
