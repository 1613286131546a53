//! Routes beside vLLM's OpenAI surface: vLLM's `POST /tokenize` and
//! `POST /reset_prefix_cache`, and the simulator's KV event fault controls.
//!
//! - `POST /tokenize` (`{"model", "prompt"}` or `{"model", "messages", "add_generation_prompt"?}`)
//!   → `{"count", "max_model_len", "tokens", "token_strs": null}`: the simulator token model's
//!   ids (the prompt bytes the engine sees, in 4-byte little-endian chunks, the last one
//!   zero-padded), so `count` equals the prompt tokens a completion of the same body reports.
//! - `POST /reset_prefix_cache` forgets every cached block (published as `AllBlocksCleared`).
//! - `GET /sim/kv_events`: the publisher's counters ([`KvEventsStats`]) with the engine's
//!   truth: `prefix_cache_queries_tokens`, `prefix_cache_hits_tokens` (prompt tokens looked up
//!   and found cached at admission, as `vllm:prefix_cache_{queries,hits}`), `prompt_tokens`,
//!   `cached_blocks`, `evictions`.
//! - `POST /sim/kv_events/pause`, `POST /sim/kv_events/resume`,
//!   `POST /sim/kv_events/drop?count=N` (drop the next N messages; their sequence numbers are
//!   used, so a subscriber sees a gap). These answer 409 when events are off.

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};

use super::engine::cache_events::token_ids;
use super::kv_events::KvEventsStats;
use super::prompt::{self, ApiKind, GENERATION_PROMPT};
use super::server::{error, json_response, Replica};
use super::stream::SimBody;

/// `POST /tokenize`.
pub async fn tokenize(replica: &Replica, req: Request<Incoming>) -> Response<SimBody> {
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("body: {e}"), None),
    };
    match tokenize_body(replica, &body) {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err((status, msg, param)) => error(status, &msg, param),
    }
}

type Refusal = (StatusCode, String, Option<&'static str>);

fn tokenize_body(replica: &Replica, body: &Bytes) -> Result<Value, Refusal> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            format!("invalid JSON body: {e}"),
            None,
        )
    })?;
    let chat = v.get("messages").is_some();
    let kind = if chat {
        ApiKind::Chat
    } else {
        ApiKind::Completions
    };
    let parsed =
        prompt::parse(kind, body).map_err(|e| (StatusCode::BAD_REQUEST, e.message, e.param))?;
    let cfg = &replica.cfg;
    if !cfg.models.contains(&parsed.model) && !cfg.loras.contains(&parsed.model) {
        let msg = format!("The model `{}` does not exist.", parsed.model);
        return Err((StatusCode::NOT_FOUND, msg, Some("model")));
    }
    let mut bytes: &[u8] = &parsed.prompt;
    let add_generation_prompt = v
        .get("add_generation_prompt")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    if chat && !add_generation_prompt {
        bytes = bytes.strip_suffix(GENERATION_PROMPT).unwrap_or(bytes);
    }
    let tokens: Vec<u32> = token_ids(bytes).collect();
    Ok(json!({
        "count": tokens.len(),
        "max_model_len": cfg.engine.effective_max_model_len(),
        "tokens": tokens,
        "token_strs": null,
    }))
}

/// `POST /reset_prefix_cache`.
pub async fn reset_prefix_cache(replica: &Replica) -> Response<SimBody> {
    match replica.engine.reset_prefix_cache().await {
        Ok(()) => json_response(StatusCode::OK, &json!({"status": "ok"})),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string(), None),
    }
}

/// `GET|POST /sim/kv_events[/…]`.
pub async fn kv_events(replica: &Replica, action: &str, query: &str) -> Response<SimBody> {
    let Some(control) = &replica.kv_events else {
        return error(
            StatusCode::CONFLICT,
            "KV events are off (start the simulator with --kv-events-port-offset)",
            None,
        );
    };
    match action {
        "" => {}
        "pause" => control.pause(),
        "resume" => control.resume(),
        "drop" => {
            let count = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("count="))
                .and_then(|n| n.parse::<u64>().ok());
            match count {
                Some(n) => control.drop_next(n),
                None => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "drop needs ?count=N (N >= 0)",
                        Some("count"),
                    )
                }
            }
        }
        _ => return error(StatusCode::NOT_FOUND, &format!("no control {action}"), None),
    }
    let stats = match replica.engine.stats().await {
        Ok(s) => s,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string(), None),
    };
    json_response(StatusCode::OK, &stats_body(&control.stats(), &stats))
}

fn stats_body(kv: &KvEventsStats, engine: &super::engine::EngineStats) -> Value {
    let mut v = serde_json::to_value(kv).unwrap_or_else(|_| json!({}));
    if let Some(o) = v.as_object_mut() {
        let c = &engine.counters;
        o.insert(
            "prefix_cache_queries_tokens".into(),
            json!(c.prefix_queries_tokens),
        );
        o.insert(
            "prefix_cache_hits_tokens".into(),
            json!(c.prefix_hits_tokens),
        );
        o.insert("prompt_tokens".into(), json!(c.prompt_tokens));
        o.insert("cached_blocks".into(), json!(engine.cached_blocks));
        o.insert("evictions".into(), json!(engine.evictions));
    }
    v
}
