//! Routes beside vLLM's OpenAI surface: vLLM's `POST /tokenize` and
//! `POST /reset_prefix_cache`, the simulator's KV event fault controls and its slowdown
//! control.
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
//! - `POST /sim/slowdown?factor=F&delay_ms=D` slows this replica down (a throttled GPU):
//!   every engine step lasts `F` times longer (1 ≤ F ≤ 1000; 1 = configured speed), so its
//!   time to first token and its time per output token grow about F-fold, and every step
//!   that computes prompt tokens lasts `D` more simulated milliseconds (0 ≤ D ≤ 60 000), so
//!   the time to first token grows by at least D even for a cached prompt on an idle
//!   replica. Either parameter may be left out; the slowdown becomes exactly what is given,
//!   an absent parameter its neutral value (`?factor=1` restores the configured speed).
//!   Steps started after the call run at the new speed; the step in progress keeps its end.
//!   Answers the slowdown now in effect, `{"factor": F, "delay_ms": D}`; `GET /sim/slowdown`
//!   answers the same. A missing, unknown, repeated, non-numeric or out-of-range parameter
//!   answers 400 and changes nothing.

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};

use super::engine::cache_events::token_ids;
use super::engine::Slowdown;
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

/// `GET /sim/slowdown` (`set` false) or `POST /sim/slowdown?…` (`set` true).
pub async fn slowdown(replica: &Replica, set: bool, query: &str) -> Response<SimBody> {
    let answer = if set {
        match parse_slowdown(query) {
            Ok(s) => replica.engine.set_slowdown(s).await,
            Err((msg, param)) => return error(StatusCode::BAD_REQUEST, &msg, param),
        }
    } else {
        replica.engine.slowdown().await
    };
    match answer {
        Ok(s) => json_response(
            StatusCode::OK,
            &json!({"factor": s.factor(), "delay_ms": s.delay_ms()}),
        ),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string(), None),
    }
}

/// The slowdown a `POST /sim/slowdown` query asks for, or why it is refused (a message and
/// the parameter at fault).
fn parse_slowdown(query: &str) -> Result<Slowdown, (String, Option<&'static str>)> {
    let mut factor = None;
    let mut delay_ms = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let (slot, param) = match key {
            "factor" => (&mut factor, "factor"),
            "delay_ms" => (&mut delay_ms, "delay_ms"),
            _ => {
                let msg = format!("unknown parameter {key:?} (expected factor, delay_ms)");
                return Err((msg, None));
            }
        };
        if slot.is_some() {
            return Err((format!("{param} is given twice"), Some(param)));
        }
        let number = value.parse::<f64>().map_err(|_| {
            (
                format!("{param} must be a number, got {value:?}"),
                Some(param),
            )
        })?;
        *slot = Some(number);
    }
    if factor.is_none() && delay_ms.is_none() {
        let msg = format!(
            "slowdown needs ?factor=F (1 to {}) and/or ?delay_ms=D (0 to {})",
            Slowdown::MAX_FACTOR,
            Slowdown::MAX_DELAY_MS
        );
        return Err((msg, Some("factor")));
    }
    let neutral = Slowdown::NONE;
    Slowdown::new(
        factor.unwrap_or(neutral.factor()),
        delay_ms.unwrap_or(neutral.delay_ms()),
    )
    .map_err(|e| (e.message, Some(e.param)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn a_slowdown_query_sets_what_it_names_and_neutralises_the_rest() {
        let s = parse_slowdown("factor=20").unwrap();
        assert_eq!((s.factor(), s.delay_ms()), (20.0, 0.0));
        let s = parse_slowdown("delay_ms=250").unwrap();
        assert_eq!((s.factor(), s.delay_ms()), (1.0, 250.0));
        let s = parse_slowdown("factor=2.5&delay_ms=0").unwrap();
        assert_eq!((s.factor(), s.delay_ms()), (2.5, 0.0));
        assert_eq!(parse_slowdown("factor=1").unwrap(), Slowdown::NONE);
    }

    #[test]
    fn a_bad_slowdown_query_names_its_parameter() {
        for (query, param) in [
            ("", Some("factor")),
            ("&", Some("factor")),
            ("factor", Some("factor")),
            ("factor=", Some("factor")),
            ("factor=fast", Some("factor")),
            ("factor=NaN", Some("factor")),
            ("factor=inf", Some("factor")),
            ("factor=0.5", Some("factor")),
            ("factor=-3", Some("factor")),
            ("factor=1000.1", Some("factor")),
            ("factor=2&factor=3", Some("factor")),
            ("speed=2", None),
            ("delay_ms=-1", Some("delay_ms")),
            ("delay_ms=1e9", Some("delay_ms")),
            ("factor=2&delay_ms=soon", Some("delay_ms")),
        ] {
            let refused = parse_slowdown(query).err().map(|(_, p)| p);
            assert_eq!(refused, Some(param), "query {query:?}");
        }
    }
}
