//! Helpers of the simulator's socket tests: one HTTP/1.1 request per connection, SSE
//! payloads split, and a stream read for a few chunks and then abandoned.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use infergate_sim::{self as sim, SimConfig, SimHandle};
use serde_json::{json, Value};
use tokio::net::TcpStream;

pub async fn pool(cfg: SimConfig) -> SimHandle {
    sim::start(cfg).await.unwrap()
}

pub struct Reply {
    pub status: u16,
    pub body: String,
}

async fn send(
    addr: &std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> (
    hyper::Response<hyper::body::Incoming>,
    tokio::task::JoinHandle<()>,
) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(
            body.map(|v| v.to_string()).unwrap_or_default(),
        )))
        .unwrap();
    (tx.send_request(req).await.unwrap(), task)
}

/// One whole request.
pub async fn call(
    addr: &std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> Reply {
    let (resp, _task) = send(addr, method, path, body, headers).await;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

/// Reads a streamed response until `chunks` content chunks (with non-empty text) arrived,
/// then closes the connection. Returns what was read.
pub async fn stream_then_cut(
    addr: &std::net::SocketAddr,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
    chunks: usize,
) -> String {
    let (resp, task) = send(addr, "POST", path, Some(body), headers).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut text = String::new();
    while content_chunks(&text) < chunks {
        let frame = body.frame().await.unwrap().unwrap();
        if let Ok(d) = frame.into_data() {
            text.push_str(std::str::from_utf8(&d).unwrap());
        }
    }
    drop(body);
    task.abort();
    text
}

/// Sends a streamed request and times it until the first frame of its body (the first SSE
/// chunk), which it returns with the elapsed time; the rest of the stream is abandoned.
pub async fn time_to_first_chunk(
    addr: &std::net::SocketAddr,
    path: &str,
    body: &Value,
) -> (Duration, String) {
    let start = Instant::now();
    let (resp, task) = send(addr, "POST", path, Some(body), &[]).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let frame = body.frame().await.unwrap().unwrap();
    let elapsed = start.elapsed();
    let text = String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap();
    drop(body);
    task.abort();
    (elapsed, text)
}

/// The `data:` payloads of a complete SSE body.
pub fn payloads(body: &str) -> Vec<&str> {
    assert!(body.ends_with("\n\n"), "unterminated SSE body: {body:?}");
    body.split_terminator("\n\n")
        .map(|e| e.strip_prefix("data: ").unwrap())
        .collect()
}

/// Content chunks (non-empty text) among the complete events of `body`.
pub fn content_chunks(body: &str) -> usize {
    let complete = match body.rfind("\n\n") {
        Some(p) => &body[..p + 2],
        None => return 0,
    };
    payloads(complete)
        .iter()
        .filter(|p| **p != "[DONE]")
        .map(|p| serde_json::from_str::<Value>(p).unwrap())
        .filter(|v| {
            let c = &v["choices"][0];
            let t = c["delta"]["content"].as_str().or(c["text"].as_str());
            t.is_some_and(|t| !t.is_empty())
        })
        .count()
}

pub fn chat(content: &str, extra: Value) -> Value {
    let mut v = json!({"model": "sim-model", "messages": [{"role": "user", "content": content}]});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    v
}

/// Polls `f` until it holds or `secs` pass.
pub async fn eventually<F, Fut>(secs: u64, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}
