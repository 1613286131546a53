//! The built proxy-wasm module following a pool's membership the Wasm way: its scraper
//! polls Envoy's admin `/clusters?format=json` through the admin cluster (membership mode
//! `admin`, the default in Wasm), scrapes the members, and a picker pool without
//! `endpoints` picks among the healthy ones, as they change.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // helpers outside #[test] fns

mod common;

use common::product_module;
use infergate_wasm_host::{Action, Host, HttpCallResponse, SharedData};

const MODEL: &str = "m";

fn admin_answer(members: &[(&str, u16, &str)]) -> String {
    let hosts: Vec<String> = members
        .iter()
        .map(|(ip, port, eds)| {
            format!(
                r#"{{"address":{{"socket_address":{{"address":"{ip}","port_value":{port}}}}},"stats":[{{"name":"cx_total"}}],"health_status":{{"eds_health_status":"{eds}"}},"weight":1,"locality":{{}}}}"#
            )
        })
        .collect();
    format!(
        r#"{{"cluster_statuses":[{{"name":"infergate_admin","host_statuses":[]}},{{"name":"pool","host_statuses":[{}]}}]}}"#,
        hosts.join(",")
    )
}

fn page() -> String {
    format!(
        "vllm:num_requests_waiting{{model_name=\"{MODEL}\"}} 0\n\
         vllm:num_requests_running{{model_name=\"{MODEL}\"}} 0\n\
         vllm:kv_cache_usage_perc{{model_name=\"{MODEL}\"}} 0.1\n"
    )
}

/// Answers every pending call: the admin one with `admin`, scrapes with a page. Returns
/// the scraped authorities, sorted.
fn answer(scraper: &Host, admin: &str) -> Vec<String> {
    let mut scraped = Vec::new();
    for call in scraper.pending_http_calls() {
        if call.upstream == "infergate_admin" {
            assert_eq!(call.path().as_deref(), Some("/clusters?format=json"));
            scraper
                .respond_http_call(call.token, HttpCallResponse::new(200, admin.to_owned()))
                .unwrap();
        } else {
            scraped.push(call.headers.get(":authority").unwrap_or_default());
            scraper
                .respond_http_call(call.token, HttpCallResponse::new(200, page()))
                .unwrap();
        }
    }
    scraped.sort();
    scraped
}

fn exchange(hosts: &[&Host]) {
    for _ in 0..8 {
        let delivered: usize = hosts.iter().map(|h| h.deliver_queues().unwrap()).sum();
        if delivered == 0 {
            return;
        }
    }
    panic!("the VMs keep answering each other's queue messages");
}

/// The endpoints `n` requests were sent to.
fn picks(scraper: &Host, picker: &Host, n: usize) -> Vec<String> {
    picker.set_time_ms(scraper.now_ms()).unwrap();
    let mut seen = Vec::new();
    for i in 0..n {
        let s = picker.new_http_stream().unwrap();
        let headers = [
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            (":authority", "gw"),
            ("x-gateway-base-model-name", MODEL),
        ];
        assert_eq!(s.request_headers(&headers, false).unwrap(), Action::Pause);
        let body =
            format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"c{i}"}}]}}"#);
        s.request_body(body.as_bytes(), true).unwrap();
        exchange(&[scraper, picker]);
        assert!(s.local_response().is_none(), "{:?}", s.local_response());
        let up = s.upstream_request_headers().expect("forwarded");
        let dest = up.get("x-gateway-destination-endpoint").expect("picked");
        seen.extend(dest.split(',').map(str::to_owned));
        s.response_headers(&[(":status", "200")], false).unwrap();
        s.response_body(b"{}", true).unwrap();
    }
    seen.sort();
    seen.dedup();
    seen
}

#[test]
fn the_wasm_scraper_follows_the_admin_membership_and_the_picker_follows_the_snapshot() {
    let shared = SharedData::new();
    let scraper = Host::builder()
        .vm_id("infergate")
        .shared_data(&shared)
        .load(product_module())
        .unwrap();
    scraper
        .configure_plugin(
            "picker",
            common::picker_with_scraper(
                r#"{"clusters":["pool"], "intervalMs":50,"membershipIntervalMs":100}"#,
            ),
        )
        .unwrap();
    // First tick: the admin callout only (no member known yet).
    scraper.advance_time_ms(50).unwrap();
    let calls = scraper.pending_http_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].upstream, "infergate_admin");
    let two = admin_answer(&[
        ("127.0.0.1", 18001, "HEALTHY"),
        ("127.0.0.1", 18002, "DRAINING"),
    ]);
    assert!(answer(&scraper, &two).is_empty());
    // Next tick: both members are scraped (the draining one too: only its picks stop).
    scraper.advance_time_ms(50).unwrap();
    assert_eq!(
        answer(&scraper, &two),
        ["127.0.0.1:18001", "127.0.0.1:18002"]
    );
    assert_eq!(
        scraper.metric("infergate.scraper.membership_updates.result.ok"),
        Some(1)
    );

    let picker = Host::builder()
        .vm_id("infergate")
        .shared_data(&shared)
        .load(product_module())
        .unwrap();
    picker
        .configure_plugin(
            "picker",
            r#"{"role":"picker","snapshotKey":"infergate.snapshot","allowOnHeadersStopIteration":true,
                "pools":[{"pool":"pool","baseModel":"m","fallbacks":2}]}"#,
        )
        .unwrap();
    assert_eq!(picks(&scraper, &picker, 6), ["127.0.0.1:18001"]);

    // 18003 joins and 18002 becomes healthy: both get picks after the next poll and round.
    let three = admin_answer(&[
        ("127.0.0.1", 18001, "HEALTHY"),
        ("127.0.0.1", 18002, "HEALTHY"),
        ("127.0.0.1", 18003, "HEALTHY"),
    ]);
    for _ in 0..3 {
        scraper.advance_time_ms(50).unwrap();
        answer(&scraper, &three);
    }
    assert_eq!(
        picks(&scraper, &picker, 12),
        ["127.0.0.1:18001", "127.0.0.1:18002", "127.0.0.1:18003"]
    );

    // 18001 leaves: never picked again, not even as a fallback.
    let gone = admin_answer(&[
        ("127.0.0.1", 18002, "HEALTHY"),
        ("127.0.0.1", 18003, "HEALTHY"),
    ]);
    for _ in 0..3 {
        scraper.advance_time_ms(50).unwrap();
        answer(&scraper, &gone);
    }
    assert_eq!(
        picks(&scraper, &picker, 12),
        ["127.0.0.1:18002", "127.0.0.1:18003"]
    );
    // A bad admin answer keeps the membership.
    for _ in 0..3 {
        scraper.advance_time_ms(50).unwrap();
        answer(&scraper, "{not json");
    }
    assert!(scraper
        .metric("infergate.scraper.membership_updates.result.failed")
        .is_some_and(|n| n >= 1));
    assert_eq!(
        picks(&scraper, &picker, 8),
        ["127.0.0.1:18002", "127.0.0.1:18003"]
    );
    assert!(scraper.trapped().is_none() && picker.trapped().is_none());
}

#[test]
fn the_wasm_scraper_refuses_membership_host() {
    let scraper = Host::builder()
        .vm_id("infergate")
        .load(product_module())
        .unwrap();
    let refused = scraper.configure_plugin(
        "picker",
        common::picker_with_scraper(r#"{"clusters":["pool"],"membership":"host"}"#),
    );
    assert!(refused.is_err() || scraper.pending_http_calls().is_empty());
    assert!(scraper
        .logs()
        .iter()
        .any(|l| l.message.contains("membership") && l.message.contains("admin")));
}
