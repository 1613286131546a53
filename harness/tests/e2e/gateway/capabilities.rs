//! Both flavours: the host capabilities of the request pipeline, each driven through a real
//! Envoy by a test stage of the `test-stages` builds (`testStages` in the picker's config):
//!
//! - a request paused at its headers reaches the upstream only after it was woken from
//!   elsewhere (native: another thread; Wasm: another context of the worker's VM, its root's
//!   tick, the path the picker state owner's answers take), resumes on its own worker
//!   thread, and a request sent meanwhile is not held up; a
//!   paused request whose client left is never sent, and its late wake harms nothing;
//! - every chunk of a streamed response is rewritten as it passes, still unbuffered;
//! - a replaced request body reaches the upstream whole, with its own `content-length`.
//!
//! The upstream here is a recorder that keeps what it received, so the test sees exactly
//! what Envoy forwarded.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::{chat, tag};
use crate::support::gw::{self, Plan};
use crate::support::ChannelBody;
use infergate_harness::launch::client::{post_json, post_json_streamed};
use infergate_harness::launch::{Flavor, PoolSpec};

const MODEL: &str = "model-a";
const PAUSE: &str = "x-infergate-test-pause-ms";
const RESUMED: &str = "x-infergate-test-resumed";
const REPLACE: &str = "x-infergate-test-replace-body";
const REWRITE: &str = "x-infergate-test-rewrite-chunks";

/// One request the recorder received.
#[derive(Clone, Debug)]
struct Received {
    at: Instant,
    headers: Vec<(String, String)>,
    body: Bytes,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// An upstream that records every inference request and answers it: SSE (three events
/// 400 ms apart) when the body asks for a stream, else `{"ok": true}`. `/metrics` is a
/// quiet vLLM page, so the pool is scraped and fresh.
struct Recorder {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Recorder {
    async fn start() -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&received);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(Arc::clone(&log), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Recorder { addr, received }
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

fn body_of(data: Bytes, content_type: &str) -> Response<ChannelBody> {
    let (tx, rx) = mpsc::channel(1);
    let _ = tx.try_send(data);
    let mut resp = Response::new(ChannelBody::from_channel(rx));
    resp.headers_mut()
        .insert("content-type", content_type.parse().unwrap());
    resp
}

async fn answer(
    log: Arc<Mutex<Vec<Received>>>,
    req: Request<Incoming>,
) -> Result<Response<ChannelBody>, Infallible> {
    if req.uri().path() == "/metrics" {
        let page = "vllm:num_requests_waiting{model_name=\"m\"} 0\n\
                    vllm:num_requests_running{model_name=\"m\"} 0\n\
                    vllm:kv_cache_usage_perc{model_name=\"m\"} 0.1\n";
        return Ok(body_of(Bytes::from_static(page.as_bytes()), "text/plain"));
    }
    let headers = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let streamed =
        serde_json::from_slice::<serde_json::Value>(&body).is_ok_and(|v| v["stream"] == true);
    log.lock().unwrap().push(Received {
        at: Instant::now(),
        headers,
        body,
    });
    if !streamed {
        return Ok(body_of(
            Bytes::from_static(b"{\"ok\":true}"),
            "application/json",
        ));
    }
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        for i in 0..3 {
            let event = format!("data: {{\"index\":{i},\"text\":\"chunk {i}\"}}\n\n");
            if tx.send(Bytes::from(event)).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    let mut resp = Response::new(ChannelBody::from_channel(rx));
    resp.headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    Ok(resp)
}

/// Whether the module at the flavour's artefact path holds the test stages.
fn has_test_stages(flavor: Flavor) -> bool {
    let Some(path) = flavor.artefact() else {
        return false;
    };
    let needle = PAUSE.as_bytes();
    std::fs::read(&path)
        .map(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
        .unwrap_or(false)
}

async fn pause_resume_chunk_rewrite_and_body_replacement_work_through_envoy(flavor: Flavor) {
    if flavor.artefact().is_some_and(|p| p.is_file()) && !has_test_stages(flavor) {
        eprintln!(
            "SKIPPED: the {flavor} module was built without its test stages \
             (cargo xtask test builds them into target/test-artefact/)"
        );
        return;
    }
    let recorder = Recorder::start().await;
    let mut plan = Plan::new(vec![PoolSpec::all(MODEL)]);
    plan.tweak = Some(Box::new(move |plugins| {
        if flavor == Flavor::Wasm {
            // The Wasm picker never reads the body (it picks at the headers from the
            // router's handoff, as Envoy's default for Wasm filters requires): the body
            // is the router's to replace.
            plugins.router["testStages"] = json!(["replace-body"]);
            plugins.picker["testStages"] = json!(["pause", "rewrite-chunks"]);
        } else {
            plugins.picker["testStages"] = json!(["pause", "replace-body", "rewrite-chunks"]);
        }
    }));
    let Some(stack) = gw::start_over(flavor, vec![recorder.addr], plan).await else {
        return;
    };
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let log = || stack.envoy().log_tail(30);

    // Pause: held at the picker until the test stage's thread wakes it 1.5 s later.
    let paused_url = url.clone();
    let sent = Instant::now();
    let paused = tokio::spawn(async move {
        post_json(&paused_url, &chat(MODEL, "wait for me"), &[(PAUSE, "1500")]).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Meanwhile the worker serves other requests: this one is not held up.
    let quick = post_json(&url, &chat(MODEL, "no pause"), &[])
        .await
        .unwrap();
    assert_eq!(quick.status, 200, "{}\n{}", quick.text(), log());
    assert!(
        sent.elapsed() < Duration::from_millis(1200),
        "{}: a request sent during the pause waited {:?}",
        tag(flavor),
        sent.elapsed()
    );
    assert_eq!(
        recorder.received().len(),
        1,
        "only the unpaused request is upstream"
    );
    let resp = paused.await.unwrap().unwrap();
    assert_eq!(resp.status, 200, "{}\n{}", resp.text(), log());
    let took = sent.elapsed();
    let received = recorder.received();
    assert_eq!(received.len(), 2);
    let resumed = &received[1];
    assert!(
        resumed.at.duration_since(sent) >= Duration::from_millis(1500),
        "{}: the paused request reached the upstream {:?} after it was sent, before its wake",
        tag(flavor),
        resumed.at.duration_since(sent)
    );
    assert!(
        took < Duration::from_secs(5),
        "{}: took {took:?}",
        tag(flavor)
    );
    assert_eq!(
        resumed.header(RESUMED),
        Some("same-thread"),
        "{}: resumed on the stream's own worker: {:?}",
        tag(flavor),
        resumed.headers
    );
    assert_eq!(
        resumed.header(PAUSE),
        None,
        "the test header stays in Envoy"
    );

    // A paused request whose client goes away: the stream ends while paused, the wake
    // that comes later finds it gone (Envoy's scheduler holds the stream weakly), and the
    // request never reaches the upstream.
    let before = recorder.received().len();
    let pid = stack.envoy().pid();
    let gone = tokio::time::timeout(
        Duration::from_millis(200),
        post_json(&url, &chat(MODEL, "i will not wait"), &[(PAUSE, "800")]),
    )
    .await;
    assert!(
        gone.is_err(),
        "{}: the paused request was answered",
        tag(flavor)
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let after = post_json(&url, &chat(MODEL, "still there?"), &[])
        .await
        .unwrap();
    assert_eq!(after.status, 200, "{}\n{}", after.text(), log());
    assert_eq!(stack.envoy().pid(), pid, "{}: Envoy restarted", tag(flavor));
    let received = recorder.received();
    assert_eq!(
        received.len(),
        before + 1,
        "{}: the abandoned request reached the upstream",
        tag(flavor)
    );

    // Chunk rewrite: every SSE chunk arrives upper-cased, as the upstream sends it.
    let mut body = chat(MODEL, "stream to me");
    body["stream"] = true.into();
    let resp = post_json_streamed(&url, &body, &[(REWRITE, "1")])
        .await
        .unwrap();
    assert_eq!(
        resp.status,
        200,
        "{}",
        String::from_utf8_lossy(&resp.body())
    );
    // Upper-cased, `data:` is `DATA:` too: the events are read from the raw body.
    let text = String::from_utf8_lossy(&resp.body()).into_owned();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(
        events,
        [
            r#"DATA: {"INDEX":0,"TEXT":"CHUNK 0"}"#,
            r#"DATA: {"INDEX":1,"TEXT":"CHUNK 1"}"#,
            r#"DATA: {"INDEX":2,"TEXT":"CHUNK 2"}"#,
            "DATA: [DONE]"
        ],
        "{}: {text:?}",
        tag(flavor)
    );
    let first = resp.chunks.first().unwrap().at;
    let last = resp.chunks.last().unwrap().at;
    assert!(
        first < Duration::from_millis(700) && last - first >= Duration::from_millis(700),
        "{}: first chunk at {first:?}, last at {last:?}: buffered",
        tag(flavor)
    );
    // Without the test header the same stream passes untouched.
    let plain = post_json_streamed(&url, &body, &[]).await.unwrap();
    assert_eq!(plain.sse_data()[0], r#"{"index":0,"text":"chunk 0"}"#);

    // Body replacement: the upstream reads the new body whole, by its own content-length.
    let before = recorder.received().len();
    let original = chat(MODEL, "the original words, longer than the new ones");
    let resp = post_json(&url, &original, &[(REPLACE, "new words")])
        .await
        .unwrap();
    assert_eq!(resp.status, 200, "{}\n{}", resp.text(), log());
    let received = recorder.received();
    assert_eq!(received.len(), before + 1);
    let got = &received[before];
    let sent_body: serde_json::Value = serde_json::from_slice(&got.body).unwrap_or_default();
    assert_eq!(
        sent_body,
        json!({"model": MODEL, "messages": [{"role": "user", "content": "new words"}]}),
        "{}: upstream got {:?}",
        tag(flavor),
        String::from_utf8_lossy(&got.body)
    );
    assert_eq!(
        got.header("content-length"),
        Some(got.body.len().to_string().as_str()),
        "{}: {:?}",
        tag(flavor),
        got.headers
    );
    assert_eq!(got.header(REPLACE), None);
    // The gateway still routed it: the pick's destination header is on the request.
    assert!(got.header("x-gateway-destination-endpoint").is_some());
}

mod wasm {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pause_resume_chunk_rewrite_and_body_replacement_work_through_envoy() {
        super::pause_resume_chunk_rewrite_and_body_replacement_work_through_envoy(
            infergate_harness::launch::Flavor::Wasm,
        )
        .await
    }
}

mod native {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pause_resume_chunk_rewrite_and_body_replacement_work_through_envoy() {
        super::pause_resume_chunk_rewrite_and_body_replacement_work_through_envoy(
            infergate_harness::launch::Flavor::Native,
        )
        .await
    }
}
