//! The gateway suite: every test body here takes a [`Flavor`] and runs once per gateway
//! flavour (`gateway::wasm::…`, `gateway::native::…`), so both builds are held to exactly
//! the same behaviour (one suite, passing unchanged for both). Add a body, then add its
//! name to the `for_each_flavour!` list (a module with a list of its own calls the macro
//! itself, making `gateway::<module>::wasm::…` and `…::native::…`); bodies that only make
//! sense for one build (panic injection exists only in the native test build) go in
//! `native_only`, and a body the Wasm build does not pass yet goes in `wasm_ignored` with
//! the reason (its Wasm test is generated `#[ignore]`d, its native test runs).
//!
//! Each body starts its own stack (Envoy over the in-test backends of `support`) and
//! checks several related behaviours on it, so a flavour costs a handful of Envoy starts.
//! Unless a body is about Envoy's worker threads, stacks run the suite's worker count
//! (`support::workers`: `INFERGATE_E2E_WORKERS`, 2 by default), so the suite can be run
//! at any count and state one worker keeps to itself shows.
//!
//! - [`routing`]: model and adapter routing, client-sent steering headers, the `envoy.lb`
//!   metadata, the `/rr` baseline, stats per decision and endpoint;
//! - [`errors`]: 400 / 413 / 404 / 503 answers (empty pool, dead pool, stale metrics under
//!   `FailClose` and `FailOpen`), all OpenAI error JSON;
//! - [`scheduling`]: the KV threshold, turn-2 affinity with load spread, across workers;
//! - [`simulated`]: the KV threshold again, over the engine simulator (its `/metrics`,
//!   its block accounting);
//! - [`workers`]: every turn of a conversation lands on its first turn's replica, with
//!   four Envoy workers and each turn on a new connection;
//! - [`streaming`]: responses stream through unbuffered;
//! - [`latency`]: a replica slowed down loses the affinity filter's sticky set on the TTFT
//!   the gateway measured and wins it back once restored, at 1 and 4 workers, over the
//!   simulator;
//! - [`panics`]: a panic inside the native module fails one request, Envoy keeps serving;
//! - [`tenants`]: API keys and JWTs, quotas (RPM, TPM, concurrency at 1 and 4 workers), usage
//!   accounting and the billing log, output multiplicity (`n`, completions batches) in the
//!   pre-debit and the router's cap at 1 and 4 workers, over the simulator;
//! - [`flow`]: flow control with the pool saturated: dispatch by band then by flow, a full
//!   band, a TTL, a client that leaves while queued, weighted and round-robin shares, and
//!   nothing queued below saturation;
//! - [`eviction`]: a blocked request evicts sheddable ones, at 1 and 4 workers: 429
//!   `evicted-by-priority` before the response started, a reset stream after, both billed;
//! - [`faults`]: the fault suite: hostile headers and bodies (HTTP/1.1 and HTTP/2),
//!   failing engines, aborted and held streams; Envoy keeps serving, nothing stays in flight.

/// Generates `mod wasm` and `mod native` in the module it is called in, each with one
/// `#[tokio::test]` per body of the first list; `native_only:` bodies are generated in
/// `mod native` alone; `wasm_ignored:` bodies (`name = "reason"`) in both, the Wasm one
/// ignored for that reason. A plain list (no `;` sections) is every body in both. Defined
/// before the `mod` lines so that every suite module below can call it.
macro_rules! for_each_flavour {
    ($($test:ident),* $(,)? ;
     native_only: $($native:ident),* $(,)? ;
     wasm_ignored: $($ignored:ident = $why:literal),* $(,)?) => {
        mod wasm {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(infergate_harness::launch::Flavor::Wasm).await
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = $why]
                async fn $ignored() {
                    super::$ignored(infergate_harness::launch::Flavor::Wasm).await
                }
            )*
        }
        mod native {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(infergate_harness::launch::Flavor::Native).await
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $ignored() {
                    super::$ignored(infergate_harness::launch::Flavor::Native).await
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $native() {
                    super::$native(infergate_harness::launch::Flavor::Native).await
                }
            )*
        }
    };
    ($($test:ident),* $(,)?) => {
        for_each_flavour!($($test),*; native_only: ; wasm_ignored:);
    };
}

mod capabilities;
mod clusters;
mod disagg;
mod errors;
mod eviction;
mod faults;
mod flow;
mod global_quotas;
mod latency;
mod lora;
mod membership;
mod owner;
mod panics;
mod pools;
mod precise;
mod replicas;
mod rewrite;
mod routing;
mod scheduling;
mod simulated;
mod streaming;
mod tenants;
mod workers;

use errors::error_answers_are_openai_json;
use faults::{
    aborted_and_held_streams_leave_nothing_in_flight,
    failing_engines_are_avoided_and_envoy_keeps_serving,
    hostile_requests_are_answered_and_envoy_keeps_serving,
};
use infergate_harness::launch::client::{post_json, HttpResponse};
use infergate_harness::launch::{Flavor, Stack};
use latency::{
    a_slowed_replica_loses_the_sticky_set_at_four_workers,
    a_slowed_replica_loses_the_sticky_set_at_one_worker,
};
use panics::a_panic_fails_one_request_and_envoy_keeps_serving;
use routing::routes_by_model_and_adapter_and_ignores_client_steering;
use scheduling::{
    a_replica_over_the_kv_threshold_gets_no_new_requests, turn_two_follows_turn_one_across_workers,
    turn_two_follows_turn_one_while_load_spreads,
};
use serde_json::json;
use simulated::simulated_kv_pressure_keeps_new_requests_off_a_full_replica;
use streaming::streams_through_the_picker_are_not_buffered;
use tenants::{
    a_tenants_concurrency_holds_across_workers, output_multiplicity_is_debited_and_capped,
    tenants_are_authenticated_limited_and_billed,
};
use workers::every_turn_follows_the_first_across_four_workers;

for_each_flavour!(
    routes_by_model_and_adapter_and_ignores_client_steering,
    error_answers_are_openai_json,
    a_replica_over_the_kv_threshold_gets_no_new_requests,
    turn_two_follows_turn_one_while_load_spreads,
    turn_two_follows_turn_one_across_workers,
    simulated_kv_pressure_keeps_new_requests_off_a_full_replica,
    streams_through_the_picker_are_not_buffered,
    hostile_requests_are_answered_and_envoy_keeps_serving,
    failing_engines_are_avoided_and_envoy_keeps_serving,
    aborted_and_held_streams_leave_nothing_in_flight,
    every_turn_follows_the_first_across_four_workers,
    tenants_are_authenticated_limited_and_billed,
    a_tenants_concurrency_holds_across_workers,
    output_multiplicity_is_debited_and_capped,
    a_slowed_replica_loses_the_sticky_set_at_one_worker,
    a_slowed_replica_loses_the_sticky_set_at_four_workers;
    native_only: a_panic_fails_one_request_and_envoy_keeps_serving;
    wasm_ignored:
);

/// Wasm only: the elected owner's VM dies under load (the native flavour has no owner: its
/// state is the process's memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasm_a_dead_owner_is_replaced_under_load_and_no_request_fails() {
    owner::a_dead_owner_is_replaced_under_load_and_no_request_fails().await;
}

/// Wasm only: with one worker the owner's work runs in that worker's VM and its picks need
/// no message; with four, the lease stays where it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasm_the_owner_works_where_the_picks_are() {
    owner::the_owner_works_where_the_picks_are().await;
}

/// A one-message chat request for `model`.
fn chat(model: &str, content: &str) -> serde_json::Value {
    json!({"model": model, "messages": [{"role": "user", "content": content}]})
}

/// Posts `body` to the gateway's chat endpoint with extra `headers`.
async fn post_chat(
    stack: &Stack,
    body: &serde_json::Value,
    headers: &[(&str, &str)],
) -> HttpResponse {
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    post_json(&url, body, headers).await.unwrap()
}

/// Posts `body` through the gateway, asserts 200 and returns the index of the test backend
/// that answered (`b<i>`), with the headers that backend received.
async fn served_by(
    stack: &Stack,
    body: &serde_json::Value,
    headers: &[(&str, &str)],
) -> (usize, serde_json::Value) {
    let resp = post_chat(stack, body, headers).await;
    answered_by(stack, &resp)
}

/// Asserts `resp` (from `stack`) is a 200 and returns the index of the test backend that
/// answered it (`b<i>`), with the headers that backend received.
fn answered_by(stack: &Stack, resp: &HttpResponse) -> (usize, serde_json::Value) {
    assert_eq!(
        resp.status,
        200,
        "{}\n--- envoy log:\n{}",
        resp.text(),
        stack.envoy().log_tail(20)
    );
    let json = resp.json().unwrap();
    let name = json["backend"].as_str().unwrap_or_default();
    let index = name
        .strip_prefix('b')
        .and_then(|i| i.parse().ok())
        .unwrap_or_else(|| panic!("not answered by a test backend: {json}"));
    (index, json["headers"].clone())
}

/// The Envoy stat-name form of an endpoint label (`127.0.0.1:8000` → `127_0_0_1_8000`).
fn endpoint_label(addr: &std::net::SocketAddr) -> String {
    addr.to_string().replace(['.', ':'], "_")
}

/// Which flavour a message is about (keeps assertion texts short).
/// The gateway's default scheduling config without `rendezvous-placement-scorer`: for
/// tests about something else (membership, fallbacks) whose scripted load and scores would
/// otherwise be outvoted by where placement sends a prompt.
fn epp_config_without_placement() -> serde_json::Value {
    const PLACEMENT: &str = "rendezvous-placement-scorer";
    let mut cfg = infergate_filters::picker::config::default_epp_config();
    if let Some(plugins) = cfg["plugins"].as_array_mut() {
        plugins.retain(|p| p["type"] != PLACEMENT);
    }
    if let Some(refs) = cfg["schedulingProfiles"][0]["plugins"].as_array_mut() {
        refs.retain(|r| r["pluginRef"] != PLACEMENT);
    }
    cfg
}

fn tag(flavor: Flavor) -> &'static str {
    flavor.name()
}
