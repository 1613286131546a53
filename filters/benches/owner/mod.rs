//! The Wasm state owner's work per request, in process: the ceiling of picks per second one
//! owner can make, before proxy-wasm's queues and the Wasm runtime add theirs.
//!
//! One iteration is what the owner does for one request of a busy worker: decode its
//! `Pick` (carrying the lease of the worker's previous request, given back on the way),
//! release that lease, pick over 8 scraped endpoints (prefix index, in-flight load,
//! placement) and encode the answer. The worker's encoding of the message is in the
//! iteration too (about a kilobyte: the ~8k-token prompt is 128 block hashes by then).
//! The prompt is the same every time, so the prefix index takes the warm path a
//! conversation's later turns take.

use criterion::{Criterion, Throughput};
use infergate_filters::fake::FakeHost;
use infergate_filters::picker::remote::{Owner, Released, StateKey, ToOwner, ToWorker};
use infergate_filters::picker::{PickerShared, PreparedPick};
use scheduler_core::request::Api;
use serde_json::json;

use super::{body, endpoints, snapshot_bytes, NOW};

pub fn bench(c: &mut Criterion) {
    let config = json!({"pool": "p", "baseModel": "llama", "endpoints": endpoints()});
    let config_bytes = config.to_string().into_bytes();
    let Ok(worker) = PickerShared::from_json(config) else {
        return;
    };
    let Some(plan) = worker.pool_plan("llama") else {
        return;
    };
    let Some(pool) = worker.pool_for_base_model("llama") else {
        return;
    };
    let sample = body(0);
    let mut host = FakeHost::new()
        .request_header("x-gateway-base-model-name", "llama")
        .post("/v1/chat/completions", &sample)
        .now(NOW)
        .snapshot(1, snapshot_bytes());
    let Ok(prepared) = PreparedPick::new(&plan, Api::ChatCompletions, &sample, &mut host) else {
        return;
    };
    let state = StateKey::of_config(&config_bytes);
    let mut owner = Owner::new();
    let hello = ToOwner::Hello {
        state,
        config: config_bytes,
    };
    if let Some(bytes) = hello.encode() {
        owner.handle(&mut host, &bytes);
    }
    // A busy worker's pick, giving back the lease of its previous request.
    let pick = |ticket: u64, previous: Option<u64>| ToOwner::Pick {
        state,
        reply_queue: 1,
        ticket,
        pool,
        prepared: prepared.clone(),
        releases: previous.map(Released::lease).into_iter().collect(),
        started: previous.into_iter().collect(),
    };
    let mut ticket = 0u64;
    // The owner must pick, not answer that it knows no such state: measure the real path.
    let answers = pick(ticket, None)
        .encode()
        .map(|bytes| owner.handle(&mut host, &bytes))
        .unwrap_or_default();
    let mut previous = match answers.as_slice() {
        [(_, ToWorker::Picked { lease, .. })] => Some(*lease),
        other => {
            eprintln!("owner bench skipped: the owner did not pick: {other:?}");
            return;
        }
    };
    let mut group = c.benchmark_group("owner");
    group.throughput(Throughput::Elements(1));
    group.bench_function("pick_8k_tokens_8_endpoints", |b| {
        b.iter(|| {
            ticket += 1;
            let Some(bytes) = pick(ticket, previous).encode() else {
                return 0;
            };
            let mut sent = 0;
            for (_, answer) in owner.handle(&mut host, &bytes) {
                if let ToWorker::Picked { lease, .. } = &answer {
                    previous = Some(*lease);
                }
                sent += answer.encode().len();
            }
            sent
        })
    });
    group.finish();
}
