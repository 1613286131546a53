//! A host in trouble: every read the product module makes answered with error statuses
//! (the ones Envoy can give, numbers outside the ABI) or garbled bytes. The request fails
//! closed with 500 where the module could not see what it must, proceeds where the read
//! was optional, and the VM always serves the next request. The scraper keeps scraping
//! through refused, failed, lost and unreadable callouts and failed publishes, and its
//! failures show in its stats.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // helpers outside #[test] fns

mod common;

use common::gateway::{answer_scrapes, chat, chat_headers, vllm_page, Gateway, Outcome};
use infergate_wasm_host::{Host, HostcallFault, HttpCallResponse, Status};

/// Statuses a read can meet: the ones Envoy answers, and numbers the ABI does not define.
fn error_statuses() -> Vec<HostcallFault> {
    let mut faults: Vec<HostcallFault> = [
        Status::BadArgument,
        Status::SerializationFailure,
        Status::InvalidMemoryAccess,
        Status::InternalFailure,
        Status::Unimplemented,
    ]
    .iter()
    .map(|s| HostcallFault::Status(s.code()))
    .collect();
    faults.extend([5, 9, 11, 99, u32::MAX].map(HostcallFault::Status));
    faults
}

fn request(gw: &Gateway) -> Outcome {
    gw.request(chat_headers(&[]), chat("hi").as_bytes())
        .unwrap()
}

/// Runs one request with `fault` injected into `hostcall`, then checks the VM still serves.
fn with_fault(gw: &Gateway, hostcall: &str, fault: &HostcallFault) -> Outcome {
    gw.worker.inject_fault(hostcall, fault.clone()).unwrap();
    let outcome = request(gw);
    gw.worker.clear_faults().unwrap();
    assert_eq!(gw.worker.trapped(), None, "{hostcall} {fault:?}");
    gw.assert_serving();
    outcome
}

#[test]
fn failed_reads_of_the_request_fail_it_closed_with_500() {
    let gw = Gateway::start();
    for hostcall in [
        "proxy_get_header_map_pairs",
        "proxy_get_header_map_value",
        "proxy_get_buffer_bytes",
    ] {
        for fault in error_statuses() {
            let outcome = with_fault(&gw, hostcall, &fault);
            assert_eq!(outcome.status(), Some(500), "{hostcall} {fault:?}");
        }
    }
}

#[test]
fn a_garbled_header_map_fails_the_request_closed() {
    let gw = Gateway::start();
    let mut huge_count = u32::MAX.to_le_bytes().to_vec();
    huge_count.extend_from_slice(&[1, 0, 0, 0]);
    let mut short_value = vec![1, 0, 0, 0, 1, 0, 0, 0, 200, 0, 0, 0];
    short_value.extend_from_slice(b"a\0bc\0");
    for garbage in [vec![7], vec![1, 0, 0, 0], huge_count, short_value] {
        let fault = HostcallFault::Bytes(garbage);
        let outcome = with_fault(&gw, "proxy_get_header_map_pairs", &fault);
        assert_eq!(outcome.status(), Some(500), "{fault:?}");
    }
}

#[test]
fn reads_that_find_nothing_let_the_request_proceed() {
    let gw = Gateway::start();
    let not_found = HostcallFault::Status(Status::NotFound.code());
    // No header at all: not an inference path, so the router lets it through untouched.
    let outcome = with_fault(&gw, "proxy_get_header_map_value", &not_found);
    assert!(matches!(outcome, Outcome::Forwarded(_)), "{outcome:?}");
    // No body: the router answers as for an empty body.
    let outcome = with_fault(&gw, "proxy_get_buffer_bytes", &not_found);
    assert_eq!(outcome.status(), Some(400), "{outcome:?}");
}

#[test]
fn optional_reads_and_writes_that_fail_do_not_stop_the_request() {
    let gw = Gateway::start();
    for fault in error_statuses() {
        // The router's handoff cannot be read back: the picker parses the body itself.
        let outcome = with_fault(&gw, "proxy_get_property", &fault);
        assert_eq!(outcome.destination().map(|d| d.len()), Some(1), "{fault:?}");
        // Nor stored.
        let outcome = with_fault(&gw, "proxy_set_property", &fault);
        assert_eq!(outcome.destination().map(|d| d.len()), Some(1), "{fault:?}");
        // Stats are best effort.
        for hostcall in [
            "proxy_define_metric",
            "proxy_increment_metric",
            "proxy_record_metric",
        ] {
            let outcome = with_fault(&gw, hostcall, &fault);
            assert_eq!(outcome.destination().map(|d| d.len()), Some(1), "{fault:?}");
        }
        // The snapshot cannot be read again: the picker keeps the one it decoded last.
        let outcome = with_fault(&gw, "proxy_get_shared_data", &fault);
        assert_eq!(outcome.destination().map(|d| d.len()), Some(1), "{fault:?}");
    }
}

#[test]
fn a_picker_that_never_read_a_snapshot_refuses_under_fail_close() {
    // The picks are made by the state owner in the scraper's VM: it is the one reading
    // the snapshot.
    for fault in error_statuses() {
        let gw = Gateway::start();
        gw.scraper
            .inject_fault("proxy_get_shared_data", fault.clone())
            .unwrap();
        let outcome = request(&gw);
        gw.scraper.clear_faults().unwrap();
        assert_eq!(outcome.status(), Some(503), "{fault:?}");
        assert_eq!(gw.scraper.trapped(), None, "{fault:?}");
        gw.assert_serving();
    }
}

#[test]
fn a_host_that_refuses_every_write_and_the_reply_does_not_kill_the_vm() {
    let gw = Gateway::start();
    for fault in error_statuses() {
        for hostcall in [
            "proxy_replace_header_map_value",
            "proxy_remove_header_map_value",
            "proxy_send_local_response",
            "proxy_log",
            "proxy_get_current_time_nanoseconds",
        ] {
            // Whatever the request's fate, the VM survives and serves the next one.
            with_fault(&gw, hostcall, &fault);
        }
        // A failed read whose 500 cannot be sent either: held, not crashed.
        gw.worker
            .inject_fault("proxy_send_local_response", fault.clone())
            .unwrap();
        let outcome = with_fault(&gw, "proxy_get_header_map_pairs", &fault);
        assert_eq!(outcome, Outcome::Held, "{fault:?}");
    }
}

/// Sum of a scraper counter over its endpoints (`result` is `ok` or `failed`).
fn scrapes(scraper: &Host, result: &str) -> u64 {
    let suffix = format!(".result.{result}");
    scraper
        .metrics()
        .iter()
        .filter(|m| m.name.starts_with("infergate.scraper.scrapes.") && m.name.ends_with(&suffix))
        .map(|m| m.value)
        .sum()
}

fn endpoint_of(call: &infergate_wasm_host::HttpCall) -> String {
    call.headers.get(":authority").unwrap_or_default()
}

#[test]
fn the_scraper_keeps_scraping_through_every_kind_of_failed_callout() {
    let gw = Gateway::start();
    let scraper = &gw.scraper;
    assert_eq!(scrapes(scraper, "ok"), 4);
    let publishes = || scraper.metric("infergate.scraper.publishes").unwrap_or(0);

    // The host refuses every dispatch of a round: each endpoint fails, nothing is pending.
    for fault in error_statuses() {
        let failed = scrapes(scraper, "failed");
        scraper
            .inject_fault("proxy_http_call", fault.clone())
            .unwrap();
        scraper.advance_time_ms(50).unwrap();
        scraper.clear_faults().unwrap();
        assert!(scraper.pending_http_calls().is_empty(), "{fault:?}");
        assert_eq!(scrapes(scraper, "failed"), failed + 4, "{fault:?}");
    }

    // Next round: one call reset, one lost for good, one answered with an unreadable
    // status, one with an unreadable body.
    scraper.advance_time_ms(50).unwrap();
    let calls = scraper.pending_http_calls();
    assert_eq!(calls.len(), 4, "scraping resumed after the refusals");
    let failed = scrapes(scraper, "failed");
    scraper.fail_http_call(calls[0].token).unwrap();
    scraper.drop_http_call(calls[1].token).unwrap();
    let lost = endpoint_of(&calls[1]);
    let page = || HttpCallResponse::new(200, vllm_page(0.3));
    scraper
        .inject_status("proxy_get_header_map_value", Status::InternalFailure)
        .unwrap();
    scraper.respond_http_call(calls[2].token, page()).unwrap();
    scraper.clear_faults().unwrap();
    scraper
        .inject_fault("proxy_get_buffer_bytes", HostcallFault::Status(99))
        .unwrap();
    scraper.respond_http_call(calls[3].token, page()).unwrap();
    scraper.clear_faults().unwrap();
    assert_eq!(scrapes(scraper, "failed"), failed + 3);

    // The three are scraped again at the next tick; the lost one stays outstanding...
    scraper.advance_time_ms(50).unwrap();
    let again: Vec<String> = scraper
        .pending_http_calls()
        .iter()
        .map(endpoint_of)
        .collect();
    assert_eq!(again.len(), 3, "{again:?}");
    assert!(!again.contains(&lost), "{again:?}");
    answer_scrapes(scraper);

    // ...until twice its timeout (2 × 250 ms) has passed: then it counts as failed and is
    // scraped again, and a good answer clears its failure gauge.
    let mut rescraped = false;
    for _ in 0..12 {
        scraper.advance_time_ms(50).unwrap();
        rescraped |= scraper
            .pending_http_calls()
            .iter()
            .any(|c| endpoint_of(c) == lost);
        answer_scrapes(scraper);
    }
    assert!(
        rescraped,
        "the lost callout's endpoint was never scraped again"
    );
    let gauge = format!(
        "infergate.scraper.consecutive_failures.endpoint.{}",
        lost.replace(['.', ':'], "_")
    );
    assert_eq!(scraper.metric(&gauge), Some(0), "{:?}", scraper.metrics());

    // A publish the host refuses is counted, and the next one goes through.
    let before = publishes();
    scraper
        .inject_status("proxy_set_shared_data", Status::InternalFailure)
        .unwrap();
    scraper.advance_time_ms(50).unwrap();
    answer_scrapes(scraper);
    scraper.clear_faults().unwrap();
    assert!(
        scraper
            .metric("infergate.scraper.publish_errors")
            .unwrap_or(0)
            >= 1
    );
    assert_eq!(publishes(), before);
    scraper.advance_time_ms(50).unwrap();
    answer_scrapes(scraper);
    assert!(publishes() > before);
    assert_eq!(scraper.trapped(), None);
}

#[test]
fn an_oversized_page_is_a_failed_scrape_and_never_copied_into_the_vm() {
    let scraper = Host::builder().load(common::product_module()).unwrap();
    let config = common::testdata("filters/scraper.json")
        .replace("\"path\"", "\"maxMetricsPageBytes\": 1024, \"path\"");
    scraper
        .configure_plugin("picker", common::picker_with_scraper(&config))
        .unwrap();
    // Every scraper stat exists from the election on.
    assert_eq!(scraper.metric("infergate.scraper.tick_failures"), None);
    scraper.advance_time_ms(50).unwrap();
    assert_eq!(scraper.metric("infergate.scraper.tick_failures"), Some(0));
    assert_eq!(scrapes(&scraper, "failed"), 0);
    // Were the body copied, it would read as this small valid page and succeed.
    scraper
        .inject_fault(
            "proxy_get_buffer_bytes",
            HostcallFault::Bytes(vllm_page(0.1).into_bytes()),
        )
        .unwrap();
    let huge = vllm_page(0.1).repeat(200);
    for call in scraper.pending_http_calls() {
        scraper
            .respond_http_call(call.token, HttpCallResponse::new(200, huge.clone()))
            .unwrap();
    }
    assert_eq!(scrapes(&scraper, "failed"), 4);
    assert_eq!(scrapes(&scraper, "ok"), 0);
    assert!(scraper.logged("above maxMetricsPageBytes"));
    // A page within the limit is copied and scraped.
    scraper.clear_faults().unwrap();
    scraper.advance_time_ms(50).unwrap();
    answer_scrapes(&scraper);
    assert_eq!(scrapes(&scraper, "ok"), 4);
    assert_eq!(scraper.trapped(), None);
}
