//! A conversation keeps its replica whichever Envoy worker takes each turn. Envoy runs four
//! workers here (pinned: workers are the subject) and every turn is a new TCP connection,
//! which the kernel hands to any worker; every turn after the first must land on the
//! replica that served the first, because the picker's prefix index and load are one per
//! Envoy process, not one per worker.

use super::{served_by, tag};
use crate::support::gw::{self, Plan};
use crate::support::{TestBackend, QUICK};
use infergate_harness::launch::{Flavor, PoolSpec, Stack};
use serde_json::{json, Value};
use std::collections::BTreeMap;

const MODEL: &str = "model-a";

/// Envoy workers: more than the two the suite usually runs, so most turns change worker.
const WORKERS: u32 = 4;

/// Replicas: with four, a turn sent without regard to its prefix misses three times in four.
const REPLICAS: usize = 4;

const CONVERSATIONS: usize = 8;

const TURNS: usize = 5;

/// Client connections each Envoy worker has accepted on the gateway's listener.
async fn connections_per_worker(stack: &Stack) -> Vec<i64> {
    let stats = stack.envoy().stats().await.unwrap();
    (0..WORKERS)
        .map(|w| {
            stats
                .containing(&format!(".worker_{w}.downstream_cx_total"))
                .filter(|(k, _)| k.starts_with("listener.127.0.0.1_"))
                .map(|(_, v)| v)
                .sum()
        })
        .collect()
}

/// The opening of conversation `id`: a system prompt of several prefix blocks, unique
/// from its first bytes.
fn opening(id: usize) -> Vec<Value> {
    let system = format!(
        "conversation {id} across workers. {}",
        "Answer as a patient teacher would, one step at a time. ".repeat(50)
    );
    vec![json!({"role": "system", "content": system})]
}

pub(super) async fn every_turn_follows_the_first_across_four_workers(flavor: Flavor) {
    let backends = TestBackend::many(REPLICAS, QUICK).await;
    let mut plan = Plan::new(vec![PoolSpec::all(MODEL)]);
    plan.concurrency = WORKERS;
    let Some(stack) = gw::start(flavor, &backends, plan).await else {
        return;
    };
    let before = connections_per_worker(&stack).await;
    let mut history: Vec<Vec<Value>> = (0..CONVERSATIONS).map(opening).collect();
    let mut first = Vec::with_capacity(CONVERSATIONS);
    // (conversation, turn, first turn's replica, this turn's replica)
    let mut strayed = Vec::new();
    // Turn by turn across every conversation, so no turn just follows its own previous one.
    for turn in 0..TURNS {
        for (id, messages) in history.iter_mut().enumerate() {
            messages.push(json!({"role": "user", "content": format!("turn {turn} of {id}")}));
            let body = json!({"model": MODEL, "messages": messages});
            let (replica, _) = served_by(&stack, &body, &[]).await;
            messages.push(json!({"role": "assistant", "content": "ok"}));
            match first.get(id) {
                None => first.push(replica),
                Some(&f) if f != replica => strayed.push((id, turn, f, replica)),
                Some(_) => {}
            }
        }
    }
    let after = connections_per_worker(&stack).await;
    let per_worker: Vec<i64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let mut first_turns = BTreeMap::<usize, usize>::new();
    for &f in &first {
        *first_turns.entry(f).or_default() += 1;
    }
    eprintln!(
        "ACROSS {WORKERS} WORKERS {}: {} of {} later turns left their first turn's replica; \
         connections per worker {per_worker:?}; first turns per replica {first_turns:?}",
        tag(flavor),
        strayed.len(),
        CONVERSATIONS * (TURNS - 1)
    );
    // Every worker took turns, or the question across workers was never asked.
    assert!(
        per_worker.iter().filter(|&&n| n > 0).count() == WORKERS as usize,
        "{}: connections per worker {per_worker:?}",
        tag(flavor)
    );
    // First turns spread: a pool that sends everything to one replica would pass trivially.
    assert!(
        first_turns.len() >= 2,
        "{}: every first turn on one replica: {first_turns:?}",
        tag(flavor)
    );
    // Wasm: every pick was made by the one owner the worker VMs elected (no bootstrap
    // singleton here), none in a worker's own state.
    let stats = stack.envoy().stats().await.unwrap();
    let fallbacks: i64 = stats
        .containing("infergate.picker.owner_fallbacks")
        .map(|(_, v)| v)
        .sum();
    assert_eq!(
        fallbacks,
        0,
        "{}: picks made without the owner",
        tag(flavor)
    );
    if flavor == Flavor::Wasm {
        // Router and picker in VMs of their own on every thread (the main thread's and each
        // worker's), as Istio's WasmPlugins get: they meet only in shared data and queues.
        let vms = stats.value("wasm.envoy.wasm.runtime.v8.active");
        assert!(
            vms >= 2 * (i64::from(WORKERS) + 1),
            "wasm: {vms} active VMs for 2 plugins on {WORKERS} workers and the main thread"
        );
    }
    assert!(
        strayed.is_empty(),
        "{}: turns away from their conversation's first replica \
         (conversation, turn, first, this): {strayed:?}",
        tag(flavor)
    );
}
