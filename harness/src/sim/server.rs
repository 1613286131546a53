//! The HTTP surface of one replica (hyper 1, HTTP/1.1): vLLM's OpenAI routes, `/metrics`
//! and `/health`. Streams are produced chunk by chunk as the engine generates tokens; a
//! client that goes away drops the body, which cancels the request and frees its blocks.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::config::SimConfig;
use super::driver::{EngineHandle, RequestEvent, SubmitFailed};
use super::engine::{EngineRequest, RequestId, SubmitError, Usage};
use super::metrics;
use super::prompt::{self, ApiKind, ParsedRequest};
use super::responses::{error_body, sse, ResponseMeta, SSE_DONE};
use super::text;

/// Header naming the replica index that served a response.
pub const REPLICA_HEADER: &str = "x-infergate-replica";
/// Header with the `ip:port` of the replica that served a response.
pub const REPLICA_ADDR_HEADER: &str = "x-infergate-replica-addr";

/// Shared state of one replica's listener.
#[derive(Debug)]
pub struct Replica {
    /// Index in the pool.
    pub index: usize,
    /// Bound address.
    pub addr: SocketAddr,
    /// The engine task.
    pub engine: EngineHandle,
    /// Pool configuration.
    pub cfg: Arc<SimConfig>,
    next_request: AtomicU64,
}

impl Replica {
    /// State for replica `index` listening on `addr`.
    pub fn new(index: usize, addr: SocketAddr, engine: EngineHandle, cfg: Arc<SimConfig>) -> Self {
        Self {
            index,
            addr,
            engine,
            cfg,
            next_request: AtomicU64::new(1),
        }
    }
}

/// The response body: a whole buffer or a live token stream.
pub enum SimBody {
    /// A complete body, sent once.
    Full(Option<Bytes>),
    /// A server-sent-events stream fed by the engine.
    Stream(Box<TokenStream>),
}

impl Body for SimBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            SimBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            SimBody::Stream(s) => s.poll_next(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, SimBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            SimBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            SimBody::Full(None) => SizeHint::with_exact(0),
            SimBody::Stream(_) => SizeHint::default(),
        }
    }
}

/// Cancels the engine request when dropped before it finished.
struct CancelGuard {
    engine: EngineHandle,
    id: RequestId,
    finished: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.engine.cancel(self.id);
        }
    }
}

/// What shapes the text of one completion.
struct Generation {
    meta: ResponseMeta,
    seed: u64,
    output_tokens: u32,
    finish_reason: &'static str,
    prompt_tokens: u32,
}

impl Generation {
    fn finish_for(&self, index: u32) -> Option<&'static str> {
        (index + 1 >= self.output_tokens).then_some(self.finish_reason)
    }
}

/// A live SSE stream.
pub struct TokenStream {
    rx: mpsc::UnboundedReceiver<RequestEvent>,
    guard: CancelGuard,
    gen: Generation,
    include_usage: bool,
    continuous_usage: bool,
    pending: VecDeque<Bytes>,
    done: bool,
    /// Pre-rendered head and tail of a plain content chunk.
    template: (String, String),
}

impl TokenStream {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        loop {
            if let Some(b) = self.pending.pop_front() {
                return Poll::Ready(Some(b));
            }
            if self.done {
                return Poll::Ready(None);
            }
            match self.rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => self.done = true,
                Poll::Ready(Some(ev)) => self.on_event(ev),
            }
        }
    }

    fn on_event(&mut self, ev: RequestEvent) {
        let g = &self.gen;
        match ev {
            RequestEvent::Token {
                index,
                cached_tokens,
            } => {
                let running = Usage {
                    prompt_tokens: g.prompt_tokens,
                    completion_tokens: index + 1,
                    cached_tokens,
                };
                let usage = self.continuous_usage.then_some(&running);
                if index == 0 && g.meta.kind == ApiKind::Chat {
                    let zero = Usage {
                        completion_tokens: 0,
                        ..running
                    };
                    let u = self.continuous_usage.then_some(&zero);
                    self.pending.push_back(sse(&g.meta.role_chunk(u)));
                }
                let text = text::token_text(g.seed, index);
                let finish = g.finish_for(index);
                if finish.is_none() && usage.is_none() {
                    let (head, tail) = &self.template;
                    let mut b = String::with_capacity(head.len() + text.len() + tail.len());
                    b.push_str(head);
                    b.push_str(text);
                    b.push_str(tail);
                    self.pending.push_back(Bytes::from(b));
                } else {
                    let chunk = g.meta.content_chunk(text, finish, usage);
                    self.pending.push_back(sse(&chunk));
                }
            }
            RequestEvent::Finished(usage) => {
                self.guard.finished = true;
                if self.include_usage {
                    self.pending.push_back(sse(&g.meta.usage_chunk(&usage)));
                }
                self.pending.push_back(Bytes::from_static(SSE_DONE));
                self.done = true;
            }
        }
    }
}

/// Serves one HTTP request.
pub async fn handle(replica: Arc<Replica>, req: Request<Incoming>) -> Response<SimBody> {
    let mut resp = route(&replica, req).await;
    let h = resp.headers_mut();
    h.insert(REPLICA_HEADER, HeaderValue::from(replica.index as u64));
    if let Ok(v) = HeaderValue::from_str(&replica.addr.to_string()) {
        h.insert(REPLICA_ADDR_HEADER, v);
    }
    resp
}

async fn route(replica: &Arc<Replica>, req: Request<Incoming>) -> Response<SimBody> {
    let path = req.uri().path().to_string();
    match (req.method(), path.as_str()) {
        (&Method::POST, "/v1/chat/completions") => completion(replica, ApiKind::Chat, req).await,
        (&Method::POST, "/v1/completions") => completion(replica, ApiKind::Completions, req).await,
        (&Method::GET, "/v1/models") => json_response(StatusCode::OK, &models(&replica.cfg)),
        (&Method::GET, "/metrics") => metrics_page(replica).await,
        (&Method::GET, "/health") => full(StatusCode::OK, "text/plain", Bytes::new()),
        (_, "/v1/chat/completions" | "/v1/completions" | "/v1/models" | "/metrics" | "/health") => {
            error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed", None)
        }
        _ => error(StatusCode::NOT_FOUND, &format!("no route for {path}"), None),
    }
}

fn models(cfg: &SimConfig) -> Value {
    let base = cfg.base_model();
    let mut data: Vec<Value> = cfg
        .models
        .iter()
        .map(|m| json!({"id": m, "object": "model", "owned_by": "vllm", "root": m, "parent": null}))
        .collect();
    data.extend(cfg.loras.iter().map(
        |l| json!({"id": l, "object": "model", "owned_by": "vllm", "root": l, "parent": base}),
    ));
    json!({"object": "list", "data": data})
}

async fn metrics_page(replica: &Replica) -> Response<SimBody> {
    match replica.engine.stats().await {
        Ok(stats) => {
            let stamp = unix_secs_f64();
            let page = metrics::render(&stats, replica.cfg.base_model(), stamp);
            full(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                Bytes::from(page),
            )
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string(), None),
    }
}

async fn completion(
    replica: &Arc<Replica>,
    kind: ApiKind,
    req: Request<Incoming>,
) -> Response<SimBody> {
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("body: {e}"), None),
    };
    let parsed = match prompt::parse(kind, &body) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.message, e.param),
    };
    let cfg = &replica.cfg;
    let lora = if cfg.models.contains(&parsed.model) {
        None
    } else if cfg.loras.contains(&parsed.model) {
        Some(parsed.model.clone())
    } else {
        let msg = format!("The model `{}` does not exist.", parsed.model);
        return error(StatusCode::NOT_FOUND, &msg, Some("model"));
    };
    let (output_tokens, finish_reason) = match plan_output(cfg, &parsed) {
        Ok(x) => x,
        Err(msg) => return error(StatusCode::BAD_REQUEST, &msg, Some("max_tokens")),
    };
    let seed = prompt::model_seed(&parsed.model, parsed.cache_salt.as_deref());
    let engine_req = EngineRequest {
        prompt_tokens: parsed.prompt_tokens,
        block_hashes: prompt::block_hashes(seed, &parsed.prompt, cfg.engine.block_size),
        output_tokens,
        lora,
    };
    let (id, rx) = match replica.engine.submit(engine_req).await {
        Ok(x) => x,
        Err(e) => {
            let msg = match e.downcast_ref::<SubmitFailed>() {
                Some(SubmitFailed(SubmitError::TooLong {
                    max_model_len,
                    requested,
                })) => format!(
                    "This model's maximum context length is {max_model_len} tokens. However, you requested {requested} tokens ({} in the messages, {output_tokens} in the completion). Please reduce the length of the messages or completion.",
                    parsed.prompt_tokens
                ),
                _ => e.to_string(),
            };
            return error(StatusCode::BAD_REQUEST, &msg, None);
        }
    };
    let n = replica.next_request.fetch_add(1, Ordering::Relaxed);
    let prefix = match kind {
        ApiKind::Chat => "chatcmpl",
        ApiKind::Completions => "cmpl",
    };
    let gen = Generation {
        meta: ResponseMeta {
            kind,
            id: format!("{prefix}-sim{}-{n}", replica.index),
            created: unix_secs_f64() as u64,
            model: parsed.model.clone(),
        },
        seed: text::output_seed(seed, &parsed.prompt),
        output_tokens,
        finish_reason,
        prompt_tokens: parsed.prompt_tokens,
    };
    let guard = CancelGuard {
        engine: replica.engine.clone(),
        id,
        finished: false,
    };
    if parsed.stream {
        let template = gen.meta.content_template();
        let stream = TokenStream {
            template,
            rx,
            guard,
            gen,
            include_usage: parsed.include_usage,
            continuous_usage: parsed.continuous_usage,
            pending: VecDeque::new(),
            done: false,
        };
        let mut resp = Response::new(SimBody::Stream(Box::new(stream)));
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        resp.headers_mut()
            .insert("cache-control", HeaderValue::from_static("no-cache"));
        return resp;
    }
    collect_full(rx, guard, gen).await
}

/// Decides how many tokens to generate and the finish reason.
fn plan_output(cfg: &SimConfig, p: &ParsedRequest) -> Result<(u32, &'static str), String> {
    let max_len = cfg.engine.effective_max_model_len();
    let room = max_len.saturating_sub(p.prompt_tokens);
    let natural = cfg.output_tokens.max(1);
    match (p.max_tokens, p.ignore_eos) {
        (Some(m), true) => Ok((m, "length")),
        (Some(m), false) if m <= natural => Ok((m, "length")),
        (Some(_), false) => Ok((natural, "stop")),
        (None, _) if room == 0 => Err(format!(
            "This model's maximum context length is {max_len} tokens. However, your prompt has {} tokens.",
            p.prompt_tokens
        )),
        (None, _) if room < natural => Ok((room, "length")),
        (None, _) => Ok((natural, "stop")),
    }
}

async fn collect_full(
    mut rx: mpsc::UnboundedReceiver<RequestEvent>,
    mut guard: CancelGuard,
    gen: Generation,
) -> Response<SimBody> {
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            RequestEvent::Token { index, .. } => text.push_str(text::token_text(gen.seed, index)),
            RequestEvent::Finished(usage) => {
                guard.finished = true;
                let body = gen.meta.full(&text, gen.finish_reason, &usage);
                return json_response(StatusCode::OK, &body);
            }
        }
    }
    error(StatusCode::INTERNAL_SERVER_ERROR, "engine stopped", None)
}

fn unix_secs_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn full(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<SimBody> {
    let mut resp = Response::new(SimBody::Full(Some(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn json_response(status: StatusCode, v: &Value) -> Response<SimBody> {
    full(status, "application/json", Bytes::from(v.to_string()))
}

fn error(status: StatusCode, message: &str, param: Option<&str>) -> Response<SimBody> {
    json_response(status, &error_body(status.as_u16(), message, param))
}
