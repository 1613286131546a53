//! What tenancy costs one request in our own code, through the pipeline driver on the fake
//! host: the router's stages with tenants (`auth → route → quota → usage`) against the
//! router without them (`route` alone), on the same ~8k-token chat body.
//!
//! One iteration is one whole request: request headers and body (with tenants: the API
//! key hashed and looked up, the trust boundary, the fairness id and objective injected,
//! the tenant × model buckets pre-debited, usage reporting forced into the streamed body),
//! the response headers, every response chunk (with tenants: usage read from each and the
//! usage the client did not ask for cut out), then the end (with tenants: the buckets
//! settled, the token counters and the billing record written). The engine answers what
//! it was asked for: with tenants usage on every chunk and a usage-only chunk, without
//! them no usage at all.
//!
//! `auth_quota_only_json` runs `auth → route → quota` without the usage stage: the request
//! side's tenancy (and the record's settlement) on its own. `force_usage_8k_token_body`
//! times the body rewrite alone, the largest part of the
//! streamed request's difference.
//!
//! The tenants are the platform's own objects (`testdata/tenants/all.yaml`) with limits no
//! bench rate reaches, and the key is tenant A's test key (`testdata/README.md`), as in
//! `bench overhead`'s tenancy arms.

use std::sync::Arc;

use criterion::{Criterion, Throughput};
use infergate_filters::fake::FakeHost;
use infergate_filters::pipeline::{Pipeline, Run, Stage};
use infergate_filters::quotas::MemoryQuotas;
use infergate_filters::router::Router;
use infergate_filters::stages::usage::force_usage;
use infergate_filters::stages::{AuthStage, QuotaStage, RouteStage, Tenancy, UsageStage};
use infergate_filters::tenants::Tenants;
use infergate_filters::FilterStatus;
use serde_json::{json, Value};

/// Tenant A's test API key (its sha256 is in `testdata/tenants/all.yaml`).
const API_KEY: &str = "sk-infergate-test-tenant-a";

/// Content chunks of every streamed answer.
const CHUNKS: u32 = 20;

/// The model every request names: none of the tenants' limits names it, so tenant A's
/// `"*"` fallback entry applies, as for the overhead bench's model.
const MODEL: &str = "llama";

/// The testdata tenants, every limit raised far beyond any bench rate (so no request is
/// ever refused and every bucket is still checked and debited).
fn tenants() -> Result<Tenants, String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tenants/all.yaml");
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let mut objects = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(doc).map_err(|e| e.to_string())?;
        objects.push(value);
    }
    for object in &mut objects {
        if let Some(limits) = object
            .pointer_mut("/spec/limits")
            .and_then(Value::as_array_mut)
        {
            for limit in limits {
                limit["rpm"] = json!(1_000_000_000u64);
                limit["tpm"] = json!(1_000_000_000_000u64);
                limit["concurrency"] = json!(1_000_000u64);
            }
        }
    }
    Tenants::from_objects(&objects).map_err(|e| e.to_string())
}

fn router() -> Result<Router, String> {
    Router::from_json(json!({"pools": [{"name": "p", "baseModel": MODEL}]}))
        .map_err(|e| e.to_string())
}

/// Which stages run around the body router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stages {
    /// The router filter as the builder assembles it without tenants: `route`.
    Without,
    /// `auth → route → quota`: the request side's tenancy, without reading usage (the
    /// record then bills nothing; the JSON comparison only).
    AuthQuota,
    /// The tenancy stages around the router: `auth → route → quota → usage` (the builder
    /// also runs `priority-band` after `auth`, which only sets a response header).
    Tenancy,
}

impl Stages {
    fn name(self) -> &'static str {
        match self {
            Stages::Without => "without_tenancy",
            Stages::AuthQuota => "auth_quota_only",
            Stages::Tenancy => "with_tenancy",
        }
    }
}

/// The router filter's pipeline with `stages`.
fn pipeline(stages: Stages) -> Result<Pipeline<FakeHost>, String> {
    let route = Box::new(RouteStage::new(Arc::new(router()?)));
    if stages == Stages::Without {
        return Ok(Pipeline::new(vec![route]));
    }
    let tenancy = Tenancy::new(tenants()?, Arc::new(MemoryQuotas::default()));
    let mut all: Vec<Box<dyn Stage<FakeHost>>> = vec![
        Box::new(AuthStage::new(Arc::clone(&tenancy))),
        route,
        Box::new(QuotaStage::new(tenancy)),
    ];
    if stages == Stages::Tenancy {
        all.push(Box::new(UsageStage));
    }
    Ok(Pipeline::new(all))
}

/// An ~8k-token (32 KiB) chat body, streamed or not, asking for `CHUNKS` tokens.
fn body(stream: bool) -> Vec<u8> {
    let system = "You are a careful assistant who answers briefly. ".repeat(620);
    json!({
        "model": MODEL,
        "stream": stream,
        "max_tokens": CHUNKS,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "question number 1"}
        ]
    })
    .to_string()
    .into_bytes()
}

/// The engine's answer, one element per response chunk: `CHUNKS` content chunks (each with
/// its running usage when `usage`), then the usage-only chunk (when `usage`) and `[DONE]`.
fn engine_stream(prompt_tokens: u32, usage: bool) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let usage_of = |completion: u32| {
        format!(
            r#""usage":{{"prompt_tokens":{prompt_tokens},"total_tokens":{},"completion_tokens":{completion}}}"#,
            prompt_tokens + completion
        )
    };
    for i in 1..=CHUNKS {
        let running = if usage {
            format!(",{}", usage_of(i))
        } else {
            String::new()
        };
        out.push(
            format!(
                "data: {{\"id\":\"chatcmpl-b\",\"object\":\"chat.completion.chunk\",\"created\":0,\
                 \"model\":\"{MODEL}\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}},\
                 \"logprobs\":null,\"finish_reason\":null}}]{running}}}\n\n"
            )
            .into_bytes(),
        );
    }
    if usage {
        out.push(
            format!(
                "data: {{\"id\":\"chatcmpl-b\",\"object\":\"chat.completion.chunk\",\"created\":0,\
                 \"model\":\"{MODEL}\",\"choices\":[],{}}}\n\n",
                usage_of(CHUNKS)
            )
            .into_bytes(),
        );
    }
    out.push(b"data: [DONE]\n\n".to_vec());
    out
}

/// The engine's non-streamed answer.
fn engine_json(prompt_tokens: u32) -> Vec<u8> {
    json!({
        "id": "chatcmpl-b", "object": "chat.completion", "created": 0, "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": CHUNKS,
                  "total_tokens": prompt_tokens + CHUNKS,
                  "prompt_tokens_details": {"cached_tokens": 0}}
    })
    .to_string()
    .into_bytes()
}

/// One request end to end; the host afterwards, for the sanity check, and what the client
/// received appended to `client` when given.
fn one_request(
    p: &Pipeline<FakeHost>,
    body: &[u8],
    response: &[Vec<u8>],
    sse: bool,
    mut client: Option<&mut Vec<u8>>,
) -> FakeHost {
    let mut host = FakeHost::new()
        .post("/v1/chat/completions", body)
        .request_header("authorization", &format!("Bearer {API_KEY}"))
        .now(1_000);
    let mut run = Run::new();
    let mut status = run.request_headers(p, &mut host, false);
    if status == FilterStatus::Pause {
        let len = host.body.len();
        status = run.request_body(p, &mut host, len, true);
    }
    if status == FilterStatus::Continue {
        let content_type = if sse {
            "text/event-stream"
        } else {
            "application/json"
        };
        host.response_headers = vec![
            (":status".into(), "200".into()),
            ("content-type".into(), content_type.into()),
        ];
        run.response_headers(p, &mut host, false);
        for (i, chunk) in response.iter().enumerate() {
            host.now.0 += 1;
            host.response_chunk.clone_from(chunk);
            run.response_chunk(p, &mut host, i + 1 == response.len());
            if let Some(client) = client.as_deref_mut() {
                client.extend_from_slice(&host.response_chunk);
            }
        }
    }
    run.end(p, &mut host);
    host
}

/// Checks that a run did what the bench claims to measure: admitted (with tenants: the
/// quota stage's headers on the response, one billing record), and with the usage stage
/// forced usage upstream, kept it from the client and billed the engine's usage.
fn check(
    host: &FakeHost,
    client: &[u8],
    stages: Stages,
    stream: bool,
    prompt_tokens: u32,
) -> Result<(), String> {
    if !host.replies.is_empty() {
        return Err(format!(
            "the request was answered locally: {:?}",
            host.replies
        ));
    }
    let quota_headers = host
        .response_headers
        .iter()
        .any(|(name, _)| name == "x-ratelimit-limit-requests");
    if quota_headers != (stages != Stages::Without) {
        return Err(format!(
            "x-ratelimit headers: {quota_headers}, stages: {stages:?}"
        ));
    }
    if stages == Stages::AuthQuota {
        return match host.usage_records.as_slice() {
            [record] if record.contains("\"outcome\":\"complete\"") => Ok(()),
            records => Err(format!("records {records:?}, expected one, complete")),
        };
    }
    if stages == Stages::Without {
        return if host.usage_records.is_empty() {
            Ok(())
        } else {
            Err("a billing record without tenants".into())
        };
    }
    let [record] = host.usage_records.as_slice() else {
        return Err(format!(
            "{} billing records, not 1",
            host.usage_records.len()
        ));
    };
    let record: Value = serde_json::from_str(record).map_err(|e| e.to_string())?;
    let expected = (u64::from(prompt_tokens), u64::from(CHUNKS), "complete");
    let got = (
        record["prompt_tokens"].as_u64().unwrap_or(0),
        record["completion_tokens"].as_u64().unwrap_or(0),
        record["outcome"].as_str().unwrap_or(""),
    );
    if got != expected {
        return Err(format!("billed {got:?}, expected {expected:?}: {record}"));
    }
    let forced = String::from_utf8_lossy(&host.body).contains("\"include_usage\":true");
    if forced != stream {
        return Err(format!(
            "usage forced upstream: {forced}, streamed: {stream}"
        ));
    }
    if stream && String::from_utf8_lossy(client).contains("usage") {
        return Err("the client received usage it did not ask for".into());
    }
    Ok(())
}

/// The tenancy benches, in the `filters` group's binary.
pub fn bench(c: &mut Criterion) {
    if let Err(e) = run(c) {
        eprintln!("tenancy bench: {e}");
        std::process::exit(1);
    }
}

fn run(c: &mut Criterion) -> Result<(), String> {
    let with = pipeline(Stages::Tenancy)?;
    let request_side = pipeline(Stages::AuthQuota)?;
    let without = pipeline(Stages::Without)?;
    let mut group = c.benchmark_group("tenancy");
    group.throughput(Throughput::Elements(1));
    for stream in [true, false] {
        let body = body(stream);
        let prompt_tokens = u32::try_from(body.len() / 4).unwrap_or(u32::MAX);
        let mut variants = vec![(Stages::Tenancy, &with), (Stages::Without, &without)];
        if !stream {
            variants.insert(1, (Stages::AuthQuota, &request_side));
        }
        for (stages, p) in variants {
            let response = if stream {
                engine_stream(prompt_tokens, stages == Stages::Tenancy)
            } else {
                vec![engine_json(prompt_tokens)]
            };
            let mut client = Vec::new();
            let host = one_request(p, &body, &response, stream, Some(&mut client));
            check(&host, &client, stages, stream, prompt_tokens)?;
            let name = format!(
                "{}_{}",
                stages.name(),
                if stream { "stream_20_chunks" } else { "json" }
            );
            group.bench_function(name, |b| {
                b.iter(|| one_request(p, &body, &response, stream, None))
            });
        }
    }
    // The part of the streamed request's difference that rewrites the body upstream.
    let streamed = body(true);
    group.bench_function("force_usage_8k_token_body", |b| {
        b.iter(|| force_usage(&streamed))
    });
    group.finish();
    Ok(())
}
