//! Engines that fail: a replica killed mid-stream, one that accepts and never answers,
//! `/metrics` that hangs, answers 500, answers 30 MB or answers garbage, and an engine
//! whose SSE is malformed. The client's answer is what it should be, the next requests
//! avoid a failed replica within `maxConsecutiveFailures` scrapes, and Envoy keeps serving
//! with nothing left in flight.
//!
//! Each victim has a pool of its own (so a request can be sent to it for certain) and
//! shares a second pool with the healthy `b0` (so avoidance can be seen).

use super::MODEL;
use crate::gateway::endpoint_label;
use crate::support::gw::{self, gateway_stats, Plan};
use crate::support::h2::H2;
use crate::support::settle::{nothing_in_flight, still_serving};
use crate::support::{MetricsMode, ServeMode, TestBackend, MALFORMED_SSE, QUICK};
use http_body_util::BodyExt;
use hyper::header::HeaderValue;
use infergate_harness::launch::client::{post_json, request_streamed};
use infergate_harness::launch::{ClientTimeouts, Flavor, PoolSpec, Stack};
use serde_json::json;
use std::time::{Duration, Instant};

/// The healthy replica every shared pool also has.
const HEALTHY: usize = 0;
/// Killed mid-stream.
const KILLED: usize = 1;
/// Accepts and never answers.
const HOLE: usize = 2;
/// Its `/metrics` cycles through the failure modes.
const SCRAPED: usize = 3;
/// Answers malformed SSE.
const MALFORMED: usize = 4;

/// The `maxConsecutiveFailures` of every pool here (the default).
const MAX_FAILURES: i64 = 3;

/// A stream that says nothing for this long is answered 504 (or reset once started).
const IDLE: Duration = Duration::from_secs(2);

fn alone(i: usize) -> String {
    format!("only-b{i}")
}

fn shared(i: usize) -> String {
    format!("b0-and-b{i}")
}

pub(in crate::gateway) async fn failing_engines_are_avoided_and_envoy_keeps_serving(
    flavor: Flavor,
) {
    let backends = TestBackend::many(5, QUICK).await;
    let mut pools = vec![PoolSpec::on(MODEL, &[HEALTHY])];
    for i in [KILLED, HOLE, SCRAPED, MALFORMED] {
        pools.push(PoolSpec::on(alone(i), &[i]));
        pools.push(PoolSpec::on(shared(i), &[HEALTHY, i]));
    }
    let mut plan = Plan::new(pools);
    plan.timeouts = ClientTimeouts {
        stream_idle: IDLE,
        ..ClientTimeouts::default()
    };
    let Some(stack) = gw::start(flavor, &backends, plan).await else {
        return;
    };
    still_serving(&stack, MODEL, "no fault yet").await;
    malformed_sse(&stack, &backends).await;
    killed_mid_stream(&stack, &backends).await;
    never_answers(&stack, &backends).await;
    metrics_faults(&stack, &backends).await;
}

fn chat(model: &str, content: &str) -> serde_json::Value {
    json!({"model": model, "messages": [{"role": "user", "content": content}]})
}

/// Sends `n` fresh requests for `model` and returns which backends served them.
async fn spread(stack: &Stack, model: &str, n: usize, tag: &str) -> Vec<String> {
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let mut out = Vec::new();
    for i in 0..n {
        let resp = post_json(&url, &chat(model, &format!("{tag} {i}")), &[])
            .await
            .unwrap();
        assert_eq!(
            resp.status,
            200,
            "{}: {model} {tag} {i}: {}\n{}",
            stack.flavor(),
            resp.text(),
            stack.envoy().log_tail(20)
        );
        out.push(
            resp.json().unwrap()["backend"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    out
}

/// The scraper's consecutive-failure gauge of `backend`.
async fn failures(stack: &Stack, backend: &TestBackend) -> i64 {
    let key = format!(
        "infergate.scraper.consecutive_failures.endpoint.{}",
        endpoint_label(&backend.addr)
    );
    // Exact name (after the flavour's prefix): one port must not match another's prefix.
    stack
        .envoy()
        .stats()
        .await
        .unwrap()
        .containing(&key)
        .filter(|(k, _)| k.ends_with(&key))
        .map(|(_, v)| v)
        .sum()
}

/// Waits until the scraper has failed `backend` `MAX_FAILURES` times in a row (at most
/// `within`), returning how long that took.
async fn until_dead(
    stack: &Stack,
    backend: &TestBackend,
    within: Duration,
    what: &str,
) -> Duration {
    let started = Instant::now();
    loop {
        if failures(stack, backend).await >= MAX_FAILURES {
            return started.elapsed();
        }
        if started.elapsed() > within {
            let stats = stack.envoy().stats().await.unwrap();
            panic!(
                "{}: {what}: the scraper did not fail {} {MAX_FAILURES} times within {within:?}\n{}",
                stack.flavor(),
                backend.addr,
                gateway_stats(&stats)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `backend` scrapes cleanly again.
async fn until_alive(stack: &Stack, backend: &TestBackend, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while failures(stack, backend).await != 0 {
        assert!(
            Instant::now() < deadline,
            "{}: {what}: {} still failing scrapes 10 s after recovery",
            stack.flavor(),
            backend.addr
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The engine's SSE is not SSE: the gateway does not read response bodies, so the client
/// receives exactly the bytes the engine sent, and nothing breaks.
async fn malformed_sse(stack: &Stack, backends: &[TestBackend]) {
    backends[MALFORMED].set_serve(ServeMode::MalformedSse);
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let mut body = chat(&alone(MALFORMED), "malformed sse");
    body["stream"] = true.into();
    let resp = request_streamed(
        hyper::Method::POST,
        &url,
        &[("content-type", "application/json")],
        body.to_string().into(),
    )
    .await
    .unwrap();
    assert_eq!(resp.status, 200, "{}: malformed SSE", stack.flavor());
    assert_eq!(
        resp.body(),
        MALFORMED_SSE,
        "{}: the malformed stream was altered",
        stack.flavor()
    );
    backends[MALFORMED].set_serve(ServeMode::Normal);
    still_serving(stack, MODEL, "malformed SSE").await;
}

/// A replica killed while streaming: the client's stream ends with an error (never a
/// clean end), and once the scraper has failed it `maxConsecutiveFailures` times the
/// shared pool sends nothing more its way. Restarted, it is served again; killed again
/// under an HTTP/2 client, that client's stream is reset.
async fn killed_mid_stream(stack: &Stack, backends: &[TestBackend]) {
    let victim = &backends[KILLED];
    // Fresh prompts on two idle replicas land on both: the victim serves before it dies.
    let before = spread(stack, &shared(KILLED), 16, "before the kill").await;
    assert!(
        before.contains(&format!("b{KILLED}")),
        "{}: b{KILLED} served none of {before:?}",
        stack.flavor()
    );
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let mut body = chat(&alone(KILLED), "killed mid-stream");
    body["stream"] = true.into();
    body["stream_events"] = 100.into();
    body["stream_gap_ms"] = 50.into();
    let uri: hyper::Uri = url.parse().unwrap();
    let tcp = tokio::net::TcpStream::connect(stack.envoy().listener())
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::post(uri.path())
        .header("host", "gateway")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.into_body();
    let first = stream.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    victim.kill();
    let killed = Instant::now();
    let mut ended = None;
    while let Some(frame) = stream.frame().await {
        if let Err(e) = frame {
            ended = Some(e.to_string());
            break;
        }
    }
    let stream_ended = killed.elapsed();
    assert!(
        ended.is_some(),
        "{}: the stream from a killed replica ended cleanly",
        stack.flavor()
    );
    until_dead(stack, victim, Duration::from_secs(5), "killed replica").await;
    let dead = killed.elapsed();
    eprintln!(
        "{}: killed replica: the client's stream ended ({}) {stream_ended:?} after the kill \
         (Envoy's HTTP/1.1 delayed-close timeout is 1 s); the \
         scraper had failed it {MAX_FAILURES} times {dead:?} after the kill",
        stack.flavor(),
        ended.unwrap_or_default()
    );
    // Refused connections fail each 50 ms scrape at once: three take a few hundred ms.
    assert!(
        stream_ended < Duration::from_secs(5) && dead < Duration::from_secs(5),
        "{}: stream ended {stream_ended:?}, replica dead {dead:?} after the kill",
        stack.flavor()
    );
    let after = spread(stack, &shared(KILLED), 16, "after the kill").await;
    assert!(
        after.iter().all(|b| b == &format!("b{HEALTHY}")),
        "{}: requests still reach the killed replica: {after:?}",
        stack.flavor()
    );
    nothing_in_flight(stack, "killed mid-stream").await;
    // The replica comes back: once it scrapes cleanly it is served again.
    victim.restart().await;
    until_alive(stack, victim, "restarted replica").await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let back = spread(stack, &shared(KILLED), 24, "after the restart").await;
    assert!(
        back.contains(&format!("b{KILLED}")),
        "{}: the restarted replica is never served: {back:?}",
        stack.flavor()
    );
    // Killed under an HTTP/2 client: the stream is reset at once (no connection to close).
    let h2 = H2::connect(stack.envoy().listener()).await;
    let json_type = [("content-type", HeaderValue::from_static("application/json"))];
    let resp = h2
        .send("POST", "/v1/chat/completions", &json_type, body.to_string())
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}: HTTP/2 stream", stack.flavor());
    let mut stream = resp.into_body();
    assert!(stream.frame().await.unwrap().unwrap().is_data());
    victim.kill();
    let killed = Instant::now();
    let mut reset = false;
    while let Some(frame) = stream.frame().await {
        if frame.is_err() {
            reset = true;
            break;
        }
    }
    let took = killed.elapsed();
    assert!(
        reset && took < Duration::from_secs(3),
        "{}: HTTP/2 stream from a killed replica: reset {reset} after {took:?}",
        stack.flavor()
    );
    eprintln!(
        "{}: killed replica under HTTP/2: stream reset {took:?} after the kill",
        stack.flavor()
    );
    still_serving(stack, MODEL, "killed mid-stream").await;
}

/// A replica that accepts and never answers (requests and `/metrics` alike): a request
/// already sent to it is answered 504 once it has been idle for the stream idle timeout;
/// the scraper's timeouts fail it, and the shared pool then avoids it.
async fn never_answers(stack: &Stack, backends: &[TestBackend]) {
    let hole = &backends[HOLE];
    hole.set_serve(ServeMode::Hang);
    hole.set_metrics(MetricsMode::Hang);
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let started = Instant::now();
    let resp = post_json(&url, &chat(&alone(HOLE), "anyone there?"), &[]).await;
    let took = started.elapsed();
    match resp {
        Ok(r) => assert!(
            // 504 `stream timeout` when the request reached the silent replica; 503 when the
            // scraper had already failed it (the scrape timeout is short).
            r.status == 504 || r.status == 503,
            "{}: a silent replica's request answered {} {}",
            stack.flavor(),
            r.status,
            r.text()
        ),
        Err(e) => panic!("{}: a silent replica's request: {e:#}", stack.flavor()),
    }
    assert!(
        took < IDLE + Duration::from_secs(3),
        "{}: answered after {took:?}",
        stack.flavor()
    );
    until_dead(stack, hole, Duration::from_secs(10), "silent replica").await;
    let after = spread(stack, &shared(HOLE), 12, "after the silence").await;
    assert!(
        after.iter().all(|b| b == &format!("b{HEALTHY}")),
        "{}: requests still reach the silent replica: {after:?}",
        stack.flavor()
    );
    nothing_in_flight(stack, "silent replica").await;
    still_serving(stack, MODEL, "silent replica").await;
    hole.set_serve(ServeMode::Normal);
    hole.set_metrics(MetricsMode::Normal);
}

/// `/metrics` that hangs, answers 500, 30 MB, or garbage. A scrape that fails counts
/// toward `maxConsecutiveFailures`; past it the shared pool avoids the replica, and once
/// the page is healthy again the replica serves again.
async fn metrics_faults(stack: &Stack, backends: &[TestBackend]) {
    let victim = &backends[SCRAPED];
    for mode in [
        MetricsMode::Hang,
        MetricsMode::Error,
        MetricsMode::Huge,
        MetricsMode::Garbage,
    ] {
        let what = format!("/metrics {mode:?}");
        victim.set_metrics(mode);
        let took = until_dead(stack, victim, Duration::from_secs(10), &what).await;
        eprintln!(
            "{}: {what}: failed {MAX_FAILURES} scrapes in {took:?}",
            stack.flavor()
        );
        let during = spread(stack, &shared(SCRAPED), 12, &what).await;
        assert!(
            during.iter().all(|b| b == &format!("b{HEALTHY}")),
            "{}: {what}: requests still reach b{SCRAPED}: {during:?}",
            stack.flavor()
        );
        let resp = post_json(
            &format!("{}/v1/chat/completions", stack.picker_url()),
            &chat(&alone(SCRAPED), &what),
            &[],
        )
        .await
        .unwrap();
        assert_eq!(
            resp.status,
            503,
            "{}: {what}: the pool of the failing replica alone: {}",
            stack.flavor(),
            resp.text()
        );
        victim.set_metrics(MetricsMode::Normal);
        until_alive(stack, victim, &what).await;
        // Give the picker the fresh snapshot, then the replica serves again.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let again = spread(stack, &shared(SCRAPED), 24, &format!("{what}, recovered")).await;
        assert!(
            again.contains(&format!("b{SCRAPED}")),
            "{}: {what}: b{SCRAPED} never served after recovering: {again:?}",
            stack.flavor()
        );
        nothing_in_flight(stack, &what).await;
        still_serving(stack, MODEL, &what).await;
    }
}
