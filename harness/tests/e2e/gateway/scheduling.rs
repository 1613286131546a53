//! Scheduling through the real Envoy: the KV-utilisation filter keeps new requests off a
//! full replica, and a conversation's second turn lands where its first turn was served
//! (the prefix index) while first turns spread over the replicas, at the suite's Envoy
//! worker count and pinned at two (one index per Envoy process in both flavours, so the
//! worker that takes turn 2 knows turn 1).

use super::{chat, served_by, tag};
use crate::support::gw::{self, Plan};
use crate::support::{TestBackend, QUICK};
use infergate_harness::launch::{Flavor, PoolSpec, Stack};
use serde_json::json;
use std::collections::BTreeMap;

const MODEL: &str = "model-a";

/// A KV-utilisation filter at 80% in front of prefix, queue and in-flight scorers. Nothing
/// else looks at KV usage (no `kv-cache-utilization-scorer`), so a full replica is kept
/// off by the threshold alone, and prefix affinity (weight 3) would otherwise pull a
/// conversation back to it.
pub(super) fn kv_threshold_epp_config() -> serde_json::Value {
    json!({
        "plugins": [
            {"type": "approx-prefix-cache-producer"},
            {"type": "inflight-load-producer"},
            {"type": "utilization-filter", "parameters": {
                "conditions": [{"metric": "kv-cache-utilization", "maxValue": 0.8}],
                "fallbackOnEmpty": false}},
            {"type": "prefix-cache-scorer"},
            {"type": "queue-scorer"},
            {"type": "inflight-load-scorer"},
            {"type": "max-score-picker"}
        ],
        "schedulingProfiles": [{
            "name": "default",
            "plugins": [
                {"pluginRef": "utilization-filter"},
                {"pluginRef": "prefix-cache-scorer", "weight": 3},
                {"pluginRef": "queue-scorer", "weight": 1},
                {"pluginRef": "inflight-load-scorer", "weight": 1},
                {"pluginRef": "max-score-picker"}
            ]
        }]
    })
}

/// Sends `n` requests with distinct short prompts; requests per backend index.
async fn spread(stack: &Stack, n: usize, label: &str) -> BTreeMap<usize, usize> {
    let mut per = BTreeMap::new();
    for i in 0..n {
        let (b, _) = served_by(stack, &chat(MODEL, &format!("{label} {i}")), &[]).await;
        *per.entry(b).or_default() += 1;
    }
    per
}

pub(super) async fn a_replica_over_the_kv_threshold_gets_no_new_requests(flavor: Flavor) {
    let backends = TestBackend::many(3, QUICK).await;
    let mut pool = PoolSpec::all(MODEL);
    pool.picker_config = kv_threshold_epp_config();
    let Some(stack) = gw::start(flavor, &backends, Plan::new(vec![pool])).await else {
        return;
    };
    let before = spread(&stack, 30, "all below the threshold").await;
    assert_eq!(before.len(), 3, "{}: {before:?}", tag(flavor));
    // Conversations whose first turn b0 served: their prefix is cached there.
    let mut on_b0 = Vec::new();
    let mut elsewhere = Vec::new();
    for id in 0..40 {
        let (b, _) = served_by(&stack, &turn_one(id), &[]).await;
        if b == 0 {
            on_b0.push(id);
        } else {
            elsewhere.push((id, b));
        }
        if on_b0.len() >= 3 && elsewhere.len() >= 3 {
            break;
        }
    }
    assert!(on_b0.len() >= 3, "{}: b0 served {on_b0:?}", tag(flavor));

    // b0 fills up; the others keep room. Once a scrape after the change has landed, b0
    // gets nothing new: neither fresh requests nor the second turns its cache would win.
    backends[0].set_kv(0.95);
    backends[0].wait_scrapes(3).await;
    let served_before = backends[0].served();
    let full = spread(&stack, 30, "b0 is full").await;
    for &id in &on_b0 {
        let (b, _) = served_by(&stack, &turn_two(id), &[]).await;
        assert_ne!(
            b,
            0,
            "{}: conversation {id} went back to the full b0",
            tag(flavor)
        );
    }
    for &(id, first) in &elsewhere {
        let (b, _) = served_by(&stack, &turn_two(id), &[]).await;
        assert_eq!(
            b,
            first,
            "{}: conversation {id} lost its affinity",
            tag(flavor)
        );
    }
    assert_eq!(
        backends[0].served(),
        served_before,
        "{}: {full:?}",
        tag(flavor)
    );
    assert!(
        full.contains_key(&1) && full.contains_key(&2),
        "{}: the replicas with room share the load: {full:?}",
        tag(flavor)
    );

    // Room again: b0 is back among the candidates.
    backends[0].set_kv(0.1);
    backends[0].wait_scrapes(3).await;
    let after = spread(&stack, 30, "b0 has room again").await;
    assert!(after.contains_key(&0), "{}: {after:?}", tag(flavor));
}

/// A conversation's system prompt: long enough for several prefix blocks, unique from its
/// first bytes.
fn system_prompt(id: usize) -> String {
    format!(
        "conversation {id}. {}",
        "You are a careful assistant who answers in full sentences. ".repeat(50)
    )
}

fn turn_one(id: usize) -> serde_json::Value {
    json!({"model": MODEL, "messages": [
        {"role": "system", "content": system_prompt(id)},
        {"role": "user", "content": format!("question one of {id}")}]})
}

fn turn_two(id: usize) -> serde_json::Value {
    json!({"model": MODEL, "messages": [
        {"role": "system", "content": system_prompt(id)},
        {"role": "user", "content": format!("question one of {id}")},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": format!("and question two of {id}")}]})
}

/// What many two-turn conversations did.
struct Affinity {
    conversations: usize,
    /// Turn 2 on the replica of turn 1.
    same: usize,
    /// First turns per backend index.
    first_turns: BTreeMap<usize, usize>,
}

/// Runs `conversations` two-turn conversations: every first turn, then every second turn
/// (so a second turn never just follows its own first turn on one connection).
async fn conversations(stack: &Stack, conversations: usize) -> Affinity {
    let mut first = Vec::with_capacity(conversations);
    let mut first_turns = BTreeMap::new();
    for id in 0..conversations {
        let (b, _) = served_by(stack, &turn_one(id), &[]).await;
        first.push(b);
        *first_turns.entry(b).or_default() += 1;
    }
    let mut same = 0;
    for (id, &b1) in first.iter().enumerate() {
        let (b2, _) = served_by(stack, &turn_two(id), &[]).await;
        same += usize::from(b2 == b1);
    }
    Affinity {
        conversations,
        same,
        first_turns,
    }
}

pub(super) async fn turn_two_follows_turn_one_while_load_spreads(flavor: Flavor) {
    let backends = TestBackend::many(3, QUICK).await;
    let plan = Plan::new(vec![PoolSpec::all(MODEL)]);
    let Some(stack) = gw::start(flavor, &backends, plan).await else {
        return;
    };
    let a = conversations(&stack, 30).await;
    assert!(
        a.same * 10 >= a.conversations * 9,
        "{}: turn 2 followed turn 1 in {}/{}",
        tag(flavor),
        a.same,
        a.conversations
    );
    assert!(
        a.first_turns.len() >= 2,
        "{}: every first turn on one replica: {:?}",
        tag(flavor),
        a.first_turns
    );
}

pub(super) async fn turn_two_follows_turn_one_across_workers(flavor: Flavor) {
    let backends = TestBackend::many(3, QUICK).await;
    let mut plan = Plan::new(vec![PoolSpec::all(MODEL)]);
    plan.concurrency = 2;
    let Some(stack) = gw::start(flavor, &backends, plan).await else {
        return;
    };
    let a = conversations(&stack, 40).await;
    // Both workers took connections (each request is a new connection), or the
    // cross-worker question was never asked.
    let stats = stack.envoy().stats().await.unwrap();
    let per_worker: Vec<i64> = (0..2)
        .map(|w| {
            stats
                .containing(&format!(".worker_{w}.downstream_cx_total"))
                .filter(|(k, _)| k.starts_with("listener.127.0.0.1_"))
                .map(|(_, v)| v)
                .sum()
        })
        .collect();
    eprintln!(
        "CROSS-WORKER {}: --concurrency 2, turn 2 on turn 1's replica in {}/{} \
         conversations; connections per worker {per_worker:?}; first turns {:?}",
        tag(flavor),
        a.same,
        a.conversations,
        a.first_turns
    );
    assert!(
        per_worker.iter().all(|&n| n >= 5),
        "{}: connections per worker {per_worker:?}",
        tag(flavor)
    );
    assert!(a.first_turns.len() >= 2, "{:?}", a.first_turns);
    // One prefix index per process: the worker that takes turn 2 knows turn 1.
    assert!(
        a.same * 10 >= a.conversations * 9,
        "{}: turn 2 followed turn 1 in {}/{} across workers",
        tag(flavor),
        a.same,
        a.conversations
    );
}
