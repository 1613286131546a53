//! In-flight accounting, prefix and session affinity, snapshot caching, thread safety.

use super::*;

#[test]
fn in_flight_counts_rise_at_pick_and_fall_exactly_once_at_the_end() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("hello"), Some(fresh_all(&[A])));
    let (_, mut first) = pick_one(&mut s, &mut host);
    let mut host = host_for(&chat("hello again"), Some(fresh_all(&[A])));
    let (_, mut second) = pick_one(&mut s, &mut host);
    assert_eq!(requests_in_flight(&s, A), 2);
    assert!(s.inflight(PoolId(0), A).is_some_and(|l| l.tokens.0 > 0));

    // Complete (on_log), then the context drop calls on_end again: one decrement.
    first.on_end(&mut s);
    assert_eq!(requests_in_flight(&s, A), 1);
    first.on_end(&mut s);
    assert_eq!(requests_in_flight(&s, A), 1);
    assert!(!first.holds_lease());

    // Reset first, then complete: still one decrement.
    second.on_end(&mut s);
    second.on_end(&mut s);
    assert_eq!(requests_in_flight(&s, A), 0);
    assert!(s.inflight(PoolId(0), A).is_some_and(|l| l.tokens.0 == 0));
}

#[test]
fn rejected_and_passthrough_requests_hold_nothing() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("x"), None);
    let (_, mut rejected) = pick_one(&mut s, &mut host);
    rejected.on_end(&mut s);
    assert_eq!(requests_in_flight(&s, A), 0);
}

#[test]
fn a_lease_from_a_replaced_state_is_ignored() {
    let mut old = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("x"), Some(fresh_all(&[A])));
    let (_, mut req) = pick_one(&mut old, &mut host);
    let mut new = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("y"), Some(fresh_all(&[A])));
    let (_, _held) = pick_one(&mut new, &mut host);
    req.on_end(&mut new);
    assert_eq!(requests_in_flight(&new, A), 1);
}

#[test]
fn turn_two_lands_where_turn_one_was_served_while_load_spreads() {
    let mut s = shared(pool(&[A, B, C], json!({})));
    let snap = fresh_all(&[A, B, C]);
    let mut turn_one = Vec::new();
    let mut held = Vec::new();
    for conv in 0..6 {
        // Distinct conversations, each several prefix blocks long.
        let first = format!("conversation {conv}: ").repeat(80);
        let mut host = host_for(&chat(&first), Some(snap.clone()));
        let (_, req) = pick_one(&mut s, &mut host);
        turn_one.push((first, req.endpoint().map(str::to_owned)));
        held.push(req);
    }
    // Load spread: the in-flight scorer kept every endpoint in use.
    for e in [A, B, C] {
        assert!(requests_in_flight(&s, e) >= 1, "{e} got no conversation");
    }
    for mut r in held {
        r.on_end(&mut s);
    }
    for (first, endpoint) in &turn_one {
        let body = json!({"model": "llama", "messages": [
            {"role": "user", "content": first},
            {"role": "assistant", "content": "Here is what I know."},
            {"role": "user", "content": "Tell me more."}
        ]})
        .to_string();
        let mut host = host_for(body.as_bytes(), Some(snap.clone()));
        let (_, mut req) = pick_one(&mut s, &mut host);
        assert_eq!(req.endpoint().map(str::to_owned), *endpoint);
        req.on_end(&mut s);
    }
    assert!(s.prefix_hit_ratio(PoolId(0)) > 0.3);
    assert!(s.prefix_hit_ratio(PoolId(0)) <= 1.0);
}

#[test]
fn prefix_block_stats_count_matched_and_total_blocks() {
    let mut s = shared(pool(&[A], json!({})));
    let prompt = "a".repeat(64 * 4 * 3 + 10); // three full 64-token blocks of prompt text
    let mut host = host_for(&chat(&prompt), Some(fresh_all(&[A])));
    let (_, mut r1) = pick_one(&mut s, &mut host);
    let total = host.counter("infergate.picker.prefix_total_blocks.pool.p");
    assert!(total >= 3);
    assert_eq!(
        host.counter("infergate.picker.prefix_matched_blocks.pool.p"),
        0
    );
    r1.on_end(&mut s);
    let mut host = host_for(&chat(&prompt), Some(fresh_all(&[A])));
    let (_, mut r2) = pick_one(&mut s, &mut host);
    assert_eq!(
        host.counter("infergate.picker.prefix_matched_blocks.pool.p"),
        total
    );
    r2.on_end(&mut s);
    assert!((s.prefix_hit_ratio(PoolId(0)) - 0.5).abs() < 1e-9);
}

#[test]
fn session_header_steers_to_the_last_endpoint() {
    let epp = json!({
        "plugins": [{"type": "session-affinity-scorer"}, {"type": "max-score-picker"}]
    });
    let mut s = shared(pool(
        &[A, B, C],
        json!({"eppConfig": epp, "sessionHeader": "X-Session-Id"}),
    ));
    let mut host =
        host_for(&chat("one"), Some(fresh_all(&[A, B, C]))).request_header("x-session-id", "s1");
    let (_, mut r) = pick_one(&mut s, &mut host);
    let first = r.endpoint().map(str::to_owned);
    r.on_end(&mut s);
    for i in 0..10 {
        let mut host = host_for(
            &chat(&format!("unrelated {i}")),
            Some(fresh_all(&[A, B, C])),
        )
        .request_header("x-session-id", "s1");
        let (_, mut r) = pick_one(&mut s, &mut host);
        assert_eq!(r.endpoint().map(str::to_owned), first);
        r.on_end(&mut s);
    }
    assert_eq!(s.sessions(PoolId(0)), 1);
}

#[test]
fn the_snapshot_is_copied_and_decoded_only_when_its_version_changes() {
    let mut s = shared(pool(&[A], json!({})));
    let bytes = fresh_all(&[A]);
    let mut host = host_for(&chat("x"), Some(bytes.clone()));
    for _ in 0..5 {
        let mut req = PickRun::new();
        drive(&mut s, &mut host, &mut req);
        req.on_end(&mut s);
        host.request_headers
            .retain(|(k, _)| k != DESTINATION_ENDPOINT);
    }
    assert_eq!(host.snapshot_reads.get(), 1);
    host.snapshot = Some((crate::host::SnapshotVersion(2), bytes));
    let mut req = PickRun::new();
    drive(&mut s, &mut host, &mut req);
    assert_eq!(host.snapshot_reads.get(), 2);
    req.on_end(&mut s);
}

#[test]
fn a_request_reset_while_buffering_never_takes_a_lease() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("x"), Some(fresh_all(&[A])));
    let mut req = PickRun::new();
    assert_eq!(
        req.on_request_headers(&mut s, &mut host, false),
        FilterStatus::Pause
    );
    req.on_end(&mut s);
    let len = host.body.len();
    assert_eq!(
        req.on_request_body(&mut s, &mut host, len, true),
        FilterStatus::Continue
    );
    assert!(!req.holds_lease());
    assert_eq!(requests_in_flight(&s, A), 0);
    assert_eq!(host.header(DESTINATION_ENDPOINT), None);
}

#[test]
fn shared_state_can_live_behind_a_mutex_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<PickerShared>();
    assert_send_sync::<crate::router::Router>();
    assert_send_sync::<crate::scraper::Scraper>();
    assert_send_sync::<crate::stages::PickStage<Arc<SharedPicker>>>();

    let s = std::sync::Arc::new(std::sync::Mutex::new(shared(pool(&[A, B], json!({})))));
    let snap = fresh_all(&[A, B]);
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let s = std::sync::Arc::clone(&s);
            let snap = snap.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    let mut host = host_for(&chat(&format!("w{w} r{i}")), Some(snap.clone()));
                    let mut req = PickRun::new();
                    if let Ok(mut guard) = s.lock() {
                        drive(&mut guard, &mut host, &mut req);
                    }
                    if let Ok(mut guard) = s.lock() {
                        req.on_end(&mut *guard);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        assert!(w.join().is_ok());
    }
    let guard = s.lock();
    assert!(guard.is_ok_and(|g| requests_in_flight(&g, A) == 0 && requests_in_flight(&g, B) == 0));
}

/// `n: 8, max_completion_tokens: 400`: the engine may generate 3,200 tokens, and the
/// in-flight token load counts all of them; a completions batch of three prompts with
/// `n: 2` counts six sequences.
#[test]
fn the_in_flight_token_estimate_counts_every_output_sequence() {
    let mut s = shared(pool(&[A], json!({})));
    for (api, body, sequences) in [
        (
            Api::ChatCompletions,
            json!({"model": "llama", "n": 8, "max_completion_tokens": 400,
                   "messages": [{"role": "user", "content": "name a bakery"}]}),
            8,
        ),
        (
            Api::Completions,
            json!({"model": "llama", "n": 2, "max_tokens": 400,
                   "prompt": ["one", "two", "three"]}),
            6,
        ),
    ] {
        let body = body.to_string().into_bytes();
        let prompt = scheduler_core::request::parse(api, &body)
            .map(|p| p.prompt_tokens.0)
            .unwrap_or_else(|e| unreachable!("{e:?}"));
        let mut host = FakeHost::new()
            .request_header(BASE_MODEL, "llama")
            .post(api.path(), &body)
            .now(NOW)
            .snapshot(1, fresh_all(&[A]));
        let (status, mut run) = pick_one(&mut s, &mut host);
        assert_eq!(status, FilterStatus::Continue);
        assert_eq!(
            s.inflight(PoolId(0), A).map(|l| l.tokens.0),
            Some(prompt + sequences * 400),
            "{api:?}"
        );
        run.on_end(&mut s);
        assert_eq!(s.inflight(PoolId(0), A).map(|l| l.tokens.0), Some(0));
    }
}

/// Flow control charges a request at dispatch by its estimate (prompt + 2 × the output) and
/// counts its tokens (prompt + the output) in token mode: the output is every sequence's.
#[test]
fn the_flow_estimates_count_every_output_sequence() {
    use crate::picker::admit::{FlowPlan, Priorities};
    use scheduler_core::flow::FlowControlConfig;
    let s = shared(pool(&[A], json!({})));
    let Some(plan) = s.pool_plan("llama") else {
        unreachable!()
    };
    let flow = FlowPlan::new(
        "p",
        FlowControlConfig::default(),
        Arc::new(Priorities::default()),
    );
    let estimate = |body: Value| {
        let body = body.to_string().into_bytes();
        let mut host = host_for(&body, None);
        let prompt = scheduler_core::request::parse(Api::ChatCompletions, &body)
            .map(|p| p.prompt_tokens.0)
            .unwrap_or_else(|e| unreachable!("{e:?}"));
        let prepared = PreparedPick::new(&plan, Api::ChatCompletions, &body, &mut host)
            .unwrap_or_else(|e| unreachable!("{e:?}"));
        let (arrival, tokens) = flow.arrival(&prepared);
        (prompt, arrival.service, tokens)
    };
    let messages = json!([{"role": "user", "content": "name a bakery"}]);
    let (prompt, service, tokens) = estimate(
        json!({"model": "llama", "n": 8, "max_completion_tokens": 400, "messages": messages}),
    );
    assert_eq!((service, tokens), (prompt + 2 * 3200, prompt + 3200));
    // Without an output limit, the default estimate per sequence.
    let (prompt, service, tokens) =
        estimate(json!({"model": "llama", "best_of": 3, "messages": messages}));
    let default = crate::flow::DEFAULT_OUTPUT_ESTIMATE;
    assert_eq!(
        (service, tokens),
        (prompt + 2 * 3 * default, prompt + 3 * default)
    );
    let (prompt, service, _) =
        estimate(json!({"model": "llama", "max_tokens": 400, "messages": messages}));
    assert_eq!(service, prompt + 800);
}
