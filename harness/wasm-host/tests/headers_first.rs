//! The product module under Envoy's default `allow_on_headers_stop_iteration` (false), the
//! only setting an Istio `WasmPlugin` gets: a filter that stops at the request headers is
//! handed no body, so the router lets the headers go at once and reads the body, the
//! `headers` role applies the router's header edits after Envoy's buffer filter, and the
//! picker picks at the headers from the router's handoff (or answers 503, never waits).
//! The `headers` role has a module of its own, `infergate_wasm_headers.wasm`, tested here
//! beside the full module playing it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::gateway::{chat, chat_headers, LLAMA};
use common::{headers_module, product_module, testdata};
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

    // The `headers` role (another VM, as Istio gives each plugin) applies them: its own
    // module, or the full module configured as that role.
    for module in [headers_module(), product_module()] {
        let other = Host::builder()
            .vm_id("")
            .shared_data(&shared)
            .load(module)
            .unwrap();
        let headers = other
            .configure_plugin("headers", r#"{"role":"headers","instance":"infergate"}"#)
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
        assert_eq!(action, Action::Continue, "{}", module.display());
        let up = h.upstream_request_headers().expect("forwarded");
        assert_eq!(
            up.get("x-gateway-base-model-name").as_deref(),
            Some(LLAMA),
            "{}",
            module.display()
        );
        assert_eq!(other.trapped(), None);
    }
    assert_eq!(worker.trapped(), None);
}

/// The `headers` filter's own module exports nothing but its one callback and what every
/// module needs, so Envoy enters its VM once per request: no context creation, body,
/// response, log or deletion callback. The full module exports those (its router and picker
/// need them), so as the `headers` filter it is entered at each of them.
#[test]
fn the_headers_module_is_entered_once_per_request() {
    let module = infergate_wasm_host::engine::load_module(headers_module()).unwrap();
    let mut exports: Vec<&str> = module.exports().map(|e| e.name()).collect();
    exports.sort_unstable();
    assert_eq!(
        exports,
        [
            "_initialize",
            "memory",
            "proxy_abi_version_0_2_1",
            "proxy_on_configure",
            "proxy_on_memory_allocate",
            "proxy_on_request_headers",
        ]
    );
    let full = infergate_wasm_host::engine::load_module(product_module()).unwrap();
    let full: Vec<&str> = full.exports().map(|e| e.name()).collect();
    for callback in [
        "proxy_on_context_create",
        "proxy_on_response_body",
        "proxy_on_log",
    ] {
        assert!(full.contains(&callback), "{callback}: {full:?}");
    }
}

/// A request the router left no edits for goes on unchanged; the module keeps no state, so
/// the stream's end costs nothing and the next request is served the same.
#[test]
fn the_headers_module_passes_an_unedited_request_and_answers_every_phase() {
    let host = Host::builder().vm_id("").load(headers_module()).unwrap();
    let root = host
        .configure_plugin("headers", r#"{"role":"headers"}"#)
        .unwrap();
    for _ in 0..3 {
        let h = host.new_http_stream_on(root).unwrap();
        let action = h
            .request_header_map_in(chat_headers(&[("x-keep", b"yes")]), false)
            .unwrap();
        assert_eq!(action, Action::Continue);
        assert_eq!(h.request_body(b"{}", true).unwrap(), Action::Continue);
        let up = h.upstream_request_headers().expect("forwarded");
        assert_eq!(up.get("x-keep").as_deref(), Some("yes"));
        assert_eq!(up.get("x-gateway-base-model-name"), None);
        assert!(h.local_response().is_none());
    }
    assert_eq!(host.trapped(), None);
}

/// Pointed at the router's or the picker's configuration, the `headers` module refuses it
/// (Envoy then refuses the plugin) rather than passing every request unrouted.
#[test]
fn the_headers_module_refuses_any_other_role() {
    let host = Host::builder().vm_id("").load(headers_module()).unwrap();
    for config in [
        testdata("filters/router.json"),
        r#"{"role":"picker","pools":[]}"#.to_owned(),
        r#"{"role":"headers","pools":[]}"#.to_owned(),
        "not json".to_owned(),
    ] {
        let err = host.configure_plugin("headers", &config).unwrap_err();
        assert!(
            err.to_string()
                .contains("proxy_on_configure returned false"),
            "{err}"
        );
    }
    assert!(
        host.logged("the router and the picker are infergate_wasm.wasm"),
        "{:?}",
        host.logs()
    );
    assert_eq!(host.trapped(), None);
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
