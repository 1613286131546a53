//! The product module under Envoy's default `allow_on_headers_stop_iteration` (false), the
//! only setting an Istio `WasmPlugin` gets: a filter that stops at the request headers is
//! handed no body, so the router lets the headers go at once and reads the body, the
//! `headers` role applies the router's header edits after Envoy's buffer filter, and the
//! picker picks at the headers from the router's handoff (or answers 503, never waits).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::gateway::{chat, chat_headers, LLAMA};
use common::{product_module, testdata};
use infergate_wasm_host::{Action, Host, SharedData};

/// `testdata/filters/<file>` without its `allowOnHeadersStopIteration`: Envoy's default.
fn without_the_flag(file: &str) -> String {
    let mut config: serde_json::Value = serde_json::from_str(&testdata(file)).unwrap();
    config
        .as_object_mut()
        .unwrap()
        .remove("allowOnHeadersStopIteration");
    config.to_string()
}

#[test]
fn the_router_lets_the_headers_go_reads_the_body_and_hands_its_edits_on() {
    let shared = SharedData::new();
    let worker = Host::builder()
        .vm_id("")
        .shared_data(&shared)
        .load(product_module())
        .unwrap();
    let router = worker
        .configure_plugin("router", without_the_flag("filters/router.json"))
        .unwrap();
    let s = worker.new_http_stream_on(router).unwrap();
    let body = chat("hello");
    // The headers go on at once (a buffer filter downstream holds them), unedited.
    let action = s
        .request_header_map_in(
            chat_headers(&[("x-gateway-base-model-name", b"spoofed")]),
            false,
        )
        .unwrap();
    assert_eq!(action, Action::Continue);
    // The body is buffered to its end, then goes on.
    let half = body.len() / 2;
    assert_eq!(
        s.request_body(&body.as_bytes()[..half], false).unwrap(),
        Action::Pause
    );
    assert_eq!(
        s.request_body(&body.as_bytes()[half..], true).unwrap(),
        Action::Continue
    );
    assert!(s.local_response().is_none(), "{:?}", s.local_response());
    // Nothing was written to headers Envoy no longer hands over...
    assert_eq!(s.late_request_header_writes(), Vec::<String>::new());
    // ...the edits wait in filter state, with the router's handoff.
    let edits = s.property(&["infergate.request_headers"]).expect("edits");
    let edits: serde_json::Value = serde_json::from_slice(&edits).unwrap();
    let text = edits.to_string();
    assert!(text.contains("x-gateway-base-model-name"), "{text}");
    assert!(text.contains(LLAMA), "{text}");
    assert!(s.property(&["infergate_handoff"]).is_some());

    // The `headers` role (another VM, as Istio gives each plugin) applies them.
    let other = Host::builder()
        .vm_id("")
        .shared_data(&shared)
        .load(product_module())
        .unwrap();
    let headers = other
        .configure_plugin("headers", r#"{"role":"headers"}"#)
        .unwrap();
    let h = other.new_http_stream_on(headers).unwrap();
    h.set_property(
        &["infergate.request_headers"],
        serde_json::to_vec(&edits).unwrap(),
    )
    .unwrap();
    let action = h
        .request_header_map_in(
            chat_headers(&[("x-gateway-base-model-name", b"spoofed")]),
            false,
        )
        .unwrap();
    assert_eq!(action, Action::Continue);
    let up = h.upstream_request_headers().expect("forwarded");
    assert_eq!(up.get("x-gateway-base-model-name").as_deref(), Some(LLAMA));
    assert_eq!(worker.trapped(), None);
    assert_eq!(other.trapped(), None);
}

#[test]
fn a_picker_with_no_handoff_answers_503_at_the_headers_rather_than_waiting_for_a_body() {
    let picker = Host::builder().vm_id("").load(product_module()).unwrap();
    let root = picker
        .configure_plugin("picker", without_the_flag("filters/picker.json"))
        .unwrap();
    let s = picker.new_http_stream_on(root).unwrap();
    let action = s
        .request_header_map_in(
            chat_headers(&[("x-gateway-base-model-name", LLAMA.as_bytes())]),
            false,
        )
        .unwrap();
    assert_eq!(action, Action::Pause);
    let reply = s.local_response().expect("answered at once");
    assert_eq!(reply.status, 503);
    assert_eq!(
        reply
            .headers
            .get("x-llm-d-request-dropped-reason")
            .as_deref(),
        Some("rejected-no-handoff")
    );
    assert_eq!(s.upstream_request_headers(), None);
    assert_eq!(picker.trapped(), None);
}
