//! The router → picker handoff: with a fitting handoff the picker picks in its headers
//! callback without reading the body, and picks exactly as the body path would; without
//! one (absent, undecodable, another block size, another base model) it falls back to
//! pausing for and parsing the body.

use super::*;
use crate::handoff::{Handoff, HANDOFF_KEY};
use crate::pipeline::{Pipeline, Run};
use crate::router::Router;
use crate::stages::RouteStage;

const HANDOFF_STAT: &str = "infergate.picker.handoff.pool.p";

fn router(extra: Value) -> Router {
    let mut p = json!({"name": "p", "baseModel": "llama"});
    if let (Some(obj), Some(extra)) = (p.as_object_mut(), extra.as_object()) {
        for (k, x) in extra {
            obj.insert(k.clone(), x.clone());
        }
    }
    match Router::from_json(json!({ "pools": [p] })) {
        Ok(r) => r,
        Err(e) => unreachable!("test config must build: {e}"),
    }
}

/// A long prompt: several prefix blocks at any block size used here.
fn long_chat() -> Vec<u8> {
    let content = "The quick brown fox jumps over the lazy dog. ".repeat(200);
    json!({"model": "llama", "max_tokens": 50, "messages": [{"role": "user", "content": content}]})
        .to_string()
        .into_bytes()
}

fn client_host(body: &[u8], snapshot: Vec<u8>) -> FakeHost {
    FakeHost::new()
        .post("/v1/chat/completions", body)
        .now(NOW)
        .snapshot(1, snapshot)
}

/// Runs the router over the complete body, as Envoy does before the picker sees headers.
fn route(router: &Router, host: &mut FakeHost) {
    let stage = RouteStage::new(Arc::new(router.clone()));
    let p: Pipeline<FakeHost> = Pipeline::new(vec![Box::new(stage)]);
    let mut r = Run::new();
    assert_eq!(r.request_headers(&p, host, false), FilterStatus::Pause);
    let len = host.body.len();
    assert_eq!(r.request_body(&p, host, len, true), FilterStatus::Continue);
}

#[test]
fn a_fitting_handoff_is_picked_in_the_headers_callback_without_the_body() {
    let mut s = shared(pool(&[A, B], json!({})));
    let mut host = client_host(&long_chat(), fresh_all(&[A, B]));
    route(&router(json!({})), &mut host);
    assert!(host.stream_state.contains_key(HANDOFF_KEY));
    let reads_after_router = host.body_reads.get();

    let mut req = PickRun::new();
    let status = req.on_request_headers(&mut s, &mut host, false);
    assert_eq!(status, FilterStatus::Continue);
    assert_eq!(
        host.body_reads.get(),
        reads_after_router,
        "picker read the body"
    );
    assert_eq!(host.counter(HANDOFF_STAT), 1);
    assert_eq!(host.counter("infergate.picker.decisions.pool.p"), 1);
    let picked = host.header(DESTINATION_ENDPOINT).map(str::to_owned);
    assert!(picked.is_some());
    assert_eq!(
        req.endpoint(),
        picked.as_deref().and_then(|l| l.split(',').next())
    );
    assert!(req.holds_lease());
    assert!(host.counter("infergate.picker.prefix_total_blocks.pool.p") > 1);
    // Later callbacks do nothing more.
    let len = host.body.len();
    assert_eq!(
        req.on_request_body(&mut s, &mut host, len, true),
        FilterStatus::Continue
    );
    assert_eq!(host.counter("infergate.picker.decisions.pool.p"), 1);
    let endpoint = req.endpoint().unwrap_or_default().to_owned();
    req.on_end(&mut s);
    assert_eq!(requests_in_flight(&s, &endpoint), 0);
}

#[test]
fn the_handoff_path_decides_exactly_as_the_body_path() {
    // Same request, same seeds: one picker fed by the handoff, one parsing the body.
    let snap = snapshot(NOW, &[(A, metrics(0, 0.1)), (B, metrics(1, 0.1))]);
    let mut via_handoff = shared(pool(&[A, B], json!({})));
    let mut via_body = shared(pool(&[A, B], json!({})));
    for round in 0..4 {
        let body = if round % 2 == 0 {
            long_chat()
        } else {
            chat("short")
        };
        let mut h1 = client_host(&body, snap.clone());
        route(&router(json!({})), &mut h1);
        let (st1, _r1) = pick_one(&mut via_handoff, &mut h1);
        let mut h2 = host_for(&body, Some(snap.clone()));
        let (st2, _r2) = pick_one(&mut via_body, &mut h2);
        assert_eq!(st1, st2);
        assert_eq!(
            h1.header(DESTINATION_ENDPOINT),
            h2.header(DESTINATION_ENDPOINT)
        );
        for stat in [
            "infergate.picker.prefix_total_blocks.pool.p",
            "infergate.picker.prefix_matched_blocks.pool.p",
        ] {
            assert_eq!(
                h1.counter(stat),
                h2.counter(stat),
                "{stat} in round {round}"
            );
        }
        assert_eq!(h1.counter(HANDOFF_STAT), 1);
        assert_eq!(h2.counter(HANDOFF_STAT), 0);
    }
    assert_eq!(
        via_handoff.prefix_hit_ratio(PoolId(0)),
        via_body.prefix_hit_ratio(PoolId(0))
    );
}

/// The picker must fall back to the body: pause, read, parse, pick; no handoff counted.
fn assert_body_path(s: &mut PickerShared, host: &mut FakeHost) {
    let mut req = PickRun::new();
    assert_eq!(
        req.on_request_headers(&mut *s, host, false),
        FilterStatus::Pause
    );
    let before = host.body_reads.get();
    let len = host.body.len();
    assert_eq!(
        req.on_request_body(&mut *s, host, len, true),
        FilterStatus::Continue
    );
    assert!(host.body_reads.get() > before);
    assert_eq!(host.counter(HANDOFF_STAT), 0);
    assert!(host.header(DESTINATION_ENDPOINT).is_some());
}

#[test]
fn a_handoff_of_another_block_size_falls_back_to_the_body() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = client_host(&long_chat(), fresh_all(&[A]));
    route(&router(json!({"blockSizeTokens": 16})), &mut host);
    assert!(host.stream_state.contains_key(HANDOFF_KEY));
    assert_body_path(&mut s, &mut host);
}

#[test]
fn a_configured_block_size_that_matches_the_picker_is_used() {
    let cfg = json!({"eppConfig": {
        "plugins": [
            {"type": "approx-prefix-cache-producer", "parameters": {"blockSizeTokens": 16}},
            {"type": "prefix-cache-scorer"},
            {"type": "max-score-picker"}
        ],
        "schedulingProfiles": [{
            "name": "default",
            "plugins": [{"pluginRef": "prefix-cache-scorer"}, {"pluginRef": "max-score-picker"}]
        }]
    }});
    let mut s = shared(pool(&[A], cfg));
    let mut host = client_host(&long_chat(), fresh_all(&[A]));
    route(&router(json!({"blockSizeTokens": 16})), &mut host);
    let mut req = PickRun::new();
    assert_eq!(
        req.on_request_headers(&mut s, &mut host, false),
        FilterStatus::Continue
    );
    assert_eq!(host.counter(HANDOFF_STAT), 1);
}

#[test]
fn an_undecodable_or_foreign_handoff_falls_back_to_the_body() {
    let mut s = shared(pool(&[A], json!({})));
    let mut garbage = host_for(&long_chat(), Some(fresh_all(&[A])));
    garbage
        .stream_state
        .insert(HANDOFF_KEY.to_owned(), b"IGH\x01 not a handoff".to_vec());
    assert_body_path(&mut s, &mut garbage);

    let other_base = Handoff {
        base_model: "qwen".into(),
        target_model: "llama".into(),
        prompt_tokens: scheduler_core::types::Tokens(1),
        max_output_tokens: None,
        output_sequences: 1,
        block_size_tokens: 64,
        complete: true,
        block_hashes: Vec::new(),
    };
    let mut foreign = host_for(&long_chat(), Some(fresh_all(&[A])));
    foreign.stream_state.insert(
        HANDOFF_KEY.to_owned(),
        other_base.encode().unwrap_or_default(),
    );
    assert_body_path(&mut s, &mut foreign);
}

#[test]
fn without_a_router_the_picker_parses_the_body_as_before() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = host_for(&long_chat(), Some(fresh_all(&[A])));
    assert_body_path(&mut s, &mut host);
}
