//! The host driven against a real proxy-wasm SDK module (`testmod/`), end to end.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // helpers outside #[test] fns

mod common;

use common::testmod;
use infergate_wasm_host::{Action, Host, HttpCallResponse, LogLevel, SharedData, Status};

fn filter_host() -> Host {
    let host = Host::load(testmod()).expect("load testmod");
    host.configure_plugin("filter", "upstream=pool")
        .expect("configure");
    host
}

#[test]
fn request_is_held_until_the_whole_body_arrived_then_forwarded_rewritten() {
    let host = filter_host();
    host.set_time_ms(1_800_000_000_123).unwrap();
    let s = host.new_http_stream().unwrap();
    let action = s
        .request_headers(
            &[
                (":method", "POST"),
                (":path", "/v1/x"),
                ("X-Private-Route", "evil"),
                ("content-type", "text/plain"),
            ],
            false,
        )
        .unwrap();
    assert_eq!(action, Action::Pause);
    assert_eq!(
        s.upstream_request_headers(),
        None,
        "headers must be held while paused"
    );
    assert_eq!(s.request_body(b"upper:hel", false).unwrap(), Action::Pause);
    assert!(s.upstream_request_body().is_empty());
    assert_eq!(s.request_body(b"lo", true).unwrap(), Action::Continue);

    let upstream = s.upstream_request_headers().expect("forwarded");
    assert_eq!(upstream.get("x-private-route"), None);
    assert_eq!(upstream.get("x-seen-headers").as_deref(), Some("4"));
    // body_size grew: the callback saw both chunks at once.
    assert_eq!(upstream.get("x-body-len").as_deref(), Some("11"));
    assert_eq!(upstream.get("x-now-ms").as_deref(), Some("1800000000123"));
    assert_eq!(upstream.get("x-property-path").as_deref(), Some("/v1/x"));
    assert_eq!(upstream.get("x-context-id"), Some(s.id().to_string()));
    assert_eq!(s.upstream_request_body(), b"UPPER:HELLO");
    assert_eq!(
        s.property(&["testmod", "stage"]).as_deref(),
        Some(&b"body"[..])
    );
    assert_eq!(host.metric("testmod.filter.requests"), Some(1));
    let histogram = host
        .metrics()
        .into_iter()
        .find(|m| m.name == "testmod.filter.body_bytes")
        .unwrap();
    assert_eq!(histogram.recorded, vec![11]);
}

#[test]
fn headers_only_request_continues_at_once() {
    let host = filter_host();
    let s = host.new_http_stream().unwrap();
    assert_eq!(
        s.request_headers(&[(":path", "/")], true).unwrap(),
        Action::Continue
    );
    assert!(s.upstream_request_headers().is_some());
}

#[test]
fn local_reply_is_recorded_and_nothing_goes_upstream() {
    let host = filter_host();
    let s = host.new_http_stream().unwrap();
    assert_eq!(
        s.request_headers(&[("x-reply", "429")], false).unwrap(),
        Action::Pause
    );
    let reply = s.local_response().expect("local reply");
    assert_eq!(reply.status, 429);
    assert_eq!(reply.body_text(), "{\"error\":\"asked\"}");
    assert_eq!(reply.headers.get("x-reason").as_deref(), Some("asked"));
    assert_eq!(reply.grpc_status, -1);
    assert_eq!(s.upstream_request_headers(), None);
    assert!(s.done().unwrap());
}

#[test]
fn stream_pauses_on_an_http_call_and_resumes_when_it_is_answered() {
    let host = filter_host();
    let s = host.new_http_stream().unwrap();
    assert_eq!(
        s.request_headers(&[("x-call", "1")], true).unwrap(),
        Action::Pause
    );
    let calls = host.pending_http_calls();
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!(
        (call.upstream.as_str(), call.path().as_deref()),
        ("pool", Some("/decide"))
    );
    assert_eq!(
        (call.body.as_slice(), call.timeout_ms, call.context_id),
        (&b"q"[..], 100, s.id())
    );
    assert_eq!(s.upstream_request_headers(), None);

    host.respond_http_call(call.token, HttpCallResponse::new(200, "10.0.0.7:8000"))
        .unwrap();
    assert!(host.pending_http_calls().is_empty());
    let upstream = s
        .upstream_request_headers()
        .expect("resumed by proxy_continue_stream");
    assert_eq!(
        upstream.get("x-call-result").as_deref(),
        Some("10.0.0.7:8000")
    );

    let failed = host.new_http_stream().unwrap();
    failed.request_headers(&[("x-call", "1")], true).unwrap();
    let token = host.pending_http_calls()[0].token;
    host.fail_http_call(token).unwrap();
    assert_eq!(
        failed.request_header("x-call-result").as_deref(),
        Some("failed")
    );
    assert!(
        host.respond_http_call(token, HttpCallResponse::new(200, ""))
            .is_err(),
        "already answered"
    );
}

#[test]
fn a_finished_stream_cancels_its_outstanding_calls() {
    let host = filter_host();
    let s = host.new_http_stream().unwrap();
    s.request_headers(&[("x-call", "1")], true).unwrap();
    assert!(s.done().unwrap());
    assert!(host.pending_http_calls().is_empty());
    assert_eq!(host.cancelled_http_calls().len(), 1);
}

#[test]
fn http_call_to_an_unknown_cluster_is_refused_like_envoy() {
    let host = Host::builder()
        .clusters(&["other"])
        .load(testmod())
        .unwrap();
    host.configure_plugin("filter", "upstream=pool").unwrap();
    let s = host.new_http_stream().unwrap();
    s.request_headers(&[("x-call", "1")], true).unwrap();
    assert!(host.pending_http_calls().is_empty());
    assert_eq!(s.local_response().map(|r| r.status), Some(503));
}

#[test]
fn response_streams_through_chunk_by_chunk() {
    let host = filter_host();
    let s = host.new_http_stream().unwrap();
    s.request_headers(&[(":path", "/")], true).unwrap();
    let action = s
        .response_headers(
            &[
                (":status", "200"),
                ("server", "vllm"),
                ("x-upstream-secret", "s"),
            ],
            false,
        )
        .unwrap();
    assert_eq!(action, Action::Continue);
    let down = s.downstream_response_headers().unwrap();
    assert_eq!(down.get("server").as_deref(), Some("testmod"));
    assert_eq!(down.get("x-upstream-secret"), None);
    assert_eq!(down.get("x-saw-status").as_deref(), Some("200"));
    assert_eq!(s.late_request_header_writes(), vec!["x-late".to_string()]);

    assert_eq!(
        s.response_body(b"data: 1\n\n", false).unwrap(),
        Action::Continue
    );
    assert_eq!(
        s.downstream_response_body(),
        b"data: 1\n\n",
        "first chunk forwarded before the last exists"
    );
    assert_eq!(
        s.response_body(b"data: 2\n\n", true).unwrap(),
        Action::Continue
    );
    assert_eq!(
        s.downstream_response_body(),
        b"data: 1\n\ndata: 2\n\n\n[bytes=18]"
    );
}

#[test]
fn done_runs_on_log_and_the_gauge_follows_live_streams() {
    let host = filter_host();
    let a = host.new_http_stream().unwrap();
    let b = host.new_http_stream().unwrap();
    assert_eq!(host.metric("testmod.filter.inflight"), Some(2));
    assert!(a.done().unwrap());
    assert_eq!(host.metric("testmod.filter.inflight"), Some(1));
    assert!(host.logged(&format!("stream {} done after 0 response bytes", a.id())));
    assert!(a.state().deleted);
    assert!(a.done().unwrap(), "done twice is harmless");
    assert!(b.done().unwrap());
    assert_eq!(host.metric("testmod.filter.inflight"), Some(0));
}

#[test]
fn scraper_ticks_publish_to_shared_data_seen_by_another_vm() {
    let shared = SharedData::new();
    let scraper = Host::builder()
        .vm_id("gw")
        .shared_data(&shared)
        .load(testmod())
        .unwrap();
    let root = scraper
        .configure_plugin("poller", "tick_ms=50\nupstream=pool\npath=/metrics")
        .unwrap();
    assert_eq!(scraper.tick_period_ms(root), Some(50));
    let worker = Host::builder()
        .vm_id("gw")
        .shared_data(&shared)
        .load(testmod())
        .unwrap();
    worker.configure_plugin("filter", "").unwrap();

    scraper.advance_time_ms(49).unwrap();
    assert!(scraper.pending_http_calls().is_empty());
    scraper.advance_time_ms(1).unwrap();
    let calls = scraper.pending_http_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].path().as_deref(), Some("/metrics"));
    assert_eq!(calls[0].headers.get(":authority").as_deref(), Some("pool"));
    scraper
        .respond_http_call(calls[0].token, HttpCallResponse::new(200, "snap-1"))
        .unwrap();
    assert_eq!(shared.get_string("snapshot").as_deref(), Some("snap-1"));
    assert_eq!(shared.get_string("snapshot-status").as_deref(), Some("200"));
    assert_eq!(scraper.metric("testmod.poller.scrapes_ok"), Some(1));

    let s = worker.new_http_stream().unwrap();
    s.request_headers(&[(":path", "/")], true).unwrap();
    assert_eq!(s.request_header("x-snapshot").as_deref(), Some("snap-1"));

    // The next tick's call is never answered: its 40 ms timeout fails it before the tick after.
    scraper.advance_time_ms(50 + 40).unwrap();
    assert_eq!(scraper.metric("testmod.poller.scrapes_failed"), Some(1));
    assert!(scraper.pending_http_calls().is_empty());
    scraper.advance_time_ms(10).unwrap();
    assert_eq!(scraper.pending_http_calls().len(), 1, "third tick at t=150");
    scraper.tick().unwrap();
    assert_eq!(scraper.pending_http_calls().len(), 2, "explicit tick");
}

#[test]
fn shared_counter_with_cas_across_two_vms() {
    let shared = SharedData::new();
    let hosts: Vec<Host> = (0..2)
        .map(|_| {
            let h = Host::builder()
                .shared_data(&shared)
                .load(testmod())
                .unwrap();
            h.configure_plugin("filter", "").unwrap();
            h
        })
        .collect();
    for i in 1..=6u32 {
        let s = hosts[(i % 2) as usize].new_http_stream().unwrap();
        s.request_headers(&[("x-cas-incr", "1")], true).unwrap();
        assert_eq!(s.request_header("x-counter"), Some(i.to_string()));
    }
    let (value, cas) = shared.get("counter").unwrap();
    assert_eq!(value, b"6");
    assert!(shared.set("counter", b"x", cas.wrapping_add(1)).is_err());
}

#[test]
fn foreign_functions_default_to_not_found_and_can_be_registered() {
    let host = filter_host();
    let s = host.new_http_stream().unwrap();
    s.request_headers(&[("x-ffi", "1")], true).unwrap();
    assert_eq!(
        s.request_header("x-ffi-result").as_deref(),
        Some("not-found")
    );
    host.register_foreign_function("testmod_probe", |args| {
        if args == b"args" {
            Ok(b"pong".to_vec())
        } else {
            Err(Status::BadArgument)
        }
    })
    .unwrap();
    let s = host.new_http_stream().unwrap();
    s.request_headers(&[("x-ffi", "1")], true).unwrap();
    assert_eq!(s.request_header("x-ffi-result").as_deref(), Some("pong"));
    let calls = host.foreign_calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        (calls[0].name.as_str(), calls[0].status),
        ("testmod_probe", Status::NotFound)
    );
    assert_eq!(
        (calls[1].arguments.as_slice(), calls[1].status),
        (&b"args"[..], Status::Ok)
    );
}

#[test]
fn vm_config_plugin_config_and_root_ids() {
    let host = Host::builder().vm_config("vmcfg").load(testmod()).unwrap();
    let filter = host.configure_plugin("filter", "").unwrap();
    let poller = host.configure_plugin("poller", "tick_ms=0").unwrap();
    assert_ne!(filter, poller);
    assert_eq!(host.root_context_id("poller"), Some(poller));
    assert!(host.logged("vm started with config 'vmcfg'"));
    assert!(host.logged(&format!("configured root {poller} as 'poller'")));
    assert!(
        host.new_http_stream().is_err(),
        "ambiguous with two plugins"
    );
    let s = host.new_http_stream_on(filter).unwrap();
    s.request_headers(&[], true).unwrap();
    assert_eq!(s.request_header("x-vm-config").as_deref(), Some("vmcfg"));
    let err = host.configure_plugin("filter2", "reject").unwrap_err();
    assert!(
        err.to_string()
            .contains("proxy_on_configure returned false"),
        "{err}"
    );
}

#[test]
fn a_panic_in_the_module_is_an_error_that_quotes_it_and_poisons_the_vm() {
    let host = filter_host();
    let s = host.new_http_stream().unwrap();
    let err = s
        .request_headers(&[("x-panic", "1")], true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("proxy_on_request_headers"), "{err}");
    assert!(err.contains("asked to panic"), "{err}");
    assert!(host.trapped().is_some());
    assert!(host
        .logs()
        .iter()
        .any(|l| l.level == LogLevel::Critical && l.message.contains("asked to panic")));
    assert!(host.new_http_stream().is_err());
}

#[test]
fn on_done_false_keeps_the_context_until_proxy_done() {
    let host = filter_host();
    let s = host.new_http_stream().unwrap();
    s.request_headers(&[("x-call", "1"), ("x-defer-done", "1")], true)
        .unwrap();
    assert!(!s.done().unwrap(), "the module asked to finish later");
    assert_eq!(host.metric("testmod.filter.inflight"), Some(1));
    assert_eq!(
        host.pending_http_calls().len(),
        1,
        "not cancelled: context alive"
    );
    let token = host.pending_http_calls()[0].token;
    host.respond_http_call(token, HttpCallResponse::new(200, "x"))
        .unwrap();
    assert!(s.state().deleted, "proxy_done finished it");
    assert_eq!(host.metric("testmod.filter.inflight"), Some(0));
}

#[test]
fn reading_call_headers_of_a_failed_call_crashes_the_sdk_as_in_envoy() {
    let host = filter_host();
    let ok = host.new_http_stream().unwrap();
    ok.request_headers(&[("x-call", "1"), ("x-read-status", "1")], true)
        .unwrap();
    let token = host.pending_http_calls()[0].token;
    host.respond_http_call(token, HttpCallResponse::new(503, ""))
        .unwrap();
    assert_eq!(ok.request_header("x-call-status").as_deref(), Some("503"));

    let failed = host.new_http_stream().unwrap();
    failed
        .request_headers(&[("x-call", "1"), ("x-read-status", "1")], true)
        .unwrap();
    let token = host.pending_http_calls()[0].token;
    let err = host.fail_http_call(token).unwrap_err().to_string();
    // proxy_get_header_map_value answered BadArgument (2): the SDK panics on it.
    assert!(err.contains("unexpected status: 2"), "{err}");
}
