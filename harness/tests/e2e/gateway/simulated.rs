//! The gateway over the engine simulator rather than the scripted test backends: vLLM's
//! `/metrics` page as the simulator renders it, scraped through Envoy, and KV usage that
//! comes from real (simulated) block accounting. One replica has a small KV cache; a long
//! request sent straight to it fills it past the pool's 80% threshold, and while it is full
//! the gateway sends it nothing new; once the request is gone it is a candidate again.

use super::scheduling::kv_threshold_epp_config;
use super::tag;
use crate::support::gw::{self, Plan};
use infergate_harness::launch::client::{post_json, post_json_streamed};
use infergate_harness::launch::{Flavor, PoolSpec, Stack};
use infergate_harness::sim::{self, EngineConfig, SimConfig, SimHandle, REPLICA_ADDR_HEADER};
use serde_json::json;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const MODEL: &str = "sim-model";

/// Quarter speed: a decode step of the long request takes ~25 ms of real time, so it holds
/// its KV blocks for about 12 s, while the gateway's one-token requests stay quick.
const TIME_SCALE: f64 = 0.25;

async fn simulator(replicas: u32, kv_capacity_tokens: u32) -> SimHandle {
    sim::start(SimConfig {
        replicas,
        models: vec![MODEL.into()],
        time_scale: TIME_SCALE,
        engine: EngineConfig {
            kv_capacity_tokens,
            ..EngineConfig::default()
        },
        ..SimConfig::default()
    })
    .await
    .unwrap()
}

/// Sends `n` one-token requests through the gateway; requests per serving replica.
async fn spread(stack: &Stack, n: usize, label: &str) -> BTreeMap<SocketAddr, usize> {
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let mut per = BTreeMap::new();
    for i in 0..n {
        let body = json!({"model": MODEL, "max_tokens": 1,
            "messages": [{"role": "user", "content": format!("{label} {i}")}]});
        let resp = post_json(&url, &body, &[]).await.unwrap();
        assert_eq!(resp.status, 200, "{}", resp.text());
        let addr: SocketAddr = resp.header(REPLICA_ADDR_HEADER).unwrap().parse().unwrap();
        *per.entry(addr).or_default() += 1;
    }
    per
}

async fn kv_of(sim: &SimHandle) -> f64 {
    sim.stats(0).await.unwrap().kv_usage
}

/// Polls until `pred(kv)` holds for the single replica of `sim`, at most 20 s.
async fn wait_kv(sim: &SimHandle, what: &str, pred: impl Fn(f64) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let kv = kv_of(sim).await;
        if pred(kv) {
            return;
        }
        assert!(Instant::now() < deadline, "KV usage {kv}: never {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(super) async fn simulated_kv_pressure_keeps_new_requests_off_a_full_replica(flavor: Flavor) {
    // 256 blocks of 16 tokens on the small replica; the default 160k tokens on the others.
    let small = simulator(1, 4096).await;
    let big = simulator(2, 160_000).await;
    let full = small.addrs()[0];
    let mut addrs = vec![full];
    addrs.extend_from_slice(big.addrs());
    let mut pool = PoolSpec::all(MODEL);
    pool.picker_config = kv_threshold_epp_config();
    let Some(stack) = gw::start_over(flavor, addrs, Plan::new(vec![pool])).await else {
        return;
    };
    let before = spread(&stack, 24, "room everywhere").await;
    assert_eq!(before.len(), 3, "{}: {before:?}", tag(flavor));

    // ~3500 prompt tokens (4 bytes each) and 500 more to generate (the whole fits the
    // 4096-token context): 85% of the small cache at once, more as it decodes.
    let hold = tokio::spawn(async move {
        let body = json!({"model": MODEL, "stream": true, "max_tokens": 500,
            "ignore_eos": true,
            "messages": [{"role": "user", "content": "fill the cache. ".repeat(875)}]});
        let url = format!("http://{full}/v1/chat/completions");
        post_json_streamed(&url, &body, &[]).await
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while kv_of(&small).await <= 0.8 {
        if hold.is_finished() || Instant::now() > deadline {
            let kv = kv_of(&small).await;
            let outcome = hold.await.unwrap().map(|r| (r.status, r.body()));
            panic!("KV usage {kv}; the long request: {outcome:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The scraper polls every 50 ms; leave it a few rounds to publish the new usage.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let during = spread(&stack, 24, "one replica full").await;
    let kv_after = kv_of(&small).await;
    assert!(
        kv_after > 0.8,
        "the long request ended early (KV {kv_after})"
    );
    assert!(
        !during.contains_key(&full),
        "{}: the full replica {full} got new requests: {during:?}",
        tag(flavor)
    );
    assert_eq!(
        during.len(),
        2,
        "{}: the replicas with room share the load: {during:?}",
        tag(flavor)
    );

    // Cancel the long request: its blocks are freed and the replica is a candidate again.
    hold.abort();
    wait_kv(&small, "back to 0", |kv| kv == 0.0).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let after = spread(&stack, 24, "room again").await;
    assert!(after.contains_key(&full), "{}: {after:?}", tag(flavor));
}
