//! The backend of `bench overhead`, which answers at once so a run measures Envoy and the
//! filters, not an engine: one small chat completion per `POST` ([`COMPLETION_JSON`]), a
//! constant idle vLLM `/metrics` page ([`METRICS_PAGE`], so the gateway's scraper keeps a
//! fresh snapshot), `/health`, and a streamed
//! answer for requests carrying [`STREAM_HEADER`]: one content chunk of vLLM's shape per
//! token the body's `max_tokens` asks for ([`STREAM_CHUNKS`] when it names none, at most
//! [`MAX_STREAM_CHUNKS`]), the first with the response headers at once, each next one at
//! least [`CHUNK_GAP`] later, then `data: [DONE]` right after the last (as vLLM sends its
//! usage-only chunk and `[DONE]` with the last token, so a stream with usage takes no
//! longer than one without).
//!
//! Like vLLM, a stream carries usage only when the body asks for it: with
//! `"include_usage":true` a usage-only chunk before `[DONE]`, and with
//! `"continuous_usage_stats":true` as well the running usage on every chunk. The bench's
//! clients never ask, so only a gateway that forces usage on (the tenancy arms) gets it;
//! the backend counts those streams.
//!
//! The header, not the body, says "stream", so the non-streamed answer costs what the fast
//! backend's does: the body is searched only for streamed requests.

use std::convert::Infallible;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use memchr::memmem;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Sleep;

use crate::launch::DEFAULT_MODEL;

/// The answer to every `POST`: a finished chat completion of one token.
pub const COMPLETION_JSON: &str = concat!(
    r#"{"id":"cmpl-bench","object":"chat.completion","created":0,"model":"sim-model","#,
    r#""choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"#,
    r#""finish_reason":"stop"}],"usage":{"prompt_tokens":8000,"completion_tokens":1,"#,
    r#""total_tokens":8001,"prompt_tokens_details":{"cached_tokens":0}}}"#
);

/// The `/metrics` page: an idle vLLM replica (nothing waiting or running, 10% KV in use).
pub const METRICS_PAGE: &str = "\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"sim-model\"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine=\"0\",model_name=\"sim-model\"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"sim-model\"} 0.1
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"10000\"} 1.0
";

/// What the backend has seen so far.
#[derive(Debug, Default)]
pub struct Counters {
    /// `POST` requests answered.
    pub posts: AtomicU64,
    /// Bytes of `POST` bodies received.
    pub body_bytes: AtomicU64,
    /// `GET /metrics` answered.
    pub scrapes: AtomicU64,
}

/// The request header that asks for the streamed answer.
pub const STREAM_HEADER: &str = "x-bench-stream";

/// Content chunks of a streamed answer whose body names no `max_tokens`, and the bench's
/// default (`bench overhead --stream-chunks`).
pub const STREAM_CHUNKS: u32 = 20;

/// The most content chunks one streamed answer has, whatever `max_tokens` asks.
pub const MAX_STREAM_CHUNKS: u32 = 4096;

/// The least time between two chunks of a streamed answer: an engine's inter-token time,
/// shortened. Tokio's timer rounds a sleep up past its next millisecond tick, so chunks
/// come about 2 ms apart and a stream of 20 lasts about 40 ms. The first chunk leaves with
/// the headers.
pub const CHUNK_GAP: Duration = Duration::from_millis(1);

/// Streamed answers and how many of them had usage forced on.
#[derive(Debug, Default)]
pub struct StreamCounters {
    /// Streamed answers started.
    pub streams: AtomicU64,
    /// Of those, bodies that asked for `include_usage` (a gateway forced it on).
    pub usage_forced: AtomicU64,
}

/// A running backend; dropping it stops accepting connections.
#[derive(Debug)]
pub struct BenchBackend {
    addrs: Vec<SocketAddr>,
    counters: Arc<Counters>,
    streams: Arc<StreamCounters>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

#[derive(Clone, Debug)]
struct Shared {
    counters: Arc<Counters>,
    streams: Arc<StreamCounters>,
}

impl BenchBackend {
    /// Starts `replicas` listeners on kernel-chosen loopback ports.
    pub async fn start(replicas: usize) -> Result<BenchBackend> {
        let shared = Shared {
            counters: Arc::new(Counters::default()),
            streams: Arc::new(StreamCounters::default()),
        };
        let (shutdown, rx) = watch::channel(false);
        let mut addrs = Vec::with_capacity(replicas);
        let mut tasks = Vec::with_capacity(replicas);
        for _ in 0..replicas.max(1) {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
            addrs.push(listener.local_addr()?);
            tasks.push(tokio::spawn(accept_loop(
                listener,
                shared.clone(),
                rx.clone(),
            )));
        }
        Ok(BenchBackend {
            addrs,
            counters: shared.counters,
            streams: shared.streams,
            shutdown,
            tasks,
        })
    }

    /// The listeners' addresses.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Requests and bytes seen so far (streamed ones included).
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Streamed answers so far.
    pub fn streams(&self) -> &StreamCounters {
        &self.streams
    }
}

impl Drop for BenchBackend {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Shared, mut shutdown: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(shared.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(shared: Shared, req: Request<Incoming>) -> Result<Response<Answer>, hyper::Error> {
    let streamed = req.headers().contains_key(STREAM_HEADER);
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            shared.counters.scrapes.fetch_add(1, Ordering::Relaxed);
            (
                StatusCode::OK,
                "text/plain; version=0.0.4",
                Answer::whole(METRICS_PAGE),
            )
        }
        (&Method::GET, "/health") => (StatusCode::OK, "text/plain", Answer::whole("")),
        (&Method::POST, _) => {
            let bytes = req.into_body().collect().await?.to_bytes();
            let c = &shared.counters;
            c.posts.fetch_add(1, Ordering::Relaxed);
            c.body_bytes
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            if streamed {
                let usage = UsageAsked::of(&bytes);
                let tokens = stream_tokens(&bytes);
                shared.streams.streams.fetch_add(1, Ordering::Relaxed);
                if usage.include {
                    shared.streams.usage_forced.fetch_add(1, Ordering::Relaxed);
                }
                let prompt_tokens = bytes.len() as u64 / 4;
                (
                    StatusCode::OK,
                    "text/event-stream",
                    Answer::stream(sse_chunks(prompt_tokens, tokens, usage), tokens),
                )
            } else {
                (
                    StatusCode::OK,
                    "application/json",
                    Answer::whole(COMPLETION_JSON),
                )
            }
        }
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            Answer::whole("not found"),
        ),
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    Ok(resp)
}

/// The usage a request body asks for (`stream_options`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct UsageAsked {
    include: bool,
    continuous: bool,
}

impl UsageAsked {
    /// Looks for the flags as a gateway writes them (compact JSON); a client that spaced
    /// them out would get no usage, which the bench's clients never ask for anyway.
    fn of(body: &[u8]) -> UsageAsked {
        let has = |needle: &[u8]| memmem::find(body, needle).is_some();
        let include = has(b"\"include_usage\":true");
        UsageAsked {
            include,
            continuous: include && has(b"\"continuous_usage_stats\":true"),
        }
    }
}

/// The content chunks a streamed answer to `body` has: its `max_tokens`, else
/// [`STREAM_CHUNKS`], within 1 and [`MAX_STREAM_CHUNKS`].
fn stream_tokens(body: &[u8]) -> u32 {
    max_tokens(body)
        .unwrap_or(STREAM_CHUNKS)
        .clamp(1, MAX_STREAM_CHUNKS)
}

/// The `max_tokens` a request body asks for, as the bench writes it (compact JSON).
fn max_tokens(body: &[u8]) -> Option<u32> {
    const KEY: &[u8] = b"\"max_tokens\":";
    let at = memmem::find(body, KEY)? + KEY.len();
    let digits = body[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&body[at..at + digits])
        .ok()?
        .parse()
        .ok()
}

/// The chunks of one streamed answer of `tokens` content chunks, each one `data:` event,
/// `[DONE]` last.
fn sse_chunks(prompt_tokens: u64, tokens: u32, usage: UsageAsked) -> Vec<Bytes> {
    let fields = |completion: u64| {
        format!(
            r#""prompt_tokens":{prompt_tokens},"total_tokens":{},"completion_tokens":{completion}"#,
            prompt_tokens + completion
        )
    };
    let head = format!(
        r#"data: {{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":0,"model":"{DEFAULT_MODEL}","choices":["#
    );
    let last = u64::from(tokens);
    let mut out = Vec::new();
    for i in 1..=last {
        let finish = if i == last { r#""stop""# } else { "null" };
        let running = if usage.continuous {
            format!(r#","usage":{{{}}}"#, fields(i))
        } else {
            String::new()
        };
        out.push(Bytes::from(format!(
            "{head}{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}},\"logprobs\":null,\
             \"finish_reason\":{finish}}}]{running}}}\n\n"
        )));
    }
    if usage.include {
        out.push(Bytes::from(format!(
            "{head}],\"usage\":{{{},\"prompt_tokens_details\":{{\"cached_tokens\":0}}}}}}\n\n",
            fields(last)
        )));
    }
    out.push(Bytes::from_static(b"data: [DONE]\n\n"));
    out
}

/// A response body: one buffer, or chunks the first `gaps + 1` of which are paced
/// [`CHUNK_GAP`] apart, the rest following the last of those at once.
pub struct Answer {
    chunks: std::vec::IntoIter<Bytes>,
    /// A stream (no length known up front).
    streamed: bool,
    /// Gaps still to wait, one after each of the next chunks.
    gaps: usize,
    /// The wait before the next chunk (none before the first).
    gap: Option<Pin<Box<Sleep>>>,
}

impl Answer {
    fn whole(text: &'static str) -> Answer {
        Answer {
            chunks: vec![Bytes::from_static(text.as_bytes())].into_iter(),
            streamed: false,
            gaps: 0,
            gap: None,
        }
    }

    /// A stream whose first `tokens` chunks are paced (the rest, usage and `[DONE]`,
    /// follow the last of them at once).
    fn stream(chunks: Vec<Bytes>, tokens: u32) -> Answer {
        Answer {
            chunks: chunks.into_iter(),
            streamed: true,
            gaps: tokens.saturating_sub(1) as usize,
            gap: None,
        }
    }
}

impl Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(gap) = this.gap.as_mut() {
            if gap.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.gap = None;
        }
        match this.chunks.next() {
            Some(chunk) => {
                if this.gaps > 0 && this.chunks.len() > 0 {
                    this.gaps -= 1;
                    this.gap = Some(Box::pin(tokio::time::sleep(CHUNK_GAP)));
                }
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.len() == 0 && self.gap.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        if self.streamed {
            return SizeHint::default();
        }
        let len: usize = self.chunks.as_slice().iter().map(Bytes::len).sum();
        SizeHint::with_exact(len as u64)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::launch::client;

    #[test]
    fn usage_is_sent_only_when_asked_and_every_chunk_is_json() {
        for (body, want) in [
            (
                &br#"{"model":"m","stream":true}"#[..],
                UsageAsked::default(),
            ),
            (
                br#"{"stream_options":{"include_usage":true},"stream":true}"#,
                UsageAsked {
                    include: true,
                    continuous: false,
                },
            ),
            (
                br#"{"stream_options":{"include_usage":true,"continuous_usage_stats":true}}"#,
                UsageAsked {
                    include: true,
                    continuous: true,
                },
            ),
        ] {
            let asked = UsageAsked::of(body);
            assert_eq!(asked, want);
            let chunks = sse_chunks(100, STREAM_CHUNKS, asked);
            let extra = usize::from(asked.include);
            assert_eq!(chunks.len(), STREAM_CHUNKS as usize + 1 + extra);
            let mut last_usage = None;
            for c in &chunks[..chunks.len() - 1] {
                let text = std::str::from_utf8(c).unwrap();
                let json = text
                    .strip_prefix("data: ")
                    .unwrap()
                    .strip_suffix("\n\n")
                    .unwrap();
                let v: serde_json::Value = serde_json::from_str(json).unwrap();
                assert_eq!(
                    v["usage"].is_object(),
                    asked.continuous || v["choices"] == serde_json::json!([])
                );
                if v["usage"].is_object() {
                    last_usage = Some(v["usage"].clone());
                }
            }
            if asked.include {
                let u = last_usage.unwrap();
                assert_eq!(u["completion_tokens"], u64::from(STREAM_CHUNKS));
                assert_eq!(u["total_tokens"], 100 + u64::from(STREAM_CHUNKS));
                assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 0);
            }
            assert_eq!(&chunks[chunks.len() - 1][..], b"data: [DONE]\n\n");
        }
    }

    #[tokio::test]
    async fn streams_on_the_header_and_answers_json_without_it() {
        let backend = BenchBackend::start(1).await.unwrap();
        let url = format!("http://{}/v1/chat/completions", backend.addrs()[0]);
        let body = serde_json::json!({"model": "m", "stream": true});
        let r = client::post_json(&url, &body, &[]).await.unwrap();
        assert_eq!(r.json().unwrap()["usage"]["completion_tokens"], 1);
        let r = client::post_json(&url, &body, &[(STREAM_HEADER, "1")])
            .await
            .unwrap();
        let text = r.text();
        assert_eq!(text.matches("data: ").count(), STREAM_CHUNKS as usize + 1);
        assert!(!text.contains("usage"), "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"));
        assert_eq!(backend.streams().usage_forced.load(Ordering::Relaxed), 0);
        // Usage asked: the usage-only chunk, and no gap more than without it.
        let forced = serde_json::json!({"stream_options": {"include_usage": true}});
        let started = std::time::Instant::now();
        let r = client::post_json(&url, &forced, &[(STREAM_HEADER, "1")])
            .await
            .unwrap();
        assert!(started.elapsed() >= CHUNK_GAP * (STREAM_CHUNKS - 1));
        assert_eq!(r.text().matches("\"usage\"").count(), 1, "{}", r.text());
        assert_eq!(backend.streams().usage_forced.load(Ordering::Relaxed), 1);
        assert_eq!(backend.streams().streams.load(Ordering::Relaxed), 2);
        assert_eq!(backend.counters().posts.load(Ordering::Relaxed), 3);
        // A body's `max_tokens` sets how many content chunks it gets, within the bound.
        for (asked, chunks) in [(3, 3), (1, 1), (0, 1)] {
            let body = serde_json::json!({"stream": true, "max_tokens": asked});
            let r = client::post_json(&url, &body, &[(STREAM_HEADER, "1")])
                .await
                .unwrap();
            assert_eq!(
                r.text().matches("data: ").count(),
                chunks as usize + 1,
                "{asked}"
            );
        }
    }

    #[test]
    fn max_tokens_is_read_from_compact_json() {
        assert_eq!(
            max_tokens(br#"{"model":"m","max_tokens":200,"stream":true}"#),
            Some(200)
        );
        assert_eq!(max_tokens(br#"{"max_tokens":7}"#), Some(7));
        assert_eq!(max_tokens(br#"{"stream":true}"#), None);
        assert_eq!(max_tokens(br#"{"max_tokens":"x"}"#), None);
        assert_eq!(max_tokens(br#"{"max_tokens":99999999999}"#), None);
        assert_eq!(stream_tokens(br#"{"max_tokens":200}"#), 200);
        assert_eq!(stream_tokens(br#"{"max_tokens":0}"#), 1);
        assert_eq!(stream_tokens(br#"{"max_tokens":5000}"#), MAX_STREAM_CHUNKS);
        assert_eq!(stream_tokens(br#"{"stream":true}"#), STREAM_CHUNKS);
    }

    #[tokio::test]
    async fn only_content_chunks_are_paced() {
        use http_body_util::BodyExt;
        let chunks = sse_chunks(
            10,
            STREAM_CHUNKS,
            UsageAsked {
                include: true,
                continuous: true,
            },
        );
        let total = chunks.len();
        let mut body = Answer::stream(chunks, STREAM_CHUNKS);
        let start = std::time::Instant::now();
        let mut arrivals = Vec::new();
        while let Some(frame) = body.frame().await {
            assert!(frame.unwrap().is_data());
            arrivals.push(start.elapsed());
        }
        assert_eq!(arrivals.len(), total);
        let last_content = STREAM_CHUNKS as usize - 1;
        assert!(arrivals[0] < CHUNK_GAP, "the first chunk is not paced");
        assert!(arrivals[last_content] >= CHUNK_GAP * (STREAM_CHUNKS - 1));
        // The usage-only chunk and [DONE] come with the last content chunk, no gap after it.
        assert!(arrivals[total - 1] - arrivals[last_content] < CHUNK_GAP);
    }

    #[tokio::test]
    async fn answers_posts_metrics_and_counts_bytes() {
        let backend = BenchBackend::start(2).await.unwrap();
        assert_eq!(backend.addrs().len(), 2);
        let a = backend.addrs()[1];
        let m = client::get(&format!("http://{a}/metrics")).await.unwrap();
        assert_eq!(m.status, 200);
        assert!(m.text().contains("vllm:kv_cache_usage_perc"));
        let body = serde_json::json!({"model": "sim-model", "messages": []});
        let r = client::post_json(&format!("http://{a}/v1/chat/completions"), &body, &[])
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.json().unwrap()["usage"]["completion_tokens"], 1);
        let c = backend.counters();
        assert_eq!(c.posts.load(Ordering::Relaxed), 1);
        assert_eq!(
            c.body_bytes.load(Ordering::Relaxed),
            body.to_string().len() as u64
        );
        assert_eq!(c.scrapes.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn metrics_page_parses_with_the_core_parser() {
        use scheduler_core::metrics::{extract, MetricNames};
        let m = extract(METRICS_PAGE.as_bytes(), &MetricNames::default());
        assert_eq!((m.waiting, m.running), (Some(0), Some(0)));
        assert_eq!(m.kv_cache_usage, Some(0.1));
        assert_eq!(
            m.cache.map(|c| (c.block_size, c.num_blocks)),
            Some((16, 10_000))
        );
    }
}
