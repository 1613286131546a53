//! The HTTP surface of one replica (hyper 1, HTTP/1.1): vLLM's OpenAI routes, `/metrics`
//! and `/health`. Streams are produced chunk by chunk as the engine generates tokens; a
//! client that goes away drops the body, which cancels the request and frees its blocks.
//!
//! A request with several choices (`n`, or a `/v1/completions` batch of prompts) is one
//! engine request per choice, submitted together: the choices of one prompt hash the same
//! prompt blocks (so the prefix cache holds them once), each draws its own text, and the answer counts
//! every prompt once and every choice's completion tokens, in its usage and in the served
//! ledger. A disaggregated request's prefiller computes the first prompt of a batch; the
//! others are computed here.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::arrivals::ArrivalLog;
use super::config::{SimConfig, DETERMINISTIC_CREATED};
use super::control;
use super::disagg::{self, Prefill};
use super::driver::{EngineHandle, RequestEvent, SubmitFailed};
use super::engine::{EngineRequest, SubmitError};
use super::kv_events::KvEventsControl;
use super::metrics;
use super::prompt::{self, ApiKind, ParsedRequest};
use super::responses::{error_body, ResponseMeta};
use super::served::{ServedKey, ServedLedger, FAIRNESS_ID_HEADER};
use super::stream::{CancelGuard, Choice, Generation, SimBody, StreamUsage, TokenStream};
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
    /// What this replica's responses delivered.
    pub ledger: ServedLedger,
    /// The pool's arrival log (shared with the other replicas).
    pub arrivals: ArrivalLog,
    /// What `GET /health` answers: 200 while set, 503 once cleared (a test makes a replica
    /// fail a load balancer's active health check with it; nothing else changes).
    pub healthy: Arc<AtomicBool>,
    /// The KV event publisher's controls, when events are on.
    pub kv_events: Option<Arc<KvEventsControl>>,
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
            ledger: ServedLedger::default(),
            arrivals: ArrivalLog::default(),
            healthy: Arc::new(AtomicBool::new(true)),
            kv_events: None,
            next_request: AtomicU64::new(1),
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
        (&Method::POST, "/tokenize") => control::tokenize(replica, req).await,
        (&Method::POST, "/reset_prefix_cache") => control::reset_prefix_cache(replica).await,
        (&Method::GET, "/sim/kv_events") => {
            control::kv_events(replica, "", req.uri().query().unwrap_or("")).await
        }
        (&Method::POST, p) if p.starts_with("/sim/kv_events/") => {
            let action = p.trim_start_matches("/sim/kv_events/");
            control::kv_events(replica, action, req.uri().query().unwrap_or("")).await
        }
        (&Method::GET, "/sim/slowdown") => control::slowdown(replica, false, "").await,
        (&Method::POST, "/sim/slowdown") => {
            control::slowdown(replica, true, req.uri().query().unwrap_or("")).await
        }
        (&Method::GET, "/health") if replica.healthy.load(Ordering::Relaxed) => {
            full(StatusCode::OK, "text/plain", Bytes::new())
        }
        (&Method::GET, "/health") => full(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            Bytes::from_static(b"unhealthy"),
        ),
        (
            _,
            "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/models"
            | "/metrics"
            | "/health"
            | "/sim/slowdown",
        ) => error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed", None),
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
            let mut page = metrics::render(&stats, replica.cfg.base_model(), stamp);
            metrics::render_served(&mut page, &replica.ledger.snapshot());
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
    replica.arrivals.record(replica.index, req.headers());
    let fairness_id = req
        .headers()
        .get(FAIRNESS_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let prefiller = disagg::prefiller(req.headers(), replica.addr);
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
    let seed = prompt::model_seed(&parsed.model, parsed.cache_salt.as_deref());
    let max_len = cfg.engine.effective_max_model_len();
    // One engine request per choice: each prompt of a batch, `n` times, in vLLM's choice
    // order (a prompt's `n` choices, then the next prompt's).
    let mut planned: Vec<Planned> = Vec::new();
    let prompts = std::iter::once(&parsed.prompt).chain(&parsed.batch);
    for prompt_bytes in prompts {
        let prompt_tokens = prompt::prompt_tokens(prompt_bytes);
        let (output_tokens, finish_reason) = match plan_output(cfg, prompt_tokens, &parsed) {
            Ok(x) => x,
            Err(msg) => return error(StatusCode::BAD_REQUEST, &msg, Some("max_tokens")),
        };
        let prompt_seed = text::output_seed(seed, prompt_bytes);
        for j in 0..parsed.n {
            let output_seed = text::sequence_seed(prompt_seed, j);
            // A sequence longer than the model length is refused at submission: never
            // build more completion text than could fit after the prompt.
            let hashed_output = output_tokens.min(max_len.saturating_sub(prompt_tokens));
            let mut sequence = prompt_bytes.clone();
            sequence.extend_from_slice(text::completion(output_seed, hashed_output).as_bytes());
            let engine_req = EngineRequest {
                prompt_tokens,
                block_hashes: prompt::block_hashes(seed, &sequence, cfg.engine.block_size),
                output_tokens,
                lora: lora.clone(),
                priority: parsed.priority,
            };
            // The bytes are the KV events' token ids: kept only when events are published.
            let content: Option<Arc<[u8]>> = replica.kv_events.is_some().then(|| sequence.into());
            planned.push(Planned {
                choice: Choice {
                    seed: output_seed,
                    output_tokens,
                    finish_reason,
                    prompt_tokens,
                    counts_prompt: j == 0,
                },
                engine_req,
                content,
            });
        }
    }
    // A named prefiller computes the (first) prompt; the other prompts of a batch are
    // computed here.
    let prefill = match (&prefiller, planned.first()) {
        (Some(by), Some(first)) => {
            let blocks = prompt::block_hashes(seed, &parsed.prompt, cfg.engine.block_size);
            let import = disagg::Import {
                blocks,
                content: first.content.clone(),
                lora: first.engine_req.lora.clone(),
            };
            disagg::prefill_remotely(replica, by, kind, &body, parsed.prompt_tokens, import).await
        }
        _ => Prefill::Local,
    };
    let mut resp = submit(replica, kind, cfg, parsed, planned, seed, fairness_id).await;
    disagg::mark(&mut resp, replica.addr, &prefill);
    resp
}

/// One choice to generate: its engine request and how its text and usage are shaped.
struct Planned {
    choice: Choice,
    engine_req: EngineRequest,
    content: Option<Arc<[u8]>>,
}

/// Submits every choice's request to the engine and answers them (streamed or in full).
async fn submit(
    replica: &Arc<Replica>,
    kind: ApiKind,
    cfg: &SimConfig,
    parsed: ParsedRequest,
    planned: Vec<Planned>,
    seed: u64,
    fairness_id: String,
) -> Response<SimBody> {
    let mut guard = CancelGuard::new(replica.engine.clone(), Vec::new());
    let mut rxs = Vec::with_capacity(planned.len());
    let mut choices = Vec::with_capacity(planned.len());
    for p in planned {
        let (prompt_tokens, output_tokens) = (p.choice.prompt_tokens, p.choice.output_tokens);
        match replica
            .engine
            .submit_with_bytes(p.engine_req, p.content)
            .await
        {
            Ok((id, rx)) => {
                guard.requests.push((id, false));
                rxs.push(rx);
                choices.push(p.choice);
            }
            Err(e) => {
                // Those already submitted are cancelled with the guard.
                let msg = match e.downcast_ref::<SubmitFailed>() {
                    Some(SubmitFailed(SubmitError::TooLong {
                        max_model_len,
                        requested,
                    })) => format!(
                        "This model's maximum context length is {max_model_len} tokens. However, you requested {requested} tokens ({prompt_tokens} in the messages, {output_tokens} in the completion). Please reduce the length of the messages or completion."
                    ),
                    _ => e.to_string(),
                };
                return error(StatusCode::BAD_REQUEST, &msg, None);
            }
        }
    }
    let prefix = match kind {
        ApiKind::Chat => "chatcmpl",
        ApiKind::Completions => "cmpl",
    };
    let (id, created) = if cfg.deterministic {
        // 32 hex digits, as vLLM's random ids, from the prompt under the model's seed.
        let h = text::response_id_hash(seed, &parsed.prompt);
        (format!("{prefix}-{h:032x}"), DETERMINISTIC_CREATED)
    } else {
        let n = replica.next_request.fetch_add(1, Ordering::Relaxed);
        (
            format!("{prefix}-sim{}-{n}", replica.index),
            unix_secs_f64() as u64,
        )
    };
    let gen = Generation {
        meta: ResponseMeta::new(kind, id, created, parsed.model.clone()),
        choices,
        details: cfg.prompt_tokens_details,
        ledger: replica.ledger.clone(),
        key: ServedKey {
            fairness_id,
            model: parsed.model.clone(),
        },
    };
    if parsed.stream {
        let usage = StreamUsage::new(parsed.include_usage, parsed.continuous_usage, cfg.no_usage);
        let stream = TokenStream::new(rxs, guard, gen, usage);
        let mut resp = Response::new(SimBody::Stream(Box::new(stream)));
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        resp.headers_mut()
            .insert("cache-control", HeaderValue::from_static("no-cache"));
        return resp;
    }
    collect_full(rxs, guard, gen, !cfg.no_usage).await
}

/// Decides how many tokens to generate after a prompt of `prompt_tokens`, and the finish
/// reason.
fn plan_output(
    cfg: &SimConfig,
    prompt_tokens: u32,
    p: &ParsedRequest,
) -> Result<(u32, &'static str), String> {
    let max_len = cfg.engine.effective_max_model_len();
    let room = max_len.saturating_sub(prompt_tokens);
    let natural = cfg.output_tokens.max(1);
    match (p.max_tokens, p.ignore_eos) {
        (Some(m), true) => Ok((m, "length")),
        (Some(m), false) if m <= natural => Ok((m, "length")),
        (Some(_), false) => Ok((natural, "stop")),
        (None, _) if room == 0 => Err(format!(
            "This model's maximum context length is {max_len} tokens. However, your prompt has {prompt_tokens} tokens."
        )),
        (None, _) if room < natural => Ok((room, "length")),
        (None, _) => Ok((natural, "stop")),
    }
}

/// Waits for every token of every choice of a non-streamed request. Dropped before the end
/// (the client went away), the guard cancels the engine requests and the ledger records a
/// cut with nothing sent.
async fn collect_full(
    rxs: Vec<mpsc::UnboundedReceiver<RequestEvent>>,
    guard: CancelGuard,
    gen: Generation,
    report_usage: bool,
) -> Response<SimBody> {
    let mut pending = FullPending { guard, gen };
    let mut texts = vec![String::new(); rxs.len()];
    let mut usages = vec![None; rxs.len()];
    for (k, mut rx) in rxs.into_iter().enumerate() {
        let seed = pending.gen.choices.get(k).map_or(0, |c| c.seed);
        loop {
            match rx.recv().await {
                Some(RequestEvent::Token { index, .. }) => {
                    if let Some(t) = texts.get_mut(k) {
                        t.push_str(text::token_text(seed, index));
                    }
                }
                Some(RequestEvent::Finished(usage)) => {
                    pending.guard.finished(k);
                    if let Some(u) = usages.get_mut(k) {
                        *u = Some(usage);
                    }
                    break;
                }
                None => return error(StatusCode::INTERNAL_SERVER_ERROR, "engine stopped", None),
            }
        }
    }
    let g = &pending.gen;
    let total = g.total_usage(&usages);
    g.ledger
        .completed(&g.key, total.prompt_tokens, total.completion_tokens);
    let choices: Vec<(String, &str)> = texts
        .into_iter()
        .zip(&g.choices)
        .map(|(text, c)| (text, c.finish_reason))
        .collect();
    let usage = report_usage.then_some(&total);
    let body = g.meta.full(&choices, usage, g.details);
    full(StatusCode::OK, "application/json", Bytes::from(body))
}

/// A non-streamed request in progress: records a cut in the ledger if dropped unfinished.
struct FullPending {
    guard: CancelGuard,
    gen: Generation,
}

impl Drop for FullPending {
    fn drop(&mut self) {
        if !self.guard.all_finished() {
            let g = &self.gen;
            g.ledger.cut_off(&g.key, g.prompt_tokens(), 0);
        }
    }
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

pub(crate) fn json_response(status: StatusCode, v: &Value) -> Response<SimBody> {
    full(status, "application/json", Bytes::from(v.to_string()))
}

pub(crate) fn error(status: StatusCode, message: &str, param: Option<&str>) -> Response<SimBody> {
    json_response(status, &error_body(status.as_u16(), message, param))
}
