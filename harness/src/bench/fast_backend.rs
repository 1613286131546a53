//! A backend that answers immediately, for proxy-overhead runs: every `POST` is read to the
//! end and answered with one small non-streamed chat completion; `GET /metrics` serves a
//! constant vLLM page of an idle replica (so the gateway's scraper keeps a fresh snapshot
//! and the picker never rejects for stale metrics); `GET /health` answers 200.
//!
//! One process serves several "replicas" (one listener each), because the gateway pools
//! need distinct endpoints. It counts requests and request-body bytes, so a run can check
//! that every proxy forwarded the whole body.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Result;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

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

/// A running fast backend; dropping it stops accepting connections.
#[derive(Debug)]
pub struct FastBackend {
    addrs: Vec<SocketAddr>,
    counters: Arc<Counters>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl FastBackend {
    /// Starts `replicas` listeners on kernel-chosen loopback ports.
    pub async fn start(replicas: usize) -> Result<FastBackend> {
        let counters = Arc::new(Counters::default());
        let (shutdown, rx) = watch::channel(false);
        let mut addrs = Vec::with_capacity(replicas);
        let mut tasks = Vec::with_capacity(replicas);
        for _ in 0..replicas.max(1) {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
            addrs.push(listener.local_addr()?);
            tasks.push(tokio::spawn(accept_loop(
                listener,
                counters.clone(),
                rx.clone(),
            )));
        }
        Ok(FastBackend {
            addrs,
            counters,
            shutdown,
            tasks,
        })
    }

    /// The listeners' addresses.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Requests and bytes seen so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
}

impl Drop for FastBackend {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    counters: Arc<Counters>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        let _ = stream.set_nodelay(true);
        let counters = counters.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(counters.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    counters: Arc<Counters>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            counters.scrapes.fetch_add(1, Ordering::Relaxed);
            (StatusCode::OK, "text/plain; version=0.0.4", METRICS_PAGE)
        }
        (&Method::GET, "/health") => (StatusCode::OK, "text/plain", ""),
        (&Method::POST, _) => {
            let bytes = req.into_body().collect().await?.to_bytes();
            counters.posts.fetch_add(1, Ordering::Relaxed);
            counters
                .body_bytes
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            (StatusCode::OK, "application/json", COMPLETION_JSON)
        }
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found"),
    };
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    Ok(resp)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::launch::client;

    #[tokio::test]
    async fn answers_posts_metrics_and_counts_bytes() {
        let backend = FastBackend::start(2).await.unwrap();
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
