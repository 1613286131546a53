//! The project's built proxy-wasm module (`wasm/`, `infergate_wasm.wasm`) driven through the
//! host with the shipped example configurations (`testdata/filters/`): body router, scraper
//! and picker, without Envoy.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // helpers outside #[test] fns

mod common;

use common::{product_module, testdata};
use infergate_wasm_host::{Action, Host, HttpCallResponse, HttpStream, SharedData};

const LLAMA: &str = "meta-llama/Llama-3.1-8B-Instruct";
const LLAMA_POOL: [&str; 3] = ["127.0.0.1:18001", "127.0.0.1:18002", "127.0.0.1:18003"];

fn router() -> Host {
    let host = Host::builder()
        .vm_id("infergate")
        .load(product_module())
        .unwrap();
    host.configure_plugin("router", testdata("filters/router.json"))
        .unwrap();
    host
}

fn chat(model: &str, text: &str) -> String {
    format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"{text}"}}],"max_tokens":16}}"#
    )
}

fn post(s: &HttpStream, extra: &[(&str, &str)], body: &str) -> Action {
    let mut headers = vec![
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        (":authority", "gw"),
        ("content-type", "application/json"),
    ];
    headers.extend_from_slice(extra);
    assert_eq!(
        s.request_headers(&headers, false).unwrap(),
        Action::Pause,
        "waits for the body"
    );
    s.request_body(body.as_bytes(), true).unwrap()
}

#[test]
fn router_maps_an_adapter_to_its_base_model_and_strips_client_headers() {
    let host = router();
    let s = host.new_http_stream().unwrap();
    let spoof = [
        ("x-gateway-destination-endpoint", "6.6.6.6:80"),
        ("x-gateway-base-model-name", "evil"),
        ("x-llm-d-inference-objective", "critical"),
    ];
    assert_eq!(post(&s, &spoof, &chat("sql-lora", "hi")), Action::Continue);
    assert!(s.local_response().is_none(), "{:?}", s.local_response());
    let up = s.upstream_request_headers().expect("forwarded");
    assert_eq!(up.get("x-gateway-model-name").as_deref(), Some("sql-lora"));
    assert_eq!(up.get("x-gateway-base-model-name").as_deref(), Some(LLAMA));
    assert_eq!(up.get("x-gateway-destination-endpoint"), None);
    assert_eq!(up.get("x-llm-d-inference-objective"), None);
    assert!(s.late_request_header_writes().is_empty());
    // The handoff for the picker: stream state under the one-element path, versioned.
    let handoff = s.property(&["infergate_handoff"]).expect("handoff stored");
    assert_eq!(handoff.get(..4), Some(&b"IGH\x02"[..]));
    assert!(s.done().unwrap());
}

/// The router's handoff bytes for one request.
fn handoff_of(body: &str) -> Vec<u8> {
    let s = router().new_http_stream().unwrap();
    assert_eq!(post(&s, &[], body), Action::Continue);
    s.property(&["infergate_handoff"]).expect("handoff stored")
}

#[test]
fn router_answers_bad_json_unknown_model_and_oversize_bodies() {
    let host = router();
    let s = host.new_http_stream().unwrap();
    post(&s, &[], "{not json");
    assert_eq!(s.local_response().map(|r| r.status), Some(400));
    assert_eq!(s.upstream_request_headers(), None);

    let s = host.new_http_stream().unwrap();
    post(&s, &[], &chat("no-such-model", "hi"));
    let reply = s.local_response().expect("404");
    assert_eq!(reply.status, 404);
    assert!(reply.body_text().contains("error"), "{}", reply.body_text());

    let small = Host::builder().load(product_module()).unwrap();
    let config = testdata("filters/router.json").replace("4194304", "64");
    small.configure_plugin("router", config).unwrap();
    let s = small.new_http_stream().unwrap();
    post(&s, &[], &chat(LLAMA, &"x".repeat(200)));
    assert_eq!(s.local_response().map(|r| r.status), Some(413));
}

fn vllm_page(kv: f64, waiting: u32) -> String {
    format!(
        "# TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{model_name=\"{LLAMA}\",engine=\"0\"}} 1.0\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{model_name=\"{LLAMA}\",engine=\"0\"}} {waiting}.0\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{model_name=\"{LLAMA}\",engine=\"0\"}} {kv}\n"
    )
}

/// Carries shared-queue messages between `hosts` until none is left: the picks the worker
/// VMs send the state owner (in the scraper's VM), its answers and the lease releases.
fn exchange(hosts: &[&Host]) {
    for _ in 0..8 {
        let delivered: usize = hosts.iter().map(|h| h.deliver_queues().unwrap()).sum();
        if delivered == 0 {
            return;
        }
    }
    panic!("the VMs keep answering each other's queue messages");
}

/// Answers every pending scrape; the endpoint is the call's `:authority`.
fn answer_scrapes(scraper: &Host, kv_of: impl Fn(&str) -> f64) -> usize {
    let calls = scraper.pending_http_calls();
    for call in &calls {
        let endpoint = call.headers.get(":authority").unwrap_or_default();
        let page = vllm_page(kv_of(&endpoint), 0);
        scraper
            .respond_http_call(call.token, HttpCallResponse::new(200, page))
            .unwrap();
    }
    calls.len()
}

#[test]
fn scraper_publishes_and_the_picker_routes_inside_the_pool_avoiding_a_full_replica() {
    let shared = SharedData::new();
    let scraper = Host::builder()
        .vm_id("infergate")
        .shared_data(&shared)
        .load(product_module())
        .unwrap();
    let root = scraper
        .configure_plugin(
            "picker",
            common::picker_with_scraper(&testdata("filters/scraper.json")),
        )
        .unwrap();
    assert_eq!(scraper.tick_period_ms(root), Some(50));
    scraper.advance_time_ms(50).unwrap();
    let calls = scraper.pending_http_calls();
    assert_eq!(calls.len(), 4, "one scrape per endpoint: {calls:?}");
    assert!(calls
        .iter()
        .all(|c| c.upstream == "infergate_scrape" && c.path().as_deref() == Some("/metrics")));
    // 18001 is over the 0.9 KV threshold of picker.json.
    let answered = answer_scrapes(&scraper, |e| if e.ends_with(":18001") { 0.97 } else { 0.2 });
    assert_eq!(answered, 4);
    assert!(
        shared.get("infergate.snapshot").is_some(),
        "keys: {:?}",
        shared.keys()
    );

    let picker = Host::builder()
        .vm_id("infergate")
        .shared_data(&shared)
        .load(product_module())
        .unwrap();
    picker.set_time_ms(scraper.now_ms()).unwrap();
    picker
        .configure_plugin("picker", testdata("filters/picker.json"))
        .unwrap();
    let mut seen = Vec::new();
    for i in 0..12 {
        let s = picker.new_http_stream().unwrap();
        let headers = [
            ("x-gateway-base-model-name", LLAMA),
            ("x-gateway-model-name", LLAMA),
        ];
        post(&s, &headers, &chat(LLAMA, &format!("conversation {i}")));
        exchange(&[&scraper, &picker]);
        assert!(s.local_response().is_none(), "{:?}", s.local_response());
        let up = s.upstream_request_headers().expect("forwarded");
        let dest = up.get("x-gateway-destination-endpoint").expect("picked");
        let first = dest.split(',').next().unwrap_or_default().to_string();
        assert!(LLAMA_POOL.contains(&first.as_str()), "{dest}");
        assert_ne!(first, "127.0.0.1:18001", "over the KV threshold");
        seen.push(first);
        s.response_headers(&[(":status", "200")], false).unwrap();
        s.response_body(b"data: [DONE]\n\n", true).unwrap();
        assert!(s.done().unwrap());
    }
    assert!(
        seen.iter().any(|e| e == "127.0.0.1:18002") && seen.iter().any(|e| e == "127.0.0.1:18003"),
        "{seen:?}"
    );

    // With the router's handoff on the stream, the picker picks in its headers callback:
    // it waits for the owner's answer only, not for the body (the module reads back the
    // property the router set).
    let body = chat(LLAMA, "conversation with a handoff");
    let s = picker.new_http_stream().unwrap();
    s.set_property(&["infergate_handoff"], handoff_of(&body))
        .unwrap();
    let headers = [
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        (":authority", "gw"),
        ("x-gateway-base-model-name", LLAMA),
        ("x-gateway-model-name", LLAMA),
    ];
    assert_eq!(s.request_headers(&headers, false).unwrap(), Action::Pause);
    exchange(&[&scraper, &picker]);
    let up = s
        .upstream_request_headers()
        .expect("forwarded before any body");
    let dest = up.get("x-gateway-destination-endpoint").expect("picked");
    assert!(dest.split(',').all(|e| LLAMA_POOL.contains(&e)), "{dest}");
    // The picker's counters reach Envoy at its root's next tick.
    picker.tick().unwrap();
    assert_eq!(
        picker.metric("infergate.picker.handoff.pool.llama-pool"),
        Some(1)
    );
    s.request_body(body.as_bytes(), true).unwrap();
    s.response_headers(&[(":status", "200")], false).unwrap();
    s.response_body(b"data: [DONE]\n\n", true).unwrap();
    assert!(s.done().unwrap());
}

#[test]
fn stale_metrics_are_refused_under_fail_close() {
    let shared = SharedData::new();
    let scraper = Host::builder()
        .shared_data(&shared)
        .load(product_module())
        .unwrap();
    scraper
        .configure_plugin(
            "picker",
            common::picker_with_scraper(&testdata("filters/scraper.json")),
        )
        .unwrap();
    scraper.advance_time_ms(50).unwrap();
    answer_scrapes(&scraper, |_| 0.1);
    let picker = Host::builder()
        .shared_data(&shared)
        .load(product_module())
        .unwrap();
    // picker.json: staleAfterMs 1000 for the FailClose pool.
    picker.set_time_ms(scraper.now_ms() + 5_000).unwrap();
    picker
        .configure_plugin("picker", testdata("filters/picker.json"))
        .unwrap();
    let s = picker.new_http_stream().unwrap();
    post(
        &s,
        &[("x-gateway-base-model-name", LLAMA)],
        &chat(LLAMA, "hi"),
    );
    exchange(&[&scraper, &picker]);
    assert_eq!(s.local_response().map(|r| r.status), Some(503));
    assert_eq!(s.upstream_request_headers(), None);
}

#[test]
fn a_failed_scrape_does_not_crash_the_scraper() {
    let scraper = Host::load(product_module()).unwrap();
    scraper
        .configure_plugin(
            "picker",
            common::picker_with_scraper(&testdata("filters/scraper.json")),
        )
        .unwrap();
    scraper.advance_time_ms(50).unwrap();
    let token = scraper.pending_http_calls()[0].token;
    scraper.fail_http_call(token).unwrap();
    // A timeout (250 ms in scraper.json) is a failure too.
    scraper.advance_time_ms(300).unwrap();
    assert!(scraper.trapped().is_none());
}

/// Envoy enters a VM only for the callbacks its module exports. `proxy_on_done` would only
/// give the answer a host assumes without it (the context is done at once), so exporting it
/// would cost one VM entry per filter and request for nothing.
#[test]
fn the_module_exports_no_callback_that_only_repeats_the_hosts_default() {
    let module = infergate_wasm_host::engine::load_module(product_module()).unwrap();
    let exports: Vec<&str> = module.exports().map(|e| e.name()).collect();
    assert!(exports.contains(&"proxy_on_log"), "{exports:?}");
    assert!(!exports.contains(&"proxy_on_done"), "{exports:?}");
}

/// The product module configured as `root_id` with `config`.
fn module_as(root_id: &str, config: &str) -> anyhow::Result<Host> {
    let host = Host::builder().vm_id("infergate").load(product_module())?;
    host.configure_plugin(root_id, config)?;
    Ok(host)
}

/// The `probe` role (the Wasm floor of `bench overhead`) holds the request until its body is
/// complete and forwards it unchanged; it accepts no settings.
#[test]
fn the_probe_holds_the_request_for_its_body_and_forwards_it_unchanged() {
    let host = module_as("probe", r#"{"role":"probe"}"#).unwrap();
    let s = host.new_http_stream().unwrap();
    let headers = [(":method", "POST"), (":path", "/v1/chat/completions")];
    assert_eq!(s.request_headers(&headers, false).unwrap(), Action::Pause);
    assert_eq!(
        s.request_body(b"{\"model\":", false).unwrap(),
        Action::Pause
    );
    assert_eq!(s.request_body(b"\"m\"}", true).unwrap(), Action::Continue);
    assert_eq!(s.upstream_request_body(), b"{\"model\":\"m\"}");
    let up = s.upstream_request_headers().expect("forwarded");
    assert_eq!(up.get(":path").as_deref(), Some("/v1/chat/completions"));
    assert!(s.local_response().is_none());

    assert!(module_as("probe", r#"{"role":"probe","x":1}"#).is_err());
}

/// A request that ends with trailers leaves the probe at its trailers, body intact.
#[test]
fn the_probe_lets_a_request_with_trailers_go_at_its_trailers() {
    let host = module_as("probe", r#"{"role":"probe"}"#).unwrap();
    let s = host.new_http_stream().unwrap();
    let headers = [(":method", "POST"), (":path", "/v1/completions")];
    assert_eq!(s.request_headers(&headers, false).unwrap(), Action::Pause);
    assert_eq!(s.request_body(b"{\"x\":1}", false).unwrap(), Action::Pause);
    assert_eq!(
        s.request_trailers(&[("x-checksum", "1")]).unwrap(),
        Action::Continue
    );
    assert_eq!(s.upstream_request_body(), b"{\"x\":1}");
}

/// The router and the picker of one worker share a VM, so the picker is checked against
/// the router at configuration: a picker that leaves a routed base model without a pool
/// is refused (its requests could only be answered 503), naming the model; the full
/// example picker then loads in the same VM.
#[test]
fn a_picker_that_leaves_a_routed_base_model_without_a_pool_is_refused() {
    let host = router();
    let mut picker: serde_json::Value =
        serde_json::from_str(&testdata("filters/picker.json")).unwrap();
    picker["pools"]
        .as_array_mut()
        .unwrap()
        .retain(|p| p["baseModel"] == LLAMA);
    let refused = host.configure_plugin("picker", picker.to_string());
    assert!(refused.is_err(), "a picker without the qwen pool loaded");
    let logs = host.logs();
    assert!(
        logs.iter()
            .any(|l| l.message.contains("Qwen/Qwen2.5-7B-Instruct")),
        "{logs:?}"
    );
    host.configure_plugin("picker", testdata("filters/picker.json"))
        .unwrap();
    assert_eq!(host.trapped(), None);
}
