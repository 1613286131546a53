//! The router with model rewrites (body, headers, handoff, trusted header, split key) and
//! `/v1/models`, against the fake host.

#![allow(clippy::unwrap_used, clippy::panic)]

use serde_json::{json, Value};

use super::tests::pipeline;
use super::*;
use crate::fake::FakeHost;
use crate::handoff::HANDOFF_KEY;
use crate::pipeline::Run;
use crate::FilterStatus;

const CHAT: &str = "/v1/chat/completions";

fn rewrite(weights: (u32, u32)) -> Value {
    json!({
        "apiVersion": "llm-d.ai/v1alpha2",
        "kind": "InferenceModelRewrite",
        "metadata": {"name": "support-assistant"},
        "spec": {
            "poolRef": {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "a"},
            "rules": [{
                "matches": [{"model": {"type": "Exact", "value": "support-assistant"}}],
                "targets": [
                    {"modelRewrite": "support-assistant-v1", "weight": weights.0},
                    {"modelRewrite": "support-assistant-v2", "weight": weights.1}
                ]
            }]
        }
    })
}

fn router_with(weights: (u32, u32), split: Value) -> Router {
    let config = json!({
        "pools": [
            {"name": "a", "baseModel": "llama", "adapters": ["support-assistant-v1", "support-assistant-v2"]},
            {"name": "b", "baseModel": "qwen", "adapters": ["sql-lora"]}
        ],
        "modelRewrites": [rewrite(weights)],
        "split": split
    });
    match Router::from_json(config) {
        Ok(r) => r,
        Err(e) => panic!("test config must compile: {e}"),
    }
}

fn sticky() -> Router {
    router_with((90, 10), json!({"sessionHeader": "x-session-id"}))
}

fn body(model: &str) -> Vec<u8> {
    format!(r#"{{"model": "{model}", "messages": [{{"role": "user", "content": "hi"}}], "stream": false}}"#)
        .into_bytes()
}

/// Headers then the whole body through the route stage (after the trust boundary when
/// `trusted`); the request's run.
fn run_with(r: &Router, host: &mut FakeHost, trusted: bool) -> (FilterStatus, Run) {
    let p = pipeline(r, trusted);
    let mut run = Run::new();
    let first = run.request_headers(&p, host, host.body.is_empty());
    if first != FilterStatus::Pause {
        return (first, run);
    }
    let len = host.body.len();
    (run.request_body(&p, host, len, true), run)
}

fn run(r: &Router, host: &mut FakeHost) -> (FilterStatus, Run) {
    run_with(r, host, false)
}

/// What the router learnt about the request of `run`.
fn routed(run: &Run) -> &RoutedRequest {
    run.context().get::<RoutedRequest>().unwrap()
}

fn body_model(host: &FakeHost) -> String {
    let v: Value = serde_json::from_slice(&host.body).unwrap();
    v["model"].as_str().unwrap_or_default().to_owned()
}

fn handoff(host: &FakeHost) -> Handoff {
    Handoff::decode(host.stream_state.get(HANDOFF_KEY).unwrap()).unwrap()
}

#[test]
fn a_rewritten_request_carries_its_target_everywhere_but_the_model_header() {
    let r = sticky();
    let sent = body("support-assistant");
    let mut host = FakeHost::new()
        .request_header("x-session-id", "conversation-1")
        .post(CHAT, &sent);
    let (status, req) = run(&r, &mut host);
    assert_eq!(status, FilterStatus::Continue);
    let target = body_model(&host);
    assert!(target.starts_with("support-assistant-v"), "{target}");
    // Only the model's value changed in the body.
    let expected = String::from_utf8(sent)
        .unwrap()
        .replace("\"support-assistant\"", &format!("\"{target}\""));
    assert_eq!(String::from_utf8(host.body.clone()).unwrap(), expected);
    assert_eq!(host.header(MODEL_NAME), Some("support-assistant"));
    assert_eq!(host.header(BASE_MODEL), Some("llama"));
    let routed = routed(&req);
    assert_eq!(routed.model, "support-assistant");
    assert_eq!(routed.target_model, target);
    // The picker's LoRA scorer and prefix seed get the target.
    let h = handoff(&host);
    assert_eq!(
        (h.base_model.as_str(), h.target_model.as_str()),
        ("llama", target.as_str())
    );
    let key = format!("infergate.router.rewrites.target.{target}");
    assert_eq!(host.counter(&key), 1);
    // The split key is the session's.
    let split = rewrite::split_key(b"conversation-1").to_string();
    assert_eq!(host.header(SPLIT_KEY), Some(split.as_str()));
}

#[test]
fn a_session_sticks_and_sessions_split_by_weight() {
    let r = sticky();
    let mut on_v2 = 0;
    for s in 0..2000 {
        let session = format!("s-{s}");
        let mut first = None;
        for _turn in 0..3 {
            let mut host = FakeHost::new()
                .seed(s)
                .request_header("x-session-id", &session)
                .post(CHAT, &body("support-assistant"));
            run(&r, &mut host);
            let target = body_model(&host);
            assert_eq!(
                first.get_or_insert_with(|| target.clone()),
                &target,
                "{session}"
            );
        }
        on_v2 += u32::from(first.as_deref() == Some("support-assistant-v2"));
    }
    assert!((150..250).contains(&on_v2), "{on_v2} of 2000 on v2");
}

#[test]
fn without_a_session_the_fairness_id_is_the_key_else_each_request_draws() {
    let r = sticky();
    // The auth stage set the fairness id (the router then keeps the headers as they are).
    let targets: Vec<String> = (0..50)
        .map(|i| {
            let mut host = FakeHost::new()
                .seed(i)
                .request_header(crate::headers::FAIRNESS_ID, "tenant-a")
                .post(CHAT, &body("support-assistant"));
            run_with(&r, &mut host, true);
            let split = rewrite::split_key(b"tenant-a").to_string();
            assert_eq!(host.header(SPLIT_KEY), Some(split.as_str()));
            body_model(&host)
        })
        .collect();
    assert!(targets.iter().all(|t| t == &targets[0]), "{targets:?}");
    // The shared default flow is no key: those requests draw per request.
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..300 {
        let mut host = FakeHost::new()
            .seed(i)
            .request_header(crate::headers::FAIRNESS_ID, crate::flow::DEFAULT_FLOW)
            .post(CHAT, &body("support-assistant"));
        run_with(&r, &mut host, true);
        seen.insert(body_model(&host));
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    // No key at all: per request, so both targets appear, and split keys differ.
    let mut seen = std::collections::BTreeSet::new();
    let mut keys = std::collections::BTreeSet::new();
    for i in 0..300 {
        let mut host = FakeHost::new()
            .seed(i)
            .post(CHAT, &body("support-assistant"));
        run(&r, &mut host);
        seen.insert(body_model(&host));
        keys.insert(host.header(SPLIT_KEY).unwrap().to_owned());
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(keys.len() > 290);
}

#[test]
fn per_request_mode_switches_within_a_session() {
    let r = router_with(
        (50, 50),
        json!({"mode": "perRequest", "sessionHeader": "x-session-id"}),
    );
    let mut seen = std::collections::BTreeSet::new();
    let mut keys = std::collections::BTreeSet::new();
    for i in 0..40 {
        let mut host = FakeHost::new()
            .seed(i)
            .request_header("x-session-id", "one-session")
            .post(CHAT, &body("support-assistant"));
        run(&r, &mut host);
        seen.insert(body_model(&host));
        keys.insert(host.header(SPLIT_KEY).unwrap().to_owned());
    }
    assert_eq!(seen.len(), 2);
    assert!(keys.len() > 30, "per request: a fresh split key each time");
}

#[test]
fn the_rewrite_header_counts_only_from_a_trusted_stage() {
    // Weight 0 on v2: the rule alone always picks v1.
    let r = router_with((1, 0), json!({}));
    let send = |trusted: bool, target: &str| {
        let mut host = FakeHost::new()
            .request_header(MODEL_NAME_REWRITE, target)
            .post(CHAT, &body("support-assistant"));
        let (_, req) = run_with(&r, &mut host, trusted);
        (body_model(&host), routed(&req).target_model.clone())
    };
    // A client's header is stripped before the router reads it.
    let v1 = "support-assistant-v1".to_owned();
    let v2 = "support-assistant-v2".to_owned();
    assert_eq!(
        send(false, "support-assistant-v2"),
        (v1.clone(), v1.clone())
    );
    // Set by the auth stage (after its own strip), it wins over the rule.
    assert_eq!(send(true, "support-assistant-v2"), (v2.clone(), v2));
    // A target the base model's pools do not serve is ignored, as is a rewrite-only name.
    assert_eq!(send(true, "sql-lora"), (v1.clone(), v1.clone()));
    assert_eq!(send(true, "support-assistant"), (v1.clone(), v1));
    // On a model no rule matches, a trusted header still sets the target.
    let mut host = FakeHost::new()
        .request_header(MODEL_NAME_REWRITE, "support-assistant-v2")
        .post(CHAT, &body("llama"));
    run_with(&r, &mut host, true);
    assert_eq!(body_model(&host), "support-assistant-v2");
    assert_eq!(host.header(MODEL_NAME), Some("llama"));
}

#[test]
fn unmatched_models_keep_their_body_and_name() {
    let r = sticky();
    let sent = body("sql-lora");
    let mut host = FakeHost::new().post(CHAT, &sent);
    let (status, req) = run(&r, &mut host);
    assert_eq!(status, FilterStatus::Continue);
    assert_eq!(host.body, sent);
    assert_eq!(routed(&req).target_model, "sql-lora");
    assert_eq!(handoff(&host).target_model, "sql-lora");
    assert!(host.header(SPLIT_KEY).is_some());
    assert_eq!(host.counter_sum("infergate.router.rewrites"), 0);
}

#[test]
fn a_rewrite_error_fails_the_router_config_naming_the_path() {
    let mut bad = rewrite((90, 10));
    bad["spec"]["rules"][0]["targets"][1]["modelRewrite"] = json!("sql-lora");
    let config = json!({
        "pools": [{"name": "a", "baseModel": "llama", "adapters": ["support-assistant-v1"]},
                  {"name": "b", "baseModel": "qwen", "adapters": ["sql-lora"]}],
        "modelRewrites": [bad]
    });
    let e = Router::from_json(config).unwrap_err();
    assert!(
        e.to_string()
            .contains("spec.rules[0].targets[1].modelRewrite"),
        "{e}"
    );
    let e = Router::from_json(json!({"pools": [], "split": {"mode": "random"}})).unwrap_err();
    assert!(e.to_string().contains("random"), "{e}");
}

#[test]
fn stat_keys_include_one_rewrite_counter_per_target() {
    let r = sticky();
    let names: Vec<&str> = r.stat_keys().iter().map(|(_, k)| k.as_str()).collect();
    for t in ["support-assistant-v1", "support-assistant-v2"] {
        let want = format!("infergate.router.rewrites.target.{t}");
        assert!(names.contains(&want.as_str()), "{names:?}");
    }
}

// ---- /v1/models ----

fn get(path: &str) -> FakeHost {
    FakeHost::new()
        .request_header(":method", "GET")
        .request_header(":path", path)
        .request_header("x-gateway-destination-endpoint", "1.2.3.4:80")
}

fn reply_json(host: &FakeHost) -> (u16, Value) {
    let reply = host.last_reply().unwrap();
    (reply.status, serde_json::from_slice(&reply.body).unwrap())
}

#[test]
fn v1_models_lists_every_served_name_once_sorted() {
    let r = sticky();
    let mut host = get("/v1/models");
    let (status, _) = run(&r, &mut host);
    assert_eq!(status, FilterStatus::Replied);
    let (code, v) = reply_json(&host);
    assert_eq!(code, 200);
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            "llama",
            "qwen",
            "sql-lora",
            "support-assistant",
            "support-assistant-v1",
            "support-assistant-v2"
        ]
    );
    for m in v["data"].as_array().unwrap() {
        assert_eq!(m["object"], "model");
        assert_eq!(m["created"], 0);
        assert_eq!(m["owned_by"], "infergate");
    }
    assert_eq!(host.counter("infergate.router.requests.outcome.models"), 1);
    // The client's reserved headers are stripped on this path too.
    assert_eq!(host.header("x-gateway-destination-endpoint"), None);
}

#[test]
fn v1_models_by_id_answers_the_object_or_404() {
    let r = sticky();
    let mut host = get("/v1/models/support-assistant");
    run(&r, &mut host);
    let (code, v) = reply_json(&host);
    assert_eq!((code, v["id"].as_str()), (200, Some("support-assistant")));
    let mut host = get("/v1/models/gpt-4");
    run(&r, &mut host);
    let (code, v) = reply_json(&host);
    assert_eq!(code, 404);
    assert_eq!(v["error"]["code"], "model_not_found");
    assert_eq!(
        host.counter("infergate.router.requests.outcome.model_not_found"),
        1
    );
}

#[test]
fn other_methods_on_v1_models_are_405() {
    let r = sticky();
    let mut host = FakeHost::new().post("/v1/models", b"{}");
    let (status, _) = run(&r, &mut host);
    assert_eq!(status, FilterStatus::Replied);
    let reply = host.last_reply().unwrap();
    assert_eq!(reply.status, 405);
    assert!(reply
        .headers
        .iter()
        .any(|(k, v)| k == "allow" && v == "GET, HEAD"));
}
