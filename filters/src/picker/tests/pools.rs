//! Pools and leases: each pool has its own lock (a pick in one pool proceeds while another
//! pool is locked; a pick in the locked pool waits), and a lease gives itself back when
//! dropped, without any lock (so even on the thread that holds its pool's lock), with the
//! in-flight gauges made exact again by the pool's next request.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use super::*;

const INFLIGHT_P: &str = "infergate.picker.inflight_requests.pool.p";

/// Pool `p` (llama: A, B) and pool `q` (mistral: C).
fn two_pools() -> PickerShared {
    shared(json!({"pools": [
        pool(&[A, B], json!({})),
        {"pool": "q", "baseModel": "mistral", "endpoints": [C]},
    ]}))
}

fn mistral_host() -> FakeHost {
    let body = json!({"model": "mistral", "messages": [{"role": "user", "content": "hi"}]});
    FakeHost::new()
        .request_header(BASE_MODEL, "mistral")
        .post("/v1/chat/completions", body.to_string().as_bytes())
        .now(NOW)
        .snapshot(1, fresh_all(&[A, B, C]))
}

/// Headers then the whole body, through a shared (threaded) picker.
fn drive_shared(picker: &SharedPicker, host: &mut FakeHost, req: &mut PickRun) -> FilterStatus {
    let first = req.on_request_headers(picker, host, false);
    if first != FilterStatus::Pause {
        return first;
    }
    let len = host.body.len();
    req.on_request_body(picker, host, len, true)
}

#[test]
fn a_request_dropped_without_any_end_call_leaves_nothing_in_flight() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("x"), Some(fresh_all(&[A])));
    let (status, req) = pick_one(&mut s, &mut host);
    assert_eq!(status, FilterStatus::Continue);
    assert!(req.holds_lease());
    assert_eq!(requests_in_flight(&s, A), 1);
    drop(req);
    assert_eq!(requests_in_flight(&s, A), 0);
    assert!(s.inflight(PoolId(0), A).is_some_and(|l| l.tokens.0 == 0));
    // No host was at hand: the gauge decrement is owed, not lost...
    assert_eq!(host.gauges.get(INFLIGHT_P), Some(&1));
    assert_eq!(s.owed_gauge_decrements(PoolId(0)), 1);
    // ...and the pool's next request pays it: back to the exact count.
    let (_, mut next) = pick_one(&mut s, &mut host);
    assert_eq!(host.gauges.get(INFLIGHT_P), Some(&1));
    assert_eq!(s.owed_gauge_decrements(PoolId(0)), 0);
    next.on_end_counted(&mut s, &mut host);
    assert_eq!(host.gauges.get(INFLIGHT_P), Some(&0));
    assert_eq!(host.gauge_underflows, 0);
    assert_eq!(requests_in_flight(&s, A), 0);
}

#[test]
fn a_lease_dropped_on_the_thread_holding_its_pool_lock_neither_blocks_nor_panics() {
    // What Wasm does all the time (one thread): here a std mutex would deadlock (and in
    // Wasm panic) if giving a lease back took the pool's lock.
    let s = Arc::new(shared(pool(&[A], json!({}))));
    let (done, finished) = mpsc::channel();
    let worker = {
        let s = Arc::clone(&s);
        std::thread::spawn(move || {
            let mut host = host_for(&chat("x"), Some(fresh_all(&[A])));
            let mut req = PickRun::new();
            req.on_request_headers(&*s, &mut host, false);
            let len = host.body.len();
            req.on_request_body(&*s, &mut host, len, true);
            let held = req.holds_lease();
            let guard = s.hold_pool(PoolId(0));
            let locked = guard.is_some();
            drop(req);
            let in_flight = requests_in_flight(&s, A);
            drop(guard);
            let _ = done.send((held, locked, in_flight));
        })
    };
    let outcome = finished.recv_timeout(Duration::from_secs(30));
    assert_eq!(outcome, Ok((true, true, 0)), "dropping the lease blocked");
    assert!(worker.join().is_ok());
}

/// The same on one thread, as Wasm runs everything (`cargo test -p infergate-filters
/// --target wasm32-wasip1` with the wasi runner): a std mutex there cannot block, it
/// panics when locked twice, so a give-back that took the pool's lock would panic here.
#[cfg(target_family = "wasm")]
#[test]
fn on_one_thread_a_lease_dropped_under_its_pool_lock_neither_blocks_nor_panics() {
    let mut s = shared(pool(&[A], json!({})));
    let mut host = host_for(&chat("x"), Some(fresh_all(&[A])));
    let (_, req) = pick_one(&mut s, &mut host);
    assert!(req.holds_lease());
    let guard = s.hold_pool(PoolId(0));
    assert!(guard.is_some());
    assert!(s.pool_is_locked(PoolId(0)));
    drop(req);
    assert_eq!(requests_in_flight(&s, A), 0);
    drop(guard);
    assert!(!s.pool_is_locked(PoolId(0)));
}

#[test]
fn a_pick_in_one_pool_proceeds_while_another_pool_is_locked() {
    let picker = Arc::new(SharedPicker::new(two_pools()));
    let guard = picker.state().hold_pool(PoolId(0));
    assert!(guard.is_some());

    // Pool q picks (and decodes the first snapshot) while p is locked.
    let (tx, rx) = mpsc::channel();
    let q_worker = {
        let picker = Arc::clone(&picker);
        std::thread::spawn(move || {
            let mut host = mistral_host();
            let mut req = PickRun::new();
            let status = drive_shared(&picker, &mut host, &mut req);
            let _ = tx.send((status, req.endpoint().map(str::to_owned)));
            req.on_end_counted(&*picker, &mut host);
        })
    };
    let q = rx.recv_timeout(Duration::from_secs(30));
    assert_eq!(
        q,
        Ok((FilterStatus::Continue, Some(C.to_owned()))),
        "a pick in pool q waited for pool p's lock"
    );
    assert!(q_worker.join().is_ok());

    // A pick in p itself waits for p's lock: the lock is real.
    let (tx, rx) = mpsc::channel();
    let p_worker = {
        let picker = Arc::clone(&picker);
        std::thread::spawn(move || {
            let mut host = host_for(&chat("x"), Some(fresh_all(&[A, B, C])));
            let mut req = PickRun::new();
            let status = drive_shared(&picker, &mut host, &mut req);
            let _ = tx.send(status);
            req.on_end_counted(&*picker, &mut host);
        })
    };
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "a pick in pool p ran while p was locked"
    );
    drop(guard);
    // It sees the snapshot decoded while it was locked (mapped at its own pick).
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(30)),
        Ok(FilterStatus::Continue)
    );
    assert!(p_worker.join().is_ok());
    let state = picker.state();
    for (pool, e) in [(PoolId(0), A), (PoolId(0), B), (PoolId(1), C)] {
        assert_eq!(state.inflight(pool, e).map(|l| l.requests), Some(0));
    }
}

#[test]
fn in_steady_state_a_pick_takes_no_lock_but_its_pools() {
    let picker = Arc::new(SharedPicker::new(two_pools()));
    // The first pick in q decodes the snapshot and maps it onto q.
    let mut host = mistral_host();
    let mut req = PickRun::new();
    assert_eq!(
        drive_shared(&picker, &mut host, &mut req),
        FilterStatus::Continue
    );
    req.on_end_counted(&*picker, &mut host);
    // With pool p and the snapshot both locked, the same snapshot version still picks in q.
    let pool_p = picker.state().hold_pool(PoolId(0));
    let snapshot = picker.state().hold_snapshot();
    let (tx, rx) = mpsc::channel();
    let worker = {
        let picker = Arc::clone(&picker);
        std::thread::spawn(move || {
            let mut host = mistral_host();
            let mut req = PickRun::new();
            let status = drive_shared(&picker, &mut host, &mut req);
            let _ = tx.send(status);
            req.on_end_counted(&*picker, &mut host);
        })
    };
    let status = rx.recv_timeout(Duration::from_secs(30));
    drop(snapshot);
    drop(pool_p);
    assert_eq!(
        status,
        Ok(FilterStatus::Continue),
        "a steady-state pick waited for another pool's or the snapshot's lock"
    );
    assert!(worker.join().is_ok());
}

#[test]
fn threads_picking_in_two_pools_account_every_request_once() {
    let picker = Arc::new(SharedPicker::new(two_pools()));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let picker = Arc::clone(&picker);
            std::thread::spawn(move || {
                for i in 0..50 {
                    let mut host = if w % 2 == 0 {
                        host_for(&chat(&format!("w{w} r{i}")), Some(fresh_all(&[A, B, C])))
                    } else {
                        mistral_host()
                    };
                    let mut req = PickRun::new();
                    assert_eq!(
                        drive_shared(&picker, &mut host, &mut req),
                        FilterStatus::Continue
                    );
                    // Every other request ends without any end call.
                    if i % 2 == 0 {
                        req.on_end_counted(&*picker, &mut host);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        assert!(w.join().is_ok());
    }
    let state = picker.state();
    for (pool, e) in [(PoolId(0), A), (PoolId(0), B), (PoolId(1), C)] {
        assert_eq!(state.inflight(pool, e).map(|l| l.requests), Some(0));
        assert_eq!(state.inflight(pool, e).map(|l| l.tokens.0), Some(0));
    }
}

#[test]
fn release_leaves_the_gauges_to_its_caller() {
    // The state owner keeps leases for other VMs and lowers their gauges itself.
    let s = shared(pool(&[A], json!({})));
    let Some(plan) = s.pool_plan("llama") else {
        unreachable!("the pool serves llama")
    };
    let mut host = host_for(b"", Some(fresh_all(&[A])));
    s.refresh_snapshot(&host);
    let req = PickRequest {
        target_model: "llama",
        block_hashes: &[],
        prompt_tokens: scheduler_core::types::Tokens(5),
        max_output_tokens: None,
        output_sequences: 1,
        session: None,
    };
    let Ok(mut picked) = s.pick(&plan, &req, Millis(NOW), 1) else {
        unreachable!("A is fresh")
    };
    picked.lease.raise_gauges(&mut host);
    picked.lease.end(&mut host);
    assert_eq!(requests_in_flight(&s, A), 0);
    assert_eq!(s.owed_gauge_decrements(PoolId(0)), 0);
    assert_eq!(host.gauges.get(INFLIGHT_P), Some(&0));
    assert_eq!(host.gauge_underflows, 0);
}
