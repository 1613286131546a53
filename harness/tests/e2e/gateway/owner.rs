//! Wasm: where the elected owner runs, and another taking over when it dies under load.
//!
//! No bootstrap extension runs (the template has none): the pickers' VMs elect the one that
//! scrapes and owns the picker state.
//!
//! Placement: with one Envoy worker the worker's own VM ends up owning (its picks are
//! answered there, with no queue message); with four, nothing is claimed.
//!
//! Failover, at four workers: clients keep multi-turn conversations going while a request
//! carrying the test build's trap header kills the owner's VM (the header traps only on the
//! VM holding the lease; Envoy's `FAIL_RELOAD` starts a fresh VM on that worker). The test
//! holds:
//!
//! - another VM takes the lease over: one more takeover, within a second of the death;
//! - no conversation request fails, none waits as long as a second and a half (an answer
//!   the dead owner never gave is asked of the new one, not left to Envoy's timeouts);
//! - after the load, the in-flight gauges read zero within a few ticks (the dead owner's
//!   counts died with it; the new owner writes its own).

use std::time::{Duration, Instant};

use infergate_harness::launch::client::post_json;
use infergate_harness::launch::{Flavor, PoolSpec, Stack};
use serde_json::json;

use crate::owner_trap::{has_test_stages, TRAP_HEADER};
use crate::support::gw::{self, Plan};
use crate::support::{TestBackend, QUICK};

const MODEL: &str = "model-a";
const WORKERS: u32 = 4;
const CLIENTS: usize = 4;

async fn stat_sum(stack: &Stack, needle: &str) -> i64 {
    let stats = stack.envoy().stats().await.unwrap();
    stats.containing(needle).map(|(_, v)| v).sum()
}

pub(super) async fn a_dead_owner_is_replaced_under_load_and_no_request_fails() {
    if !has_test_stages() {
        eprintln!(
            "SKIPPED: the wasm module was built without its test stages (cargo xtask test \
             builds them into target/wasm32-wasip1/test-artefact/)"
        );
        return;
    }
    let backends = TestBackend::many(4, QUICK).await;
    let mut plan = Plan::new(vec![PoolSpec::all(MODEL)]);
    plan.concurrency = WORKERS;
    let Some(stack) = gw::start(Flavor::Wasm, &backends, plan).await else {
        return;
    };
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    // The owner exists once a request was picked by it.
    let warm = post_json(
        &url,
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "warm"}]}),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(warm.status, 200);
    assert_eq!(
        stat_sum(&stack, "infergate.owner.takeovers").await,
        1,
        "one owner"
    );

    let (clients, results) =
        crate::conversations::converse(&url, MODEL, CLIENTS, Duration::from_secs(4));
    tokio::time::sleep(Duration::from_millis(800)).await;
    // Kill the owner: a request carrying the trap header asks it (through shared data) to
    // trap at its next tick, whichever thread its VM runs on.
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "die"}]});
    let asked = post_json(&url, &body, &[(TRAP_HEADER, "1")]).await.unwrap();
    assert_eq!(asked.status, 200, "the asking request itself is served");
    let killed_at = Some(Instant::now());
    let Some(killed_at) = killed_at else {
        let log = std::fs::read_to_string(stack.envoy().log_path()).unwrap_or_default();
        let wasm: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("wasm log"))
            .take(40)
            .collect();
        panic!(
            "no request reached the owner's VM and trapped it; envoy's wasm log:\n{}",
            wasm.join("\n")
        );
    };
    let mut taken_over = None;
    while killed_at.elapsed() < Duration::from_secs(3) {
        if stat_sum(&stack, "infergate.owner.takeovers").await >= 2 {
            taken_over = Some(killed_at.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for c in clients {
        c.await.unwrap();
    }
    let taken_over = taken_over.expect("another VM took the owner's lease over");
    let results = results.lock().unwrap().clone();
    let failed: Vec<_> = results.iter().filter(|(s, _, _)| *s != 200).collect();
    let slowest = results.iter().map(|(_, d, _)| *d).max().unwrap_or_default();
    let fallbacks = stat_sum(&stack, "infergate.picker.owner_fallbacks").await;
    let resends = stat_sum(&stack, "infergate.picker.owner_resends").await;
    eprintln!(
        "OWNER FAILOVER wasm {WORKERS} workers: takeover {taken_over:?} after the death; \
         {} requests under load, {} failed, slowest {slowest:?}; {resends} picks resent to \
         the new owner, {fallbacks} picked locally",
        results.len(),
        failed.len()
    );
    assert!(
        taken_over <= Duration::from_secs(1),
        "takeover after {taken_over:?}"
    );
    assert!(failed.is_empty(), "failed under failover: {failed:?}");
    assert!(
        slowest < Duration::from_millis(1500),
        "a request took {slowest:?}"
    );
    // The gauges read the truth again within a few ticks of the load's end.
    let mut inflight = -1;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        inflight = stat_sum(&stack, "infergate.picker.inflight_requests").await;
        if inflight == 0 {
            break;
        }
    }
    assert_eq!(inflight, 0, "in-flight gauges after the load");
}

/// Wasm: where the owner's work runs. With one Envoy worker, that worker's VM ends up
/// holding the lease (it claims it from the idle main-thread VM once it serves requests, or
/// it won the first election) and every pick is answered in its own VM, with no queue
/// message; with four workers, nothing is claimed. No pick falls back to a
/// worker's own state either way.
pub(super) async fn the_owner_works_where_the_picks_are() {
    const PICKS: i64 = 20;
    for workers in [1, WORKERS] {
        let backends = TestBackend::many(2, QUICK).await;
        let mut plan = Plan::new(vec![PoolSpec::all(MODEL)]);
        plan.concurrency = workers;
        let Some(stack) = gw::start(Flavor::Wasm, &backends, plan).await else {
            return;
        };
        let url = format!("{}/v1/chat/completions", stack.picker_url());
        let warm = post_json(&url, &one_message("warm"), &[]).await.unwrap();
        assert_eq!(warm.status, 200);
        // The roster learns that the worker serves, and the lease moves: a few ticks.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let before = stat_sum(&stack, "infergate.owner.local_messages").await;
        for i in 0..PICKS {
            let resp = post_json(&url, &one_message(&format!("turn {i}")), &[])
                .await
                .unwrap();
            assert_eq!(resp.status, 200, "{workers} worker(s): request {i}");
        }
        // The owner counts its local messages at its tick.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let local = stat_sum(&stack, "infergate.owner.local_messages").await - before;
        let claims = stat_sum(&stack, "infergate.owner.claims").await;
        let takeovers = stat_sum(&stack, "infergate.owner.takeovers").await;
        let fallbacks = stat_sum(&stack, "infergate.picker.owner_fallbacks").await;
        eprintln!(
            "OWNER PLACEMENT wasm {workers} worker(s): {claims} claim(s), {takeovers} \
             takeover(s); {local} of the owner's messages for {PICKS} picks taken in its own VM; \
             {fallbacks} fallbacks"
        );
        assert_eq!(fallbacks, 0, "{workers} worker(s): picks fell back");
        if workers == 1 {
            assert!(
                local >= PICKS,
                "one worker: its picks went to the owner by message ({local} local)"
            );
            assert!(
                claims <= 1,
                "one worker: the lease was claimed {claims} times"
            );
        } else {
            assert_eq!(claims, 0, "{workers} workers: the lease was claimed");
        }
    }
}

/// A one-message chat request for the test's model.
fn one_message(content: &str) -> serde_json::Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": content}]})
}
