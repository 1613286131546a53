//! Unit tests of the engine model: block accounting, prefix hits, eviction order, batching,
//! queueing, preemption, adapters and timing — all without sockets or real time.

use super::*;

fn cfg(blocks: u32) -> EngineConfig {
    EngineConfig {
        kv_capacity_tokens: blocks * 16,
        ..EngineConfig::default()
    }
}

/// `n` distinct chained-looking hashes from a conversation tag.
fn hashes(tag: u64, n: usize) -> Vec<BlockHash> {
    (0..n as u64)
        .map(|i| BlockHash(tag * 1_000_000 + i))
        .collect()
}

fn req(tag: u64, prompt_tokens: u32, output_tokens: u32) -> EngineRequest {
    EngineRequest {
        prompt_tokens,
        block_hashes: hashes(tag, (prompt_tokens / 16) as usize),
        output_tokens,
        lora: None,
        priority: 0,
    }
}

/// Runs until idle, returning every event.
fn drain(e: &mut Engine) -> Vec<EngineEvent> {
    let mut out = Vec::new();
    let mut guard = 0;
    while let Some(t) = e.next_wakeup() {
        e.advance(t, &mut out);
        guard += 1;
        assert!(guard < 1_000_000, "engine never went idle");
    }
    out
}

fn usage_of(events: &[EngineEvent], id: RequestId) -> Usage {
    events
        .iter()
        .find_map(|ev| match ev {
            EngineEvent::Finished { id: i, usage, .. } if *i == id => Some(*usage),
            _ => None,
        })
        .expect("request finished")
}

fn first_token_at(events: &[EngineEvent], id: RequestId) -> SimTime {
    events
        .iter()
        .find_map(|ev| match ev {
            EngineEvent::Token {
                id: i,
                index: 0,
                at,
                ..
            } if *i == id => Some(*at),
            _ => None,
        })
        .expect("first token")
}

#[test]
fn blocks_are_allocated_and_all_returned() {
    let mut e = Engine::new(cfg(100));
    e.submit(SimTime(0), RequestId(1), req(1, 100, 40)).unwrap();
    // Prefill of 100 tokens needs 7 blocks.
    assert_eq!(e.stats().free_blocks, 93);
    assert_eq!(e.stats().running, 1);
    let ev = drain(&mut e);
    let u = usage_of(&ev, RequestId(1));
    assert_eq!(u.prompt_tokens, 100);
    assert_eq!(u.completion_tokens, 40);
    assert_eq!(u.cached_tokens, 0);
    let s = e.stats();
    assert_eq!(s.free_blocks, 100, "every block is free again");
    assert_eq!(s.cached_blocks, 6, "the 6 full prompt blocks stay cached");
    assert_eq!(s.kv_usage, 0.0);
    let tokens: Vec<u32> = ev
        .iter()
        .filter_map(|x| match x {
            EngineEvent::Token { index, .. } => Some(*index),
            _ => None,
        })
        .collect();
    assert_eq!(tokens, (0..40).collect::<Vec<_>>());
}

#[test]
fn repeated_prefix_hits_the_cache_but_never_the_last_token() {
    let mut e = Engine::new(cfg(100));
    e.submit(SimTime(0), RequestId(1), req(1, 100, 1)).unwrap();
    drain(&mut e);
    e.submit(SimTime(1), RequestId(2), req(1, 100, 1)).unwrap();
    let ev = drain(&mut e);
    assert_eq!(usage_of(&ev, RequestId(2)).cached_tokens, 96);
    // A prompt that is exactly 6 blocks can reuse only 5: the last token is recomputed.
    e.submit(SimTime(2), RequestId(3), req(1, 96, 1)).unwrap();
    let ev = drain(&mut e);
    assert_eq!(usage_of(&ev, RequestId(3)).cached_tokens, 80);
    let c = e.stats().counters;
    assert_eq!(c.prefix_queries_tokens, 100 + 100 + 96);
    assert_eq!(c.prefix_hits_tokens, 96 + 80);
}

#[test]
fn generated_tokens_blocks_are_cached_for_the_next_turn() {
    let mut e = Engine::new(cfg(100));
    // Turn 1: 40 prompt tokens and 40 generated; the hashes cover the 80-token sequence.
    let mut turn1 = req(7, 40, 40);
    turn1.block_hashes = hashes(7, 5);
    e.submit(SimTime(0), RequestId(1), turn1).unwrap();
    drain(&mut e);
    // Turn 2 repeats turn 1 and its answer, then adds 20 tokens.
    let mut turn2 = req(7, 100, 1);
    turn2.block_hashes = hashes(7, 6);
    e.submit(SimTime(1), RequestId(2), turn2).unwrap();
    let ev = drain(&mut e);
    // 79 tokens were computed (the last sampled token never is): 4 full blocks, the last two
    // of them holding generated tokens. Prompt blocks alone would give 32.
    assert_eq!(usage_of(&ev, RequestId(2)).cached_tokens, 64);
}

#[test]
fn cached_prefix_skips_prefill_time() {
    let mut e = Engine::new(cfg(1000));
    e.submit(SimTime(0), RequestId(1), req(1, 1600, 1)).unwrap();
    let ev = drain(&mut e);
    let cold = first_token_at(&ev, RequestId(1)).as_secs_f64();
    assert!(
        (cold - 0.1).abs() < 1e-6,
        "1600 tokens at 16k tok/s = 100 ms, got {cold}"
    );
    let t0 = SimTime::from_secs_f64(1.0);
    e.submit(t0, RequestId(2), req(1, 1600, 1)).unwrap();
    let ev = drain(&mut e);
    let warm = first_token_at(&ev, RequestId(2)).as_secs_f64() - 1.0;
    // 16 uncached tokens (the recomputed last block).
    assert!((warm - 0.001).abs() < 1e-6, "warm TTFT {warm}");
}

#[test]
fn eviction_takes_least_recently_freed_and_tail_blocks_first() {
    let mut e = Engine::new(cfg(10));
    // A: 4 full blocks; after it finishes, blocks are freed tail first.
    e.submit(SimTime(0), RequestId(1), req(1, 64, 1)).unwrap();
    drain(&mut e);
    assert_eq!(e.stats().cached_blocks, 4);
    // B needs 4 fresh blocks: 6 never-used blocks are older than A's, so A survives.
    e.submit(SimTime(1), RequestId(2), req(2, 64, 1)).unwrap();
    drain(&mut e);
    assert_eq!(e.stats().evictions, 0);
    // C needs 4 blocks: the 2 unused ones, then A's last two blocks (freed first).
    e.submit(SimTime(2), RequestId(3), req(3, 64, 1)).unwrap();
    drain(&mut e);
    assert_eq!(e.stats().evictions, 2);
    e.submit(SimTime(3), RequestId(4), req(1, 64, 1)).unwrap();
    let ev = drain(&mut e);
    assert_eq!(
        usage_of(&ev, RequestId(4)).cached_tokens,
        32,
        "A's head survived"
    );
}

#[test]
fn max_num_seqs_bounds_the_batch_and_the_rest_waits() {
    let mut e = Engine::new(EngineConfig {
        max_num_seqs: 2,
        ..cfg(1000)
    });
    for i in 1..=3 {
        e.submit(SimTime(0), RequestId(i), req(i, 32, 5)).unwrap();
    }
    let mut out = Vec::new();
    // First step started with request 1 alone (submitted into an idle engine).
    let t = e.next_wakeup().unwrap();
    e.advance(t, &mut out);
    let s = e.stats();
    assert_eq!((s.running, s.waiting), (2, 1));
    let ev = drain(&mut e);
    assert!(first_token_at(&ev, RequestId(3)) > first_token_at(&ev, RequestId(2)));
    assert_eq!(e.stats().counters.finished, 3);
}

#[test]
fn full_kv_queues_fcfs_until_blocks_free() {
    // 20 blocks; request 1 holds 16 of them, request 2 needs 8 and must wait.
    let mut e = Engine::new(cfg(20));
    e.submit(SimTime(0), RequestId(1), req(1, 250, 10)).unwrap();
    e.submit(SimTime(0), RequestId(2), req(2, 120, 1)).unwrap();
    let mut out = Vec::new();
    let t = e.next_wakeup().unwrap();
    e.advance(t, &mut out);
    assert_eq!(e.stats().waiting, 1, "request 2 waits for KV");
    assert!(e.stats().kv_usage > 0.75);
    // A small request behind it also waits: FCFS, no overtaking.
    e.submit(t, RequestId(3), req(3, 16, 1)).unwrap();
    assert_eq!(e.stats().waiting, 2);
    let ev = drain(&mut e);
    let done1 = ev
        .iter()
        .find_map(|x| match x {
            EngineEvent::Finished { id, at, .. } if *id == RequestId(1) => Some(*at),
            _ => None,
        })
        .unwrap();
    assert!(first_token_at(&ev, RequestId(2)) > done1);
    assert!(first_token_at(&ev, RequestId(3)) > done1);
}

#[test]
fn decode_step_time_grows_with_batch() {
    let step_len = |n: u64| {
        let mut e = Engine::new(cfg(1000));
        for i in 0..n {
            e.submit(SimTime(0), RequestId(i), req(i + 1, 16, 10))
                .unwrap();
        }
        let mut out = Vec::new();
        // Step 1: prefill of request 0; step 2: prefill of the rest plus a decode.
        // Run until every sequence is decoding, then time one step.
        for _ in 0..2 {
            let t = e.next_wakeup().unwrap();
            e.advance(t, &mut out);
        }
        let start = e.next_wakeup().unwrap();
        e.advance(start, &mut out);
        e.next_wakeup().unwrap().0 - start.0
    };
    let one = step_len(1);
    let eight = step_len(8);
    assert!(
        eight > one,
        "decode step of 8 ({eight} ns) must exceed 1 ({one} ns)"
    );
}

#[test]
fn cancel_frees_blocks_and_stops_tokens() {
    let mut e = Engine::new(cfg(100));
    e.submit(SimTime(0), RequestId(1), req(1, 200, 1500))
        .unwrap_err();
    e.submit(SimTime(0), RequestId(1), req(1, 200, 500))
        .unwrap();
    let mut out = Vec::new();
    for _ in 0..5 {
        let t = e.next_wakeup().unwrap();
        e.advance(t, &mut out);
    }
    assert!(e.stats().free_blocks < 100);
    assert!(e.cancel(RequestId(1)));
    let s = e.stats();
    assert_eq!((s.free_blocks, s.running, s.waiting), (100, 0, 0));
    assert_eq!(e.next_wakeup().map(|t| t > SimTime(0)), Some(true));
    let ev = drain(&mut e);
    assert!(ev.is_empty(), "no tokens after cancel: {ev:?}");
    assert!(!e.cancel(RequestId(1)));
}

#[test]
fn chunked_prefill_splits_long_prompts() {
    let mut e = Engine::new(cfg(5000));
    e.submit(SimTime(0), RequestId(1), req(1, 20_000, 1))
        .unwrap();
    let mut steps = 0;
    let mut out = Vec::new();
    while let Some(t) = e.next_wakeup() {
        e.advance(t, &mut out);
        steps += 1;
    }
    assert_eq!(steps, 3, "8192 + 8192 + 3616 tokens");
    let ttft = first_token_at(&out, RequestId(1)).as_secs_f64();
    assert!((ttft - 20_000.0 / 16_000.0).abs() < 1e-6);
}

#[test]
fn growing_sequences_preempt_the_newest_and_all_finish() {
    // 12 blocks; two requests of 80 prompt tokens (5 blocks) each growing by 40 tokens.
    let mut e = Engine::new(cfg(12));
    e.submit(SimTime(0), RequestId(1), req(1, 80, 40)).unwrap();
    e.submit(SimTime(0), RequestId(2), req(2, 80, 40)).unwrap();
    let ev = drain(&mut e);
    assert!(e.stats().counters.preemptions > 0);
    assert_eq!(usage_of(&ev, RequestId(1)).completion_tokens, 40);
    assert_eq!(usage_of(&ev, RequestId(2)).completion_tokens, 40);
    let idx: Vec<u32> = ev
        .iter()
        .filter_map(|x| match x {
            EngineEvent::Token { id, index, .. } if *id == RequestId(2) => Some(*index),
            _ => None,
        })
        .collect();
    assert_eq!(
        idx,
        (0..40).collect::<Vec<_>>(),
        "no token repeated after recompute"
    );
    assert_eq!(e.stats().free_blocks, 12);
}

#[test]
fn lora_slots_limit_distinct_adapters_but_not_base_requests() {
    let mut e = Engine::new(EngineConfig {
        max_loras: 1,
        ..cfg(1000)
    });
    let with = |tag, lora: &str| EngineRequest {
        lora: Some(lora.to_string()),
        ..req(tag, 32, 20)
    };
    e.submit(SimTime(0), RequestId(1), with(1, "a")).unwrap();
    e.submit(SimTime(0), RequestId(2), with(2, "b")).unwrap();
    e.submit(SimTime(0), RequestId(3), req(3, 32, 20)).unwrap();
    e.submit(SimTime(0), RequestId(4), with(4, "a")).unwrap();
    let mut out = Vec::new();
    let t = e.next_wakeup().unwrap();
    e.advance(t, &mut out);
    let s = e.stats();
    assert_eq!(s.running_loras, vec!["a".to_string()]);
    assert_eq!(s.waiting_loras, vec!["b".to_string()]);
    assert_eq!(
        (s.running, s.waiting),
        (3, 1),
        "b skipped, base and second a admitted"
    );
    let mut ev = out;
    ev.extend(drain(&mut e));
    assert_eq!(usage_of(&ev, RequestId(2)).completion_tokens, 20);
    // The first step paid the adapter load delay (50 ms) on top of 32 prefill tokens.
    let first = first_token_at(&ev, RequestId(1)).as_secs_f64();
    assert!((first - (0.05 + 32.0 / 16_000.0)).abs() < 1e-6, "{first}");
}

#[test]
fn lora_loads_count_each_admission_of_an_adapter_not_resident() {
    let mut e = Engine::new(EngineConfig {
        max_loras: 2,
        ..cfg(1000)
    });
    let with = |tag, lora: &str| EngineRequest {
        lora: Some(lora.to_string()),
        ..req(tag, 32, 4)
    };
    let mut id = 0;
    // Each batch arrives at once, 10 s after the previous one (long after it drained).
    let mut run = |e: &mut Engine, loras: &[&str]| {
        let now = SimTime::from_secs_f64(10.0 * id as f64);
        for l in loras {
            id += 1;
            e.submit(now, RequestId(id), with(id, l)).unwrap();
        }
        drain(e);
        e.stats().counters.lora_loads
    };
    // Two requests of one adapter: one load; b beside them: a second.
    assert_eq!(run(&mut e, &["a", "a", "b"]), 2);
    // Both resident (two slots): no load.
    assert_eq!(run(&mut e, &["b", "a"]), 2);
    // c evicts the least recently used (b); b then comes back at a's expense.
    assert_eq!(run(&mut e, &["c"]), 3);
    assert_eq!(run(&mut e, &["c", "b"]), 4);
    assert_eq!(run(&mut e, &["a"]), 5);
    // Base-model requests never load anything.
    e.submit(
        SimTime::from_secs_f64(1000.0),
        RequestId(100),
        req(100, 32, 4),
    )
    .unwrap();
    drain(&mut e);
    assert_eq!(e.stats().counters.lora_loads, 5);
}

#[test]
fn too_long_and_empty_requests_are_refused() {
    let mut e = Engine::new(cfg(10));
    assert!(matches!(
        e.submit(SimTime(0), RequestId(1), req(1, 150, 20)),
        Err(SubmitError::TooLong {
            max_model_len: 160,
            ..
        })
    ));
    assert_eq!(
        e.submit(SimTime(0), RequestId(2), req(1, 10, 0)),
        Err(SubmitError::Empty)
    );
    e.submit(SimTime(0), RequestId(3), req(1, 10, 1)).unwrap();
    assert_eq!(
        e.submit(SimTime(0), RequestId(3), req(1, 10, 1)),
        Err(SubmitError::DuplicateId)
    );
}

#[test]
fn a_prompt_queued_during_a_step_hits_blocks_that_step_computed() {
    // Request 2 arrives while request 1's prefill runs and is admitted right after it.
    let mut e = Engine::new(cfg(100));
    e.submit(SimTime(0), RequestId(1), req(1, 64, 1)).unwrap();
    e.submit(SimTime(0), RequestId(2), req(1, 64, 1)).unwrap();
    let ev = drain(&mut e);
    assert_eq!(usage_of(&ev, RequestId(1)).cached_tokens, 0);
    assert_eq!(
        usage_of(&ev, RequestId(2)).cached_tokens,
        48,
        "admitted after 1 computed"
    );
    assert_eq!(e.stats().cached_blocks, 4);
}

#[test]
fn priority_policy_admits_by_priority_and_preempts_the_last_in_that_order() {
    let mut e = Engine::new(EngineConfig {
        scheduling_policy: SchedulingPolicy::Priority,
        ..cfg(40)
    });
    let with = |tag, prompt, priority| EngineRequest {
        priority,
        ..req(tag, prompt, 200)
    };
    // 1 fills most of the cache; 2 (priority 0) and 3 (priority -1) wait: 3 goes first.
    e.submit(SimTime(0), RequestId(1), with(1, 400, 0)).unwrap();
    let mut out = Vec::new();
    e.advance(SimTime(0), &mut out);
    e.submit(SimTime(1), RequestId(2), with(2, 160, 0)).unwrap();
    e.submit(SimTime(2), RequestId(3), with(3, 160, -1))
        .unwrap();
    let events = drain(&mut e);
    let first = |id| first_token_at(&events, RequestId(id));
    assert!(
        first(3) < first(2),
        "priority -1 is admitted before an earlier priority 0"
    );
    // Growth ran out of blocks; the victim was request 1 (priority 0), so 3, admitted
    // after it, was never pushed back behind it and finished first.
    assert!(e.stats().counters.preemptions > 0);
    let done_at = |id| {
        events
            .iter()
            .find_map(|ev| match ev {
                EngineEvent::Finished { id: i, at, .. } if *i == RequestId(id) => Some(*at),
                _ => None,
            })
            .unwrap()
    };
    assert!(done_at(3) < done_at(1));
    assert_eq!(usage_of(&events, RequestId(3)).completion_tokens, 200);
    // Under FCFS the earlier request 2 blocks the queue and goes first.
    let mut f = Engine::new(cfg(40));
    f.submit(SimTime(0), RequestId(1), with(1, 400, 0)).unwrap();
    f.advance(SimTime(0), &mut out);
    f.submit(SimTime(1), RequestId(2), with(2, 160, 0)).unwrap();
    f.submit(SimTime(2), RequestId(3), with(3, 160, -1))
        .unwrap();
    let events = drain(&mut f);
    assert!(first_token_at(&events, RequestId(2)) < first_token_at(&events, RequestId(3)));
}

/// The KV event log: stores with token ids as blocks are computed, removals on eviction,
/// one clear on reset, and nothing while disabled.
#[test]
fn cache_events_follow_the_cache() {
    use crate::prompt::{block_hashes, model_seed};
    let seed = model_seed("m", None);
    let bytes = |fill: u8, tokens: usize| -> Arc<[u8]> {
        (0..tokens * 4)
            .map(|i| fill.wrapping_add(i as u8))
            .collect::<Vec<u8>>()
            .into()
    };
    let request = |content: &[u8], prompt_tokens: u32| EngineRequest {
        prompt_tokens,
        block_hashes: block_hashes(seed, content, 16),
        output_tokens: 1,
        lora: None,
        priority: 0,
    };
    let mut e = Engine::new(cfg(6));
    let mut log = Vec::new();
    let a = bytes(1, 33);
    e.submit_with_bytes(SimTime(0), RequestId(1), request(&a, 32), Some(a.clone()))
        .unwrap();
    drain(&mut e);
    e.drain_cache_events(&mut log);
    assert!(log.is_empty(), "disabled by default");

    e.reset_prefix_cache();
    e.set_cache_events(true);
    e.submit_with_bytes(SimTime(0), RequestId(2), request(&a, 32), Some(a.clone()))
        .unwrap();
    drain(&mut e);
    e.drain_cache_events(&mut log);
    let ha = block_hashes(seed, &a, 16);
    assert_eq!(ha.len(), 2);
    let a_tokens: Vec<u32> = cache_events::token_ids(&a[..128]).collect();
    assert_eq!(
        log,
        vec![CacheEvent::Stored {
            hashes: ha.clone(),
            parent: None,
            token_ids: a_tokens,
            lora: None
        }]
    );

    // 92 prompt tokens need all 6 blocks: A's two cached blocks are evicted.
    log.clear();
    let b = bytes(7, 93);
    e.submit_with_bytes(SimTime(0), RequestId(3), request(&b, 92), Some(b.clone()))
        .unwrap();
    drain(&mut e);
    e.drain_cache_events(&mut log);
    let hb = block_hashes(seed, &b, 16);
    assert_eq!(hb.len(), 5);
    let CacheEvent::Removed { hashes: removed } = &log[0] else {
        panic!("eviction first: {log:?}");
    };
    let mut removed = removed.clone();
    removed.sort();
    let mut want = ha.clone();
    want.sort();
    assert_eq!(removed, want);
    let CacheEvent::Stored {
        hashes,
        parent,
        token_ids,
        ..
    } = &log[1]
    else {
        panic!("then the stores: {log:?}");
    };
    assert_eq!(hashes, &hb);
    assert_eq!(*parent, None);
    assert_eq!(token_ids.len(), 80);
    assert_eq!(log.len(), 2);

    log.clear();
    e.reset_prefix_cache();
    e.drain_cache_events(&mut log);
    assert_eq!(log, vec![CacheEvent::Cleared]);
    assert_eq!(e.stats().cached_blocks, 0);
    // A request without bytes is cached but logs no store.
    log.clear();
    e.submit(SimTime(0), RequestId(4), request(&a, 32)).unwrap();
    drain(&mut e);
    e.drain_cache_events(&mut log);
    assert!(log.is_empty(), "{log:?}");
    assert_eq!(e.stats().cached_blocks, 2);
}

#[test]
fn a_slowdown_stretches_the_steps_started_after_it() {
    let mut e = Engine::new(cfg(1000));
    // Normal speed: 1600 tokens at 16k tok/s = 100 ms, then 6.08 ms per decode step.
    e.submit(SimTime(0), RequestId(1), req(1, 1600, 3)).unwrap();
    let ev = drain(&mut e);
    let normal = first_token_at(&ev, RequestId(1)).as_secs_f64();
    assert!((normal - 0.1).abs() < 1e-6, "normal TTFT {normal}");

    e.set_slowdown(Slowdown::new(10.0, 0.0).unwrap());
    let t0 = SimTime::from_secs_f64(1.0);
    e.submit(t0, RequestId(2), req(2, 1600, 3)).unwrap();
    let ev = drain(&mut e);
    let ttft = first_token_at(&ev, RequestId(2)).as_secs_f64() - 1.0;
    assert!((ttft - 1.0).abs() < 1e-6, "10x slower TTFT {ttft}");
    let done = ev
        .iter()
        .find_map(|x| match x {
            EngineEvent::Finished { at, .. } => Some(at.as_secs_f64()),
            _ => None,
        })
        .unwrap();
    let tpot = (done - 1.0 - ttft) / 2.0;
    assert!(
        (tpot - 0.0608).abs() < 1e-6,
        "10x slower decode step {tpot}"
    );

    // The delay is added to prefill steps only; a cached prompt pays it too.
    e.set_slowdown(Slowdown::new(1.0, 300.0).unwrap());
    let t1 = SimTime::from_secs_f64(5.0);
    e.submit(t1, RequestId(3), req(2, 1600, 3)).unwrap();
    let ev = drain(&mut e);
    let ttft = first_token_at(&ev, RequestId(3)).as_secs_f64() - 5.0;
    assert!((ttft - 0.301).abs() < 1e-6, "cached TTFT + 300 ms: {ttft}");

    // A step already running keeps its end when the slowdown changes.
    e.set_slowdown(Slowdown::new(10.0, 0.0).unwrap());
    let t2 = SimTime::from_secs_f64(10.0);
    e.submit(t2, RequestId(4), req(4, 1600, 1)).unwrap();
    e.set_slowdown(Slowdown::NONE);
    assert_eq!(e.slowdown(), Slowdown::NONE);
    let ev = drain(&mut e);
    let ttft = first_token_at(&ev, RequestId(4)).as_secs_f64() - 10.0;
    assert!((ttft - 1.0).abs() < 1e-6, "started slow, ends slow: {ttft}");
}
