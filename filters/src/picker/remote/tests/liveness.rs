//! Liveness at the owner: the leases of a worker that stops being heard from expire at the
//! owner's tick and the in-flight counts read the truth again, while a worker that keeps
//! sending heartbeats keeps the lease of a request however long it runs.

use super::*;
use crate::host::SnapshotVersion;

const POOL_INFLIGHT: &str = "infergate.picker.inflight_requests.pool.p";

/// `worker`'s pick of `content`, answered by `owner` on `owner_host`: the lease.
fn lease_of(
    owner: &mut Owner,
    owner_host: &mut FakeHost,
    worker: &mut Worker,
    content: &str,
) -> u64 {
    let mut host = host(content);
    let (_req, _, message) = worker.prepare(&mut host);
    match owner.handle(owner_host, &message).as_slice() {
        [(queue, ToWorker::Picked { lease, .. })] if *queue == worker.queue => *lease,
        other => panic!("expected a pick for queue {}, got {other:?}", worker.queue),
    }
}

fn heartbeat(queue: u32) -> Vec<u8> {
    ToOwner::Release {
        state: StateKey::of_config(&config()),
        reply_queue: queue,
        leases: Vec::new(),
        started: Vec::new(),
    }
    .encode()
    .unwrap()
}

#[test]
fn a_silent_workers_leases_expire_and_a_living_workers_long_request_keeps_its_lease() {
    let mut owner = Owner::new();
    let mut owner_host = FakeHost::new().now(NOW).snapshot(1, snapshot());
    assert!(owner.handle(&mut owner_host, &hello()).is_empty());
    let mut dies = Worker::new(1);
    let mut lives = Worker::new(2);
    let dead_leases = [
        lease_of(
            &mut owner,
            &mut owner_host,
            &mut dies,
            "first of the worker that dies",
        ),
        lease_of(
            &mut owner,
            &mut owner_host,
            &mut dies,
            "second of the worker that dies",
        ),
    ];
    let long = lease_of(
        &mut owner,
        &mut owner_host,
        &mut lives,
        "a very long request",
    );
    assert_eq!(owner.leases(), 3);
    assert!(owner.tick(&mut owner_host).is_empty());
    assert_eq!(owner_host.gauges.get(POOL_INFLIGHT), Some(&3));

    // Worker 1's VM dies; worker 2 keeps ticking: a heartbeat every HEARTBEAT_MS.
    let mut at = NOW;
    while at < NOW + HOLDER_TTL_MS - 250 {
        at += 250;
        owner_host.now = Millis(at);
        if (at - NOW) % HEARTBEAT_MS < 250 {
            assert!(owner.handle(&mut owner_host, &heartbeat(2)).is_empty());
        }
        assert!(owner.tick(&mut owner_host).is_empty());
    }
    assert_eq!(owner.leases(), 3, "within the TTL every lease is kept");
    assert_eq!(owner_host.counter(LEASES_EXPIRED), 0);

    for _ in 0..12 {
        at += 250;
        owner_host.now = Millis(at);
        if (at - NOW) % HEARTBEAT_MS < 250 {
            owner.handle(&mut owner_host, &heartbeat(2));
        }
        owner.tick(&mut owner_host);
    }
    assert!(
        at - NOW > 2 * HOLDER_TTL_MS,
        "the long request outlived the TTL"
    );
    assert_eq!(owner.leases(), 1, "the silent worker's leases expired");
    assert_eq!(owner_host.counter(LEASES_EXPIRED), 2);
    assert_eq!(
        owner_host.gauges.get(POOL_INFLIGHT),
        Some(&1),
        "the truth again"
    );
    assert!(owner_host
        .error_logs
        .iter()
        .any(|l| l.contains("2 lease(s) of 1 worker(s)")));

    // The dead worker's leases are unknown now: a late release moves nothing.
    let late = ToOwner::Release {
        state: StateKey::of_config(&config()),
        reply_queue: dies.queue,
        leases: dead_leases.iter().map(|&l| Released::lease(l)).collect(),
        started: Vec::new(),
    };
    owner.handle(&mut owner_host, &late.encode().unwrap());
    assert_eq!(owner.leases(), 1);
    // The long request ends: nothing is left in flight, and no gauge went below zero.
    let end = ToOwner::Release {
        state: StateKey::of_config(&config()),
        reply_queue: lives.queue,
        leases: vec![Released::lease(long)],
        started: Vec::new(),
    };
    owner.handle(&mut owner_host, &end.encode().unwrap());
    assert_eq!(owner.leases(), 0);
    owner.tick(&mut owner_host);
    assert_eq!(owner_host.gauges.get(POOL_INFLIGHT), Some(&0));
    for endpoint in ENDPOINTS {
        let key = StateKey::of_config(&config());
        assert_eq!(
            owner.inflight(key, PoolId(0), endpoint).unwrap().requests,
            0
        );
    }
    assert_eq!(owner_host.gauge_underflows, 0);
    assert_eq!(owner_host.counter(LEASES_EXPIRED), 2, "counted once");
}

#[test]
fn every_message_naming_the_worker_counts_as_its_heartbeat() {
    let mut owner = Owner::new();
    let mut owner_host = FakeHost::new().now(NOW).snapshot(1, snapshot());
    owner.handle(&mut owner_host, &hello());
    let mut busy = Worker::new(3);
    let first = lease_of(&mut owner, &mut owner_host, &mut busy, "first");
    // Only picks for a while, never an empty release: the first lease is kept.
    for step in 1..=12 {
        owner_host.now = Millis(NOW + step * 500);
        owner_host.snapshot = Some((SnapshotVersion(step + 1), snapshot_at(NOW + step * 500)));
        lease_of(
            &mut owner,
            &mut owner_host,
            &mut busy,
            &format!("pick {step}"),
        );
        owner.tick(&mut owner_host);
    }
    assert_eq!(owner.leases(), 13);
    assert_eq!(owner_host.counter(LEASES_EXPIRED), 0);
    // A cancel names the worker too.
    owner_host.now = Millis(NOW + 7_500);
    let cancel = ToOwner::Cancel {
        state: StateKey::of_config(&config()),
        reply_queue: busy.queue,
        ticket: 999,
    };
    owner.handle(&mut owner_host, &cancel.encode().unwrap());
    owner_host.now = Millis(NOW + 7_500 + HOLDER_TTL_MS - 1);
    owner.tick(&mut owner_host);
    assert_eq!(owner.leases(), 13);
    // Then silence.
    owner_host.now = Millis(NOW + 7_500 + HOLDER_TTL_MS);
    owner.tick(&mut owner_host);
    assert_eq!(owner.leases(), 0);
    assert_eq!(owner_host.counter(LEASES_EXPIRED), 13);
    // Its first lease among them: the release that comes now is an unknown id.
    let late = ToOwner::Release {
        state: StateKey::of_config(&config()),
        reply_queue: busy.queue,
        leases: vec![Released::lease(first)],
        started: Vec::new(),
    };
    owner.handle(&mut owner_host, &late.encode().unwrap());
    assert_eq!(owner_host.gauge_underflows, 0);
}
