//! The picker's memory of the LoRA adapters it sent to each endpoint: an adapter sent
//! earlier and idle since (so absent from the scrape) pulls its next request back, one in
//! flight counts as loaded before any scrape shows it, the guess of what is loaded never
//! exceeds the endpoint's slots and forgets the least recent, and base-model picks neither
//! read nor change it.

use scheduler_core::metrics::LoraState;
use scheduler_core::types::Tokens;

use super::*;

/// Seeds each pick is repeated with, so a tie broken by chance cannot pass for a choice.
const SEEDS: u64 = 24;

/// Pool `p` (llama: A, B) scored by LoRA affinity alone.
fn lora_pool() -> PickerShared {
    shared(pool(
        &[A, B],
        json!({"eppConfig": {
            "plugins": [
                {"type": "lora-affinity-scorer"},
                {"type": "max-score-picker"}
            ],
            "schedulingProfiles": [{
                "name": "default",
                "plugins": [
                    {"pluginRef": "lora-affinity-scorer", "weight": 1},
                    {"pluginRef": "max-score-picker"}
                ]
            }]
        }}),
    ))
}

/// Both endpoints scraped with `max` adapter slots and nothing running or waiting.
fn idle_lora(s: &PickerShared, max: u32) {
    let m = EndpointMetrics {
        lora: Some(LoraState {
            max,
            running: Vec::new(),
            waiting: Vec::new(),
        }),
        ..metrics(0, 0.1)
    };
    let host = FakeHost::new().snapshot(1, snapshot(NOW, &[(A, m.clone()), (B, m)]));
    assert_eq!(s.refresh_snapshot(&host), SnapshotRefresh::Updated);
}

fn request(model: &str) -> PickRequest<'_> {
    PickRequest {
        target_model: model,
        block_hashes: &[],
        prompt_tokens: Tokens(10),
        max_output_tokens: None,
        output_sequences: 1,
        session: None,
    }
}

/// Pick `model` among the pool endpoints `subset` (all when `None`) with `seed`.
fn pick(s: &PickerShared, model: &str, subset: Option<&[u32]>, seed: u64) -> Picked {
    let Some(plan) = s.pool_plan("llama") else {
        unreachable!("the pool serves llama")
    };
    let subset: Option<Vec<String>> = subset.map(|slots| {
        slots
            .iter()
            .filter_map(|&i| plan.endpoints().get(i as usize).cloned())
            .collect()
    });
    match s.pick_within(&plan, &request(model), subset.as_deref(), Millis(NOW), seed) {
        Ok(picked) => picked,
        Err(e) => unreachable!("both endpoints are fresh: {e:?}"),
    }
}

/// Where `model` goes for each seed, each request finished before the next.
fn destinations(s: &PickerShared, model: &str) -> Vec<String> {
    (0..SEEDS)
        .map(|seed| pick(s, model, None, seed).endpoint)
        .collect()
}

/// Send `model` to A and finish the request at once.
fn sent_to_a(s: &PickerShared, model: &str) {
    let picked = pick(s, model, Some(&[0]), 0);
    assert_eq!(picked.endpoint, A);
}

fn remembered(s: &PickerShared, endpoint: usize) -> Vec<String> {
    let Some(state) = s.hold_pool(PoolId(0)) else {
        unreachable!("pool 0 exists")
    };
    state
        .adapters
        .get(endpoint)
        .map(|m| m.names().into_iter().map(str::to_owned).collect())
        .unwrap_or_default()
}

#[test]
fn with_no_memory_equal_endpoints_with_free_slots_split_an_adapter_by_chance() {
    // The control for the tests below: nothing but the memory tells A from B.
    let first: Vec<String> = (0..SEEDS)
        .map(|seed| pick(&lora_pool_fresh(), "x", None, seed).endpoint)
        .collect();
    assert!(first.iter().any(|e| e == A) && first.iter().any(|e| e == B));
}

/// A fresh pool scraped idle with 4 slots each.
fn lora_pool_fresh() -> PickerShared {
    let s = lora_pool();
    idle_lora(&s, 4);
    s
}

#[test]
fn an_idle_adapter_sent_earlier_pulls_its_next_request_to_the_same_endpoint() {
    let s = lora_pool_fresh();
    sent_to_a(&s, "x");
    // The request finished and the scrape lists nothing running: only the memory says x
    // is still loaded on A, where it scores as running against B's free slot.
    assert_eq!(requests_in_flight(&s, A), 0);
    assert!(destinations(&s, "x").iter().all(|e| e == A));
}

#[test]
fn an_adapter_in_flight_counts_as_running_before_the_scrape_shows_it() {
    let s = lora_pool();
    idle_lora(&s, 1);
    // Two adapters in flight on A, one slot: both are loaded or queued there, so both
    // count (the in-flight ones are never cut to the slots).
    let held_x = pick(&s, "x", Some(&[0]), 0);
    let held_y = pick(&s, "y", Some(&[0]), 0);
    assert_eq!((held_x.endpoint.as_str(), held_y.endpoint.as_str()), (A, A));
    for model in ["x", "y"] {
        for seed in 0..SEEDS {
            let picked = pick(&s, model, None, seed);
            assert_eq!(picked.endpoint, A, "{model} with seed {seed}");
        }
    }
    // A third adapter finds A's slot taken and goes to B.
    assert!(destinations(&s, "z").iter().all(|e| e == B));
    // Finished, only the most recent one (y, picked last above) is guessed loaded in A's
    // one slot.
    drop((held_x, held_y));
    assert!(destinations(&s, "y").iter().all(|e| e == A));
    assert!(destinations(&s, "x").iter().all(|e| e == B));
}

#[test]
fn the_guess_never_exceeds_the_slots_and_forgets_the_least_recent() {
    let s = lora_pool();
    idle_lora(&s, 2);
    for model in ["a", "b", "c"] {
        sent_to_a(&s, model);
    }
    assert_eq!(remembered(&s, 0), ["c", "b"]);
    // A looks full (c, b): a goes to B's free slot; b and c stay on A.
    assert!(destinations(&s, "a").iter().all(|e| e == B));
    assert!(destinations(&s, "b").iter().all(|e| e == A));
    assert!(destinations(&s, "c").iter().all(|e| e == A));
    assert!(remembered(&s, 0).len() <= 2 && remembered(&s, 1).len() <= 2);
}

#[test]
fn base_model_requests_neither_read_nor_change_the_memory() {
    let s = lora_pool_fresh();
    sent_to_a(&s, "x");
    let fresh = lora_pool_fresh();
    // The same seeds choose the same endpoints as in a pool that remembers nothing.
    for seed in 0..SEEDS {
        let remembering = pick(&s, "llama", None, seed).endpoint;
        assert_eq!(remembering, pick(&fresh, "llama", None, seed).endpoint);
    }
    assert_eq!(remembered(&s, 0), ["x"]);
    assert!(remembered(&s, 1).is_empty());
}
