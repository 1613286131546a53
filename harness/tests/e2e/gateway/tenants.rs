//! Both flavours: tenants, quotas and billing through a real Envoy, over the engine
//! simulator (usage as vLLM reports it, a replica that reports none) and an echo backend
//! (what headers an engine receives).
//!
//! - Authentication: no key, a wrong key and a revoked key get 401; a JWT from the test
//!   issuer, verified by Envoy's `jwt_authn`, maps to its tenant; one with a bad signature is
//!   stopped by `jwt_authn`. Client-sent objective / fairness headers have no effect.
//! - Quotas: RPM, TPM (the engine never sees the refused request) and concurrency (a third
//!   concurrent request is refused until one of two ends), each with its dropped reason,
//!   `retry-after` and `x-ratelimit-*` headers. Concurrency is exact per Envoy process at 1
//!   and at 4 workers.
//! - Accounting: a completed request is charged its engine usage; a stream cut off mid-way
//!   what was generated up to the cut; an engine without usage by chunk count; a client
//!   that did not ask for usage gets the engine's bytes without it. The billing log holds one
//!   line per request that reached the auth stage, its totals per tenant equal what the
//!   engines served, and pre-debit − refund = charged everywhere.
//! - Output multiplicity: `n` and a completions batch multiply the pre-debit's output part,
//!   so a second such request within the minute is refused; more sequences than the
//!   router's `maxOutputSequences` is a 400 naming the parameter; at 1 and 4 workers.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpStream;

use super::tag;
use crate::support::gw::{self, billing_records, openai_error, Plan};
use crate::support::objects::{objective, tenant_quota};
use crate::support::{ServeMode, StreamPace, TestBackend, MALFORMED_SSE};
use infergate_cli::config::tenancy::Tenancy;
use infergate_harness::launch::client::{post_json, post_json_streamed, HttpResponse};
use infergate_harness::launch::jwt::TestIssuer;
use infergate_harness::launch::{Flavor, PoolSpec, Stack};
use infergate_harness::sim::{self, SimConfig, SimHandle};

/// Served by two deterministic simulator replicas that report usage.
const MODEL: &str = "sim-model";
/// Served by a simulator replica that reports no usage at all.
const NO_USAGE_MODEL: &str = "plain-model";
/// Served by an echo backend that answers with the headers it received.
const ECHO_MODEL: &str = "echo-model";
/// A pool with no endpoint: the picker answers 503 after the quota admitted the request.
const EMPTY_MODEL: &str = "empty-model";

/// The test keys of `testdata/tenants` (see testdata/README.md).
const KEY_A: &str = "sk-infergate-test-tenant-a";
const KEY_B: &str = "sk-infergate-test-tenant-b";
const KEY_B_REVOKED: &str = "sk-infergate-test-tenant-b-revoked";
/// Keys of this suite's own small-quota tenants.
const KEY_RPM: &str = "sk-infergate-e2e-rpm";
const KEY_TPM: &str = "sk-infergate-e2e-tpm";
const KEY_ONE: &str = "sk-infergate-e2e-one";

const OBJECTIVE: &str = "x-llm-d-inference-objective";
const FAIRNESS: &str = "x-llm-d-inference-fairness-id";
const DROPPED: &str = "x-llm-d-request-dropped-reason";

/// tenant-a (premium, also by JWT), tenant-b (standard, concurrency `b_concurrency`), and
/// two tenants whose RPM / TPM are small enough to hit.
fn objects(b_concurrency: u64) -> Vec<Value> {
    let big = json!({"rpm": 100000, "tpm": 100000000, "concurrency": 1000,
                     "maxCompletionTokensDefault": 64});
    vec![
        tenant_quota(
            "tenant-a",
            KEY_A,
            "premium-traffic",
            big.clone(),
            Some(
                json!({"issuer": infergate_harness::launch::jwt::TEST_ISSUER,
                        "tenantClaim": "org", "tenantValue": "product-team"}),
            ),
        ),
        tenant_quota(
            "tenant-b",
            KEY_B,
            "standard-traffic",
            json!({"rpm": 100000, "tpm": 100000000, "concurrency": b_concurrency}),
            None,
        ),
        tenant_quota(
            "tenant-rpm",
            KEY_RPM,
            "standard-traffic",
            json!({"rpm": 2, "tpm": 100000000, "concurrency": 100}),
            None,
        ),
        tenant_quota(
            "tenant-tpm",
            KEY_TPM,
            "standard-traffic",
            json!({"rpm": 1000, "tpm": 600, "concurrency": 100}),
            None,
        ),
        tenant_quota(
            "tenant-one",
            KEY_ONE,
            "standard-traffic",
            json!({"rpm": 1000, "tpm": 100000000, "concurrency": 1}),
            None,
        ),
        objective("premium-traffic", 100),
        objective("standard-traffic", 0),
    ]
}

async fn simulator(replicas: u32, model: &str, no_usage: bool) -> SimHandle {
    sim::start(SimConfig {
        replicas,
        models: vec![model.into()],
        deterministic: true,
        no_usage,
        ..SimConfig::default()
    })
    .await
    .unwrap()
}

fn billing_path(flavor: Flavor, what: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "infergate-e2e-billing-{}-{}-{what}.log",
        std::process::id(),
        tag(flavor)
    ));
    let _ = std::fs::remove_file(&path);
    path
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

async fn chat(stack: &Stack, body: &Value, headers: &[(&str, &str)]) -> HttpResponse {
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    post_json(&url, body, headers).await.unwrap()
}

fn short(model: &str, text: &str) -> Value {
    json!({"model": model, "max_tokens": 4,
           "messages": [{"role": "user", "content": text}]})
}

/// A stream long enough to hold open (the simulator's 6 ms per token).
fn long_stream(text: &str, tokens: u32) -> Value {
    json!({"model": MODEL, "stream": true, "max_tokens": tokens, "ignore_eos": true,
           "messages": [{"role": "user", "content": text}]})
}

/// A streamed response read a piece at a time, on its own connection; dropping it closes
/// the connection (a client that leaves).
struct OpenStream {
    status: u16,
    headers: hyper::HeaderMap,
    body: Incoming,
    received: Vec<u8>,
    conn: tokio::task::JoinHandle<()>,
}

impl OpenStream {
    async fn open(url: &str, body: &Value, headers: &[(&str, &str)]) -> OpenStream {
        let uri: hyper::Uri = url.parse().unwrap();
        let authority = uri.authority().unwrap().clone();
        let stream = TcpStream::connect((authority.host(), authority.port_u16().unwrap()))
            .await
            .unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = hyper::Request::post(uri.path())
            .header("host", authority.as_str())
            .header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body.to_string()))).unwrap();
        let resp = sender.send_request(req).await.unwrap();
        OpenStream {
            status: resp.status().as_u16(),
            headers: resp.headers().clone(),
            body: resp.into_body(),
            received: Vec::new(),
            conn,
        }
    }

    /// Reads until at least `events` SSE events arrived (or the stream ended).
    async fn read_events(&mut self, events: usize) {
        while self.events() < events {
            match tokio::time::timeout(Duration::from_secs(10), self.body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.received.extend_from_slice(&data);
                    }
                }
                _ => return,
            }
        }
    }

    async fn read_to_end(mut self) -> Vec<u8> {
        self.read_events(usize::MAX).await;
        std::mem::take(&mut self.received)
    }

    fn events(&self) -> usize {
        self.received.windows(2).filter(|w| w == b"\n\n").count()
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

/// The `data:` payloads of an SSE body.
fn sse_data(body: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// SSE events carrying at least one choice (what a chunk count counts).
fn content_chunks(body: &[u8]) -> u64 {
    sse_data(body)
        .iter()
        .filter(|e| e["choices"].as_array().is_some_and(|c| !c.is_empty()))
        .count() as u64
}

fn header(resp: &HttpResponse, name: &str) -> String {
    resp.header(name).unwrap_or_default().to_owned()
}

fn by_request_id<'a>(records: &'a [Value], id: &str) -> &'a Value {
    let found: Vec<&Value> = records.iter().filter(|r| r["request_id"] == id).collect();
    assert_eq!(found.len(), 1, "records of {id}: {found:?}");
    found[0]
}

/// What the simulators served for `fairness_id` (prompt + completion tokens, requests
/// completed, requests cut off).
fn served(sims: &[&SimHandle], fairness_id: &str) -> (u64, u64, u64) {
    let mut tokens = 0;
    let mut completed = 0;
    let mut cut = 0;
    for sim in sims {
        for i in 0..sim.addrs().len() {
            for (key, totals) in sim.served(i).unwrap() {
                if key.fairness_id == fairness_id {
                    tokens += totals.prompt_tokens + totals.completion_tokens;
                    completed += totals.requests_completed;
                    cut += totals.requests_cut_off;
                }
            }
        }
    }
    (tokens, completed, cut)
}

pub(super) async fn tenants_are_authenticated_limited_and_billed(flavor: Flavor) {
    let t = tag(flavor);
    let usage_sim = simulator(2, MODEL, false).await;
    let plain_sim = simulator(1, NO_USAGE_MODEL, true).await;
    let echo = TestBackend::start(
        "b0",
        StreamPace {
            events: 1,
            gap: Duration::from_millis(1),
        },
    )
    .await;
    let mut addrs = usage_sim.addrs().to_vec();
    addrs.extend_from_slice(plain_sim.addrs());
    addrs.push(echo.addr);
    let issuer = TestIssuer::new();
    let mut plan = Plan::new(vec![
        PoolSpec::on(MODEL, &[0, 1]),
        PoolSpec::on(NO_USAGE_MODEL, &[2]),
        PoolSpec::on(ECHO_MODEL, &[3]),
        PoolSpec::empty(EMPTY_MODEL),
    ]);
    plan.tenancy = Tenancy {
        objects: objects(2),
        jwt: Some(issuer.provider()),
        billing_log: Some(billing_path(flavor, "main")),
    };
    let Some(stack) = gw::start_over(flavor, addrs, plan).await else {
        return;
    };
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    // Requests that reach the auth stage, each of which must leave one billing line.
    let mut reached = 0;

    // --- authentication ---
    let auth_a = bearer(KEY_A);
    let body = short(MODEL, "who are you");
    let revoked = bearer(KEY_B_REVOKED);
    for (what, headers) in [
        ("no key", vec![]),
        ("a wrong key", vec![("authorization", "Bearer sk-wrong")]),
        ("a revoked key", vec![("authorization", revoked.as_str())]),
    ] {
        let resp = chat(&stack, &body, &headers).await;
        let error = openai_error(&resp, 401);
        assert_eq!(error["code"], "invalid_api_key", "{t}: {what}");
        reached += 1;
    }
    let jwt = issuer.mint(&json!({"iss": issuer.issuer(), "org": "product-team", "sub": "u1"}));
    let jwt_auth = bearer(&jwt);
    let resp = chat(
        &stack,
        &body,
        &[("authorization", &jwt_auth), ("x-request-id", "e2e-jwt")],
    )
    .await;
    assert_eq!(resp.status, 200, "{t}: valid JWT: {}", resp.text());
    reached += 1;
    let forged =
        bearer(&issuer.mint_bad_signature(&json!({"iss": issuer.issuer(), "org": "product-team"})));
    let resp = chat(&stack, &body, &[("authorization", &forged)]).await;
    assert_eq!(resp.status, 401, "{t}: forged JWT: {}", resp.text());
    assert!(
        resp.text().contains("Jwt"),
        "{t}: stopped by jwt_authn itself: {}",
        resp.text()
    );

    // --- the trust boundary: client-sent objective and fairness headers do nothing ---
    let auth_b = bearer(KEY_B);
    let resp = chat(
        &stack,
        &short(ECHO_MODEL, "steer me"),
        &[
            ("authorization", &auth_b),
            (OBJECTIVE, "premium-traffic"),
            (FAIRNESS, "tenant-a"),
            ("x-gateway-inference-objective", "premium-traffic"),
        ],
    )
    .await;
    assert_eq!(resp.status, 200, "{t}: {}", resp.text());
    let seen = resp.json().unwrap()["headers"].clone();
    assert_eq!(seen[OBJECTIVE], "standard-traffic", "{t}: {seen}");
    assert_eq!(seen[FAIRNESS], "tenant-b", "{t}: {seen}");
    assert!(
        seen.get("x-gateway-inference-objective").is_none(),
        "{t}: {seen}"
    );
    assert!(
        seen.get("authorization").is_none(),
        "{t}: the engine got the tenant's key: {seen}"
    );
    reached += 1;

    // --- RPM ---
    let auth_rpm = bearer(KEY_RPM);
    for i in 0..2 {
        let resp = chat(
            &stack,
            &short(MODEL, "rpm"),
            &[("authorization", &auth_rpm)],
        )
        .await;
        assert_eq!(resp.status, 200, "{t}: rpm #{i}: {}", resp.text());
        assert_eq!(header(&resp, "x-ratelimit-limit-requests"), "2", "{t}");
        assert_eq!(
            header(&resp, "x-ratelimit-remaining-requests"),
            (1 - i).to_string(),
            "{t}"
        );
    }
    let resp = chat(
        &stack,
        &short(MODEL, "rpm"),
        &[("authorization", &auth_rpm)],
    )
    .await;
    let error = openai_error(&resp, 429);
    assert_eq!(error["code"], "rate_limit_exceeded", "{t}");
    assert_eq!(error["type"], "requests", "{t}");
    assert_eq!(header(&resp, DROPPED), "rejected-quota-rpm", "{t}");
    let retry: u64 = header(&resp, "retry-after").parse().unwrap();
    assert!((1..=30).contains(&retry), "{t}: retry-after {retry}");
    assert!(resp.header("x-ratelimit-reset-requests").is_some(), "{t}");
    reached += 3;

    // --- TPM: the refused request never reaches an engine ---
    let auth_tpm = bearer(KEY_TPM);
    let tpm_body = |text: &str| {
        json!({"model": MODEL, "max_tokens": 500, "ignore_eos": true,
               "messages": [{"role": "user", "content": text}]})
    };
    let resp = chat(&stack, &tpm_body("first"), &[("authorization", &auth_tpm)]).await;
    assert_eq!(resp.status, 200, "{t}: {}", resp.text());
    let before = served(&[&usage_sim], "tenant-tpm");
    let resp = chat(&stack, &tpm_body("second"), &[("authorization", &auth_tpm)]).await;
    let error = openai_error(&resp, 429);
    assert_eq!(error["type"], "tokens", "{t}");
    assert_eq!(header(&resp, DROPPED), "rejected-quota-tpm", "{t}");
    assert!(resp.header("x-ratelimit-remaining-tokens").is_some(), "{t}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        served(&[&usage_sim], "tenant-tpm"),
        before,
        "{t}: the engine saw the refused request"
    );
    reached += 2;

    // --- concurrency 2 ---
    let mut held = Vec::new();
    for i in 0..2 {
        let mut s = OpenStream::open(
            &url,
            &long_stream(&format!("hold {i}"), 400),
            &[("authorization", &auth_b)],
        )
        .await;
        assert_eq!(s.status, 200, "{t}: held #{i}");
        s.read_events(1).await;
        held.push(s);
    }
    let resp = chat(
        &stack,
        &short(MODEL, "third"),
        &[("authorization", &auth_b)],
    )
    .await;
    openai_error(&resp, 429);
    assert_eq!(header(&resp, DROPPED), "rejected-quota-concurrency", "{t}");
    let first = held.remove(0).read_to_end().await;
    assert!(first.ends_with(b"data: [DONE]\n\n"), "{t}");
    let resp = chat(
        &stack,
        &short(MODEL, "fourth"),
        &[("authorization", &auth_b)],
    )
    .await;
    assert_eq!(resp.status, 200, "{t}: once one ended: {}", resp.text());
    held.remove(0).read_to_end().await;
    reached += 4;

    // --- a completed stream is charged exactly its usage ---
    let asked = json!({"model": MODEL, "stream": true, "max_tokens": 12,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "count to twelve"}]});
    let resp = post_json_streamed(
        &url,
        &asked,
        &[("authorization", &auth_a), ("x-request-id", "e2e-usage")],
    )
    .await
    .unwrap();
    let events = sse_data(&resp.body());
    let usage = events.last().unwrap()["usage"].clone();
    assert_eq!(usage["completion_tokens"], 12, "{t}: {usage}");
    assert!(
        events[..events.len() - 1]
            .iter()
            .all(|e| e.get("usage").is_none()),
        "{t}: the client asked for no per-chunk usage"
    );
    reached += 1;

    // --- a client that asked for no usage gets the engine's own bytes ---
    let plain = json!({"model": MODEL, "stream": true, "max_tokens": 9,
        "messages": [{"role": "user", "content": "byte for byte"}]});
    let through = post_json_streamed(&url, &plain, &[("authorization", &auth_a)])
        .await
        .unwrap()
        .body();
    let direct = post_json_streamed(
        &format!("http://{}/v1/chat/completions", usage_sim.addrs()[0]),
        &plain,
        &[],
    )
    .await
    .unwrap()
    .body();
    assert_eq!(
        String::from_utf8_lossy(&through),
        String::from_utf8_lossy(&direct),
        "{t}: the gateway changed the engine's stream"
    );
    reached += 1;

    // --- a stream cut off mid-way ---
    let mut cut = OpenStream::open(
        &url,
        &long_stream("cut me off", 400),
        &[("authorization", &auth_a), ("x-request-id", "e2e-cut")],
    )
    .await;
    assert_eq!(cut.status, 200, "{t}");
    cut.read_events(20).await;
    let client_chunks = content_chunks(&cut.received);
    drop(cut);
    reached += 1;

    // --- an engine without usage: chunk count ---
    let resp = post_json_streamed(
        &url,
        &json!({"model": NO_USAGE_MODEL, "stream": true, "max_tokens": 7,
                "messages": [{"role": "user", "content": "no usage here"}]}),
        &[("authorization", &auth_a), ("x-request-id", "e2e-chunks")],
    )
    .await
    .unwrap();
    let counted = content_chunks(&resp.body());
    reached += 1;

    // --- every end settles once: a later filter's 503, an upstream reset mid-stream,
    // malformed SSE; tenant-one's single slot must be free after each ---
    let auth_one = bearer(KEY_ONE);
    let one = [("authorization", auth_one.as_str())];
    let resp = chat(&stack, &short(EMPTY_MODEL, "nobody"), &one).await;
    openai_error(&resp, 503);
    assert_eq!(header(&resp, DROPPED), "rejected-no-endpoints", "{t}");
    echo.set_serve(ServeMode::MalformedSse);
    let malformed = post_json_streamed(
        &url,
        &json!({"model": ECHO_MODEL, "stream": true, "messages": []}),
        &one,
    )
    .await
    .unwrap();
    echo.set_serve(ServeMode::Normal);
    assert_eq!(malformed.status, 200, "{t}");
    assert_eq!(
        malformed.body(),
        MALFORMED_SSE,
        "{t}: malformed SSE passes through byte for byte"
    );
    let mut reset = OpenStream::open(
        &url,
        &json!({"model": ECHO_MODEL, "stream": true, "stream_events": 50, "stream_gap_ms": 100,
                "messages": [{"role": "user", "content": "reset me"}]}),
        &one,
    )
    .await;
    assert_eq!(reset.status, 200, "{t}");
    reset.read_events(1).await;
    // The engine dies mid-stream (it is not needed after this).
    echo.kill();
    let cut_short = reset.read_to_end().await;
    assert!(
        !cut_short.ends_with(b"[DONE]\n\n"),
        "{t}: the upstream reset"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let resp = chat(&stack, &short(MODEL, "still one slot"), &one).await;
        if resp.status == 200 {
            break;
        }
        assert_eq!(header(&resp, DROPPED), "rejected-quota-concurrency", "{t}");
        assert!(
            Instant::now() < deadline,
            "{t}: tenant-one's slot never came back"
        );
        reached += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    reached += 4;

    // --- the billing log ---
    let records = billing_records(&stack, reached, Duration::from_secs(10)).await;
    assert_eq!(
        records.len(),
        reached,
        "{t}: one line per request that reached the auth stage\n{records:#?}"
    );
    let outcome_of = |model: &str| -> Vec<String> {
        records
            .iter()
            .filter(|r| r["tenant"] == "tenant-one" && r["model"] == model)
            .map(|r| r["outcome"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(outcome_of(EMPTY_MODEL), ["rejected-no-endpoints"], "{t}");
    assert_eq!(
        outcome_of(ECHO_MODEL).len(),
        2,
        "{t}: {:?}",
        outcome_of(ECHO_MODEL)
    );
    let jwt_record = by_request_id(&records, "e2e-jwt");
    assert_eq!(jwt_record["tenant"], "tenant-a", "{t}");
    let r = by_request_id(&records, "e2e-usage");
    assert_eq!(r["outcome"], "complete", "{t}");
    // `endpoint` is the replica that answered; `destinations` the list it was picked from.
    let served_by = r["endpoint"].as_str().unwrap_or_default();
    assert!(
        usage_sim.addrs().iter().any(|a| a.to_string() == served_by),
        "{t}: endpoint {served_by:?} is not a replica of the pool: {r}"
    );
    let destinations = r["destinations"].as_str().unwrap_or_default();
    assert_eq!(
        destinations.split(',').next(),
        Some(served_by),
        "{t}: no fallback happened, so the pick served: {r}"
    );
    let no_endpoints = records.iter().find(|r| r["model"] == EMPTY_MODEL).unwrap();
    assert!(no_endpoints["endpoint"].is_null(), "{t}: {no_endpoints}");
    assert_eq!(r["tokens_source"], "usage", "{t}");
    assert_eq!(r["prompt_tokens"], usage["prompt_tokens"], "{t}");
    assert_eq!(r["completion_tokens"], usage["completion_tokens"], "{t}");
    assert_eq!(
        r["cached_tokens"], usage["prompt_tokens_details"]["cached_tokens"],
        "{t}"
    );
    assert_eq!(
        r["charged"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap(),
        "{t}"
    );
    let r = by_request_id(&records, "e2e-cut");
    assert_eq!(r["outcome"], "client_disconnect", "{t}: {r}");
    assert_eq!(r["tokens_source"], "continuous_usage", "{t}: {r}");
    let billed = r["completion_tokens"].as_u64().unwrap();
    assert!(
        billed + 1 >= client_chunks && billed <= client_chunks + 40,
        "{t}: billed {billed} for a stream whose client read {client_chunks} chunks"
    );
    let r = by_request_id(&records, "e2e-chunks");
    assert_eq!(r["tokens_source"], "chunk_count", "{t}: {r}");
    assert_eq!(
        r["completion_tokens"].as_u64().unwrap(),
        counted,
        "{t}: {r}"
    );

    let mut outcomes = BTreeMap::new();
    for r in &records {
        *outcomes
            .entry(r["outcome"].as_str().unwrap().to_owned())
            .or_insert(0) += 1;
        let pre = r["pre_debit"].as_i64().unwrap();
        let refund = r["refund"].as_i64().unwrap();
        assert_eq!(pre - refund, r["charged"].as_i64().unwrap(), "{t}: {r}");
    }
    for reason in [
        "rejected-unauthenticated",
        "rejected-quota-rpm",
        "rejected-quota-tpm",
        "rejected-quota-concurrency",
    ] {
        assert!(outcomes.contains_key(reason), "{t}: {outcomes:?}");
    }

    // Per tenant, what was billed on the usage-reporting pool is what its engines served:
    // exactly, except a cut-off stream's last chunk or two still in flight at the cut.
    for tenant in [
        "tenant-a",
        "tenant-b",
        "tenant-rpm",
        "tenant-tpm",
        "tenant-one",
    ] {
        let billed: u64 = records
            .iter()
            .filter(|r| r["tenant"] == tenant && r["pool"] == MODEL)
            .map(|r| r["charged"].as_u64().unwrap())
            .sum();
        let (served, _, cut_off) = served(&[&usage_sim], tenant);
        let slack = 3 * cut_off;
        assert!(
            billed.abs_diff(served) <= slack,
            "{t}: {tenant} billed {billed}, engines served {served} (cut off: {cut_off})"
        );
    }

    let stats = stack.envoy().stats().await.unwrap();
    for needle in [
        "infergate.quota.rejects.tenant.tenant-rpm",
        "infergate.usage.completion_tokens.tenant.tenant-a",
        "infergate.auth.requests",
    ] {
        assert!(
            stats.sum_containing(needle) > 0,
            "{t}: no {needle}\n{}",
            gw::gateway_stats(&stats)
        );
    }
}

/// Concurrency 2 admits exactly 2 per Envoy process, at 1 and at 4 workers: held streams on
/// connections of their own (so on any worker), then a burst that must all be refused, then
/// the two slots freed and taken again.
pub(super) async fn a_tenants_concurrency_holds_across_workers(flavor: Flavor) {
    let t = tag(flavor);
    let usage_sim = simulator(2, MODEL, false).await;
    for workers in [1, 4] {
        let mut plan = Plan::new(vec![PoolSpec::on(MODEL, &[0, 1])]);
        plan.concurrency = workers;
        plan.tenancy = Tenancy {
            objects: objects(2),
            jwt: None,
            billing_log: Some(billing_path(flavor, &format!("workers{workers}"))),
        };
        let Some(stack) = gw::start_over(flavor, usage_sim.addrs().to_vec(), plan).await else {
            return;
        };
        let url = format!("{}/v1/chat/completions", stack.picker_url());
        let auth = bearer(KEY_B);
        let headers = [("authorization", auth.as_str())];
        let mut admitted = Vec::new();
        let mut refused = 0;
        for i in 0..10 {
            let mut s = OpenStream::open(&url, &long_stream(&format!("w{i}"), 600), &headers).await;
            match s.status {
                200 => {
                    s.read_events(1).await;
                    admitted.push(s);
                }
                429 => {
                    assert_eq!(
                        s.headers[DROPPED], "rejected-quota-concurrency",
                        "{t} x{workers}"
                    );
                    refused += 1;
                }
                other => panic!("{t} x{workers}: status {other}"),
            }
        }
        assert_eq!(admitted.len(), 2, "{t} at {workers} workers");
        assert_eq!(refused, 8, "{t} at {workers} workers");
        // The two clients leave; their slots come back once Envoy ends their streams.
        admitted.clear();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut again = Vec::new();
        while again.len() < 2 {
            assert!(
                Instant::now() < deadline,
                "{t} x{workers}: slots never freed"
            );
            let mut s = OpenStream::open(&url, &long_stream("again", 600), &headers).await;
            if s.status == 200 {
                s.read_events(1).await;
                again.push(s);
            } else {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let s = OpenStream::open(&url, &long_stream("over", 600), &headers).await;
        assert_eq!(s.status, 429, "{t} x{workers}: a third while two run again");
        drop(again);
    }
}

/// Keys of the output-multiplicity tenants (TPM 4,000 each).
const KEY_N: &str = "sk-infergate-e2e-n";
const KEY_BATCH: &str = "sk-infergate-e2e-batch";
/// The router's `maxOutputSequences` in the multiplicity test.
const SEQUENCE_CAP: u64 = 16;

/// Output multiplicity, at 1 and at 4 workers: `n: 8, max_completion_tokens: 400` may make
/// the engine generate 3,200 tokens, so the pre-debit counts them all (the billing line's
/// `pre_debit` is the prompt estimate + 3,200) and a second such request in the same minute
/// does not fit a 4,000 TPM bucket (429 `rejected-quota-tpm`, the engine never sees it);
/// the same for a `/v1/completions` batch of 8 prompts. A request over the router's
/// `maxOutputSequences` is a 400 naming `n` or `prompt`. The simulator answers the 8
/// choices and bills all their tokens: `pre_debit − refund = charged` = its usage.
pub(super) async fn output_multiplicity_is_debited_and_capped(flavor: Flavor) {
    let t = tag(flavor);
    let usage_sim = sim::start(SimConfig {
        replicas: 2,
        models: vec![MODEL.into()],
        deterministic: true,
        time_scale: 20.0,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let limit = json!({"rpm": 1000, "tpm": 4000, "concurrency": 100});
    let mut objects = objects(2);
    objects.push(tenant_quota(
        "tenant-n",
        KEY_N,
        "standard-traffic",
        limit.clone(),
        None,
    ));
    objects.push(tenant_quota(
        "tenant-batch",
        KEY_BATCH,
        "standard-traffic",
        limit,
        None,
    ));
    let chat_body = |text: &str, n: u64| {
        json!({"model": MODEL, "n": n, "max_completion_tokens": 400, "ignore_eos": true,
               "messages": [{"role": "user", "content": text}]})
    };
    let batch_body = |text: &str, n: u64| {
        let prompts: Vec<String> = (0..8).map(|i| format!("{text} {i}")).collect();
        json!({"model": MODEL, "prompt": prompts, "n": n, "max_tokens": 400,
               "ignore_eos": true})
    };
    for workers in [1, 4] {
        let mut plan = Plan::new(vec![PoolSpec::on(MODEL, &[0, 1])]);
        plan.concurrency = workers;
        plan.tenancy = Tenancy {
            objects: objects.clone(),
            jwt: None,
            billing_log: Some(billing_path(flavor, &format!("multiplicity{workers}"))),
        };
        plan.tweak = Some(Box::new(|plugins| {
            plugins.router["maxOutputSequences"] = json!(SEQUENCE_CAP);
        }));
        let Some(stack) = gw::start_over(flavor, usage_sim.addrs().to_vec(), plan).await else {
            return;
        };
        let w = format!("{t} x{workers}");
        let mut reached = 0;
        for (path, api, key, tenant, body) in [
            (
                "/v1/chat/completions",
                scheduler_core::request::Api::ChatCompletions,
                KEY_N,
                "tenant-n",
                chat_body as fn(&str, u64) -> Value,
            ),
            (
                "/v1/completions",
                scheduler_core::request::Api::Completions,
                KEY_BATCH,
                "tenant-batch",
                batch_body as fn(&str, u64) -> Value,
            ),
        ] {
            let url = format!("{}{path}", stack.picker_url());
            let auth = bearer(key);
            let first = body(
                &format!("first {workers}"),
                if key == KEY_N { 8 } else { 1 },
            );
            let id = format!("multiplicity-{tenant}-{workers}");
            let resp = post_json(
                &url,
                &first,
                &[("authorization", &auth), ("x-request-id", &id)],
            )
            .await
            .unwrap();
            assert_eq!(resp.status, 200, "{w} {path}: {}", resp.text());
            let answer = resp.json().unwrap();
            assert_eq!(
                answer["choices"].as_array().map(Vec::len),
                Some(8),
                "{w} {path}: every choice answered"
            );
            assert_eq!(answer["usage"]["completion_tokens"], 3200, "{w} {path}");
            reached += 1;
            let before = served(&[&usage_sim], tenant);
            let second = body(
                &format!("second {workers}"),
                if key == KEY_N { 8 } else { 1 },
            );
            let resp = post_json(&url, &second, &[("authorization", &auth)])
                .await
                .unwrap();
            let error = openai_error(&resp, 429);
            assert_eq!(error["type"], "tokens", "{w} {path}");
            assert_eq!(header(&resp, DROPPED), "rejected-quota-tpm", "{w} {path}");
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert_eq!(
                served(&[&usage_sim], tenant),
                before,
                "{w} {path}: the engine saw the refused request"
            );
            reached += 1;

            // Over the cap: n alone, or the batch's prompts × n.
            let (over, param) = if key == KEY_N {
                (body("over", SEQUENCE_CAP + 1), "n")
            } else {
                (body("over", 4), "prompt")
            };
            let resp = post_json(&url, &over, &[("authorization", &auth)])
                .await
                .unwrap();
            let error = openai_error(&resp, 400);
            assert_eq!(error["param"], param, "{w} {path}: {error}");
            assert_eq!(error["code"], "integer_above_max_value", "{w} {path}");
            reached += 1;

            // The billing line of the admitted request: the prompt estimate + 8 × 400.
            let records = billing_records(&stack, reached, Duration::from_secs(10)).await;
            let r = by_request_id(&records, &id);
            let prompt = scheduler_core::request::parse(api, first.to_string().as_bytes())
                .unwrap()
                .prompt_tokens
                .0;
            assert_eq!(r["pre_debit"], prompt + 3200, "{w} {path}: {r}");
            assert_eq!(r["outcome"], "complete", "{w} {path}: {r}");
            assert_eq!(
                r["charged"].as_u64().unwrap(),
                answer["usage"]["prompt_tokens"].as_u64().unwrap() + 3200,
                "{w} {path}: {r}"
            );
            assert_eq!(
                r["pre_debit"].as_i64().unwrap() - r["refund"].as_i64().unwrap(),
                r["charged"].as_i64().unwrap(),
                "{w} {path}: {r}"
            );
        }
        let records = billing_records(&stack, reached, Duration::from_secs(10)).await;
        assert_eq!(
            records.len(),
            reached,
            "{w}: one line per request\n{records:#?}"
        );
    }
}
