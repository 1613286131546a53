//! Clients that go away: aborting mid-stream over HTTP/1.1 (closing the connection) and
//! HTTP/2 (resetting the stream), many HTTP/2 streams on one connection, and 2,000 streams
//! held open at once and then dropped together. Every aborted stream is cancelled at the
//! replica too, and nothing stays in flight; Envoy's memory is reported before, during
//! and after the 2,000.

use super::MODEL;
use crate::support::gw::{self, picker_pool, Plan};
use crate::support::h2::H2;
use crate::support::settle::{
    envoy_heap_kib, envoy_rss_kib, in_flight, nothing_in_flight, picker_in_flight, still_serving,
};
use crate::support::{StreamPace, TestBackend};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderValue;
use hyper_util::rt::TokioIo;
use infergate_harness::launch::{Flavor, GatewaySettings, PoolSpec, Stack};
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

/// Streams held open at once.
const HELD: usize = 2000;

/// A stream body: `events` SSE events `gap_ms` apart (the test backend's own fields).
fn stream_body(content: &str, events: u64, gap_ms: u64) -> serde_json::Value {
    json!({"model": MODEL, "stream": true, "stream_events": events, "stream_gap_ms": gap_ms,
           "messages": [{"role": "user", "content": content}]})
}

pub(in crate::gateway) async fn aborted_and_held_streams_leave_nothing_in_flight(flavor: Flavor) {
    raise_fd_limit(4 * HELD as u64 + 1024);
    let pace = StreamPace {
        events: 3,
        gap: Duration::from_millis(5),
    };
    let backends = TestBackend::many(2, pace).await;
    let mut plan = Plan::new(vec![PoolSpec::all(MODEL)]);
    // The replicas share this process with 2,000 clients: while those connect, a `/metrics`
    // answer can take longer than the default 250 ms scrape timeout, and three such scrapes
    // would (rightly) take the replicas out of the pool. Liveness is the engine suite's
    // subject; here the scraper is patient so that only the streams are under test.
    plan.settings = GatewaySettings {
        scrape_timeout_ms: 3000,
        stale_after_ms: 20_000,
        ..GatewaySettings::default()
    };
    plan.tweak = Some(Box::new(|plugins| {
        picker_pool(plugins, MODEL)["maxConsecutiveFailures"] = 20.into();
    }));
    let Some(stack) = gw::start(flavor, &backends, plan).await else {
        return;
    };
    still_serving(&stack, MODEL, "no fault yet").await;
    aborted_mid_stream_http1(&stack, &backends).await;
    http2_streams(&stack, &backends).await;
    held_open(&stack, &backends).await;
}

/// Raises this process's open-file limit to at least `want` (the hard limit too, where
/// the process may: root may); Envoy, started afterwards, inherits it. Fails naming the
/// limit when it cannot: 2,000 streams need about two descriptors each in this process
/// (client and test backend) and two in Envoy's.
fn raise_fd_limit(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    let got = unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < want {
            let wanted = libc::rlimit {
                rlim_cur: want,
                rlim_max: lim.rlim_max.max(want),
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) != 0 {
                lim.rlim_cur = lim.rlim_max.min(want);
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        }
        lim.rlim_cur
    };
    assert!(
        got >= want,
        "open-file limit {got} < {want} needed for {HELD} streams (raise `ulimit -Hn`)"
    );
}

fn cancelled(backends: &[TestBackend]) -> u64 {
    backends.iter().map(TestBackend::streams_cancelled).sum()
}

fn open(backends: &[TestBackend]) -> i64 {
    backends.iter().map(TestBackend::streams_open).sum()
}

/// Waits until the replicas have seen `more` more cancelled streams and have `left` open.
async fn replicas_cancelled(
    stack: &Stack,
    backends: &[TestBackend],
    (base, more, left): (u64, u64, i64),
    what: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while cancelled(backends) < base + more || open(backends) != left {
        assert!(
            Instant::now() < deadline,
            "{}: {what}: replicas saw {} of {more} streams cancelled, {} open (expected {left})",
            stack.flavor(),
            cancelled(backends) - base,
            open(backends)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Opens an HTTP/1.1 stream through the gateway; `Some` once its first chunk arrived.
async fn first_chunk_http1(
    stack: &Stack,
    body: &serde_json::Value,
) -> Result<hyper::body::Incoming, String> {
    open_stream(stack.envoy().listener(), body).await
}

/// A client that reads the first chunk and closes its connection.
async fn aborted_mid_stream_http1(stack: &Stack, backends: &[TestBackend]) {
    let base = cancelled(backends);
    for i in 0..3 {
        let stream = first_chunk_http1(stack, &stream_body(&format!("abort {i}"), 200, 50))
            .await
            .unwrap_or_else(|e| panic!("{}: stream {i} did not start: {e}", stack.flavor()));
        drop(stream);
    }
    replicas_cancelled(stack, backends, (base, 3, 0), "HTTP/1.1 aborts").await;
    nothing_in_flight(stack, "HTTP/1.1 aborts").await;
    still_serving(stack, MODEL, "HTTP/1.1 aborts").await;
}

/// HTTP/2: a full stream arrives whole; streams reset by the client mid-way are cancelled
/// at the replica while the connection's other streams go on; 100 streams at once share
/// one connection.
async fn http2_streams(stack: &Stack, backends: &[TestBackend]) {
    let h2 = H2::connect(stack.envoy().listener()).await;
    let json_type = [("content-type", HeaderValue::from_static("application/json"))];
    let whole = h2
        .send(
            "POST",
            "/v1/chat/completions",
            &json_type,
            stream_body("h2 whole", 5, 5).to_string(),
        )
        .await
        .unwrap();
    assert_eq!(whole.status(), 200);
    let text = whole.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&text).ends_with("data: [DONE]\n\n"),
        "{}: HTTP/2 stream: {text:?}",
        stack.flavor()
    );
    let base = cancelled(backends);
    let mut survivors = Vec::new();
    for i in 0..4 {
        let body = stream_body(&format!("h2 abort {i}"), 200, 50).to_string();
        let resp = h2
            .send("POST", "/v1/chat/completions", &json_type, body)
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let mut stream = resp.into_body();
        assert!(stream.frame().await.unwrap().unwrap().is_data());
        if i % 2 == 0 {
            drop(stream); // RST_STREAM(CANCEL)
        } else {
            survivors.push(stream);
        }
    }
    replicas_cancelled(stack, backends, (base, 2, 2), "HTTP/2 resets").await;
    // The connection's other streams were not touched by the resets.
    for mut s in survivors {
        assert!(s.frame().await.unwrap().unwrap().is_data());
    }
    replicas_cancelled(stack, backends, (base, 4, 0), "HTTP/2 survivors dropped").await;
    let mut tasks = Vec::new();
    for i in 0..100 {
        let h2 = h2.clone();
        tasks.push(tokio::spawn(async move {
            let body = json!({"model": MODEL, "messages": [{"role": "user", "content": format!("h2 {i}")}]});
            h2.post_json("/v1/chat/completions", &[], &body).await
        }));
    }
    for t in tasks {
        let r = t.await.unwrap().unwrap();
        assert_eq!(
            r.status,
            200,
            "{}: HTTP/2 concurrent: {}",
            stack.flavor(),
            r.text()
        );
    }
    nothing_in_flight(stack, "HTTP/2 streams").await;
    still_serving(stack, MODEL, "HTTP/2 streams").await;
}

/// 2,000 streams open at once (each its own HTTP/1.1 connection, first chunk received),
/// then every client goes away together.
async fn held_open(stack: &Stack, backends: &[TestBackend]) {
    let flavor = stack.flavor();
    let base = cancelled(backends);
    let rss_before = envoy_rss_kib(stack);
    let heap_before = envoy_heap_kib(stack).await;
    let (release_tx, release_rx) = watch::channel(false);
    let (ready_tx, mut ready_rx) = mpsc::channel::<Result<(), String>>(HELD);
    let started = Instant::now();
    let mut clients = Vec::with_capacity(HELD);
    for i in 0..HELD {
        let addr = stack.envoy().listener();
        let ready = ready_tx.clone();
        let mut release = release_rx.clone();
        clients.push(tokio::spawn(async move {
            let body = stream_body(&format!("held {i}"), 2, 120_000);
            let stream = open_stream(addr, &body).await;
            let _ = ready
                .send(stream.as_ref().map(|_| ()).map_err(Clone::clone))
                .await;
            // Hold the stream (and its connection) until released.
            let _ = release.wait_for(|r| *r).await;
            drop(stream);
        }));
        // Connect in bursts the listener's backlog takes without SYN retries.
        if i % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    drop(ready_tx);
    let mut ok = 0;
    let mut failed = Vec::new();
    for _ in 0..HELD {
        match tokio::time::timeout(Duration::from_secs(60), ready_rx.recv()).await {
            Ok(Some(Ok(()))) => ok += 1,
            Ok(Some(Err(e))) => failed.push(e),
            Ok(None) => break,
            Err(_) => {
                failed.push("not started within 60 s".into());
                break;
            }
        }
    }
    let opened_in = started.elapsed();
    let stats = stack.envoy().stats().await.unwrap();
    let scraping: Vec<String> = stats
        .iter()
        .filter(|(k, v)| {
            *v != 0
                && (k.contains("infergate.picker.rejects")
                    || k.contains("infergate.scraper.consecutive_failures")
                    || (k.contains("infergate.scraper.scrapes") && k.ends_with("failed")))
        })
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    let held = in_flight(&stats);
    let picked = picker_in_flight(&stats);
    let rss_during = envoy_rss_kib(stack);
    let heap_during = envoy_heap_kib(stack).await;
    let replica_open = open(backends);
    release_tx.send(true).unwrap();
    for c in clients {
        c.await.unwrap();
    }
    assert_eq!(
        ok,
        HELD,
        "{flavor}: only {ok} of {HELD} streams started; in flight: {held:?}; failures \
         (first 5 of {}): {:?}; rejects and failed scrapes: {scraping:?}\n{}",
        failed.len(),
        &failed[..failed.len().min(5)],
        stack.envoy().log_tail(20)
    );
    assert_eq!(
        replica_open, HELD as i64,
        "{flavor}: replicas held {replica_open} streams"
    );
    let active = held
        .iter()
        .find(|(k, _)| k == "http.gateway.downstream_rq_active")
        .map_or(0, |(_, v)| *v);
    assert_eq!(active, HELD as i64, "{flavor}: {held:?}");
    assert_eq!(picked, HELD as i64, "{flavor}: picker in flight: {held:?}");
    replicas_cancelled(
        stack,
        backends,
        (base, HELD as u64, 0),
        "2,000 held streams dropped",
    )
    .await;
    nothing_in_flight(stack, "2,000 held streams dropped").await;
    still_serving(stack, MODEL, "2,000 held streams").await;
    let rss_after = envoy_rss_kib(stack);
    let heap_after = envoy_heap_kib(stack).await;
    // What 2,000 streams hold is given back once they end (RSS stays: the allocator keeps
    // its pages). A quarter of it left over would be a leak of ~13 KiB per stream.
    assert!(
        heap_during > heap_before && heap_after < heap_before + (heap_during - heap_before) / 4,
        "{flavor}: Envoy heap {heap_before} KiB before, {heap_during} KiB with {HELD} streams \
         open, {heap_after} KiB after they ended"
    );
    eprintln!(
        "{flavor}: {HELD} streams held open (all started in {opened_in:?}): Envoy RSS \
         {rss_before} KiB before, {rss_during} KiB during ({} KiB per stream), {rss_after} KiB \
         after; heap allocated {heap_before} / {heap_during} / {heap_after} KiB; in flight \
         during: {held:?}",
        (rss_during.saturating_sub(rss_before)) / HELD as u64
    );
}

/// Opens one HTTP/1.1 stream to `addr`; `Ok` once its first chunk has arrived, else
/// what went wrong.
async fn open_stream(
    addr: std::net::SocketAddr,
    body: &serde_json::Value,
) -> Result<hyper::body::Incoming, String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    let req = hyper::Request::post("/v1/chat/completions")
        .header("host", "gateway")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| e.to_string())?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("send: {e:#}"))?;
    if resp.status() != 200 {
        let status = resp.status();
        let text = resp.into_body().collect().await.map(|b| b.to_bytes());
        return Err(format!("status {status}: {text:?}"));
    }
    let mut stream = resp.into_body();
    match stream.frame().await {
        Some(Ok(frame)) if frame.is_data() => Ok(stream),
        other => Err(format!("first frame: {other:?}")),
    }
}
