//! Flow control at the owner: a saturated pool answers `Queued`, a release dispatches the
//! next request with a pick, a cancel takes a request out of the queue, the tick ends a
//! TTL, and the flow stats move at the owner.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;

use super::*;
use crate::fake::FakeHost;
use crate::headers::{BASE_MODEL, FAIRNESS_ID};
use crate::picker::tests::PickRun;
use crate::FilterStatus;
use scheduler_core::types::Millis;

fn config() -> Vec<u8> {
    let mut epp = crate::picker::config::default_epp_config();
    let plugins = epp["plugins"].as_array_mut().unwrap();
    plugins.push(json!({"type": "concurrency-detector", "parameters": {"maxConcurrency": 1}}));
    epp["featureGates"] = json!(["flowControl"]);
    epp["flowControl"] = json!({"defaultRequestTTL": "2s",
        "priorityBands": [{"priority": 0, "maxRequests": 2}]});
    serde_json::to_vec(&json!({"pools": [{"pool": "p", "baseModel": "llama",
        "endpoints": ["10.0.0.1:8000"], "failureMode": "FailOpen", "eppConfig": epp}]}))
    .unwrap()
}

fn key() -> StateKey {
    StateKey::of_config(&config())
}

/// The `Pick` a worker sends for a request of `flow` with `ticket`, at `now`.
fn pick(ticket: u64, flow: &str, now: u64) -> Vec<u8> {
    pick_in(&config(), ticket, flow, None, now)
}

/// The `Pick` of a request of `flow` (and `objective`, if any) in the state of `config`.
fn pick_in(config: &[u8], ticket: u64, flow: &str, objective: Option<&str>, now: u64) -> Vec<u8> {
    let mut local = PickerShared::from_json(serde_json::from_slice(config).unwrap()).unwrap();
    let body = json!({"model": "llama", "messages": [{"role": "user", "content": "hi"}]});
    let mut host = FakeHost::new()
        .request_header(BASE_MODEL, "llama")
        .request_header(FAIRNESS_ID, flow)
        .post("/v1/chat/completions", body.to_string().as_bytes())
        .now(now);
    if let Some(objective) = objective {
        host = host.request_header(crate::headers::OBJECTIVE, objective);
    }
    let mut req = PickRun::deferred();
    req.on_request_headers(&mut local, &mut host, false);
    let len = host.body.len();
    assert_eq!(
        req.on_request_body(&mut local, &mut host, len, true),
        FilterStatus::Pause
    );
    let (pool, prepared) = req.pending_pick().unwrap();
    ToOwner::Pick {
        state: StateKey::of_config(config),
        reply_queue: 7,
        ticket,
        pool,
        prepared: prepared.clone(),
        releases: Vec::new(),
        started: Vec::new(),
    }
    .encode()
    .unwrap()
}

fn owner() -> (Owner, FakeHost) {
    let mut owner = Owner::new();
    let mut host = FakeHost::new().now(0);
    let hello = ToOwner::Hello {
        state: key(),
        config: config(),
    };
    assert!(owner.handle(&mut host, &hello.encode().unwrap()).is_empty());
    (owner, host)
}

fn release(lease: u64) -> Vec<u8> {
    ToOwner::Release {
        state: key(),
        reply_queue: 1,
        leases: vec![Released::lease(lease)],
        started: Vec::new(),
    }
    .encode()
    .unwrap()
}

#[test]
fn a_saturated_pool_queues_and_a_release_dispatches_with_a_pick() {
    let (mut owner, mut host) = owner();
    let first = owner.handle(&mut host, &pick(1, "a", 0));
    let [(
        7,
        ToWorker::Picked {
            lease, queued_ms, ..
        },
    )] = first.as_slice()
    else {
        panic!("{first:?}");
    };
    assert_eq!(*queued_ms, Some(0), "admitted at once, under flow control");
    assert_eq!(
        owner.handle(&mut host, &pick(2, "b", 0)),
        vec![(7, ToWorker::Queued { ticket: 2 })]
    );
    assert_eq!(
        host.gauges
            .get("infergate.flow.queued.pool.p.band.0.flow.b"),
        Some(&1)
    );
    host.now = Millis(40);
    let answers = owner.handle(&mut host, &release(*lease));
    let [(
        7,
        ToWorker::Picked {
            ticket: 2,
            queued_ms: Some(40),
            ..
        },
    )] = answers.as_slice()
    else {
        panic!("the release dispatches the queued request: {answers:?}");
    };
    assert_eq!(
        host.gauges
            .get("infergate.flow.queued.pool.p.band.0.flow.b"),
        Some(&0)
    );
    assert_eq!(
        host.counters
            .get("infergate.flow.dispatches.pool.p.band.0.flow.b"),
        Some(&1)
    );
}

#[test]
fn a_full_band_a_cancel_and_a_ttl_are_answered_by_the_owner() {
    let (mut owner, mut host) = owner();
    owner.handle(&mut host, &pick(1, "a", 0));
    assert_eq!(
        owner.handle(&mut host, &pick(2, "a", 0)),
        vec![(7, ToWorker::Queued { ticket: 2 })]
    );
    assert_eq!(
        owner.handle(&mut host, &pick(3, "a", 0)),
        vec![(7, ToWorker::Queued { ticket: 3 })]
    );
    assert_eq!(
        owner.handle(&mut host, &pick(4, "a", 0)),
        vec![(
            7,
            ToWorker::Dropped {
                ticket: 4,
                reason: DropReason::Saturated,
                queued_ms: 0
            }
        )]
    );
    // Ticket 2's client leaves: its place is free, nothing is answered.
    let cancel = ToOwner::Cancel {
        state: key(),
        reply_queue: 7,
        ticket: 2,
    };
    assert!(owner
        .handle(&mut host, &cancel.encode().unwrap())
        .is_empty());
    assert_eq!(
        host.counters.get(
            "infergate.flow.rejections.pool.p.band.0.flow.a.reason.rejected-context-cancelled"
        ),
        Some(&1)
    );
    assert_eq!(
        owner.handle(&mut host, &pick(5, "a", 0)),
        vec![(7, ToWorker::Queued { ticket: 5 })],
        "the freed place is taken"
    );
    // The tick drops what waited past its TTL (the worker lives: its heartbeat).
    host.now = Millis(1_000);
    let heartbeat = ToOwner::Release {
        state: key(),
        reply_queue: 7,
        leases: Vec::new(),
        started: Vec::new(),
    };
    assert!(owner
        .handle(&mut host, &heartbeat.encode().unwrap())
        .is_empty());
    host.now = Millis(1_999);
    assert!(owner.tick(&mut host).is_empty());
    host.now = Millis(2_000);
    let expired = owner.tick(&mut host);
    assert_eq!(expired.len(), 2, "{expired:?}");
    assert!(expired.iter().all(|(_, a)| matches!(
        a,
        ToWorker::Dropped {
            reason: DropReason::TtlExpired,
            queued_ms: 2_000,
            ..
        }
    )));
    assert_eq!(
        host.gauges
            .get("infergate.flow.queued.pool.p.band.0.flow.a"),
        Some(&0)
    );
}

/// [`pick`], sent by the worker of reply queue `queue`.
fn pick_from(queue: u32, ticket: u64, flow: &str, now: u64) -> Vec<u8> {
    let Some(ToOwner::Pick {
        state,
        pool,
        prepared,
        releases,
        ..
    }) = ToOwner::decode(&pick(ticket, flow, now))
    else {
        panic!("a pick");
    };
    ToOwner::Pick {
        state,
        reply_queue: queue,
        ticket,
        pool,
        prepared,
        releases,
        started: Vec::new(),
    }
    .encode()
    .unwrap()
}

#[test]
fn a_silent_workers_lease_and_queued_pick_make_room_for_a_living_workers_request() {
    let (mut owner, mut host) = owner();
    // Worker 7 holds the pool's only place and queues one more; then its VM dies.
    assert!(matches!(
        owner.handle(&mut host, &pick(1, "a", 0)).as_slice(),
        [(7, ToWorker::Picked { .. })]
    ));
    assert_eq!(
        owner.handle(&mut host, &pick(2, "a", 0)),
        vec![(7, ToWorker::Queued { ticket: 2 })]
    );
    // Worker 8, alive, queues behind it.
    host.now = Millis(1_000);
    assert_eq!(
        owner.handle(&mut host, &pick_from(8, 1, "b", 1_000)),
        vec![(8, ToWorker::Queued { ticket: 1 })]
    );
    host.now = Millis(HOLDER_TTL_MS);
    let answers = owner.tick(&mut host);
    let [(8, ToWorker::Picked { ticket: 1, .. })] = answers.as_slice() else {
        panic!("the freed place goes to the living worker: {answers:?}");
    };
    assert_eq!(host.counter(LEASES_EXPIRED), 1);
    assert_eq!(
        host.counters.get(
            "infergate.flow.rejections.pool.p.band.0.flow.a.reason.rejected-context-cancelled"
        ),
        Some(&1),
        "the dead worker's queued pick left the queue"
    );
    assert_eq!(owner.leases(), 1);
}

/// One slot, a sheddable band (`batch`, -1) under the default one, eviction on.
fn eviction_config() -> Vec<u8> {
    let mut epp = crate::picker::config::default_epp_config();
    let plugins = epp["plugins"].as_array_mut().unwrap();
    plugins.push(json!({"type": "concurrency-detector", "parameters": {"maxConcurrency": 1}}));
    epp["featureGates"] = json!(["flowControl"]);
    epp["flowControl"] = json!({"priorityBands": [{"priority": 0}, {"priority": -1}],
        "enableEviction": true});
    serde_json::to_vec(&json!({
        "pools": [{"pool": "p", "baseModel": "llama", "endpoints": ["10.0.0.1:8000"],
                   "failureMode": "FailOpen", "eppConfig": epp}],
        "objectives": [{"apiVersion": "llm-d.ai/v1alpha2", "kind": "InferenceObjective",
                        "metadata": {"name": "batch"}, "spec": {"priority": -1}}]}))
    .unwrap()
}

#[test]
fn a_blocked_request_sends_an_eviction_to_the_sheddable_leases_holder() {
    let config = eviction_config();
    let key = StateKey::of_config(&config);
    let mut owner = Owner::new();
    let mut host = FakeHost::new().now(0);
    let hello = ToOwner::Hello {
        state: key,
        config: config.clone(),
    };
    assert!(owner.handle(&mut host, &hello.encode().unwrap()).is_empty());

    let first = owner.handle(&mut host, &pick_in(&config, 1, "b", Some("batch"), 0));
    let [(
        7,
        ToWorker::Picked {
            lease, evictable, ..
        },
    )] = first.as_slice()
    else {
        panic!("{first:?}");
    };
    assert!(*evictable, "a sheddable band's lease may be evicted");
    let lease = *lease;

    // A default-band request is queued, and the holder of the sheddable lease is told.
    let answers = owner.handle(&mut host, &pick_in(&config, 2, "s", None, 1));
    assert_eq!(
        answers,
        vec![
            (7, ToWorker::Evict { lease }),
            (7, ToWorker::Queued { ticket: 2 })
        ]
    );
    // Another blocked request finds no candidate left: it only waits.
    let answers = owner.handle(&mut host, &pick_in(&config, 3, "s", None, 2));
    assert_eq!(answers, vec![(7, ToWorker::Queued { ticket: 3 })]);

    // The evicted request ends: its release dispatches the first waiting one, whose lease
    // is not evictable (its band is not sheddable).
    let release = ToOwner::Release {
        state: key,
        reply_queue: 7,
        leases: vec![Released::lease(lease)],
        started: Vec::new(),
    };
    let answers = owner.handle(&mut host, &release.encode().unwrap());
    let [(
        7,
        ToWorker::Picked {
            ticket: 2,
            evictable: false,
            peer: false,
            ..
        },
    )] = answers.as_slice()
    else {
        panic!("{answers:?}");
    };
}
