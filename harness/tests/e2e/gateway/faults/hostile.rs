//! Hostile requests: header values no well-behaved client sends, bodies built to hurt a
//! parser or its memory, and bodies that arrive too slowly or never finish. Each is
//! answered (served, or refused with the right status), and Envoy goes on serving with
//! nothing left in flight. The stack is the deployment form of the template (no `/rr`
//! baseline), with short client timeouts.

use super::{with_sessions, MODEL, SESSION_HEADER};
use crate::support::gw::{self, Plan};
use crate::support::h2::H2;
use crate::support::raw::{self, RawResponse};
use crate::support::settle::{envoy_heap_kib, envoy_rss_kib, nothing_in_flight, still_serving};
use crate::support::{TestBackend, QUICK};
use hyper::header::HeaderValue;
use infergate_harness::launch::{ClientTimeouts, Flavor, PoolSpec, Stack};
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// Short client timeouts, so the slow-body cases are quick.
const TIMEOUTS: ClientTimeouts = ClientTimeouts {
    request: Duration::from_secs(3),
    request_headers: Duration::from_secs(2),
    stream_idle: Duration::from_secs(300),
};

const CHAT: &str = "/v1/chat/completions";
/// A path the router passes through untouched (not an inference API, nor `/v1/models`,
/// which the router answers itself): no pool route matches it, so Envoy answers 404 once
/// the filters have seen its headers.
const PASS_THROUGH: &str = "/v1/files";
const DESTINATION: &str = "x-gateway-destination-endpoint";

/// What a case must get back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// 200 from a replica (the backend's JSON names it).
    Served,
    /// This status, from Envoy or the gateway.
    Status(u16),
}

/// A header-value case: `name: value`, and the answer on each kind of path.
struct HeaderCase {
    what: &'static str,
    name: &'static [u8],
    value: Vec<u8>,
    inference: Expect,
    pass_through: Expect,
}

pub(in crate::gateway) async fn hostile_requests_are_answered_and_envoy_keeps_serving(
    flavor: Flavor,
) {
    let backends = TestBackend::many(2, QUICK).await;
    let mut plan = Plan::new(vec![PoolSpec::all(MODEL)]);
    plan.tweak = Some(Box::new(|p| with_sessions(p, MODEL)));
    plan.timeouts = TIMEOUTS;
    // What users deploy: the template without the `/rr` benchmark baseline.
    plan.baseline = false;
    let Some(stack) = gw::start(flavor, &backends, plan).await else {
        return;
    };
    let mut wrong = Vec::new();
    still_serving(&stack, MODEL, "nothing hostile yet").await;
    // No baseline route: `/rr/...` is an ordinary path, passed through to no route.
    let req = raw::post_json("/rr/v1/chat/completions", &[], &chat_body("baseline?"));
    let got = raw::exchange(stack.envoy().listener(), req, Duration::from_secs(10)).await;
    check(
        "the deployment form's /rr/",
        got,
        Expect::Status(404),
        &mut wrong,
    );
    header_values(&stack, &backends, &mut wrong).await;
    duplicate_steering_headers(&stack, &backends, &mut wrong).await;
    headers_over_http2(&stack, &backends, &mut wrong).await;
    bodies(&stack, &mut wrong).await;
    slow_and_abandoned_requests(&stack, &backends, &mut wrong).await;
    assert!(
        wrong.is_empty(),
        "{flavor}: {} hostile cases answered wrongly:\n{}\n--- envoy log:\n{}",
        wrong.len(),
        wrong.join("\n"),
        stack.envoy().log_tail(30)
    );
}

fn chat_body(content: &str) -> Vec<u8> {
    json!({"model": MODEL, "messages": [{"role": "user", "content": content}]})
        .to_string()
        .into_bytes()
}

/// Checks `got` against `expect`, recording a mismatch in `wrong`.
fn check(what: &str, got: Result<RawResponse, String>, expect: Expect, wrong: &mut Vec<String>) {
    match (got, expect) {
        (Ok(r), Expect::Served) if r.status == 200 && r.json()["backend"].is_string() => {}
        (Ok(r), Expect::Status(s)) if r.status == s => {}
        (Ok(r), _) => wrong.push(format!(
            "{what}: expected {expect:?}, got {} {}",
            r.status,
            r.text().chars().take(200).collect::<String>()
        )),
        (Err(e), _) => wrong.push(format!("{what}: expected {expect:?}, got no answer: {e}")),
    }
}

fn header_cases() -> Vec<HeaderCase> {
    let high: Vec<u8> = (0x80..=0xFFu8).collect();
    // Every control byte but NUL, and but CR and LF (which end a header line).
    let control: Vec<u8> = (0x01..0x20u8)
        .filter(|b| ![b'\r', b'\n', b'\t'].contains(b))
        .chain([0x7F])
        .collect();
    let served = |what, name, value| HeaderCase {
        what,
        name,
        value,
        inference: Expect::Served,
        pass_through: Expect::Status(404),
    };
    let refused = |what, name, value, status| HeaderCase {
        what,
        name,
        value,
        inference: Expect::Status(status),
        pass_through: Expect::Status(status),
    };
    vec![
        served("a byte above 0x7F", b"x-note", b"caf\xe9".to_vec()),
        served("every byte 0x80-0xFF", b"x-note", high.clone()),
        served(
            "bytes 0x80-0xFF in the session header",
            SESSION_HEADER.as_bytes(),
            high.clone(),
        ),
        served(
            "bytes 0x80-0xFF in the steering header",
            DESTINATION.as_bytes(),
            high,
        ),
        served(
            "invalid UTF-8 sequences",
            b"x-note",
            b"\xc3\x28 \xe2\x82 \xf0\x28\x8c\xbc \xed\xa0\x80".to_vec(),
        ),
        refused("control bytes", b"x-note", control.clone(), 400),
        refused(
            "control bytes in the session header",
            SESSION_HEADER.as_bytes(),
            control,
            400,
        ),
        refused("one 0x01 byte", b"x-note", b"a\x01b".to_vec(), 400),
        refused("a DEL byte", b"x-note", b"a\x7fb".to_vec(), 400),
        served("a 56 KiB value", b"x-note", vec![b'v'; 56 << 10]),
        served(
            "a 56 KiB session id",
            SESSION_HEADER.as_bytes(),
            vec![b's'; 56 << 10],
        ),
        refused(
            "a 64 KiB value (over Envoy's 60 KiB of headers)",
            b"x-note",
            vec![b'v'; 64 << 10],
            431,
        ),
    ]
}

async fn header_values(stack: &Stack, backends: &[TestBackend], wrong: &mut Vec<String>) {
    let addr = stack.envoy().listener();
    for case in header_cases() {
        let headers: [(&[u8], &[u8]); 1] = [(case.name, &case.value)];
        let what = format!("HTTP/1.1 {} ({})", case.what, CHAT);
        let served_before: u64 = backends.iter().map(TestBackend::served).sum();
        let req = raw::post_json(CHAT, &headers, &chat_body(case.what));
        let got = raw::exchange(addr, req, Duration::from_secs(10)).await;
        check(&what, got, case.inference, wrong);
        if case.inference != Expect::Served {
            let served: u64 = backends.iter().map(TestBackend::served).sum();
            if served != served_before {
                wrong.push(format!("{what}: refused, yet a replica was sent it"));
            }
        }
        still_serving(stack, MODEL, &what).await;
        let what = format!("HTTP/1.1 {} ({})", case.what, PASS_THROUGH);
        let req = raw::request("GET", PASS_THROUGH, &headers, b"");
        let got = raw::exchange(addr, req, Duration::from_secs(10)).await;
        check(&what, got, case.pass_through, wrong);
        still_serving(stack, MODEL, &what).await;
    }
}

/// Copies of the steering header in mixed case, naming an address outside the pool and
/// the pool's replicas. 100 of them, with the request's own headers, are over Envoy's
/// limit of 100 headers: 431. As many as that limit allows (96, plus `host`,
/// `content-type`, `content-length` and `connection`) are served by a replica the picker
/// chose, which receives exactly one copy, naming itself.
async fn duplicate_steering_headers(
    stack: &Stack,
    backends: &[TestBackend],
    wrong: &mut Vec<String>,
) {
    for copies in [MAX_COPIES, 100] {
        steering_copies(stack, backends, copies, wrong).await;
    }
}

/// The most steering headers a request with four others may carry (Envoy's
/// `max_request_headers_count` is 100).
const MAX_COPIES: usize = 96;

/// The same over HTTP/2, where the four pseudo-headers, `content-type` and
/// `content-length` count too.
const MAX_COPIES_H2: usize = 94;

async fn steering_copies(
    stack: &Stack,
    backends: &[TestBackend],
    copies: usize,
    wrong: &mut Vec<String>,
) {
    let names = [
        "x-gateway-destination-endpoint",
        "X-Gateway-Destination-Endpoint",
        "X-GATEWAY-DESTINATION-ENDPOINT",
        "x-Gateway-destination-ENDPOINT",
    ];
    let targets: Vec<String> = std::iter::once("127.0.0.1:1".to_string())
        .chain(backends.iter().map(|b| b.addr.to_string()))
        .collect();
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..copies)
        .map(|i| {
            (
                names[i % names.len()].as_bytes().to_vec(),
                targets[i % targets.len()].as_bytes().to_vec(),
            )
        })
        .collect();
    let headers: Vec<(&[u8], &[u8])> = pairs
        .iter()
        .map(|(k, v)| (k.as_slice(), v.as_slice()))
        .collect();
    for path in [CHAT, PASS_THROUGH] {
        let what = format!("HTTP/1.1 {copies} mixed-case steering headers ({path})");
        let req = if path == CHAT {
            raw::post_json(path, &headers, &chat_body("duplicates"))
        } else {
            raw::request("GET", path, &headers, b"")
        };
        match raw::exchange(stack.envoy().listener(), req, Duration::from_secs(10)).await {
            Ok(r) if copies > MAX_COPIES && r.status == 431 => {}
            Ok(r) if copies <= MAX_COPIES && path == CHAT && r.status == 200 => {
                let json = r.json();
                let backend = json["backend"].as_str().unwrap_or_default();
                let index: usize = backend.trim_start_matches('b').parse().unwrap_or(99);
                let own = backends.get(index).map(|b| b.addr.to_string());
                let seen: Vec<String> = json["destinations"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                // One destination header, the picker's list: its first entry is the
                // replica that served, the rest are fallbacks of the same pool.
                let first = seen
                    .first()
                    .and_then(|list| list.split(',').next())
                    .map(str::to_owned);
                if own.is_none() || seen.len() != 1 || first != own {
                    wrong.push(format!(
                        "{what}: served by {backend:?}, which received steering headers {seen:?}"
                    ));
                }
            }
            Ok(r) if copies <= MAX_COPIES && path == PASS_THROUGH && r.status == 404 => {}
            Ok(r) => wrong.push(format!("{what}: got {} {}", r.status, r.text())),
            Err(e) => wrong.push(format!("{what}: no answer: {e}")),
        }
        still_serving(stack, MODEL, &what).await;
    }
}

/// Header pairs for the HTTP/2 client.
type H2Headers = Vec<(&'static str, HeaderValue)>;

/// The same hostile values over HTTP/2 (h2c), header names lower-case as HTTP/2 wants
/// them. hyper sends no control bytes in a value, so those cases are HTTP/1.1's alone.
async fn headers_over_http2(stack: &Stack, backends: &[TestBackend], wrong: &mut Vec<String>) {
    let h2 = H2::connect(stack.envoy().listener()).await;
    let high: Vec<u8> = (0x80..=0xFFu8).collect();
    let value = |bytes: &[u8]| HeaderValue::from_bytes(bytes).unwrap();
    let cases: Vec<(&str, H2Headers, Expect)> = vec![
        (
            "every byte 0x80-0xFF",
            vec![("x-note", value(&high))],
            Expect::Served,
        ),
        (
            "bytes 0x80-0xFF in the session header",
            vec![(SESSION_HEADER, value(&high))],
            Expect::Served,
        ),
        (
            "bytes 0x80-0xFF in the steering header",
            vec![(DESTINATION, value(&high))],
            Expect::Served,
        ),
        (
            "a 56 KiB session id",
            vec![(SESSION_HEADER, value(&vec![b's'; 56 << 10]))],
            Expect::Served,
        ),
        (
            "94 steering headers",
            (0..MAX_COPIES_H2)
                .map(|i| {
                    let target = if i % 2 == 0 {
                        "127.0.0.1:1".to_string()
                    } else {
                        backends[i % backends.len()].addr.to_string()
                    };
                    (DESTINATION, value(target.as_bytes()))
                })
                .collect(),
            Expect::Served,
        ),
    ];
    for (what, headers, expect) in cases {
        let what = format!("HTTP/2 {what}");
        let body = json!({"model": MODEL, "messages": [{"role": "user", "content": what}]});
        let got = h2
            .post_json(CHAT, &headers, &body)
            .await
            .map(|r| RawResponse {
                status: r.status,
                head: String::new(),
                body: r.body.to_vec(),
            });
        if let (Ok(r), Expect::Served) = (&got, expect) {
            let seen = &r.json()["destinations"];
            if seen.as_array().map(Vec::len) != Some(1) {
                wrong.push(format!(
                    "{what}: the replica received steering headers {seen}"
                ));
            }
        }
        check(&what, got, expect, wrong);
        still_serving(stack, MODEL, &what).await;
    }
    // A header block over Envoy's 60 KiB: HTTP/2 has no 431 for it; Envoy resets the stream
    // or answers 431. Either way the connection's other streams and Envoy go on.
    let what = "HTTP/2 a 64 KiB value";
    let headers = [("x-note", value(&vec![b'v'; 64 << 10]))];
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": what}]});
    match h2.post_json(CHAT, &headers, &body).await {
        Ok(r) if r.status == 431 => {}
        Ok(r) => wrong.push(format!("{what}: got {} {}", r.status, r.text())),
        Err(e) => eprintln!("{}: {what}: stream reset ({e})", stack.flavor()),
    }
    still_serving(stack, MODEL, what).await;
    let fresh = H2::connect(stack.envoy().listener()).await;
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "h2 after"}]});
    let got = fresh.post_json(CHAT, &[], &body).await;
    if !got.as_ref().is_ok_and(|r| r.status == 200) {
        wrong.push(format!("HTTP/2 after the hostile cases: {got:?}"));
    }
}

/// Bodies built to hurt the parser or its memory. Each is answered; Envoy's resident
/// memory is printed before and after (the largest single-request costs are measured
/// elsewhere; here it must simply not run away).
async fn bodies(stack: &Stack, wrong: &mut Vec<String>) {
    let limit = 4 << 20;
    let rss_before = envoy_rss_kib(stack);
    let heap_before = envoy_heap_kib(stack).await;
    let nested = {
        let depth = 200;
        format!(
            r#"{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "deep"}}], "extra": {}{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        )
    };
    let nested_messages = {
        let depth = 200;
        format!(
            r#"{{"model": "{MODEL}", "messages": [{{"role": "user", "content": {}"x"{}}}]}}"#,
            r#"{"a": "#.repeat(depth),
            "}".repeat(depth)
        )
    };
    let floats = {
        let mut s = format!(
            r#"{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "tools"}}], "tools": ["#
        );
        let item = "1e308,";
        while s.len() + item.len() + 8 < limit - 1024 {
            s.push_str(item);
        }
        s.push_str("1e308]}");
        s
    };
    let many_messages = {
        let one = r#"{"role": "user", "content": "m"},"#;
        let mut s = format!(r#"{{"model": "{MODEL}", "messages": ["#);
        for _ in 0..100_000 {
            s.push_str(one);
        }
        s.pop();
        s.push_str("]}");
        s
    };
    let huge_model = format!(
        r#"{{"model": "{}", "messages": [{{"role": "user", "content": "x"}}]}}"#,
        "m".repeat(1 << 20)
    );
    let mut invalid_utf8 =
        format!(r#"{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "caf"#)
            .into_bytes();
    invalid_utf8.extend_from_slice(b"\xe9 \xff\xfe \xc3\x28\"}]}");
    let cases: Vec<(&str, Vec<u8>, Expect)> = vec![
        (
            "truncated JSON",
            format!(r#"{{"model": "{MODEL}", "messages": [{{"role": "us"#).into_bytes(),
            Expect::Status(400),
        ),
        (
            "200-deep nesting in an extra field",
            nested.into_bytes(),
            Expect::Served,
        ),
        (
            "200-deep nesting in a message",
            nested_messages.into_bytes(),
            Expect::Status(400),
        ),
        (
            "4 MiB of floats in tools",
            floats.into_bytes(),
            Expect::Served,
        ),
        (
            "invalid UTF-8 in a string",
            invalid_utf8,
            Expect::Status(400),
        ),
        ("100k messages", many_messages.into_bytes(), Expect::Served),
        (
            "a 1 MiB model name",
            huge_model.into_bytes(),
            Expect::Status(404),
        ),
    ];
    let h2 = H2::connect(stack.envoy().listener()).await;
    let json_type = [("content-type", HeaderValue::from_static("application/json"))];
    for (what, body, expect) in cases {
        for http2 in [false, true] {
            let what = format!(
                "{} body: {what} ({} bytes)",
                if http2 { "HTTP/2" } else { "HTTP/1.1" },
                body.len()
            );
            let got = if http2 {
                let sent = h2.send("POST", CHAT, &json_type, body.clone()).await;
                match sent {
                    Ok(resp) => crate::support::h2::collect(resp).await,
                    Err(e) => Err(e),
                }
                .map(|r| RawResponse {
                    status: r.status,
                    head: String::new(),
                    body: r.body.to_vec(),
                })
            } else {
                let req = raw::post_json(CHAT, &[], &body);
                raw::exchange(stack.envoy().listener(), req, Duration::from_secs(30)).await
            };
            if let Ok(r) = &got {
                // An error answer quotes little of the input, whatever its size.
                if r.status != 200 && r.body.len() > 4096 {
                    wrong.push(format!("{what}: a {} byte error body", r.body.len()));
                }
            }
            check(&what, got, expect, wrong);
            still_serving(stack, MODEL, &what).await;
        }
    }
    eprintln!(
        "{}: Envoy around the hostile bodies: RSS {rss_before} KiB before, {} KiB after; \
         heap allocated {heap_before} KiB before, {} KiB after",
        stack.flavor(),
        envoy_rss_kib(stack),
        envoy_heap_kib(stack).await
    );
}

/// Whether a timeout answer after `took` came when `timeout` says: not before it (Envoy's
/// timer and this clock may differ by a few ms) and at most 4 s after (a loaded CI machine).
fn in_time(took: Duration, timeout: Duration) -> bool {
    took + Duration::from_millis(50) >= timeout && took <= timeout + Duration::from_secs(4)
}

/// A body trickled in gets Envoy's 408 once `request_timeout` has passed (headers alike
/// with `request_headers_timeout`; HTTP/2 streams alike); a body abandoned half-way ends
/// the stream. Neither
/// reaches a replica, and neither leaves anything in flight.
async fn slow_and_abandoned_requests(
    stack: &Stack,
    backends: &[TestBackend],
    wrong: &mut Vec<String>,
) {
    let served = || backends.iter().map(TestBackend::served).sum::<u64>();
    let served_before = served();
    let addr = stack.envoy().listener();
    for (what, timeout, head_only) in [
        ("a body trickled in", TIMEOUTS.request, false),
        ("headers trickled in", TIMEOUTS.request_headers, true),
    ] {
        let started = Instant::now();
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST {CHAT} HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n",
            4 << 20
        );
        let (first, trickle): (Vec<u8>, u8) = if head_only {
            (head.into_bytes(), b'x')
        } else {
            (
                format!("{head}\r\n{{\"model\": \"{MODEL}\", ").into_bytes(),
                b' ',
            )
        };
        stream.write_all(&first).await.unwrap();
        let (mut rd, mut wr) = stream.into_split();
        let trickler = tokio::spawn(async move {
            // A header line that never ends, or body whitespace, one byte every 100 ms.
            if head_only {
                let _ = wr.write_all(b"x-slow: ").await;
            }
            loop {
                if wr.write_all(&[trickle]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(
            timeout + Duration::from_secs(8),
            tokio::io::AsyncReadExt::read_to_end(&mut rd, &mut answer),
        )
        .await;
        trickler.abort();
        let took = started.elapsed();
        let text = String::from_utf8_lossy(&answer);
        if !text.starts_with("HTTP/1.1 408") {
            wrong.push(format!(
                "{what}: expected 408 after {timeout:?}, got {:?} after {took:?}",
                text.chars().take(120).collect::<String>()
            ));
        } else if !in_time(took, timeout) {
            wrong.push(format!("{what}: 408 after {took:?}, timeout {timeout:?}"));
        }
        nothing_in_flight(stack, what).await;
        still_serving(stack, MODEL, what).await;
    }
    // The same trickle on an HTTP/2 stream: 408 on that stream, in time.
    let what = "an HTTP/2 body trickled in";
    {
        let h2 = H2::connect(addr).await;
        let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(1);
        let trickler = tokio::spawn(async move {
            let start = format!("{{\"model\": \"{MODEL}\", ");
            if tx.send(bytes::Bytes::from(start)).await.is_err() {
                return;
            }
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if tx.send(bytes::Bytes::from_static(b" ")).await.is_err() {
                    return;
                }
            }
        });
        let started = Instant::now();
        let json_type = [("content-type", HeaderValue::from_static("application/json"))];
        let sent = tokio::time::timeout(
            TIMEOUTS.request + Duration::from_secs(8),
            h2.send_streaming("POST", CHAT, &json_type, rx),
        )
        .await;
        trickler.abort();
        let took = started.elapsed();
        match sent {
            Ok(Ok(resp)) if resp.status() == 408 => {
                if !in_time(took, TIMEOUTS.request) {
                    wrong.push(format!("{what}: 408 after {took:?}"));
                }
            }
            Ok(Ok(resp)) => wrong.push(format!("{what}: answered {}", resp.status())),
            Ok(Err(e)) => wrong.push(format!("{what}: {e} after {took:?}")),
            Err(_) => wrong.push(format!("{what}: no answer after {took:?}")),
        }
    }
    nothing_in_flight(stack, what).await;
    still_serving(stack, MODEL, what).await;
    // Abandoned: 1 MiB announced, 100 KiB sent, the connection closed.
    let what = "a body abandoned half-way";
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{{\"model\": \"{MODEL}\", \"messages\": [{{\"role\": \"user\", \"content\": \"",
        1 << 20
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&vec![b'a'; 100 << 10]).await.unwrap();
    drop(stream);
    nothing_in_flight(stack, what).await;
    still_serving(stack, MODEL, what).await;
    // Same over HTTP/2: the stream is reset while its body is arriving.
    let what = "an HTTP/2 body abandoned half-way";
    {
        let h2 = H2::connect(addr).await;
        let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(4);
        let send = h2.send_streaming("POST", CHAT, &[], rx);
        let pump = async {
            let _ = tx.send(bytes::Bytes::from(head.clone())).await;
            let _ = tx.send(bytes::Bytes::from(vec![b'a'; 64 << 10])).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        };
        tokio::select! {
            _ = send => wrong.push(format!("{what}: answered before the body ended")),
            _ = pump => {}
        }
    }
    nothing_in_flight(stack, what).await;
    still_serving(stack, MODEL, what).await;
    if served() != served_before + 5 {
        // Five `still_serving` requests; the slow and abandoned ones never reached a replica.
        wrong.push(format!(
            "slow or abandoned requests reached a replica: {} served, expected {}",
            served(),
            served_before + 5
        ));
    }
}
