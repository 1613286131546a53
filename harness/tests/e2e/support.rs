//! Shared pieces of the end-to-end suite: tiny engine-like backends the tests control
//! exactly (which replica answered, how slowly a stream is produced, the KV usage their
//! `/metrics` reports, whether `/metrics` fails), and stack start-up that skips a flavour
//! whose module is not built. [`gw`] holds the gateway-specific helpers.

pub mod gw;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use infergate_harness::launch::{Backends, EnvoyOptions, Flavor, PoolSpec, Stack, StackOptions};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// How a test backend streams: `events` SSE events, `gap` apart.
#[derive(Clone, Copy, Debug)]
pub struct StreamPace {
    pub events: usize,
    pub gap: Duration,
}

/// What a test changes on a running backend, and what it counts.
#[derive(Debug)]
pub struct Control {
    /// KV utilisation reported on `/metrics`, in thousandths.
    kv_permille: AtomicU64,
    /// `/metrics` answers 500 while set.
    metrics_broken: AtomicBool,
    /// Requests other than `/metrics` answered.
    served: AtomicU64,
    /// `/metrics` requests answered (successfully or not).
    scrapes: AtomicU64,
}

impl Default for Control {
    fn default() -> Self {
        Control {
            kv_permille: AtomicU64::new(100),
            metrics_broken: AtomicBool::new(false),
            served: AtomicU64::new(0),
            scrapes: AtomicU64::new(0),
        }
    }
}

/// A backend that answers like a minimal OpenAI-compatible engine and says who it is:
/// - `GET /metrics`: vLLM gauges (idle, KV from [`Control`], 10% unless set), after a
///   `# backend <name>` comment; 500 while [`TestBackend::break_metrics`] is on;
/// - a body with `"stream": true`: SSE, `pace.events` chunks `pace.gap` apart, then `[DONE]`;
/// - anything else: JSON `{"backend", "path", "headers": {…}}` plus an OpenAI-style
///   `choices` so clients that expect a completion are satisfied.
pub struct TestBackend {
    pub addr: SocketAddr,
    pub control: Arc<Control>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestBackend {
    pub async fn start(name: &str, pace: StreamPace) -> TestBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let name = name.to_string();
        let control = Arc::new(Control::default());
        let ctl = control.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    break;
                };
                let name = name.clone();
                let ctl = ctl.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| handle(name.clone(), pace, ctl.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        TestBackend {
            addr,
            control,
            task,
        }
    }

    /// Sets the KV utilisation (0..1) the next `/metrics` pages report.
    pub fn set_kv(&self, utilisation: f64) {
        let permille = (utilisation * 1000.0).round().clamp(0.0, 1000.0) as u64;
        self.control.kv_permille.store(permille, Ordering::SeqCst);
    }

    /// Makes `/metrics` answer 500 (`true`) or the normal page (`false`).
    pub fn break_metrics(&self, broken: bool) {
        self.control.metrics_broken.store(broken, Ordering::SeqCst);
    }

    /// Requests other than `/metrics` this backend has answered.
    pub fn served(&self) -> u64 {
        self.control.served.load(Ordering::SeqCst)
    }

    /// `/metrics` requests this backend has answered.
    pub fn scrapes(&self) -> u64 {
        self.control.scrapes.load(Ordering::SeqCst)
    }

    /// Waits until `/metrics` has been requested `more` more times (so a scrape that started
    /// after a change has been answered), at most 10 s.
    pub async fn wait_scrapes(&self, more: u64) {
        let target = self.scrapes() + more;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.scrapes() < target {
            assert!(
                tokio::time::Instant::now() < deadline,
                "backend {} was scraped {} times, waited for {target}",
                self.addr,
                self.scrapes()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `n` backends named `b0`, `b1`, ….
    pub async fn many(n: usize, pace: StreamPace) -> Vec<TestBackend> {
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            out.push(TestBackend::start(&format!("b{i}"), pace).await);
        }
        out
    }
}

async fn handle(
    name: String,
    pace: StreamPace,
    ctl: Arc<Control>,
    req: Request<Incoming>,
) -> Result<Response<ChannelBody>, Infallible> {
    let path = req.uri().path().to_string();
    let headers: serde_json::Map<String, serde_json::Value> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").into()))
        .collect();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    if path == "/metrics" {
        ctl.scrapes.fetch_add(1, Ordering::SeqCst);
        if ctl.metrics_broken.load(Ordering::SeqCst) {
            let mut resp = ChannelBody::full("text/plain", Bytes::from_static(b"broken\n"));
            *resp.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
            return Ok(resp);
        }
        let kv = ctl.kv_permille.load(Ordering::SeqCst) as f64 / 1000.0;
        let page = format!(
            "# backend {name}\n\
             vllm:num_requests_waiting{{model_name=\"m\"}} 0\n\
             vllm:num_requests_running{{model_name=\"m\"}} 0\n\
             vllm:kv_cache_usage_perc{{model_name=\"m\"}} {kv}\n"
        );
        return Ok(ChannelBody::full("text/plain; version=0.0.4", page.into()));
    }
    ctl.served.fetch_add(1, Ordering::SeqCst);
    if json["stream"] == true {
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            for i in 0..pace.events {
                let event = serde_json::json!({"backend": name, "index": i,
                    "choices": [{"index": 0, "delta": {"content": format!("t{i} ")}}]});
                if tx
                    .send(Bytes::from(format!("data: {event}\n\n")))
                    .await
                    .is_err()
                {
                    return;
                }
                tokio::time::sleep(pace.gap).await;
            }
            let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
        });
        let mut resp = Response::new(ChannelBody { rx: Some(rx) });
        resp.headers_mut()
            .insert("content-type", "text/event-stream".parse().unwrap());
        return Ok(resp);
    }
    let answer = serde_json::json!({
        "backend": name, "path": path, "headers": headers,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    });
    Ok(ChannelBody::full(
        "application/json",
        answer.to_string().into(),
    ))
}

/// A response body fed by a channel, so chunks leave exactly when the backend sends them.
pub struct ChannelBody {
    rx: Option<mpsc::Receiver<Bytes>>,
}

impl ChannelBody {
    /// A body whose frames are whatever `rx` yields, until its sender is dropped.
    pub fn from_channel(rx: mpsc::Receiver<Bytes>) -> ChannelBody {
        ChannelBody { rx: Some(rx) }
    }

    fn full(content_type: &str, data: Bytes) -> Response<ChannelBody> {
        let (tx, rx) = mpsc::channel(1);
        let _ = tx.try_send(data);
        let mut resp = Response::new(ChannelBody { rx: Some(rx) });
        resp.headers_mut()
            .insert("content-type", content_type.parse().unwrap());
        resp
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let Some(rx) = self.rx.as_mut() else {
            return Poll::Ready(None);
        };
        match rx.poll_recv(cx) {
            Poll::Ready(Some(data)) => Poll::Ready(Some(Ok(Frame::data(data)))),
            Poll::Ready(None) => {
                self.rx = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The pace tests use unless they care: quick streams.
pub const QUICK: StreamPace = StreamPace {
    events: 3,
    gap: Duration::from_millis(5),
};

/// Starts `flavor` over `backends` with `pools`, Envoy at `concurrency` workers. Returns
/// `None` (after printing why) when the flavour's module is not built, so a machine without
/// the artefacts still runs every other test; CI builds them first (`cargo xtask test`).
pub async fn stack_over(
    flavor: Flavor,
    backends: &[TestBackend],
    pools: Vec<PoolSpec>,
    concurrency: u32,
) -> Option<Stack> {
    if let Some(module) = flavor.artefact() {
        // `cargo xtask test` names every artefact explicitly: there a missing one is a failure,
        // never a skip.
        let named = ["INFERGATE_WASM", "INFERGATE_NATIVE"]
            .iter()
            .any(|var| std::env::var_os(var).is_some_and(|v| module == std::path::Path::new(&v)));
        assert!(
            !named || module.is_file(),
            "{flavor} flavour: {} was named but does not exist",
            module.display()
        );
        if !module.is_file() {
            eprintln!(
                "SKIPPED: {flavor} flavour needs {} (build it with `cargo xtask build`)",
                module.display()
            );
            return None;
        }
    }
    let addrs = backends.iter().map(|b| b.addr).collect();
    let mut opts = StackOptions::new(flavor, Backends::External(addrs));
    opts.pools = pools;
    opts.envoy = EnvoyOptions {
        concurrency,
        ..EnvoyOptions::default()
    };
    Some(Stack::start(opts).await.unwrap())
}

/// Which test backend answered a JSON request (the `backend` field of its answer).
pub fn answered_by(resp: &infergate_harness::launch::client::HttpResponse) -> String {
    let json = resp.json().unwrap();
    json["backend"].as_str().unwrap_or_default().to_string()
}
