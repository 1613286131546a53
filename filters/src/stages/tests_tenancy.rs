//! The tenancy stages through the driver over the fake host: authentication and the trust
//! boundary, quota admission and settlement, usage forcing and reading, and one billing
//! record per request.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::Arc;

use scheduler_core::request::Api;
use serde_json::{json, Value};

use super::*;
use crate::fake::FakeHost;
use crate::headers::{DROPPED_REASON, FAIRNESS_ID, OBJECTIVE};
use crate::pipeline::{Pipeline, Run};
use crate::quotas::MemoryQuotas;
use crate::router::Router;
use crate::tenants::{sha256_hex, Tenants};
use crate::FilterStatus;

const KEY_A: &str = "sk-test-a";
const KEY_B: &str = "sk-test-b";

fn tenants(concurrency: u64, tpm: u64) -> Tenants {
    let quota = |name: &str, key: &str, objective: &str, jwt: Option<Value>| {
        let mut identity = json!({"apiKeyHashes": [sha256_hex(key.as_bytes())]});
        if let Some(jwt) = jwt {
            identity["jwtClaims"] = jwt;
        }
        json!({
            "apiVersion": "mini-platform.local/v1alpha1",
            "kind": "TenantQuota",
            "metadata": {"name": name},
            "spec": {
                "identity": identity,
                "inject": {"fairnessId": name, "objective": objective},
                "limits": [{"model": "llama", "rpm": 1000, "tpm": tpm,
                            "concurrency": concurrency, "maxCompletionTokensDefault": 100}],
                "accounting": {"preDebit": "input_plus_max_output",
                               "settleOn": "usage_or_chunk_count",
                               "streamDisconnect": "bill_generated"}
            }
        })
    };
    let objective = |name: &str, priority: i64| {
        json!({"apiVersion": "llm-d.ai/v1alpha2", "kind": "InferenceObjective",
               "metadata": {"name": name}, "spec": {"priority": priority}})
    };
    Tenants::from_objects(&[
        quota(
            "tenant-a",
            KEY_A,
            "premium",
            Some(json!({"issuer": "https://sso.test", "tenantClaim": "org",
                        "tenantValue": "team-a"})),
        ),
        quota("tenant-b", KEY_B, "standard", None),
        objective("premium", 100),
        objective("standard", 0),
    ])
    .unwrap()
}

fn pipeline(tenants: Tenants) -> Pipeline<FakeHost> {
    let router = Router::from_json(json!({
        "bodyLimitBytes": 1 << 20,
        "pools": [{"name": "p", "baseModel": "llama"}]
    }))
    .unwrap();
    let tenancy = Tenancy::new(tenants, Arc::new(MemoryQuotas::default()));
    Pipeline::new(vec![
        Box::new(AuthStage::new(Arc::clone(&tenancy))),
        Box::new(RouteStage::new(Arc::new(router))),
        Box::new(QuotaStage::new(tenancy)),
        Box::new(UsageStage),
    ])
}

const STREAM_BODY: &str =
    r#"{"model":"llama","stream":true,"messages":[{"role":"user","content":"hello there"}]}"#;

/// The engine's stream with usage forced on: usage on every chunk, then a usage-only chunk.
const ENGINE: [&str; 4] = [
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}],\"usage\":{\"prompt_tokens\":5,\"total_tokens\":6,\"completion_tokens\":1}}\n\n",
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"}}],\"usage\":{\"prompt_tokens\":5,\"total_tokens\":7,\"completion_tokens\":2}}\n\n",
    "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"total_tokens\":7,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":3}}}\n\n",
    "data: [DONE]\n\n",
];

/// What the engine would have sent a client that asked for no usage.
const PLAIN: &str = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"}}]}\n\ndata: [DONE]\n\n";

fn request(key: Option<&str>, body: &str) -> FakeHost {
    let mut host = FakeHost::new()
        .post("/v1/chat/completions", body.as_bytes())
        .now(1_000);
    if let Some(key) = key {
        host = host.request_header("authorization", &format!("Bearer {key}"));
    }
    host
}

/// Runs the request side; the status the host got.
fn send(p: &Pipeline<FakeHost>, run: &mut Run, host: &mut FakeHost) -> FilterStatus {
    let status = run.request_headers(p, host, false);
    if status != FilterStatus::Pause {
        return status;
    }
    let len = host.body.len();
    run.request_body(p, host, len, true)
}

/// Streams `chunks` back through the run; what the client received.
fn respond(p: &Pipeline<FakeHost>, run: &mut Run, host: &mut FakeHost, chunks: &[&str]) -> String {
    host.response_headers = vec![
        (":status".into(), "200".into()),
        ("content-type".into(), "text/event-stream".into()),
    ];
    run.response_headers(p, host, false);
    let mut client = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        host.now.0 += 10;
        host.response_chunk = chunk.as_bytes().to_vec();
        run.response_chunk(p, host, i + 1 == chunks.len());
        client.extend_from_slice(&host.response_chunk);
    }
    String::from_utf8(client).unwrap()
}

fn record(host: &FakeHost) -> Value {
    assert_eq!(host.usage_records.len(), 1, "{:?}", host.usage_records);
    serde_json::from_str(&host.usage_records[0]).unwrap()
}

#[test]
fn no_key_a_wrong_key_and_a_jwt_nobody_verified_get_401_and_one_record() {
    let p = pipeline(tenants(10, 100_000));
    for key in [None, Some("sk-wrong"), Some("eyJh.eyJi.c2ln")] {
        let mut host = request(key, STREAM_BODY);
        let mut run = Run::new();
        assert_eq!(send(&p, &mut run, &mut host), FilterStatus::Replied);
        run.end(&p, &mut host);
        let reply = host.last_reply().unwrap();
        assert_eq!(reply.status, 401, "{key:?}");
        let body: Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(body["error"]["code"], "invalid_api_key");
        let r = record(&host);
        assert_eq!(r["outcome"], "rejected-unauthenticated");
        assert_eq!(r["tenant"], Value::Null);
        assert_eq!(r["charged"], 0);
    }
}

#[test]
fn client_gateway_headers_are_stripped_and_the_tenants_are_injected() {
    let p = pipeline(tenants(10, 100_000));
    let mut host = request(Some(KEY_B), STREAM_BODY)
        .request_header(OBJECTIVE, "premium")
        .request_header(FAIRNESS_ID, "tenant-a")
        .request_header("x-gateway-inference-objective", "premium")
        .request_header("x-gateway-destination-endpoint", "10.9.9.9:1");
    let mut run = Run::new();
    assert_eq!(send(&p, &mut run, &mut host), FilterStatus::Continue);
    assert_eq!(host.header(OBJECTIVE), Some("standard"));
    assert_eq!(host.header(FAIRNESS_ID), Some("tenant-b"));
    assert_eq!(host.header("x-gateway-inference-objective"), None);
    assert_eq!(host.header("x-gateway-destination-endpoint"), None);
    assert_eq!(
        host.header("authorization"),
        None,
        "the key stays at the gateway"
    );
    // The router's own headers are set after the boundary and survive it.
    assert_eq!(host.header("x-gateway-base-model-name"), Some("llama"));
    run.end(&p, &mut host);
}

#[test]
fn a_verified_jwt_maps_to_its_tenant_by_issuer_and_claim() {
    let p = pipeline(tenants(10, 100_000));
    let claims = |iss: &str, org: &str| {
        Some(BTreeMap::from([
            ("iss".to_owned(), iss.to_owned()),
            ("org".to_owned(), org.to_owned()),
        ]))
    };
    let mut host = request(Some("eyJh.eyJi.c2ln"), STREAM_BODY);
    host.verified_jwt = claims("https://sso.test", "team-a");
    let mut run = Run::new();
    assert_eq!(send(&p, &mut run, &mut host), FilterStatus::Continue);
    assert_eq!(host.header(FAIRNESS_ID), Some("tenant-a"));
    run.end(&p, &mut host);
    for (iss, org) in [("https://other", "team-a"), ("https://sso.test", "team-b")] {
        let mut host = request(Some("eyJh.eyJi.c2ln"), STREAM_BODY);
        host.verified_jwt = claims(iss, org);
        let mut run = Run::new();
        assert_eq!(send(&p, &mut run, &mut host), FilterStatus::Replied);
        assert_eq!(host.last_reply().unwrap().status, 401);
    }
}

#[test]
fn concurrency_two_admits_two_and_a_third_after_one_ends() {
    let p = pipeline(tenants(2, 100_000));
    let mut runs: Vec<(Run, FakeHost)> = (0..2)
        .map(|_| {
            let mut host = request(Some(KEY_A), STREAM_BODY);
            let mut run = Run::new();
            assert_eq!(send(&p, &mut run, &mut host), FilterStatus::Continue);
            (run, host)
        })
        .collect();
    let mut third = request(Some(KEY_A), STREAM_BODY);
    let mut run = Run::new();
    assert_eq!(send(&p, &mut run, &mut third), FilterStatus::Replied);
    let reply = third.last_reply().unwrap().clone();
    assert_eq!(reply.status, 429);
    let header = |name: &str| {
        reply
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        header(DROPPED_REASON).as_deref(),
        Some("rejected-quota-concurrency")
    );
    assert!(header("retry-after").is_some());
    assert_eq!(
        header("x-ratelimit-limit-requests").as_deref(),
        Some("1000")
    );
    let body: Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    run.end(&p, &mut third);
    assert_eq!(record(&third)["outcome"], "rejected-quota-concurrency");
    // Another tenant is not affected.
    let mut b = request(Some(KEY_B), STREAM_BODY);
    assert_eq!(send(&p, &mut Run::new(), &mut b), FilterStatus::Continue);

    let (mut first, mut host) = runs.remove(0);
    respond(&p, &mut first, &mut host, &ENGINE);
    first.end(&p, &mut host);
    let mut fourth = request(Some(KEY_A), STREAM_BODY);
    assert_eq!(
        send(&p, &mut Run::new(), &mut fourth),
        FilterStatus::Continue
    );
}

#[test]
fn a_pre_debit_over_the_token_balance_is_refused_before_the_engine() {
    let p = pipeline(tenants(10, 1_000));
    let small = r#"{"model":"llama","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut host = request(Some(KEY_A), small);
    assert_eq!(send(&p, &mut Run::new(), &mut host), FilterStatus::Continue);
    // The output part is capped at the bucket's capacity (1000): with the prompt, more
    // than the balance left.
    let big = r#"{"model":"llama","max_tokens":2000,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut host = request(Some(KEY_A), big);
    let mut run = Run::new();
    assert_eq!(send(&p, &mut run, &mut host), FilterStatus::Replied);
    let reply = host.last_reply().unwrap();
    assert_eq!(reply.status, 429);
    assert!(reply
        .headers
        .iter()
        .any(|(k, v)| k == DROPPED_REASON && v == "rejected-quota-tpm"));
    let body: Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(body["error"]["type"], "tokens");
    assert_eq!(host.header("x-gateway-destination-endpoint"), None);
    run.end(&p, &mut host);
    assert_eq!(record(&host)["outcome"], "rejected-quota-tpm");
}

#[test]
fn a_stream_is_forced_to_report_usage_and_the_client_gets_the_engines_bytes_without_it() {
    let p = pipeline(tenants(10, 100_000));
    let mut host = request(Some(KEY_A), STREAM_BODY);
    let mut run = Run::new();
    assert_eq!(send(&p, &mut run, &mut host), FilterStatus::Continue);
    let sent: Value = serde_json::from_slice(&host.body).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    assert_eq!(sent["stream_options"]["continuous_usage_stats"], true);
    let client = respond(&p, &mut run, &mut host, &ENGINE);
    assert_eq!(client, PLAIN);
    assert!(host
        .response_headers
        .iter()
        .any(|(k, _)| k == "x-ratelimit-remaining-tokens"));
    run.end(&p, &mut host);
    let r = record(&host);
    assert_eq!(r["tenant"], "tenant-a");
    assert_eq!(r["priority"], 100);
    assert_eq!(r["outcome"], "complete");
    assert_eq!(r["prompt_tokens"], 5);
    assert_eq!(r["completion_tokens"], 2);
    assert_eq!(r["cached_tokens"], 3);
    assert_eq!(r["charged"], 7);
    assert_eq!(r["tokens_source"], "usage");
    let pre = r["pre_debit"].as_i64().unwrap();
    assert_eq!(pre - r["refund"].as_i64().unwrap(), 7);
    assert_eq!(r["ttft_ms"], 10);
    assert_eq!(
        host.counter("infergate.usage.completion_tokens.tenant.tenant-a.model.llama.priority.100"),
        2
    );
}

#[test]
fn a_client_asking_for_usage_gets_every_byte() {
    let p = pipeline(tenants(10, 100_000));
    let body = r#"{"model":"llama","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"messages":[]}"#;
    let mut host = request(Some(KEY_A), body);
    let mut run = Run::new();
    assert_eq!(send(&p, &mut run, &mut host), FilterStatus::Continue);
    assert_eq!(host.body, body.as_bytes(), "nothing to force");
    assert_eq!(respond(&p, &mut run, &mut host, &ENGINE), ENGINE.concat());
}

#[test]
fn a_stream_cut_off_is_billed_for_what_was_generated_and_settles_once() {
    let p = pipeline(tenants(1, 100_000));
    let mut host = request(Some(KEY_A), STREAM_BODY);
    let mut run = Run::new();
    assert_eq!(send(&p, &mut run, &mut host), FilterStatus::Continue);
    host.response_headers = vec![
        (":status".into(), "200".into()),
        ("content-type".into(), "text/event-stream".into()),
    ];
    run.response_headers(&p, &mut host, false);
    for chunk in &ENGINE[..2] {
        host.response_chunk = chunk.as_bytes().to_vec();
        run.response_chunk(&p, &mut host, false);
    }
    run.end(&p, &mut host);
    run.end(&p, &mut host);
    let r = record(&host);
    assert_eq!(r["outcome"], "client_disconnect");
    assert_eq!(r["tokens_source"], "continuous_usage");
    assert_eq!(r["completion_tokens"], 2);
    assert_eq!(r["charged"], 7);
    // Concurrency 1 is free again: settled exactly once.
    let mut next = request(Some(KEY_A), STREAM_BODY);
    assert_eq!(send(&p, &mut Run::new(), &mut next), FilterStatus::Continue);
    let mut third = request(Some(KEY_A), STREAM_BODY);
    assert_eq!(send(&p, &mut Run::new(), &mut third), FilterStatus::Replied);
}

#[test]
fn an_engine_without_usage_is_billed_by_chunk_count() {
    let p = pipeline(tenants(10, 100_000));
    let mut host = request(Some(KEY_A), STREAM_BODY);
    let mut run = Run::new();
    assert_eq!(send(&p, &mut run, &mut host), FilterStatus::Continue);
    let plain: Vec<&str> = PLAIN.split_inclusive("\n\n").collect();
    assert_eq!(respond(&p, &mut run, &mut host, &plain), PLAIN);
    run.end(&p, &mut host);
    let r = record(&host);
    assert_eq!(r["tokens_source"], "chunk_count");
    assert_eq!(r["completion_tokens"], 2);
    // The gateway's own estimate of the prompt: canonical prompt bytes / 4.
    assert!(r["prompt_tokens"].as_u64().unwrap() > 0);
}

#[test]
fn a_non_streamed_response_is_billed_from_its_usage() {
    let p = pipeline(tenants(10, 100_000));
    let body = r#"{"model":"llama","messages":[{"role":"user","content":"hello"}]}"#;
    let mut host = request(Some(KEY_A), body);
    let mut run = Run::new();
    assert_eq!(send(&p, &mut run, &mut host), FilterStatus::Continue);
    assert_eq!(host.body, body.as_bytes());
    host.response_headers = vec![
        (":status".into(), "200".into()),
        ("content-type".into(), "application/json".into()),
    ];
    run.response_headers(&p, &mut host, false);
    let json = r#"{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}"#;
    let (a, b) = json.split_at(60);
    for (chunk, last) in [(a, false), (b, true)] {
        host.response_chunk = chunk.as_bytes().to_vec();
        run.response_chunk(&p, &mut host, last);
        assert_eq!(host.response_chunk, chunk.as_bytes());
    }
    run.end(&p, &mut host);
    let r = record(&host);
    assert_eq!(r["charged"], 13);
    assert_eq!(r["tokens_source"], "usage");
}

/// `n: 8, max_completion_tokens: 400` is pre-debited 3,200 output tokens, so a second such
/// request in the same minute does not fit a 4,000 TPM bucket; a completions batch of eight
/// prompts the same; without a limit, `maxCompletionTokensDefault` counts per sequence.
#[test]
fn output_multiplicity_is_pre_debited_in_full() {
    let prompt_of = |api, body: &str| {
        scheduler_core::request::parse(api, body.as_bytes())
            .unwrap()
            .prompt_tokens
            .0
    };
    let chat = r#"{"model":"llama","n":8,"max_completion_tokens":400,"messages":[{"role":"user","content":"name a bakery"}]}"#;
    let batch = serde_json::to_string(&json!({"model": "llama", "max_tokens": 400,
        "prompt": (0..8).map(|i| format!("prompt {i}")).collect::<Vec<_>>()}))
    .unwrap();
    for (path, api, body) in [
        (
            "/v1/chat/completions",
            Api::ChatCompletions,
            chat.to_owned(),
        ),
        ("/v1/completions", Api::Completions, batch),
    ] {
        let p = pipeline(tenants(10, 4_000));
        let host = || {
            FakeHost::new()
                .post(path, body.as_bytes())
                .now(1_000)
                .request_header("authorization", &format!("Bearer {KEY_A}"))
        };
        // The first is still in flight (its settlement would refund what it did not use).
        let mut first = host();
        let mut first_run = Run::new();
        assert_eq!(
            send(&p, &mut first_run, &mut first),
            FilterStatus::Continue,
            "{path}"
        );
        let mut second = host();
        let mut run = Run::new();
        assert_eq!(
            send(&p, &mut run, &mut second),
            FilterStatus::Replied,
            "{path}"
        );
        assert_eq!(second.last_reply().unwrap().status, 429);
        run.end(&p, &mut second);
        assert_eq!(record(&second)["outcome"], "rejected-quota-tpm", "{path}");
        first_run.end(&p, &mut first);
        let r = record(&first);
        assert_eq!(r["pre_debit"], prompt_of(api, &body) + 3_200, "{path}: {r}");
    }
    // No limit: the tenant's default (100) per sequence.
    let p = pipeline(tenants(10, 100_000));
    let body = r#"{"model":"llama","best_of":4,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut host = request(Some(KEY_A), body);
    let mut run = Run::new();
    assert_eq!(send(&p, &mut run, &mut host), FilterStatus::Continue);
    run.end(&p, &mut host);
    assert_eq!(
        record(&host)["pre_debit"],
        prompt_of(Api::ChatCompletions, body) + 400
    );
    // Over the router's cap: 400 before any debit, still one record.
    let mut host = request(
        Some(KEY_A),
        r#"{"model":"llama","n":129,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    let mut run = Run::new();
    assert_eq!(send(&p, &mut run, &mut host), FilterStatus::Replied);
    assert_eq!(host.last_reply().unwrap().status, 400);
    run.end(&p, &mut host);
    let r = record(&host);
    assert_eq!(
        (r["pre_debit"].as_u64(), r["status"].as_u64()),
        (Some(0), Some(400)),
        "{r}"
    );
}

#[test]
fn a_later_filters_rejection_is_recorded_with_its_reason_and_refunded() {
    let p = pipeline(tenants(10, 100_000));
    let mut host = request(Some(KEY_A), STREAM_BODY);
    let mut run = Run::new();
    assert_eq!(send(&p, &mut run, &mut host), FilterStatus::Continue);
    host.response_headers = vec![
        (":status".into(), "503".into()),
        (DROPPED_REASON.into(), "rejected-no-endpoints".into()),
        ("content-type".into(), "application/json".into()),
    ];
    run.response_headers(&p, &mut host, false);
    host.response_chunk = br#"{"error":{}}"#.to_vec();
    run.response_chunk(&p, &mut host, true);
    run.end(&p, &mut host);
    let r = record(&host);
    assert_eq!(r["outcome"], "rejected-no-endpoints");
    assert_eq!(r["charged"], 0);
    assert_eq!(r["refund"], r["pre_debit"]);
}

/// Global quotas: the stage leaves RPM and TPM to the rate-limit filter (bucket and
/// pre-debit in request headers, nothing debited here, concurrency still local), writes
/// the tokens used for the settlement, and a refusal by the service debits nothing.
#[test]
fn global_quotas_hand_the_pre_debit_to_the_rate_limit_filter_and_settle_by_stream_state() {
    use crate::stages::tenancy::{QUOTA_ACTUAL_STATE, QUOTA_BUCKET_HEADER, QUOTA_TOKENS_HEADER};
    let header = |host: &FakeHost, name: &str| {
        host.request_headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    // TPM 1: the in-process buckets would refuse every request; concurrency 1 stays local.
    let mut t = tenants(1, 1);
    t.set_global_quotas(true);
    let p = pipeline(t);
    let mut host = request(Some(KEY_A), STREAM_BODY);
    // A client cannot name the bucket or the pre-debit itself.
    host.request_headers
        .push((QUOTA_TOKENS_HEADER.into(), "1".into()));
    let mut run = Run::new();
    assert_eq!(send(&p, &mut run, &mut host), FilterStatus::Continue);
    assert_eq!(
        header(&host, QUOTA_BUCKET_HEADER).as_deref(),
        Some("tenant-a/llama")
    );
    let debit: u64 = header(&host, QUOTA_TOKENS_HEADER).unwrap().parse().unwrap();
    // The prompt estimate plus the output part, capped at the entry's TPM (1): more than
    // the in-process bucket holds, so only the global mode admits it.
    assert!(debit > 1, "{debit}");
    // Concurrency is still this process's: a second request at once is refused here.
    let mut second = request(Some(KEY_A), STREAM_BODY);
    assert_eq!(
        send(&p, &mut Run::new(), &mut second),
        FilterStatus::Replied
    );
    assert_eq!(
        second.replies[0]
            .headers
            .iter()
            .find(|(k, _)| k == DROPPED_REASON)
            .map(|(_, v)| v.as_str()),
        Some("rejected-quota-concurrency")
    );
    let client = respond(&p, &mut run, &mut host, &ENGINE);
    assert_eq!(client, PLAIN);
    assert!(
        host.response_headers
            .iter()
            .all(|(k, _)| !k.starts_with("x-ratelimit-")),
        "the service sets the x-ratelimit-* headers"
    );
    run.end(&p, &mut host);
    assert_eq!(
        host.stream_state
            .get(QUOTA_ACTUAL_STATE)
            .map(|v| v.as_slice()),
        Some(&b"7"[..])
    );
    let r = record(&host);
    assert_eq!(
        (r["pre_debit"].as_u64(), r["charged"].as_u64()),
        (Some(debit), Some(7))
    );

    // Refused by the service (its 429 on the response): no debit, no settlement, and the
    // concurrency slot comes back.
    let mut refused = request(Some(KEY_A), STREAM_BODY);
    let mut run = Run::new();
    assert_eq!(send(&p, &mut run, &mut refused), FilterStatus::Continue);
    refused.response_headers = vec![
        (":status".into(), "429".into()),
        (DROPPED_REASON.into(), "rejected-quota-tpm".into()),
        ("content-type".into(), "application/json".into()),
    ];
    run.response_headers(&p, &mut refused, false);
    refused.response_chunk = br#"{"error":{}}"#.to_vec();
    run.response_chunk(&p, &mut refused, true);
    run.end(&p, &mut refused);
    assert!(!refused.stream_state.contains_key(QUOTA_ACTUAL_STATE));
    let r = record(&refused);
    assert_eq!(r["outcome"], "rejected-quota-tpm");
    assert_eq!(
        (r["pre_debit"].as_u64(), r["charged"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(
        refused
            .counters
            .iter()
            .filter(
                |(k, _)| k.contains("infergate.quota.rejects") && k.contains("rejected-quota-tpm")
            )
            .map(|(_, v)| *v)
            .sum::<u64>(),
        1
    );
    let mut again = request(Some(KEY_A), STREAM_BODY);
    assert_eq!(
        send(&p, &mut Run::new(), &mut again),
        FilterStatus::Continue
    );
}

#[test]
fn global_quotas_are_a_boolean_and_need_tenants() {
    use crate::stages::tenancy::take_tenants;
    assert!(take_tenants(&mut json!({"globalQuotas": true})).is_err());
    assert!(take_tenants(&mut json!({"globalQuotas": "yes", "tenantQuotas": []})).is_err());
    let mut config = json!({"globalQuotas": false});
    assert!(take_tenants(&mut config).unwrap().is_none());
    assert!(config.get("globalQuotas").is_none(), "the key is taken out");
}

/// Global quotas: an engine's response carrying the service's dropped reasons is not the
/// service's refusal. It is billed and settled as any other (the reservation committed
/// with what was used), and no quota rejection is counted.
#[test]
fn global_quotas_settle_an_upstream_response_whatever_dropped_reason_it_carries() {
    use crate::stages::tenancy::{QUOTA_ACTUAL_STATE, QUOTA_TOKENS_HEADER};
    let mut t = tenants(1, 1);
    t.set_global_quotas(true);
    let p = pipeline(t);
    let rejects = |host: &FakeHost| {
        host.counters
            .iter()
            .filter(|(k, _)| k.contains("infergate.quota.rejects"))
            .map(|(_, v)| *v)
            .sum::<u64>()
    };

    // A 200 stream that says `rejected-quota-tpm`: billed what it used, settled with it.
    let mut served = request(Some(KEY_A), STREAM_BODY);
    let mut run = Run::new();
    assert_eq!(send(&p, &mut run, &mut served), FilterStatus::Continue);
    let debit: u64 = served
        .request_headers
        .iter()
        .find(|(k, _)| k == QUOTA_TOKENS_HEADER)
        .map(|(_, v)| v.parse().unwrap())
        .unwrap();
    served.served_upstream = Some("10.0.0.1:8000".into());
    served.response_headers = vec![
        (":status".into(), "200".into()),
        ("content-type".into(), "text/event-stream".into()),
        (DROPPED_REASON.into(), "rejected-quota-tpm".into()),
    ];
    run.response_headers(&p, &mut served, false);
    for (i, chunk) in ENGINE.iter().enumerate() {
        served.response_chunk = chunk.as_bytes().to_vec();
        run.response_chunk(&p, &mut served, i + 1 == ENGINE.len());
    }
    run.end(&p, &mut served);
    assert_eq!(
        served
            .stream_state
            .get(QUOTA_ACTUAL_STATE)
            .map(|v| v.as_slice()),
        Some(&b"7"[..])
    );
    let r = record(&served);
    assert_eq!(r["outcome"], "complete");
    assert_eq!(
        (r["pre_debit"].as_u64(), r["charged"].as_u64()),
        (Some(debit), Some(7))
    );
    assert_eq!(rejects(&served), 0);

    // An engine's own 429 with `rejected-quota-rpm`: nothing used, but the reservation is
    // still settled (with 0) rather than left to hold the pre-debit.
    let mut refused = request(Some(KEY_A), STREAM_BODY);
    let mut run = Run::new();
    assert_eq!(send(&p, &mut run, &mut refused), FilterStatus::Continue);
    refused.served_upstream = Some("10.0.0.1:8000".into());
    refused.response_headers = vec![
        (":status".into(), "429".into()),
        (DROPPED_REASON.into(), "rejected-quota-rpm".into()),
        ("content-type".into(), "application/json".into()),
    ];
    run.response_headers(&p, &mut refused, false);
    refused.response_chunk = br#"{"error":{}}"#.to_vec();
    run.response_chunk(&p, &mut refused, true);
    run.end(&p, &mut refused);
    assert_eq!(
        refused
            .stream_state
            .get(QUOTA_ACTUAL_STATE)
            .map(|v| v.as_slice()),
        Some(&b"0"[..])
    );
    let r = record(&refused);
    assert_ne!(r["outcome"], "rejected-quota-rpm");
    assert_eq!(
        (r["pre_debit"].as_u64(), r["charged"].as_u64()),
        (Some(debit), Some(0))
    );
    assert_eq!(rejects(&refused), 0);
}
