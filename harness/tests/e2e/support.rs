//! Shared pieces of the end-to-end suite: tiny engine-like backends the tests control
//! exactly (which replica answered, how slowly a stream is produced, the KV usage their
//! `/metrics` reports, how `/metrics` and requests fail, killing a replica outright), and
//! stack start-up that skips a flavour whose module is not built, and the one Envoy worker
//! count every stack runs unless a test pins its own ([`workers`]). [`gw`] holds the
//! gateway-specific helpers, [`raw`] an HTTP/1.1 client that sends any bytes, [`h2`] an
//! HTTP/2 (h2c) client, [`settle`] the checks every fault scenario ends with, [`objects`]
//! the platform's `TenantQuota` and `InferenceObjective` objects as tests write them,
//! [`reset`] a replica that resets every request (scraped as healthy).

pub mod gw;
pub mod h2;
pub mod objects;
pub mod raw;
pub mod reset;
pub mod settle;

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
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
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

/// How a backend answers `GET /metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum MetricsMode {
    /// The vLLM page.
    Normal = 0,
    /// 500 with a short text body.
    Error = 1,
    /// Accepts the request and never answers.
    Hang = 2,
    /// A 30 MB page of well-formed gauge lines.
    Huge = 3,
    /// 200 with bytes that are not a Prometheus page (invalid UTF-8, NUL, broken lines).
    Garbage = 4,
}

/// How a backend answers everything but `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ServeMode {
    /// JSON, or SSE when the body asks for a stream.
    Normal = 0,
    /// Reads the request and never answers.
    Hang = 1,
    /// A 200 `text/event-stream` that is not valid SSE ([`MALFORMED_SSE`]).
    MalformedSse = 2,
}

/// The body a [`ServeMode::MalformedSse`] backend sends: events without `data:`, JSON cut
/// short, NUL and invalid UTF-8, CR-only line ends, a `[DONE]` that is not the end, and a
/// last event never terminated.
pub const MALFORMED_SSE: &[u8] = b"data: {\"choices\": [{\"delta\": {\"content\": \"ok\"}}]}\n\n\
data: {\"choices\": [{\"delta\"\n\n\
event without data\n\n\
data: \x00\x01\xff\xfe\xc3\x28\n\n\
data: [DONE]\n\n\
data: {\"after\": \"done\"}\r\r\
: comment\n\
data: {\"unterminated\": ";

/// What a test changes on a running backend, and what it counts.
#[derive(Debug)]
pub struct Control {
    /// KV utilisation reported on `/metrics`, in thousandths.
    kv_permille: AtomicU64,
    /// A [`MetricsMode`].
    metrics_mode: AtomicU8,
    /// A [`ServeMode`].
    serve_mode: AtomicU8,
    /// Requests other than `/metrics` answered (or held, when hanging).
    served: AtomicU64,
    /// `/metrics` requests answered (successfully or not).
    scrapes: AtomicU64,
    /// SSE streams in progress.
    streams_open: AtomicI64,
    /// SSE streams whose reader went away before the end.
    streams_cancelled: AtomicU64,
    /// Every connection task, so [`TestBackend::kill`] can drop them all at once.
    connections: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Default for Control {
    fn default() -> Self {
        Control {
            kv_permille: AtomicU64::new(100),
            metrics_mode: AtomicU8::new(MetricsMode::Normal as u8),
            serve_mode: AtomicU8::new(ServeMode::Normal as u8),
            served: AtomicU64::new(0),
            scrapes: AtomicU64::new(0),
            streams_open: AtomicI64::new(0),
            streams_cancelled: AtomicU64::new(0),
            connections: Mutex::new(Vec::new()),
        }
    }
}

impl Control {
    fn metrics_mode(&self) -> MetricsMode {
        match self.metrics_mode.load(Ordering::SeqCst) {
            1 => MetricsMode::Error,
            2 => MetricsMode::Hang,
            3 => MetricsMode::Huge,
            4 => MetricsMode::Garbage,
            _ => MetricsMode::Normal,
        }
    }

    fn serve_mode(&self) -> ServeMode {
        match self.serve_mode.load(Ordering::SeqCst) {
            1 => ServeMode::Hang,
            2 => ServeMode::MalformedSse,
            _ => ServeMode::Normal,
        }
    }
}

/// Counts a stream as open while it lives; a drop before `finished` counts it cancelled.
struct OpenStream {
    ctl: Arc<Control>,
    finished: bool,
}

impl OpenStream {
    fn new(ctl: Arc<Control>) -> OpenStream {
        ctl.streams_open.fetch_add(1, Ordering::SeqCst);
        OpenStream {
            ctl,
            finished: false,
        }
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.ctl.streams_open.fetch_sub(1, Ordering::SeqCst);
        if !self.finished {
            self.ctl.streams_cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A backend that answers like a minimal OpenAI-compatible engine and says who it is:
/// - `GET /metrics`: vLLM gauges (idle, KV from [`Control`], 10% unless set), after a
///   `# backend <name>` comment, or the fault of its [`MetricsMode`];
/// - a body with `"stream": true`: SSE, `pace.events` chunks `pace.gap` apart, then `[DONE]`
///   (the body's own `stream_events` / `stream_gap_ms` override the pace);
/// - anything else: JSON `{"backend", "path", "headers": {…}}` plus an OpenAI-style
///   `choices` so clients that expect a completion are satisfied;
/// - or the fault of its [`ServeMode`].
pub struct TestBackend {
    pub addr: SocketAddr,
    pub control: Arc<Control>,
    name: String,
    pace: StreamPace,
    /// The accept loop; replaced by [`TestBackend::restart`].
    task: Mutex<tokio::task::JoinHandle<()>>,
}

impl Drop for TestBackend {
    fn drop(&mut self) {
        self.kill();
    }
}

impl TestBackend {
    pub async fn start(name: &str, pace: StreamPace) -> TestBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let control = Arc::new(Control::default());
        let task = accept_loop(listener, name.to_string(), pace, control.clone());
        TestBackend {
            addr,
            control,
            name: name.to_string(),
            pace,
            task: Mutex::new(task),
        }
    }

    /// A killed replica comes back on the same address, with the same controls.
    pub async fn restart(&self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        let task = accept_loop(listener, self.name.clone(), self.pace, self.control.clone());
        let old = std::mem::replace(&mut *self.task.lock().unwrap(), task);
        old.abort();
    }

    /// Sets the KV utilisation (0..1) the next `/metrics` pages report.
    pub fn set_kv(&self, utilisation: f64) {
        let permille = (utilisation * 1000.0).round().clamp(0.0, 1000.0) as u64;
        self.control.kv_permille.store(permille, Ordering::SeqCst);
    }

    /// Makes `/metrics` answer 500 (`true`) or the normal page (`false`).
    pub fn break_metrics(&self, broken: bool) {
        let mode = if broken {
            MetricsMode::Error
        } else {
            MetricsMode::Normal
        };
        self.set_metrics(mode);
    }

    /// How `/metrics` answers from now on.
    pub fn set_metrics(&self, mode: MetricsMode) {
        self.control
            .metrics_mode
            .store(mode as u8, Ordering::SeqCst);
    }

    /// How every other request is answered from now on.
    pub fn set_serve(&self, mode: ServeMode) {
        self.control.serve_mode.store(mode as u8, Ordering::SeqCst);
    }

    /// The replica dies: it stops listening and every open connection is dropped at once
    /// (streams end mid-way, as when an engine process is killed).
    pub fn kill(&self) {
        self.task.lock().unwrap().abort();
        for conn in self.control.connections.lock().unwrap().drain(..) {
            conn.abort();
        }
    }

    /// SSE streams in progress now.
    pub fn streams_open(&self) -> i64 {
        self.control.streams_open.load(Ordering::SeqCst)
    }

    /// SSE streams whose reader went away before their end.
    pub fn streams_cancelled(&self) -> u64 {
        self.control.streams_cancelled.load(Ordering::SeqCst)
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

/// Accepts connections on `listener` and serves each as [`TestBackend`] describes; every
/// connection task is recorded in `ctl` so a kill can drop them all.
fn accept_loop(
    listener: TcpListener,
    name: String,
    pace: StreamPace,
    ctl: Arc<Control>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                break;
            };
            let name = name.clone();
            let conn_ctl = ctl.clone();
            let task = tokio::spawn(async move {
                let svc = service_fn(move |req| handle(name.clone(), pace, conn_ctl.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
            let mut conns = ctl.connections.lock().unwrap();
            conns.retain(|c| !c.is_finished());
            conns.push(task.abort_handle());
        }
    })
}

async fn handle(
    name: String,
    pace: StreamPace,
    ctl: Arc<Control>,
    req: Request<Incoming>,
) -> Result<Response<ChannelBody>, Infallible> {
    let path = req.uri().path().to_string();
    // Every value of the steering header, so a test can tell one from many.
    let destinations: Vec<String> = req
        .headers()
        .get_all("x-gateway-destination-endpoint")
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    let headers: serde_json::Map<String, serde_json::Value> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            let text = String::from_utf8_lossy(v.as_bytes()).into_owned();
            (k.to_string(), text.into())
        })
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
        match ctl.metrics_mode() {
            MetricsMode::Normal => {}
            MetricsMode::Error => {
                let mut resp = ChannelBody::full("text/plain", Bytes::from_static(b"broken\n"));
                *resp.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
                return Ok(resp);
            }
            MetricsMode::Hang => std::future::pending::<()>().await,
            MetricsMode::Huge => return Ok(ChannelBody::chunked("text/plain", huge_page())),
            MetricsMode::Garbage => {
                return Ok(ChannelBody::full(
                    "text/plain; version=0.0.4",
                    Bytes::from_static(GARBAGE_PAGE),
                ))
            }
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
    match ctl.serve_mode() {
        ServeMode::Normal => {}
        ServeMode::Hang => std::future::pending::<()>().await,
        ServeMode::MalformedSse => {
            return Ok(ChannelBody::full(
                "text/event-stream",
                Bytes::from_static(MALFORMED_SSE),
            ))
        }
    }
    if json["stream"] == true {
        let pace = StreamPace {
            events: json["stream_events"]
                .as_u64()
                .map_or(pace.events, |n| n as usize),
            gap: json["stream_gap_ms"]
                .as_u64()
                .map_or(pace.gap, Duration::from_millis),
        };
        let (tx, rx) = mpsc::channel(4);
        let open = OpenStream::new(ctl.clone());
        tokio::spawn(async move {
            // The whole guard moves into the task (not just the field it sets at the end).
            let mut open = open;
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
                // A reader that goes away is seen at once, not at the next event.
                tokio::select! {
                    _ = tokio::time::sleep(pace.gap) => {}
                    _ = tx.closed() => return,
                }
            }
            if tx
                .send(Bytes::from_static(b"data: [DONE]\n\n"))
                .await
                .is_ok()
            {
                open.finished = true;
            }
        });
        let mut resp = Response::new(ChannelBody { rx: Some(rx) });
        resp.headers_mut()
            .insert("content-type", "text/event-stream".parse().unwrap());
        return Ok(resp);
    }
    let answer = serde_json::json!({
        "backend": name, "path": path, "headers": headers, "destinations": destinations,
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

    /// `data` sent in 1 MiB frames, as a real server writes a large page.
    fn chunked(content_type: &str, data: Bytes) -> Response<ChannelBody> {
        let (tx, rx) = mpsc::channel(2);
        tokio::spawn(async move {
            for at in (0..data.len()).step_by(1 << 20) {
                let end = (at + (1 << 20)).min(data.len());
                if tx.send(data.slice(at..end)).await.is_err() {
                    return;
                }
            }
        });
        let mut resp = Response::new(ChannelBody { rx: Some(rx) });
        resp.headers_mut()
            .insert("content-type", content_type.parse().unwrap());
        resp
    }
}

/// A [`MetricsMode::Huge`] page: 30 MB of well-formed gauge lines.
fn huge_page() -> Bytes {
    static PAGE: OnceLock<Bytes> = OnceLock::new();
    PAGE.get_or_init(|| {
        let line = "vllm:num_requests_waiting{model_name=\"m\",replica=\"padding\"} 0\n";
        Bytes::from(line.repeat((30 << 20) / line.len() + 1))
    })
    .clone()
}

/// A [`MetricsMode::Garbage`] page.
const GARBAGE_PAGE: &[u8] = b"\xff\xfe\x00garbage {{{\n\x80\x81\x82\n\
vllm:num_requests_waiting{model_name=\"m\" NaN NaN\n\
vllm:kv_cache_usage_perc{model_name=\"m\"} not-a-number\n\
vllm:num_requests_running{model_name=\"m\",\xc3\x28=\"\xff\"} 1e999999\n\
}}}}\t\x01\x02 no newline at the end";

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

/// The variable that sets the Envoy worker count of the suite's stacks
/// (`cargo xtask test --workers N` sets it).
pub const WORKERS_ENV: &str = "INFERGATE_E2E_WORKERS";

/// Envoy workers when [`WORKERS_ENV`] is not set: more than one, so state a worker keeps to
/// itself shows.
const DEFAULT_WORKERS: u32 = 2;

/// The Envoy worker count (`--concurrency`) of every stack in the suite, except those of
/// tests that pin a count because workers are their subject: [`WORKERS_ENV`], or
/// [`DEFAULT_WORKERS`]. A value that is not a positive number fails the test that asks, so a
/// typo never silently runs another count.
pub fn workers() -> u32 {
    static WORKERS: OnceLock<u32> = OnceLock::new();
    *WORKERS.get_or_init(|| match std::env::var(WORKERS_ENV) {
        Err(std::env::VarError::NotPresent) => DEFAULT_WORKERS,
        Ok(v) => match v.trim().parse::<u32>() {
            Ok(n) if n > 0 => n,
            _ => panic!("{WORKERS_ENV}={v:?}: expected a positive number of Envoy workers"),
        },
        Err(e) => panic!("{WORKERS_ENV}: {e}"),
    })
}

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
        let named = [
            infergate_artefacts::WASM_ENV,
            infergate_artefacts::NATIVE_ENV,
        ]
        .iter()
        .any(|var| std::env::var_os(var).is_some_and(|v| module == std::path::Path::new(&v)));
        assert!(
            !named || module.is_file(),
            "{flavor} flavour: {} was named but does not exist",
            module.display()
        );
    }
    if unbuilt(flavor) {
        return None;
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

/// Whether `flavor`'s module is not built (then says so: the caller skips its test).
pub fn unbuilt(flavor: Flavor) -> bool {
    match flavor.artefact() {
        Some(module) if !module.is_file() => {
            eprintln!(
                "SKIPPED: {flavor} flavour needs {} (build it with `cargo xtask build`)",
                module.display()
            );
            true
        }
        _ => false,
    }
}

/// Which test backend answered a JSON request (the `backend` field of its answer).
pub fn answered_by(resp: &infergate_harness::launch::client::HttpResponse) -> String {
    let json = resp.json().unwrap();
    json["backend"].as_str().unwrap_or_default().to_string()
}
