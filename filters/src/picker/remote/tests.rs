//! The owner protocol: the codec rejects what it did not write, and requests prepared in
//! different "workers" meet one state at the owner (affinity and in-flight load are shared).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;

use super::*;
use crate::fake::FakeHost;
use crate::headers::{BASE_MODEL, DESTINATION_ENDPOINT};
use crate::picker::tests::PickRun;
use crate::FilterStatus;
use scheduler_core::metrics::EndpointMetrics;
use scheduler_core::snapshot::{encode, EndpointSample, Snapshot};
use scheduler_core::types::Millis;

const ENDPOINTS: [&str; 4] = [
    "10.0.0.1:8000",
    "10.0.0.2:8000",
    "10.0.0.3:8000",
    "10.0.0.4:8000",
];
const NOW: u64 = 100_000;

fn config() -> Vec<u8> {
    serde_json::to_vec(&json!({"pool": "p", "baseModel": "llama", "endpoints": ENDPOINTS})).unwrap()
}

fn snapshot() -> Vec<u8> {
    snapshot_at(NOW)
}

/// Every endpoint idle, scraped at `at`.
fn snapshot_at(at: u64) -> Vec<u8> {
    encode(&Snapshot {
        taken_at: Millis(at),
        clusters: Vec::new(),
        endpoints: ENDPOINTS
            .iter()
            .map(|a| EndpointSample {
                address: (*a).to_owned(),
                scraped_at: Millis(at),
                consecutive_failures: 0,
                metrics: Some(EndpointMetrics {
                    waiting: Some(0),
                    running: Some(0),
                    kv_cache_usage: Some(0.1),
                    ..EndpointMetrics::default()
                }),
            })
            .collect(),
    })
}

fn host(content: &str) -> FakeHost {
    let body =
        json!({"model": "llama", "messages": [{"role": "user", "content": content}]}).to_string();
    FakeHost::new()
        .request_header(BASE_MODEL, "llama")
        .post("/v1/chat/completions", body.as_bytes())
        .now(NOW)
        .snapshot(1, snapshot())
}

/// One worker: its own copy of the state (for the plans only) and deferred requests.
struct Worker {
    local: PickerShared,
    queue: u32,
    next_ticket: u64,
}

impl Worker {
    fn new(queue: u32) -> Worker {
        let local = PickerShared::from_json(serde_json::from_slice(&config()).unwrap()).unwrap();
        Worker {
            local,
            queue,
            next_ticket: 0,
        }
    }

    /// Headers + body through a deferred request, then the `Pick` message it sends.
    fn prepare(&mut self, host: &mut FakeHost) -> (PickRun, u64, Vec<u8>) {
        let mut req = PickRun::deferred();
        assert_eq!(
            req.on_request_headers(&mut self.local, host, false),
            FilterStatus::Pause
        );
        let len = host.body.len();
        assert_eq!(
            req.on_request_body(&mut self.local, host, len, true),
            FilterStatus::Pause
        );
        let (pool, prepared) = req.pending_pick().expect("a pending pick");
        self.next_ticket += 1;
        let message = ToOwner::Pick {
            state: StateKey::of_config(&config()),
            reply_queue: self.queue,
            ticket: self.next_ticket,
            pool,
            prepared: prepared.clone(),
            releases: Vec::new(),
            started: Vec::new(),
        };
        (req, self.next_ticket, message.encode().unwrap())
    }
}

fn hello() -> Vec<u8> {
    ToOwner::Hello {
        state: StateKey::of_config(&config()),
        config: config(),
    }
    .encode()
    .unwrap()
}

/// Send `content` from `worker` through `owner`; the endpoint and the lease.
fn turn(owner: &mut Owner, worker: &mut Worker, content: &str) -> (String, u64) {
    let mut host = host(content);
    let (mut req, ticket, message) = worker.prepare(&mut host);
    let mut owner_host = FakeHost::new().now(NOW).snapshot(1, snapshot());
    let (queue, answer) = owner
        .handle(&mut owner_host, &message)
        .pop()
        .expect("an answer");
    assert_eq!(queue, worker.queue);
    assert_eq!(answer.ticket(), ticket);
    let ToWorker::Picked {
        lease,
        endpoint,
        fallbacks,
        ..
    } = answer
    else {
        panic!("expected a pick, got {answer:?}");
    };
    let status = req.on_answer(&mut host, Ok((&endpoint, &fallbacks, None)));
    assert_eq!(status, Some(FilterStatus::Continue));
    let list: Vec<&str> = std::iter::once(endpoint.as_str())
        .chain(fallbacks.iter().map(String::as_str))
        .collect();
    assert_eq!(
        host.header(DESTINATION_ENDPOINT),
        Some(list.join(",").as_str())
    );
    // A second answer for the same request is not applied.
    assert_eq!(req.on_answer(&mut host, Ok(("1.2.3.4:1", &[], None))), None);
    (endpoint, lease)
}

#[test]
fn conversations_keep_their_endpoint_whichever_worker_carries_each_turn() {
    let mut owner = Owner::new();
    let mut no_stats = FakeHost::new();
    assert!(owner.handle(&mut no_stats, &hello()).is_empty());
    let mut workers: Vec<Worker> = (1..=4).map(Worker::new).collect();
    let key = StateKey::of_config(&config());
    for conv in 0..8 {
        let mut history = format!("conversation {conv} system prompt. ").repeat(60);
        let mut served = Vec::new();
        for turn_no in 0..4 {
            history.push_str(&format!(" user turn {turn_no} with some words."));
            // Turn n of every conversation arrives on worker (conv + n) % 4.
            let worker = &mut workers[(conv + turn_no) % 4];
            let (endpoint, lease) = turn(&mut owner, worker, &history);
            served.push(endpoint);
            let mut stats = FakeHost::new();
            owner.handle(
                &mut stats,
                &ToOwner::Release {
                    state: key,
                    reply_queue: worker.queue,
                    leases: vec![Released::lease(lease)],
                    started: Vec::new(),
                }
                .encode()
                .unwrap(),
            );
        }
        assert!(
            served.iter().all(|e| *e == served[0]),
            "conversation {conv} moved: {served:?}"
        );
    }
    assert_eq!(owner.leases(), 0);
}

#[test]
fn in_flight_load_is_counted_once_for_every_worker_and_released_once() {
    let mut owner = Owner::new();
    let mut stats = FakeHost::new();
    owner.handle(&mut stats, &hello());
    let key = StateKey::of_config(&config());
    let mut w1 = Worker::new(1);
    let mut w2 = Worker::new(2);
    let (e1, l1) = turn(&mut owner, &mut w1, "first request");
    let (e2, l2) = turn(&mut owner, &mut w2, "another request");
    assert_eq!(owner.leases(), 2);
    let load = |owner: &Owner, e: &str| owner.inflight(key, PoolId(0), e).unwrap().requests;
    assert_eq!(
        load(&owner, &e1) + u32::from(e1 != e2) * load(&owner, &e2),
        2
    );
    let release = |lease| {
        ToOwner::Release {
            state: key,
            reply_queue: 1,
            leases: vec![Released::lease(lease)],
            started: Vec::new(),
        }
        .encode()
        .unwrap()
    };
    owner.handle(&mut stats, &release(l1));
    owner.handle(&mut stats, &release(l1));
    owner.handle(&mut stats, &release(999));
    assert_eq!(owner.leases(), 1);
    owner.handle(&mut stats, &release(l2));
    assert_eq!(owner.leases(), 0);
    assert_eq!(load(&owner, &e1), 0);
    assert_eq!(load(&owner, &e2), 0);
}

#[test]
fn a_pick_gives_back_the_leases_it_carries_before_it_picks() {
    let mut owner = Owner::new();
    let mut stats = FakeHost::new();
    owner.handle(&mut stats, &hello());
    let key = StateKey::of_config(&config());
    let mut w = Worker::new(1);
    let (_, first) = turn(&mut owner, &mut w, "one");
    let (_, second) = turn(&mut owner, &mut w, "two");
    assert_eq!(owner.leases(), 2);
    let mut host = host("three");
    let (_req, _ticket, message) = w.prepare(&mut host);
    let Some(ToOwner::Pick {
        prepared, ticket, ..
    }) = ToOwner::decode(&message)
    else {
        panic!("a pick");
    };
    let carrying = ToOwner::Pick {
        state: key,
        reply_queue: 1,
        ticket,
        pool: PoolId(0),
        prepared,
        releases: vec![
            Released::lease(first),
            Released::lease(second),
            Released::lease(999),
        ],
        started: Vec::new(),
    };
    let mut owner_host = FakeHost::new().now(NOW).snapshot(1, snapshot());
    let answer = owner.handle(&mut owner_host, &carrying.encode().unwrap());
    assert!(matches!(answer.as_slice(), [(1, ToWorker::Picked { .. })]));
    assert_eq!(owner.leases(), 1, "two given back, the new one taken");
}

#[test]
fn an_owner_without_the_state_asks_for_a_hello() {
    let mut owner = Owner::new();
    let mut w = Worker::new(7);
    let mut host = host("hello");
    let (mut req, ticket, message) = w.prepare(&mut host);
    let mut stats = FakeHost::new();
    let answer = owner.handle(&mut stats, &message);
    assert_eq!(answer, vec![(7, ToWorker::UnknownState { ticket })]);
    // The request still waits; picking here after all routes it.
    assert!(req.pending_pick().is_some());
    assert_eq!(
        req.pick_here(&mut w.local, &mut host),
        FilterStatus::Continue
    );
    assert!(host.header(DESTINATION_ENDPOINT).is_some());
}

#[test]
fn a_pick_for_a_pool_the_state_lacks_is_rejected_and_answered_503() {
    let mut owner = Owner::new();
    let mut stats = FakeHost::new();
    owner.handle(&mut stats, &hello());
    let mut w = Worker::new(1);
    let mut host = host("which pool");
    let (mut req, ticket, message) = w.prepare(&mut host);
    let Some(ToOwner::Pick { prepared, .. }) = ToOwner::decode(&message) else {
        panic!("a pick");
    };
    let wrong_pool = ToOwner::Pick {
        state: StateKey::of_config(&config()),
        reply_queue: 1,
        ticket,
        pool: PoolId(5),
        prepared,
        releases: Vec::new(),
        started: Vec::new(),
    };
    let (_, answer) = owner
        .handle(&mut stats, &wrong_pool.encode().unwrap())
        .pop()
        .unwrap();
    assert_eq!(
        answer,
        ToWorker::Rejected {
            ticket,
            rejection: Rejection::NoEndpoints
        }
    );
    let status = req.on_answer(&mut host, Err(Rejection::NoEndpoints));
    assert_eq!(status, Some(FilterStatus::Replied));
    assert_eq!(host.last_reply().map(|r| r.status), Some(503));
    assert_eq!(owner.leases(), 0);
}

#[test]
fn the_codec_round_trips_and_rejects_every_truncation_and_trailing_byte() {
    let prepared_message = {
        let mut w = Worker::new(3);
        let mut host = host("codec");
        w.prepare(&mut host).2
    };
    let answers = [
        ToWorker::Picked {
            ticket: 5,
            lease: 9,
            endpoint: "10.0.0.1:8000".into(),
            fallbacks: Vec::new(),
            prefiller: None,
            queued_ms: None,
            release_at_once: false,
            evictable: false,
            peer: false,
        },
        ToWorker::Picked {
            ticket: 5,
            lease: 9,
            endpoint: "10.0.0.1:8000".into(),
            fallbacks: vec!["10.0.0.2:8000".into()],
            prefiller: Some("10.0.0.4:8000".into()),
            queued_ms: None,
            release_at_once: false,
            evictable: false,
            peer: false,
        },
        ToWorker::Picked {
            ticket: 5,
            lease: 9,
            endpoint: "10.0.0.1:8000".into(),
            fallbacks: vec!["10.0.0.2:8000".into(), "10.0.0.3:8000".into()],
            prefiller: None,
            queued_ms: Some(1234),
            release_at_once: true,
            evictable: true,
            peer: false,
        },
        ToWorker::Evict { lease: 11 },
        ToWorker::Rejected {
            ticket: 6,
            rejection: Rejection::Unscraped,
        },
        ToWorker::UnknownState { ticket: 7 },
        ToWorker::Queued { ticket: 8 },
        ToWorker::Dropped {
            ticket: 9,
            reason: crate::flow::DropReason::TtlExpired,
            queued_ms: 2000,
        },
        ToWorker::Dropped {
            ticket: 10,
            reason: crate::flow::DropReason::Evicted,
            queued_ms: 0,
        },
    ];
    for answer in &answers {
        let bytes = answer.encode();
        assert_eq!(ToWorker::decode(&bytes).as_ref(), Some(answer));
        for cut in 0..bytes.len() {
            assert_eq!(ToWorker::decode(&bytes[..cut]), None);
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(ToWorker::decode(&longer), None);
    }
    let release = ToOwner::Release {
        state: StateKey(1),
        reply_queue: 7,
        leases: vec![
            Released::lease(2),
            Released {
                lease: 3,
                service: 1200,
                timing: ResponseTiming {
                    ttft_us: Some(41_000),
                    tpot_us: None,
                },
            },
        ],
        started: vec![4, 5],
    }
    .encode()
    .unwrap();
    let served = ToOwner::Served {
        state: StateKey(1),
        lease: 4,
        endpoint: "10.0.0.3:8000".into(),
        block_hashes: vec![11, 12, 13],
        session: Some("s1".into()),
    }
    .encode()
    .unwrap();
    let served_without_session = ToOwner::Served {
        state: StateKey(1),
        lease: 4,
        endpoint: "[fd00::1]:8000".into(),
        block_hashes: Vec::new(),
        session: None,
    }
    .encode()
    .unwrap();
    let subset_message = {
        let mut w = Worker::new(3);
        let mut host = host("codec").request_header(
            crate::headers::DESTINATION_SUBSET,
            "10.0.0.2:8000,10.0.0.4:8000",
        );
        w.prepare(&mut host).2
    };
    let Some(ToOwner::Pick { prepared, .. }) = ToOwner::decode(&subset_message) else {
        panic!("a pick with a subset decodes");
    };
    let subset = ["10.0.0.2:8000".to_owned(), "10.0.0.4:8000".to_owned()];
    assert_eq!(prepared.subset(), Some(&subset[..]));
    for bytes in [
        prepared_message,
        release,
        served,
        served_without_session,
        subset_message,
    ] {
        let decoded = ToOwner::decode(&bytes).expect("decodes");
        assert_eq!(decoded.encode().unwrap(), bytes);
        for cut in 0..bytes.len() {
            assert_eq!(ToOwner::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(ToOwner::decode(&longer), None);
    }
    assert!(ToOwner::decode(&[]).is_none());
}

#[test]
fn a_request_a_fallback_served_moves_its_lease_at_the_owner() {
    let mut owner = Owner::new();
    let mut owner_host = FakeHost::new().now(NOW).snapshot(1, snapshot());
    assert!(owner.handle(&mut owner_host, &hello()).is_empty());
    let mut worker = Worker::new(1);
    let mut host = host(
        "a long enough prompt for a block or two of prefix, repeated. "
            .repeat(40)
            .as_str(),
    );
    let (mut req, _, message) = worker.prepare(&mut host);
    let Some((
        _,
        ToWorker::Picked {
            lease,
            endpoint,
            fallbacks,
            ..
        },
    )) = owner.handle(&mut owner_host, &message).pop()
    else {
        panic!("a pick");
    };
    req.on_answer(&mut host, Ok((&endpoint, &fallbacks, None)));
    let state = StateKey::of_config(&config());
    let other = ENDPOINTS.iter().find(|e| **e != endpoint).unwrap();
    assert_eq!(
        owner
            .inflight(state, PoolId(0), &endpoint)
            .unwrap()
            .requests,
        1
    );

    host.served_upstream = Some((*other).to_owned());
    let served = req
        .on_response_headers(&mut worker.local, &mut host)
        .expect("the correction goes to the owner");
    assert_eq!(served.endpoint, *other);
    assert!(!served.block_hashes.is_empty());
    assert_eq!(
        host.counter("infergate.picker.served_by_fallback.pool.p"),
        1,
        "the worker counts it"
    );
    let message = ToOwner::Served {
        state,
        lease,
        endpoint: served.endpoint.clone(),
        block_hashes: served.block_hashes.iter().map(|h| h.0).collect(),
        session: served.session.clone(),
    };
    assert!(owner
        .handle(&mut owner_host, &message.encode().unwrap())
        .is_empty());
    assert_eq!(
        owner
            .inflight(state, PoolId(0), &endpoint)
            .unwrap()
            .requests,
        0
    );
    assert_eq!(owner.inflight(state, PoolId(0), other).unwrap().requests, 1);
    // The release gives it back where it now counts.
    let release = ToOwner::Release {
        state,
        reply_queue: 1,
        leases: vec![Released::lease(lease)],
        started: Vec::new(),
    };
    owner.handle(&mut owner_host, &release.encode().unwrap());
    assert_eq!(owner.inflight(state, PoolId(0), other).unwrap().requests, 0);
    assert_eq!(owner_host.gauge_underflows, 0);
    assert!(
        owner_host
            .gauges
            .iter()
            .filter(|(k, _)| k.starts_with("infergate.picker.inflight_requests"))
            .all(|(_, v)| *v == 0),
        "{:?}",
        owner_host.gauges
    );
    // A correction for a lease the owner no longer keeps is ignored.
    assert!(owner
        .handle(&mut owner_host, &message.encode().unwrap())
        .is_empty());
}

#[test]
fn the_owner_remembers_the_adapter_a_lease_holds_until_a_worker_releases_it() {
    use scheduler_core::metrics::LoraState;
    let lora = encode(&Snapshot {
        taken_at: Millis(NOW),
        clusters: Vec::new(),
        endpoints: ENDPOINTS
            .iter()
            .map(|a| EndpointSample {
                address: (*a).to_owned(),
                scraped_at: Millis(NOW),
                consecutive_failures: 0,
                metrics: Some(EndpointMetrics {
                    waiting: Some(0),
                    running: Some(0),
                    kv_cache_usage: Some(0.1),
                    lora: Some(LoraState {
                        max: 2,
                        running: Vec::new(),
                        waiting: Vec::new(),
                    }),
                    ..EndpointMetrics::default()
                }),
            })
            .collect(),
    });
    let mut owner = Owner::new();
    let mut owner_host = FakeHost::new().now(NOW).snapshot(1, lora.clone());
    assert!(owner.handle(&mut owner_host, &hello()).is_empty());
    let key = StateKey::of_config(&config());
    let mut worker = Worker::new(1);
    let body = json!({"model": "sql-adapter", "messages": [{"role": "user", "content": "q"}]});
    let mut host = FakeHost::new()
        .request_header(BASE_MODEL, "llama")
        .post("/v1/chat/completions", body.to_string().as_bytes())
        .now(NOW)
        .snapshot(1, lora);
    let (_req, _, message) = worker.prepare(&mut host);
    let Some((
        _,
        ToWorker::Picked {
            lease, endpoint, ..
        },
    )) = owner.handle(&mut owner_host, &message).pop()
    else {
        panic!("a pick");
    };
    let index = ENDPOINTS.iter().position(|e| *e == endpoint).unwrap();
    let memory = |owner: &Owner| {
        let state = owner.states.get(&key).unwrap().shared.hold_pool(PoolId(0));
        let memory = &state.as_ref().unwrap().adapters[index];
        let names: Vec<String> = memory.names().iter().map(|n| (*n).to_owned()).collect();
        let busy: Vec<String> = memory
            .in_flight_names()
            .iter()
            .map(|n| (*n).to_owned())
            .collect();
        (names, busy)
    };
    assert_eq!(
        memory(&owner),
        (vec!["sql-adapter".into()], vec!["sql-adapter".into()])
    );
    let release = ToOwner::Release {
        state: key,
        reply_queue: 1,
        leases: vec![Released::lease(lease)],
        started: Vec::new(),
    };
    owner.handle(&mut owner_host, &release.encode().unwrap());
    assert_eq!(owner.leases(), 0);
    // Given back, still remembered as (probably) loaded there.
    assert_eq!(memory(&owner), (vec!["sql-adapter".into()], Vec::new()));
}

mod liveness;

/// A pick of `n: 8, max_completion_tokens: 400` reaches the owner with its output
/// sequences, so the owner's in-flight token load counts all eight; a message claiming 0
/// sequences is refused.
#[test]
fn a_picks_output_sequences_reach_the_owner() {
    let body = json!({"model": "llama", "n": 8, "max_completion_tokens": 400,
                      "messages": [{"role": "user", "content": "name a bakery"}]})
    .to_string();
    let mut host = FakeHost::new()
        .request_header(BASE_MODEL, "llama")
        .post("/v1/chat/completions", body.as_bytes())
        .now(NOW)
        .snapshot(1, snapshot());
    let mut w = Worker::new(2);
    let (_req, _ticket, message) = w.prepare(&mut host);
    let Some(ToOwner::Pick { prepared, .. }) = ToOwner::decode(&message) else {
        panic!("a pick");
    };
    let req = prepared.request();
    assert_eq!(
        (req.max_output_tokens, req.output_sequences),
        (Some(400), 8)
    );
    assert_eq!(req.inflight_tokens().0, req.prompt_tokens.0 + 3200);
    // The sequences follow the output cap: tag 1, state 8, queue 4, ticket 8, pool 4,
    // released count 4, started count 4, then now 8, random 8, prompt 8, flags 1, cap 8.
    let at = 1 + 8 + 4 + 8 + 4 + 4 + 4 + 8 + 8 + 8 + 1 + 8;
    assert_eq!(message.get(at..at + 4), Some(&8u32.to_le_bytes()[..]));
    let mut zero = message.clone();
    zero[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(ToOwner::decode(&zero), None);
}

#[test]
fn a_released_lease_carries_its_requests_timing_to_the_owners_estimate() {
    let mut owner = Owner::new();
    let mut stats = FakeHost::new();
    owner.handle(&mut stats, &hello());
    let key = StateKey::of_config(&config());
    let mut worker = Worker::new(1);
    let (endpoint, lease) = turn(&mut owner, &mut worker, "a timed request");
    let timing = ResponseTiming {
        ttft_us: Some(73_000),
        tpot_us: Some(4_000),
    };
    owner.handle(
        &mut stats,
        &ToOwner::Release {
            state: key,
            reply_queue: worker.queue,
            leases: vec![Released {
                timing,
                ..Released::lease(lease)
            }],
            started: Vec::new(),
        }
        .encode()
        .unwrap(),
    );
    let gauge = |name: &str| {
        let slug = endpoint.replace(['.', ':'], "_");
        stats
            .gauges
            .iter()
            .find(|(k, _)| k.starts_with(name) && k.ends_with(&slug))
            .map(|(_, v)| *v)
    };
    assert_eq!(gauge("infergate.picker.observed_ttft_us"), Some(73_000));
    assert_eq!(gauge("infergate.picker.observed_tpot_us"), Some(4_000));
}

#[test]
fn a_started_notice_ends_the_prefill_the_owner_counts() {
    let mut owner = Owner::new();
    let mut stats = FakeHost::new();
    owner.handle(&mut stats, &hello());
    let key = StateKey::of_config(&config());
    let mut worker = Worker::new(1);
    let (endpoint, lease) = turn(&mut owner, &mut worker, "a prefill in progress");
    let prefilling = |owner: &Owner| {
        owner
            .inflight(key, PoolId(0), &endpoint)
            .unwrap()
            .prefilling
    };
    assert_eq!(prefilling(&owner), 1);
    let notice = |started: Vec<u64>| {
        ToOwner::Release {
            state: key,
            reply_queue: worker.queue,
            leases: Vec::new(),
            started,
        }
        .encode()
        .unwrap()
    };
    owner.handle(&mut stats, &notice(vec![lease, 999]));
    assert_eq!(prefilling(&owner), 0);
    assert_eq!(
        owner.inflight(key, PoolId(0), &endpoint).unwrap().requests,
        1
    );
    owner.handle(&mut stats, &notice(vec![lease]));
    assert_eq!(prefilling(&owner), 0, "a second notice changes nothing");
}
