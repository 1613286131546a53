//! Header values as Envoy really passes them (bytes 0x80–0xFF, control bytes, 60 KiB
//! values, a hundred duplicates of the destination header in mixed case) through the
//! product module's router and picker: each request is served as a clean one would be, and
//! the VM serves the next request.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // helpers outside #[test] fns

mod common;

use common::gateway::{chat, chat_headers, Gateway, Outcome, LLAMA, LLAMA_POOL};
use infergate_wasm_host::HeaderMap;

/// Every byte from 0x80 to 0xFF, and the control bytes Envoy lets through (no NUL, CR, LF).
fn high_bytes() -> Vec<u8> {
    (0x80..=0xFF_u8).collect()
}

fn control_bytes() -> Vec<u8> {
    (0x01..0x20_u8)
        .chain([0x7F])
        .filter(|b| !matches!(b, b'\r' | b'\n'))
        .collect()
}

/// A hundred `x-gateway-destination-endpoint` headers, names in changing case.
fn spoofed_destinations(map: &mut HeaderMap) {
    for i in 0..100 {
        let name = match i % 3 {
            0 => "X-Gateway-Destination-Endpoint",
            1 => "x-GATEWAY-destination-ENDPOINT",
            _ => "x-gateway-destination-endpoint",
        };
        map.add(name, format!("6.6.6.{}:80", i % 250).as_bytes());
    }
}

fn assert_picked_once(outcome: &Outcome) -> HeaderMap {
    let Outcome::Forwarded(up) = outcome else {
        panic!("not forwarded: {outcome:?}");
    };
    let dest = up.get_all("x-gateway-destination-endpoint");
    assert_eq!(
        dest.len(),
        1,
        "exactly the picker's one destination: {dest:?}"
    );
    // The pick, then its fallbacks: every one an endpoint of the pool.
    assert!(
        dest[0].split(',').all(|e| LLAMA_POOL.contains(&e)),
        "{dest:?}"
    );
    up.clone()
}

#[test]
fn a_value_with_a_byte_above_0x7f_is_served_and_so_is_the_next_request() {
    let gw = Gateway::start();
    for _ in 0..2 {
        let outcome = gw
            .request(
                chat_headers(&[("x-note", b"caf\xe9")]),
                chat("hello").as_bytes(),
            )
            .unwrap();
        let up = assert_picked_once(&outcome);
        // Passed on byte for byte: the gateway neither rejects nor rewrites the value.
        assert_eq!(up.get_bytes("x-note"), Some(&b"caf\xe9"[..]));
    }
    gw.assert_serving();
}

#[test]
fn high_bytes_control_bytes_and_a_60_kib_value_are_served() {
    let gw = Gateway::start();
    let big = vec![b'a'; 60 * 1024];
    let high = high_bytes();
    let control = control_bytes();
    // In an ordinary header, in the session header the picker reads, and in the model
    // headers the router overwrites.
    let extra: [(&str, &[u8]); 5] = [
        ("x-high", &high),
        ("x-control", &control),
        ("x-big", &big),
        ("x-session-id", &high),
        ("x-gateway-base-model-name", &control),
    ];
    let outcome = gw
        .request(chat_headers(&extra), chat("hostile headers").as_bytes())
        .unwrap();
    let up = assert_picked_once(&outcome);
    assert_eq!(up.get_bytes("x-high"), Some(&high[..]));
    assert_eq!(up.get_bytes("x-control"), Some(&control[..]));
    assert_eq!(up.get_bytes("x-big").map(<[u8]>::len), Some(60 * 1024));
    assert_eq!(up.get("x-gateway-base-model-name").as_deref(), Some(LLAMA));
    gw.assert_serving();
}

#[test]
fn a_hundred_mixed_case_destinations_are_replaced_by_one_pick() {
    let gw = Gateway::start();
    let mut headers = chat_headers(&[("x-note", b"\xff\xfe")]);
    spoofed_destinations(&mut headers);
    let outcome = gw.request(headers, chat("spoof").as_bytes()).unwrap();
    let up = assert_picked_once(&outcome);
    assert!(!up.get_all("x-gateway-destination-endpoint")[0].starts_with("6.6.6."));
    gw.assert_serving();
}

#[test]
fn a_picker_alone_drops_a_hundred_spoofed_destinations() {
    let gw = Gateway::start();
    let mut headers = chat_headers(&[
        ("x-gateway-base-model-name", LLAMA.as_bytes()),
        ("x-gateway-model-name", LLAMA.as_bytes()),
        ("x-session-id", b"\xe9\x01"),
    ]);
    spoofed_destinations(&mut headers);
    let p = gw.worker.new_http_stream_on(gw.picker).unwrap();
    p.request_header_map_in(headers, false).unwrap();
    p.request_body(chat("picker only").as_bytes(), true)
        .unwrap();
    // The pick goes to the state owner (the scraper VM) and its answer resumes the stream.
    gw.exchange_queue_messages().unwrap();
    assert!(p.local_response().is_none(), "{:?}", p.local_response());
    let up = p.upstream_request_headers().expect("forwarded");
    assert_picked_once(&Outcome::Forwarded(up));
    assert!(p.done().unwrap());
    gw.assert_serving();
}

#[test]
fn pass_through_paths_strip_the_spoofed_destinations_and_keep_hostile_values() {
    let gw = Gateway::start();
    let mut headers = HeaderMap::from_pairs(&[(":method", "GET"), (":path", "/v1/files")]);
    headers.add("x-note", &high_bytes());
    headers.add("x-control", &control_bytes());
    headers.add("x-big", &vec![b'z'; 60 * 1024]);
    spoofed_destinations(&mut headers);
    let r = gw.worker.new_http_stream_on(gw.router).unwrap();
    r.request_header_map_in(headers, true).unwrap();
    assert!(r.local_response().is_none(), "{:?}", r.local_response());
    let up = r.upstream_request_headers().expect("passed through");
    assert!(up.get_all("x-gateway-destination-endpoint").is_empty());
    assert_eq!(up.get_bytes("x-note"), Some(&high_bytes()[..]));
    assert_eq!(up.get_bytes("x-big").map(<[u8]>::len), Some(60 * 1024));
    assert!(r.done().unwrap());
    gw.assert_serving();
}
