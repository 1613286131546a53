//! Per-request cost of the filters on the fake host, with realistic prompt sizes: the body
//! router and the picker (parse, prefix hashing, scheduling over 8 endpoints, bookkeeping)
//! on an ~8k-token chat body (also with two peer clusters that take nothing), and the two in sequence on one stream, with the router's
//! handoff (the picker takes the parse and hashes from stream state) and without it (the
//! picker buffers and parses again). The `tenancy` group ([`tenancy`]) is one request
//! through the router filter's pipeline with tenants and without. Run: `cargo bench -p
//! infergate-filters --features fake-host`. The `precise_keys` group ([`precise`]) is the
//! precise index's tokenizing and keying against the approximate parse and hashing. The
//! `owner` group ([`owner`]) is the Wasm state owner's work per request.

mod owner;
mod precise;
mod tenancy;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use infergate_filters::fake::FakeHost;
use infergate_filters::handoff::HANDOFF_KEY;
use std::sync::Arc;

use infergate_filters::picker::PickerShared;
use infergate_filters::pipeline::{Pipeline, Run};
use infergate_filters::router::Router;
use infergate_filters::stages::{PickStage, RouteStage};
use scheduler_core::metrics::EndpointMetrics;
use scheduler_core::snapshot::{encode, EndpointSample, Snapshot};
use scheduler_core::types::Millis;
use serde_json::json;

const NOW: u64 = 1_000_000;

fn endpoints() -> Vec<String> {
    (1..=8).map(|i| format!("10.0.0.{i}:8000")).collect()
}

/// Two peer clusters' gateways (scraped, with room).
const PEERS: [&str; 2] = ["10.1.0.1:8080", "10.2.0.1:8080"];

fn snapshot_bytes() -> Vec<u8> {
    encode(&Snapshot {
        taken_at: Millis(NOW),
        clusters: Vec::new(),
        endpoints: endpoints()
            .into_iter()
            .chain(PEERS.iter().map(|p| (*p).to_owned()))
            .enumerate()
            .map(|(i, address)| EndpointSample {
                address,
                scraped_at: Millis(NOW),
                consecutive_failures: 0,
                metrics: Some(EndpointMetrics {
                    waiting: Some(i as u32),
                    running: Some(4),
                    kv_cache_usage: Some(0.1 * i as f64),
                    ..EndpointMetrics::default()
                }),
            })
            .collect(),
    })
}

/// An ~8k-token (32 KiB) chat body: a long shared system prompt plus a per-request turn.
fn body(i: usize) -> Vec<u8> {
    let system = "You are a careful assistant who answers briefly. ".repeat(620);
    json!({
        "model": "llama",
        "stream": true,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": format!("question number {i}")}
        ]
    })
    .to_string()
    .into_bytes()
}

fn bench(c: &mut Criterion) {
    let router = Router::from_json(json!({"pools": [{"name": "p", "baseModel": "llama"}]}));
    let shared = PickerShared::from_json(json!({
        "pool": "p", "baseModel": "llama", "endpoints": endpoints()
    }));
    let (Ok(router), Ok(shared)) = (router, shared) else {
        return;
    };
    let router: Pipeline<FakeHost> =
        Pipeline::new(vec![Box::new(RouteStage::new(Arc::new(router)))]);
    let picker: Pipeline<FakeHost> = Pipeline::new(vec![Box::new(PickStage::new(shared))]);
    let snap = snapshot_bytes();
    let sample = body(0);
    let mut group = c.benchmark_group("filters");
    group.throughput(Throughput::Bytes(sample.len() as u64));
    let mut i = 0usize;
    group.bench_function("router_8k_tokens", |b| {
        b.iter(|| {
            let mut host = FakeHost::new().post("/v1/chat/completions", &sample);
            let mut run = Run::new();
            run.request_headers(&router, &mut host, false);
            run.request_body(&router, &mut host, sample.len(), true)
        })
    });
    // The same pool with two peer clusters, every request served here (the pool has room):
    // the cost of the cluster-level step when nothing spills.
    let with_peers = PickerShared::from_json(json!({
        "pool": "p", "baseModel": "llama", "endpoints": endpoints(),
        "peers": {"cluster": "peers", "endpoints": PEERS}
    }));
    let Ok(with_peers) = with_peers else {
        return;
    };
    let with_peers: Pipeline<FakeHost> = Pipeline::new(vec![Box::new(PickStage::new(with_peers))]);
    for (name, picker) in [
        ("picker_8k_tokens_8_endpoints", &picker),
        ("picker_8k_tokens_8_endpoints_2_peers", &with_peers),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                i += 1;
                let mut host = FakeHost::new()
                    .request_header("x-gateway-base-model-name", "llama")
                    .post("/v1/chat/completions", &sample)
                    .now(NOW)
                    .snapshot(1, snap.clone());
                let mut run = Run::new();
                run.request_headers(picker, &mut host, false);
                let status = run.request_body(picker, &mut host, sample.len(), true);
                run.end(picker, &mut host);
                status
            })
        });
    }
    for (name, keep_handoff) in [
        ("router_then_picker_with_handoff", true),
        ("router_then_picker_without_handoff", false),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut host = FakeHost::new()
                    .post("/v1/chat/completions", &sample)
                    .now(NOW)
                    .snapshot(1, snap.clone());
                let mut r = Run::new();
                r.request_headers(&router, &mut host, false);
                r.request_body(&router, &mut host, sample.len(), true);
                if !keep_handoff {
                    host.stream_state.remove(HANDOFF_KEY);
                }
                let mut run = Run::new();
                let mut status = run.request_headers(&picker, &mut host, false);
                if status == infergate_filters::FilterStatus::Pause {
                    status = run.request_body(&picker, &mut host, sample.len(), true);
                }
                run.end(&picker, &mut host);
                status
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench, tenancy::bench, precise::bench, owner::bench);
criterion_main!(benches);
