//! Both flavours, at 1 and at 4 Envoy workers: flow control's eviction
//! (`enableEviction: true`) through a real Envoy, over the engine simulator.
//!
//! The pool admits 2 requests at a time and has a sheddable band (priority -1, the `batch`
//! tenant) under the default one. Two batch requests hold both slots: one streaming, one
//! not streamed whose prefill the simulator holds back (so its response has not started:
//! the headers of a streamed answer would have gone out at once). A standard
//! request then arrives: it is queued, and evicts the most recently admitted batch request,
//! whose client gets 429 `evicted-by-priority` at once, before any response byte. The next
//! standard request evicts the streaming one: its stream is cut off (no `[DONE]`), and its
//! billing record charges what the engine generated. Both standard requests are served.
//! With several workers the requests have connections of their own, so the eviction
//! reaches a request on another worker (native: its stream's scheduler; Wasm: the state
//! owner's message to the holder's worker).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::flow::{
    band, counted, epp_config, outcome, rig_at, short, Rig, BATCH, PATIENCE, STANDARD,
};
use infergate_harness::launch::stats::Stats;
use infergate_harness::launch::Flavor;
use infergate_harness::sim::Slowdown;

for_each_flavour!(
    a_blocked_request_evicts_sheddable_ones_at_one_worker,
    a_blocked_request_evicts_sheddable_ones_at_four_workers,
);

/// The prefill delay that keeps the waiting batch request's response from starting.
const HELD_PREFILL_MS: u64 = 4_000;

async fn a_blocked_request_evicts_sheddable_ones_at_one_worker(flavor: Flavor) {
    evicts(flavor, 1).await;
}

async fn a_blocked_request_evicts_sheddable_ones_at_four_workers(flavor: Flavor) {
    evicts(flavor, 4).await;
}

/// Evictions counted for `when` (`before_response` or `responding`), any band and flow.
fn evictions(stats: &Stats, when: &str) -> i64 {
    counted(stats, "evictions", ("when", when))
}

fn config() -> Value {
    let rr = "round-robin-fairness-policy";
    let mut epp = epp_config(2, "60s", vec![band(0, 50, rr), band(-1, 50, rr)], vec![]);
    epp["flowControl"]["enableEviction"] = json!(true);
    epp
}

async fn evicts(flavor: Flavor, workers: u32) {
    let tenants = [("tenant-batch", BATCH), ("tenant-std", STANDARD)];
    let Some(rig) = rig_at(flavor, "evict", config(), &tenants, workers).await else {
        return;
    };
    let t = rig.t();

    // Two batch requests fill the pool: one streaming, one held in its prefill.
    let streaming = rig.hold("tenant-batch", "batch-streaming").await;
    rig.sim
        .set_slowdown(0, Slowdown::new(1.0, HELD_PREFILL_MS as f64).unwrap())
        .await
        .unwrap();
    // Not streamed: an engine answers it whole, so nothing of its response passes before
    // the prefill is over (a streamed answer's headers go out at once).
    let body = json!({"model": "sim-model", "max_tokens": 16,
                      "messages": [{"role": "user", "content": "held batch request"}]});
    let held = rig.send("tenant-batch", "batch-held", body);
    wait_arrived(&rig, "batch-held").await;

    // A standard request is blocked: it evicts the latest batch request, which gets a 429
    // before its prefill is over; then it is served.
    let sent = Instant::now();
    let (std_1, held) = tokio::join!(rig.hold("tenant-std", "std-1"), outcome(held));
    assert_eq!(
        (held.status, held.reason.as_str()),
        (429, "evicted-by-priority"),
        "{t}: {held:?}\n{}",
        rig.context().await
    );
    assert!(
        held.elapsed < Duration::from_millis(HELD_PREFILL_MS) && held.body.contains("error"),
        "{t}: answered at once, as OpenAI error JSON: {held:?}"
    );
    rig.sim.set_slowdown(0, Slowdown::NONE).await.unwrap();
    eprintln!(
        "{t}: batch-held evicted, std-1 streaming after {:?}",
        sent.elapsed()
    );

    // Both slots are taken again (batch-streaming, std-1): the next standard request
    // evicts the streaming batch request, whose stream is cut off.
    let std_2 = rig.send("tenant-std", "std-2", short("std-2", 4));
    let (cut, ended) = streaming.rest(PATIENCE).await;
    assert!(
        ended && !cut.contains("[DONE]"),
        "{t}: the streaming batch request is reset, not finished: ended {ended}, tail {:?}\n{}",
        cut.get(cut.len().saturating_sub(300)..),
        rig.context().await
    );
    let std_2 = outcome(std_2).await;
    assert_eq!(std_2.status, 200, "{t}: {std_2:?}");
    drop(std_1);

    let stats = rig.stats().await;
    assert_eq!(
        (
            evictions(&stats, "before_response"),
            evictions(&stats, "responding")
        ),
        (1, 1),
        "{t}\n{}",
        rig.context().await
    );

    // The billing log: the evicted requests say so; the one cut off mid-stream is charged
    // what the engine generated, the one answered 429 nothing.
    let held = rig.record_of("batch-held").await;
    assert_eq!(held["outcome"], "evicted-by-priority", "{t}: {held}");
    assert_eq!(held["status"], 429, "{t}: {held}");
    assert_eq!(held["charged"], 0, "{t}: {held}");
    let cut = rig.record_of("batch-streaming").await;
    assert_eq!(cut["outcome"], "evicted-by-priority", "{t}: {cut}");
    let completion = cut["completion_tokens"].as_u64().unwrap_or(0);
    assert!(completion > 0, "{t}: {cut}");
    assert_eq!(
        cut["charged"].as_u64(),
        Some(cut["prompt_tokens"].as_u64().unwrap_or(0) + completion),
        "{t}: {cut}"
    );
    let served = rig.record_of("std-2").await;
    assert_eq!(served["outcome"], "complete", "{t}: {served}");
    // The engine's requests went with them: neither batch request ran to its end there
    // (the held one's prefill was over well after its eviction).
    tokio::time::sleep(Duration::from_millis(HELD_PREFILL_MS)).await;
    assert_eq!(rig.served("tenant-batch").completed, 0, "{t}");
}

/// Waits until the engine has received request `id` (at most [`PATIENCE`]).
async fn wait_arrived(rig: &Rig, id: &str) {
    let deadline = Instant::now() + PATIENCE;
    while !rig.sim.arrivals().iter().any(|a| a.request_id == id) {
        assert!(
            Instant::now() < deadline,
            "{}: {id} never reached the engine\n{}",
            rig.t(),
            rig.context().await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
