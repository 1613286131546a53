//! Body-router tests against the fake host.

use std::sync::Arc;

use super::*;
use crate::fake::FakeHost;
use crate::handoff::HANDOFF_KEY;
use crate::headers::{ClientHeadersStripped, DESTINATION_ENDPOINT};
use crate::pipeline::{Pipeline, RequestContext, Run, Stage};
use crate::stages::RouteStage;
use crate::FilterStatus;

/// A stage before the router that stands for the trust boundary (the auth stage): it says
/// the client's gateway headers are gone, so the router leaves the headers alone.
struct TrustBoundary;

impl Stage<FakeHost> for TrustBoundary {
    fn name(&self) -> &'static str {
        "trust-boundary"
    }
    fn on_request_headers(
        &self,
        cx: &mut RequestContext,
        _host: &mut FakeHost,
        _end_of_stream: bool,
    ) -> FilterStatus {
        cx.insert(ClientHeadersStripped);
        FilterStatus::Continue
    }
}

/// A pipeline running `router`'s stage, after the trust boundary when `trusted`.
pub(super) fn pipeline(router: &Router, trusted: bool) -> Pipeline<FakeHost> {
    let mut stages: Vec<Box<dyn Stage<FakeHost>>> = Vec::new();
    if trusted {
        stages.push(Box::new(TrustBoundary));
    }
    stages.push(Box::new(RouteStage::new(Arc::new(router.clone()))));
    Pipeline::new(stages)
}

const CHAT: &str = "/v1/chat/completions";

fn router() -> Router {
    let config = serde_json::json!({
        "bodyLimitBytes": 1024,
        "pools": [
            {"name": "a", "baseModel": "llama", "adapters": ["sql-lora"]},
            {"name": "b", "baseModel": "qwen"}
        ]
    });
    match Router::from_json(config) {
        Ok(r) => r,
        Err(e) => unreachable!("test config must compile: {e}"),
    }
}

fn chat_body(model: &str) -> Vec<u8> {
    serde_json::json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
        .to_string()
        .into_bytes()
}

/// Drive headers then one body callback with the whole body.
fn run(host: &mut FakeHost) -> (FilterStatus, FilterStatus) {
    let p = pipeline(&router(), false);
    let mut run = Run::new();
    let first = run.request_headers(&p, host, host.body.is_empty());
    if first != FilterStatus::Pause {
        return (first, first);
    }
    let len = host.body.len();
    (first, run.request_body(&p, host, len, true))
}

fn error_code(host: &FakeHost) -> Option<String> {
    let reply = host.last_reply()?;
    let v: serde_json::Value = serde_json::from_slice(&reply.body).ok()?;
    v["error"]["code"].as_str().map(str::to_owned)
}

#[test]
fn routes_a_model_to_its_base_model() {
    let mut host = FakeHost::new().post(CHAT, &chat_body("qwen"));
    assert_eq!(
        run(&mut host),
        (FilterStatus::Pause, FilterStatus::Continue)
    );
    assert_eq!(host.header(MODEL_NAME), Some("qwen"));
    assert_eq!(host.header(BASE_MODEL), Some("qwen"));
    assert!(host.replies.is_empty());
    assert_eq!(host.counter("infergate.router.requests.outcome.routed"), 1);
}

#[test]
fn an_adapter_routes_to_its_base_model_and_keeps_its_own_name() {
    let mut host = FakeHost::new().post(CHAT, &chat_body("sql-lora"));
    assert_eq!(run(&mut host).1, FilterStatus::Continue);
    assert_eq!(host.header(MODEL_NAME), Some("sql-lora"));
    assert_eq!(host.header(BASE_MODEL), Some("llama"));
}

#[test]
fn client_sent_gateway_headers_are_removed_and_cannot_steer() {
    let mut host = FakeHost::new()
        .request_header("X-Gateway-Destination-Endpoint", "1.2.3.4:80")
        .request_header("x-gateway-base-model-name", "qwen")
        .request_header("x-llm-d-inference-objective", "critical")
        .request_header("x-llm-d-inference-fairness-id", "tenant-b")
        .request_header("x-request-id", "keep-me")
        .post(CHAT, &chat_body("sql-lora"));
    assert_eq!(run(&mut host).1, FilterStatus::Continue);
    assert_eq!(host.header(BASE_MODEL), Some("llama"));
    assert!(host
        .request_headers
        .iter()
        .all(|(k, _)| !k.eq_ignore_ascii_case(DESTINATION_ENDPOINT) && !k.starts_with("x-llm-d-")));
    assert_eq!(host.header("x-request-id"), Some("keep-me"));
}

#[test]
fn non_inference_paths_pass_through_but_are_still_stripped() {
    let mut host = FakeHost::new()
        .request_header(":method", "GET")
        .request_header(":path", "/healthz")
        .request_header("x-gateway-destination-endpoint", "1.2.3.4:80");
    let p = pipeline(&router(), false);
    let mut run = Run::new();
    assert_eq!(
        run.request_headers(&p, &mut host, true),
        FilterStatus::Continue
    );
    assert_eq!(host.header(DESTINATION_ENDPOINT), None);
    assert_eq!(host.header(BASE_MODEL), None);
    assert_eq!(
        host.counter("infergate.router.requests.outcome.passthrough"),
        1
    );
    // A later body callback is a no-op.
    assert_eq!(
        run.request_body(&p, &mut host, 10, true),
        FilterStatus::Continue
    );
}

#[test]
fn bad_json_is_400_openai_error() {
    let mut host = FakeHost::new().post(CHAT, b"{not json");
    assert_eq!(run(&mut host).1, FilterStatus::Replied);
    let reply = host.last_reply().map(|r| r.status);
    assert_eq!(reply, Some(400));
    let v: serde_json::Value = serde_json::from_slice(&host.replies[0].body).unwrap_or_default();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"].as_str().is_some());
    assert_eq!(host.header(BASE_MODEL), None);
}

/// What `router` answered a request of `api` with `body`: its status and error object, or
/// 0 and null when it routed the request.
fn answer(router: &Router, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    let mut host = FakeHost::new().post(path, body.to_string().as_bytes());
    let p = pipeline(router, false);
    let mut run = Run::new();
    assert_eq!(
        run.request_headers(&p, &mut host, false),
        FilterStatus::Pause
    );
    let len = host.body.len();
    run.request_body(&p, &mut host, len, true);
    match host.last_reply() {
        Some(reply) => {
            let v: serde_json::Value = serde_json::from_slice(&reply.body).unwrap_or_default();
            (reply.status, v["error"].clone())
        }
        None => (0, serde_json::Value::Null),
    }
}

#[test]
fn more_output_sequences_than_the_cap_is_400_naming_the_param() {
    let cap = |n: u32| {
        Router::from_json(serde_json::json!({
            "maxOutputSequences": n,
            "pools": [{"name": "a", "baseModel": "llama"}]
        }))
        .unwrap_or_else(|e| unreachable!("{e}"))
    };
    let default = cap(config::DEFAULT_MAX_OUTPUT_SEQUENCES);
    let messages = serde_json::json!([{"role": "user", "content": "hi"}]);
    let chat = |extra: serde_json::Value| {
        let mut b = serde_json::json!({"model": "llama", "messages": messages});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let completions = |extra: serde_json::Value| {
        let mut b = serde_json::json!({"model": "llama"});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    const COMPLETIONS: &str = "/v1/completions";
    // At the cap: routed.
    assert_eq!(
        answer(&default, CHAT, &chat(serde_json::json!({"n": 128}))).0,
        0
    );
    assert_eq!(
        answer(&default, CHAT, &chat(serde_json::json!({"n": 8}))).0,
        0
    );
    let batch: Vec<String> = (0..8).map(|i| format!("prompt {i}")).collect();
    assert_eq!(
        answer(
            &default,
            COMPLETIONS,
            &completions(serde_json::json!({"prompt": batch, "n": 16}))
        )
        .0,
        0
    );
    for (router, path, body, param) in [
        (&default, CHAT, chat(serde_json::json!({"n": 129})), "n"),
        (
            &default,
            CHAT,
            chat(serde_json::json!({"n": 2, "best_of": 129})),
            "best_of",
        ),
        (
            &default,
            CHAT,
            chat(serde_json::json!({"n": 200, "best_of": 150})),
            "n",
        ),
        (
            &default,
            CHAT,
            chat(serde_json::json!({"n": 18446744073709551615u64})),
            "n",
        ),
        (
            &default,
            COMPLETIONS,
            completions(serde_json::json!({"prompt": batch, "n": 17})),
            "prompt",
        ),
        (
            &cap(4),
            COMPLETIONS,
            completions(serde_json::json!({"prompt": [[1, 2], [3], [4], [5], [6]]})),
            "prompt",
        ),
        (
            &cap(4),
            COMPLETIONS,
            completions(serde_json::json!({"prompt": "x", "best_of": 5})),
            "best_of",
        ),
    ] {
        let (status, error) = answer(router, path, &body);
        assert_eq!(status, 400, "{body}");
        assert_eq!(error["param"], param, "{body}: {error}");
        assert_eq!(error["code"], "integer_above_max_value", "{body}");
        assert_eq!(error["type"], "invalid_request_error", "{body}");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains(&format!("'{param}'")), "{message}");
    }
    // A flat list of token ids is one prompt.
    assert_eq!(
        answer(
            &cap(1),
            COMPLETIONS,
            &completions(serde_json::json!({"prompt": [1, 2, 3]}))
        )
        .0,
        0
    );
}

#[test]
fn a_cap_of_zero_output_sequences_is_a_config_error() {
    let r = Router::from_json(serde_json::json!({"maxOutputSequences": 0, "pools": []}));
    assert!(matches!(
        r,
        Err(RouterConfigError::Invalid {
            field: "maxOutputSequences",
            ..
        })
    ));
    let r = Router::from_json(serde_json::json!({"pools": []}));
    assert_eq!(
        r.map(|r| r.max_output_sequences()).ok(),
        Some(config::DEFAULT_MAX_OUTPUT_SEQUENCES)
    );
}

#[test]
fn missing_model_is_400() {
    let mut host = FakeHost::new().post(CHAT, br#"{"messages":[]}"#);
    assert_eq!(run(&mut host).1, FilterStatus::Replied);
    assert_eq!(host.last_reply().map(|r| r.status), Some(400));
}

#[test]
fn an_inference_path_without_body_is_400() {
    let mut host = FakeHost::new()
        .request_header(":method", "POST")
        .request_header(":path", CHAT);
    assert_eq!(run(&mut host).0, FilterStatus::Replied);
    assert_eq!(host.last_reply().map(|r| r.status), Some(400));
}

#[test]
fn unknown_model_is_404_model_not_found() {
    let mut host = FakeHost::new().post(CHAT, &chat_body("gpt-9"));
    assert_eq!(run(&mut host).1, FilterStatus::Replied);
    assert_eq!(host.last_reply().map(|r| r.status), Some(404));
    assert_eq!(error_code(&host).as_deref(), Some("model_not_found"));
    assert_eq!(
        host.counter("infergate.router.requests.outcome.model_not_found"),
        1
    );
}

#[test]
fn oversize_body_is_413_while_buffering() {
    let p = pipeline(&router(), false);
    let mut host = FakeHost::new().post(CHAT, &[b' '; 2000]);
    let mut run = Run::new();
    assert_eq!(
        run.request_headers(&p, &mut host, false),
        FilterStatus::Pause
    );
    assert_eq!(
        run.request_body(&p, &mut host, 600, false),
        FilterStatus::Pause
    );
    assert_eq!(
        run.request_body(&p, &mut host, 1025, false),
        FilterStatus::Replied
    );
    assert_eq!(host.last_reply().map(|r| r.status), Some(413));
    assert_eq!(error_code(&host).as_deref(), Some("request_too_large"));
    // Nothing more happens after the reply.
    assert_eq!(
        run.request_body(&p, &mut host, 2000, true),
        FilterStatus::Replied
    );
    assert_eq!(host.replies.len(), 1);
}

#[test]
fn oversize_content_length_is_413_before_the_body() {
    let p = pipeline(&router(), false);
    let mut host = FakeHost::new()
        .request_header("content-length", "5000")
        .post(CHAT, &chat_body("qwen"));
    let mut run = Run::new();
    assert_eq!(
        run.request_headers(&p, &mut host, false),
        FilterStatus::Replied
    );
    assert_eq!(host.last_reply().map(|r| r.status), Some(413));
}

#[test]
fn a_body_exactly_at_the_limit_is_accepted() {
    let mut body = chat_body("qwen");
    // Pad with JSON whitespace up to the limit.
    body.resize(1024, b' ');
    let mut host = FakeHost::new().post(CHAT, &body);
    assert_eq!(run(&mut host).1, FilterStatus::Continue);
}

#[test]
fn default_limit_is_4_mib() {
    let r = Router::from_json(serde_json::json!({"pools": []}));
    assert_eq!(r.map(|r| r.body_limit()).ok(), Some(4 * 1024 * 1024));
}

#[test]
fn unknown_config_fields_are_rejected() {
    let r = Router::from_json(serde_json::json!({"pool": []}));
    assert!(matches!(r, Err(RouterConfigError::Json(_))));
}

#[test]
fn a_one_mib_model_gets_a_small_404_and_never_reaches_a_header() {
    let config = serde_json::json!({
        "bodyLimitBytes": 4 * 1024 * 1024,
        "pools": [{"name": "a", "baseModel": "llama"}]
    });
    let r = Router::from_json(config).unwrap_or_else(|e| unreachable!("{e}"));
    let model = "m".repeat(1 << 20);
    let mut host = FakeHost::new().post(CHAT, &chat_body(&model));
    let p = pipeline(&r, false);
    let mut run = Run::new();
    assert_eq!(
        run.request_headers(&p, &mut host, false),
        FilterStatus::Pause
    );
    let len = host.body.len();
    assert_eq!(
        run.request_body(&p, &mut host, len, true),
        FilterStatus::Replied
    );
    let reply = host.last_reply().cloned().unwrap_or_else(|| unreachable!());
    assert_eq!(reply.status, 404);
    assert!(reply.body.len() < 1024, "{}", reply.body.len());
    let longest_header = host
        .request_headers
        .iter()
        .map(|(_, v)| v.len())
        .max()
        .unwrap_or(0);
    assert!(longest_header < 1024, "{longest_header}");
}

/// The picker pools' block sizes as the adapter's config registry would report them.
struct PickerBlockSizes;

impl BlockSizeSource for PickerBlockSizes {
    fn block_size_tokens(&self, base_model: &str) -> Option<u32> {
        (base_model == "llama").then_some(16)
    }
}

fn handoff_block_size(router: &Router, model: &str) -> Option<u32> {
    let mut host = FakeHost::new().post(CHAT, &chat_body(model));
    let p = pipeline(router, false);
    let mut run = Run::new();
    run.request_headers(&p, &mut host, false);
    let len = host.body.len();
    run.request_body(&p, &mut host, len, true);
    let bytes = host.stream_state.get(HANDOFF_KEY)?;
    crate::handoff::Handoff::decode(bytes).map(|h| h.block_size_tokens)
}

#[test]
fn the_handoff_is_hashed_at_the_block_size_of_the_loaded_picker_pool() {
    let r = router().with_block_sizes(std::sync::Arc::new(PickerBlockSizes));
    // Set only in the picker: the router follows it.
    assert_eq!(r.block_size_tokens("llama"), 16);
    assert_eq!(handoff_block_size(&r, "sql-lora"), Some(16));
    // No picker pool says: the default.
    assert_eq!(handoff_block_size(&r, "qwen"), Some(64));
    // Without a source (no picker loaded), the default too.
    assert_eq!(handoff_block_size(&router(), "llama"), Some(64));
    // A router config that sets it wins over the lookup.
    let explicit = Router::from_json(serde_json::json!({
        "pools": [{"name": "a", "baseModel": "llama", "blockSizeTokens": 32}]
    }))
    .map(|r| r.with_block_sizes(std::sync::Arc::new(PickerBlockSizes)));
    assert_eq!(explicit.map(|r| r.block_size_tokens("llama")), Ok(32));
}
